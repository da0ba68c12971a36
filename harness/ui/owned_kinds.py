"""The commands that spell their own results tables and register them
(``harness.results.tables.register``), and the one lookup of a run's kind that every
reader uses: it loads those commands' files modules first, so ``report``, ``compare``
and the CI summary know their tables as they know the others."""

from __future__ import annotations

import importlib

from harness.results.tables import ResultsKind
from harness.results.tables import kind_of as _registered_kind

# Each module registers its ResultsKind when imported (commands/<command>/files.py).
OWNERS = ("harness.commands.oracle.files", "harness.commands.namespace.files")


def load() -> None:
    for name in OWNERS:
        importlib.import_module(name)


def kind_of(command: str) -> ResultsKind | None:
    """A run's results kind by its ``run.json`` ``command``, owned commands included."""
    load()
    return _registered_kind(command)
