"""``offload-check compare``: what changed between two runs of the same command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from harness.cli.common import console, fail, show
from harness.errors import HarnessError


def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="the earlier results directory")],
    run_b: Annotated[Path, typer.Argument(help="the later results directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
) -> None:
    """Show what changed between two runs of the same command (for nightly trends).

    Exit 1 when something regressed: a check or row that passed no longer does, an outcome
    changed, or a row is gone; 0 otherwise. Counters show their delta (later - earlier).
    """

    from harness.ui.compare import compare
    from harness.ui.terminal import frame_table

    try:
        result = compare(run_a, run_b)
    except HarnessError as err:
        raise fail(err) from None
    if as_json:
        typer.echo(json.dumps(result.record(), indent=2, default=str))
        raise typer.Exit(result.exit_code)
    for table in result.tables:
        show(frame_table(table.title, table.records(), table.columns()))
    for line in result.regressions:
        console.print(f"[red]regressed[/] {escape(line)}", highlight=False)
    regressed = len(result.regressions)
    console.print(f"{result.changed} row(s) changed, {regressed} regression(s)", highlight=False)
    raise typer.Exit(result.exit_code)
