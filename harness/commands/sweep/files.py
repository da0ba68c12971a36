"""A sweep's files, rewritten after each cell: ``sweep.csv`` (release x check),
``envs.csv`` (each build), ``junit.xml``, ``transitions.json``, ``report.md`` and the
heatmap; the tables are spelled here and registered with the results registry
(``harness.results.tables.register``). The bug corpus writes the same builds table."""

from __future__ import annotations

from harness.results.chart import sweep_heatmap
from harness.results.markdown import Envs, Meta, Rows, sweep_report
from harness.results.records import SweepCell
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, record_fields, register

SWEEP_CELLS = TableFile(
    "sweep.csv",
    record_fields(SweepCell),
    key=("release", "check"),
    compared=("vllm_version", "outcome", "known", "matched"),
    passes=("matched",),
    outcomes=("outcome",),
    shown=("release", "check", "outcome", "signature", "expected", "matched", "detail"),
    display=("release", "check", "outcome", "signature", "expected", "match", "detail"),
    junit=JUnitMap(
        "sweep.{release}",
        "{check}",
        lambda c: f"expected {c.expected}, got {c.state}: {c.why}" if c.matched is False else None,
        stdout="outcome={outcome} {signature}\n{detail}\n{why}",
        properties=("vllm_version", "outcome", "expected", "scenario"),
        seconds="seconds",
    ),
)
SWEEP_ENVS = TableFile(
    "envs.csv",
    ("release", "state", "reason", "seconds", "disk_bytes", "vllm_version", "python", "ahead"),
    title="builds",
    key=("release",),
    compared=("state", "vllm_version"),
    outcomes=("state",),
    shown=("release", "state", "vllm_version", "seconds", "reason"),
)
SWEEP = register(
    ResultsKind(
        "sweep",
        (SWEEP_CELLS, SWEEP_ENVS),
        (
            "junit.xml",
            "report.md",
            "heatmap.png",
            "transitions.json",
            "releases/<build>/<scenario>/",
        ),
    )
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
