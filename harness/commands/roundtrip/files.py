"""A round trip's files in a run directory, rewritten after every phase.

Shared by ``roundtrip`` (one run) and ``matrix`` (one sub-directory per cell), so a
cell's evidence has the same shape, and the same documented schema, as a run's. Its
tables (``phases.csv``, ``checks.csv``) are spelled here and registered with the results
registry (``harness.results.tables.register``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.commands.roundtrip import RoundtripPlan, RoundtripResult, save_requests
from harness.results.records import CheckResult
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, record_fields, register
from harness.server.metrics import Snapshot


def _phase_columns() -> tuple[str, ...]:
    counters = record_fields(Snapshot)
    deltas = tuple(f"d_{c}" for c in counters)
    totals = tuple(f"cum_{c}" for c in counters)
    return ("phase", "requests", "seconds", *deltas, *totals)


PHASE_TABLE = TableFile(
    "phases.csv",
    _phase_columns(),
    key=("phase",),
    compared=("d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits", "d_ext_queries"),
    display=("phase", "d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits/d_ext_queries"),
)
# A check is a JUnit case by its name, failing with what it expected and saw.
CHECKS = TableFile(
    "checks.csv",
    record_fields(CheckResult),
    junit=JUnitMap(
        "roundtrip.{scenario}",
        "{name}",
        lambda c: None if c.passed else f"expected {c.expected}, observed {c.observed}. {c.detail}",
        stdout="{why}",
    ),
    key=("name",),
    compared=("passed", "observed"),
    passes=("passed",),
    display=("name", "passed", "expected", "observed", "detail"),
)
ROUNDTRIP = register(
    ResultsKind(
        "roundtrip",
        (PHASE_TABLE, CHECKS),
        (
            "requests.jsonl",
            "junit.xml",
            "report.md",
            "phases.png",
            "metrics/<phase>.prom",
            "logs/server.log",
            "logs/baseline-server.log",
            "logs/server-restarted.log",
            "disk-tier/",
        ),
    )
)


class RoundtripWriter:
    """Call with the result after each step; every file is replaced atomically."""

    def __init__(self, run_dir: RunDirectory, plan: RoundtripPlan, chart: bool = True) -> None:
        self.run_dir, self.plan, self.chart = run_dir, plan, chart

    def __call__(self, result: RoundtripResult) -> None:
        from harness.results.markdown import roundtrip_report

        plan, run_dir = self.plan, self.run_dir
        run_dir.update_meta(
            plan=result.describe_plan(),
            startup_seconds=result.startup_seconds,
            engine_kv_groups=result.engine_groups,
            engine_kernels=result.engine_kernels,
            restart_seconds=result.restart_seconds,
            disk_files=result.disk_files.record() if result.disk_files else None,
        )
        rows: list[dict[str, Any]] = [p.record() for p in result.phases]
        if rows:
            PHASE_TABLE.write(run_dir, rows)
        save_requests(result, run_dir.path / "requests.jsonl")
        if not result.checks:
            return
        CHECKS.write(run_dir, [c.record() for c in (*result.checks, *result.info_checks)])
        CHECKS.write_junit(run_dir, "roundtrip", result.checks, scenario=plan.scenario.name)
        run_dir.write_text(
            "report.md", roundtrip_report(result, {"results_dir": str(run_dir.path)})
        )
        if rows and self.chart:
            from harness.results.chart import phases_chart

            phases_chart(
                rows, f"{plan.scenario.name}: {plan.model_ref}", run_dir.path / "phases.png"
            )


def part_writer(path: Path, plan: RoundtripPlan, **meta: Any) -> RoundtripWriter:
    """The files of one round trip inside a larger run (a matrix cell, a fault round):
    the same files and schema as a ``roundtrip`` run, no chart. The caller ends the part's
    ``run.json`` with its verdict (``writer.run_dir.finish``)."""
    path.mkdir(parents=True, exist_ok=True)
    sub = RunDirectory(path, "roundtrip")
    sub.update_meta(plan=plan.describe(), **meta)
    return RoundtripWriter(sub, plan, chart=False)
