"""offload-check sweep on real vLLM builds: release environments made with uv, servers
launched through the real connector, one at a time.

Nightly (the PR tier's real sweep is the bug corpus's, tests/integration/test_bugs_engine.py,
which also proves an uninstallable release is a cell): one build with a scenario whose rule
is seeded wrong (it expects the #51150 crash on every version) next to a release that cannot
be installed: the sweep must call the cell not as expected, list it first, exit 1, and
write the unavailable release as a cell, not an error; and two real releases on either
side of the fix, where it must find the transition.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import CLI, ROOT, run_cli

pytestmark = pytest.mark.engine
SCENARIOS = ROOT / "scenarios"
CHECK = "llama4-small-chunk/connector-on"


def sweep(results: Path, *args: str) -> tuple[int, Path, str]:
    return run_cli(results, "sweep", *args, timeout=3600)


def cells(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "sweep.csv", keep_default_na=False)


def seeded_wrong_scenario(tmp_path: Path) -> Path:
    """crash-repro.toml whose #51150 rule covers every version (a mutant expectation)."""
    text = (SCENARIOS / "crash-repro.toml").read_text()
    assert 'vllm = "<0.28.0"' in text
    text = text.replace('vllm = "<0.28.0"', 'vllm = "<99"')
    text = text.replace('"models/', f'"{SCENARIOS}/models/')
    text = text.replace(
        'variants_file = "variants.toml"', f'variants_file = "{SCENARIOS}/variants.toml"'
    )
    path = tmp_path / "crash-repro-wrong.toml"
    path.write_text(text)
    return path


@pytest.mark.weekly
@pytest.mark.nightly  # the PR tier proves unavailable releases through the bug corpus's run
@pytest.mark.launches(1)
def test_a_wrong_expectation_and_an_uninstallable_release(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    scenario = seeded_wrong_scenario(tmp_path)
    code, run, out = sweep(
        results,
        "--scenario", str(scenario),
        "--releases", "0.26.0",
        "--build", str(ROOT / ".venv" / "bin" / "python"),
        "--check", CHECK,
    )  # fmt: skip
    assert code == 1, out
    df = cells(run)
    assert list(df.release) == ["0.26.0", ".venv"] and set(df.check) == {CHECK}
    old, current = df.iloc[0], df.iloc[1]
    # 0.26.0 pins a torch no index here offers: a cell, with the reason, never judged.
    assert old.outcome == "unavailable" and str(old.matched) == "" and "torch" in old.why
    # The current build starts; the seeded rule wanted the #51150 crash.
    assert current.outcome == "started" and current.detail == "answered"
    assert current.expected == "crashed #51150" and str(current.matched) == "False"
    assert str(current.vllm_version).startswith("0.3")
    envs = pd.read_csv(run / "envs.csv", keep_default_na=False)
    assert list(envs.state) == ["unavailable", "ready"]
    sub = Path(current.run_dir)
    assert sub.parent.parent == run / "releases" and (sub / "outcomes.csv").is_file()
    meta = json.loads((run / "run.json").read_text())
    assert meta["exit_code"] == 1 and meta["summary"]["mismatched"] == 1
    report = (run / "report.md").read_text()
    assert report.index("## Not as expected") < report.index("## Release x check")
    assert (run / "heatmap.png").stat().st_size > 1000
    junit = (run / "junit.xml").read_text()
    assert 'failures="1"' in junit and "expected crashed #51150, got started" in junit
    assert "UNEXPECTED .venv" in out


@pytest.mark.weekly
@pytest.mark.nightly
@pytest.mark.launches(2)
def test_two_releases_either_side_of_the_fix(tmp_path):
    """Real release environments (made, or reused from ~/.cache/offload-check/envs)."""
    results = tmp_path / "results"
    results.mkdir()
    code, run, out = sweep(results, "--releases", "0.27.1,0.28.0", "--check", CHECK)
    assert code == 0, out
    df = cells(run)
    assert list(df.release) == ["0.27.1", "0.28.0"]
    assert list(df.outcome) == ["crashed", "started"]
    # pandas reads an all-True column as booleans, one with blanks as text: compare text.
    assert list(df.known) == ["#51150", ""] and list(df.matched.astype(str)) == ["True", "True"]
    assert list(df.vllm_version) == ["0.27.1", "0.28.0"]
    (t,) = json.loads((run / "transitions.json").read_text())
    assert t["changes"] == [
        {"verb": "first good", "from": "crashed #51150", "to": "started", "at": "0.28.0"}
    ]
    assert "first good: 0.28.0" in out
    # A merge of the one shard is the same table; report and compare read sweep runs.
    (results / "merged").mkdir()
    code, again, _ = sweep(results / "merged", "--merge", str(run))
    columns = ["release", "check", "outcome", "known", "matched", "vllm_version"]
    assert code == 0 and cells(again)[columns].equals(df[columns])
    shown = subprocess.run([*CLI, "report", str(run)], capture_output=True, text=True, check=True)
    assert "0.28.0" in shown.stdout and "llama4-small-chunk/connector-on" in shown.stdout
    diff = subprocess.run(
        [*CLI, "compare", str(run), str(again)], capture_output=True, text=True, check=True
    )
    assert "0 row(s) changed" in diff.stdout
