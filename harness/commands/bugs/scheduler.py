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
from harness.commands.sweep import ERROR, Job
from harness.errors import BadInput
from harness.results.records import SweepCell
from harness.scenario.schema import BugEntry, SchedulerTrigger

DRIVE_MODULE = "harness.engine.scheduler_drive"


def _trigger(entry: BugEntry) -> SchedulerTrigger:
    return entry.trigger_as(SchedulerTrigger)


def check_case(entry: BugEntry) -> None:
    """Refuse an entry naming a case the drive does not have, before any build runs."""
    from harness.engine.scheduler_drive import CASES

    case = _trigger(entry).case
    if case not in CASES:
        raise BadInput(
            f"{entry.source}: unknown scheduler case {case!r}; known: {', '.join(CASES)}"
        )


def drive_argv(python: str, case: str) -> list[str]:
    return [python, "-m", DRIVE_MODULE, case]


def cell_from(report: dict[str, Any], cell: SweepCell) -> SweepCell:
    """The drive's JSON line as a sweep cell: an assertion is the build crashing (its
    text and vLLM's frame the signature), no assertion a pass, anything else an error."""
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
    else:
        cell.outcome = ERROR
        cell.why = f"the scheduler drive could not run: {report.get('exception') or outcome}"
    return cell


def parse_report(stdout: str) -> dict[str, Any] | None:
    """The drive's last JSON line (vLLM may log to stdout before it)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run_scheduler(job: Job) -> list[SweepCell]:
    """A sweep runner (``harness.commands.sweep.run_target``) for a scheduler-level entry:
    the drive in the build's interpreter, its stdout and stderr kept, one cell."""
    from harness.commands.bugs.steps import open_entry_run

    entry: BugEntry = job.target.scenario
    trig = _trigger(entry)
    check_case(entry)
    python = job.variants[job.build.label].python
    run_dir, cell = open_entry_run(job, "bug-scheduler")
    argv = drive_argv(python, trig.case)
    job.reporter.status(f"bug {entry.id}: scheduler drive {trig.case} (no server)")
    t0 = time.perf_counter()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=trig.timeout_s, env=env, check=False
        )
        run_dir.write_text("drive.stdout", proc.stdout)
        run_dir.write_text("drive.stderr", proc.stderr)
        report = parse_report(proc.stdout)
        if report is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            cell.outcome, cell.why = (
                ERROR,
                f"the drive printed no report (exit {proc.returncode}): {tail}",
            )
        else:
            run_dir.write_text("drive.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
            cell_from(report, cell)
    except subprocess.TimeoutExpired:
        cell.outcome, cell.why = "timeout", f"the drive ran past {trig.timeout_s:g}s"
    finally:
        cell.seconds = time.perf_counter() - t0
        run_dir.update_meta(drive_argv=argv)
        run_dir.finish(
            "finished", 0 if cell.outcome == "pass" else 1, passed=cell.outcome == "pass"
        )
    job.on_cell(cell)
    return [cell]


sweep.RUNNERS[sweep.KIND_SCHEDULER] = run_scheduler
