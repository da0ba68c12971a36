"""A sweep as it goes: every target on every build, one build (and server) at a time."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.commands.sweep.ahead import Ahead
from harness.commands.sweep.builds import Build
from harness.commands.sweep.runners import SweepReporter, run_target
from harness.commands.sweep.spans import BisectResult, Transition, bisect, transitions
from harness.commands.sweep.targets import (
    KIND_SCHEDULER,
    NOT_JUDGED,
    NOT_RUN,
    UNAVAILABLE,
    Target,
    selects,
    unrun_cells,
)
from harness.errors import BadInput
from harness.results.records import SweepCell
from harness.server import build_envs, launcher
from harness.server.build_prep import Prepared, prepare
from harness.server.side_by_side import run_in_lanes


@dataclass
class SweepRun:
    """A sweep as it goes: the plan (builds x targets) and what is known so far."""

    builds: list[Build]
    targets: list[Target]
    dist: str
    cells: list[SweepCell] = field(default_factory=list)
    envs: list[dict[str, Any]] = field(default_factory=list)
    bisect: list[BisectResult] = field(default_factory=list)
    # The checks of a target worth running on a build (None: all of them). The corpus
    # names only those some entry judges there: a launch no verdict reads is not made.
    narrow: Callable[[Build, Target], tuple[str, ...]] | None = None

    def targets_for(self, build: Build) -> tuple[list[Target], list[SweepCell]]:
        """The targets to run on ``build`` (narrowed), and a ``not-judged`` cell for each
        check left out."""
        if self.narrow is None:
            return list(self.targets), []
        keep: list[Target] = []
        left: list[SweepCell] = []
        for t in self.targets:
            checks = self.narrow(build, t)
            if checks:
                keep.append(replace(t, checks=checks))
            why = "no entry says anything of this release: not run"
            left += [
                SweepCell(build.label, c, t.kind, t.name, NOT_JUDGED, why=why)
                for c in t.checks
                if c not in checks
            ]
        return keep, left

    @property
    def release_order(self) -> list[str]:
        return [b.label for b in self.builds if b.release]

    def transitions(self) -> list[Transition]:
        return transitions(self.cells, self.release_order)

    def build_records(self) -> list[dict[str, Any]]:
        """The builds as ``run.json`` records them."""
        return [{"label": b.label, "spec": b.spec, "release": b.release} for b in self.builds]

    def describe(self) -> dict[str, Any]:
        """The plan as ``run.json`` records it: distribution, builds, scenarios and checks."""
        return {
            "dist": self.dist,
            "builds": self.build_records(),
            "scenarios": [
                {"kind": t.kind, "file": str(t.scenario.source), "checks": list(t.checks)}
                for t in self.targets
            ],
        }

    def report_meta(self) -> dict[str, Any]:
        """What the report and the chart need besides the cells (``write_sweep``)."""
        return {
            "builds": [b.label for b in self.builds],
            "release_order": self.release_order,
            "bisect": [b.text() for b in self.bisect],
        }

    def fill_not_run(self, why: str) -> None:
        """Cells never reached (Ctrl-C, an error) are written as ``not-run``, so the table
        says what is missing instead of silently shrinking."""
        have = {(c.release, c.check) for c in self.cells}
        for b in self.builds:
            for c in unrun_cells(b, self.targets, NOT_RUN, why):
                if (c.release, c.check) not in have:
                    self.cells.append(c)


def env_record(build: Build, status: Any, prepared: Prepared | None = None) -> dict[str, Any]:
    """A row of ``envs.csv``; ``ahead``: made ready while the build before it ran."""
    return {
        "release": build.label,
        "state": status.state,
        "reason": status.reason,
        "seconds": round(status.seconds, 1),
        "disk_bytes": "" if status.disk_bytes is None else status.disk_bytes,
        "vllm_version": status.vllm_version or "",
        "python": status.python or "",
        "ahead": bool(prepared and prepared.ahead),
    }


def run_build(
    run: SweepRun,
    build: Build,
    targets: Sequence[Target],
    out_dir: Path,
    reporter: SweepReporter,
    on_change: Callable[[], None],
    *,
    index: int = 1,
    total: int = 1,
    uv: str | None = None,
    torch_index: str | None = None,
    port: int | None = None,
    prepared: Prepared | None = None,
    ready: Callable[[], None] | None = None,
) -> list[SweepCell]:
    """Make (or reuse) the build's environment, unless ``prepared`` (ahead) already did,
    then run every target on it; ``ready`` is called once the build is ready, before
    its first server."""
    prepared = ready_build(
        run,
        build,
        targets,
        reporter,
        on_change,
        index=index,
        total=total,
        uv=uv,
        torch_index=torch_index,
        prepared=prepared,
    )
    if ready is not None and prepared.status.ok:
        ready()
    return run_targets(run, build, targets, prepared, out_dir, reporter, on_change, port)


def ready_build(
    run: SweepRun,
    build: Build,
    targets: Sequence[Target],
    reporter: SweepReporter,
    on_change: Callable[[], None],
    *,
    index: int = 1,
    total: int = 1,
    uv: str | None = None,
    torch_index: str | None = None,
    prepared: Prepared | None = None,
) -> Prepared:
    """The build's environment made or reused (unless ``prepared`` already is), said
    once and recorded in ``envs``; ``targets`` say whether a server will need vLLM's
    model-class cache warm."""
    reporter.build_started(build, index, total)
    if prepared is None:
        prepared = prepare(
            build.spec,
            build.label,
            dist=run.dist,
            warm=needs_warm(targets),
            uv=uv,
            torch_index=torch_index,
            on_step=lambda message: reporter.build_step(build, message),
        )
    reporter.build_ready(build, prepared.status)
    if prepared.warm:
        reporter.build_step(build, prepared.warm)
    run.envs.append(env_record(build, prepared.status, prepared))
    on_change()
    return prepared


def run_targets(
    run: SweepRun,
    build: Build,
    targets: Sequence[Target],
    prepared: Prepared,
    out_dir: Path,
    reporter: SweepReporter,
    on_change: Callable[[], None],
    port: int | None = None,
) -> list[SweepCell]:
    """``targets`` on a build made ready, each cell recorded as it is judged; on a
    build that could not be made, each target's cells ``unavailable`` with the reason."""
    status = prepared.status
    if not status.ok or status.python is None:
        cells = unrun_cells(build, targets, UNAVAILABLE, status.reason)
        for c in cells:
            c.vllm_version = status.vllm_version or ""
            run.cells.append(c)
            reporter.cell_done(c)
        on_change()
        return cells

    def on_cell(cell: SweepCell) -> None:
        if launcher.stopping():
            # A lane's server torn down by an interrupted run (--jobs) looks like a
            # crash to its runner: not a result. The lane ends as the main thread did.
            raise KeyboardInterrupt("the run is stopping")
        run.cells.append(cell)
        reporter.cell_done(cell)
        on_change()

    out: list[SweepCell] = []
    for t in targets:
        sub = out_dir / "releases" / build.slug / t.slug
        out += run_target(t, build, status.python, sub, reporter, on_cell, port)
    return out


def needs_warm(targets: Sequence[Target]) -> bool:
    """Whether any target launches a server (a scheduler drive launches none)."""
    return any(t.kind != KIND_SCHEDULER for t in targets)


def execute_sweep(
    run: SweepRun,
    out_dir: Path,
    reporter: SweepReporter,
    on_change: Callable[[], None],
    *,
    uv: str | None = None,
    torch_index: str | None = None,
    port: int | None = None,
    jobs: int = 1,
) -> None:
    """Every target on every build, one build (and one server) at a time; a build with
    nothing to run (``SweepRun.narrow``) is not even installed.

    Two things keep set-up out of the servers' way: the releases are first screened
    for installability side by side (``build_envs.screen_releases``: dozens of old
    releases pin a torch no source offers), and each build's successor is prepared in
    the background while its servers run (:mod:`harness.commands.sweep.ahead`).

    ``jobs`` > 1 runs that many targets side by side, each in a lane of the machine's
    cores (``_targets_side_by_side``)."""
    work: list[tuple[int, Build, list[Target]]] = []
    for i, build in enumerate(run.builds, 1):
        targets, left = run.targets_for(build)
        for cell in left:
            run.cells.append(cell)
            reporter.cell_done(cell)
        if left:
            on_change()
        if targets:
            work.append((i, build, targets))
    releases = [b.spec for _, b, _ in work if b.release]
    if len(releases) > 1:
        reporter.status(f"which of {len(releases)} releases can be installed here")
        build_envs.screen_releases(run.dist, releases, uv=uv, torch_index=torch_index)

    if jobs > 1 and len(work) > 1:
        _targets_side_by_side(run, work, out_dir, reporter, on_change, jobs, uv, torch_index)
        return
    with Ahead(dist=run.dist, uv=uv, torch_index=torch_index) as ahead:
        for k, item in enumerate(work):
            following = work[k + 1] if k + 1 < len(work) else None

            def begin_next(following: tuple[int, Build, list[Target]] | None = following) -> None:
                if following is not None:
                    ahead.start(following[1], warm=needs_warm(following[2]))

            i, build, targets = item
            prepared = ahead.take(build, functools.partial(reporter.build_step, build))
            run_build(
                run,
                build,
                targets,
                out_dir,
                reporter,
                on_change,
                index=i,
                total=len(run.builds),
                uv=uv,
                torch_index=torch_index,
                port=port,
                prepared=prepared,
                ready=begin_next,
            )


def _targets_side_by_side(
    run: SweepRun,
    work: Sequence[tuple[int, Build, list[Target]]],
    out_dir: Path,
    reporter: SweepReporter,
    on_change: Callable[[], None],
    jobs: int,
    uv: str | None,
    torch_index: str | None,
) -> None:
    """Every (build, target) pair, ``jobs`` at a time, each lane on its own cores
    (``side_by_side``), the results written under one lock.

    The unit is a target, not a build: with whole builds, seven releases on two lanes
    left one lane a whole release alone at the end (measured: 0.32.0's ten launches).
    A free lane takes a target of a build already made ready, else one of a build no
    lane has begun (and makes that build ready), else waits for a build another lane is
    making. So lanes work on different builds until the last ones, then share them. No
    build is prepared ahead: while one lane installs, the other's servers use the other
    core, which is all ``Ahead`` is for."""
    write = threading.Lock()
    made: dict[str, Prepared] = {}
    making: dict[str, threading.Lock] = {b.label: threading.Lock() for _, b, _ in work}
    begun: set[str] = set()

    def changed() -> None:
        with write:
            on_change()

    every = {b.label: (i, targets) for i, b, targets in work}
    items = [(b, t) for _, b, targets in work for t in targets]

    def pick(pending: Sequence[tuple[Build, Target]]) -> int:
        for k, (b, _) in enumerate(pending):
            if b.label in made:
                return k
        for k, (b, _) in enumerate(pending):
            if b.label not in begun:
                begun.add(b.label)
                return k
        return 0

    def one(item: tuple[Build, Target], _cores: tuple[int, ...]) -> None:
        build, target = item
        i, targets = every[build.label]
        with making[build.label]:
            if build.label not in made:
                made[build.label] = ready_build(
                    run,
                    build,
                    targets,
                    reporter,
                    changed,
                    index=i,
                    total=len(run.builds),
                    uv=uv,
                    torch_index=torch_index,
                )
            else:
                reporter.build_joined(build, i, len(run.builds))
        run_targets(run, build, [target], made[build.label], out_dir, reporter, changed)

    run_in_lanes(items, jobs, one, pick=pick)


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
    reporter: SweepReporter,
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
