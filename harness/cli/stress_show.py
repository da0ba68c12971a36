"""What ``stress`` shows: its plan (``--dry-run``, text or ``--json``: the request plan,
the servers) and a line per server step and finished request while it runs; its plan
renderers registered with ``harness.ui.dry_run``."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from harness.cli.roundtrip_show import checks_table
from harness.commands.stress.files import STRESS_CHECKS
from harness.commands.stress.plan import StressPlan, prompt_bounds
from harness.ui import dry_run, terminal
from harness.ui.dry_run import heading, host_state, say


def stress_plan(console: Console, plan: StressPlan) -> None:
    d = plan.describe()
    base = plan.base
    heading(
        console,
        base,
        "stress plan",
        f"{d['scenario']}: profile {plan.profile}, seed {plan.seed}, "
        f"concurrency {plan.concurrency}, model {base.model_ref}, variant {base.variant}, "
        f"TP {base.tensor_parallel}",
        f"launched, no reference; the requests go to its model {base.served_name}",
    )
    per = ", ".join(f"{k} {n}" for k, n in d["requests"].items())
    bounds = prompt_bounds(plan.requests)
    longest = max(bounds[r.id] + r.max_tokens for r in plan.requests)
    say(
        console,
        f"requests: {len(plan.requests)} ({per}); longest up to {longest} tokens; "
        f"can store up to {plan.storable_tokens:,} tokens",
    )
    if plan.duration_s:
        say(
            console,
            f"duration: rounds with seeds {plan.seed}, {plan.seed + 1}, ... until "
            f"{plan.duration_s:g}s of traffic",
        )
    if plan.restarts:
        say(
            console,
            f"restarts: {plan.restarts} new server(s) on the same disk directory after the "
            f"plan, each sent its {len(plan.requests)} requests again (ids restart<k>/...), "
            "logs in logs/server-restart<k>.log",
        )
    tier = d["cpu_bytes_to_use"]
    say(
        console,
        f"patch {d['patch']}, fault {d['fault']}; offload chunk "
        f"{d['offload_tokens_per_chunk']} tokens, KV block {d['kv_block_size']}, CPU tier "
        + (f"{tier:,} B" if tier is not None else "the server's")
        + (f" over a disk tier in {plan.base.disk.dir}" if plan.base.disk else ""),
    )
    for r in plan.requests[:8]:
        extra = f" after {r.parent}" if r.parent else ""
        console.print(
            f"    {r.at_s:6.2f}s {r.id}: {len(r.prompt)} new tokens{extra}, max {r.max_tokens}",
            highlight=False,
            markup=False,
        )
    if len(plan.requests) > 8:
        console.print(f"    ... {len(plan.requests) - 8} more", highlight=False)
    if base.url is not None:
        say(console, "then the checks an attached run can make: no outputs compared")
        return
    say(
        console,
        "then the reference (connector off): round 0 again at the same concurrency "
        "(noise floor), every answered request scored alone",
    )
    if d["server_argv"]:
        console.print("  argv: " + json.dumps(d["server_argv"]), highlight=False, markup=False)
        console.print(
            "  reference argv: " + json.dumps(d["reference_argv"]), highlight=False, markup=False
        )


def stress_plan_record(plan: object) -> dict[str, Any]:
    assert isinstance(plan, StressPlan)
    base = plan.base
    return {
        "command": "stress",
        "attach": base.url,
        "launches": 0 if base.server is None else 2,
        "off_platform": base.off_platform or None,
        "host": host_state(),
        **plan.describe(),
        "request_plan": [
            {
                "id": r.id,
                "at_s": r.at_s,
                "prompt_tokens": len(r.prompt),
                "max_tokens": r.max_tokens,
                "parent": r.parent,
            }
            for r in plan.requests
        ],
    }


class StressProgress:
    """One line per server step and one per finished request (``--quiet``-free: a stress
    run is a few dozen requests, each worth seeing as it lands)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def status(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def request_done(self, outcome: Any, done: int, total: int) -> None:
        if outcome.error and not outcome.aborted:
            what = f"[red]error[/] {escape(outcome.error[:120])}"
        elif outcome.aborted:
            what = f"aborted after {len(outcome.output)} tokens"
        else:
            cached = "" if outcome.cached_tokens is None else f", {outcome.cached_tokens} cached"
            what = f"{len(outcome.prompt)} prompt{cached}, {len(outcome.output)} generated"
        self.console.print(
            f"    \\[{done}/{total}] {outcome.ended_s:6.1f}s {outcome.id}: {what}",
            highlight=False,
        )


PLAN = dry_run.register("stress_plan", stress_plan, stress_plan_record)
terminal.register_view(STRESS_CHECKS, checks_table)
