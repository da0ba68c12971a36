"""A run's directory from the CLI's side: opened (with what every run records about
itself), guarded against Ctrl-C and harness errors, finished, and its verdict line."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape

from harness.cli.common import console, err_console, fail
from harness.cli.options import RunOptions
from harness.errors import ExitCode, HarnessError
from harness.names import REPO_ROOT
from harness.results.run_directory import RunDirectory, new_run_dir
from harness.server import interpreters
from harness.server.launch_timeline import summary_line
from harness.server.launcher import install_signal_handlers, stop_all
from harness.server.server_lock import refuse_if_lock_busy


class Outcome:
    """How a run ended: set by :func:`guard` and read when the run directory is finished."""

    def __init__(self) -> None:
        self.status, self.code = "finished", ExitCode.OK


@contextlib.contextmanager
def guard() -> Iterator[Outcome]:
    """Ctrl-C and harness errors end a run cleanly: servers stopped, results kept."""
    outcome = Outcome()
    try:
        yield outcome
    except KeyboardInterrupt:
        stop_all()
        outcome.status, outcome.code = "interrupted", ExitCode.INTERRUPTED
        err_console.print("offload-check: interrupted; servers stopped, partial results kept")
    except HarnessError as err:
        stop_all()
        outcome.status, outcome.code = "error", err.exit_code
        err_console.print(f"offload-check: error: {err}", highlight=False, markup=False)


def verdict_line(bad: int, status: str, noun: str, where: Path, all_ok: str) -> None:
    """The last line of a run: ``all_ok``, how many were not as expected, or how it stopped."""
    if not bad and status == "finished":
        verdict = f"[green]{all_ok}[/]"
    else:
        verdict = f"[red]{bad} {noun}(s) not as expected[/]" if bad else f"[yellow]{status}[/]"
    launches = launches_of(where)
    if launches:
        console.print(launches, highlight=False, markup=False)
    console.print(f"{verdict}; results: {where}", highlight=False)


def launches_of(run_dir: Path) -> str:
    """The run's launch timeline in one line (run.json -> launches)."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return ""
    return summary_line(meta.get("launches") or [])


def end_run(
    run_dir: Any, outcome: Outcome, done: list[Any], noun: str, planned: int | None = None
) -> int:
    """Finish ``run.json`` with how many rows ran and matched (``<noun>_run``,
    ``<noun>_matched``); a finished run with one not as expected, or fewer than planned,
    exits 1. Returns the exit code."""
    matched = sum(1 for x in done if x.matched)
    short = planned is not None and len(done) < planned
    if outcome.status == "finished" and (matched < len(done) or short):
        outcome.code = ExitCode.MISMATCH
    run_dir.finish(
        outcome.status, int(outcome.code), **{f"{noun}_run": len(done), f"{noun}_matched": matched}
    )
    return int(outcome.code)


def lock_free() -> None:
    """``--no-wait``: a run another holds the server lock against does not start."""
    try:
        refuse_if_lock_busy()
    except HarnessError as err:
        raise fail(err) from None


def open_run(opts: RunOptions, command: str, scenario: Any) -> Any:
    """The run's directory under ``--results-dir``, with what every run records about
    itself written at once (``--label``: in the directory's name and ``run.json``)."""
    results_dir, label = opts.results_dir, opts.label
    from harness.commands.doctor.host import host_record

    install_signal_handlers()
    lock_free()
    try:
        run_dir = RunDirectory(new_run_dir(results_dir, command, label), command)
    except OSError as err:
        raise fail(HarnessError(f"cannot create results directory: {err}")) from None
    run_dir.update_meta(label=label)
    if scenario is not None:
        run_dir.update_meta(
            scenario=scenario.model_dump(mode="json"), scenario_file=str(scenario.source)
        )
    run_dir.update_meta(
        platform=interpreters.host_platform(),
        host=host_record(),
        git_revision=interpreters.git_revision(REPO_ROOT),
    )
    return run_dir


def open_roundtrip_run(
    opts: RunOptions, command: str, base: Any, scenario: Any, **meta: Any
) -> Any:
    """``open_run`` for the commands made of round trips (roundtrip, stress, faults) on
    ``base``, a round-trip plan: a note when its variant is off its platform, and the
    variant (or the attached server's URL) recorded with ``meta``."""
    if base.off_platform:
        console.print(f"[yellow]note:[/] {escape(base.off_platform)}", highlight=False)
    run_dir = open_run(opts, command, scenario)
    variant = base.env.as_dict() if base.env else {"url": base.url}
    run_dir.update_meta(variant={"name": base.variant, **variant}, **meta)
    return run_dir
