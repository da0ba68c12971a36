"""``offload-check sweep``: the harness's checks on every vLLM build, and where they change.

A sweep answers "which releases are affected, since when, fixed where?". It runs the
checks other commands define (crash-repro rows, matrix cells, round trips) on each build
in turn, one server at a time, each build in its own environment
(``harness.server.release_envs``), and judges every result by the scenario's own expectation
rules: those carry PEP 440 specifiers on the vLLM version (``vllm = "<0.28.0"``), so one
table of rules serves a three-variant run and a sweep over thirty releases alike.

Each (build, scenario) pair is run by the command that owns it and leaves that
command's own results directory under ``releases/<build>/<scenario>/``; the sweep's
tables only summarise them. Along the releases, in version order, each check's results
fall into spans of equal outcome; the first release of a span is where it changed
(:func:`transitions`). :func:`bisect` finds one such change by building only about
log2(N) environments.

Nothing here prints or parses options: the CLI hands over, the reporter shows progress.

The package, by step: :mod:`.builds` (the builds), :mod:`.targets` (the checks, by
``--check``), :mod:`.plan` (both from the command line's words), :mod:`.runners` (each kind
of target on one build), :mod:`.judge` (expectations by version), :mod:`.run` (the sweep
as it goes, a bisect's launches), :mod:`.spans` (transitions along the releases, the
bisect's search) and
:mod:`.shards` (CI shards merged back into one sweep).
"""

from harness.commands.sweep.builds import Build, build_device, build_label, cuda_build, plan_builds
from harness.commands.sweep.files import read_cells
from harness.commands.sweep.judge import expected_for, judge_roundtrip, roundtrip_detail
from harness.commands.sweep.plan import choose_builds, load_targets
from harness.commands.sweep.run import (
    SweepRun,
    bisect_target,
    env_record,
    execute_bisect,
    execute_sweep,
    run_build,
)
from harness.commands.sweep.runners import (
    RUNNERS,
    Job,
    Runner,
    SweepReporter,
    run_target,
    variant_for,
    with_message,
)
from harness.commands.sweep.shards import merge
from harness.commands.sweep.spans import (
    HEALTHY,
    BisectResult,
    Span,
    Transition,
    bisect,
    transitions,
)
from harness.commands.sweep.targets import (
    ERROR,
    KIND_CRASH_REPRO,
    KIND_MATRIX,
    KIND_ROUNDTRIP,
    KIND_SCHEDULER,
    KIND_STEPS,
    NOT_JUDGED,
    NOT_RUN,
    UNAVAILABLE,
    Scenario,
    Target,
    judged,
    ordered,
    plan_targets,
    scenario_checks,
    selects,
    unrun_cells,
)
from harness.results.records import SweepCell

__all__ = [
    "ERROR",
    "HEALTHY",
    "KIND_CRASH_REPRO",
    "KIND_MATRIX",
    "KIND_ROUNDTRIP",
    "KIND_SCHEDULER",
    "KIND_STEPS",
    "NOT_JUDGED",
    "NOT_RUN",
    "RUNNERS",
    "UNAVAILABLE",
    "BisectResult",
    "Build",
    "Job",
    "Runner",
    "Scenario",
    "Span",
    "SweepCell",
    "SweepReporter",
    "SweepRun",
    "Target",
    "Transition",
    "bisect",
    "bisect_target",
    "build_device",
    "build_label",
    "choose_builds",
    "cuda_build",
    "env_record",
    "execute_bisect",
    "execute_sweep",
    "expected_for",
    "judge_roundtrip",
    "judged",
    "load_targets",
    "merge",
    "ordered",
    "plan_builds",
    "plan_targets",
    "read_cells",
    "roundtrip_detail",
    "run_build",
    "run_target",
    "scenario_checks",
    "selects",
    "transitions",
    "unrun_cells",
    "variant_for",
    "with_message",
]
