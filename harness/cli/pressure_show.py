"""What ``pressure`` shows: its plan (``--dry-run``, text or ``--json``: the tier, each
server's requests against the oracle) and a line per request while it runs; its plan
renderers registered with ``harness.ui.dry_run``."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from harness.commands.pressure.plan import PressurePlan
from harness.ui import dry_run
from harness.ui.dry_run import host_line, host_state, say
from harness.ui.terminal import mb


def pressure_plan(console: Console, plan: object) -> None:
    assert isinstance(plan, PressurePlan)
    t = plan.tier
    say(
        console,
        f"pressure plan {plan.scenario.name}: {len(plan.servers)} servers, one at a time; "
        f"model {plan.geometry_path}, variant {plan.variant} (vLLM {plan.env.vllm_version})",
        indent=0,
        bold="pressure plan",
    )
    host_line(console)
    say(
        console,
        f"tier: {t.slots} slots x {t.slot_bytes:,} B (cpu_bytes_to_use {t.cpu_bytes:,}), "
        f"chunk {t.chunk_tokens} tokens = {t.chunk_bytes:,} B moved; the GPU prefix cache off",
    )
    for s in plan.servers:
        rules = ", ".join(s.deviations) or "none"
        extra = f", mutant {s.mutant}" if s.mutant else ""
        known = f"; may fail: {', '.join(s.failing_checks)}" if s.failing_checks else ""
        say(
            console,
            f"server {s.name}: {s.policy}, store_threshold {s.store_threshold}{extra}; "
            f"deviations for vLLM {plan.env.vllm_version}: {rules}{known}",
            bold=f"server {s.name}:",
        )
        for note in s.notes:
            say(console, f"no round {note}", indent=4)
        for rnd in s.rounds:
            say(
                console,
                f"then round {rnd.round} on the same server (the tier reset, "
                + (f"policy {rnd.policy_mode}" if rnd.mutant else f"fault {rnd.fault}")
                + f", fresh prompts): must fail exactly {', '.join(sorted(rnd.must_fail))}",
                indent=4,
            )
        for r in s.requests:
            e = r.expected
            what = f"hit {e.hit}, store {len(e.stored)}"
            if e.evicted:
                what += f", evict {' '.join(e.evicted)}"
            if e.skipped:
                what += f", skip {len(e.skipped)}"
            if e.failed:
                what += ", the store fails"
            say(
                console,
                f"#{r.index} {r.label} ({len(r.prompt.token_ids)} tokens): {what}",
                indent=4,
            )


def pressure_plan_record(plan: object) -> dict[str, Any]:
    assert isinstance(plan, PressurePlan)
    return {
        "command": "pressure",
        "launches": len(plan.servers),
        "host": host_state(),
        **plan.describe(),
        "argv": {s.name: s.spec.argv(0) for s in plan.servers},
    }


class PressureProgress:
    """A line per request: what it hit, stored and loaded against the oracle, and the
    checks it failed (a pressure server is a dozen requests, each one decisive)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def status(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def request_done(self, server: str, judged: Any) -> None:
        r = judged.row
        mark = "[red]x[/]" if judged.failing else "[green]ok[/]"
        failed = f" [red]{', '.join(judged.failing)}[/]" if judged.failing else ""
        self.console.print(
            f"    {mark} {server} #{r.index} {r.request}: hit {r.ext_hits} (oracle "
            f"{r.hit_expected}), stored {mb(r.stored_bytes)}, loaded {mb(r.loaded_bytes)}"
            f"{failed}",
            highlight=False,
        )


PLAN = dry_run.register("pressure_plan", pressure_plan, pressure_plan_record)
