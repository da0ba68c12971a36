"""What ``crash-repro`` shows: its plan (``--dry-run``, text or ``--json``), its progress
while servers start, and its outcome table (live, and ``report``'s from ``outcomes.csv``);
registered with the shared floors (``harness.ui.dry_run``, ``harness.ui.terminal``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from harness.commands.crash_repro import Row, RunPlan, backends, launch_count
from harness.commands.crash_repro.files import OUTCOMES
from harness.server.crash_signatures import known_label
from harness.ui import dry_run, terminal
from harness.ui.dry_run import host_line, host_state, say
from harness.ui.terminal import OUTCOME_STYLE


def crash_repro_plan(console: Console, plan: object) -> None:
    assert isinstance(plan, RunPlan)
    skipped = sum(1 for r in plan.rows if r.skip_reason)
    launches = launch_count(plan.rows)
    shared = len(plan.rows) - skipped - launches
    say(
        console,
        f"scenario {plan.scenario.name}: {len(plan.rows)} rows, {launches} launches, "
        "one at a time"
        + (f"; {shared} rows share a launch with an identical server" if shared else "")
        + (f" ({skipped} rows skipped on this host)" if skipped else ""),
        indent=0,
        bold="scenario",
    )
    first_of: dict[str, str] = {}
    host_line(console)
    for n, env in plan.environments.items():
        say(
            console,
            f"variant {n}: vLLM {env.vllm_version} ({env.vllm_dist}) on "
            f"{env.device}, offload backend {backends(plan)[n]}, python {env.python}",
        )
    for row in plan.rows:
        exp = row.expected + (f" ({known_label(row.expected_known)})" if row.expected_known else "")
        say(console, f"{row.key} expect {exp}", indent=0, bold=row.key)
        if row.skip_reason:
            say(console, f"skipped on this host: {row.skip_reason}")
        else:
            key = row.plan.launch_key()
            if key in first_of:
                say(console, f"same server as {first_of[key]}: served by its launch")
            first_of.setdefault(key, row.key)
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(row.plan.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(row.plan.argv()), highlight=False, markup=False)


def crash_repro_plan_record(plan: object) -> dict[str, Any]:
    assert isinstance(plan, RunPlan)
    first_of: dict[str, str] = {}
    rows = []
    for row in plan.rows:
        key = row.plan.launch_key()
        shared = first_of.get(key, "") if not row.skip_reason else ""
        if not row.skip_reason:
            first_of.setdefault(key, row.key)
        rows.append(
            {
                "key": row.key,
                "model": row.model,
                "variant": row.variant,
                "connector": "on" if row.connector else "off",
                "patch": row.patch or "none",
                "vllm_version": row.vllm_version,
                "expected": row.expected,
                "expected_known": row.expected_known,
                "skipped": row.skip_reason or None,
                "shares_launch_of": shared or None,
                "env": row.plan.env,
                "argv": row.plan.argv(),
            }
        )
    return {
        "command": "crash-repro",
        "scenario": plan.scenario.name,
        "launches": launch_count(plan.rows),
        "host": host_state(),
        "variants": {
            n: {**env.as_dict(), "offload_backend": backends(plan)[n]}
            for n, env in plan.environments.items()
        },
        "rows": rows,
    }


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


PLAN = dry_run.register("crash_repro_plan", crash_repro_plan, crash_repro_plan_record)
terminal.register_view(OUTCOMES, crash_repro_table)
