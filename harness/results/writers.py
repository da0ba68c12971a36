"""Writing a run's files from its rows: each table by its schema (``harness.results.tables``),
its JUnit cases and its ``report.md``. Outputs import the schema, never the reverse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.results.chart import sweep_heatmap
from harness.results.markdown import Envs, Meta, Rows, faults_report, matrix_report, sweep_report
from harness.results.run_directory import RunDirectory
from harness.results.tables import (
    BENCH_FIGURES,
    FAULT_ROUNDS,
    MATRIX_CELLS,
    OUTCOMES,
    SWEEP_CELLS,
    SWEEP_ENVS,
)


def write_crash_repro(run_dir: RunDirectory, rows: Sequence[Any]) -> None:
    OUTCOMES.write(run_dir, [r.record() for r in rows])
    OUTCOMES.write_junit(run_dir, "crash-repro", rows)


def write_matrix(run_dir: RunDirectory, cells: Sequence[Any]) -> None:

    MATRIX_CELLS.write(run_dir, [c.record() for c in cells])
    MATRIX_CELLS.write_junit(run_dir, "matrix", cells)
    run_dir.write_text("report.md", matrix_report(cells, {"results_dir": str(run_dir.path)}))


def write_faults(run_dir: RunDirectory, rounds: Sequence[Any], meta: dict[str, Any]) -> None:

    FAULT_ROUNDS.write(run_dir, [r.record() for r in rounds])
    FAULT_ROUNDS.write_junit(run_dir, "faults", rounds)
    run_dir.write_text(
        "report.md", faults_report(rounds, {"results_dir": str(run_dir.path), **meta})
    )


def write_sweep(
    run_dir: RunDirectory,
    cells: Rows,
    envs: Envs,
    transitions: Rows,
    meta: Meta,
    *,
    chart: bool = True,
) -> None:
    """Every sweep file from what is known so far (rewritten after each cell)."""

    SWEEP_CELLS.write(run_dir, [c.record() for c in cells])
    SWEEP_ENVS.write(run_dir, envs)
    SWEEP_CELLS.write_junit(run_dir, "sweep", cells)
    run_dir.write_json("transitions.json", [t.record() for t in transitions])
    run_dir.write_text(
        "report.md",
        sweep_report(cells, envs, transitions, {"results_dir": str(run_dir.path), **meta}),
    )
    if chart and cells:
        sweep_heatmap(cells, meta.get("release_order", []), run_dir.path / "heatmap.png")


def write_bench(run_dir: RunDirectory, figures: Sequence[dict[str, Any]]) -> None:
    """``bench.json`` keeps every sample (``detail``); ``bench.csv`` the figures."""
    run_dir.write_json("bench.json", list(figures))
    BENCH_FIGURES.write(run_dir, figures)
