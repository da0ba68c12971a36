"""``offload-check validate``: a scenario file checked as far as it can be without a launch.

Loading (pydantic) catches malformed files and unknown keys; planning goes further and
resolves what the file names (variants and their interpreters, model configs, patches,
expectation rules) and plans every round trip, refusing impossible eviction plans. A
file's kind is recognised by the keys only that kind has (``harness.scenario.kinds``).
"""

from __future__ import annotations

from pathlib import Path

from harness.commands.bugs import corpus as bugs
from harness.commands.bugs import scheduler as bug_scheduler
from harness.commands.bugs import steps as bug_steps
from harness.commands.crash_repro import load_models
from harness.commands.matrix import plan_matrix
from harness.commands.oracle.plan import plan_oracle
from harness.commands.pressure.plan import plan_pressure
from harness.commands.roundtrip import plan_roundtrip
from harness.commands.stress.plan import plan_stress
from harness.errors import HarnessError
from harness.scenario.bugs import load_bug
from harness.scenario.crash_repro import load_crash_repro
from harness.scenario.kinds import scenario_kind
from harness.scenario.matrix import load_matrix
from harness.scenario.oracle import load_oracle
from harness.scenario.pressure import load_pressure
from harness.scenario.roundtrip import load_roundtrip
from harness.scenario.schema import load_variants, read_toml
from harness.scenario.stress import load_stress


def validate(path: Path) -> tuple[str, str]:
    """The file's kind and a one-line summary of what planning found; raises
    ``HarnessError`` with one line on the first problem."""
    kind = scenario_kind(read_toml(path))
    return kind, _check(kind, path)


def _check(kind: str, path: Path) -> str:
    if kind == "bug":
        entry = load_bug(path)
        bugs.plan_targets_for([entry])
        if entry.trigger.kind == "steps":
            bug_steps.check_script(entry)
        elif entry.trigger.kind == "scheduler":
            bug_scheduler.check_case(entry)
        fixed = entry.fixed or "still open"
        return f"{entry.trigger.kind} trigger, affected {entry.affected}, fixed {fixed}"
    if kind == "stress":
        splan = plan_stress(load_stress(path))
        return (
            f"profile {splan.profile}: {len(splan.requests)} requests at concurrency "
            f"{splan.concurrency}, variant {splan.base.variant}"
        )
    if kind == "pressure":
        pplan = plan_pressure(load_pressure(path))
        n = sum(len(s.requests) for s in pplan.servers)
        return (
            f"{len(pplan.servers)} servers, {n} requests on {pplan.tier.slots} slots of "
            f"{pplan.tier.slot_bytes:,} B, every one predicted"
        )
    if kind == "oracle":
        oplan = plan_oracle(load_oracle(path))
        n = sum(len([s for s in c.steps if not s.reset]) for c in oplan.cells if not c.skip)
        return (
            f"{len(oplan.drive_cells)} drive and {len(oplan.server_cells)} server cells, "
            f"{n} requests, every one predicted"
        )
    if kind == "variants":
        return f"{len(load_variants(path))} variants"
    if kind == "matrix":
        plan = plan_matrix(load_matrix(path))
        families = len({c.family for c in plan.cells})
        tiers = len({c.tier for c in plan.cells})
        return f"{len(plan.cells)} cells over {families} families and {tiers} tiers, all planned"
    if kind == "roundtrip":
        rt = plan_roundtrip(load_roundtrip(path))
        stored = f"expects {rt.expected.stored_bytes:,} B stored"
        disk = (
            ""
            if rt.disk is None
            else ", over a disk tier across a restart"
            if rt.disk.restart
            else ", over a disk tier"
        )
        return f"variant {rt.variant}, {len(rt.targets)} targets, {stored}{disk}"

    scen = load_crash_repro(path)
    variants = load_variants(scen.resolve(scen.variants_file))
    missing = [v for v in scen.variants if v not in variants]
    if missing:
        raise HarnessError(f"{path}: variant {missing[0]!r} is not in {scen.variants_file}")
    models = load_models(scen, None)
    return (
        f"{len(scen.variants)} variants, {len(models)} models, "
        f"{len(scen.expectations)} expectation rules"
    )
