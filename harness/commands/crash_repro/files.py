"""A crash-repro run's files: ``outcomes.csv`` (a row per model x variant x connector)
and ``junit.xml``; the table is spelled here and registered with the results registry
(``harness.results.tables.register``) for ``report``, ``compare`` and the CI summary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.results import ci_summary as ci
from harness.results.ci_summary import Row
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, register

OUTCOMES = TableFile(
    "outcomes.csv",
    (
        "model",
        "variant",
        "vllm_version",
        "patch",
        "patch_status",
        "connector",
        "chunked_local",
        "outcome",
        "seconds",
        "launch",
        "signature",
        "exception",
        "frame",
        "message",
        "known_issue",
        "answered",
        "answer",
        "returncode",
        "kernels",
        "expected",
        "expected_known",
        "matched",
        "why",
        "log",
        "command",
    ),
    title="crash-repro",
    key=("model", "variant", "connector"),
    compared=("vllm_version", "outcome", "signature", "matched"),
    passes=("matched",),
    outcomes=("outcome",),
    junit=JUnitMap(
        "crash-repro.{model}",
        "{variant} connector={connector}",
        lambda r: None if r.matched else (r.why or "mismatch"),
        stdout="outcome={outcome} {signature}\nlog={log}",
        properties=("outcome", "expected", "vllm_version"),
        seconds="seconds",
    ),
    shown=(
        "model",
        "variant",
        "vllm_version",
        "patch",
        "connector",
        "outcome",
        "signature",
        "seconds",
        "expected",
        "matched",
    ),
    display=(
        "model",
        "variant",
        "vllm_version",
        "connector",
        "outcome",
        "signature",
        "expected",
        "matched",
    ),
)


def _signature(row: Row) -> str:
    """The crash signature, or for a server that started whether it answered."""
    if ci.col(row, "signature"):
        return ci.col(row, "signature")
    answered = ci.truthy(ci.col(row, "answered"))
    if answered:
        return "answered"
    if answered is False:
        return "no answer: " + ci.col(row, "answer").strip()
    return ""


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The CI summary's section: the rows, those not as expected with why and their log."""
    frame, problem = ci.read_csv(run_dir / OUTCOMES.name)
    summary = run.get("summary") if isinstance(run.get("summary"), dict) else {}
    extra = ""
    if summary:
        extra = (
            f"{summary.get('done', '?')}/{summary.get('rows', '?')} rows done, "
            f"{summary.get('matched', '?')} as expected, "
            f"{summary.get('mismatched', '?')} not"
        )
    passed = None
    if frame is not None and len(frame) and "matched" in frame.columns:
        passed = all(ci.truthy(v) for v in frame["matched"])
    lines = ci.headline(run_dir, run, ci.verdict(run, passed), extra)
    if problem:
        return [*lines, problem, ""]
    assert frame is not None
    if not len(frame):
        return [*lines, "_`outcomes.csv` has no rows yet._", ""]
    rows = []
    for _, row in frame.iterrows():
        expected = ci.col(row, "expected")
        known = ci.num(ci.col(row, "expected_known"), "")
        if expected and known:
            # known_label's spelling, inline: the summary imports no verdict logic.
            expected += f" (#{known})" if known.isdigit() else f" ({known})"
        matched = ci.truthy(ci.col(row, "matched"))
        rows.append(
            [
                ci.col(row, "model"),
                ci.col(row, "variant"),
                ci.col(row, "vllm_version"),
                ci.col(row, "connector"),
                ci.col(row, "outcome"),
                _signature(row),
                expected,
                "yes" if matched else ("**NO**" if matched is False else ""),
            ]
        )
    lines += ci.table(OUTCOMES.display, rows)
    why = [
        (ci.col(r, "variant"), ci.col(r, "connector"), ci.col(r, "why"), ci.col(r, "log"))
        for _, r in frame.iterrows()
        if ci.truthy(ci.col(r, "matched")) is False
    ]
    if why:
        lines += ["", "Not as expected:", ""]
        lines += [
            f"- {v} connector={c}: {ci.cell(w) or 'see the log'} (log: `{log}`)"
            for v, c, w, log in why
        ]
    return [*lines, ""]


CRASH_REPRO = register(
    ResultsKind(
        "crash-repro",
        (OUTCOMES,),
        ("junit.xml", "logs/<model>__<variant>__connector-<on|off>.log"),
        summary=summary_section,
    )
)


def write_crash_repro(run_dir: RunDirectory, rows: Sequence[Any]) -> None:
    OUTCOMES.write(run_dir, [r.record() for r in rows])
    OUTCOMES.write_junit(run_dir, "crash-repro", rows)
