"""``offload-check doctor``: the preflight, one line per check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from harness.cli.common import console, default_scenario, fail
from harness.cli.help_texts import opt
from harness.errors import HarnessError


def doctor_cmd(
    variants_file: Annotated[
        Path | None, opt("doctor.variants-file", show_default="scenarios/variants.toml")
    ] = None,
    variant: Annotated[list[str] | None, opt("doctor.variant", "--variant", "-v")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Preflight: Python, CPU and AMX, memory, disk, loopback, model cache, each variant's
    vLLM and engine plugin, GPU. Run it first; exit 0 when nothing fails."""

    from harness.commands.doctor.host import exit_code
    from harness.commands.doctor.preflight import run_checks

    try:
        checks = run_checks(variants_file or default_scenario("variants.toml"), variant or None)
    except HarnessError as err:
        raise fail(err) from None
    code = exit_code(checks)
    if as_json:
        typer.echo(
            json.dumps({"checks": [c.record() for c in checks], "exit_code": code}, indent=2)
        )
        raise typer.Exit(code)
    width = max(len(c.name) for c in checks)
    styles = {"ok": "green", "warn": "yellow", "fail": "red"}
    for c in checks:
        line = Text(f"{c.status:<4}", style=styles[c.status])
        line.append(f"  {c.name:<{width}}  {c.detail}")
        if c.fix:
            line.append(f"  fix: {c.fix}")
        console.print(line, highlight=False)
    counts = {s: sum(1 for c in checks if c.status == s) for s in styles}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()), highlight=False)
    raise typer.Exit(code)
