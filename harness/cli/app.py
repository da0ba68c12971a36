"""The ``offload-check`` command line: a thin layer over the library modules.

This module holds the typer app, the registration of the commands (one module each
beside this one, in the order ``--help`` lists them) and the guard around the whole
command line (:func:`run`; its parts in ``guard``, the help's format in
``help_format``). Each command parses options, loads a scenario, applies overrides, and
hands off to the library; all user-facing failures arrive here as HarnessError and leave
as one line on stderr with a distinct exit code, never as a traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from harness import __version__
from harness.cli import (
    bench,
    bugs,
    compare,
    crash_repro,
    doctor,
    envs,
    faults,
    listing,
    matrix,
    mutate,
    namespace,
    oracle,
    pressure,
    report,
    roundtrip,
    stress,
    sweep,
    validate,
)
from harness.cli.common import err_console, fit_console
from harness.cli.guard import (
    click_exceptions,
    command_name,
    internal_error,
    reset_lock_wait,
    stop_servers,
    usage_error,
)
from harness.cli.help_format import readable_help, typer_problem
from harness.cli.help_texts import opt
from harness.errors import ExitCode
from harness.results.run_directory import finish_unfinished, runs_created

app = typer.Typer(
    name="offload-check",
    help="Prove vLLM's KV-cache offloading is correct on Llama 4 models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"offload-check {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool, opt("main.version", "--version", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Prove vLLM's KV-cache offloading is correct on Llama 4 models."""


# The commands, in the order the help lists them: each module's ``<module>_cmd``, named
# after its module (``listing`` is ``list``: no module shadows the builtin).
for _module in (
    crash_repro,
    roundtrip,
    stress,
    pressure,
    oracle,
    matrix,
    faults,
    namespace,
    sweep,
    bugs,
    mutate,
    bench,
    report,
    compare,
    validate,
    doctor,
    listing,
):
    _name = _module.__name__.rsplit(".", 1)[-1]
    _command = "list" if _module is listing else _name.replace("_", "-")
    app.command(_command)(getattr(_module, f"{_command.replace('-', '_')}_cmd"))
app.add_typer(envs.envs_app, name="envs")


def run(args: list[str] | None = None) -> int:
    """The whole command line, guarded: every way a command can end becomes an exit code
    of the documented set (0, 1, 2, 3, 130), one line on stderr for errors, and no
    ``run.json`` left ``running``. Returns the exit code."""
    click_exc = click_exceptions()

    argv = sys.argv[1:] if args is None else list(args)
    # Before the command tree is built: an older typer fails there (exit 2, one line).
    problem = typer_problem()
    if problem is not None:
        err_console.print(f"offload-check: error: {problem}", highlight=False, markup=False)
        return int(ExitCode.BAD_INPUT)
    try:
        tree = readable_help(typer.main.get_command(app))
    except Exception as err:  # a typer whose tree this code does not know: exit 3, one line
        return internal_error("offload-check", err, runs_created())
    command = command_name(argv, tree)
    mark = runs_created()
    reset_lock_wait()
    fit_console()
    try:
        rv = tree(args=argv, prog_name="offload-check", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click_exc.ClickException as err:
        code = usage_error(command, err)
    except (KeyboardInterrupt, typer.Abort):
        stop_servers()
        err_console.print("offload-check: interrupted")
        code = int(ExitCode.INTERRUPTED)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except Exception as err:
        code = internal_error(command, err, mark)
    # Whatever ended the command, a run it opened is not left `running`.
    status = {0: "finished", 1: "finished", int(ExitCode.INTERRUPTED): "interrupted"}
    finish_unfinished(status.get(code, "error"), code, mark)
    reset_lock_wait()
    return code


def main() -> None:
    # Piped output (CI logs, `| tee`) is block-buffered by default; a run is long, and each
    # finished row should be visible the moment it is known.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    sys.exit(run())
