"""What the commands share: the consoles, one-line errors, default scenario files, the
dry run, and every run command's shape (``plan_and_run``). The checks of the options
that name what a run launches are ``launch_checks``'."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from harness.cli.launch_checks import port_free
from harness.cli.options import DEFAULT_SCENARIOS, RunOptions
from harness.errors import HarnessError
from harness.ui.fit import fit

if TYPE_CHECKING:
    pass

# Wide when piped (CI logs, files): rich's 80-column default folds every table cell.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True)
PIPED_WIDTH = 200


def fit_console() -> None:
    """The output's width, read when a command starts: ``COLUMNS`` if set (a terminal's
    own, or a test's), else the terminal's, else (piped, CI logs) ``PIPED_WIDTH``."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        console.width = int(columns)
    elif sys.stdout.isatty():
        console.width = None  # type: ignore[assignment]  # rich asks the terminal
    else:
        console.width = PIPED_WIDTH


def show(table: Any) -> None:
    """A table as the terminal can take it (``harness.ui.fit.fit``: its columns when they
    fit, else one record at a time; ASCII when piped)."""
    console.print(fit(console, table))


def print_json(data: Any) -> None:
    """One JSON document on stdout, and nothing else (``--json``)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def fail(err: HarnessError) -> typer.Exit:
    """A harness error as one line on stderr; raise the exit it returns."""
    err_console.print(f"offload-check: error: {err}", highlight=False, markup=False)
    return typer.Exit(int(err.exit_code))


def default_scenario(name: str) -> Path:
    """``scenarios/<name>`` of the working directory, else the checkout's."""
    local = Path("scenarios") / name
    return local if local.is_file() else DEFAULT_SCENARIOS / name


def scenarios_dir(name: str = "") -> Path:
    """The working directory's ``scenarios/<name>`` directory, else the checkout's."""
    local = Path("scenarios") / name
    return local if local.is_dir() else DEFAULT_SCENARIOS / name


def dry_run_renderers() -> Any:
    """``harness.ui.dry_run``, where each plan is printed (loaded only for a dry run)."""
    from harness.ui import dry_run

    return dry_run


def show_plan(
    renderer: str | Callable[[Console, Any], None], plan: Any, as_json: bool = False
) -> typer.Exit:
    """``--dry-run``: print the plan with ``harness.ui.dry_run.<renderer>`` (``--json``:
    its ``<renderer>_record`` as one JSON document), or with the command's own renderer
    (a function; ``--json``: the plan's ``describe()``); raise the exit it returns."""
    if callable(renderer):
        if as_json:
            print_json(plan.describe())
        else:
            renderer(console, plan)
        return typer.Exit(0)
    if as_json:
        print_json(getattr(dry_run_renderers(), f"{renderer}_record")(plan))
    else:
        getattr(dry_run_renderers(), renderer)(console, plan)
    return typer.Exit(0)


def json_needs_dry_run(as_json: bool, dry_run: bool) -> None:
    """``--json`` of a run command prints its plan: without ``--dry-run`` it is refused."""
    if as_json and not dry_run:
        raise HarnessError("--json prints the plan as JSON: give it with --dry-run")


def plan_and_run(
    make_plan: Callable[[], Any],
    dry_run_renderer: str | Callable[[Console, Any], None],
    run: Callable[[Any], int],
    opts: RunOptions,
) -> None:
    """A run command's shape, once: the shared options' checks, its plan (bad input is
    one line, exit 2, before anything runs, a busy ``--port`` too), then the plan printed
    with ``harness.ui.dry_run.<dry_run_renderer>`` (``--dry-run``) or run; exits either
    way with the exit code."""
    try:
        json_needs_dry_run(opts.as_json, opts.dry_run)
        plan = make_plan()
        port_free(opts.port)
    except HarnessError as err:
        raise fail(err) from None
    if opts.dry_run:
        raise show_plan(dry_run_renderer, plan, opts.as_json)
    raise typer.Exit(run(plan))
