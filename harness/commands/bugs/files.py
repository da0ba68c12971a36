"""The tables a bug-corpus run writes, spelled here and registered with the results
registry (``harness.results.tables.register``): ``bugs.csv`` (a cell per entry and build)
beside the sweep's builds table, a scripted trigger's ``steps.csv`` (``bug-steps``) and a
scheduler-level trigger's drive files (``bug-scheduler``); ``report.md`` is
``commands/bugs/report.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.commands.roundtrip.files import CHECKS
from harness.commands.sweep.files import SWEEP_ENVS
from harness.errors import BadInput
from harness.results import ci_summary as ci
from harness.results.records import BugCell, StepRecord
from harness.results.tables import JUnitMap, ResultsKind, TableFile, record_fields, register

# One cell per corpus entry and build, and a scripted trigger's steps (``bug-steps``).
BUG_CELLS = TableFile(
    "bugs.csv",
    record_fields(BugCell),
    key=("bug", "release"),
    compared=("vllm_version", "outcome", "matched"),
    passes=("matched",),
    outcomes=("outcome",),
    shown=("bug", "release", "outcome", "expected", "matched", "signature"),
    display=("bug", "release", "outcome", "expected", "match", "signature"),
    junit=JUnitMap(
        "bugs.{bug}",
        "{release}",
        lambda c: (
            f"expected {c.expected}, got {c.outcome}: {c.why}" if c.matched is False else None
        ),
        stdout="outcome={outcome} ({observed}) {signature}\n{detail}\n{why}",
        properties=("vllm_version", "outcome", "expected", "check"),
        seconds="seconds",
    ),
)
BUG_STEPS = TableFile(
    "steps.csv",
    record_fields(StepRecord),
    key=("index",),
    compared=("http_status", "counters"),
    outcomes=("http_status",),
    shown=("index", "do", "name", "detail", "counters"),
)
BUG_SCRIPT = register(
    ResultsKind("bug-steps", (BUG_STEPS, CHECKS), ("requests.jsonl", "metrics/", "logs/server.log"))
)
BUG_SCHEDULER = register(
    ResultsKind("bug-scheduler", (), ("drive.json", "drive.stdout", "drive.stderr"))
)


def read_cells(run_dir: Path) -> list[BugCell]:
    """A corpus run's cells back from ``bugs.csv`` (the CI summary, ``report``)."""
    frame = BUG_CELLS.read(run_dir)
    if frame is None:
        raise BadInput(f"{run_dir}: no bugs.csv (not a bugs run directory)")
    cells = []
    for rec in frame.astype(str).to_dict("records"):
        matched = rec["matched"].strip().lower()
        rec["matched"] = None if matched == "" else matched in ("true", "1")
        rec["seconds"] = float(rec["seconds"] or 0.0)
        cells.append(BugCell(**rec))
    return cells


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """Bug x release, unmatched cells listed first."""
    cells = read_cells(run_dir)
    bad = [
        f"- **unmatched**: {c.bug} on {c.release}: {c.outcome} ({c.why})"
        for c in cells
        if c.matched is False
    ]
    return [*ci.grid(run_dir, run, cells, bad, "bug", "outcome"), ""]


BUGS = register(
    ResultsKind(
        "bugs",
        (BUG_CELLS, SWEEP_ENVS),
        ("junit.xml", "report.md", "releases/<build>/<scenario or bug>/"),
        summary=summary_section,
    )
)
