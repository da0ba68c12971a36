"""What the commands share: the consoles, one-line errors, default scenario files, the
dry run, and the checks of the options that name an interpreter, a build or a fault."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from harness.cli.options import DEFAULT_SCENARIOS, RunOptions
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripOptions

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
    from harness.ui.fit import fit

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


def port_free(port: int | None) -> None:
    """A busy ``--port`` is bad input before anything runs (not a failed launch later)."""
    if port is not None:
        from harness.server.launcher import check_port_free

        check_port_free(port)


def reachable(url: str) -> None:
    """An attach ``--url`` answers before a run directory is made (as roundtrip's plan)."""
    from harness.server.launcher import http_json

    base = url.rstrip("/")
    try:
        http_json(f"{base}/v1/models", None, 30)
    except HarnessError as err:
        raise HarnessError(f"cannot reach {base}: {err}") from None


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


def check_jobs(jobs: int, port: int | None) -> None:
    """``--jobs`` N > 1: N lanes of this machine's cores (each server its own), so not
    more than its cores, no fixed ``--port`` (N servers at once), and no GPU machine
    (its servers would share the GPU, which the lanes do not split)."""
    if jobs <= 1:
        return
    from harness.server import lanes
    from harness.server.interpreters import has_gpu

    if port is not None:
        raise HarnessError(f"--jobs {jobs} runs {jobs} servers at once: one --port cannot do")
    if has_gpu():
        raise HarnessError(
            f"--jobs {jobs} splits CPU cores between servers; on a GPU machine they would "
            "share the GPU: use --jobs 1"
        )
    lanes.split(jobs)  # more lanes than cores: one line, exit 2


def given_flags(**given: object) -> list[str]:
    """The options among ``given`` (by name without dashes) that were set, as flags."""
    return [f"--{k.replace('_', '-')}" for k, v in given.items() if v not in (None, [], False)]


def refuse_on_attach(url: str | None, **given: object) -> None:
    """``--url`` attaches to a server someone else launched: an option that only chooses
    what a launch starts is refused (one line, exit 2), the same for every command.
    ``given``: each such option's value by its name without dashes (``engine_arg``)."""
    if url is None:
        return
    named = given_flags(**given)
    if named:
        which = ", ".join(named[:-1]) + f" and {named[-1]}" if len(named) > 1 else named[0]
        verb = "do not apply (they choose" if len(named) > 1 else "does not apply (it chooses"
        raise HarnessError(
            f"--url attaches to a server someone else launched: {which} {verb} what a "
            "launch starts)"
        )


def interpreter(given: str, option: str) -> Path:
    """An interpreter (or the venv holding it) with vLLM, checked the same way for every
    option that names one (``--python``, ``--build``): it exists, runs, and imports vLLM."""
    from harness.server.interpreters import probe

    path = Path(given)
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.is_file():
        what = (
            "wheel, environment or interpreter"
            if option == "--build"
            else "interpreter or environment"
        )
        raise HarnessError(f"{option} {given}: no such {what}")
    try:
        probe(str(path))
    except HarnessError as err:
        raise HarnessError(f"{option} {given}: {err}") from None
    return path


def check_builds(builds: list[str]) -> None:
    """``--build``: a wheel (path or URL) or an interpreter / venv, as ``--python``."""
    for given in builds:
        if given.endswith(".whl"):
            if "://" not in given and not Path(given).is_file():
                raise HarnessError(f"--build {given}: no such wheel")
            continue
        interpreter(given, "--build")


def adhoc_variants(pythons: list[str]) -> dict[str, Any]:
    """``--python`` interpreters as variants, named as the sweep names user builds."""
    from harness.commands.sweep import build_label
    from harness.scenario.schema import Variant

    out: dict[str, Any] = {}
    for given in pythons:
        path = interpreter(given, "--python")
        name = build_label(str(path))
        out[name] = Variant(name=name, python=str(path.absolute()), description=f"--python {given}")
    return out


def known_fault(fault: str | None) -> None:
    from harness.names import FAULTS

    if fault is not None and fault not in FAULTS:
        raise HarnessError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def launch_options(
    variant: str | None,
    python: str | None,
    patch: str | None,
    config: Path | None,
    tp: int | None,
    fault: str | None,
    engine_arg: list[str] | None,
) -> RoundtripOptions:
    """What ``roundtrip`` and ``stress`` forward to ``plan_roundtrip`` (its
    ``RoundtripOptions``): ``--python`` becomes an ad-hoc variant, named as the sweep names
    user builds."""
    adhoc = adhoc_variants([python] if python else [])
    if adhoc and variant:
        raise HarnessError("give --variant or --python, not both")
    return {
        "variant": next(iter(adhoc), variant),
        "patch": patch,
        "config": str(config) if config else None,
        "tp": tp,
        "fault": fault,
        "extra_args": engine_arg,
        "extra_variants": adhoc,
    }
