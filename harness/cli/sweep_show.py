"""What ``sweep`` shows: its plan (``--dry-run``, text or ``--json``: the builds and what
the scenarios' rules expect of each check on each), a line per build and cell while it
runs (with a spinner on a terminal), and the release x check table; its plan renderers
registered with ``harness.ui.dry_run``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.commands import sweep as sw
from harness.ui import dry_run
from harness.ui.dry_run import build_lines, build_states, host_line, host_state, say
from harness.ui.fit import fit, grid
from harness.ui.terminal import MATRIX_STYLE, OUTCOME_STYLE, SpinnerLines, env_line, grid_table


def _sweep_expected(run: Any) -> list[tuple[str, list[str]]]:
    return [
        (
            c,
            [
                sw.expected_for(t, c, b.label, b.label, sw.build_device(b, run.dist))
                if b.release
                else "(by its version)"
                for b in run.builds
            ],
        )
        for t in run.targets
        for c in t.checks
    ]


def sweep_plan(console: Console, run: object) -> None:
    """The builds (and whether their environment exists), the checks, and what the
    scenarios' rules expect of each check on each release."""

    assert isinstance(run, sw.SweepRun)
    say(
        console,
        f"sweep (dry run): {len(run.builds)} build(s), "
        f"{sum(len(t.checks) for t in run.targets)} check(s), one server at a time",
        indent=0,
        bold="sweep",
    )
    host_line(console)
    build_lines(console, run)
    labels = [b.label for b in run.builds]
    rows = [((c,), [Text(x) for x in cells]) for c, cells in _sweep_expected(run)]
    table = grid(
        "expected (from the scenarios' rules, by version)",
        ("check",),
        rows,
        labels,
        {b.label for b in run.builds if b.release},
        width=console.width,
    )
    console.print(fit(console, table))


def sweep_plan_record(run: object) -> dict[str, Any]:
    assert isinstance(run, sw.SweepRun)
    labels = [b.label for b in run.builds]
    return {
        "command": "sweep",
        "host": host_state(),
        **run.describe(),
        "builds": build_states(run),
        "expected": {c: dict(zip(labels, cells, strict=True)) for c, cells in _sweep_expected(run)},
    }


class SweepProgress(SpinnerLines):
    """A line per build and per cell (a sweep runs for an hour or more, and CI logs must
    show where it is); on a terminal a spinner shows the launch or install under way."""

    def build_started(self, build: Any, index: int, total: int) -> None:
        self._prefix = f"[{index}/{total}] {build.label}"
        self._line(Text(f"{self._prefix}: environment ..."))
        self._show("environment")

    def build_joined(self, build: Any, index: int, total: int) -> None:
        self._prefix = f"[{index}/{total}] {build.label}"

    def build_step(self, build: Any, message: str) -> None:
        self._show(message)

    def build_ready(self, build: Any, status: Any) -> None:
        self._line(env_line(self._prefix, status))

    def cell_done(self, cell: Any) -> None:
        if cell.outcome == "unavailable":
            return  # the build's own line said so, with the reason, once
        if cell.matched is None:
            mark = Text("--", style="dim")
        elif cell.matched:
            mark = Text("ok", style="green")
        else:
            mark = Text("UNEXPECTED", style="bold red")
        line = mark + Text(f" {cell.release} {cell.check}: ")
        line.append(cell.state, style=_sweep_style(cell.outcome))
        if cell.signature and cell.signature != cell.state:
            line.append(f" {cell.signature}")
        if cell.matched is False:
            line.append(f" (expected {cell.expected}: {cell.why})")
        elif cell.matched is None and cell.why:
            line.append(f" ({cell.why})")
        if cell.seconds:
            line.append(f" ({cell.seconds:.0f}s)")
        self._line(line)

    # The commands' reporters, while one of their rows, cells or round trips runs.
    def row_started(self, row: Any, index: int, total: int) -> None:
        self._show(f"launching {row.key}")

    def row_tick(self, row: Any, elapsed: float) -> None:
        self._show(f"launching {row.key} ({elapsed:.0f}s)")

    def row_finished(self, row: Any, index: int, total: int) -> None:
        pass  # cell_done prints the verdict

    def cell_started(self, cell: Any, index: int, total: int) -> None:
        self._show(f"{cell.key}: round trip")

    def cell_finished(self, cell: Any, index: int, total: int) -> None:
        pass

    def status(self, message: str) -> None:
        self._show(message)

    def phase_done(self, phase: Any) -> None:
        self._show(f"phase {phase.phase} done")

    def request_done(self, completion: Any) -> None:
        pass


def _sweep_style(outcome: str) -> str:
    head = outcome.split(",")[0]
    if outcome in ("unavailable", "not-run"):
        return "dim"
    if outcome.endswith("fail"):
        return "red"
    return MATRIX_STYLE.get(head, OUTCOME_STYLE.get(head, "white"))


def sweep_table(cells: Sequence[Any], builds: Sequence[str], width: int | None = None) -> Table:
    """Release x check: outcome per cell, red where it is not what the rules expect; over
    many builds (or more than ``width`` takes), runs of releases alike per check."""
    return grid_table(
        cells, builds, "check", "state", "sweep (* = not as expected)", _sweep_style, width
    )


PLAN = dry_run.register("sweep_plan", sweep_plan, sweep_plan_record)
