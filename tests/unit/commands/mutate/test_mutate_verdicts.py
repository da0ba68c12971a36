"""How ``offload-check mutate`` reads a command's run of a mutant: the exit codes, the
failing checks, the first command that noticed, and the commands refused up front."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands.mutate import execute as ex
from harness.errors import BadInput
from tests.conftest import CLI

ROOT = Path(__file__).resolve().parents[4]


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


def test_commands_are_a_run_command_the_suite_or_a_scenario_of_one(tmp_path):
    assert ex.MutateCommand.parse("stress").argv == ("stress",)
    assert ex.MutateCommand.parse("pressure").argv == ("pressure",)
    # The oracle stops at its first failing cell and shrinks nothing: a kill needs one.
    drive = ex.MutateCommand.parse("oracle-drive")
    assert drive.argv == ("oracle", "--engine", "drive", "--no-shrink", "--fail-fast")
    assert drive.kind == "oracle" and drive.slug == "oracle-drive"
    disk = ex.MutateCommand.parse(str(ROOT / "scenarios" / "roundtrip-disk.toml"))
    assert disk.argv[:2] == ("roundtrip", "--scenario") and disk.slug == "roundtrip-disk"
    oracle = ex.MutateCommand.parse(str(ROOT / "scenarios" / "oracle.toml"))
    assert oracle.argv[:3] == ("oracle", "--no-shrink", "--fail-fast")
    assert oracle.argv[3] == "--scenario" and oracle.slug == "oracle"
    listing = "neither suite, roundtrip, stress, pressure, pressure-replay, oracle"
    with pytest.raises(BadInput, match=listing):
        ex.MutateCommand.parse("matrix")
    with pytest.raises(BadInput, match="a matrix scenario; mutate runs roundtrip, stress"):
        ex.MutateCommand.parse(str(ROOT / "scenarios" / "matrix.toml"))


READ_EIO = [
    "disk-errors",
    "disk-read-bytes",
    "disk-written-bytes",
    "replay-external-hits",
    "replay-loaded-bytes",
]


def test_a_seeded_faults_scenario_expects_its_own_checks_to_fail_on_the_releases_it_names():
    """The read-EIO round trip names its five checks from 0.28.0; before that the release
    crashes at start (#51150), which is no expectation a mutant could be judged by."""
    cmd = ex.MutateCommand.parse(str(ROOT / "scenarios" / "roundtrip-disk-read-eio.toml"))
    assert cmd.expect_failing == frozenset()
    assert cmd.expecting("0.32.0").expect_failing == frozenset(READ_EIO)
    assert cmd.expecting("0.32.0").argv == cmd.argv
    assert cmd.expecting("0.27.1").expect_failing == frozenset()
    # A clean scenario and the run commands expect every check to pass.
    clean = ex.MutateCommand.parse(str(ROOT / "scenarios" / "roundtrip-disk.toml"))
    assert clean.expecting("0.32.0") == clean
    assert ex.MutateCommand.parse("roundtrip").expecting("0.32.0").expect_failing == frozenset()
    # The suite's restart round trip names the same five from 0.29.0; on 0.28.0 the new
    # server finds no file (#51875), so the fault never acts and the restart's own fail.
    restart = ex.MutateCommand.parse(str(ROOT / "scenarios" / "roundtrip-restart-read-eio.toml"))
    assert restart.expecting("0.32.0").expect_failing == frozenset(READ_EIO)
    assert restart.expecting("0.29.0", "cuda").expect_failing == frozenset(READ_EIO)
    assert restart.expecting("0.28.0").expect_failing == {
        "disk-files", "disk-hits", "disk-read-bytes", "replay-external-hits",
        "replay-loaded-bytes",
    }  # fmt: skip
    assert ex.READ_EIO_SCENARIO.name == "roundtrip-restart-read-eio.toml"
    # By its name too (the default suite's last command).
    named = ex.MutateCommand.parse("roundtrip-read-eio").expecting("0.32.0")
    assert named.expect_failing == frozenset(READ_EIO) and named.slug == "roundtrip-read-eio"


def test_a_seeded_fault_survives_by_failing_exactly_its_checks_and_is_noticed_otherwise():
    want = frozenset(READ_EIO)
    as_expected = ex.CommandRun("rt", 1, None, list(READ_EIO), expected=want)
    assert as_expected.verdict == "survived" and as_expected.noticed == []
    assert ex.judge_runs([as_expected]).detail == (
        "every command passed; rt failed exactly its seeded fault's checks"
    )
    # A check beyond the fault's: the mutant is told apart by it, not by the fault's own.
    extra = ex.CommandRun("rt", 1, None, [*READ_EIO, "tier-idle"], expected=want)
    assert extra.verdict == "killed" and extra.noticed == ["tier-idle"]
    # One of the fault's checks passing is a difference too (the fault no longer seen).
    fewer = ex.CommandRun("rt", 1, None, READ_EIO[1:], expected=want)
    assert fewer.verdict == "killed" and fewer.noticed == ["disk-errors passed"]
    # An engine that died judged nothing else: its fault's checks did not "pass".
    died = ex.CommandRun("rt", 1, None, ["engine-survived"], expected=want)
    assert died.verdict == "killed" and died.noticed == ["engine-survived"]
    v = ex.judge_runs([extra])
    assert (v.verdict, v.failed) == ("killed", "tier-idle")
    assert "expected failing exactly disk-errors" in v.detail
    # Every check passing is not what a seeded fault's run may do either.
    clean = ex.CommandRun("rt", 0, None, expected=want)
    assert clean.verdict == "killed" and "every check passed" in clean.detail()
    assert ex.CommandRun("rt", 3, None, expected=want).verdict == "killed"
    assert ex.CommandRun("rt", 2, None, expected=want).verdict == "incompetent"


def test_the_suite_is_every_command_cheapest_first_in_one_word():
    cmds = ex.MutateCommand.parse_all(["suite"])
    assert [c.name for c in cmds] == list(ex.SUITE)
    kinds = ["oracle", "oracle", "stress", "roundtrip", "pressure", "roundtrip"]
    assert [c.kind for c in cmds] == kinds
    assert [c.name for c in ex.MutateCommand.parse_all(["oracle-drive", "stress"])] == [
        "oracle-drive",
        "stress",
    ]


def test_a_broken_import_is_named_by_its_last_line(tmp_path):
    assert ex.import_check(sys.executable, "json") == ""
    assert "No module named" in ex.import_check(sys.executable, "no_such_module_here")


def test_reached_names_the_commands_whose_clean_run_executed_the_line():
    covered = {"stress": [10, 11, 40], "roundtrip": [10, 12]}
    assert ex.reached_by(10, covered) == "stress,roundtrip"
    assert ex.reached_by(40, covered) == "stress"
    assert ex.reached_by(99, covered) == ""


def test_a_mutant_runs_only_the_commands_whose_clean_run_executed_its_line():
    """A command that never ran the line sees the same run on the mutant: it is left
    out (in the session's order), and a survivor's detail names what it did not face."""
    cmds = ex.MutateCommand.parse_all(["oracle-drive", "stress", "roundtrip"])
    covered = {"oracle-drive": [7, 2072], "stress": [7, 1859], "roundtrip": [7]}
    assert [c.name for c in ex.commands_reaching(2072, cmds, covered)] == ["oracle-drive"]
    assert [c.name for c in ex.commands_reaching(1859, cmds, covered)] == ["stress"]
    assert ex.commands_reaching(7, cmds, covered) == cmds  # module-level: every command
    assert ex.commands_reaching(99, cmds, covered) == []
    assert ex.commands_reaching(7, cmds, {"stress": [7]}) == [cmds[1]]  # no baseline: not run
    drive = ex.CommandRun("oracle-drive", 0, None, seconds=30.0)
    v = ex.judge_runs([drive], ["stress", "roundtrip"])
    assert (v.verdict, v.seconds) == ("survived", 30.0)
    assert v.detail == (
        "every command that executed its line passed (oracle-drive); not run: stress, "
        "roundtrip (their unmutated runs never executed it)"
    )
    assert ex.judge_runs([drive]).detail == "every command passed"


def rec(
    id_: str, verdict: str, line: int = 1, reached: str = "", command: str = "", failed: str = ""
):
    from harness.results.records import MutantRecord

    return MutantRecord(
        id_, "vllm.x", line, "f", "Op", "`a` -> `b`", verdict, command, failed, reached=reached
    )


def test_a_kill_is_a_checks_when_any_check_beyond_the_engines_named_it():
    from harness.commands.mutate.files import detected_by

    def by(failed: str, verdict: str = "killed") -> str:
        return detected_by(rec("m", verdict, failed=failed))

    assert by("hit-tokens (lru),loaded-bytes (lru)") == "check"
    assert by("engine-survived (full-attention/prompt/drive)") == "engine"
    assert by("ran (full-attention/prompt/drive)") == "engine"  # the drive could not set up
    assert by("engine-survived,no-request-errored,engine-log-clean") == "engine"
    assert by("") == "engine"  # exit 3, or a run not as expected with no check named
    assert by("engine-survived,content-matches") == "check"  # judged before it died
    assert by("tier-idle,disk-errors passed") == "check"  # a seeded fault's run told apart
    assert by("", verdict="timeout") == "stall"


def test_the_score_counts_what_changed_behaviour_and_timeouts_as_noticed():
    from harness.commands.mutate.files import report_md, score

    rows = [
        rec("a", "killed", command="stress", failed="engine-survived,no-request-errored"),
        rec("b", "killed", command="roundtrip", failed="replay-loaded-bytes"),
        rec("c", "timeout", command="stress"),
        rec("d", "survived", line=40, reached=""),
        rec("e", "survived", line=50, reached="roundtrip"),
        rec("f", "incompetent", command="import"),
        rec("g", ""),  # not run yet
    ]
    s = score(rows)
    assert (s.detected, s.scored, s.survived, s.survived_reached) == (3, 5, 2, 1)
    assert s.value == 0.6 and s.by_command == {"stress": 2, "roundtrip": 1}
    assert s.by_kind == {"engine": 1, "check": 1, "stall": 1}
    assert s.text() == (
        "3/5 detected (60%), 1 by an accounting or output check; 2 survived, 1 of them on "
        "lines a run executed"
    )
    assert (
        "- how: an accounting or output check 1, a dead engine or a refused run 1, a stall 1"
        in (report_md(rows, {}))
    )
    md = report_md(rows, {"target": "vllm.x", "commands": ["stress", "roundtrip"]})
    survivors = md[md.index("## Survivors") : md.index("## Every mutant")]
    assert survivors.index("| e |") < survivors.index("| d |")  # reached ones first
    assert "| d | 40 | f | `a` -> `b` | not reached |" in survivors
    assert score([]).text() == "no mutant judged yet"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "mutate needs --target"),
        (("--target", "vllm.v1.kv_offload.cpu.manager", "--command", "nope"), "--command nope"),
        (
            ("--target", "vllm.v1.kv_offload.cpu.manager", "--command", "roundtrip",
             "--mutant", "000000000000"),
            "--mutant 000000000000: no mutant of vllm/v1/kv_offload/cpu/manager.py",
        ),
        (
            ("--target", "vllm.v1.kv_offload.cpu.manager", "--command", "roundtrip",
             "--sample", "3", "--all"),
            "give one of --sample N, --all and --mutant ID",
        ),
        (("--target", "packaging.version", "--command", "roundtrip"), "not vLLM's code"),
        (("--resume", "/nonexistent"), "no session.sqlite there"),
        (("--merge", "/nonexistent", "--target", "x"), "--merge takes the session's own plan"),
        (("--target", "x", "--port", "8000", "--command", "roundtrip"), "--port does not apply"),
    ],
)  # fmt: skip
def test_bad_mutate_input_is_one_line_and_exit_2(args, message, tmp_path):
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "harness", "mutate", *args, "--dry-run",
         "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_a_dry_run_lists_the_sample_the_same_on_every_run(tmp_path):
    import json
    import subprocess

    def plan() -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "mutate", "--target",
             "vllm.v1.kv_offload.cpu.policies.lru", "--command", "roundtrip", "--sample", "3",
             "--seed", "1", "--dry-run", "--json", "--results-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=120, cwd=ROOT, check=True,
        )  # fmt: skip
        return json.loads(proc.stdout)

    first = plan()
    assert first["command"] == "mutate" and first["relpath"].endswith("policies/lru.py")
    assert len(first["mutants"]) == 3 and first["total_mutants"] > 3
    assert [m["id"] for m in plan()["mutants"]] == [m["id"] for m in first["mutants"]]


def test_the_failing_checks_are_read_from_whichever_checks_file_the_command_wrote(tmp_path):
    """A kill names the check that saw it: the oracle's per cell, pressure's per server
    (its ``matched`` is the verdict: a known deviation that failed still matched)."""
    oracle = tmp_path / "oracle"
    oracle.mkdir()
    (oracle / "oracle-checks.csv").write_text(
        "cell,check,passed,requests,failed,allowed\n"
        "chunked-local/prompt/drive,hit-tokens,True,60,0,False\n"
        "chunked-local/prompt/drive,stored-chunks,False,60,3,False\n"
        "mla/prompt/drive,loaded-bytes,True,60,2,True\n"
    )
    assert ex.failed_checks(oracle) == ["stored-chunks (chunked-local/prompt/drive)"]
    pressure = tmp_path / "pressure"
    pressure.mkdir()
    (pressure / "pressure-checks.csv").write_text(
        "server,round,check,passed,matched\n"
        "lru,clean,hit-tokens,False,True\n"
        "arc,clean,stored-bytes,True,False\n"
    )
    assert ex.failed_checks(pressure) == ["stored-bytes (arc)"]


@pytest.mark.parametrize("name", sorted(ex.RUN_COMMANDS))
def test_every_command_mutate_runs_takes_the_mutant_interpreter(name):
    """mutate runs each command with ``--python <the mutant's copy>``: a command without
    that option fails the baseline on every build (pressure did, until it had one)."""
    cmd = ex.MutateCommand.parse(name)
    python = str(ROOT / ".venv" / "bin" / "python")
    argv = [*cmd.argv, "--python", python, "--dry-run"]
    proc = subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, (argv, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr


def test_an_engine_that_dies_mid_run_is_a_failed_run_not_bad_input():
    """pressure lets vLLM's failure end its run: that is exit 1 (the build failed), so a
    mutant that kills the engine there is killed, not incompetent (exit 2 said so)."""
    from harness.commands.roundtrip.run import EngineFailure
    from harness.errors import ExitCode

    err = EngineFailure("threshold-2 clean request 0 (A4)", "AssertionError in manager.py", "")
    assert err.exit_code == ExitCode.MISMATCH
    run = ex.CommandRun("pressure", int(err.exit_code), None)
    assert run.verdict == "killed"


def test_without_a_command_mutate_runs_the_default_suite(tmp_path):
    """No --command is the question a user asks first ("is my build right?"): the suite."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "harness", "mutate", "--target", "vllm.v1.kv_offload.cpu.manager",
         "--sample", "1", "--dry-run", "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())  # rich wraps at the pipe's width
    assert f"(the first that fails a mutant kills it): {', '.join(ex.SUITE)};" in said


def test_the_baselines_are_dealt_to_lanes_longest_first():
    """Pressure's four servers and the oracle's five first, the drive and the round trip
    last: in session order the two longest met in one lane (16 min where 12 would do)."""
    cmds = ex.MutateCommand.parse_all(["suite"])
    order = [c.name for c in ex.longest_first(cmds)]
    assert order == [
        "pressure", "oracle-server", "stress", "roundtrip-read-eio", "oracle-drive", "roundtrip",
    ]  # fmt: skip
    scenario = ex.MutateCommand.parse(str(ROOT / "scenarios" / "pressure.toml"))
    first = ex.longest_first([ex.MutateCommand.parse("roundtrip"), scenario])
    assert first[0] is scenario  # a scenario file weighs as its kind
