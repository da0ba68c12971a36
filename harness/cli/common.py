"""What the commands share: the consoles, one-line errors, default scenario files, the
dry run, and the checks of the options that name an interpreter, a build or a fault."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from harness.cli.options import DEFAULT_SCENARIOS
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripOptions

# Wide when piped (CI logs, files): rich's 80-column default folds every table cell.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True)


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


def show_plan(renderer: str, plan: object) -> typer.Exit:
    """``--dry-run``: print the plan with ``harness.ui.dry_run.<renderer>``; raise the exit
    it returns."""
    getattr(dry_run_renderers(), renderer)(console, plan)
    return typer.Exit(0)


def launch_or_show(plan: object, dry_run_renderer: str | None, launch: Callable[[], int]) -> None:
    """A command's last step: print the plan (``--dry-run``) or run it; exits either way."""
    if dry_run_renderer is not None:
        raise show_plan(dry_run_renderer, plan)
    raise typer.Exit(launch())


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
    from harness.scenario.schema import FAULTS

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
