"""The commands that spell their own results tables and register them
(``harness.results.tables.register``): loaded before a reader looks a run's kind up, so
``report``, ``compare`` and the CI summary know them as they know the others."""

from __future__ import annotations

import importlib

# Each module registers its ResultsKind when imported (commands/<command>/files.py).
OWNERS = ("harness.commands.oracle.files",)


def load() -> None:
    for name in OWNERS:
        importlib.import_module(name)
