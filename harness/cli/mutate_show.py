"""What ``mutate`` shows of its plan (``--dry-run``, text or ``--json``): the file, the
mutants chosen and the commands each runs through, or the shards a merge reads;
registered with ``harness.ui.dry_run``."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from harness.commands.mutate.plan import MergePlan, MutatePlan
from harness.ui import dry_run
from harness.ui.dry_run import host_line, host_state, say


def mutate_plan(console: Console, plan: object) -> None:
    if isinstance(plan, MergePlan):
        say(console, f"mutate: merge {len(plan.runs)} shard sessions into one report", 0, "bold")
        for run in plan.runs:
            say(console, str(run))
        return
    assert isinstance(plan, MutatePlan)
    chosen = (
        "all" if plan.sample_size is None else f"a sample of {plan.sample_size} (seed {plan.seed})"
    )
    say(
        console,
        f"mutate plan: {plan.module} of vLLM {plan.vllm_version} ({plan.python})",
        0,
        "bold",
    )
    host_line(console)
    say(
        console, f"file: {plan.relpath} (sha256 {plan.sha256[:12]}), {plan.total} mutants; {chosen}"
    )
    which = "every one" if plan.run_unreached else "only those that ran its line"
    say(
        console,
        "commands, in order (the first that fails a mutant kills it): "
        + ", ".join(c.name for c in plan.commands)
        + "; each first once on the unmutated build with line coverage, and a mutant "
        + f"through {which}; {plan.timeout_s:g}s a command",
    )
    if plan.shard:
        say(console, f"shard {plan.shard[0]}/{plan.shard[1]}: the mutants whose id falls there")
    if plan.resume:
        say(console, f"resumes {plan.resume}")
    for m in plan.mutants:
        console.print(f"    {m.id} {m.one_line()}", highlight=False, markup=False)


def mutate_plan_record(plan: object) -> dict[str, Any]:
    if isinstance(plan, MergePlan):
        return {"command": "mutate", "merge": [str(r) for r in plan.runs], "launches": 0}
    assert hasattr(plan, "describe")
    return {"command": "mutate", "host": host_state(), **plan.describe()}


PLAN = dry_run.register("mutate_plan", mutate_plan, mutate_plan_record)
