"""Comparing two result directories with pandas: what changed between two nights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import BadInput


def _command(run: Path) -> str:
    path = run / "run.json"
    if not path.is_file():
        raise BadInput(f"{run} is not a results directory (no run.json)")
    return str(json.loads(path.read_text()).get("command"))


def compare_runs(a: Path, b: Path) -> tuple[list[tuple[str, list[dict[str, Any]], list[str]]], int]:
    """Tables of (title, records, columns), and how many rows changed."""
    cmd_a, cmd_b = _command(a), _command(b)
    if cmd_a != cmd_b:
        raise BadInput(f"cannot compare a {cmd_a} run with a {cmd_b} run")
    if cmd_a == "roundtrip":
        return _compare_roundtrip(a, b)
    if cmd_a == "matrix":
        return _compare_matrix(a, b)
    return _compare_crash_repro(a, b)


def _read(run: Path, name: str) -> pd.DataFrame:
    path = run / name
    if not path.is_file():
        raise BadInput(f"{run} has no {name} (the run ended before writing it)")
    return pd.read_csv(path, keep_default_na=False)


def _diff_records(
    m: pd.DataFrame, key: list[str], cols: list[str]
) -> tuple[list[dict[str, Any]], int]:
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


Table = tuple[str, list[dict[str, Any]], list[str]]


def _compare_roundtrip(a: Path, b: Path) -> tuple[list[Table], int]:
    cols = ["d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits", "d_ext_queries"]
    m = _read(a, "phases.csv")[["phase", *cols]].merge(
        _read(b, "phases.csv")[["phase", *cols]], on="phase", how="outer", suffixes=(" a", " b")
    )
    phases, n1 = _diff_records(m, ["phase"], cols)
    ccols = ["passed", "observed"]
    m = _read(a, "checks.csv")[["name", *ccols]].merge(
        _read(b, "checks.csv")[["name", *ccols]], on="name", how="outer", suffixes=(" a", " b")
    )
    checks, n2 = _diff_records(m, ["name"], ccols)
    title = f"{a.name} -> {b.name}"
    return (
        [
            (f"phases: {title}", phases, ["phase", "changed", *cols]),
            (f"checks: {title}", checks, ["name", "changed", *ccols]),
        ],
        n1 + n2,
    )


def _compare_crash_repro(a: Path, b: Path) -> tuple[list[Table], int]:
    key = ["model", "variant", "connector"]
    cols = ["vllm_version", "outcome", "signature", "matched"]
    m = _read(a, "outcomes.csv")[key + cols].merge(
        _read(b, "outcomes.csv")[key + cols], on=key, how="outer", suffixes=(" a", " b")
    )
    records, changed = _diff_records(m, key, cols)
    return [(f"crash-repro: {a.name} -> {b.name}", records, [*key, "changed", *cols])], changed


def _compare_matrix(a: Path, b: Path) -> tuple[list[Table], int]:
    """Cell by cell: a new vLLM build that changes a spec class, a verdict or a check."""
    key = ["family", "geometry", "variant"]
    cols = ["vllm_version", "spec_classes", "startup", "roundtrip", "failed_checks", "matched"]
    m = _read(a, "matrix.csv")[key + cols].merge(
        _read(b, "matrix.csv")[key + cols], on=key, how="outer", suffixes=(" a", " b")
    )
    records, changed = _diff_records(m, key, cols)
    return [(f"matrix: {a.name} -> {b.name}", records, [*key, "changed", *cols])], changed
