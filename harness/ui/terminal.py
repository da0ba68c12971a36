"""What a person sees on the terminal: progress while servers start, then tables.

Only the CLI imports this module (rich is a terminal concern); the library API
reports through plain callbacks so it can be driven from tests or other tools.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from harness.commands.crash_repro import Row
from harness.server.crash_signatures import known_label

OUTCOME_STYLE = {"started": "green", "crashed": "red", "timeout": "yellow", "error": "magenta"}


class CrashReproProgress:
    """A progress bar over rows, with the row being launched and its elapsed time."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task: TaskID | None = None

        # A live display only makes sense on a terminal; in CI logs and pipes it would
        # hold every line back until the end, so there each row is a plain line.
        self.live = console.is_terminal

    def __enter__(self) -> CrashReproProgress:
        if self.live:
            self.progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.live:
            self.progress.__exit__(exc_type, exc, tb)

    def row_started(self, row: Row, index: int, total: int) -> None:
        if not self.live:
            self.console.print(
                f"[{index}/{total}] launching {row.key} ...", highlight=False, markup=False
            )
            return
        if self.task is None:
            self.task = self.progress.add_task("", total=total)
        self.progress.update(self.task, description=f"launching {row.key}")

    def row_tick(self, row: Row, elapsed: float) -> None:
        if self.live and self.task is not None:
            self.progress.update(self.task, description=f"launching {row.key} ({elapsed:.0f}s)")

    def row_finished(self, row: Row, index: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=index)
        mark = "[green]ok[/]" if row.matched else "[red]UNEXPECTED[/]"
        style = OUTCOME_STYLE.get(row.outcome, "white")
        detail = f" {row.signature}" if row.signature else ""
        if row.outcome == "started":
            detail = " and answered" if row.answered else " but did not answer"
        took = f"{row.seconds or 0:.1f}s"
        if row.shared_with:
            took = f"launch #{row.launch}, shared with {row.shared_with}"
        self.console.print(
            f"{mark} {row.key}: [{style}]{row.outcome}[/]{detail} ({took})",
            highlight=False,
        )


def crash_repro_table(rows: Sequence[Row] | Sequence[dict[str, Any]]) -> Table:
    """The crash-repro rows, from the rows of a run or the records of its
    ``outcomes.csv`` (``report``): one table for both."""
    table = Table(title="crash-repro", show_lines=False, header_style="bold")
    for col in (
        "model",
        "variant",
        "vLLM",
        "patch",
        "connector",
        "outcome",
        "signature",
        "time",
        "launch",
        "expected",
        "match",
    ):
        table.add_column(col, overflow="fold")
    launched: set[str] = set()
    for row in rows:
        r = row.record() if isinstance(row, Row) else row
        outcome = _text(r.get("outcome"))
        style = OUTCOME_STYLE.get(outcome, "white")
        sig = _text(r.get("signature"))
        if _text(r.get("frame")):
            sig = f"{_text(r.get('exception'))} in {_text(r['frame']).rsplit('/', 1)[-1]}"
            known = _issue(r.get("known_issue"))
            sig += f" (known: {known_label(known)})" if known else ""
        if outcome == "started":
            answered = _text(r.get("answered")) == "True"
            sig = "answered" if answered else f"no answer: {_text(r.get('answer'))}"
        known = _issue(r.get("expected_known"))
        expected = _text(r.get("expected")) + (f" {known_label(known)}" if known else "")
        launch = _issue(r.get("launch"))
        shared = launch in launched  # a later row served by an earlier row's launch
        if launch and launch != "0":
            launched.add(launch)
        matched = _text(r.get("matched")) == "True"
        table.add_row(
            _text(r.get("model")),
            _text(r.get("variant")),
            _text(r.get("vllm_version")),
            _text(r.get("patch")) or "-",
            "on" if _text(r.get("connector")) in ("on", "True") else "off (control)",
            Text(outcome, style=style),
            sig,
            _seconds(r.get("seconds")),
            (f"#{launch}" + (" (shared)" if shared else "")) if launch and launch != "0" else "-",
            expected,
            Text("yes", style="green")
            if matched
            else Text(f"NO: {_text(r.get('why'))}", style="bold red"),
        )
    return table


def _text(value: Any) -> str:
    """A record's value as text: "" for none (a CSV's empty cell, NaN)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def _seconds(value: Any) -> str:
    try:
        return f"{float(_text(value)):.1f}s"
    except ValueError:
        return "-"


def _issue(value: Any) -> str:
    """An integer a CSV may have read back as a float (51150.0) as its digits."""
    text = _text(value)
    return text[:-2] if text.endswith(".0") and text[:-2].isdigit() else text


def _mb(n: float) -> str:
    return f"{n / 1e6:,.3f}MB"


def phase_table(phases: Sequence[dict[str, Any]]) -> Table:
    """The PR's phase table from phase records (``phases.csv`` rows): deltas, cumulative."""
    table = Table(title="phases (delta | cumulative)", header_style="bold")
    for col in (
        "phase",
        "requests",
        "stored",
        "loaded",
        "gpu_hits",
        "ext_hits/queries",
        "cum stored",
        "cum loaded",
        "cum ext_hits/queries",
    ):
        table.add_column(col, justify="right" if col != "phase" else "left")
    for p in phases:
        table.add_row(
            str(p["phase"]),
            str(p["requests"]),
            _mb(p["d_stored_bytes"]),
            _mb(p["d_loaded_bytes"]),
            f"{int(p['d_gpu_hits'])}",
            f"{int(p['d_ext_hits'])}/{int(p['d_ext_queries'])}",
            _mb(p["cum_stored_bytes"]),
            _mb(p["cum_loaded_bytes"]),
            f"{int(p['cum_ext_hits'])}/{int(p['cum_ext_queries'])}",
        )
    return table


def checks_table(checks: Sequence[dict[str, Any]]) -> Table:
    """Checks from their records (``checks.csv`` rows), informational ones last."""
    table = Table(title="checks", header_style="bold", show_lines=True)
    for col in ("check", "expected", "observed", "result", "why"):
        table.add_column(col, overflow="fold")
    for c in sorted(checks, key=lambda c: bool(c.get("informational"))):
        passed = str(c["passed"]) == "True"
        if str(c.get("informational")) == "True":
            result = Text("same" if passed else "differs", style="cyan")
        else:
            result = Text("pass", style="green") if passed else Text("FAIL", style="bold red")
        detail = c.get("detail")
        detail = "" if detail is None or detail != detail else str(detail)  # NaN from CSV
        why = str(c["why"]) + (f"\n[{detail}]" if detail else "")
        table.add_row(str(c["name"]), str(c["expected"]), str(c["observed"]), result, Text(why))
    return table


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


class RoundtripProgress:
    """Plain lines: a round trip is a handful of phases, each worth a line."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def status(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def request_done(self, completion: Any) -> None:
        if completion.phase != "filler":
            self.console.print(
                f"    {completion.phase} {completion.prompt}: "
                f"{completion.prompt_tokens} tokens in {completion.seconds:.2f}s",
                highlight=False,
                markup=False,
            )

    def phase_done(self, phase: Any) -> None:
        d = phase.delta
        self.console.print(
            f"  phase {phase.phase}: {phase.requests} requests, stored {_mb(d.stored_bytes)}, "
            f"loaded {_mb(d.loaded_bytes)}, gpu_hits {int(d.gpu_hits)}, ext_hits "
            f"{int(d.ext_hits)}/{int(d.ext_queries)} ({phase.seconds:.1f}s)",
            highlight=False,
            markup=False,
        )


MATRIX_STYLE = {
    "started": "green",
    "crashed": "red",
    "unsupported": "yellow",
    "timeout": "yellow",
    "error": "magenta",
}


class MatrixProgress:
    """One line per cell and per phase: cells take a minute or two each."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._rt = RoundtripProgress(console)

    def cell_started(self, cell: Any, index: int, total: int) -> None:
        self.console.print(
            f"[{index}/{total}] {cell.key} (vLLM {cell.vllm_version}): expect "
            f"{cell.expected_text()}",
            highlight=False,
            markup=False,
        )

    def cell_finished(self, cell: Any, index: int, total: int) -> None:
        mark = "[green]ok[/]" if cell.matched else "[red]UNEXPECTED[/]"
        self.console.print(
            f"{mark} {escape(cell.key)}: {escape(cell.observed_text())} ({cell.seconds:.0f}s)",
            highlight=False,
        )

    def status(self, message: str) -> None:
        self._rt.status(message)

    def request_done(self, completion: Any) -> None:
        pass  # a matrix is many round trips: phases are enough

    def phase_done(self, phase: Any) -> None:
        self._rt.phase_done(phase)


def matrix_table(cells: Sequence[Any]) -> Table:
    """The matrix, cells that differ from their expectation first."""
    table = Table(title="KV-cache spec family matrix", header_style="bold", show_lines=True)
    from harness.commands.matrix.files import MATRIX_CELLS

    for col in MATRIX_CELLS.display:
        table.add_column(col, overflow="fold")
    for c in cells:
        start = Text(c.startup or "-", style=MATRIX_STYLE.get(c.startup, "white"))
        if c.signature:
            start.append(f"\n{c.signature}")
        if c.startup == "unsupported" and c.message:
            start.append(f"\n{c.message[:160]}")
        if c.roundtrip == "pass":
            rt = Text("pass", style="green")
        elif c.roundtrip == "fail":
            rt = Text("FAIL: " + ", ".join(c.failed_checks), style="bold red")
            first = next((k for k in c.checks if not k.passed), None)
            if first is not None:
                rt.append(f"\n{first.observed}"[:200])
        elif c.roundtrip == "error":
            rt = Text(f"error: {c.why}", style="magenta")
        else:
            rt = Text("-")
        match = Text("yes", style="green") if c.matched else Text(f"NO: {c.why}", style="bold red")
        table.add_row(
            *c.identity(),
            start,
            rt,
            c.expected_text(),
            match,
        )
    return table


def bench_table(figures: Sequence[dict[str, Any]]) -> Table:
    """The benchmark figures, each with its target and verdict."""
    from harness.commands.bench.files import BENCH_FIGURES

    table = Table(title="benchmarks (ratios measured side by side in this run)")
    for col in BENCH_FIGURES.shown:
        table.add_column(col)
    for f in figures:
        ok = Text("yes", style="green") if f["ok"] else Text("no", style="red")
        table.add_row(str(f["figure"]), str(f["value"]), str(f["target"]), ok)
    return table


def launches_table(launches: Sequence[dict[str, Any]]) -> Table:
    """Each launch of a run (run.json -> launches), phase by phase, in seconds."""
    from harness.server.launch_timeline import LAUNCH_PHASES

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
    """A results directory's tables, as its command's results kind defines them, then
    its launches (every command records them in run.json)."""
    from harness.commands.crash_repro.files import OUTCOMES
    from harness.commands.roundtrip.files import CHECKS, PHASE_TABLE
    from harness.commands.stress.files import STRESS_CHECKS
    from harness.ui.owned_kinds import kind_of

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
        if spec is OUTCOMES:
            out.append(crash_repro_table(records))
        elif spec is PHASE_TABLE:
            out.append(phase_table(records))
        elif spec in (CHECKS, STRESS_CHECKS):
            out.append(checks_table(records))
        else:
            out.append(frame_table(spec.title, records, spec.shown or spec.columns))
    if launches:
        out.append(launches_table(launches))
    return out


def run_records(command: str, run_dir: Path) -> list[dict[str, Any]]:
    """What ``run_tables`` shows, as data (``report --json``): each table file the run
    wrote (its title, file, columns and rows), then its launches."""
    from harness.ui.owned_kinds import kind_of

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


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


class _SpinnerLines:
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


def _env_line(head: str, status: Any) -> Text:
    line = Text(f"{head}: ")
    line.append(status.state, style=ENV_STATE_STYLE.get(status.state, "white"))
    if status.state == "unavailable":
        line.append(f": {status.reason}")
    else:
        version = f"vLLM {status.vllm_version}, " if status.vllm_version else ""
        line.append(f" ({version}{status.seconds:.0f}s, {_size(status.disk_bytes)})")
    return line


class EnvsProgress(_SpinnerLines):
    """Release environments, one line per release when it is done."""

    def env_started(self, release: str, index: int, total: int) -> None:
        self._prefix = f"[{index}/{total}] {release}"
        if not self.live:
            self.console.print(f"{self._prefix} ...", highlight=False, markup=False)
        self._show("checking")

    def env_step(self, release: str, message: str) -> None:
        self._show(message)

    def env_finished(self, status: Any, index: int, total: int) -> None:
        self._line(_env_line(f"[{index}/{total}] {status.release}", status))


def env_status_table(statuses: Sequence[Any]) -> Table:
    """What ``envs create`` did for each release."""
    table = Table(title="release environments", header_style="bold")
    for col in ("release", "state", "vLLM", "time", "disk", "python or reason"):
        table.add_column(col, overflow="fold")
    for s in statuses:
        table.add_row(
            s.release,
            Text(s.state, style=ENV_STATE_STYLE.get(s.state, "white")),
            s.vllm_version or "-",
            f"{s.seconds:.0f}s",
            _size(s.disk_bytes),
            s.python if s.ok else s.reason,
        )
    return table


def envs_table(entries: Sequence[Any], total: Any, where: Path) -> Table:
    """``envs list``: each environment's disk three ways (see ``disk_usage.DiskUsage``)."""
    table = Table(
        title=f"release environments in {where}",
        header_style="bold",
        caption=(
            f"{len(entries)} environment(s): {_size(total.allocated)} on disk together "
            f"(hard links once), {_size(total.apparent)} apparent"
            if entries
            else "none"
        ),
    )
    for col in ("environment", "vLLM", "complete", "on disk", "apparent", "freed if removed"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(
            e.name,
            str(e.stamp.get("vllm_version") or "-"),
            Text("yes", style="green") if e.complete else Text("no (not reused)", style="red"),
            _size(e.disk.allocated),
            _size(e.disk.apparent),
            _size(e.disk.exclusive),
        )
    return table


def prune_lines(removed: Sequence[Any], busy: Sequence[Any]) -> list[Text]:
    """``envs prune``: one line per environment removed or left (being built)."""
    lines = []
    for e in removed:
        what = "" if e.complete else " (incomplete)"
        lines.append(Text(f"removed {e.name}{what}: {_size(e.disk.exclusive)} freed"))
    for e in busy:
        lines.append(Text(f"kept {e.name}: being built by another process", style="yellow"))
    freed = sum(e.disk.exclusive for e in removed)
    lines.append(Text(f"{len(removed)} removed, {_size(freed)} freed", style="bold"))
    return lines


class SweepProgress(_SpinnerLines):
    """A line per build and per cell (a sweep runs for an hour or more, and CI logs must
    show where it is); on a terminal a spinner shows the launch or install under way."""

    def build_started(self, build: Any, index: int, total: int) -> None:
        self._prefix = f"[{index}/{total}] {build.label}"
        self._line(Text(f"{self._prefix}: environment ..."))
        self._show("environment")

    def build_joined(self, build: Any, index: int, total: int) -> None:
        self._prefix = f"[{index}/{total}] {build.label}"

    def build_step(self, build: Any, message: str) -> None:
        self._show(message)

    def build_ready(self, build: Any, status: Any) -> None:
        self._line(_env_line(self._prefix, status))

    def cell_done(self, cell: Any) -> None:
        if cell.outcome == "unavailable":
            return  # the build's own line said so, with the reason, once
        if cell.matched is None:
            mark = Text("--", style="dim")
        elif cell.matched:
            mark = Text("ok", style="green")
        else:
            mark = Text("UNEXPECTED", style="bold red")
        line = mark + Text(f" {cell.release} {cell.check}: ")
        line.append(cell.state, style=_sweep_style(cell.outcome))
        if cell.signature and cell.signature != cell.state:
            line.append(f" {cell.signature}")
        if cell.matched is False:
            line.append(f" (expected {cell.expected}: {cell.why})")
        elif cell.matched is None and cell.why:
            line.append(f" ({cell.why})")
        if cell.seconds:
            line.append(f" ({cell.seconds:.0f}s)")
        self._line(line)

    # The commands' reporters, while one of their rows, cells or round trips runs.
    def row_started(self, row: Any, index: int, total: int) -> None:
        self._show(f"launching {row.key}")

    def row_tick(self, row: Any, elapsed: float) -> None:
        self._show(f"launching {row.key} ({elapsed:.0f}s)")

    def row_finished(self, row: Any, index: int, total: int) -> None:
        pass  # cell_done prints the verdict

    def cell_started(self, cell: Any, index: int, total: int) -> None:
        self._show(f"{cell.key}: round trip")

    def cell_finished(self, cell: Any, index: int, total: int) -> None:
        pass

    def status(self, message: str) -> None:
        self._show(message)

    def phase_done(self, phase: Any) -> None:
        self._show(f"phase {phase.phase} done")

    def request_done(self, completion: Any) -> None:
        pass


class BugsProgress(SweepProgress):
    """The sweep's lines, each trigger's cell read as its entries' verdicts: ``ok`` when
    the entry says so of that release, ``UNMATCHED`` when not, ``--`` when not judged."""

    def __init__(self, console: Console, judge: Any) -> None:
        super().__init__(console)
        self._judge = judge  # a sweep cell -> the bug cells it decides

    def cell_done(self, cell: Any) -> None:
        if cell.outcome == "unavailable":
            return  # the build's own line said so, with the reason, once
        for c in self._judge(cell):
            if c.matched is None:
                mark = Text("--", style="dim")
            else:
                mark = Text("ok", style="green") if c.matched else Text("UNMATCHED", "bold red")
            line = mark + Text(f" {c.release} {c.bug}: ")
            line.append(c.outcome, style=BUG_STYLE.get(c.outcome, "dim"))
            if c.signature:
                line.append(f" ({c.signature})")
            if c.why and c.matched is not True:
                line.append(f": {c.why}")
            if c.seconds:
                line.append(f" ({c.seconds:.0f}s)")
            self._line(line)


def _sweep_style(outcome: str) -> str:
    head = outcome.split(",")[0]
    if outcome in ("unavailable", "not-run"):
        return "dim"
    if outcome.endswith("fail"):
        return "red"
    return MATRIX_STYLE.get(head, OUTCOME_STYLE.get(head, "white"))


def sweep_table(cells: Sequence[Any], builds: Sequence[str], width: int | None = None) -> Table:
    """Release x check: outcome per cell, red where it is not what the rules expect; over
    many builds (or more than ``width`` takes), runs of releases alike per check."""
    return _grid_table(
        cells, builds, "check", "state", "sweep (* = not as expected)", _sweep_style, width
    )


BUG_STYLE = {"reproduced": "yellow", "passed": "green", "error": "red"}


def bugs_table(cells: Sequence[Any], builds: Sequence[str], width: int | None = None) -> Table:
    """Bug x release: reproduced (yellow), passed (green), error (red); bold red where the
    cell is not what the entry says of that release."""
    return _grid_table(
        cells,
        builds,
        "bug",
        "outcome",
        "bugs (* = unmatched)",
        lambda o: BUG_STYLE.get(o, "dim"),
        width,
    )


def _is_release(label: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        Version(label)
    except InvalidVersion:
        return False
    return True


def _grid_table(
    cells: Sequence[Any],
    builds: Sequence[str],
    row_of: str,
    text_of: str,
    title: str,
    style_of: Any,
    width: int | None = None,
) -> Table:
    from harness.results.markdown import sweep_grid, unavailable_builds
    from harness.ui.fit import grid

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


class StressProgress:
    """One line per server step and one per finished request (``--quiet``-free: a stress
    run is a few dozen requests, each worth seeing as it lands)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def status(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def request_done(self, outcome: Any, done: int, total: int) -> None:
        if outcome.error and not outcome.aborted:
            from rich.markup import escape

            what = f"[red]error[/] {escape(outcome.error[:120])}"
        elif outcome.aborted:
            what = f"aborted after {len(outcome.output)} tokens"
        else:
            cached = "" if outcome.cached_tokens is None else f", {outcome.cached_tokens} cached"
            what = f"{len(outcome.prompt)} prompt{cached}, {len(outcome.output)} generated"
        self.console.print(
            f"    \\[{done}/{total}] {outcome.ended_s:6.1f}s {outcome.id}: {what}",
            highlight=False,
        )


class PressureProgress:
    """A line per request: what it hit, stored and loaded against the oracle, and the
    checks it failed (a pressure server is a dozen requests, each one decisive)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def status(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def request_done(self, server: str, judged: Any) -> None:
        r = judged.row
        mark = "[red]x[/]" if judged.failing else "[green]ok[/]"
        failed = f" [red]{', '.join(judged.failing)}[/]" if judged.failing else ""
        self.console.print(
            f"    {mark} {server} #{r.index} {r.request}: hit {r.ext_hits} (oracle "
            f"{r.hit_expected}), stored {_mb(r.stored_bytes)}, loaded {_mb(r.loaded_bytes)}"
            f"{failed}",
            highlight=False,
        )
