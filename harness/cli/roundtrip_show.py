"""What ``roundtrip`` shows: its plan (``--dry-run``, text or ``--json``), a line per
phase and request while it runs, and its phase and check tables (live, and ``report``'s
from ``phases.csv`` and ``checks.csv``, which stress and the bug corpus's scripted
triggers write too); registered with ``harness.ui.dry_run`` and ``harness.ui.terminal``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.commands.roundtrip import RoundtripPlan
from harness.commands.roundtrip.files import CHECKS, PHASE_TABLE, SPEED_TABLE, percent, rate
from harness.ui import dry_run, terminal
from harness.ui.dry_run import heading, host_state, say
from harness.ui.terminal import mb


def roundtrip_plan(console: Console, plan: RoundtripPlan) -> None:
    what = f"model {plan.model_ref}, variant {plan.variant}, TP {plan.tensor_parallel}"
    sent = f"the targets, filler and replay are sent to its model {plan.served_name}"
    attached = f"launched; {sent}, the pool and KV block read from its /metrics"
    heading(console, plan, "roundtrip plan", f"{plan.scenario.name}: {what}", attached)
    d, exp = plan.describe(), plan.expected
    kinds = ", ".join(
        f"{k.kind} x{k.layers} {k.bytes_per_token:,} B/token"
        + (f" window {k.window}" if k.window else "")
        for k in exp.layout
    )
    say(
        console,
        f"KV layout: {kinds or 'unknown'}; offload chunk {exp.tokens_per_chunk} "
        f"tokens, KV block {exp.kv_block_size}",
    )
    if exp.mamba_state_bytes:
        say(console, f"Mamba state {exp.mamba_state_bytes:,} B over all Mamba layers")
    for t in exp.targets:
        need = ", ".join(f"{kind} {n}" for kind, n in t.loaded_by_kind.items())
        say(
            console,
            f"{t.name}: {t.prompt_tokens} tokens -> stores {t.stored_tokens}, "
            f"replay hit {t.hit_tokens}; each layer loads back ({need}) "
            f"= {t.loaded_bytes:,} B",
        )
    say(
        console,
        f"expected: stored {exp.stored_bytes:,} B, loaded {exp.loaded_bytes:,} B, "
        f"external hits {exp.hit_tokens} tokens",
    )
    tier = (
        f"; CPU tier capacity ~{plan.cpu_capacity_tokens} tokens"
        if plan.cpu_capacity_tokens is not None
        else "; the CPU tier is the server's"
    )
    say(
        console,
        f"filler: sized at launch from the live pool x "
        f"{1 + plan.scenario.workload.filler_margin:g}{tier}",
    )
    if plan.disk is not None:
        served = (
            "a new server over the same directory serves the replay"
            if plan.disk.restart
            else "the CPU tier holds only the targets, so the replay reads them back from disk"
            if plan.disk.from_disk
            else "the CPU tier serves the replay"
        )
        fault = "" if plan.disk.fault == "none" else f"; seeded disk fault {plan.disk.fault}"
        say(console, f"disk tier (vLLM's fs tier) in {plan.disk.dir}: {served}{fault}")
    for note in plan.notes:
        say(console, f"note: {note}")
    if plan.server is not None:
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(plan.server.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(d["server_argv"]), highlight=False, markup=False)


def roundtrip_plan_record(plan: object) -> dict[str, Any]:
    assert isinstance(plan, RoundtripPlan)
    return {
        "command": "roundtrip",
        "scenario": plan.scenario.name,
        "attach": plan.url,
        "launches": 0 if plan.server is None else 1,
        "off_platform": plan.off_platform or None,
        "host": host_state(),
        **plan.describe(),
    }


class RoundtripProgress:
    """Plain lines: a round trip is a handful of phases, each worth a line."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def status(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def request_done(self, completion: Any) -> None:
        if completion.phase != "filler":
            self.console.print(
                f"    {completion.phase} {completion.prompt}: "
                f"{completion.prompt_tokens} tokens in {completion.seconds:.2f}s",
                highlight=False,
                markup=False,
            )

    def phase_done(self, phase: Any) -> None:
        d = phase.delta
        self.console.print(
            f"  phase {phase.phase}: {phase.requests} requests, stored {mb(d.stored_bytes)}, "
            f"loaded {mb(d.loaded_bytes)}, gpu_hits {int(d.gpu_hits)}, ext_hits "
            f"{int(d.ext_hits)}/{int(d.ext_queries)} ({phase.seconds:.1f}s)",
            highlight=False,
            markup=False,
        )


def phase_table(phases: Sequence[dict[str, Any]]) -> Table:
    """The PR's phase table from phase records (``phases.csv`` rows): deltas, cumulative."""
    table = Table(title="phases (delta | cumulative)", header_style="bold")
    for col in (
        "phase",
        "requests",
        "stored",
        "loaded",
        "gpu_hits",
        "ext_hits/queries",
        "cum stored",
        "cum loaded",
        "cum ext_hits/queries",
    ):
        table.add_column(col, justify="right" if col != "phase" else "left")
    for p in phases:
        table.add_row(
            str(p["phase"]),
            str(p["requests"]),
            mb(p["d_stored_bytes"]),
            mb(p["d_loaded_bytes"]),
            f"{int(p['d_gpu_hits'])}",
            f"{int(p['d_ext_hits'])}/{int(p['d_ext_queries'])}",
            mb(p["cum_stored_bytes"]),
            mb(p["cum_loaded_bytes"]),
            f"{int(p['cum_ext_hits'])}/{int(p['cum_ext_queries'])}",
        )
    return table


def checks_table(checks: Sequence[dict[str, Any]]) -> Table:
    """Checks from their records (``checks.csv`` rows), informational ones last."""
    table = Table(title="checks", header_style="bold", show_lines=True)
    for col in ("check", "expected", "observed", "result", "why"):
        table.add_column(col, overflow="fold")
    for c in sorted(checks, key=lambda c: bool(c.get("informational"))):
        passed = str(c["passed"]) == "True"
        if str(c.get("informational")) == "True":
            result = Text("same" if passed else "differs", style="cyan")
        else:
            result = Text("pass", style="green") if passed else Text("FAIL", style="bold red")
        detail = c.get("detail")
        detail = "" if detail is None or detail != detail else str(detail)  # NaN from CSV
        why = str(c["why"]) + (f"\n[{detail}]" if detail else "")
        table.add_row(str(c["name"]), str(c["expected"]), str(c["observed"]), result, Text(why))
    return table


def speed_table(rows: Sequence[dict[str, Any]]) -> Table:
    """vLLM's offload rate beside one bulk copy of the same bytes (``offload-speed.csv``)."""
    first = rows[0] if rows else {}
    table = Table(
        title=f"offload speed on {first.get('device', '?')}: vLLM's workers vs one bulk copy "
        f"of {mb(first.get('copy_bytes', 0))}",
        header_style="bold",
        caption=str(first.get("copy", "")),
    )
    for col in ("phase", "direction", "bytes", "vLLM s", "vLLM rate", "bulk copy", "ratio"):
        table.add_column(col, justify="left" if col in ("phase", "direction") else "right")
    for r in rows:
        table.add_row(
            str(r["phase"]),
            str(r["direction"]),
            mb(r["bytes"]),
            f"{float(r['seconds']):.3f}",
            rate(r.get("gbps")),
            rate(r.get("copy_gbps")),
            percent(r.get("ratio")),
        )
    return table


PLAN = dry_run.register("roundtrip_plan", roundtrip_plan, roundtrip_plan_record)
terminal.register_view(PHASE_TABLE, phase_table)
terminal.register_view(CHECKS, checks_table)
terminal.register_view(SPEED_TABLE, speed_table)
