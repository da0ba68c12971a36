"""Each kind of target run on one build by the command that owns it, each result a cell."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.commands import crash_repro
from harness.commands import matrix as mx
from harness.commands import roundtrip as rt
from harness.commands.crash_repro.files import write_crash_repro
from harness.commands.matrix.files import write_matrix
from harness.commands.pressure.files import write_pressure
from harness.commands.pressure.plan import build_local_model, plan_pressure
from harness.commands.pressure.replay import check_replayable, replay_plan
from harness.commands.pressure.run import ServerResult, run_server
from harness.commands.roundtrip.files import RoundtripWriter
from harness.commands.sweep.builds import Build
from harness.commands.sweep.judge import judge_roundtrip, roundtrip_detail
from harness.commands.sweep.targets import (
    ERROR,
    KIND_CRASH_REPRO,
    KIND_MATRIX,
    KIND_PRESSURE,
    KIND_ROUNDTRIP,
    Target,
    unrun_cells,
)
from harness.errors import BadInput, HarnessError
from harness.results.records import SweepCell
from harness.results.run_directory import RunDirectory
from harness.scenario.crash_repro import CrashReproScenario
from harness.scenario.matrix import MatrixScenario
from harness.scenario.roundtrip import RoundtripScenario
from harness.scenario.schema import Variant
from harness.server.crash_signatures import crash_signature, known_label
from harness.server.interpreters import has_gpu


class SweepReporter(Protocol):
    """Sweep progress, plus the commands' own reporters' hooks (passed down to them)."""

    def build_started(self, build: Build, index: int, total: int) -> None: ...
    # A lane (--jobs) taking a target of a build another lane made ready: its progress
    # is that build's from here on (no line: the build was announced once).
    def build_joined(self, build: Build, index: int, total: int) -> None: ...
    def build_step(self, build: Build, message: str) -> None: ...
    def build_ready(self, build: Build, status: Any) -> None: ...
    def cell_done(self, cell: SweepCell) -> None: ...
    # crash_repro.CrashReproReporter, matrix.MatrixReporter, roundtrip.run.RoundtripReporter
    def row_started(self, row: Any, index: int, total: int) -> None: ...
    def row_tick(self, row: Any, elapsed: float) -> None: ...
    def row_finished(self, row: Any, index: int, total: int) -> None: ...
    def cell_started(self, cell: Any, index: int, total: int) -> None: ...
    def cell_finished(self, cell: Any, index: int, total: int) -> None: ...
    def status(self, message: str) -> None: ...
    def phase_done(self, phase: Any) -> None: ...
    def request_done(self, completion: Any) -> None: ...


def variant_for(build: Build, python: str, amx: str = "auto") -> dict[str, Variant]:
    """The build as a variant the commands' planners launch by name; ``amx="off"`` also
    needs AMX of the host (rows are skipped where there is none, as the variants file's
    ``current-no-amx`` is)."""
    kind = "release" if build.release else "build"
    variant = Variant(name=build.label, python=python, description=f"sweep {kind}")
    if amx == "off":
        variant.amx, variant.requires_cpu = "off", ["amx_tile"]
    return {build.label: variant}


@dataclass(frozen=True)
class Job:
    """One scenario's checks on one build, and where its results and verdicts go."""

    target: Target
    build: Build
    variants: dict[str, Variant]  # the build as a variant the planners launch by name
    out_dir: Path  # the scenario command's own results directory for this build
    reporter: SweepReporter
    on_cell: Callable[[SweepCell], None]  # each cell as soon as it is judged
    port: int | None = None


def run_target(
    target: Target,
    build: Build,
    python: str,
    out_dir: Path,
    reporter: SweepReporter,
    on_cell: Callable[[SweepCell], None],
    port: int | None = None,
) -> list[SweepCell]:
    """Run one scenario's selected checks on one build, in the scenario command's own
    results directory ``out_dir``; each cell is handed to ``on_cell`` as it is judged.

    A plan the build refuses (its vLLM lacks the engine plugin, a geometry it cannot
    build) makes every cell of the target ``error``, not the sweep's end.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = variant_for(build, python, target.amx)
    job = Job(target, build, variants, out_dir, reporter, on_cell, port)
    runner = RUNNERS.get(target.kind)
    if runner is None:
        raise HarnessError(
            f"no runner for {target.kind} targets (the module that runs them "
            "registers it in sweep.RUNNERS when imported)"
        )
    try:
        return runner(job)
    except BadInput as err:
        cells = unrun_cells(build, [target], ERROR, f"cannot plan on this build: {err}")
        for c in cells:
            c.matched = False
            on_cell(c)
        return cells


def _run_crash_repro(job: Job) -> list[SweepCell]:
    target, build, reporter, on_cell = job.target, job.build, job.reporter, job.on_cell

    scn: CrashReproScenario = target.scenario
    models = {c.split("/")[0] for c in target.checks}
    configs = [m.config_path for m in crash_repro.load_models(scn, None) if m.name in models]
    plan = crash_repro.plan_run(
        scn, variant_names=[build.label], configs=configs, extra_variants=job.variants
    )
    plan.rows = [r for r in plan.rows if _row_check(r) in target.checks]
    crash_repro.build_models(plan)
    run_dir = RunDirectory(job.out_dir, "crash-repro")
    run_dir.update_meta(scenario_file=str(scn.source), sweep_build=build.label)
    cells: list[SweepCell] = []

    class Rows:
        """Forwards to the sweep's reporter, and turns each finished row into a cell."""

        def row_started(self, row: Any, index: int, total: int) -> None:
            reporter.row_started(row, index, total)

        def row_tick(self, row: Any, elapsed: float) -> None:
            reporter.row_tick(row, elapsed)

        def row_finished(self, row: Any, index: int, total: int) -> None:
            reporter.row_finished(row, index, total)
            write_crash_repro(run_dir, [r for r in plan.rows if r.outcome])
            cell = _row_cell(row, build, target, run_dir.path)
            cells.append(cell)
            on_cell(cell)

    try:
        crash_repro.execute_crash_repro(plan, run_dir.path, Rows(), port=job.port)
    finally:
        done = [r for r in plan.rows if r.outcome]
        write_crash_repro(run_dir, done)
        mismatch = any(x.matched is False for x in done)
        run_dir.finish("finished" if len(done) == len(plan.rows) else "interrupted", int(mismatch))
    return cells


def _row_check(row: Any) -> str:
    return f"{row.model}/connector-{'on' if row.connector else 'off'}"


def _row_cell(row: Any, build: Build, target: Target, run_dir: Path) -> SweepCell:
    expected = row.expected + (f" {known_label(row.expected_known)}" if row.expected_known else "")
    detail = ""
    if row.answered is not None:
        detail = "answered" if row.answered else f"no answer: {row.answer[:120]}"
    return SweepCell(
        release=build.label,
        check=_row_check(row),
        kind=target.kind,
        scenario=target.name,
        outcome=row.outcome,
        known=known_label(row.known_issue) or "",
        signature=with_message(row.signature, row.message),
        expected=expected,
        matched=row.matched,
        seconds=float(row.seconds or 0.0),
        vllm_version=row.vllm_version,
        detail=detail,
        why=row.why,
        rule=row.rule_index,
        run_dir=str(run_dir),
    )


def with_message(signature: str, message: str) -> str:
    """A crash's signature and the first line of its message: two crashes in one function
    (an assert on block sizes, another on hashes) differ only there, and a bug entry's
    symptom names that text."""
    first = (message or "").strip().splitlines()[0][:200] if (message or "").strip() else ""
    return f"{signature}: {first}" if first and first not in signature else signature


def _run_matrix(job: Job) -> list[SweepCell]:
    target, build, reporter, on_cell = job.target, job.build, job.reporter, job.on_cell

    scn: MatrixScenario = target.scenario
    picked = [mx.parse_check_id(c) for c in target.checks]
    plan = mx.plan_matrix(
        scn,
        variants=[build.label],
        geometries=sorted({g for _, g, _ in picked}),
        tiers=sorted({t for _, _, t in picked}),
        extra_variants=job.variants,
    )
    plan.cells = [c for c in plan.cells if c.check_id in target.checks]
    run_dir = RunDirectory(job.out_dir, "matrix")
    run_dir.update_meta(scenario_file=str(scn.source), sweep_build=build.label)
    cells: list[SweepCell] = []

    def one(cell: Any) -> None:
        write_matrix(run_dir, [c for c in plan.cells if c.matched is not None])
        sc = _matrix_cell(cell, build, target)
        cells.append(sc)
        on_cell(sc)

    try:
        mx.execute_matrix(plan, run_dir.path, reporter, one)
    finally:
        done = [c for c in plan.cells if c.matched is not None]
        write_matrix(run_dir, done)
        mismatch = any(x.matched is False for x in done)
        run_dir.finish("finished" if len(done) == len(plan.cells) else "interrupted", int(mismatch))
    return cells


def _matrix_cell(cell: Any, build: Build, target: Target) -> SweepCell:
    outcome = cell.startup if cell.startup != "started" else f"started, {cell.roundtrip}"
    detail = ", ".join(cell.failed_checks) if cell.failed_checks else ""
    failing = ",".join(sorted(cell.failed_checks or []))
    return SweepCell(
        release=build.label,
        check=cell.check_id,
        kind=target.kind,
        scenario=target.name,
        outcome=outcome,
        known=known_label(cell.known_issue) or "",
        signature=with_message(cell.signature, cell.message),
        expected=cell.expected_text(),
        matched=cell.matched,
        seconds=float(cell.seconds or 0.0),
        vllm_version=cell.vllm_version,
        detail=f"fails {detail}" if detail else cell.specs,
        failing=failing,
        why=cell.why,
        rule=cell.rule_index,
        run_dir=cell.cell_dir,
    )


def _run_roundtrip(job: Job) -> list[SweepCell]:
    target, build, reporter, on_cell = job.target, job.build, job.reporter, job.on_cell

    scn: RoundtripScenario = target.scenario
    plan = rt.plan_roundtrip(scn, variant=build.label, extra_variants=job.variants)
    assert plan.env is not None
    version = plan.env.vllm_version
    rt.build_local_model(plan)
    run_dir = RunDirectory(job.out_dir, "roundtrip")
    run_dir.update_meta(
        scenario_file=str(scn.source), sweep_build=build.label, plan=plan.describe()
    )
    writer = RoundtripWriter(run_dir, plan, chart=False)
    check = target.checks[0]
    cell = SweepCell(build.label, check, target.kind, target.name, "", vllm_version=version)
    cell.run_dir = str(run_dir.path)
    result = None
    try:
        result = rt.execute_roundtrip(plan, run_dir.path, reporter, writer, port=job.port)
        cell.outcome = "pass" if result.passed else "fail"
        cell.detail = roundtrip_detail(result)
        failing = sorted(c.name for c in result.checks if not c.passed)
        if failing:
            cell.signature = "fails " + ", ".join(failing)
            cell.failing = ",".join(failing)
    except rt.StartupFailure as err:
        lines = err.log_path.read_text(errors="replace").splitlines()
        sig = crash_signature(lines, err.returncode, scn.known_crashes)
        cell.outcome = "timeout" if err.state == "timeout" else "crashed"
        cell.signature = with_message(sig.summary(), sig.message)
        if err.state == "timeout":
            cell.signature = str(err)
        cell.known = known_label(sig.known) or ""
        cell.seconds = err.seconds
        failing = []
    except HarnessError as err:
        cell.outcome, cell.why, failing = ERROR, str(err), []
    if result is not None:
        cell.seconds = sum(p.seconds for p in result.phases) + (result.startup_seconds or 0.0)
    judge_roundtrip(cell, scn.expectations, failing, device=plan.env.device)
    run_dir.finish("finished", 0 if cell.matched else 1, passed=cell.outcome == "pass")
    on_cell(cell)
    return [cell]


class _PressureStatus:
    """A pressure run's progress as the sweep's status lines."""

    def __init__(self, reporter: SweepReporter) -> None:
        self.reporter = reporter

    def status(self, message: str) -> None:
        self.reporter.status(message)

    def request_done(self, server: str, judged: Any) -> None:
        if judged.failing:
            r = judged.row
            self.reporter.status(f"{server} #{r.index} {r.request}: {', '.join(judged.failing)}")


def replays_pressure(vllm_dist: str) -> bool:
    """Whether a build's pressure rows are judged by replaying its own manager instead of
    on servers: the CUDA wheel (distribution ``vllm``) on a host without a GPU serves
    nothing, but its manager, policies and store threshold are pure Python (``pressure
    --replay``; the same test ``harness.engine.cuda_wheel`` makes for the drives)."""
    return vllm_dist == "vllm" and not has_gpu()


def _run_pressure(job: Job) -> list[SweepCell]:
    """Each selected server a cell: ``pass`` (every request as the oracle's own
    semantics say), ``deviates`` (as the exact model of a known upstream behaviour says,
    which the clean semantics would not have predicted for this sequence: ``known``
    names it) or ``fail``; matched when every check is as the scenario's rules expect.
    A CUDA build on a host without a GPU is judged by its manager replayed
    (``replays_pressure``), every server in one interpreter start."""
    target, build = job.target, job.build
    servers = [c.split("/", 1)[1] for c in target.checks]
    plan = plan_pressure(
        target.scenario, variant=build.label, servers=servers, extra_variants=job.variants
    )
    replayed: list[ServerResult] | None = None
    if replays_pressure(plan.env.vllm_dist):
        check_replayable(plan, 0)  # a release before 0.31: every cell an error, named
        job.reporter.status(f"{target.name}: replayed through the build's own manager")
        replayed = replay_plan(plan)
    else:
        build_local_model(plan)
    run_dir = RunDirectory(job.out_dir, "pressure")
    run_dir.update_meta(
        scenario_file=str(target.scenario.source),
        sweep_build=build.label,
        plan=plan.describe(),
        mode="live" if replayed is None else "replay",
    )
    done: list[ServerResult] = []
    cells = []
    for n, sp in enumerate(plan.servers):
        check = f"pressure/{sp.name}"
        cell = SweepCell(
            build.label, check, target.kind, target.name, "", vllm_version=plan.env.vllm_version
        )
        cell.run_dir = str(run_dir.path)

        def update(results: list[ServerResult]) -> None:
            write_pressure(run_dir, plan, [*done, *results])

        try:
            if replayed is not None:
                res = replayed[n]
                update([res])
            else:
                (res,) = run_server(
                    plan, sp, run_dir.path, _PressureStatus(job.reporter), update, job.port
                )
        except HarnessError as err:
            cell.outcome, cell.why, cell.matched = ERROR, str(err), False
            job.on_cell(cell)
            cells.append(cell)
            continue
        done.append(res)
        rules = sp.rules
        failing = sorted(c.check for c in res.checks if not c.passed)
        shown = rules.shown(failing)
        if failing and not set(failing) <= rules.failing_checks:
            cell.outcome = "fail"
        elif shown:
            cell.outcome, cell.known = "deviates", shown
        else:
            cell.outcome = "pass"
        cell.failing = ",".join(failing)
        cell.signature = ("fails " + ", ".join(failing)) if failing else ""
        cell.expected = rules.expected()
        cell.matched = res.matched
        cell.seconds = res.startup_seconds + sum(r.seconds for r in res.rows)
        hits = sum(r.ext_hits for r in res.rows)
        cell.detail = (
            f"{len(res.rows)} requests, {hits} hit tokens, rules: {', '.join(sp.issues) or 'none'}"
            + ("" if replayed is None else "; replayed through vLLM's manager, no server")
        )
        if not res.matched:
            cell.why = "; ".join(f"{c.check}: {c.detail}" for c in res.checks if not c.matched)
        job.on_cell(cell)
        cells.append(cell)
    run_dir.finish("finished", 0 if all(c.matched for c in cells) else 1)
    return cells


Runner = Callable[[Job], list[SweepCell]]
# How each kind of target runs on one build. The bug corpus's scripted entries
# (``KIND_STEPS``) are run by ``harness.commands.bugs.steps``, which registers itself here:
# the bug corpus is built on the sweep, so the sweep never imports it.
RUNNERS: dict[str, Runner] = {
    KIND_CRASH_REPRO: _run_crash_repro,
    KIND_MATRIX: _run_matrix,
    KIND_ROUNDTRIP: _run_roundtrip,
    KIND_PRESSURE: _run_pressure,
}
