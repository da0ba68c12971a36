"""Every command's results kind, found where the command keeps it, and the one lookup of
a run's kind that every reader (``report``, ``compare``, the CI summary) uses.

A command spells its tables in its own package and registers its kind with
``harness.results.tables.register`` when that module is imported: a command package's
``files`` module (``commands/<command>/files.py``), or a one-module command itself
(``commands/faults.py``). ``load`` imports them all, found by walking ``harness.commands``,
so a new command is found without a line here."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import harness.commands
from harness.results.tables import ResultsKind
from harness.results.tables import kind_of as _registered_kind


def owners() -> list[str]:
    """The modules that register the commands' results kinds, by name."""
    out = []
    for info in pkgutil.iter_modules(harness.commands.__path__):
        name = f"{harness.commands.__name__}.{info.name}"
        if not info.ispkg:
            out.append(name)
        elif importlib.util.find_spec(f"{name}.files") is not None:
            out.append(f"{name}.files")
    return sorted(out)


def load() -> None:
    for name in owners():
        importlib.import_module(name)


def kind_of(command: str) -> ResultsKind | None:
    """A run's results kind by its ``run.json`` ``command``."""
    load()
    return _registered_kind(command)
