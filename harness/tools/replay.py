"""Re-evaluate a recorded round trip offline: the verdict without the engine.

Whether a seeded fault makes the engine misbehave needs a real server; whether the
checks turn the recorded misbehaviour into the right verdict does not. This module
rebuilds a ``RoundtripResult`` from what a run kept (``scripts/record-roundtrip-fixtures.py``
writes it: Prometheus snapshots, requests, the engine's KV-group report, the CLI args)
through the same code the live run uses (``plan_roundtrip``, ``metrics.parse``,
``size_filler``, ``make_fillers``, ``read_engine_layout``, ``evaluate``), so unit tests
can pin each fault's failing checks in milliseconds and any change to the checks, the
parser or the expected-figure rules is judged against real engine numbers.

Nothing here re-derives a figure: a replay that needed its own arithmetic would test
itself, not the harness.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer.main

from harness.cli.app import app
from harness.commands import roundtrip as rt
from harness.errors import BadInput
from harness.names import FAULTS, REPO_ROOT
from harness.scenario.roundtrip import load_roundtrip
from harness.server import metrics
from harness.server.workload import Completion, Prompt, make_fillers

DEFAULT_SCENARIO = "scenarios/roundtrip-cpu.toml"


def _cli_params(args: list[str]) -> dict[str, Any]:
    """The CLI's own option parser, so a replayed argv means what it meant to the run."""
    command = typer.main.get_command(app).commands["roundtrip"]  # type: ignore[attr-defined]
    return dict(command.make_context("roundtrip", list(args)).params)


def plan_from_args(args: list[str], root: Path = REPO_ROOT) -> rt.RoundtripPlan:
    """The plan ``offload-check roundtrip <args>`` makes, as ``harness.cli.roundtrip`` makes it.

    Relative paths resolve against the checkout, where the recording ran the CLI. Modes
    whose evidence is not in a recording are refused rather than half replayed.
    """
    p = _cli_params(args)
    for opt, what in (
        ("url", "attach mode plans from a live server"),
        ("baseline", "the baseline server's comparison is not replayed"),
        ("dry_run", "a dry run has no phases"),
    ):
        if p.get(opt):
            raise BadInput(f"cannot replay --{opt.replace('_', '-')}: {what}")
    if p["fault"] is not None and p["fault"] not in FAULTS:
        raise BadInput(f"unknown fault {p['fault']!r}; known: {', '.join(FAULTS)}")
    scenario = p["scenario"] or Path(DEFAULT_SCENARIO)
    scen = load_roundtrip(scenario if scenario.is_absolute() else root / scenario)
    if p["filler_count"] is not None:
        scen.workload.filler_count = p["filler_count"]
    config = p["config"]
    if config is not None and not config.is_absolute():
        config = root / config
    return rt.plan_roundtrip(
        scen,
        variant=p["variant"],
        patch=p["patch"],
        config=str(config) if config else None,
        tp=p["tp"],
        fault=p["fault"],
        extra_args=list(p["engine_arg"] or []),
    )


def load_completions(path: Path) -> list[Completion]:
    """``requests.jsonl`` back into Completions: its records are ``Completion.record()``."""
    return [
        Completion(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()
    ]


def _snapshot(path: Path) -> tuple[metrics.Snapshot, metrics.CacheConfig | None]:
    snap, cache, _ = metrics.parse(path.read_text())
    return snap, cache


def rebuild(plan: rt.RoundtripPlan, run: Path) -> rt.RoundtripResult:
    """The result ``execute`` would hold once the replay phase's snapshot is in.

    Follows ``execute`` and ``run_round`` step for step: engine layout first (it may
    correct the planned Mamba state), the filler sized from the start snapshot's pool
    unless the plan fixed it, then one ``PhaseResult`` per phase with its delta against
    the previous snapshot and its total against the start. Raises ``BadInput`` when the
    recorded requests are not the traffic this plan sends: the recording and the plan
    then disagree, and no verdict from it would mean anything.
    """
    result = rt.RoundtripResult(plan)
    rt.read_engine_layout(plan, result, run / "server.log")
    w = plan.scenario.workload
    start, cache = _snapshot(run / "metrics" / "start.prom")
    result.filler = rt.size_filler(plan, cache)
    result.note(result.filler.note)
    fillers = make_fillers(list(result.filler.lengths), plan.vocab_size, w.seed)
    traffic: dict[str, list[Prompt]] = {
        "cold": plan.targets,
        "warm": plan.targets,
        "filler": fillers,
        "replay": plan.targets,
    }
    completions = load_completions(run / "requests.jsonl")
    prev = start
    for phase in rt.PHASES:
        done = [c for c in completions if c.phase == phase]
        sent = [(p.name, len(p.token_ids)) for p in traffic[phase]]
        if [(c.prompt, c.prompt_tokens) for c in done] != sent:
            raise BadInput(
                f"{run}: the recorded {phase} requests "
                f"{[(c.prompt, c.prompt_tokens) for c in done]} are not the "
                f"traffic the plan sends {sent}"
            )
        result.completions.extend(done)
        result.generation_seconds += sum(c.seconds for c in done)
        text = (run / "metrics" / f"{phase}.prom").read_text()
        snap, _, _ = metrics.parse(text)
        if phase == "replay":
            result.tier_usage_after = metrics.tier_usage(snap, text)
        # Wall seconds of a phase are not evaluated; the requests' own time stands in.
        result.phases.append(
            rt.PhaseResult(
                phase, len(traffic[phase]), snap - prev, snap - start, sum(c.seconds for c in done)
            )
        )
        prev = snap
    return result


def replay(run: Path, root: Path = REPO_ROOT) -> rt.RoundtripResult:
    """Plan from the recorded CLI args, rebuild the result, and evaluate it."""
    manifest = json.loads((run / "manifest.json").read_text())
    plan = plan_from_args(manifest["cli_args"], root)
    result = rebuild(plan, run)
    result.checks = rt.evaluate(plan, result)
    return result


def failing(result: rt.RoundtripResult) -> set[str]:
    """Names of the failed checks that decide the verdict (informational ones never do)."""
    return {c.name for c in result.checks if not c.passed and not c.informational}
