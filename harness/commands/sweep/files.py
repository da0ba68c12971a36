"""A sweep's files, rewritten after each cell: ``sweep.csv`` (release x check),
``envs.csv`` (each build), ``junit.xml``, ``transitions.json``, ``report.md`` and the
heatmap; the tables are spelled here and registered with the results registry
(``harness.results.tables.register``). The bug corpus writes the same builds table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import BadInput
from harness.results import ci_summary as ci
from harness.results.chart import sweep_heatmap
from harness.results.markdown import (
    Envs,
    Meta,
    Rows,
    builds_table,
    grid_report_head,
    grid_section,
    mark,
    table,
)
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


def read_cells(run_dir: Path) -> tuple[list[SweepCell], list[dict[str, Any]]]:
    """A sweep run's cells and builds back from its CSV files (``--merge``)."""
    frame = SWEEP_CELLS.read(run_dir)
    if frame is None:
        raise BadInput(f"{run_dir}: no sweep.csv (not a sweep run directory)")
    cells = []
    for rec in frame.to_dict("records"):
        matched = str(rec["matched"]).strip().lower()
        cells.append(
            SweepCell(
                release=str(rec["release"]),
                check=str(rec["check"]),
                kind=str(rec["kind"]),
                scenario=str(rec["scenario"]),
                outcome=str(rec["outcome"]),
                known=str(rec["known"]),
                signature=str(rec["signature"]),
                expected=str(rec["expected"]),
                matched=None if matched == "" else matched in ("true", "1"),
                seconds=float(rec["seconds"] or 0.0),
                vllm_version=str(rec["vllm_version"]),
                detail=str(rec["detail"]),
                failing=str(rec.get("failing", "")),
                why=str(rec["why"]),
                rule=None if str(rec["rule"]) == "" else int(rec["rule"]),
                run_dir=str(rec["run_dir"]),
            )
        )
    envs_frame = SWEEP_ENVS.read(run_dir)
    envs = [] if envs_frame is None else envs_frame.to_dict("records")
    return cells, envs


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """Release x check, cells not as expected listed first, and the transitions."""
    cells, _ = read_cells(run_dir)
    bad = [
        f"- **not as expected**: {c.release} {c.check}: {c.state} ({c.why})"
        for c in cells
        if c.matched is False
    ]
    lines = ci.grid(run_dir, run, cells, bad, "check", "state")
    return [*lines, "", *[f"- {t}" for t in run.get("transitions") or []], ""]


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
        summary=summary_section,
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


def sweep_report(cells: Rows, envs: Envs, transitions: Rows, meta: Meta) -> str:
    bad = [c for c in cells if c.matched is False]
    unjudged = [c for c in cells if c.matched is None]
    verdict = "as expected" if not bad else f"{len(bad)} not as expected"
    counts = f"{len(cells) - len(bad) - len(unjudged)} as expected, {len(bad)} not"
    summary = f"checks: {len({c.check for c in cells})}; cells: {len(cells)} ({counts}, "
    rows = [[c.release, c.check, c.state, c.expected, c.why] for c in bad]
    headers = ["release", "check", "outcome", "expected", "why"]
    lines = grid_report_head(
        f"sweep: {verdict}",
        f"{summary}{len(unjudged)} not run)",
        meta,
        ("Not as expected", headers, rows),
    )
    lines += grid_section("Release x check", "* = not as expected", cells, meta)
    lines += ["## Transitions", ""]
    lines += [f"- {t.text()}" for t in transitions] or ["_no release ran twice_"]
    for text in meta.get("bisect", []):
        lines.append(f"- bisect: {text}")
    lines += ["", "## Builds", "", builds_table(envs), "", "## Cells", ""]
    lines.append(
        table(
            ["release", "check", "outcome", "signature", "expected", "match", "detail"],
            [
                [c.release, c.check, c.state, c.signature, c.expected, mark(c.matched), c.detail]
                for c in cells
            ],
        )
    )
    return "\n".join(lines) + "\n"
