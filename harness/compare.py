"""Comparing two result directories with pandas: what changed between two nights.

Which files a command writes, which columns identify a row and which are compared
come from its results kind (``harness.result_kinds``); this module only merges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import BadInput
from harness.result_kinds import TableFile, kind_of

Table = tuple[str, list[dict[str, Any]], list[str]]


def _command(run: Path) -> str:
    path = run / "run.json"
    if not path.is_file():
        raise BadInput(f"{run} is not a results directory (no run.json)")
    return str(json.loads(path.read_text()).get("command"))


def compare_runs(a: Path, b: Path) -> tuple[list[Table], int]:
    """Tables of (title, records, columns), and how many rows changed."""
    cmd_a, cmd_b = _command(a), _command(b)
    if cmd_a != cmd_b:
        raise BadInput(f"cannot compare a {cmd_a} run with a {cmd_b} run")
    kind = kind_of(cmd_a)
    if kind is None:
        raise BadInput(f"{a} is a {cmd_a} run, which has no tables to compare")
    tables: list[Table] = []
    changed = 0
    for spec in kind.tables:
        if not spec.key:
            continue
        records, n = _compare_table(spec, a, b)
        tables.append(
            (f"{spec.title}: {a.name} -> {b.name}", records, [*spec.key, "changed", *spec.compared])
        )
        changed += n
    return tables, changed


def _read(run: Path, spec: TableFile) -> pd.DataFrame:
    frame = spec.read(run)
    if frame is None:
        raise BadInput(f"{run} has no {spec.name} (the run ended before writing it)")
    return frame


def _compare_table(spec: TableFile, a: Path, b: Path) -> tuple[list[dict[str, Any]], int]:
    """Row by row on the table's key: a new vLLM build that changes a verdict, a byte
    count or a check shows as ``old -> new``."""
    key, cols = list(spec.key), list(spec.compared)
    m = _read(a, spec)[key + cols].merge(
        _read(b, spec)[key + cols], on=key, how="outer", suffixes=(" a", " b")
    )
    records, changed = [], 0
    for row in m.fillna("-").to_dict("records"):
        diff = any(str(row[f"{c} a"]) != str(row[f"{c} b"]) for c in cols)
        changed += diff
        rec = {k: row[k] for k in key}
        rec["changed"] = "yes" if diff else ""
        for c in cols:
            va, vb = str(row[f"{c} a"]), str(row[f"{c} b"])
            rec[c] = va if va == vb else f"{va} -> {vb}"
        records.append(rec)
    return records, changed
