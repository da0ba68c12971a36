"""What ``matrix`` shows: its plan (``--dry-run``, text or ``--json``), a line per cell
and phase while it runs, and the matrix table; its plan renderers registered with
``harness.ui.dry_run``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from harness.cli.roundtrip_show import RoundtripProgress
from harness.commands import matrix as mx
from harness.commands.matrix.files import MATRIX_CELLS
from harness.ui import dry_run
from harness.ui.dry_run import say
from harness.ui.terminal import MATRIX_STYLE


def matrix_plan(console: Console, plan: object) -> None:
    assert isinstance(plan, mx.MatrixPlan)
    scen = plan.scenario
    say(
        console,
        f"matrix {scen.name}: {len(plan.cells)} cells, one server at a time",
        indent=0,
        bold="matrix",
    )
    for cell in plan.cells:
        assert cell.plan is not None
        exp = cell.plan.expected
        say(
            console,
            f"{cell.key} (vLLM {cell.vllm_version}): expect "
            f"{cell.expected_text()}; plan stores {exp.stored_bytes:,} B, loads "
            f"{exp.loaded_bytes:,} B, hits {exp.hit_tokens} tokens",
        )


def matrix_plan_record(plan: object) -> dict[str, Any]:
    assert isinstance(plan, mx.MatrixPlan)
    cells = []
    for cell in plan.cells:
        assert cell.plan is not None
        exp = cell.plan.expected
        server = cell.plan.server
        cells.append(
            {
                "key": cell.key,
                "family": cell.family,
                "geometry": cell.geometry,
                "variant": cell.variant,
                "vllm_version": cell.vllm_version,
                "expected": cell.expected_text(),
                "stored_bytes": exp.stored_bytes,
                "loaded_bytes": exp.loaded_bytes,
                "hit_tokens": exp.hit_tokens,
                "argv": server.argv() if server is not None else None,
            }
        )
    return {"command": "matrix", "scenario": plan.scenario.name, "cells": cells}


class MatrixProgress:
    """One line per cell and per phase: cells take a minute or two each."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._rt = RoundtripProgress(console)

    def cell_started(self, cell: Any, index: int, total: int) -> None:
        self.console.print(
            f"[{index}/{total}] {cell.key} (vLLM {cell.vllm_version}): expect "
            f"{cell.expected_text()}",
            highlight=False,
            markup=False,
        )

    def cell_finished(self, cell: Any, index: int, total: int) -> None:
        mark = "[green]ok[/]" if cell.matched else "[red]UNEXPECTED[/]"
        self.console.print(
            f"{mark} {escape(cell.key)}: {escape(cell.observed_text())} ({cell.seconds:.0f}s)",
            highlight=False,
        )

    def status(self, message: str) -> None:
        self._rt.status(message)

    def request_done(self, completion: Any) -> None:
        pass  # a matrix is many round trips: phases are enough

    def phase_done(self, phase: Any) -> None:
        self._rt.phase_done(phase)


def matrix_table(cells: Sequence[Any]) -> Table:
    """The matrix, cells that differ from their expectation first."""
    table = Table(title="KV-cache spec family matrix", header_style="bold", show_lines=True)

    for col in MATRIX_CELLS.display:
        table.add_column(col, overflow="fold")
    for c in cells:
        start = Text(c.startup or "-", style=MATRIX_STYLE.get(c.startup, "white"))
        if c.signature:
            start.append(f"\n{c.signature}")
        if c.startup == "unsupported" and c.message:
            start.append(f"\n{c.message[:160]}")
        if c.roundtrip == "pass":
            rt = Text("pass", style="green")
        elif c.roundtrip == "fail":
            rt = Text("FAIL: " + ", ".join(c.failed_checks), style="bold red")
            first = next((k for k in c.checks if not k.passed), None)
            if first is not None:
                rt.append(f"\n{first.observed}"[:200])
        elif c.roundtrip == "error":
            rt = Text(f"error: {c.why}", style="magenta")
        else:
            rt = Text("-")
        match = Text("yes", style="green") if c.matched else Text(f"NO: {c.why}", style="bold red")
        table.add_row(
            *c.identity(),
            start,
            rt,
            c.expected_text(),
            match,
        )
    return table


PLAN = dry_run.register("matrix_plan", matrix_plan, matrix_plan_record)
