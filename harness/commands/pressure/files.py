"""A pressure run's files, rewritten after every request: ``pressure.csv`` (each request
against the oracle), ``pressure-checks.csv`` and ``junit.xml`` (each server's checks),
``requests.jsonl`` (every completion whole) and ``report.md``. The tables are spelled
here and registered with the results registry (``harness.results.tables.register``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from harness.commands.pressure.plan import PressurePlan
from harness.commands.pressure.run import ServerResult
from harness.results.markdown import table
from harness.results.records import PressureRequest
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, record_fields, register

PRESSURE_REQUESTS = TableFile(
    "pressure.csv",
    record_fields(PressureRequest),
    title="requests against the oracle",
    key=("server", "round", "index"),
    compared=("ext_hits", "stored_bytes", "loaded_bytes", "failing"),
    shown=("server", "round", "index", "request", "hit_expected", "ext_hits", "stored_bytes",
           "loaded_bytes", "evicted_expected", "failing"),
    display=("server", "round", "#", "request", "hit (oracle)", "hit", "stored B",
             "loaded B", "oracle evicts", "failed"),
)  # fmt: skip
PRESSURE_CHECKS = TableFile(
    "pressure-checks.csv",
    (
        "server",
        "round",
        "check",
        "passed",
        "expected",
        "observed",
        "why",
        "detail",
        "known",
        "matched",
    ),
    title="checks",
    key=("server", "round", "check"),
    compared=("passed", "matched"),
    passes=("matched",),
    shown=("server", "round", "check", "passed", "matched", "known", "detail"),
    display=("server", "round", "check", "passed", "as expected", "known bug", "where"),
    junit=JUnitMap(
        "pressure.{server}.{round}",
        "{check}",
        lambda r: (
            None
            if r.matched
            else (
                "passed, but this round's mutant or fault must fail it"
                if r.passed
                else f"expected {r.expected}; observed {r.observed}. {r.detail}"
            )
        ),
        properties=("known",),
    ),
)
PRESSURE = register(
    ResultsKind(
        "pressure",
        (PRESSURE_REQUESTS, PRESSURE_CHECKS),
        ("requests.jsonl", "junit.xml", "report.md", "logs/<server>.log"),
    )
)


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


def pressure_report(
    servers: Sequence[Any], checks: Sequence[Any], requests: Sequence[Any], meta: dict[str, Any]
) -> str:
    """``report.md`` of a pressure run: each server's settings and verdict, the checks
    not as expected first, then every request beside the oracle's figures."""
    bad = [c for c in checks if not c.matched]
    verdict = "every round as expected" if not bad else f"{len(bad)} checks NOT as expected"
    lines = [
        f"# offload-check pressure: {verdict}",
        "",
        f"- model `{meta.get('model', '')}`, variant `{meta.get('variant', '')}` "
        f"(vLLM {meta.get('vllm_version', '')})",
        f"- tier: {meta.get('slots', '')} slots of {meta.get('slot_bytes', '')} B, "
        f"chunk {meta.get('chunk_tokens', '')} tokens",
        f"- results: `{meta.get('results_dir', '')}`",
        "",
        table(
            ("server", "round", "policy", "store_threshold", "deviations", "must fail", "verdict"),
            [
                [
                    s["name"],
                    s["round"],
                    s["policy"],
                    s["store_threshold"],
                    ", ".join(s["deviations"]) or "-",
                    ", ".join(s["must_fail"]) or "-",
                    s["verdict"],
                ]
                for s in servers
            ],
        ),
        "",
    ]
    if bad:
        lines += ["## Not as expected", ""]
        lines.append(
            table(
                ("server", "round", "check", "passed", "expected", "observed", "where"),
                [
                    [c.server, c.round, c.check, c.passed, c.expected, c.observed, c.detail]
                    for c in bad
                ],
            )
        )
        lines.append("")
    lines += ["## Requests", ""]
    lines.append(
        table(
            PRESSURE_REQUESTS.display,
            [[getattr(r, k) for k in PRESSURE_REQUESTS.shown] for r in requests],
        )
    )
    return "\n".join(lines) + "\n"
