"""What ``faults`` shows of its plan (``--dry-run``, text or ``--json``): the rounds on
one server and the checks each must fail; registered with ``harness.ui.dry_run``."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

from harness.commands import faults as fs
from harness.ui import dry_run
from harness.ui.dry_run import heading, host_state, say


def faults_plan(console: Console, sweep: object) -> None:
    assert isinstance(sweep, fs.SweepPlan)
    faults = sweep.faults
    scen = sweep.base.scenario
    base = sweep.base
    heading(
        console,
        base,
        "faults",
        f"{scen.name}: {len(faults)} rounds on one server "
        f"({base.model_ref}, variant {base.variant}, TP {base.tensor_parallel})",
    )
    for i, (name, plan) in enumerate(zip(faults, sweep.plans, strict=True)):
        must = ", ".join(sorted(fs.CAUGHT_BY[name])) or "nothing (every check passes)"
        say(console, f"round {i}: {name} (seed {plan.scenario.workload.seed}) must fail: {must}")
    assert base.server is not None
    console.print("  argv: " + json.dumps(base.server.argv()), highlight=False, markup=False)


def faults_plan_record(sweep: object) -> dict[str, Any]:
    assert isinstance(sweep, fs.SweepPlan)
    rounds = [
        {
            "round": i,
            "fault": name,
            "seed": plan.scenario.workload.seed,
            "must_fail": sorted(fs.CAUGHT_BY[name]),
        }
        for i, (name, plan) in enumerate(zip(sweep.faults, sweep.plans, strict=True))
    ]
    return {
        "command": "faults",
        "scenario": sweep.base.scenario.name,
        "host": host_state(),
        "rounds": rounds,
        **sweep.describe(),
    }


PLAN = dry_run.register("faults_plan", faults_plan, faults_plan_record)
