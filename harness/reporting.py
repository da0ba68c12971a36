"""What a person sees on the terminal: progress while servers start, then tables.

Only the CLI imports this module (rich is a terminal concern); the library API
reports through plain callbacks so it can be driven from tests or other tools.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from harness.crash_repro import Row

OUTCOME_STYLE = {"started": "green", "crashed": "red", "timeout": "yellow", "error": "magenta"}


class CrashReproProgress:
    """A progress bar over rows, with the row being launched and its elapsed time."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
            console=console, transient=True,
        )
        self.task: int | None = None

        # A live display only makes sense on a terminal; in CI logs and pipes it would
        # hold every line back until the end, so there each row is a plain line.
        self.live = console.is_terminal

    def __enter__(self) -> CrashReproProgress:
        if self.live:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.__exit__(*exc)

    def row_started(self, row: Row, index: int, total: int) -> None:
        if not self.live:
            self.console.print(f"[{index}/{total}] launching {row.key} ...", highlight=False,
                               markup=False)
            return
        if self.task is None:
            self.task = self.progress.add_task("", total=total)
        self.progress.update(self.task, description=f"launching {row.key}")

    def row_tick(self, row: Row, elapsed: float) -> None:
        if self.live and self.task is not None:
            self.progress.update(self.task, description=f"launching {row.key} ({elapsed:.0f}s)")

    def row_finished(self, row: Row, index: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=index)
        mark = "[green]ok[/]" if row.matched else "[red]UNEXPECTED[/]"
        style = OUTCOME_STYLE.get(row.outcome, "white")
        detail = f" {row.signature}" if row.signature else ""
        if row.outcome == "started":
            detail = " and answered" if row.answered else " but did not answer"
        self.console.print(
            f"{mark} {row.key}: [{style}]{row.outcome}[/]{detail} ({row.seconds or 0:.1f}s)",
            highlight=False,
        )


def crash_repro_table(rows: Sequence[Row]) -> Table:
    table = Table(title="crash-repro", show_lines=False, header_style="bold")
    for col in ("model", "variant", "vLLM", "patch", "connector", "outcome", "signature",
                "time", "expected", "match"):
        table.add_column(col, overflow="fold")
    for r in rows:
        style = OUTCOME_STYLE.get(r.outcome, "white")
        sig = r.signature
        if r.frame:
            sig = f"{r.exception} in {r.frame.rsplit('/', 1)[-1]}"
            sig += f" (known: #{r.known_issue})" if r.known_issue else ""
        if r.outcome == "started":
            sig = "answered" if r.answered else f"no answer: {r.answer}"
        expected = r.expected + (f" #{r.expected_known}" if r.expected_known else "")
        table.add_row(
            r.model, r.variant, r.vllm_version, r.patch or "-",
            "on" if r.connector else "off (control)",
            Text(r.outcome, style=style), sig,
            f"{r.seconds:.1f}s" if r.seconds is not None else "-",
            expected,
            Text("yes", style="green") if r.matched else Text(f"NO: {r.why}", style="bold red"),
        )
    return table
