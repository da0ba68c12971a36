"""The checks a sweep runs: each scenario's, picked by ``--check``, and the cells' counts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.commands.crash_repro import load_models
from harness.commands.matrix import matrix_check_id
from harness.commands.sweep.builds import Build
from harness.errors import BadInput
from harness.results.records import SweepCell
from harness.scenario.crash_repro import CrashReproScenario
from harness.scenario.matrix import MatrixScenario
from harness.scenario.pressure import PressureScenario
from harness.scenario.roundtrip import RoundtripScenario

KIND_CRASH_REPRO = "crash-repro"
KIND_ROUNDTRIP = "roundtrip"
KIND_MATRIX = "matrix"
KIND_PRESSURE = "pressure"
KIND_STEPS = "bug-steps"  # a bug entry's own script (harness.commands.bugs.steps)
# a bug entry's in-process scheduler drive (harness.commands.bugs.scheduler)
KIND_SCHEDULER = "bug-scheduler"

# Outcomes a cell may have besides its command's own.
UNAVAILABLE = "unavailable"  # the build could not be installed (the cell was never run)
NOT_RUN = "not-run"  # interrupted before this cell's turn
ERROR = "error"  # the harness could not judge it (a plan refused for this build, ...)
NOT_JUDGED = "not-judged"  # no one judges this check on this build: not run (the corpus)

Scenario = CrashReproScenario | RoundtripScenario | MatrixScenario | PressureScenario


@dataclass(frozen=True)
class Target:
    """A scenario and the checks of it the sweep runs (rows, cells or the round trip)."""

    kind: str
    scenario: Any  # CrashReproScenario | RoundtripScenario | MatrixScenario | BugEntry
    checks: tuple[str, ...]
    amx: str = "auto"  # "off": the builds run without the AMX permission fix (Variant.amx)

    @property
    def name(self) -> str:
        # A bug entry's own script is named by the entry (it has an id, not a name).
        return str(getattr(self.scenario, "name", None) or f"bug-{self.scenario.id}")

    @property
    def slug(self) -> str:
        return Path(str(self.scenario.source or self.name)).stem


def scenario_checks(kind: str, scenario: Any) -> list[str]:
    """Every check a scenario defines, by the id the sweep tables use.

    crash-repro: ``<model>/connector-<on|off>``; matrix: ``<family>/<geometry>`` (and
    ``/pressure`` on a tier under pressure, ``harness.commands.matrix.matrix_check_id``);
    roundtrip: ``roundtrip/<scenario name>``; pressure: ``pressure/<server>``.
    """
    if kind == KIND_CRASH_REPRO:
        return [
            f"{m.name}/connector-{mode}"
            for m in load_models(scenario, None)
            for mode in scenario.connector
        ]
    if kind == KIND_MATRIX:
        return [
            matrix_check_id(e.family, Path(e.geometry).stem, tier)
            for e in scenario.entries
            for tier in dict.fromkeys(scenario.tiers)
        ]
    if kind == KIND_PRESSURE:
        return [f"pressure/{s.name}" for s in scenario.servers]
    return [f"roundtrip/{scenario.name}"]


def selects(selector: str, check: str) -> bool:
    """``--check`` names a check by its id or by any part of it: a model, a family, a
    geometry, ``connector-on``; so ``llama4-issue-51150`` picks the model's row with the
    connector and its control without."""
    return selector == check or selector in check.split("/")


def plan_targets(scenarios: Sequence[tuple[str, Any]], selectors: Sequence[str]) -> list[Target]:
    """Each scenario with the checks ``selectors`` pick (all when none); a selector that
    picks nothing anywhere is bad input, listing what there is."""
    targets: list[Target] = []
    seen: dict[str, str] = {}
    used: set[str] = set()
    everything: list[str] = []
    for kind, scn in scenarios:
        checks = scenario_checks(kind, scn)
        everything += checks
        for c in checks:
            if c in seen:
                raise BadInput(f"check {c} is in two scenarios ({seen[c]} and {scn.name})")
            seen[c] = scn.name
        picked = [c for c in checks if not selectors or any(selects(s, c) for s in selectors)]
        used.update(s for s in selectors for c in picked if selects(s, c))
        if picked:
            targets.append(Target(kind, scn, tuple(picked)))
    unused = [s for s in selectors if s not in used]
    if unused:
        raise BadInput(f"--check {unused[0]} names no check; there are: {', '.join(everything)}")
    return targets


def unrun_cells(build: Build, targets: Sequence[Target], outcome: str, why: str) -> list[SweepCell]:
    """Every check of a build that never ran: unavailable, or cut short."""
    return [
        SweepCell(build.label, c, t.kind, t.name, outcome, why=why)
        for t in targets
        for c in t.checks
    ]


def ordered(cells: Iterable[SweepCell]) -> list[SweepCell]:
    """Cells that differ from their expectation first (the reader's first question), then
    the rest in run order."""
    return sorted(cells, key=lambda c: c.matched is not False)


def judged(cells: Iterable[Any]) -> tuple[int, int, int]:
    """(matched, not matched, not judged) counts of cells with a ``matched`` verdict."""
    cells = list(cells)
    return (
        sum(1 for c in cells if c.matched is True),
        sum(1 for c in cells if c.matched is False),
        sum(1 for c in cells if c.matched is None),
    )
