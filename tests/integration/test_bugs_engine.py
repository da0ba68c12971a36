"""offload-check bugs on real vLLM builds: each entry's trigger through the real connector,
one server at a time, judged both ways.

The PR tier runs the cheapest live entry, #57727 (a prefix-cache reset that answers
success while the CPU tier keeps serving), on the current build: its script must fail
exactly the check the entry names, with the control (a reset with reset_external=true)
passing on the same server; a release that cannot be installed is a cell, never judged.
The nightly tier runs the AMX-only entry (skipped on hosts without AMX, reproduced where
there is AMX: the PR tier's crash-repro already launches that SIGILL there), #51150 on
releases either side of its fix, with a seeded wrong entry sharing its launches, and
#57596 on both, the four scripts that share one server (#49118's queued abort among
them), and every entry's trigger whose bug lived only in releases this machine cannot
install on the current build with its fix undone (``seeded_by``: #49118).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.engine.amx import cpu_flags
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.engine
CORPUS = ROOT / "scenarios" / "bugs"
HAS_AMX = "amx_tile" in cpu_flags()


def bugs_cli(results: Path, *args: str) -> tuple[int, Path, str]:
    return run_cli(results, "bugs", *args, timeout=3600)


def corpus_copy(tmp_path: Path, *entries: tuple[str, str, dict[str, str]]) -> Path:
    """Entries copied into a corpus of their own (paths made absolute), each as
    (source id, new id, text replacements): a seeded wrong entry is a copy with its
    ranges changed."""
    out = tmp_path / "corpus"
    out.mkdir()
    for source, new, changes in entries:
        text = (CORPUS / f"{source}.toml").read_text()
        text = text.replace('"../', f'"{ROOT}/scenarios/')
        text = text.replace(f'id = "{source}"', f'id = "{new}"')
        for old, replacement in changes.items():
            assert old in text, old
            text = text.replace(old, replacement)
        (out / f"{new}.toml").write_text(text)
    return out


def table(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "bugs.csv", keep_default_na=False, dtype=str)


CURRENT = str(ROOT / ".venv" / "bin" / "python")


@pytest.mark.launches(1)
def test_a_live_bug_reproduces_and_its_control_passes(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    code, run, out = bugs_cli(results, "--bug", "57727", "--releases", "0.26.0", "--build", CURRENT)
    assert code == 0, out
    df = table(run)
    # #57727 says nothing of 0.26.0 (affected >=0.27.0): a cell, with the reason, never
    # judged, and never run (not even installed: that release pins a torch no index here
    # offers, which would have made it unavailable).
    old = df[df.release == "0.26.0"].set_index("bug")
    assert set(old.matched) == {""}
    assert old.loc["57727"].outcome == "not-judged" and "not run" in old.loc["57727"].why
    envs = pd.read_csv(run / "envs.csv", keep_default_na=False)
    assert "0.26.0" not in set(envs.release.astype(str))
    df = df[df.release == ".venv"]
    live = df[df.bug == "57727"].iloc[0]
    assert (live.outcome, live.expected, live.matched) == ("reproduced", "reproduced", "True")
    assert live.observed == "fail" and live.signature == "fails reset-clears-offloaded"
    # The script's own run: the reset answered success, yet the replay was served from
    # the CPU tier; the control reset emptied it.
    checks = pd.read_csv(Path(live.run_dir) / "checks.csv", keep_default_na=False)
    verdict = dict(zip(checks.name, checks.passed.astype(str), strict=True))
    assert verdict == {
        "stored-before-reset": "True",
        "reset-answered-success": "True",
        "reset-clears-offloaded": "False",
        "external-reset-clears": "True",
    }
    observed = checks.set_index("name").observed["reset-clears-offloaded"]
    assert observed.startswith("external_hits since after-reset = ") and not observed.endswith(
        "= 0"
    )
    steps = pd.read_csv(Path(live.run_dir) / "steps.csv", keep_default_na=False, dtype=str)
    assert list(steps.do).count("reset-prefix-cache") == 2
    assert set(steps[steps.do == "reset-prefix-cache"].http_status) == {"200"}
    meta = json.loads((run / "run.json").read_text())
    assert meta["exit_code"] == 0 and meta["summary"]["unmatched"] == 0
    report = (run / "report.md").read_text()
    assert "## Bug x release" in report and "reset_external=true" in report
    assert 'failures="0"' in (run / "junit.xml").read_text()
    assert "offload-check bugs --bug 57727" in out


@pytest.mark.nightly
@pytest.mark.launches(0)  # +1 on AMX hosts, where the entry's SIGILL is reproduced
def test_the_amx_entry_follows_the_host(tmp_path):
    """The AMX-only entry runs only where there is AMX: reproduced there, and not run on
    a release it says nothing of (0.26.0: neither affected nor fixed, so the corpus does
    not even make its environment); skipped (the host lacks AMX) elsewhere. The host
    decides, not the test."""
    results = tmp_path / "results"
    results.mkdir()
    code, run, out = bugs_cli(
        results, "--bug", "amx-sigill", "--releases", "0.26.0", "--build", CURRENT
    )
    assert code == 0, out
    df = table(run).set_index("release")
    old, amx = df.loc["0.26.0"], df.loc[".venv"]
    assert old.matched == ""
    if HAS_AMX:
        assert old.outcome == "not-judged" and "not run" in old.why
        assert (amx.outcome, amx.matched) == ("reproduced", "True"), out
    else:
        assert old.outcome == "skipped" and "amx_tile" in old.why
        assert amx.outcome == "skipped" and amx.matched == "" and "amx_tile" in amx.why


@pytest.mark.weekly
@pytest.mark.nightly
@pytest.mark.launches(4)
def test_releases_either_side_of_a_fix_and_a_wrong_entry(tmp_path):
    """Real 0.27.1 and 0.28.0 environments (made, or reused from the envs cache)."""
    results = tmp_path / "results"
    results.mkdir()
    corpus = corpus_copy(
        tmp_path,
        ("51150", "51150", {}),
        # Seeded wrong: says the crash lives on in every release. It shares #51150's
        # trigger (one launch per build) and must be unmatched on 0.28.0 only.
        (
            "51150",
            "wrong",
            {'affected = "<0.28.0"': 'affected = "<99"', 'fixed = ">=0.28.0"\n': ""},
        ),
        ("57596", "57596", {}),
    )
    code, run, out = bugs_cli(results, "--corpus", str(corpus), "--releases", "0.27.1,0.28.0")
    assert code == 1, out
    df = table(run).set_index(["bug", "release"])
    assert df.loc[("51150", "0.27.1")].outcome == "reproduced"
    assert df.loc[("51150", "0.28.0")].outcome == "passed"
    assert df.loc[("57596", "0.27.1")].outcome == "reproduced"
    assert df.loc[("57596", "0.28.0")].outcome == "reproduced"
    unmatched = df[df.matched == "False"]
    assert list(unmatched.index) == [("wrong", "0.28.0")]
    assert unmatched.iloc[0].why == "did not reproduce on a release the bug lived in"
    assert (df[df.matched != "False"].matched == "True").all()
    sub = Path(df.loc[("57596", "0.28.0")].run_dir)
    checks = pd.read_csv(sub / "checks.csv", keep_default_na=False)
    failing = set(checks[checks.passed.astype(str) == "False"].name)
    assert failing == {"logprobs-not-an-external-query"}


@pytest.mark.weekly
@pytest.mark.nightly
@pytest.mark.launches(1)
def test_four_scripts_share_one_server_each_judged_as_alone(tmp_path):
    """#49118, #54193, #57596 and #57727 ask for the same server
    (harness/commands/bugs/groups.py): on 0.29.0, where the last three bugs live and the
    first is fixed, one launch serves the four scripts in turn, a reset of both caches
    between them, and each is judged as it would be alone: #49118's queued request is
    aborted and stores nothing, the others fail exactly their own checks."""
    results = tmp_path / "results"
    results.mkdir()
    bugs = ("49118", "54193", "57596", "57727")
    code, run, out = bugs_cli(
        results, *[a for b in bugs for a in ("--bug", b)], "--releases", "0.29.0"
    )
    assert code == 0, out
    df = table(run).set_index("bug")
    assert set(df.matched) == {"True"}, df
    assert df.loc["49118"].outcome == "passed"
    assert set(df.drop(index="49118").outcome) == {"reproduced"}, df
    assert df.loc["54193"].signature == "fails unwritten-slot-not-stored, no-hit-on-unwritten-slot"
    assert df.loc["57596"].signature == "fails logprobs-not-an-external-query"
    assert df.loc["57727"].signature == "fails reset-clears-offloaded"
    group = run / "releases" / "0.29.0" / "bug-49118+54193+57596+57727"
    logs = sorted(p.name for p in (group / "logs").iterdir() if p.suffix == ".log")
    assert logs == ["server.log"], logs  # one server, no restart between the scripts
    assert "Application startup complete" in (group / "logs" / "server.log").read_text()
    for i, bug in enumerate(bugs):
        meta = json.loads((group / bug / "run.json").read_text())
        assert meta["bug"] == bug and meta["shared_server"] == (list(bugs[:i]) or None), meta
        assert meta["server_log"] == str(group / "logs" / "server.log")
        assert (group / bug / "checks.csv").is_file() and (group / bug / "steps.csv").is_file()
    steps = pd.read_csv(group / "49118" / "steps.csv", keep_default_na=False, dtype=str)
    queued = steps.set_index("name").detail["queued"]
    assert "aborted while waiting (queue: 1 running, 1 waiting" in queued, queued


SEEDED = [e for e in sorted(CORPUS.glob("*.toml")) if "\nseeded_by = " in e.read_text()]


@pytest.mark.weekly
@pytest.mark.nightly
@pytest.mark.launches(1)
@pytest.mark.parametrize("path", SEEDED, ids=[p.stem for p in SEEDED])
def test_a_bug_no_installable_release_has_is_caught_with_its_fix_undone(tmp_path, path):
    """A bug that lived only in releases this machine cannot install (#49118) has cells
    here that can only pass. Its entry names the patch that undoes its fix
    (``seeded_by``): on the current build with it, the trigger must show exactly the
    entry's symptom (#49118: the queued request's abort kills the engine in
    _build_store_jobs)."""
    from harness.scenario.bugs import load_bug

    entry = load_bug(path)
    assert entry.seeded_by and entry.fixed
    results = tmp_path / "results"
    results.mkdir()
    env = 'env = { VLLM_SERVER_DEV_MODE = "1" }'
    patched = f'env = {{ VLLM_SERVER_DEV_MODE = "1", OFFLOAD_CHECK_PATCH = "{entry.seeded_by}" }}'
    ranges = f'affected = "{entry.affected}"\nfixed = "{entry.fixed}"'
    corpus = corpus_copy(
        tmp_path, (entry.id, entry.id, {ranges: 'affected = ">=0.27.0"', env: patched})
    )
    code, run, out = bugs_cli(results, "--corpus", str(corpus), "--build", CURRENT)
    assert code == 0, out
    cell = table(run).iloc[0]
    assert (cell.outcome, cell.matched) == ("reproduced", "True"), cell
    log = (Path(cell.run_dir) / "logs" / "server.log").read_text()
    assert f"offload-check patch: {entry.seeded_by} applied" in log
    if entry.id == "49118":
        assert cell.observed == "crashed" and cell.signature.endswith(
            "scheduler.py:_build_store_jobs"
        ), cell.signature
        assert cell.detail.startswith("during step queued: assert len(offload_keys) ==")
