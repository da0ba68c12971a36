"""What ``--dry-run`` prints: the plan of each command, and the exact argv and environment
of every server it would launch, so a user can check (or rerun by hand) before anything
starts. Planning happened already; this module only renders it."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console


def host_line(console: Console) -> None:
    """The environment fixes every server gets on this host (dry-runs show them)."""
    from harness.engine.amx import planned_state
    from harness.names import ENV_AMX

    state = planned_state()
    why = {
        "requested": "AMX tile permission requested in every vLLM process (vLLM's CPU "
        f"attention needs it and never asks; {ENV_AMX}=off to reproduce that)",
        "off": f"AMX present but {ENV_AMX}=off: vLLM's CPU attention may die by SIGILL",
        "not-needed": "no AMX on this CPU: nothing to request",
    }[state]
    console.print(
        f"  host: amx_permission={state} ({why}); servers run with PYTHONFAULTHANDLER=1",
        highlight=False,
    )


def crash_repro_plan(console: Console, plan: object) -> None:
    from harness.commands.crash_repro import RunPlan, backends, launch_count
    from harness.server.crash_signatures import known_label

    assert isinstance(plan, RunPlan)
    skipped = sum(1 for r in plan.rows if r.skip_reason)
    launches = launch_count(plan.rows)
    shared = len(plan.rows) - skipped - launches
    console.print(
        f"[bold]scenario[/] {plan.scenario.name}: {len(plan.rows)} rows, {launches} launches, "
        "one at a time"
        + (f"; {shared} rows share a launch with an identical server" if shared else "")
        + (f" ({skipped} rows skipped on this host)" if skipped else "")
    )
    first_of: dict[str, str] = {}
    host_line(console)
    for n, env in plan.environments.items():
        console.print(
            f"  variant {n}: vLLM {env.vllm_version} ({env.vllm_dist}) on "
            f"{env.device}, offload backend {backends(plan)[n]}, python {env.python}",
            highlight=False,
        )
    for row in plan.rows:
        exp = row.expected + (f" ({known_label(row.expected_known)})" if row.expected_known else "")
        console.print(f"[bold]{row.key}[/] expect {exp}", highlight=False)
        if row.skip_reason:
            console.print(f"  skipped on this host: {row.skip_reason}", highlight=False)
        else:
            key = row.plan.launch_key()
            if key in first_of:
                console.print(
                    f"  same server as {first_of[key]}: served by its launch", highlight=False
                )
            first_of.setdefault(key, row.key)
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(row.plan.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(row.plan.argv()), highlight=False, markup=False)


def roundtrip_plan(console: Console, plan: object) -> None:
    from harness.commands.roundtrip import RoundtripPlan

    assert isinstance(plan, RoundtripPlan)
    d = plan.describe()
    exp = plan.expected
    console.print(
        f"[bold]roundtrip plan[/] {plan.scenario.name}: model {plan.model_ref}, "
        f"variant {plan.variant}, TP {plan.tensor_parallel}",
        highlight=False,
    )
    host_line(console)
    kinds = ", ".join(
        f"{k.kind} x{k.layers} {k.bytes_per_token:,} B/token"
        + (f" window {k.window}" if k.window else "")
        for k in exp.layout
    )
    console.print(
        f"  KV layout: {kinds or 'unknown'}; offload chunk {exp.tokens_per_chunk} "
        f"tokens, KV block {exp.kv_block_size}",
        highlight=False,
    )
    if exp.mamba_state_bytes:
        console.print(
            f"  Mamba state {exp.mamba_state_bytes:,} B over all Mamba layers", highlight=False
        )
    for t in exp.targets:
        need = ", ".join(f"{kind} {n}" for kind, n in t.loaded_by_kind.items())
        console.print(
            f"  {t.name}: {t.prompt_tokens} tokens -> stores {t.stored_tokens}, "
            f"replay hit {t.hit_tokens}; each layer loads back ({need}) "
            f"= {t.loaded_bytes:,} B",
            highlight=False,
        )
    console.print(
        f"  expected: stored {exp.stored_bytes:,} B, loaded {exp.loaded_bytes:,} B, "
        f"external hits {exp.hit_tokens} tokens",
        highlight=False,
    )
    console.print(
        f"  filler: sized at launch from the live pool x "
        f"{1 + plan.scenario.workload.filler_margin:g}; CPU tier capacity "
        f"~{plan.cpu_capacity_tokens} tokens",
        highlight=False,
    )
    for note in plan.notes:
        console.print(f"  note: {note}", highlight=False)
    if plan.server is not None:
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(plan.server.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(d["server_argv"]), highlight=False, markup=False)


def matrix_plan(console: Console, plan: object) -> None:
    from harness.commands import matrix as mx

    assert isinstance(plan, mx.MatrixPlan)
    scen = plan.scenario
    console.print(
        f"[bold]matrix[/] {scen.name}: {len(plan.cells)} cells, one server at a time",
        highlight=False,
    )
    for cell in plan.cells:
        assert cell.plan is not None
        exp = cell.plan.expected
        console.print(
            f"  {cell.key} (vLLM {cell.vllm_version}): expect "
            f"{cell.expected_text()}; plan stores {exp.stored_bytes:,} B, loads "
            f"{exp.loaded_bytes:,} B, hits {exp.hit_tokens} tokens",
            highlight=False,
            markup=False,
        )


def faults_plan(console: Console, sweep: object) -> None:
    from harness.commands import faults as fs

    assert isinstance(sweep, fs.SweepPlan)
    faults = sweep.faults
    scen = sweep.base.scenario
    base = sweep.base
    console.print(
        f"[bold]faults[/] {scen.name}: {len(faults)} rounds on one server "
        f"({base.model_ref}, variant {base.variant}, TP {base.tensor_parallel})",
        highlight=False,
    )
    host_line(console)
    for i, (name, plan) in enumerate(zip(faults, sweep.plans, strict=True)):
        must = ", ".join(sorted(fs.CAUGHT_BY[name])) or "nothing (every check passes)"
        console.print(
            f"  round {i}: {name} (seed {plan.scenario.workload.seed}) must fail: {must}",
            highlight=False,
            markup=False,
        )
    assert base.server is not None
    console.print("  argv: " + json.dumps(base.server.argv()), highlight=False, markup=False)


def _build_lines(console: Console, run: Any) -> None:
    """Each build of a sweep and whether its environment exists yet."""
    from harness.server import release_envs as renv

    existing = {e.name: e for e in renv.list_envs(measure=False)}
    for b in run.builds:
        if b.release:
            name = renv.env_name(run.dist, b.spec)
            entry = existing.get(name)
            state = "ready" if entry and entry.complete else "to create"
            where = f"{renv.envs_dir() / name}"
        else:
            state, where = "your build", b.spec
        console.print(f"  build {b.label}: {state} ({where})", highlight=False, markup=False)


def bugs_plan(console: Console, run: object) -> None:
    """The entries (trigger, ranges, why skipped), the builds, what each entry expects on
    each release, and the command that reruns each."""
    from rich.table import Table

    from harness.commands.bugs import corpus as bugs

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    console.print(
        f"[bold]bugs[/] (dry run): {len(run.entries)} entries x {len(sweep.builds)} build(s), "
        "one server at a time",
        highlight=False,
    )
    host_line(console)
    _build_lines(console, sweep)
    table = Table(title="expected (from each entry's ranges)", header_style="bold")
    for h in ("bug", "trigger", *[b.label for b in sweep.builds]):
        table.add_column(h, overflow="fold")
    for e in run.entries:
        trig = e.trigger
        what = trig.check if trig.kind == "check" else f"{len(trig.steps)} steps"
        if e.id in run.skipped:
            cells = ["skipped"] * len(sweep.builds)
        else:
            cells = [
                "skipped"
                if (e.id, b.label) in run.off_platform
                else (bugs.expected_on(e, b.label) or "-")
                if b.release
                else "(by its version)"
                for b in sweep.builds
            ]
        table.add_row(e.id, what, *cells)
    console.print(table)
    for e in run.entries:
        why = f" (skipped: {run.skipped[e.id]})" if e.id in run.skipped else ""
        console.print(f"  {e.id}: {e.title}{why}", highlight=False, markup=False)
        console.print(
            f"    {bugs.reproduction(e, sweep.release_order)}", highlight=False, markup=False
        )


def sweep_plan(console: Console, run: object) -> None:
    """The builds (and whether their environment exists), the checks, and what the
    scenarios' rules expect of each check on each release."""
    from rich.table import Table

    from harness.commands import sweep as sw

    assert isinstance(run, sw.SweepRun)
    console.print(
        f"[bold]sweep[/] (dry run): {len(run.builds)} build(s), "
        f"{sum(len(t.checks) for t in run.targets)} check(s), one server at a time",
        highlight=False,
    )
    host_line(console)
    _build_lines(console, run)
    table = Table(title="expected (from the scenarios' rules, by version)", header_style="bold")
    table.add_column("check")
    for b in run.builds:
        table.add_column(b.label)
    for t in run.targets:
        for c in t.checks:
            cells = [
                sw.expected_for(t, c, b.label, b.label, sw.build_device(b, run.dist))
                if b.release
                else "(by its version)"
                for b in run.builds
            ]
            table.add_row(c, *cells)
    console.print(table)


def stress_plan(console: Console, plan: object) -> None:
    from harness.commands.stress.plan import StressPlan, prompt_bounds

    assert isinstance(plan, StressPlan)
    d = plan.describe()
    base = plan.base
    console.print(
        f"[bold]stress plan[/] {d['scenario']}: profile {plan.profile}, seed {plan.seed}, "
        f"concurrency {plan.concurrency}, model {base.model_ref}, variant {base.variant}, "
        f"TP {base.tensor_parallel}",
        highlight=False,
    )
    host_line(console)
    per = ", ".join(f"{k} {n}" for k, n in d["requests"].items())
    bounds = prompt_bounds(plan.requests)
    longest = max(bounds[r.id] + r.max_tokens for r in plan.requests)
    console.print(
        f"  requests: {len(plan.requests)} ({per}); longest up to {longest} tokens; "
        f"can store up to {plan.storable_tokens:,} tokens",
        highlight=False,
    )
    if plan.duration_s:
        console.print(
            f"  duration: rounds with seeds {plan.seed}, {plan.seed + 1}, ... until "
            f"{plan.duration_s:g}s of traffic",
            highlight=False,
        )
    console.print(
        f"  patch {d['patch']}, fault {d['fault']}; offload chunk "
        f"{d['offload_tokens_per_chunk']} tokens, KV block {d['kv_block_size']}, CPU tier "
        f"{d['cpu_bytes_to_use']:,} B",
        highlight=False,
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
    console.print(
        "  then the reference (connector off): round 0 again at the same concurrency "
        "(noise floor), every answered request scored alone",
        highlight=False,
    )
    if d["server_argv"]:
        console.print("  argv: " + json.dumps(d["server_argv"]), highlight=False, markup=False)
        console.print(
            "  reference argv: " + json.dumps(d["reference_argv"]), highlight=False, markup=False
        )
