"""Comparing two result directories with pandas: what changed between two nights.

Which files a command writes, which columns identify a row, which are compared and
which of those gate (``passes``: true -> false; ``outcomes``: any change) come from its
results kind (``harness.results.tables``); this module only merges. A regression (a check
or row that passed and no longer does, an outcome that changed, a row that vanished)
makes ``offload-check compare`` exit 1, so a nightly can fail on one. Numeric columns
carry their real delta, later minus earlier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import BadInput
from harness.results.run_directory import read_json_object
from harness.results.tables import TableFile
from harness.ui.owned_kinds import kind_of

Table = tuple[str, list[dict[str, Any]], list[str]]
MISSING = "-"


@dataclass
class TableDiff:
    """One table of two runs, row by row on its key."""

    spec: TableFile
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # the JSON form of each row
    regressions: list[str] = field(default_factory=list)  # one line each

    @property
    def changed(self) -> int:
        return sum(1 for r in self.rows if r["changed"])

    def records(self) -> list[dict[str, Any]]:
        """The terminal's rows: ``a -> b`` where a value changed, ``(+delta)`` for numbers."""
        out = []
        for row in self.rows:
            rec: dict[str, Any] = dict(row["key"])
            rec["changed"] = "REGRESSED" if row["regressed"] else ("yes" if row["changed"] else "")
            for c, v in row["columns"].items():
                if v["a"] == v["b"]:
                    rec[c] = _text(v["a"])
                else:
                    delta = f" ({_signed(v['delta'])})" if "delta" in v else ""
                    rec[c] = f"{_text(v['a'])} -> {_text(v['b'])}{delta}"
            out.append(rec)
        return out

    def columns(self) -> list[str]:
        return [*self.spec.key, "changed", *self.spec.compared]

    def record(self) -> dict[str, Any]:
        return {
            "file": self.spec.name,
            "title": self.title,
            "changed": self.changed,
            "regressions": self.regressions,
            "rows": self.rows,
        }


@dataclass
class Comparison:
    a: Path
    b: Path
    command: str
    tables: list[TableDiff]

    @property
    def changed(self) -> int:
        return sum(t.changed for t in self.tables)

    @property
    def regressions(self) -> list[str]:
        return [r for t in self.tables for r in t.regressions]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def record(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "a": str(self.a),
            "b": str(self.b),
            "changed": self.changed,
            "regressions": self.regressions,
            "exit_code": self.exit_code,
            "tables": [t.record() for t in self.tables],
        }


def _text(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _signed(delta: float) -> str:
    text = _text(delta)
    return text if text.startswith("-") else f"+{text}"


def _command(run: Path) -> str:
    path = run / "run.json"
    if not path.is_file():
        raise BadInput(f"{run} is not a results directory (no run.json)")
    meta = read_json_object(path, "a run record", BadInput)
    command = meta.get("command")
    argv = meta.get("argv")
    if not command and isinstance(argv, list) and len(argv) > 1:
        command = argv[1]  # a cut-down record (the replay fixtures) keeps only its argv
    return str(command)


def compare(a: Path, b: Path) -> Comparison:
    """Every keyed table of two runs of one command, merged row by row."""
    cmd_a, cmd_b = _command(a), _command(b)
    if cmd_a != cmd_b:
        raise BadInput(f"cannot compare a {cmd_a} run with a {cmd_b} run")
    kind = kind_of(cmd_a)
    if kind is None:
        raise BadInput(f"{a} is a {cmd_a} run, which has no tables to compare")
    tables = [
        _compare_table(spec, a, b, f"{spec.title}: {a.name} -> {b.name}")
        for spec in kind.tables
        if spec.key
    ]
    return Comparison(a, b, cmd_a, tables)


def compare_runs(a: Path, b: Path) -> tuple[list[Table], int]:
    """Tables of (title, records, columns), and how many rows changed."""
    result = compare(a, b)
    return [(t.title, t.records(), t.columns()) for t in result.tables], result.changed


def _read(run: Path, spec: TableFile) -> pd.DataFrame:
    frame = spec.read(run)
    if frame is None:
        raise BadInput(f"{run} has no {spec.name} (the run ended before writing it)")
    missing = [c for c in (*spec.key, *spec.compared) if c not in frame.columns]
    if missing:
        raise BadInput(f"{run / spec.name} has no column(s) {', '.join(missing)}")
    return frame


def _value(value: Any) -> Any:
    """A cell as JSON: numbers stay numbers, a missing row's cell is None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _passing(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "yes", "pass", "passed", "ok", "1")


def _compare_table(spec: TableFile, a: Path, b: Path, title: str) -> TableDiff:
    """Row by row on the table's key: a new vLLM build that changes a verdict, a byte
    count or a check shows as ``old -> new``; counters with their delta."""
    key, cols = list(spec.key), list(spec.compared)
    m = _read(a, spec)[key + cols].merge(
        _read(b, spec)[key + cols], on=key, how="outer", suffixes=(" a", " b"), indicator=True
    )
    diff = TableDiff(spec, title)
    for row in m.astype(object).to_dict("records"):
        keys = {k: _value(row[k]) for k in key}
        name = " / ".join(_text(v) for v in keys.values())
        only_a, only_b = row["_merge"] == "left_only", row["_merge"] == "right_only"
        columns: dict[str, dict[str, Any]] = {}
        changed = False
        regressed: list[str] = []
        for c in cols:
            va = None if only_b else _value(row[f"{c} a"])
            vb = None if only_a else _value(row[f"{c} b"])
            entry: dict[str, Any] = {"a": va, "b": vb}
            na, nb = _number(va), _number(vb)
            if na is not None and nb is not None:
                entry["delta"] = nb - na
            columns[c] = entry
            if _text(va) == _text(vb):
                continue
            changed = True
            if only_a or only_b:
                continue
            failed = c in spec.passes and _passing(va) and not _passing(vb)
            if failed or c in spec.outcomes:
                regressed.append(f"{c} {_text(va)} -> {_text(vb)}")
        passed_before = any(_passing(row[f"{c} a"]) for c in spec.passes)
        if only_a and (passed_before or spec.outcomes):
            regressed.append("gone from the later run")
        diff.rows.append(
            {
                "key": keys,
                "changed": changed,
                "regressed": bool(regressed),
                "only_in": "a" if only_a else ("b" if only_b else None),
                "columns": columns,
            }
        )
        if regressed:
            diff.regressions.append(f"{spec.title} {name}: {'; '.join(regressed)}")
    return diff
