"""A matrix run's files: ``matrix.csv`` (a row per family x geometry x variant x tier,
mismatches first), ``junit.xml`` and ``report.md``; the table is spelled here and
registered with the results registry (``harness.results.tables.register``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.results import ci_summary as ci
from harness.results.markdown import table
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, register

MATRIX_CELLS = TableFile(
    "matrix.csv",
    (
        "family",
        "geometry",
        "variant",
        "tier",
        "vllm_version",
        "spec_classes",
        "kernels",
        "startup",
        "startup_seconds",
        "signature",
        "message",
        "known_issue",
        "roundtrip",
        "failed_checks",
        "expected",
        "observed",
        "expected_issue",
        "matched",
        "why",
        "seconds",
        "cell_dir",
    ),
    title="KV-cache spec family matrix",
    key=("family", "geometry", "variant", "tier"),
    added={"tier": "roomy"},
    compared=("vllm_version", "spec_classes", "startup", "roundtrip", "failed_checks", "matched"),
    passes=("matched",),
    outcomes=("startup", "roundtrip"),
    junit=JUnitMap(
        "matrix.{family}",
        "{geometry} / {variant} / {tier}",
        lambda c: (
            None
            if c.matched or c.roundtrip == "error"
            else f"expected {c.expected_text()}, observed {c.observed_text()}: {c.why}"
        ),
        properties=("spec_classes", "vllm_version", "startup", "roundtrip"),
        seconds="seconds",
        error=lambda c: c.why if c.roundtrip == "error" and not c.matched else None,
    ),
    shown=(
        "family",
        "geometry",
        "variant",
        "tier",
        "vllm_version",
        "spec_classes",
        "startup",
        "roundtrip",
        "failed_checks",
        "expected",
        "matched",
        "why",
    ),
    display=(
        "family",
        "model",
        "variant",
        "CPU tier",
        "vLLM",
        "engine KV specs",
        "startup",
        "round trip",
        "expected",
        "match",
    ),
)


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The CI summary's section: every cell, mismatches first."""
    frame, problem = ci.read_csv(run_dir / MATRIX_CELLS.name)
    passed = None
    if frame is not None and len(frame) and "matched" in frame.columns:
        passed = all(ci.truthy(v) for v in frame["matched"])
    extra = f"{run.get('cells_matched', '?')}/{len(run.get('cells') or [])} cells as expected"
    lines = ci.headline(run_dir, run, ci.verdict(run, passed), extra)
    if problem:
        return [*lines, problem, ""]
    assert frame is not None
    rows = []
    for _, row in frame.iterrows():  # matrix.csv lists mismatches first
        start = ci.col(row, "startup") + (
            f": {ci.col(row, 'signature')}" if ci.col(row, "signature") else ""
        )
        rt = ci.col(row, "roundtrip")
        if rt == "fail":
            rt = "FAIL " + ci.col(row, "failed_checks")
        matched = ci.truthy(ci.col(row, "matched"))
        rows.append(
            [
                ci.col(row, "family"),
                ci.col(row, "geometry"),
                ci.col(row, "variant"),
                ci.col(row, "tier") or "roomy",
                ci.col(row, "vllm_version"),
                ci.col(row, "spec_classes"),
                start,
                rt,
                ci.col(row, "expected"),
                "yes" if matched else f"**NO**: {ci.col(row, 'why')}",
            ]
        )
    return [*lines, *ci.table(MATRIX_CELLS.display, rows), ""]


MATRIX = register(
    ResultsKind(
        "matrix",
        (MATRIX_CELLS,),
        ("junit.xml", "report.md", "cells/<family>__<geometry>__<variant>__<tier>/"),
        summary=summary_section,
    )
)


def write_matrix(run_dir: RunDirectory, cells: Sequence[Any]) -> None:
    MATRIX_CELLS.write(run_dir, [c.record() for c in cells])
    MATRIX_CELLS.write_junit(run_dir, "matrix", cells)
    run_dir.write_text("report.md", matrix_report(cells, {"results_dir": str(run_dir.path)}))


def matrix_report(cells: Sequence[Any], meta: dict[str, Any]) -> str:
    """``report.md`` of a matrix run: the table first (mismatches on top), then details."""
    bad = [c for c in cells if c.matched is False]
    verdict = "every cell as expected" if not bad else f"{len(bad)} cell(s) NOT as expected"
    lines = [
        f"# offload-check matrix: {verdict}",
        "",
        f"- results: `{meta.get('results_dir', '')}`",
        "",
    ]
    rows = []
    for c in cells:
        start = c.startup + (f": {c.signature}" if c.signature else "")
        rt = {
            "pass": "pass",
            "fail": "**FAIL** " + ", ".join(c.failed_checks),
            "error": f"error: {c.why}",
        }.get(c.roundtrip, "-")
        rows.append(
            [
                *c.identity(),
                start,
                rt,
                c.expected_text(),
                "yes" if c.matched else f"**NO**: {c.why}",
            ]
        )
    lines.append(table(MATRIX_CELLS.display, rows))
    details = [c for c in cells if c.message or any(not k.passed for k in c.checks)]
    if details:
        lines += ["", "## Details", ""]
    for c in details:
        lines.append(f"### {c.key}")
        if c.message:
            lines += ["", f"Crash: `{c.signature}`", "", f"> {c.message}"]
        for k in c.checks:
            if not k.passed:
                lines += [
                    "",
                    f"- `{k.name}`: expected {k.expected}, observed {k.observed}. {k.detail}",
                ]
        lines += ["", f"Cell results: `{c.cell_dir}`", ""]
    return "\n".join(lines) + "\n"
