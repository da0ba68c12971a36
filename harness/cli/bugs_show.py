"""What ``bugs`` shows: its plan (``--dry-run``, text or ``--json``: the entries, the
builds, what each entry expects on each release and the command that reruns it), the
sweep's lines read as the entries' verdicts while it runs, and the bug x release table;
its plan renderers registered with ``harness.ui.dry_run``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.cli.sweep_show import SweepProgress
from harness.commands.bugs import corpus as bugs
from harness.ui import dry_run
from harness.ui.dry_run import build_lines, build_states, host_line, host_state, say
from harness.ui.fit import fit, grid
from harness.ui.terminal import grid_table


def _bugs_expected(run: Any) -> list[tuple[str, str, list[str]]]:
    """(entry, trigger, what it expects on each build) of a corpus run."""
    sweep = run.sweep
    out = []
    for e in run.entries:
        trig = e.trigger
        if trig.kind == "check":
            what = trig.check
        elif trig.kind == "scheduler":
            what = f"scheduler drive {trig.case}"
        else:
            what = f"{len(trig.steps)} steps"
        if e.id in run.skipped:
            cells = ["skipped"] * len(sweep.builds)
        else:
            cells = [
                "skipped"
                if (e.id, b.label) in run.off_platform
                else (bugs.expected_on(e, b.label) or "-")
                if b.release
                else "(by its version)"
                for b in sweep.builds
            ]
        out.append((e.id, what, cells))
    return out


def bugs_plan(console: Console, run: object) -> None:
    """The entries (trigger, ranges, why skipped), the builds, what each entry expects on
    each release, and the command that reruns each."""

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    say(
        console,
        f"bugs (dry run): {len(run.entries)} entries x {len(sweep.builds)} build(s), "
        "one server at a time",
        indent=0,
        bold="bugs",
    )
    host_line(console)
    build_lines(console, sweep)
    labels = [b.label for b in sweep.builds]
    rows = [((bug, what), [Text(c) for c in cells]) for bug, what, cells in _bugs_expected(run)]
    releases = {b.label for b in sweep.builds if b.release}
    table = grid(
        "expected (from each entry's ranges)",
        ("bug", "trigger"),
        rows,
        labels,
        releases,
        width=console.width,
    )
    console.print(fit(console, table))
    for e in run.entries:
        why = f" (skipped: {run.skipped[e.id]})" if e.id in run.skipped else ""
        say(console, f"{e.id}: {e.title}{why}")
        say(console, bugs.reproduction(e, sweep.release_order), indent=4)


def bugs_plan_record(run: object) -> dict[str, Any]:
    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    labels = [b.label for b in sweep.builds]
    entries = []
    by_id = {e.id: e for e in run.entries}
    for bug, trigger, cells in _bugs_expected(run):
        e = by_id[bug]
        entries.append(
            {
                "id": bug,
                "title": e.title,
                "trigger": trigger,
                "skipped": run.skipped.get(bug),
                "expected": dict(zip(labels, cells, strict=True)),
                "rerun": bugs.reproduction(e, sweep.release_order),
            }
        )
    return {
        "command": "bugs",
        "dist": sweep.dist,
        "host": host_state(),
        "builds": build_states(sweep),
        "entries": entries,
    }


class BugsProgress(SweepProgress):
    """The sweep's lines, each trigger's cell read as its entries' verdicts: ``ok`` when
    the entry says so of that release, ``UNMATCHED`` when not, ``--`` when not judged."""

    def __init__(self, console: Console, judge: Any) -> None:
        super().__init__(console)
        self._judge = judge  # a sweep cell -> the bug cells it decides

    def cell_done(self, cell: Any) -> None:
        if cell.outcome == "unavailable":
            return  # the build's own line said so, with the reason, once
        for c in self._judge(cell):
            if c.matched is None:
                mark = Text("--", style="dim")
            else:
                mark = Text("ok", style="green") if c.matched else Text("UNMATCHED", "bold red")
            line = mark + Text(f" {c.release} {c.bug}: ")
            line.append(c.outcome, style=BUG_STYLE.get(c.outcome, "dim"))
            if c.signature:
                line.append(f" ({c.signature})")
            if c.why and c.matched is not True:
                line.append(f": {c.why}")
            if c.seconds:
                line.append(f" ({c.seconds:.0f}s)")
            self._line(line)


BUG_STYLE = {"reproduced": "yellow", "passed": "green", "error": "red"}


def bugs_table(cells: Sequence[Any], builds: Sequence[str], width: int | None = None) -> Table:
    """Bug x release: reproduced (yellow), passed (green), error (red); bold red where the
    cell is not what the entry says of that release."""
    return grid_table(
        cells,
        builds,
        "bug",
        "outcome",
        "bugs (* = unmatched)",
        lambda o: BUG_STYLE.get(o, "dim"),
        width,
    )


PLAN = dry_run.register("bugs_plan", bugs_plan, bugs_plan_record)
