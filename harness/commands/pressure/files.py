"""A pressure run's files, rewritten after every request: ``pressure.csv`` (each request
against the oracle), ``pressure-checks.csv`` and ``junit.xml`` (each server's checks),
``requests.jsonl`` (every completion whole) and ``report.md``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from harness.commands.pressure.plan import PressurePlan
from harness.commands.pressure.run import ServerResult
from harness.results.markdown import pressure_report
from harness.results.run_directory import RunDirectory
from harness.results.tables import PRESSURE_CHECKS, PRESSURE_REQUESTS


def server_verdict(result: ServerResult) -> str:
    """A round's verdict in words: as expected (the clean round passed, a mutant's or a
    fault's round failed exactly its checks), or how it was not."""
    if result.error:
        return f"error: {result.error}"
    if not result.checks:
        return f"running: {len(result.rows)} of {len(result.plan.requests)} requests"
    if result.matched:
        return "as expected" if result.plan.round == "clean" else "caught by exactly its checks"
    if result.plan.round == "clean":
        return "NOT as expected"
    must = ", ".join(sorted(result.plan.must_fail))
    got = ", ".join(sorted(result.failing)) or "nothing"
    return f"NOT as expected: must fail {must}, failed {got}"


def write_pressure(
    run_dir: RunDirectory, plan: PressurePlan, results: Sequence[ServerResult]
) -> None:
    rows = [r for res in results for r in res.rows]
    checks = [c for res in results for c in res.checks]
    PRESSURE_REQUESTS.write(run_dir, [r.record() for r in rows])
    if checks:
        PRESSURE_CHECKS.write(run_dir, [c.record() for c in checks])
        PRESSURE_CHECKS.write_junit(run_dir, "pressure", checks)
    lines = []
    for res in results:
        for comp in res.completions:
            lines.append(json.dumps({"server": res.plan.name, "round": res.plan.round,
                                     **comp.record()}))  # fmt: skip
    run_dir.write_text("requests.jsonl", "\n".join(lines) + ("\n" if lines else ""))
    t = plan.tier
    servers: list[dict[str, Any]] = [
        {**res.plan.describe(), "verdict": server_verdict(res)} for res in results
    ]
    meta = {
        "model": str(plan.geometry_path),
        "variant": plan.variant,
        "vllm_version": plan.env.vllm_version,
        "slots": t.slots,
        "slot_bytes": t.slot_bytes,
        "chunk_tokens": t.chunk_tokens,
        "results_dir": str(run_dir.path),
    }
    run_dir.write_text("report.md", pressure_report(servers, checks, rows, meta))
    run_dir.update_meta(
        servers=[{"name": s["name"], "round": s["round"], "verdict": s["verdict"]} for s in servers]
    )
