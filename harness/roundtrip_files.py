"""A round trip's files in a run directory, rewritten after every phase.

Shared by ``roundtrip`` (one run) and ``matrix`` (one sub-directory per cell), so a
cell's evidence has the same shape, and the same documented schema, as a run's.
"""

from __future__ import annotations

from typing import Any

from harness.results import JUnitCase, RunDirectory, junit_xml
from harness.roundtrip import RoundtripPlan, RoundtripResult, save_requests


class RoundtripWriter:
    """Call with the result after each step; every file is replaced atomically."""

    def __init__(self, run_dir: RunDirectory, plan: RoundtripPlan, chart: bool = True) -> None:
        self.run_dir, self.plan, self.chart = run_dir, plan, chart

    def __call__(self, result: RoundtripResult) -> None:
        from harness.markdown import roundtrip_report

        plan, run_dir = self.plan, self.run_dir
        run_dir.update_meta(
            plan=plan.describe(),
            startup_seconds=result.startup_seconds,
            engine_kv_groups=result.engine_groups,
            engine_kernels=result.engine_kernels,
        )
        rows: list[dict[str, Any]] = [p.record() for p in result.phases]
        if rows:
            run_dir.write_csv("phases.csv", rows, list(rows[0]))
        save_requests(result, run_dir.path / "requests.jsonl")
        if not result.checks:
            return
        allc = [*result.checks, *result.info_checks]
        run_dir.write_csv("checks.csv", [c.record() for c in allc], list(allc[0].record()))
        cases = [
            JUnitCase(
                classname=f"roundtrip.{plan.scenario.name}",
                name=c.name,
                seconds=0.0,
                failure=None
                if c.passed
                else f"expected {c.expected}, observed {c.observed}. {c.detail}",
                stdout=c.why,
            )
            for c in result.checks
        ]
        run_dir.write_text("junit.xml", junit_xml("roundtrip", cases))
        run_dir.write_text(
            "report.md", roundtrip_report(result, {"results_dir": str(run_dir.path)})
        )
        if rows and self.chart:
            from harness.chart import phases_chart

            phases_chart(
                rows, f"{plan.scenario.name}: {plan.model_ref}", run_dir.path / "phases.png"
            )
