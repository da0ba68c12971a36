"""A bench run's files: ``bench.json`` (every sample) and ``bench.csv`` (the figures,
each with its target); the table is spelled here and registered with the results
registry (``harness.results.tables.register``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.results.run_directory import RunDirectory
from harness.results.tables import ResultsKind, TableFile, register

BENCH_FIGURES = TableFile(
    "bench.csv",
    ("figure", "value", "target", "ok"),
    key=("figure",),
    compared=("value", "ok"),
    passes=("ok",),
    shown=("figure", "value", "target", "ok"),
)
BENCH = register(
    ResultsKind("bench", (BENCH_FIGURES,), ("bench.json", "crash-repro/logs/", "roundtrip/logs/"))
)


def write_bench(run_dir: RunDirectory, figures: Sequence[dict[str, Any]]) -> None:
    """``bench.json`` keeps every sample (``detail``); ``bench.csv`` the figures."""
    run_dir.write_json("bench.json", list(figures))
    BENCH_FIGURES.write(run_dir, figures)
