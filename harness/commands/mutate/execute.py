"""Running a mutation session: each mutant in its own copy of the environment, through
the harness's own commands, until one of them notices it.

Why whole commands and not unit tests: the point is what ``offload-check`` itself would
catch, so a mutant is judged exactly as a user's build would be: ``offload-check
roundtrip`` (or ``stress``, or a scenario of either) launched with ``--python`` pointing
at the mutant's copy. Exit 0 is the mutant going unnoticed by that command; exit 1 is
a check failing (``killed``, with the failing checks read from the command's own
``checks.csv``); exit 3 the engine dying or a server not starting (``killed``, a crash);
exit 2 the harness refusing the interpreter (the mutant broke vLLM's import:
``incompetent``); past the time limit, ``timeout``. A mutant killed by one command does
not run the next.

Before any mutant, each command runs once on the unmutated environment with the engine
processes' line tracer on (``harness.engine.reach``): a command that fails there is
refused (it would kill every mutant), and the lines it executed decide what a mutant
runs: only the commands whose unmutated run executed its line (``--run-unreached``: every
command), and none when no command did (a survivor, recorded without a run). A command
that seeds a fault
(a round-trip scenario whose rules name the checks that catch it on this release) must
fail exactly those checks there instead, and a mutant is noticed by any other outcome.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from harness.commands.mutate import sandbox
from harness.commands.mutate.mutants import mutated_source
from harness.engine import amx
from harness.engine.reach import read_lines
from harness.errors import BadInput, ExitCode, RuntimeFailure
from harness.names import ENV_COVER, ENV_COVER_OUT, REPO_ROOT
from harness.scenario.kinds import load_any
from harness.scenario.roundtrip import expectation_for
from harness.server import lanes, launcher, server_lock
from harness.server.side_by_side import run_in_lanes
from harness.server.stall_watch import STALL_S

# Seconds a command may take per mutant; a mutant that makes the engine spin past this
# is a ``timeout`` (roundtrip about 2 minutes here, the default stress about 5).
DEFAULT_TIMEOUT_S = 1200.0
IMPORT_TIMEOUT_S = 300.0  # a cold import of vLLM without bytecode takes ~25 s here
STOP_GRACE_S = 90.0  # after SIGINT, the harness stops its servers and writes its results


ENGINE_DIED = "engine-survived"  # the check a command fails when vLLM raised or died mid-run
READ_EIO_SCENARIO = REPO_ROOT / "scenarios" / "roundtrip-restart-read-eio.toml"
# The harness commands a mutant can run through, and the argv each runs with: the
# oracle stops at its first failing cell and does not shrink (a kill needs one failure).
RUN_COMMANDS: dict[str, tuple[str, ...]] = {
    "roundtrip": ("roundtrip",),
    "stress": ("stress",),
    "pressure": ("pressure",),
    # The build's own manager and policies against the oracle, no server: any build from
    # 0.31, a CUDA wheel's on a CPU host included (pressure --replay).
    "pressure-replay": ("pressure", "--replay"),
    "oracle": ("oracle", "--no-shrink", "--fail-fast"),
    "oracle-drive": ("oracle", "--engine", "drive", "--no-shrink", "--fail-fast"),
    "oracle-server": ("oracle", "--engine", "server", "--no-shrink", "--fail-fast"),
    # The restart round trip with every disk read failing (a seeded fault judged by its
    # scenario's rules: ``MutateCommand.expecting``): vLLM's failure paths, which no clean
    # run takes, on a roomy CPU tier where the chunks a failed promotion frees stay freed
    # (the scenario's header says why not the filler-evicted ``roundtrip-disk-read-eio``).
    "roundtrip-read-eio": ("roundtrip", "--scenario", str(READ_EIO_SCENARIO)),
}
SCENARIO_KINDS = ("roundtrip", "stress", "pressure", "oracle")
# What a user runs to ask "is my build right?", cheapest and most telling first: the
# oracle on vLLM's scheduler in one process (seconds a mutant), then on live servers,
# then concurrency against a reference, the round trip, the CPU tier under eviction, and
# last a disk tier whose reads fail (a build must lose those hits cleanly and free what
# it held for them).
SUITE = ("oracle-drive", "oracle-server", "stress", "roundtrip", "pressure", "roundtrip-read-eio")


# Minutes each command's baseline took here under the line tracer, one core a lane
# (2026-12-06, the CPU manager's session: pressure's four servers 9.0, the oracle's five
# 6.8, stress with its reference 4.3, the restart round trip 1.8, the drive 1.4, the round
# trip 0.8). Only their order matters: the baselines are dealt to lanes longest first, so
# the longest do not end up one after another in one lane while the other lane idles
# (in that session, pressure after the oracle's servers: 16 min where 12 would do). A
# scenario file weighs as its kind.
BASELINE_MINUTES: dict[str, float] = {
    "pressure": 9.0,
    "oracle": 8.2,
    "oracle-server": 6.8,
    "stress": 4.3,
    "roundtrip-read-eio": 1.8,
    "oracle-drive": 1.4,
    "roundtrip": 0.8,
    "pressure-replay": 0.5,
}


def longest_first(commands: Sequence[MutateCommand]) -> list[MutateCommand]:
    """The commands in the order their baselines are dealt to lanes: longest first (the
    classic longest-processing-time rule), ties in the session's order."""

    def minutes(cmd: MutateCommand) -> float:
        return BASELINE_MINUTES.get(cmd.name, BASELINE_MINUTES.get(cmd.kind, 1.0))

    return sorted(commands, key=minutes, reverse=True)


@dataclass(frozen=True)
class MutateCommand:
    """One harness command a mutant is run through: one of ``RUN_COMMANDS``, or a
    scenario file of a kind those run (its kind decides the command)."""

    name: str  # as given on the command line; the column in the report
    argv: tuple[str, ...]  # after ``offload-check``
    # The checks its scenario expects to fail on the build (a seeded fault's, ``outcome =
    # "fail"``): the unmutated run must fail exactly these, and a mutant is noticed when
    # its run fails any other, or one of these passes. Empty: every check must pass.
    expect_failing: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> MutateCommand:
        if text in RUN_COMMANDS:
            return cls(text, RUN_COMMANDS[text])
        path = Path(text)
        names = ", ".join(RUN_COMMANDS)
        if not path.is_file():
            raise BadInput(f"--command {text}: neither suite, {names} nor a scenario file")

        kind, _ = load_any(path)
        if kind not in SCENARIO_KINDS:
            raise BadInput(
                f"--command {text}: a {kind} scenario; mutate runs {', '.join(SCENARIO_KINDS)}"
            )
        return cls(text, (*RUN_COMMANDS[kind], "--scenario", str(path.resolve())))

    @classmethod
    def parse_all(cls, texts: Sequence[str]) -> list[MutateCommand]:
        """Each ``--command``; ``suite`` stands for ``SUITE``, in its order."""
        out: list[MutateCommand] = []
        for text in texts:
            out += [cls.parse(t) for t in SUITE] if text == "suite" else [cls.parse(text)]
        return out

    def expecting(self, vllm_version: str, device: str = "cpu") -> MutateCommand:
        """The command with what its round-trip scenario's rules expect to fail on this
        build (``expect_failing``): a scenario that seeds a fault and names the checks
        that catch it (``scenarios/roundtrip-restart-read-eio.toml``) is a command too, so
        the fault's paths in vLLM (a failed read, a freed chunk) are reached by a run
        that is judged, not by one that fails anyway. The rule is chosen as the sweep's
        verdict chooses it (``scenario.roundtrip.expectation_for``), for the build's
        ``device`` (the interpreter's probe: rules may say where they hold)."""
        if self.kind != "roundtrip" or "--scenario" not in self.argv:
            return self
        _, scn = load_any(Path(self.argv[self.argv.index("--scenario") + 1]))
        found = expectation_for(scn.expectations, vllm_version, device, amx.cpu_flags())
        if found is None or found.rule.outcome != "fail":
            return self
        return replace(self, expect_failing=frozenset(found.rule.failing_checks))

    @property
    def slug(self) -> str:
        return Path(self.name).stem if self.name not in RUN_COMMANDS else self.name

    @property
    def kind(self) -> str:
        """The harness command it runs (``roundtrip``, ``stress``, ...)."""
        return self.argv[0]

    def stalling_after(self, seconds: float | None) -> MutateCommand:
        """The same command, its stall watch's window ``seconds`` (stress only)."""
        if seconds is None or self.kind != "stress":
            return self
        return replace(self, argv=(*self.argv, "--stall-after", f"{seconds:g}"))


@dataclass
class CommandRun:
    """One command's run on one environment: its exit, its run directory, what failed."""

    command: str
    code: int | None  # None: timed out
    run_dir: Path | None
    failed: list[str] = field(default_factory=list)
    last_line: str = ""
    seconds: float = 0.0
    first_observed: str = ""  # what the first failing check saw (a crash's signature)
    expected: frozenset[str] = frozenset()  # the command's ``expect_failing``

    @property
    def verdict(self) -> str:
        """survived / killed / timeout / incompetent, for this command alone: survived is
        every check passing, or, for a seeded fault's command, exactly its checks failing."""
        if self.code is None:
            return "timeout"
        if self.code == ExitCode.BAD_INPUT:
            return "incompetent"
        if self.expected:
            as_expected = self.code == ExitCode.MISMATCH and set(self.failed) == self.expected
            return "survived" if as_expected else "killed"
        if self.code == ExitCode.OK:
            return "survived"
        return "killed"

    @property
    def noticed(self) -> list[str]:
        """The checks that told this run from what was expected: those failing (beyond a
        seeded fault's own), then a fault's checks that passed."""
        extra = [f for f in self.failed if f not in self.expected]
        # A run whose engine died judged nothing else: the fault's checks did not pass.
        judged = self.code == ExitCode.MISMATCH and not any(
            f.startswith(ENGINE_DIED) for f in self.failed
        )
        held = sorted(self.expected - set(self.failed)) if judged else []
        return extra + [f"{name} passed" for name in held]

    def detail(self) -> str:
        if self.code is None:
            return f"{self.command}: past the time limit"
        if self.expected:
            want = f"expected failing exactly {', '.join(sorted(self.expected))}"
            if self.code == ExitCode.OK:
                return f"{self.command}: every check passed ({want})"
            if self.code == ExitCode.MISMATCH:
                return f"{self.command}: {', '.join(self.noticed) or 'as expected'} ({want})"
        if self.failed:
            seen = (
                f" ({self.failed[0]}: {self.first_observed[:160]})" if self.first_observed else ""
            )
            return f"{self.command}: {', '.join(self.failed)}{seen}"
        return f"{self.command}: exit {self.code}: {self.last_line}"


class MutateReporter(Protocol):
    def status(self, message: str) -> None: ...


REFERENCE_CACHE = "reference-cache"  # <session>/reference-cache/<command slug>/


def command_argv(
    cmd: MutateCommand, python: str, out: Path, reference_cache: Path | None = None
) -> list[str]:
    """``python -m harness <cmd> --python <python> --results-dir <out>``; a stress command
    also ``--reference-cache <reference_cache>/<slug>``, so the baseline's connector-off
    reference is reused by every mutant whose run generated the tokens it scored: the
    reference never imports the mutated module (no connector), and equal tokens are
    equal scores (docs/mutate.md). A round trip has no reference to reuse."""
    argv = [sys.executable, "-m", "harness", *cmd.argv, "--python", python]
    argv += ["--results-dir", str(out)]
    if reference_cache is not None and cmd.kind == "stress":
        argv += ["--reference-cache", str(reference_cache / cmd.slug)]
    return argv


def run_command(
    cmd: MutateCommand,
    python: str,
    out: Path,
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    reference_cache: Path | None = None,
) -> CommandRun:
    """``offload-check <cmd> --python <python> --results-dir <out>`` (``command_argv``) in
    its own process group; on time out it is asked to stop (SIGINT: the harness stops its
    servers and keeps its results), then killed."""
    out.mkdir(parents=True, exist_ok=True)
    argv = command_argv(cmd, python, out, reference_cache)
    log = out / "command.log"
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            code = _wait(proc, t0 + timeout_s)
        except BaseException:
            # Ctrl-C or SIGTERM on mutate itself: the command is in a session of its own,
            # so it is stopped here (its servers with it), never left running.
            _stop(proc)
            raise
        if code is None:
            _stop(proc)
    lines = log.read_text(errors="replace").strip().splitlines()
    run_dir = _run_dir(out)
    rows = failed_rows(run_dir) if code == ExitCode.MISMATCH else []
    # What the first check that told it apart saw (a seeded fault's own checks are not).
    telling = [r for r in rows if r["name"] not in cmd.expect_failing]
    return CommandRun(
        cmd.name,
        code,
        run_dir,
        [r["name"] for r in rows],
        lines[-1][:300] if lines else "",
        time.monotonic() - t0,
        telling[0].get("observed", "") if telling else "",
        cmd.expect_failing,
    )


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The command's exit code, or None past ``deadline``. A lane (``--jobs``) is a
    thread, which no signal reaches: it looks up once a second, and when the run is
    stopping (``launcher.stop_lanes``) raises KeyboardInterrupt as the main thread got."""
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if launcher.stopping():
                raise KeyboardInterrupt("the run is stopping") from None
            if time.monotonic() >= deadline:
                return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_GRACE_S)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run_dir(out: Path) -> Path | None:
    """The run directory the command made under ``out`` (the newest)."""
    runs = sorted(p for p in out.iterdir() if p.is_dir() and (p / "run.json").is_file())
    return runs[-1] if runs else None


# Each command's checks file, and how its rows name a check and say it failed:
# roundtrip and stress write checks.csv, the oracle oracle-checks.csv (per cell),
# pressure pressure-checks.csv (per server and round, "matched" its verdict).
CHECK_FILES: tuple[tuple[str, str, str, str], ...] = (
    ("checks.csv", "name", "passed", ""),
    ("oracle-checks.csv", "check", "passed", "cell"),
    ("pressure-checks.csv", "check", "matched", "server"),
)


def failed_rows(run_dir: Path | None) -> list[dict[str, str]]:
    """The checks a run failed, as rows with ``name`` (the check, and the oracle cell or
    pressure server that saw it) and ``observed``, from whichever checks file the
    command writes."""
    if run_dir is None:
        return []
    for name, check, passed, where in CHECK_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        with path.open() as fh:
            rows = [r for r in csv.DictReader(fh) if r.get(passed) not in ("True", "true")]
        return [
            {
                **r,
                "name": r[check] + (f" ({r[where]})" if where and r.get(where) else ""),
            }
            for r in rows
        ]
    return []


def failed_checks(run_dir: Path | None) -> list[str]:
    return [r["name"] for r in failed_rows(run_dir)]


def import_check(python: str, module: str) -> str:
    """ "" when the mutant's module imports in its copy, else the error's last line."""
    try:
        proc = subprocess.run(
            [python, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"import {module} ran past {IMPORT_TIMEOUT_S:g}s"
    if proc.returncode == 0:
        return ""
    tail = proc.stderr.strip().splitlines()
    return tail[-1] if tail else f"exit {proc.returncode}"


def coverage_env(relpath: str, out: Path) -> dict[str, str]:
    return {ENV_COVER: relpath, ENV_COVER_OUT: str(out)}


@dataclass(frozen=True)
class Verdict:
    """A mutant's verdict over every command it ran through."""

    verdict: str
    command: str = ""  # the command that decided it
    failed: str = ""  # its failing checks, comma-separated
    detail: str = ""
    seconds: float = 0.0


def judge_runs(runs: Sequence[CommandRun], not_run: Sequence[str] = ()) -> Verdict:
    """The first command that noticed decides; every command passing is a survivor.
    ``not_run``: the commands left out because their unmutated run never executed the
    mutant's line (a survivor's detail names them, so a reader knows what it faced)."""
    seconds = sum(r.seconds for r in runs)
    for r in runs:
        if r.verdict != "survived":
            return Verdict(r.verdict, r.command, ",".join(r.noticed), r.detail(), seconds)
    faults = [r.command for r in runs if r.expected]
    as_expected = (
        f"; {', '.join(faults)} failed exactly its seeded fault's checks" if faults else ""
    )
    if not not_run:
        return Verdict("survived", "", "", f"every command passed{as_expected}", seconds)
    ran = ", ".join(r.command for r in runs)
    detail = (
        f"every command that executed its line passed ({ran}){as_expected}; not run: "
        f"{', '.join(not_run)} (their unmutated runs never executed it)"
    )
    return Verdict("survived", "", "", detail, seconds)


def baseline(
    commands: Sequence[MutateCommand],
    python: str,
    relpath: str,
    out: Path,
    timeout_s: float,
    reporter: MutateReporter,
    reference_cache: Path | None = None,
    jobs: int = 1,
) -> dict[str, list[int]]:
    """Each command on the unmutated environment with the line tracer on: the lines of
    the target it reached. A command failing here is refused: it would kill every
    mutant, and its kills would mean nothing. A stress command's reference fills
    ``reference_cache`` here, for the mutants. With ``jobs`` > 1 the commands run side
    by side, each on a lane's cores, as the mutants will."""

    def one(cmd: MutateCommand, cores: tuple[int, ...] | None) -> CommandRun:
        where = out / cmd.slug
        reporter.status(f"baseline: {cmd.name} on the unmutated build (line coverage on)")
        lane = {} if cores is None else lanes.lane_env(cores)
        return run_command(
            cmd,
            python,
            where,
            timeout_s,
            env={**coverage_env(relpath, where / "lines"), **lane},
            reference_cache=reference_cache,
        )

    runs: dict[str, CommandRun] = {}
    if jobs > 1:
        run_in_lanes(
            longest_first(commands), jobs, one, lambda cmd, run: runs.__setitem__(cmd.name, run)
        )
    else:
        for cmd in commands:
            runs[cmd.name] = one(cmd, None)
            if runs[cmd.name].verdict != "survived":
                break
    covered: dict[str, list[int]] = {}
    for cmd in commands:
        run = runs.get(cmd.name)
        if run is None:
            continue  # not run: an earlier command already failed
        if run.verdict != "survived":
            how = "is not as its scenario expects" if cmd.expect_failing else "fails"
            raise RuntimeFailure(
                f"{cmd.name} {how} on the unmutated build ({run.detail()}); every mutant "
                f"would count as killed. Its run: {run.run_dir or out / cmd.slug}"
            )
        covered[cmd.name] = sorted(read_lines(out / cmd.slug / "lines"))
    return covered


def run_mutant(
    mutant: Any,
    source: str,
    commands: Sequence[MutateCommand],
    make_env: Callable[[Any, str], str],
    out: Path,
    timeout_s: float,
    reporter: MutateReporter,
    drop_env: Callable[[str], None],
    reference_cache: Path | None = None,
    env: dict[str, str] | None = None,
    not_run: Sequence[str] = (),
) -> Verdict:
    """One mutant: its copy of the environment (``make_env`` gives the copy's python),
    the import check, then the commands until one notices; the copy is removed after.
    ``env``: the commands' extra environment (a lane's cores, ``lanes.lane_env``);
    ``not_run``: the session's commands left out for this mutant (``commands_reaching``)."""
    python = make_env(mutant, mutated_source(source, mutant))
    try:
        broken = import_check(python, mutant.module)
        if broken:
            return Verdict("incompetent", "import", "", broken)
        runs: list[CommandRun] = []
        for cmd in commands:
            reporter.status(f"{mutant.id}: {cmd.name} ({mutant.one_line()})")
            runs.append(
                run_command(
                    cmd, python, out / cmd.slug, timeout_s, env=env, reference_cache=reference_cache
                )
            )
            if runs[-1].verdict != "survived":
                break
        return judge_runs(runs, not_run)
    finally:
        drop_env(python)


# A mutant that stalls the engine (a transfer job never completed) is stopped by stress's
# stall watch after a window calibrated from the baseline's own run: this many times the
# longest the baseline's counters stayed still with requests outstanding (a first
# request's warm-up; the line tracer makes the baseline's steps slower, so its quiets are
# long), never under STALL_MIN_S nor over stress's default. With the 120 s default, each
# stalling mutant of the scheduler's sample cost two minutes of watching.
STALL_FACTOR = 4.0
STALL_MIN_S = 30.0


def calibrated_stall(run_dir: Path | None) -> float | None:
    """The stall window for the mutants' runs of a stress command, from its baseline run
    (``run.json``'s ``stress.longest_still_s``); None when the run recorded none."""
    if run_dir is None:
        return None
    try:
        quiet = float(json.loads((run_dir / "run.json").read_text())["stress"]["longest_still_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return round(min(STALL_S, max(STALL_MIN_S, STALL_FACTOR * quiet)), 1)


def stall_windows(commands: Sequence[MutateCommand], where: Path) -> dict[str, float]:
    """Each stress command's calibrated window, from its baseline run under ``where``."""
    out: dict[str, float] = {}
    for cmd in commands:
        if cmd.kind != "stress":
            continue
        found = _run_dir(where / cmd.slug) if (where / cmd.slug).is_dir() else None
        window = calibrated_stall(found)
        if window is not None:
            out[cmd.name] = window
    return out


def reaching(line: int, covered: dict[str, list[int]]) -> list[str]:
    """The names of the commands whose unmutated run executed ``line``, in their order."""
    return [name for name, lines in covered.items() if line in lines]


def reached_by(line: int, covered: dict[str, list[int]]) -> str:
    """``reaching`` as the report's column ("" when none did)."""
    return ",".join(reaching(line, covered))


def commands_reaching(
    line: int, commands: Sequence[MutateCommand], covered: dict[str, list[int]]
) -> list[MutateCommand]:
    """The commands a mutant of ``line`` runs through: those whose unmutated run executed
    it, in the session's order.

    The same argument as ``skip_unreached``, one command at a time: a command runs the
    same workload on a mutant as on the unmutated build, so one that never executed the
    line sees the same run either way, and running it costs a launch or several to learn
    nothing. It is most of a session's wall where it matters: an equivalent mutant of
    the scheduler's ``reset_cache``, executed only by the oracle drive, used to run the
    whole suite (17 of a session's 30 minutes here) to survive where the drive alone
    already said so. A command whose run varies (stress's timing, which request is
    preempted) can miss a line another run would reach; ``--run-unreached`` runs every
    command on every mutant."""
    names = set(reaching(line, covered))
    return [cmd for cmd in commands if cmd.name in names]


COVERAGE_FILE = "coverage.json"  # baseline/: each command's lines of the target
NOT_REACHED = (
    "not run: no command's unmutated run executed its line, so no run of it can differ "
    "(--run-unreached runs it anyway)"
)


def skip_unreached(
    pending: Sequence[Any],
    covered: dict[str, list[int]],
    session: Any,
    source: str,
    reporter: MutateReporter,
) -> list[Any]:
    """The mutants whose line some command's baseline executed; the others are recorded
    as survivors without a run.

    Every command runs the same workload on a mutant as on the unmutated build, so an
    edit on a line none of them executed cannot change what any of them sees: running it
    costs the whole suite (the survivors of a sample are most of a session's wall) to
    learn nothing. Counting it a survivor keeps the score honest (a workload that never
    reaches a line is a gap of the suite, and the report says which). Coverage, not
    guesswork: the line tracer records the module's own frames from its import on, so
    module-level and class-body lines count as reached when they ran."""
    ran: list[Any] = []
    for mutant in pending:
        if reached_by(mutant.line, covered):
            ran.append(mutant)
            continue
        session.record(
            mutant.id,
            "survived",
            detail=NOT_REACHED,
            diff=mutant.unified_diff(source),
        )
        reporter.status(f"  {mutant.id}: survived (line {mutant.line} not reached: not run)")
    return ran


def execute_session(
    plan: Any,
    session: Any,
    out: Path,
    reporter: MutateReporter,
    on_verdict: Callable[[], None],
    jobs: int = 1,
) -> None:
    """The baseline (once per session: a resume reads ``baseline/coverage.json``), then
    every pending mutant of this shard, each verdict in the session as it lands. The
    build's own file is checked unchanged before and after every mutant.

    ``jobs`` > 1: that many mutants side by side, each command pinned to its lane's
    cores (``harness.server.side_by_side``); the baseline's commands side by side too,
    so the stall window and the stress reference it leaves come from a server with the
    mutants' share of the machine. The machine's server lock is held from the baseline
    to the last mutant, so no other run launches between the two."""
    with server_lock.hold_machine() if jobs > 1 else contextlib.nullcontext():
        _execute(plan, session, out, reporter, on_verdict, jobs)


def _execute(
    plan: Any,
    session: Any,
    out: Path,
    reporter: MutateReporter,
    on_verdict: Callable[[], None],
    jobs: int,
) -> None:
    where = out / "baseline"
    coverage = where / COVERAGE_FILE
    # The stress commands' connector-off references, filled by the baseline and reused by
    # the mutants (``command_argv``); a resumed session keeps its own.
    cache = out / REFERENCE_CACHE
    if coverage.is_file():
        covered = json.loads(coverage.read_text())
    else:
        covered = baseline(
            plan.commands,
            plan.python,
            plan.relpath,
            where,
            plan.timeout_s,
            reporter,
            cache,
            jobs,
        )
        coverage.write_text(json.dumps(covered, sort_keys=True) + "\n")
    on_verdict()
    stalls = stall_windows(plan.commands, where)
    for name, window in stalls.items():
        reporter.status(f"{name}: a stalled engine is stopped after {window:g} s of no progress")
    commands = [cmd.stalling_after(stalls.get(cmd.name)) for cmd in plan.commands]
    source = plan.path.read_text()
    pending = session.pending(plan.shard)
    if not plan.run_unreached:
        pending = skip_unreached(pending, covered, session, source, reporter)
        on_verdict()
    reporter.status(f"{len(pending)} mutant(s) to run of {len(session.mutants())}")

    def untouched() -> None:
        if sandbox.file_sha256(plan.path) != plan.sha256:
            raise RuntimeFailure(
                f"{plan.path} changed during the session: the build itself is no longer "
                "the one mutated (stopped; the verdicts so far are kept)"
            )

    def make_env(mutant: Any, text: str) -> str:
        dest = out / "mutants" / mutant.id / "env"
        if dest.exists():  # an interrupted run's copy
            sandbox.remove_copy(dest)
        sandbox.make_copy(plan.prefix, dest, plan.site_rel)
        sandbox.replace_module(dest, plan.site_rel, plan.relpath, text)
        return str(dest / "bin" / "python")

    def drop_env(python: str) -> None:
        sandbox.remove_copy(Path(python).parent.parent)

    order = {m.id: n for n, m in enumerate(pending, 1)}

    def one(mutant: Any, cores: tuple[int, ...] | None) -> tuple[Verdict, float]:
        """A mutant's verdict and its seconds (the copy and the import check included)."""
        untouched()
        reporter.status(f"[{order[mutant.id]}/{len(pending)}] {mutant.id}: {mutant.one_line()}")
        began = time.monotonic()
        mine = commands if plan.run_unreached else commands_reaching(mutant.line, commands, covered)
        verdict = run_mutant(
            mutant,
            source,
            mine,
            make_env,
            out / "mutants" / mutant.id,
            plan.timeout_s,
            reporter,
            drop_env,
            cache,
            None if cores is None else lanes.lane_env(cores),
            [cmd.name for cmd in commands if cmd not in mine],
        )
        untouched()
        return verdict, time.monotonic() - began

    def record(mutant: Any, result: tuple[Verdict, float]) -> None:
        verdict, seconds = result
        session.record(
            mutant.id,
            verdict.verdict,
            command=verdict.command,
            failed=verdict.failed,
            detail=verdict.detail,
            seconds=seconds,
            reached=reached_by(mutant.line, covered),
            diff=mutant.unified_diff(source),
        )
        reporter.status(f"  {mutant.id}: {verdict.verdict} ({verdict.detail})")
        on_verdict()

    if jobs > 1:
        run_in_lanes(pending, jobs, one, record)
        return
    for mutant in pending:
        record(mutant, one(mutant, None))
