"""The fault sweep's pure logic: which faults run, how each round is judged, and that
every round gets prompts no other round can hit. The engine run is in
tests/integration/test_roundtrip_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.commands import faults as fs
from harness.commands.roundtrip import RoundtripResult
from harness.commands.roundtrip.checks import CheckResult
from harness.errors import BadInput
from harness.scenario.roundtrip import load_roundtrip

ROOT = Path(__file__).resolve().parents[4]


def scenario():
    return load_roundtrip(ROOT / "scenarios" / "roundtrip-cpu.toml")


def _round(fault: str, failing: set[str], names: tuple[str, ...] = ()) -> fs.Round:
    """A round whose result failed exactly ``failing`` out of the round trip's checks."""
    rnd = fs.Round(0, fault, fs.CAUGHT_BY[fault])
    all_names = set(names) | failing | {"kv-layout", "cold-stored-bytes"}
    result = RoundtripResult(plan=None)  # type: ignore[arg-type]
    result.checks = [CheckResult(n, n not in failing, "", "", "", "") for n in sorted(all_names)]
    rnd.result = result
    return rnd


def test_every_fault_of_the_backend_has_its_checks():
    from harness.engine.host_faults import FAULT_MODES

    assert set(fs.CAUGHT_BY) == set(FAULT_MODES)
    assert fs.DEFAULT_FAULTS[0] == "none" and fs.DEFAULT_FAULTS[-1] == "segv-in-worker"


@pytest.mark.parametrize(
    ("fault", "failing", "status"),
    [
        ("none", set(), "passed"),
        ("none", {"replay-output-identical"}, "missed"),
        ("corrupt-load", {"content-matches", "replay-output-identical"}, "caught"),
        # The answers alone are not enough: the content check is the one it is for.
        ("corrupt-load", {"replay-output-identical"}, "missed"),
        # A blind harness: the fault ran and nothing failed.
        ("corrupt-load", set(), "missed"),
        # A harness that blames the wrong thing as well.
        ("partial-load", {"replay-loaded-bytes", "replay-output-identical", "kv-layout"}, "missed"),
        ("partial-load", {"replay-loaded-bytes"}, "missed"),
        (
            "partial-store",
            {"content-matches", "cold-stored-bytes", "replay-output-identical"},
            "caught",
        ),
        ("load-neighbour", {"content-matches", "replay-output-identical"}, "caught"),
    ],
)
def test_a_round_is_caught_only_by_exactly_its_checks(fault, failing, status):
    rnd = _round(fault, failing)
    fs.judge(rnd)
    assert rnd.status == status
    assert rnd.matched is (status in ("passed", "caught"))
    if status == "missed":
        assert rnd.reason.startswith(("did not fail", "failed too"))


def test_a_round_without_checks_did_not_run():
    rnd = fs.Round(3, "no-load", fs.CAUGHT_BY["no-load"])
    fs.judge(rnd)
    assert rnd.status == "not-run" and not rnd.matched
    assert rnd.record()["failing"] == ""


def test_missed_and_unexpected_columns():
    rnd = _round("partial-load", {"content-matches", "replay-output-identical", "kv-layout"})
    fs.judge(rnd)
    rec = rnd.record()
    assert rec["missed"] == "replay-loaded-bytes"
    assert rec["unexpected"] == "kv-layout"
    assert "did not fail: replay-loaded-bytes" in rec["reason"]
    assert "failed too: kv-layout" in rec["reason"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["corrupt"], "unknown fault"),
        (["no-load", "none", "no-load"], "listed once"),
        (["segv-in-worker", "none"], "list it last"),
    ],
)
def test_bad_fault_lists_are_refused(names, message):
    with pytest.raises(BadInput, match=message):
        fs.parse_faults(names)


def test_default_and_explicit_lists():
    assert fs.parse_faults(None) == list(fs.DEFAULT_FAULTS)
    assert fs.parse_faults(["no-load", "none"]) == ["no-load", "none"]
    # A soak: the clean round again and again on one server.
    assert fs.parse_faults(["none"] * 5) == ["none"] * 5


def test_rounds_share_one_server_and_never_share_prompts(tmp_path):
    control = tmp_path / "fault"
    sweep = fs.plan_sweep(scenario(), list(fs.DEFAULT_FAULTS), control)
    assert sweep.base.server is not None
    argv = sweep.base.server.argv()
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == sweep.base.server.kv_transfer
    extra = kv["kv_connector_extra_config"]
    assert extra["offload_check_fault_control"] == str(control)
    assert "offload_check_fault" not in extra
    seeds = [p.scenario.workload.seed for p in sweep.plans]
    # Targets use seed s and fillers s + 1: no two rounds may share either.
    used = [s for seed in seeds for s in (seed, seed + 1)]
    assert len(set(used)) == len(used)
    first_blocks = {tuple(p.targets[0].token_ids[:128]) for p in sweep.plans}
    assert len(first_blocks) == len(sweep.plans)
    assert [p.fault for p in sweep.plans] == list(fs.DEFAULT_FAULTS)
    # Same lengths, so the same expected figures in every round.
    assert len({p.expected.stored_bytes for p in sweep.plans}) == 1
    assert all(p.server is sweep.base.server for p in sweep.plans)


def test_a_scenario_with_a_fixed_fault_is_refused(tmp_path):
    scn = scenario()
    scn.fault = "no-load"
    with pytest.raises(BadInput, match="sets faults itself"):
        fs.plan_sweep(scn, ["none"], tmp_path / "fault")


def test_control_file_is_replaced_whole(tmp_path):
    path = tmp_path / "fault"
    fs.write_control(path, "none")
    inode = path.stat().st_ino
    fs.write_control(path, "no-load")
    assert path.read_text() == "no-load\n"
    assert path.stat().st_ino != inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault"]
