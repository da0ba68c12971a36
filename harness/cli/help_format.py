"""``--help`` that reads at 80 columns (each option's value named, each docstring
paragraph one paragraph), and the oldest typer whose command tree this works with."""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path
from typing import Any

import typer
from packaging.version import InvalidVersion, Version

from harness.cli.help_texts import METAVARS

# The oldest typer this command line works with: readable_help reads each parameter's
# type_descriptor (TyperOption, TyperArgument), new in typer 0.29.0; under 0.28 and older
# every command ended in an AttributeError. pyproject.toml's floor is the same
# (tests/unit/repo/test_dependency_floors.py keeps the two equal).
TYPER_FLOOR = "0.29.0"


def typer_problem() -> str | None:
    """Why the installed typer cannot run this command line, in one line (its version is
    below ``TYPER_FLOOR``); None when it can."""
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
