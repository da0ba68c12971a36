"""The ``offload-check`` command line: a thin layer over the library modules.

This module holds the typer app, the registration of the commands (one module each
beside this one, in the order ``--help`` lists them) and the guard around the whole
command line (:func:`run`). Each command parses options, loads a scenario, applies
overrides, and hands off to the library; all user-facing failures arrive here as
HarnessError and leave as one line on stderr with a distinct exit code, never as a
traceback.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import typing
from pathlib import Path
from typing import Annotated, Any

import typer

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
from harness.cli.options import opt
from harness.errors import ExitCode

# The oldest typer this command line works with: readable_help reads each parameter's
# type_descriptor (TyperOption, TyperArgument), new in typer 0.29.0; under 0.28 and older
# every command ended in an AttributeError. pyproject.toml's floor is the same
# (tests/unit/test_dependency_floors.py keeps the two equal).
TYPER_FLOOR = "0.29.0"

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
        from harness import __version__

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


def typer_problem() -> str | None:
    """Why the installed typer cannot run this command line, in one line (its version is
    below ``TYPER_FLOOR``); None when it can."""
    from packaging.version import InvalidVersion, Version

    installed = str(getattr(typer, "__version__", "0"))
    try:
        if Version(installed) >= Version(TYPER_FLOOR):
            return None
    except InvalidVersion:
        return None  # a build naming itself oddly: the command tree's guard is the check
    return (
        f"offload-check needs typer>={TYPER_FLOOR}, this environment has typer {installed} "
        f"({Path(typer.__file__).parent}): upgrade it there "
        f"(`{sys.executable} -m pip install 'typer>={TYPER_FLOOR}'`, or `make setup`)"
    )


def readable_help(command: Any) -> Any:
    """The click command tree with help that reads at 80 columns: each option's value
    named (``METAVARS`` by parameter name, else its type: TEXT, PATH, INTEGER, NUMBER,
    the choices; a flag nothing), never typer's ``<list[str]>``; each docstring paragraph
    one paragraph (typer keeps a docstring's line breaks). Returns ``command``."""
    import inspect

    from harness.cli.options import METAVARS

    for sub in getattr(command, "commands", {}).values():
        readable_help(sub)
    help_option = command.get_help_option

    def flag_help(ctx: Any, made: Any = help_option) -> Any:
        option = made(ctx)
        if option is not None:
            option.metavar = ""  # a flag: no value to name
        return option

    command.get_help_option = flag_help
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    for param in command.params:
        if param.param_type_name != "option" or param.metavar is not None:
            continue
        desc = param.type_descriptor
        inner = desc.annotation
        if typing.get_origin(inner) is list:
            (inner,) = typing.get_args(inner)
        if param.is_flag:
            param.metavar = ""
        elif param.name in METAVARS:
            param.metavar = METAVARS[param.name]
        elif desc.is_choice:
            param.metavar = "|".join(str(getattr(c, "value", c)) for c in desc.choices or ())
        else:
            names = {int: "INTEGER", float: "NUMBER", Path: "PATH"}
            param.metavar = names.get(inner, "TEXT")
    return command


def _command_name(args: list[str], tree: Any = None) -> str:
    """The (sub)command ``args`` name, e.g. ``envs create``; ``offload-check`` for none."""
    group: Any = typer.main.get_command(app) if tree is None else tree
    names: list[str] = []
    for arg in args:
        if arg.startswith("-"):
            continue
        if arg not in getattr(group, "commands", {}):
            break
        names.append(arg)
        group = group.commands[arg]
    return " ".join(names) or "offload-check"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _click_exceptions() -> Any:
    """The module of click's exceptions typer uses (its own copy of click, or click)."""
    return sys.modules[typer.BadParameter.__module__]


def _usage_error(command: str, err: Any) -> int:
    """click's usage errors (bad value, unknown option, missing argument) as one line."""
    if isinstance(err, _click_exceptions().NoArgsIsHelpError):
        return int(err.exit_code)  # typer printed the help already, as it does by itself
    hint = f" (see `offload-check {command} --help`)" if command != "offload-check" else ""
    message = _one_line(err.format_message())
    err_console.print(
        f"offload-check: error: {command}: {message}{hint}", highlight=False, markup=False
    )
    return int(err.exit_code)


def _internal_error(command: str, err: BaseException, mark: int) -> int:
    """An exception the harness did not expect: one line naming the command, the cause and
    where the whole traceback went (the oldest unfinished run directory, else a temp
    file); every unfinished run is marked ``failed``. Exit 3."""
    import tempfile

    from harness.results.run_directory import finish_unfinished, unfinished_runs

    _stop_servers()
    text = "".join(traceback.format_exception(err))
    runs = unfinished_runs(mark)
    where: Path | None = None
    for run in runs[:1]:
        with contextlib.suppress(OSError):
            where = run.write_text("traceback.txt", text)
    if where is None:
        fd, name = tempfile.mkstemp(
            prefix=f"offload-check-{command.replace(' ', '-')}-", suffix=".traceback.txt"
        )
        with open(fd, "w") as out:
            out.write(text)
        where = Path(name)
    cause = _one_line(f"{type(err).__name__}: {err}")
    finish_unfinished("failed", int(ExitCode.RUNTIME), mark, error=cause, traceback_file=str(where))
    err_console.print(
        f"offload-check: internal error in {command}: {cause} (traceback: {where})",
        highlight=False,
        markup=False,
    )
    return int(ExitCode.RUNTIME)


def _stop_servers() -> None:
    """Stop servers this process launched (only if the launcher was ever loaded)."""
    launcher = sys.modules.get("harness.server.launcher")
    if launcher is not None:
        with contextlib.suppress(Exception):
            launcher.stop_all()


def run(args: list[str] | None = None) -> int:
    """The whole command line, guarded: every way a command can end becomes an exit code
    of the documented set (0, 1, 2, 3, 130), one line on stderr for errors, and no
    ``run.json`` left ``running``. Returns the exit code."""
    from harness.results.run_directory import finish_unfinished, runs_created

    click_exc = _click_exceptions()

    argv = sys.argv[1:] if args is None else list(args)
    # Before the command tree is built: an older typer fails there (exit 2, one line).
    problem = typer_problem()
    if problem is not None:
        err_console.print(f"offload-check: error: {problem}", highlight=False, markup=False)
        return int(ExitCode.BAD_INPUT)
    try:
        tree = readable_help(typer.main.get_command(app))
    except Exception as err:  # a typer whose tree this code does not know: exit 3, one line
        return _internal_error("offload-check", err, runs_created())
    command = _command_name(argv, tree)
    mark = runs_created()
    _reset_lock_wait()
    fit_console()
    try:
        rv = tree(args=argv, prog_name="offload-check", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click_exc.ClickException as err:
        code = _usage_error(command, err)
    except (KeyboardInterrupt, typer.Abort):
        _stop_servers()
        err_console.print("offload-check: interrupted")
        code = int(ExitCode.INTERRUPTED)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except Exception as err:
        code = _internal_error(command, err, mark)
    # Whatever ended the command, a run it opened is not left `running`.
    status = {0: "finished", 1: "finished", int(ExitCode.INTERRUPTED): "interrupted"}
    finish_unfinished(status.get(code, "error"), code, mark)
    _reset_lock_wait()
    return code


def _reset_lock_wait() -> None:
    """``--no-wait`` holds for one command (several may run in one process: tests)."""
    server_lock = sys.modules.get("harness.server.server_lock")
    if server_lock is not None:
        server_lock.set_lock_wait(None)


def main() -> None:
    # Piped output (CI logs, `| tee`) is block-buffered by default; a run is long, and each
    # finished row should be visible the moment it is known.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    sys.exit(run())
