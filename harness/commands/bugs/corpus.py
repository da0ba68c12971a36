"""``offload-check bugs``: a corpus of real upstream bugs, each a regression row.

An entry (``scenarios/bugs/<id>.toml``, a :class:`harness.scenario.bugs.BugEntry`) names an
upstream bug, the releases it lived in and the ones with its fix (PEP 440 specifiers),
a trigger and the symptom the trigger shows on an affected build. The trigger is either
a check another scenario already defines (a crash-repro row, a matrix cell, a round
trip: the same ids ``offload-check sweep`` uses) or a short script of requests and admin
calls (``harness.commands.bugs.steps``).

A corpus run is a release sweep whose checks are the entries' triggers: builds, their
environments, one server at a time, the per-command results under ``releases/`` all come
from :mod:`harness.commands.sweep`. What this module adds is the judgement: every cell is read as
``reproduced`` (the symptom, exactly), ``passed`` (healthy) or ``error`` (anything else,
e.g. a different crash), and matched against what the entry says of that release. An
entry whose trigger stops reproducing where the bug lived, or that fails where it was
fixed, is unmatched (exit 1): the corpus cannot rot silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion

# Imported for its runner too: it registers the scripted entries' runner with the sweep.
from harness.commands.bugs import scheduler, steps
from harness.commands.bugs.groups import EntryGroup, group_by_launch
from harness.commands.pressure.replay import replayable
from harness.commands.sweep import (
    ERROR,
    KIND_SCHEDULER,
    KIND_STEPS,
    NOT_JUDGED,
    NOT_RUN,
    UNAVAILABLE,
    SweepRun,
    Target,
    judged,
    plan_targets,
)
from harness.errors import BadInput
from harness.results.records import BugCell, SweepCell
from harness.scenario.bugs import BugEntry, CheckTrigger, load_bug
from harness.scenario.kinds import load_any
from harness.scenario.rules import version_matches
from harness.server.crash_signatures import known_label

# A cell's outcome in the corpus (bugs.csv; results/README.md).
REPRODUCED = "reproduced"  # the entry's symptom, exactly
PASSED = "passed"  # healthy: started, or every check passed
SKIPPED = "skipped"  # the host lacks what the entry needs (a GPU, a CPU feature)

HEALTHY = ("started", "pass")


# --- entries ---------------------------------------------------------------------------------
def load_corpus(directory: Path, ids: Sequence[str] = ()) -> list[BugEntry]:
    """The entries of ``directory`` (all, or those ``ids`` name), sorted by id."""
    if not directory.is_dir():
        raise BadInput(f"bug corpus not found: {directory}")
    entries = {p.stem: p for p in sorted(directory.glob("*.toml"))}
    if not entries:
        raise BadInput(f"bug corpus {directory} holds no entries (*.toml)")
    unknown = [i for i in ids if i.removeprefix("#") not in entries]
    if unknown:
        raise BadInput(f"--bug {unknown[0]}: no such entry; there are: {', '.join(entries)}")
    chosen = [i.removeprefix("#") for i in ids] or list(entries)
    return [load_bug(entries[i]) for i in dict.fromkeys(chosen)]


def check_id(entry: BugEntry) -> str:
    """The sweep check an entry's trigger is: another scenario's check, or its own script."""
    if entry.trigger.kind == "check":
        return entry.trigger.check
    return f"bug/{entry.id}"


def plan_targets_for(entries: Sequence[BugEntry]) -> list[Target]:
    """The sweep targets that run every entry's trigger once: entries sharing a scenario
    share its target (one matrix run covers several cells), scripted entries asking for
    the same server share one launch, and every scheduler-level entry one drive process
    (:mod:`harness.commands.bugs.groups`)."""
    targets: list[Target] = []
    scripted = [e for e in entries if e.trigger.kind == "steps"]
    for group in group_by_launch(scripted):
        targets.append(Target(KIND_STEPS, group, tuple(check_id(e) for e in group.entries)))
    driven = tuple(e for e in entries if e.trigger.kind == "scheduler")
    if driven:
        targets.append(Target(KIND_SCHEDULER, EntryGroup(driven), tuple(map(check_id, driven))))
    by_file: dict[tuple[Path, str], list[str]] = {}
    for e in entries:
        if not isinstance(e.trigger, CheckTrigger):
            continue
        path = e.resolve(e.trigger.scenario)
        by_file.setdefault((path, e.trigger.amx), []).append(e.trigger.check)
    for (path, amx), checks in by_file.items():
        kind, scenario = load_any(path)
        if kind not in ("crash-repro", "matrix", "roundtrip", "pressure"):
            raise BadInput(f"{path}: a {kind} file has no checks to trigger a bug")
        try:
            (target,) = plan_targets([(kind, scenario)], checks)
        except BadInput as err:
            raise BadInput(f"{path}: {err}") from None
        exact = tuple(c for c in target.checks if c in checks)
        missing = [c for c in checks if c not in exact]
        if missing:
            raise BadInput(f"{path}: check {missing[0]} is not an id there (give a whole id)")
        targets.append(Target(kind, scenario, exact, amx=amx))
    return targets


def is_pressure_trigger(entry: BugEntry) -> bool:
    """Whether the entry's trigger is a server of a pressure scenario."""
    if not isinstance(entry.trigger, CheckTrigger):
        return False
    kind, _ = load_any(entry.resolve(entry.trigger.scenario))
    return kind == "pressure"


def replays_manager(label: str) -> bool:
    """Whether a build's pressure servers can be judged by replaying its own manager
    (``pressure --replay``: a release from 0.31; a build not named by its version cannot
    be told, and is left to a server)."""
    try:
        return replayable(label)
    except InvalidVersion:
        return False


def host_lacks(entry: BugEntry, flags: Iterable[str], has_gpu: bool) -> str:
    """Why this host cannot run the entry ("" when it can): what it ``requires``, and the
    CPU flags of its ``platform``."""
    have = set(flags) | ({"gpu"} if has_gpu else set())
    needed = [*entry.requires, *(entry.platform.cpu_flags if entry.platform else [])]
    missing = [r for r in dict.fromkeys(needed) if r not in have]
    return f"needs {', '.join(missing)}, which this host lacks" if missing else ""


def off_platform(entry: BugEntry, device: str) -> str:
    """Why the entry says nothing of a build on ``device`` ("" when it does): a bug in
    one device's code (a CPU kernel) neither lives nor is fixed on another's."""
    p = entry.platform
    if p is None or not p.device or device in p.device:
        return ""
    return f"no expectation on {device}: the bug holds only on {p.describe()}"


# --- judging ---------------------------------------------------------------------------------
def expected_on(entry: BugEntry, version: str) -> str:
    """What the entry says of a build of this vLLM version: ``reproduced`` where the bug
    lives, ``passed`` where it is fixed, "" where it says neither (not judged)."""
    if version and version_matches(version, entry.affected):
        return REPRODUCED
    if version and entry.fixed is not None and version_matches(version, entry.fixed):
        return PASSED
    return ""


def symptom_seen(entry: BugEntry, cell: SweepCell) -> str:
    """ "" when the cell shows the entry's symptom exactly, else what differs."""
    s = entry.symptom
    outcome = cell.outcome.split(", ")[-1]  # a matrix cell reads "started, fail"
    if outcome != s.outcome:
        return f"{outcome}, not {s.outcome}"
    if s.known is not None and cell.known != known_label(s.known):
        return f"a crash other than {known_label(s.known)}: {cell.signature or 'unnamed'}"
    if s.error and s.error not in f"{cell.signature} {cell.why}":
        return f"the signature lacks {s.error!r}: {cell.signature or '(none)'}"
    failing = sorted(f for f in cell.failing.split(",") if f)
    if s.outcome == "fail" and failing != sorted(s.failing_checks):
        return f"failing {failing}, not {sorted(s.failing_checks)}"
    return ""


def judge(entry: BugEntry, cell: SweepCell) -> BugCell:
    """The trigger's cell read as the entry's outcome, and matched against the entry."""
    out = BugCell(
        bug=entry.id,
        release=cell.release,
        outcome=cell.outcome,
        observed=cell.state,
        signature=cell.signature,
        detail=cell.detail,
        check=cell.check,
        vllm_version=cell.vllm_version,
        seconds=cell.seconds,
        run_dir=cell.run_dir,
        why=cell.why,
    )
    if cell.outcome in (UNAVAILABLE, NOT_RUN, SKIPPED, NOT_JUDGED):
        return out
    if cell.outcome.split(", ")[-1] == "skipped":  # a crash-repro row the host cannot run
        out.outcome = SKIPPED
        return out
    out.expected = expected_on(entry, cell.vllm_version)
    differs = symptom_seen(entry, cell)
    if not differs:
        out.outcome = REPRODUCED
    elif cell.outcome.split(", ")[-1] in HEALTHY:
        out.outcome = PASSED
    else:
        out.outcome = ERROR
        out.why = cell.why or f"neither the symptom nor healthy: {differs}"
    if not out.expected:
        out.matched = None
        out.why = out.why or "the entry names neither affected nor fixed for this version"
    elif out.outcome == out.expected:
        out.matched = True
    else:
        out.matched = False
        if out.outcome == PASSED:
            out.why = "did not reproduce on a release the bug lived in"
        elif out.outcome == REPRODUCED:
            out.why = "reproduced on a release with the fix"
        else:
            out.why = f"expected {out.expected}: {out.why}"
    return out


def judge_all(entries: Sequence[BugEntry], cells: Iterable[SweepCell]) -> list[BugCell]:
    """Every entry's cells, in entry then run order; a check shared by two entries is
    judged once for each."""
    cells = list(cells)
    out = []
    for e in entries:
        cid = check_id(e)
        out += [judge(e, c) for c in cells if c.check == cid]
    return out


def skipped_cells(entry: BugEntry, builds: Sequence[str], why: str) -> list[BugCell]:
    return [BugCell(entry.id, b, SKIPPED, why=why, check=check_id(entry)) for b in builds]


def reproduction(entry: BugEntry, releases: Sequence[str] = ()) -> str:
    """The one command that reruns the entry on the newest release it lived in and the
    first with its fix, of ``releases`` (the installable ones); ``all`` without them."""
    lived = [r for r in releases if expected_on(entry, r) == REPRODUCED]
    fixed = [r for r in releases if expected_on(entry, r) == PASSED]
    pick = ([lived[-1]] if lived else []) + ([fixed[0]] if fixed else [])
    return f"offload-check bugs --bug {entry.id} --releases {','.join(pick) or 'all'}"


def counts(cells: Iterable[BugCell]) -> tuple[int, int, int]:
    """(matched, not matched, not judged), counted as a sweep's cells are."""
    return judged(cells)


# --- a corpus run --------------------------------------------------------------------------------
@dataclass
class CorpusRun:
    """The entries, the sweep that runs their triggers, and the entries this host skips."""

    entries: list[BugEntry]
    sweep: Any  # harness.commands.sweep.SweepRun over the triggers of the entries not skipped
    skipped: dict[str, str]  # entry id -> why this host cannot run it
    # (entry id, build label) -> why the entry says nothing of that build (its device)
    off_platform: dict[tuple[str, str], str] = field(default_factory=dict)

    def cells(self) -> list[BugCell]:
        """Every (entry, build) judged so far, entry by entry."""
        builds = [b.label for b in self.sweep.builds]
        run = [e for e in self.entries if e.id not in self.skipped]
        judged = judge_all(run, self.sweep.cells)
        out: list[BugCell] = []
        for e in self.entries:
            if e.id in self.skipped:
                out += skipped_cells(e, builds, self.skipped[e.id])
                continue
            for c in judged:
                if c.bug == e.id:
                    why = self.off_platform.get((e.id, c.release))
                    out.append(
                        BugCell(e.id, c.release, SKIPPED, why=why, check=c.check) if why else c
                    )
        return out

    def judge_cell(self, cell: SweepCell) -> list[BugCell]:
        """The entries one trigger's cell decides, judged (progress lines)."""
        run = [
            e
            for e in self.entries
            if e.id not in self.skipped and (e.id, cell.release) not in self.off_platform
        ]
        return judge_all([e for e in run if check_id(e) == cell.check], [cell])


def plan_corpus(
    entries: Sequence[BugEntry],
    builds: Sequence[Any],
    dist: str,
    flags: Iterable[str],
    has_gpu: bool,
    devices: Mapping[str, str] | None = None,
    serverless: Mapping[str, str] | None = None,
) -> CorpusRun:
    """The sweep of the entries' triggers on ``builds`` (``harness.commands.sweep.Build``); entries
    needing what the host lacks are skipped, with the reason, and run on no build. An
    entry whose ``platform`` names devices is skipped on builds of other ``devices``
    (build label -> device; CPU where not given), and not run when that is every build.
    On ``serverless`` builds (label -> why) only scheduler-level triggers run; the
    other entries are named there with the reason, and their targets not run."""
    flags = set(flags)
    device = {b.label: (devices or {}).get(b.label, "cpu") for b in builds}
    skipped = {e.id: why for e in entries if (why := host_lacks(e, flags, has_gpu))}
    off = {
        (e.id, label): why
        for e in entries
        if e.id not in skipped
        for label, on in device.items()
        if (why := off_platform(e, on))
    }
    # Builds that can run no server (label -> why): only scheduler-level triggers there,
    # and pressure servers of a release whose manager the replay judges.
    replayable = {e.id for e in entries if is_pressure_trigger(e)}
    for e in entries:
        for label, why in (serverless or {}).items():
            if e.id in skipped or e.trigger.kind == "scheduler":
                continue
            if e.id in replayable and replays_manager(label):
                continue
            off.setdefault((e.id, label), why)
    for e in entries:
        if e.id not in skipped and device and all((e.id, b) in off for b in device):
            skipped[e.id] = off[(e.id, next(iter(device)))]
    runnable = [e for e in entries if e.id not in skipped]
    for e in runnable:
        if e.trigger.kind == "steps":
            steps.check_script(e)
        elif e.trigger.kind == "scheduler":
            scheduler.check_case(e)
    targets = plan_targets_for(runnable) if runnable else []
    off = {k: why for k, why in off.items() if k[0] not in skipped}
    sweep_run = SweepRun(list(builds), targets, dist, narrow=judged_checks(runnable, off))
    return CorpusRun(list(entries), sweep_run, skipped, off)


def judged_checks(
    entries: Sequence[BugEntry], off: Mapping[tuple[str, str], str] | None = None
) -> Callable[[Any, Target], tuple[str, ...]]:
    """For the sweep: the checks of a target some entry judges on a build. A release
    every entry of a check names neither affected nor fixed is not run for it (its cell
    would only say "not judged"); a user's build, whose version is known only once its
    environment is made, runs everything."""

    def narrow(build: Any, target: Target) -> tuple[str, ...]:
        if not build.release:
            return target.checks
        return tuple(
            c
            for c in target.checks
            if any(
                check_id(e) == c
                and expected_on(e, build.label)
                and (e.id, build.label) not in (off or {})
                for e in entries
            )
        )

    return narrow
