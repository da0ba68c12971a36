"""A bug entry's own run directory on one build and the one sweep cell it decides, as
every entry runner (scripts, scheduler drives) makes them; a directory of its own when
the entry shares its target with others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.commands.bugs.groups import EntryGroup
from harness.commands.sweep import Job
from harness.results.records import SweepCell
from harness.results.run_directory import RunDirectory
from harness.scenario.bugs import BugEntry


def open_entry_run(
    job: Job, kind: str, entry: BugEntry, where: Path | None = None, **cell: Any
) -> tuple[Any, SweepCell]:
    """A bug entry's own run directory on one build (``kind``: its ``run.json`` command;
    ``where``: the target's directory unless the entry shares it with others) and the
    one cell it will decide, as every entry runner makes them."""
    path = where or job.out_dir
    path.mkdir(parents=True, exist_ok=True)
    run_dir = RunDirectory(path, kind)
    run_dir.update_meta(bug=entry.id, scenario_file=str(entry.source), sweep_build=job.build.label)
    return run_dir, SweepCell(
        job.build.label,
        f"bug/{entry.id}",
        job.target.kind,
        entry.id,
        "",
        run_dir=str(run_dir.path),
        **cell,
    )


def entry_dir(job: Job, entry: BugEntry) -> Path | None:
    """Where an entry's run goes: the target's directory when it is the target's only
    entry (as a lone entry always was), else a directory of its own inside it."""
    group: EntryGroup = job.target.scenario
    return None if len(group.entries) == 1 else job.out_dir / entry.id
