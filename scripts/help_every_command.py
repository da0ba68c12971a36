"""Every command's ``--help`` through the installed ``offload-check``: each must exit 0
with its usage on stdout and nothing on stderr, never a traceback. ci.yml's lowest-direct
job runs it on the oldest releases pyproject.toml allows (docs/development.md,
"Dependency floors"); it is as good beside any other environment.

    .venv/bin/python scripts/help_every_command.py

The commands come from the typer app itself, groups and their subcommands included, so a
new command is checked without editing this file. The ``offload-check`` beside the
interpreter running this script is the one run (the environment under test), each help in
its own process, as a user runs it. Exit 0 when every help is clean, 1 otherwise (each
failure named, with what it printed).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CLI = Path(sys.executable).parent / "offload-check"


def _walk(group: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name, command in getattr(group, "commands", {}).items():
        yield (*prefix, name)
        yield from _walk(command, (*prefix, name))


def command_paths() -> list[tuple[str, ...]]:
    """``()`` (the top-level help), then every command and subcommand, in help order."""
    import typer

    from harness.cli.app import app

    return [(), *_walk(typer.main.get_command(app), ())]


def check_help(cli: Path, path: Sequence[str]) -> str | None:
    """What is wrong with ``cli *path --help``; None when it is clean."""
    proc = subprocess.run(
        [str(cli), *path, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit {proc.returncode}")
    if "Usage:" not in proc.stdout:
        problems.append("no usage on stdout")
    if proc.stderr.strip():
        problems.append("output on stderr")
    if not problems:
        return None
    shown = "\n".join(f"    {line}" for line in (proc.stderr or proc.stdout).splitlines()[-20:])
    return f"{', '.join(problems)}:\n{shown}"


def main(argv: Sequence[str] | None = None, cli: Path = CLI) -> int:
    if argv:
        print(f"usage: {Path(__file__).name} (no arguments)", file=sys.stderr)
        return 2
    started = time.monotonic()
    # The top-level help first, alone: if the command line cannot start (say, a typer
    # below its floor), that one line is the finding, before the app is read here.
    first = check_help(cli, ())
    if first is not None:
        print(f"FAIL offload-check --help: {first}")
        return 1
    failed = 0
    paths = command_paths()
    for path in paths:
        problem = check_help(cli, path) if path else None
        name = " ".join(("offload-check", *path, "--help"))
        print(f"ok   {name}" if problem is None else f"FAIL {name}: {problem}", flush=True)
        failed += problem is not None
    took = time.monotonic() - started
    print(f"{len(paths) - failed}/{len(paths)} helps clean ({cli}, {took:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
