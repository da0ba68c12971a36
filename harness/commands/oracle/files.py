"""An oracle run's files, rewritten as each cell lands: ``oracle.csv`` (every request:
what the model said and the engine did), ``oracle-checks.csv`` and ``junit.xml`` (each
cell's checks), ``sequences/<cell>.json`` (each cell's steps, to replay), ``shrunk.json``
(each failing cell's shortest failing sequence) and ``report.md``.

The command owns its tables: their columns are spelled here and registered with the
results registry (``harness.results.tables.register``) for ``report`` and ``compare``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from harness.commands.oracle.judge import CHECKS, CellResult, Judged
from harness.commands.oracle.plan import Cell, OraclePlan
from harness.results.run_directory import JUnitCase, RunDirectory, junit_xml
from harness.results.tables import ResultsKind, TableFile, register

REQUEST_COLUMNS = (
    "cell",
    "index",
    "request",
    "prompt_tokens",
    "why",
    "hit_expected",
    "hit_observed",
    "loaded_expected",
    "loaded_observed",
    "stored_expected",
    "stored_observed",
    "failing",
)
CHECK_COLUMNS = (
    "cell",
    "check",
    "passed",
    "requests",
    "failed",
    "allowed",
    "first_request",
    "expected",
    "observed",
    "detail",
)
ORACLE_REQUESTS = TableFile(
    "oracle.csv",
    REQUEST_COLUMNS,
    title="requests against the model",
    key=("cell", "index"),
    compared=("hit_observed", "loaded_observed", "stored_observed", "failing"),
    shown=("cell", "index", "prompt_tokens", "hit_expected", "hit_observed", "failing"),
)
ORACLE_CHECKS = TableFile(
    "oracle-checks.csv",
    CHECK_COLUMNS,
    title="checks per cell",
    key=("cell", "check"),
    compared=("passed", "failed"),
    passes=("passed",),
    shown=("cell", "check", "passed", "failed", "first_request", "expected", "observed"),
)
ORACLE = register(
    ResultsKind(
        "oracle",
        (ORACLE_REQUESTS, ORACLE_CHECKS),
        (
            "junit.xml",
            "report.md",
            "shrunk.json",
            "sequences/<cell>.json",
            "drive/",
            "logs/<cell>.log",
        ),
    )
)


def _fig(judged: Judged, what: str) -> tuple[str, str]:
    """``what`` (loaded / stored): the bytes the model expected and the engine counted,
    or per group the blocks where the engine counts no bytes (the drive)."""
    s, o = judged.served, judged.observed
    moves = "loads" if what == "loaded" else "stores"
    counted = getattr(o, f"{what}_bytes")
    if counted is not None:
        return (f"{getattr(s, f'{what}_bytes')}" if s else ""), f"{int(counted)}"

    def per_group(transfers: Any) -> str:
        return " ".join(f"g{g}:{t.blocks}" for g, t in enumerate(transfers) if t.blocks)

    return (per_group(getattr(s, moves)) if s else ""), per_group(getattr(o, moves))


def request_rows(cell: Cell, result: CellResult) -> list[dict[str, Any]]:
    rows = []
    for j in result.requests:
        step = cell.steps[j.index]
        le, lo = _fig(j, "loaded")
        se, so = _fig(j, "stored")
        rows.append(
            {
                "cell": cell.name,
                "index": j.index,
                "request": step.request,
                "prompt_tokens": len(step.tokens),
                "why": step.why,
                "hit_expected": j.served.hit if j.served else "",
                "hit_observed": j.observed.hit if j.observed.hit is not None else "",
                "loaded_expected": le,
                "loaded_observed": lo,
                "stored_expected": se,
                "stored_observed": so,
                "failing": " ".join(j.failing),
            }
        )
    return rows


def check_rows(result: CellResult) -> list[dict[str, Any]]:
    """Per check the cell made: how many requests it judged, failed, the first failure."""
    made: dict[str, list[tuple[Judged, Any]]] = {}
    for j in result.requests:
        for v in j.verdicts:
            made.setdefault(v.check, []).append((j, v))
    rows = []
    for check in CHECKS:
        if check not in made:
            continue
        bad = [(j, v) for j, v in made[check] if not v.passed]
        allowed = check in result.expected_failing
        first = bad[0] if bad else None
        rows.append(
            {
                "cell": result.name,
                "check": check,
                "passed": not bad or allowed,
                "requests": len(made[check]),
                "failed": len(bad),
                "allowed": allowed,
                "first_request": first[0].index if first else "",
                "expected": first[1].expected if first else "",
                "observed": first[1].observed if first else "",
                "detail": first[1].detail if first else "",
            }
        )
    if result.error:
        rows.append(
            {
                "cell": result.name,
                "check": "ran",
                "passed": False,
                "requests": len(result.requests),
                "failed": 0,
                "allowed": False,
                "first_request": "",
                "expected": "the cell's sequence served to its end",
                "observed": result.error,
                "detail": "",
            }
        )
    return rows


def junit_cases(results: Sequence[CellResult]) -> list[JUnitCase]:
    out = []
    for r in results:
        for row in check_rows(r):
            failure = None
            if not row["passed"]:
                failure = (
                    f"{row['failed']} of {row['requests']} requests; first: request "
                    f"{row['first_request']}: expected {row['expected']}, observed "
                    f"{row['observed']} {row['detail']}".strip()
                )
            out.append(
                JUnitCase(
                    classname=f"oracle.{r.name}",
                    name=row["check"],
                    seconds=0.0,
                    failure=failure,
                    error=None,
                    stdout="",
                    properties={"requests": str(row["requests"])},
                )
            )
    return out


def write_oracle(run_dir: RunDirectory, plan: OraclePlan, results: Sequence[CellResult]) -> None:
    by_name = {c.name: c for c in plan.cells}
    rows = [row for r in results for row in request_rows(by_name[r.name], r)]
    ORACLE_REQUESTS.write(run_dir, rows)
    checks = [row for r in results for row in check_rows(r)]
    ORACLE_CHECKS.write(run_dir, checks)
    run_dir.write_text("junit.xml", junit_xml("oracle", junit_cases(results)))
    shrunk = {r.name: r.shrunk for r in results if r.shrunk}
    if shrunk:
        run_dir.write_text("shrunk.json", json.dumps(shrunk, indent=1) + "\n")
    run_dir.write_text("report.md", report(plan, results))
    run_dir.update_meta(
        cells=[
            {
                "cell": r.name,
                "verdict": verdict(r),
                "requests": len(r.requests),
                "failing": sorted(r.failing),
                "seconds": round(r.seconds, 1),
            }
            for r in results
        ]
    )


def write_sequences(run_dir: RunDirectory, plan: OraclePlan) -> None:
    (run_dir.path / "sequences").mkdir(exist_ok=True)
    for cell in plan.cells:
        name = f"sequences/{cell.name.replace('/', '__')}.json"
        run_dir.write_text(name, json.dumps(cell.drive_sequence()) + "\n")


def verdict(r: CellResult) -> str:
    if r.error:
        return f"error: {r.error}"
    if not r.requests:
        return "not run"
    if r.unexpected:
        return "FAILED " + ", ".join(sorted(r.unexpected))
    allowed = r.failing & r.expected_failing
    return "passed" + (f" (allowed to fail: {', '.join(sorted(allowed))})" if allowed else "")


def report(plan: OraclePlan, results: Sequence[CellResult]) -> str:
    """``report.md``: every cell's verdict, each failing check's first failure, the
    shrunk sequences."""
    lines = [
        f"# oracle: {plan.scenario.name}",
        "",
        f"vLLM {plan.env.vllm_version} (variant {plan.variant}), seed {plan.scenario.seed}; "
        "every request held against the harness's model of the offloading scheduler "
        "(docs/oracle.md).",
        "",
        "| cell | requests | verdict | seconds |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| `{r.name}` | {len(r.requests)} | {verdict(r)} | {r.seconds:.1f} |" for r in results
    ]
    bad = [row for r in results for row in check_rows(r) if not row["passed"]]
    if bad:
        lines += ["", "## Failing checks", ""]
        for row in bad:
            lines.append(
                f"- `{row['cell']}` **{row['check']}**: {row['failed']} of {row['requests']} "
                f"requests; first request {row['first_request']}: expected "
                f"{row['expected']}, observed {row['observed']}. {row['detail']}"
            )
    for r in results:
        for s in r.shrunk:
            lines += ["", f"## `{r.name}`: {s['check']} in {len(s['steps'])} steps", ""]
            how = "each candidate replayed on the drive" if s["replayed"] else "by relevance"
            lines.append(f"Shrunk {how} ({s['tries']} tries, {s['seconds']} s):")
            lines.append("")
            for st in s["steps"]:
                if st.get("reset"):
                    lines.append("- reset the tier")
                else:
                    extra = f" ({st['why']})" if st.get("why") else ""
                    lines.append(
                        f"- `{st['request']}`: {st['tokens']} tokens, max_tokens "
                        f"{st['max_tokens']}{extra}"
                    )
    return "\n".join(lines) + "\n"
