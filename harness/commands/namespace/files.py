"""A namespace run's files, rewritten as each row lands: ``namespace.csv`` (a row per
build and change: what the restarted server hit and how its answers compared),
``junit.xml`` and ``report.md`` (the matrix: changes down, builds across).

The command owns its table: its columns are spelled here and registered with the
results registry (``harness.results.tables.register``) for ``report`` and ``compare``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from harness.commands.namespace.changes import BY_NAME
from harness.commands.namespace.judge import KEPT, Row
from harness.commands.namespace.plan import NamespacePlan
from harness.results.markdown import table
from harness.results.run_directory import JUnitCase, RunDirectory, junit_xml
from harness.results.tables import ResultsKind, TableFile, register

COLUMNS = (
    "build",
    "vllm_version",
    "change",
    "outcome",
    "passed",
    "known",
    "hit_tokens",
    "expected_hit_tokens",
    "loaded_bytes",
    "disk_hits",
    "answers",
    "tolerance",
    "seconds",
    "detail",
)
NAMESPACE_ROWS = TableFile(
    "namespace.csv",
    COLUMNS,
    title="restarts with one change",
    key=("build", "change"),
    compared=("outcome", "passed", "hit_tokens"),
    passes=("passed",),
    shown=("build", "change", "outcome", "known", "hit_tokens", "answers"),
)
NAMESPACE = register(
    ResultsKind(
        "namespace",
        (NAMESPACE_ROWS,),
        ("junit.xml", "report.md", "diffs.json", "<build>/logs/<server>.log"),
    )
)


def cell(row: Row) -> str:
    """A row in a word or two: the outcome, a known bug's number, KEPT or not."""
    mark = {True: "", False: " **FAIL**", None: ""}[row.passed]
    known = f" ({row.known})" if row.known else ""
    return f"{row.outcome}{known}{mark}"


def report(plan: NamespacePlan, rows: Sequence[Row]) -> str:
    builds = [b.label for b in plan.builds]
    versions = [b.vllm_version for b in plan.builds]
    heads = versions if len(set(versions)) == len(versions) else builds
    by = {(r.build, r.change): r for r in rows}
    lines = [
        f"# namespace: {plan.scenario.name}",
        "",
        "A disk tier written by one server, read by a restarted one with exactly one "
        "change (docs/namespace.md). A restarted server must hit nothing, or answer as its "
        "own clean cache (the same prompts under a cache salt); the unchanged restart must "
        f"hit every target chunk. Outcomes that keep the rule: {', '.join(KEPT)}.",
        "",
    ]
    grid = [
        [
            f"`{c.name}`",
            c.what,
            *(cell(by[(b, c.name)]) if (b, c.name) in by else "" for b in builds),
        ]
        for c in plan.changes
    ]
    lines += [table(["change", "what differs", *heads], grid), ""]
    bad = [r for r in rows if r.passed is False]
    if bad:
        lines += ["## Broken", ""]
        for r in bad:
            where = BY_NAME[r.change].namespace_field if r.change in BY_NAME else ""
            hits = (
                f", {r.hit_tokens} hit tokens of {r.expected_hit_tokens}"
                if r.hit_tokens is not None
                else ""
            )
            lines.append(
                f"- {r.build} (vLLM {r.vllm_version}) `{r.change}`: {r.outcome}{hits}; "
                f"answers: {r.answers or '-'}"
                + (f"; {r.detail}" if r.detail else "")
                + (f"; the namespace's field for it: {where}" if where else "")
            )
        lines.append("")
    skipped = [r for r in rows if r.passed is None]
    if skipped:
        lines += ["## Not runnable here", ""]
        lines += [f"- {r.build} `{r.change}`: {r.detail}" for r in skipped]
        lines.append("")
    return "\n".join(lines)


def write_namespace(run_dir: RunDirectory, plan: NamespacePlan, rows: Sequence[Row]) -> None:
    NAMESPACE_ROWS.write(run_dir, [{c: r.record()[c] for c in COLUMNS} for r in rows])
    cases = [
        JUnitCase(
            f"namespace.{r.build}", r.change, r.seconds,
            failure=None if r.passed is not False else f"{r.outcome}: {r.answers or r.detail}",
            error=None,
        )
        for r in rows if r.passed is not None
    ]  # fmt: skip
    run_dir.write_text("junit.xml", junit_xml("namespace", cases))
    diffs = {f"{r.build}/{r.change}": r.diffs for r in rows if r.diffs}
    run_dir.write_text("diffs.json", json.dumps(diffs, indent=1, default=str) + "\n")
    run_dir.write_text("report.md", report(plan, rows))
    run_dir.update_meta(
        rows=[{"build": r.build, "change": r.change, "outcome": r.outcome, "passed": r.passed}
              for r in rows]
    )  # fmt: skip
