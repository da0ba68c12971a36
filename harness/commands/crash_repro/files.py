"""A crash-repro run's files: ``outcomes.csv`` (a row per model x variant x connector)
and ``junit.xml``; the table is spelled here and registered with the results registry
(``harness.results.tables.register``) for ``report``, ``compare`` and the CI summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
CRASH_REPRO = register(
    ResultsKind(
        "crash-repro", (OUTCOMES,), ("junit.xml", "logs/<model>__<variant>__connector-<on|off>.log")
    )
)


def write_crash_repro(run_dir: RunDirectory, rows: Sequence[Any]) -> None:
    OUTCOMES.write(run_dir, [r.record() for r in rows])
    OUTCOMES.write_junit(run_dir, "crash-repro", rows)
