"""A sweep planned from what the command line names: scenario files and ``--check``
selectors become targets, ``--releases`` and ``--build`` the builds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.commands.sweep.builds import Build, plan_builds
from harness.commands.sweep.targets import Target, plan_targets
from harness.errors import HarnessError
from harness.scenario.kinds import load_any
from harness.server.release_envs import known_releases


def load_targets(paths: Sequence[Path], selectors: Sequence[str]) -> list[Target]:
    """The scenario files (crash-repro, roundtrip, matrix or pressure), each with the checks
    ``selectors`` pick (all when none); any other kind of file is bad input."""
    loaded = []
    for path in paths:
        kind, scenario = load_any(path)
        if kind not in ("crash-repro", "roundtrip", "matrix", "pressure"):
            raise HarnessError(f"{path}: a {kind} file is not a scenario to sweep")
        loaded.append((kind, scenario))
    return plan_targets(loaded, selectors)


def choose_builds(releases: str | None, builds: Sequence[str], dist: str) -> list[Build]:
    """The builds of a run over many: the releases ``releases`` names (every known one
    when neither releases nor builds are given), then the user's builds."""
    chosen = releases if releases is not None else (None if builds else "all")
    known = known_releases(dist) if chosen else []
    return plan_builds(chosen, builds, known)
