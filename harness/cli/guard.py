"""The parts of the guard around every command (``app.run``): the command a command line
names, click's usage errors as one line (exit 2), an unexpected exception as one line
naming the command and where its traceback went (exit 3), the servers this process
launched stopped, and ``--no-wait`` reset between commands."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import typer

from harness.cli.common import err_console
from harness.errors import ExitCode
from harness.results.run_directory import finish_unfinished, unfinished_runs


def command_name(args: list[str], tree: Any) -> str:
    """The (sub)command ``args`` name in the command ``tree``, e.g. ``envs create``;
    ``offload-check`` for none."""
    group: Any = tree
    names: list[str] = []
    for arg in args:
        if arg.startswith("-"):
            continue
        if arg not in getattr(group, "commands", {}):
            break
        names.append(arg)
        group = group.commands[arg]
    return " ".join(names) or "offload-check"


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def click_exceptions() -> Any:
    """The module of click's exceptions typer uses (its own copy of click, or click)."""
    return sys.modules[typer.BadParameter.__module__]


def usage_error(command: str, err: Any) -> int:
    """click's usage errors (bad value, unknown option, missing argument) as one line."""
    if isinstance(err, click_exceptions().NoArgsIsHelpError):
        return int(err.exit_code)  # typer printed the help already, as it does by itself
    hint = f" (see `offload-check {command} --help`)" if command != "offload-check" else ""
    message = one_line(err.format_message())
    err_console.print(
        f"offload-check: error: {command}: {message}{hint}", highlight=False, markup=False
    )
    return int(err.exit_code)


def internal_error(command: str, err: BaseException, mark: int) -> int:
    """An exception the harness did not expect: one line naming the command, the cause and
    where the whole traceback went (the oldest unfinished run directory, else a temp
    file); every unfinished run is marked ``failed``. Exit 3."""
    stop_servers()
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
    cause = one_line(f"{type(err).__name__}: {err}")
    finish_unfinished("failed", int(ExitCode.RUNTIME), mark, error=cause, traceback_file=str(where))
    err_console.print(
        f"offload-check: internal error in {command}: {cause} (traceback: {where})",
        highlight=False,
        markup=False,
    )
    return int(ExitCode.RUNTIME)


def stop_servers() -> None:
    """Stop servers this process launched (only if the launcher was ever loaded)."""
    launcher = sys.modules.get("harness.server.launcher")
    if launcher is not None:
        with contextlib.suppress(Exception):
            launcher.stop_all()


def reset_lock_wait() -> None:
    """``--no-wait`` holds for one command (several may run in one process: tests)."""
    server_lock = sys.modules.get("harness.server.server_lock")
    if server_lock is not None:
        server_lock.set_lock_wait(None)
