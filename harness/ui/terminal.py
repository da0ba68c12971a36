"""What a person sees on the terminal, the shared part: any table of records, fitted;
a run's tables as ``report`` re-renders them (each by the view its command registered,
``register_view``), its launches; plain lines with a spinner for long steps; the release
environments; a release x row grid. Each command's progress and tables are its own
(``cli/<command>_show.py``).

Only the CLI imports this module (rich is a terminal concern); the library API
reports through plain callbacks so it can be driven from tests or other tools.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from harness.results.markdown import sweep_grid, unavailable_builds
from harness.results.tables import TableFile
from harness.server.launch_timeline import LAUNCH_PHASES
from harness.ui.fit import grid
from harness.ui.owned_kinds import kind_of

# A server's startup outcome in colour (crash-repro's rows, matrix cells, sweep cells).
OUTCOME_STYLE = {"started": "green", "crashed": "red", "timeout": "yellow", "error": "magenta"}
MATRIX_STYLE = {
    "started": "green",
    "crashed": "red",
    "unsupported": "yellow",
    "timeout": "yellow",
    "error": "magenta",
}

_VIEWS: list[tuple[TableFile, Callable[[list[dict[str, Any]]], Table]]] = []


def register_view(spec: TableFile, view: Callable[[list[dict[str, Any]]], Table]) -> None:
    """How ``report`` shows one table file, from its records: a command registers its
    own from its show module (``cli/<command>_show.py``); a table without one is shown
    by ``frame_table`` (its title, ``shown`` columns)."""
    _VIEWS.append((spec, view))


def frame_table(title: str, records: Sequence[dict[str, Any]], columns: Sequence[str]) -> Table:
    """Any result table (e.g. a re-rendered outcomes.csv or a comparison)."""
    table = Table(title=title, header_style="bold")
    for col in columns:
        table.add_column(col, overflow="fold")
    for rec in records:
        table.add_row(*[_cell(rec.get(col)) for col in columns])
    return table


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return str(value)


def mb(n: float) -> str:
    return f"{n / 1e6:,.3f}MB"


def launches_table(launches: Sequence[dict[str, Any]]) -> Table:
    """Each launch of a run (run.json -> launches), phase by phase, in seconds."""
    table = Table(title="launches (seconds)", header_style="bold")
    table.add_column("#", justify="right")
    table.add_column("log", overflow="fold")
    for name, _ in LAUNCH_PHASES:
        table.add_column(name.replace("_", " "), justify="right")
    table.add_column("to /health", justify="right")
    table.add_column("teardown", justify="right")
    for i, t in enumerate(launches, 1):
        phases = t.get("phases") or {}
        table.add_row(
            str(i),
            Path(str(t.get("log", ""))).name,
            *[_cell(phases.get(name)) for name, _ in LAUNCH_PHASES],
            _cell(t.get("health_s")),
            _cell(t.get("teardown_s")),
        )
    return table


def run_tables(command: str, run_dir: Path) -> list[Table]:
    """A results directory's tables, as its command's results kind defines them (each by
    the view its command registered, else ``frame_table``), then its launches (every
    command records them in run.json)."""
    kind = kind_of(command)
    if kind is None:
        return []
    out: list[Table] = []
    try:
        launches = json.loads((run_dir / "run.json").read_text()).get("launches") or []
    except (OSError, ValueError):
        launches = []
    for spec in kind.tables:
        frame = spec.read(run_dir)
        if frame is None:
            continue
        records = frame.to_dict("records")
        view = next((v for s, v in _VIEWS if s is spec), None)
        out.append(
            view(records) if view else frame_table(spec.title, records, spec.shown or spec.columns)
        )
    if launches:
        out.append(launches_table(launches))
    return out


def run_records(command: str, run_dir: Path) -> list[dict[str, Any]]:
    """What ``run_tables`` shows, as data (``report --json``): each table file the run
    wrote (its title, file, columns and rows), then its launches."""
    kind = kind_of(command)
    out: list[dict[str, Any]] = []
    for spec in kind.tables if kind is not None else ():
        frame = spec.read(run_dir)
        if frame is None:
            continue
        rows = [{k: (None if _cell(v) == "-" and v != "-" else v) for k, v in r.items()}
                for r in frame.to_dict("records")]  # fmt: skip
        out.append({"title": spec.title, "file": spec.name, "columns": list(frame.columns),
                    "rows": rows})  # fmt: skip
    try:
        launches = json.loads((run_dir / "run.json").read_text()).get("launches") or []
    except (OSError, ValueError):
        launches = []
    if launches:
        out.append({"title": "launches", "file": "run.json", "rows": launches})
    return out


ENV_STATE_STYLE = {"ready": "green", "created": "cyan", "unavailable": "yellow"}


def size_text(n: float | None) -> str:
    """Bytes as ``1.23 GB`` or ``456 MB`` (``-`` unknown): environment and disk figures."""
    if n is None:
        return "-"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


class SpinnerLines:
    """Plain lines for what is done, and on a terminal one spinner line for the step
    under way (an install or a launch takes a minute; CI logs get only the lines)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self._status: Any = None
        # Per thread: a sweep with --jobs reports from one thread per lane, each with
        # its build's prefix; the spinner shows the latest step of either.
        self._local = threading.local()
        self._lock = threading.RLock()

    @property
    def _prefix(self) -> str:
        return str(getattr(self._local, "prefix", ""))

    @_prefix.setter
    def _prefix(self, value: str) -> None:
        self._local.prefix = value

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop()

    def _stop(self) -> None:
        with self._lock:
            if self._status is not None:
                self._status.stop()
                self._status = None

    def _show(self, message: str) -> None:
        if not self.live:
            return
        text = escape(f"{self._prefix}: {message}")
        with self._lock:
            if self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            else:
                self._status.update(text)

    def _line(self, text: Text | str) -> None:
        with self._lock:
            self._stop()
            self.console.print(text, highlight=False)


def env_line(head: str, status: Any) -> Text:
    line = Text(f"{head}: ")
    line.append(status.state, style=ENV_STATE_STYLE.get(status.state, "white"))
    if status.state == "unavailable":
        line.append(f": {status.reason}")
    else:
        version = f"vLLM {status.vllm_version}, " if status.vllm_version else ""
        line.append(f" ({version}{status.seconds:.0f}s, {size_text(status.disk_bytes)})")
    return line


def _is_release(label: str) -> bool:
    try:
        Version(label)
    except InvalidVersion:
        return False
    return True


def grid_table(
    cells: Sequence[Any],
    builds: Sequence[str],
    row_of: str,
    text_of: str,
    title: str,
    style_of: Any,
    width: int | None = None,
) -> Table:
    headers, rows = sweep_grid(cells, builds, row_of=row_of, text_of=text_of)
    at = {(getattr(c, row_of), c.release): c for c in cells}
    gone = unavailable_builds(cells, builds)
    caption = f"{len(gone)} build(s) could not be installed: left out" if gone else None
    shown = headers[1:]
    out_rows = []
    for r in rows:
        out: list[Text] = []
        for b in shown:
            c = at.get((r[0], b))
            if c is None:
                out.append(Text(""))
                continue
            style = "bold red" if c.matched is False else style_of(c.outcome)
            text = str(getattr(c, text_of)) + (" *" if c.matched is False else "")
            out.append(Text(text, style=style))
        out_rows.append(((r[0],), out))
    releases = {b for b in shown if _is_release(b)}
    return grid(title, (row_of,), out_rows, shown, releases, caption=caption, width=width)
