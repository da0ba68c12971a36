"""``offload-check report``: a finished (or interrupted) run's tables, from its files."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Annotated

import typer

import harness.cli
from harness.cli.common import console, fail, print_json, show
from harness.cli.help_texts import opt
from harness.errors import HarnessError


def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a results directory (results/<run-id>)")],
    as_json: Annotated[bool, opt("report.json", "--json")] = False,
) -> None:
    """Re-render the tables of a finished (or interrupted) run from its files."""
    from harness.ui.terminal import run_records, run_tables

    try:
        meta = read_run(run_dir)
    except HarnessError as err:
        raise fail(err) from None
    command = str(meta.get("command"))
    if as_json:
        print_json(
            {
                "run_dir": str(run_dir),
                "command": command,
                "label": meta.get("label"),
                "status": meta.get("status"),
                "exit_code": meta.get("exit_code"),
                "tables": run_records(command, run_dir),
            }
        )
        return
    console.print(
        f"[bold]{command}[/] {run_dir}: status {meta.get('status')}, "
        f"exit code {meta.get('exit_code')}",
        highlight=False,
        soft_wrap=False,
    )
    load_views()
    for table in run_tables(command, run_dir):
        show(table)


def read_run(run_dir: Path) -> dict[str, object]:
    """A results directory's ``run.json``."""
    path = run_dir / "run.json"
    if not path.is_file():
        raise HarnessError(f"{run_dir} is not a results directory (no run.json)")
    try:
        return dict(json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise HarnessError(f"{path}: not valid JSON: {err}") from None


def load_views() -> None:
    """Every command's show module (``cli/<command>_show.py``), found by name: each
    registers how ``report`` shows its tables (``harness.ui.terminal.register_view``)."""
    for info in pkgutil.iter_modules(harness.cli.__path__):
        if info.name.endswith("_show"):
            importlib.import_module(f"{harness.cli.__name__}.{info.name}")
