"""The pieces every command's section of the CI summary is made of
(``python -m harness.ui.summary``): markdown cells and tables, a table file read as
strings or why it could not be, a run's ``run.json`` and its headline verdict.

A command's section lives with the command (its ``ResultsKind.summary``, in
``commands/<command>/files.py``) and is made of these; a run whose kind has none gets
``other`` (its headline and its files). Nothing here raises on a run cut short: a missing
or unreadable file becomes a line saying so.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from harness.results.markdown import sweep_grid
from harness.results.tables import TableFile

if TYPE_CHECKING:
    import pandas as pd

    Frame: TypeAlias = pd.DataFrame
    Row: TypeAlias = pd.Series
else:  # the commands' sections use pandas' frames without importing pandas
    Frame = Row = Any

MAX_CELL = 300  # characters; a CI page is for reading, the files hold everything


def cell(value: Any) -> str:
    text = "" if value is None else str(value)
    text = " ".join(text.split())  # newlines and runs of spaces would break the row
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 3] + "..."
    return text.replace("|", "\\|")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out


def truthy(value: Any) -> bool | None:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    return None


def num(value: Any, sep: str = ",") -> str:
    """``1310720.0`` -> ``1,310,720`` (bytes); ``num(1700.0, "")`` -> ``1700`` (tokens).

    Anything that is not a number is shown as it is."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    if number != number:  # NaN
        return ""
    if number.is_integer():
        return f"{int(number):,}".replace(",", sep)
    return f"{number:,.3f}".replace(",", sep)


def read_csv(path: Path) -> tuple[Frame | None, str | None]:
    """The CSV as strings (no type guessing), or why it could not be read."""
    import pandas as pd

    if not path.is_file():
        return None, f"_`{path.name}` is missing: the run did not get that far._"
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return None, f"_`{path.name}` is empty: the run did not get that far._"
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        return None, f"_`{path.name}` could not be read: {cell(exc)}_"
    return frame, None


def col(row: Row, name: str) -> str:
    return str(row[name]) if name in row.index else ""


def load_run(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads((run_dir / "run.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"`run.json` could not be read: {cell(exc)}"
    if not isinstance(data, dict):
        return None, "`run.json` is not a JSON object"
    return data, None


def verdict(run: dict[str, Any], passed: bool | None) -> str:
    """Headline word from the run's own status and exit code (``results/README.md``)."""
    status = run.get("status")
    code = run.get("exit_code")
    if status == "running":
        return "INCOMPLETE (still `running` in run.json: the harness was killed or is live)"
    if status == "interrupted":
        return "INTERRUPTED"
    if status == "error":
        return f"ERROR (the harness could not finish, exit {code})"
    if status != "finished":
        return f"UNKNOWN (status {status!r})"
    if passed is None:
        passed = code == 0
    if passed and code in (0, None):
        return "PASS"
    if code == 2:
        return "BAD INPUT (exit 2)"
    return f"FAIL (exit {code})"


def headline(run_dir: Path, run: dict[str, Any], verdict: str, extra: str = "") -> list[str]:
    command = run.get("command") or "run"
    lines = [f"## {command} `{run_dir.name}`: **{verdict}**", ""]
    facts = []
    raw_scenario = run.get("scenario")
    scenario = raw_scenario if isinstance(raw_scenario, dict) else {}
    if scenario.get("name"):
        facts.append(f"scenario `{scenario['name']}`")
    if isinstance(run.get("argv"), list):
        facts.append("`" + " ".join(str(a) for a in run["argv"]) + "`")
    if isinstance(run.get("wall_seconds"), (int, float)):
        facts.append(f"{run['wall_seconds']:.0f} s")
    if run.get("gpus"):
        facts.append("GPUs: " + ", ".join(str(g) for g in run["gpus"]))
    if extra:
        facts.append(extra)
    if facts:
        lines += ["- " + "; ".join(facts), ""]
    return lines


def rows_or_note(
    frame: Frame | None,
    problem: str | None,
    spec: TableFile,
    render: Callable[[Row], list[str]],
) -> list[str]:
    """A table file as markdown, or why it cannot be shown (a run cut short has none)."""
    if problem:
        return [problem]
    if frame is None:
        return []
    if not len(frame):
        return [f"_`{spec.name}` has no rows yet._"]
    return table(spec.display, [render(r) for _, r in frame.iterrows()])


def other(run_dir: Path, run: dict[str, Any]) -> list[str]:
    lines = headline(run_dir, run, verdict(run, None))
    files = sorted(p.name for p in run_dir.iterdir() if p.name != "run.json")
    return [*lines, "Files: " + (", ".join(f"`{f}`" for f in files) or "none"), ""]


def grid(
    run_dir: Path, run: dict[str, Any], cells: list[Any], bad: list[str], row_of: str, text_of: str
) -> list[str]:
    """A sweep-shaped run: headline, the cells that went wrong, the build grid."""
    lines = headline(run_dir, run, verdict(run, not bad), f"{len(cells)} cells")
    lines += [*bad, ""] if bad else []
    builds = [str(b.get("label")) for b in run.get("builds") or [] if isinstance(b, dict)]
    order = builds or list(dict.fromkeys(c.release for c in cells))
    headers, rows = sweep_grid(cells, order, row_of=row_of, text_of=text_of)
    return [*lines, *table(headers, rows)]


def column(frame: Frame, name: str) -> Any:
    """A column of a table read by ``read_csv``, empty where the file lacks it."""
    import pandas as pd

    return frame[name] if name in frame.columns else pd.Series(dtype=str)
