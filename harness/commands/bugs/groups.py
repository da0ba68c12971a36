"""Bug entries that run together on one launch: one server, or one drive process.

Most of a corpus run's time is spent starting things, not in the triggers: a server
takes about 27 s to answer ``/health`` here and a scheduler drive 10-21 s to import
vLLM, while a script's steps or a drive's case take seconds. Entries whose scripts ask
for the very same server (scenario, model, environment, offload settings, arguments)
therefore share one launch, one after another, and every scheduler-level entry of a
build shares one drive process. Each entry keeps its own run directory, checks and
cell, so an entry reads the same whether it ran alone or in a group.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.scenario.bugs import BugEntry, StepsTrigger


@dataclass(frozen=True)
class EntryGroup:
    """Entries run on one launch, in this order (a sweep target's ``scenario``)."""

    entries: tuple[BugEntry, ...]

    @property
    def name(self) -> str:
        return "bug-" + "+".join(e.id for e in self.entries)

    @property
    def source(self) -> Path:
        """Where the entries are (the first one's file when several): ``run.json``'s
        ``scenario_file``; the target's directory is named by :attr:`name`."""
        return Path(self.name) if len(self.entries) > 1 else Path(str(self.entries[0].source))

    def chosen(self, checks: Iterable[str]) -> list[BugEntry]:
        """The entries whose check is among ``checks`` (a target narrowed for a build)."""
        wanted = set(checks)
        return [e for e in self.entries if f"bug/{e.id}" in wanted]


def launch_key(entry: BugEntry) -> str:
    """What a steps entry's server is made of, as text: two entries with the same key
    ask for the same launch, so they can share it. These are exactly the inputs of the
    server's scenario (``steps.scenario_for``): the round-trip scenario file, another
    geometry, the environment, the offload settings, and the arguments appended."""
    trig = entry.trigger_as(StepsTrigger)
    return json.dumps(
        {
            "scenario": str(entry.resolve(trig.scenario)),
            "geometry": str(entry.resolve(trig.geometry)) if trig.geometry else None,
            "env": trig.env,
            "offload_block_size": trig.offload_block_size,
            "offload_config": trig.offload_config,
            "server_args": trig.server_args,
        },
        sort_keys=True,
    )


def group_by_launch(entries: Sequence[BugEntry]) -> list[EntryGroup]:
    """Steps entries grouped by :func:`launch_key`, in the corpus's order (a group
    where its first entry was)."""
    groups: dict[str, list[BugEntry]] = {}
    for e in entries:
        groups.setdefault(launch_key(e), []).append(e)
    return [EntryGroup(tuple(g)) for g in groups.values()]
