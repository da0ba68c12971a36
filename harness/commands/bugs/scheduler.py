"""Bug entries below a server's reach: vLLM's real scheduler and offloading manager
driven in one process of the build's own interpreter (``harness.engine.scheduler_drive``).

Some offloading bugs need a state no request sequence on the harness's models reaches:
KV-cache groups with different block sizes (a Gemma-4-like geometry), a recurrent group
holding an unhashed block, an offload key that lags its block. vLLM's own tests reach
them by building a ``Scheduler`` with the connector on made-up KV specs; the drive does
the same, in the build under test, and prints one JSON line. This module runs it as a
subprocess (the build's vLLM is not the harness's), keeps its output in the cell's run
directory, and turns it into the sweep cell the corpus judges: ``crashed`` with the
assertion and vLLM's frame, ``pass``, or ``error`` when the drive could not be set up.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from harness.commands import sweep
from harness.commands.bugs.entry_runs import entry_dir, open_entry_run
from harness.commands.bugs.groups import EntryGroup
from harness.commands.sweep import ERROR, Job
from harness.engine import scheduler_drive
from harness.errors import BadInput
from harness.results.records import SweepCell
from harness.scenario.bugs import BugEntry, SchedulerTrigger

DRIVE_MODULE = "harness.engine.scheduler_drive"


def _trigger(entry: BugEntry) -> SchedulerTrigger:
    return entry.trigger_as(SchedulerTrigger)


def check_case(entry: BugEntry) -> None:
    """Refuse an entry naming a case the drive does not have, before any build runs."""
    case = _trigger(entry).case
    known = scheduler_drive.every_case()
    if case not in known:
        raise BadInput(
            f"{entry.source}: unknown scheduler case {case!r}; known: {', '.join(known)}"
        )


def drive_argv(python: str, cases: list[str]) -> list[str]:
    return [python, "-m", DRIVE_MODULE, *cases]


def cell_from(report: dict[str, Any], cell: SweepCell) -> SweepCell:
    """The drive's JSON line as a sweep cell: an assertion is the build crashing (its
    text and vLLM's frame the signature), a failed check of the case (vLLM quietly doing
    otherwise) a ``fail`` naming it, neither a pass, anything else an error."""
    outcome = report.get("outcome")
    figures = report.get("figures") or {}
    cell.detail = "; ".join(f"{k}={v}" for k, v in sorted(figures.items()))
    if report.get("vllm_version"):
        cell.vllm_version = str(report["vllm_version"])
    if outcome == "assert":
        frame = report.get("frame") or "no vLLM frame"
        cell.outcome = "crashed"
        cell.signature = f"{report.get('exception') or 'AssertionError'} at {frame}"
    elif outcome == "ok":
        cell.outcome = "pass"
    elif outcome == "fail":  # no assertion; the case's own check saw vLLM do otherwise
        cell.outcome = "fail"
        cell.failing = ",".join(str(c) for c in report.get("failing") or [])
    else:
        cell.outcome = ERROR
        cell.why = f"the scheduler drive could not run: {report.get('exception') or outcome}"
    return cell


def parse_reports(stdout: str) -> dict[str, dict[str, Any]]:
    """The drive's JSON lines by case (vLLM may log to stdout around them)."""
    out: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("case"), str):
            out[value["case"]] = value
    return out


def run_scheduler(job: Job) -> list[SweepCell]:
    """A sweep runner (``harness.commands.sweep.run_target``) for scheduler-level
    entries: one drive process in the build's interpreter for all of them (importing
    vLLM is most of a drive's time), its stdout and stderr kept, one cell per entry."""
    group: EntryGroup = job.target.scenario
    entries = group.chosen(job.target.checks)
    for e in entries:
        check_case(e)
    cases = [_trigger(e).case for e in entries]
    python = job.variants[job.build.label].python
    opened = [open_entry_run(job, "bug-scheduler", e, entry_dir(job, e)) for e in entries]
    argv = drive_argv(python, cases)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    job.reporter.status(f"bugs {', '.join(e.id for e in entries)}: scheduler drive (no server)")
    timeout = sum(_trigger(e).timeout_s for e in entries)
    t0 = time.perf_counter()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    reports: dict[str, dict[str, Any]] = {}
    failure, timed_out = "", False
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        (job.out_dir / "drive.stdout").write_text(proc.stdout)
        (job.out_dir / "drive.stderr").write_text(proc.stderr)
        reports = parse_reports(proc.stdout)
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        failure = f"the drive printed no report (exit {proc.returncode}): {tail}"
    except subprocess.TimeoutExpired:
        failure, timed_out = f"the drive ran past {timeout:g}s", True
    seconds = time.perf_counter() - t0
    cells = []
    for case, (run_dir, cell) in zip(cases, opened, strict=True):
        report = reports.get(case)
        if report is None:
            cell.outcome = "timeout" if timed_out else ERROR
            cell.why = failure
        else:
            run_dir.write_text("drive.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
            cell_from(report, cell)
        # The process's time, shared: the case's own is in drive.json (figures.wall_s).
        cell.seconds = seconds / len(entries)
        run_dir.update_meta(
            drive_argv=argv,
            drive_output=[str(job.out_dir / "drive.stdout"), str(job.out_dir / "drive.stderr")],
        )
        run_dir.finish(
            "finished", 0 if cell.outcome == "pass" else 1, passed=cell.outcome == "pass"
        )
        job.on_cell(cell)
        cells.append(cell)
    return cells


sweep.RUNNERS[sweep.KIND_SCHEDULER] = run_scheduler
