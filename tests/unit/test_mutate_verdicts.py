"""How ``offload-check mutate`` reads a command's run of a mutant: the exit codes, the
failing checks, the first command that noticed, and the commands refused up front."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.commands.mutate import execute as ex
from harness.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def test_exit_codes_read_as_verdicts():
    assert ex.CommandRun("roundtrip", 0, None).verdict == "survived"
    assert ex.CommandRun("roundtrip", 1, None, ["replay-loaded-bytes"]).verdict == "killed"
    assert ex.CommandRun("roundtrip", 3, None).verdict == "killed"  # engine died / no start
    assert ex.CommandRun("roundtrip", 2, None).verdict == "incompetent"  # vLLM no longer imports
    assert ex.CommandRun("roundtrip", None, None).verdict == "timeout"


def test_the_first_command_that_notices_decides_and_the_rest_do_not_run():
    stress = ex.CommandRun("stress", 1, None, ["prefix-reused"], seconds=200.0)
    rt = ex.CommandRun("roundtrip", 0, None, seconds=90.0)
    v = ex.judge_runs([stress])
    assert (v.verdict, v.command, v.failed) == ("killed", "stress", "prefix-reused")
    assert v.detail == "stress: prefix-reused"
    survived = ex.judge_runs([ex.CommandRun("stress", 0, None, seconds=1.0), rt])
    assert survived.verdict == "survived" and survived.seconds == 91.0
    crash = ex.judge_runs([ex.CommandRun("roundtrip", 3, None, last_line="engine died")])
    assert crash.detail == "roundtrip: exit 3: engine died"


def test_failing_checks_come_from_the_runs_checks_csv(tmp_path):
    run = tmp_path / "20261202-run"
    run.mkdir()
    (run / "checks.csv").write_text(
        "name,passed,expected,observed\nengine-survived,True,a,b\nreplay-loaded-bytes,False,c,d\n"
    )
    assert ex.failed_checks(run) == ["replay-loaded-bytes"]
    assert ex.failed_checks(None) == [] and ex.failed_checks(tmp_path / "none") == []


def test_commands_are_roundtrip_stress_or_a_scenario_of_either(tmp_path):
    assert ex.MutateCommand.parse("stress").argv == ("stress",)
    disk = ex.MutateCommand.parse(str(ROOT / "scenarios" / "roundtrip-disk.toml"))
    assert disk.argv[:2] == ("roundtrip", "--scenario") and disk.slug == "roundtrip-disk"
    with pytest.raises(BadInput, match="neither roundtrip, stress nor a scenario"):
        ex.MutateCommand.parse("matrix")
    with pytest.raises(BadInput, match="a matrix scenario; mutate runs roundtrip or stress"):
        ex.MutateCommand.parse(str(ROOT / "scenarios" / "matrix.toml"))


def test_a_broken_import_is_named_by_its_last_line(tmp_path):
    assert ex.import_check(sys.executable, "json") == ""
    assert "No module named" in ex.import_check(sys.executable, "no_such_module_here")


def test_reached_names_the_commands_whose_clean_run_executed_the_line():
    covered = {"stress": [10, 11, 40], "roundtrip": [10, 12]}
    assert ex.reached_by(10, covered) == "stress,roundtrip"
    assert ex.reached_by(40, covered) == "stress"
    assert ex.reached_by(99, covered) == ""
