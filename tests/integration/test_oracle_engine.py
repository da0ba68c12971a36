"""offload-check oracle on the real engine: generated sequences, every request judged
against the harness's model of the offloading scheduler.

The PR tier launches nothing: every family's sequence on vLLM's real scheduler,
connector and CPU manager (the drive, one process), every request as the model says;
then the same sequences with a seeded fault in vLLM's scheduler (``hits-minus-chunk``:
one chunk fewer admitted on every hit, loads shrunk to match, so every count agrees with
every other and only the model can tell) caught by the accounting checks, and each
failing sequence shrunk to the two requests that show it.

The PR tier's drive also serves waves: four requests scheduled together, sharing no
block, each judged on its own. The nightly tier gives each family a generated sequence
on a live server (Mamba's is skipped on the CPU, #54504), one launch a family, the
decode mode's server, whose generated blocks are stored across a chunk boundary, and a
server sent waves (each request's hit from its own answer, the counters per wave).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.engine


def checks(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "oracle-checks.csv", keep_default_na=False, dtype=str)


def failing(run: Path) -> dict[str, set[str]]:
    """Per cell, the checks that failed and were not allowed."""
    df = checks(run)
    bad = df[df["passed"] != "True"]
    out: dict[str, set[str]] = {}
    for cell, check in zip(bad["cell"], bad["check"], strict=True):
        out.setdefault(cell, set()).add(check)
    return out


@pytest.mark.launches(0)
def test_every_family_on_the_drive_as_the_model_says_and_a_seeded_scheduler_fault_caught(
    tmp_path,
):
    code, run, out = run_cli(
        tmp_path / "clean", "oracle", "--engine", "drive", "--mode", "prompt",
        "--mode", "decode", "--mode", "waves", "--requests", "30", timeout=900,
    )  # fmt: skip
    assert code == 0, out
    df = checks(run)
    cells = set(df["cell"])
    families = {c.split("/")[0] for c in cells}
    assert families == {
        "full-attention", "chunked-local", "sliding-window", "sliding-window-only", "mla",
        "mamba-hybrid",
    }  # fmt: skip
    assert len(cells) == 12 + 5  # waves: every family but Mamba's
    # The checks a count makes were made, on every cell, for every request.
    for cell in cells:
        made = set(df[df["cell"] == cell]["check"])
        assert {
            "hit-tokens",
            "loaded-chunks",
            "stored-chunks",
            "content-matches",
            "tier-gauges",
        } <= made, cell
    # Per request, every request; the tier's counters once a wave (30 in waves of 4: 8).
    tier = df["check"].isin(["allocated-chunks", "tier-idle", "tier-gauges", "async-lookups"])
    in_waves = df["cell"].str.contains("/waves/")
    assert (df[~(tier & in_waves)]["requests"] == "30").all()
    assert (df[tier & in_waves]["requests"] == "8").all()
    assert failing(run) == {}
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["exit_code"] == 0
    assert meta["plan"]["patch"] is None
    # A wave's requests were scheduled together, and each was still judged on its own.
    together = [
        line["together"]
        for line in map(json.loads, (run / "drive" / "drive.jsonl").read_text().splitlines())
        if "together" in line
    ]
    assert len(together) >= 5 * 7 and max(together) == 4, together

    code, run, out = run_cli(
        tmp_path / "seeded", "oracle", "--engine", "drive", "--mode", "prompt",
        "--family", "full-attention", "--family", "chunked-local", "--family", "mla",
        "--requests", "30", "--patch", "hits-minus-chunk", timeout=900,
    )  # fmt: skip
    assert code == 1, out
    assert "hits-minus-chunk applied" in out
    bad = failing(run)
    # Hits and loads shrink together: vLLM agrees with itself, only the model does not.
    for cell in ("full-attention/prompt/drive", "chunked-local/prompt/drive"):
        assert {"hit-tokens", "loaded-chunks", "host-tokens"} <= bad[cell], bad
        assert "engine-survived" not in bad[cell] and "content-matches" not in bad[cell]
    shrunk = json.loads((run / "shrunk.json").read_text())
    assert shrunk, "every failing cell's sequence is shrunk"
    for cell, cuts in shrunk.items():
        for cut in cuts:
            assert cut["replayed"] and 1 <= len(cut["steps"]) <= 3, (cell, cut)
    assert "in 2 steps" in (run / "report.md").read_text()


def every_family_on_servers(tmp_path: Path) -> Path:
    """The shipped scenario with its prompt mode on a server for every family (the
    default runs two there), its paths made absolute."""
    text = (ROOT / "scenarios" / "oracle.toml").read_text()
    old = 'name = "prompt"\nserver_families = ["chunked-local", "sliding-window"]\n'
    assert old in text
    text = text.replace(old, 'name = "prompt"\n')
    text = text.replace('"models/', f'"{ROOT}/scenarios/models/')
    text = text.replace('"variants.toml"', f'"{ROOT}/scenarios/variants.toml"')
    path = tmp_path / "oracle-every-family.toml"
    path.write_text(text)
    return path


@pytest.mark.nightly
@pytest.mark.launches(7)
def test_each_family_on_a_live_server_as_the_model_says(tmp_path):
    scenario = every_family_on_servers(tmp_path)
    code, run, out = run_cli(
        tmp_path / "results", "oracle", "--scenario", str(scenario), "--engine", "server",
        "--mode", "prompt", "--mode", "decode-server", "--mode", "waves", "--requests", "8",
        timeout=3600,
    )  # fmt: skip
    assert code == 0, out
    df = checks(run)
    assert set(df["cell"]) == {
        "full-attention/prompt/server",
        "chunked-local/prompt/server",
        "chunked-local/decode-server/server",
        "chunked-local/waves/server",
        "sliding-window/prompt/server",
        "sliding-window-only/prompt/server",
        "mla/prompt/server",
    }
    for cell in set(df["cell"]):
        made = set(df[df["cell"] == cell]["check"])
        assert {"hit-tokens", "loaded-blocks", "stored-blocks", "loaded-bytes"} <= made, cell
    assert failing(run) == {}
    # Mamba's server is skipped on the CPU by the scenario's rule (#54504), and says so.
    plan = json.loads((run / "run.json").read_text())["plan"]
    (mamba,) = [c for c in plan["cells"] if c["cell"] == "mamba-hybrid/prompt/server"]
    assert "54504" in mamba["skip"]
