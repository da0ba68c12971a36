"""CI shards (one release each) merged back into one sweep (``sweep --merge``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.commands.sweep.builds import Build
from harness.commands.sweep.files import read_cells
from harness.commands.sweep.run import SweepRun
from harness.results.records import SweepCell


def merge(run_dirs: Sequence[Path]) -> SweepRun:
    """One sweep from several (CI shards, one release each): builds in version order,
    user builds after; a (build, check) run twice keeps the later directory's cell."""
    cells: dict[tuple[str, str], SweepCell] = {}
    envs: dict[str, dict[str, Any]] = {}
    for d in run_dirs:
        found, found_envs = read_cells(d)
        for c in found:
            cells[(c.release, c.check)] = c
        for e in found_envs:
            envs[str(e["release"])] = e
    labels = list(dict.fromkeys([c.release for c in cells.values()] + list(envs)))

    def version(label: str) -> Version | None:
        try:
            return Version(label)
        except InvalidVersion:
            return None

    releases = sorted(
        (lb for lb in labels if version(lb) is not None),
        key=lambda lb: version(lb) or Version("0"),
    )
    others = [lb for lb in labels if version(lb) is None]
    builds = [Build(lb, lb, True) for lb in releases] + [Build(lb, lb, False) for lb in others]
    run = SweepRun(builds, [], dist="")
    order = {b.label: i for i, b in enumerate(builds)}
    run.cells = sorted(cells.values(), key=lambda c: (order[c.release], c.check))
    run.envs = [envs[b.label] for b in builds if b.label in envs]
    return run
