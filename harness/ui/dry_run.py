"""What ``--dry-run`` prints: the plan of each command, and the exact argv and environment
of every server it would launch, so a user can check (or rerun by hand) before anything
starts. Planning happened already; this module only renders it: as text (``<command>_plan``,
prose wrapped to the terminal, an argv on one line to copy) or as one JSON document
(``<command>_plan_record``, ``--dry-run --json``)."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from harness.ui.fit import fit, grid, release_ranges

if TYPE_CHECKING:
    from harness.commands.roundtrip import RoundtripPlan
    from harness.commands.stress.plan import StressPlan


def say(console: Console, text: str, indent: int = 2, bold: str = "") -> None:
    """A line of prose wrapped to the console's width, continuation lines indented two
    more; ``bold``: its first words, in bold."""
    lines = textwrap.wrap(
        text,
        width=max(20, console.width),
        initial_indent=" " * indent,
        subsequent_indent=" " * (indent + 2),
        break_on_hyphens=False,
    ) or [""]
    for i, line in enumerate(lines):
        if i == 0 and bold and line.lstrip().startswith(bold):
            pad = line[: len(line) - len(line.lstrip())]
            console.print(f"{pad}[bold]{escape(bold)}[/]", end="", highlight=False)
            console.print(line.lstrip()[len(bold) :], highlight=False, markup=False)
        else:
            console.print(line, highlight=False, markup=False)


def host_state() -> dict[str, str]:
    """The environment fixes every server gets on this host."""
    from harness.engine.amx import planned_state
    from harness.names import ENV_AMX

    state = planned_state()
    why = {
        "requested": "AMX tile permission requested in every vLLM process (vLLM's CPU "
        f"attention needs it and never asks; {ENV_AMX}=off to reproduce that)",
        "off": f"AMX present but {ENV_AMX}=off: vLLM's CPU attention may die by SIGILL",
        "not-needed": "no AMX on this CPU: nothing to request",
    }[state]
    return {"amx_permission": state, "why": why, "PYTHONFAULTHANDLER": "1"}


def host_line(console: Console) -> None:
    """The environment fixes every server gets on this host (dry-runs show them)."""
    h = host_state()
    say(
        console,
        f"host: amx_permission={h['amx_permission']} ({h['why']}); servers run with "
        "PYTHONFAULTHANDLER=1",
    )


def _off_platform(console: Console, text: str) -> None:
    if text:
        say(console, f"note: {text}", indent=0, bold="note:")


def _heading(console: Console, base: Any, bold: str, text: str, attached: str = "") -> None:
    """The first lines of a plan of round trips on ``base`` (a round-trip plan): a note
    when its variant is off its platform, ``bold`` then ``text``, and what is launched:
    the host line, or for an attached server (``--url``) nothing (``attached``: what is
    sent to it instead)."""
    _off_platform(console, base.off_platform)
    say(console, f"{bold} {text}", indent=0, bold=bold)
    if base.url is None:
        host_line(console)
    else:
        say(console, f"attach: {base.url} (a server someone else launched): nothing is {attached}")


def crash_repro_plan(console: Console, plan: object) -> None:
    from harness.commands.crash_repro import RunPlan, backends, launch_count
    from harness.server.crash_signatures import known_label

    assert isinstance(plan, RunPlan)
    skipped = sum(1 for r in plan.rows if r.skip_reason)
    launches = launch_count(plan.rows)
    shared = len(plan.rows) - skipped - launches
    say(
        console,
        f"scenario {plan.scenario.name}: {len(plan.rows)} rows, {launches} launches, "
        "one at a time"
        + (f"; {shared} rows share a launch with an identical server" if shared else "")
        + (f" ({skipped} rows skipped on this host)" if skipped else ""),
        indent=0,
        bold="scenario",
    )
    first_of: dict[str, str] = {}
    host_line(console)
    for n, env in plan.environments.items():
        say(
            console,
            f"variant {n}: vLLM {env.vllm_version} ({env.vllm_dist}) on "
            f"{env.device}, offload backend {backends(plan)[n]}, python {env.python}",
        )
    for row in plan.rows:
        exp = row.expected + (f" ({known_label(row.expected_known)})" if row.expected_known else "")
        say(console, f"{row.key} expect {exp}", indent=0, bold=row.key)
        if row.skip_reason:
            say(console, f"skipped on this host: {row.skip_reason}")
        else:
            key = row.plan.launch_key()
            if key in first_of:
                say(console, f"same server as {first_of[key]}: served by its launch")
            first_of.setdefault(key, row.key)
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(row.plan.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(row.plan.argv()), highlight=False, markup=False)


def crash_repro_plan_record(plan: object) -> dict[str, Any]:
    from harness.commands.crash_repro import RunPlan, backends, launch_count

    assert isinstance(plan, RunPlan)
    first_of: dict[str, str] = {}
    rows = []
    for row in plan.rows:
        key = row.plan.launch_key()
        shared = first_of.get(key, "") if not row.skip_reason else ""
        if not row.skip_reason:
            first_of.setdefault(key, row.key)
        rows.append(
            {
                "key": row.key,
                "model": row.model,
                "variant": row.variant,
                "connector": "on" if row.connector else "off",
                "patch": row.patch or "none",
                "vllm_version": row.vllm_version,
                "expected": row.expected,
                "expected_known": row.expected_known,
                "skipped": row.skip_reason or None,
                "shares_launch_of": shared or None,
                "env": row.plan.env,
                "argv": row.plan.argv(),
            }
        )
    return {
        "command": "crash-repro",
        "scenario": plan.scenario.name,
        "launches": launch_count(plan.rows),
        "host": host_state(),
        "variants": {
            n: {**env.as_dict(), "offload_backend": backends(plan)[n]}
            for n, env in plan.environments.items()
        },
        "rows": rows,
    }


def roundtrip_plan_record(plan: object) -> dict[str, Any]:
    from harness.commands.roundtrip import RoundtripPlan

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


def roundtrip_plan(console: Console, plan: RoundtripPlan) -> None:
    what = f"model {plan.model_ref}, variant {plan.variant}, TP {plan.tensor_parallel}"
    sent = f"the targets, filler and replay are sent to its model {plan.served_name}"
    attached = f"launched; {sent}, the pool and KV block read from its /metrics"
    _heading(console, plan, "roundtrip plan", f"{plan.scenario.name}: {what}", attached)
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


def matrix_plan(console: Console, plan: object) -> None:
    from harness.commands import matrix as mx

    assert isinstance(plan, mx.MatrixPlan)
    scen = plan.scenario
    say(
        console,
        f"matrix {scen.name}: {len(plan.cells)} cells, one server at a time",
        indent=0,
        bold="matrix",
    )
    for cell in plan.cells:
        assert cell.plan is not None
        exp = cell.plan.expected
        say(
            console,
            f"{cell.key} (vLLM {cell.vllm_version}): expect "
            f"{cell.expected_text()}; plan stores {exp.stored_bytes:,} B, loads "
            f"{exp.loaded_bytes:,} B, hits {exp.hit_tokens} tokens",
        )


def matrix_plan_record(plan: object) -> dict[str, Any]:
    from harness.commands import matrix as mx

    assert isinstance(plan, mx.MatrixPlan)
    cells = []
    for cell in plan.cells:
        assert cell.plan is not None
        exp = cell.plan.expected
        server = cell.plan.server
        cells.append(
            {
                "key": cell.key,
                "family": cell.family,
                "geometry": cell.geometry,
                "variant": cell.variant,
                "vllm_version": cell.vllm_version,
                "expected": cell.expected_text(),
                "stored_bytes": exp.stored_bytes,
                "loaded_bytes": exp.loaded_bytes,
                "hit_tokens": exp.hit_tokens,
                "argv": server.argv() if server is not None else None,
            }
        )
    return {"command": "matrix", "scenario": plan.scenario.name, "cells": cells}


def faults_plan_record(sweep: object) -> dict[str, Any]:
    from harness.commands import faults as fs

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


def faults_plan(console: Console, sweep: object) -> None:
    from harness.commands import faults as fs

    assert isinstance(sweep, fs.SweepPlan)
    faults = sweep.faults
    scen = sweep.base.scenario
    base = sweep.base
    _heading(
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


def build_states(run: Any) -> list[dict[str, Any]]:
    """Each build of a sweep and what this machine knows of it: ``ready`` (its
    environment exists), ``to create``, ``known not to install`` (an install failed
    lately, with the reason, remembered a day) or ``your build``."""
    from harness.server import release_envs as renv

    existing = {e.name: e for e in renv.list_envs(measure=False)}
    try:
        known = {r["release"]: r for r in renv.offline_releases(run.dist)[0]}
    except Exception:  # an unknown distribution: nothing is known of its releases
        known = {}
    out = []
    for b in run.builds:
        if not b.release:
            out.append({"label": b.label, "state": "your build", "where": b.spec})
            continue
        name = renv.env_name(run.dist, b.spec)
        entry = existing.get(name)
        reason = (known.get(b.label) or {}).get("unavailable")
        if entry is not None and entry.complete:
            state = "ready"
        elif reason:
            state = "known not to install"
        else:
            state = "to create"
        out.append(
            {
                "label": b.label,
                "state": state,
                "where": str(renv.envs_dir() / name),
                "reason": reason or None,
            }
        )
    return out


def _build_lines(console: Console, run: Any) -> list[dict[str, Any]]:
    """The builds in a few lines: how many, then each state (and each reason a release
    cannot install) with its releases as ranges. Returns the states."""
    from harness.server import release_envs as renv

    states = build_states(run)
    order = [b.label for b in run.builds]
    groups: dict[tuple[int, str, str], list[str]] = {}
    for st in states:
        rank = BUILD_STATES.index(st["state"])
        groups.setdefault((rank, st["state"], st.get("reason") or ""), []).append(st["label"])
    say(console, f"{len(states)} build(s) of {run.dist}, environments in {renv.envs_dir()}:")
    for (_, state, reason), labels in sorted(groups.items()):
        why = f"; {reason}" if reason else ""
        say(console, f"{state} ({len(labels)}{why}): {release_ranges(labels, order)}", indent=4)
    return states


BUILD_STATES = ("ready", "to create", "known not to install", "your build")


def _bugs_expected(run: Any) -> list[tuple[str, str, list[str]]]:
    """(entry, trigger, what it expects on each build) of a corpus run."""
    from harness.commands.bugs import corpus as bugs

    sweep = run.sweep
    out = []
    for e in run.entries:
        trig = e.trigger
        if trig.kind == "check":
            what = trig.check
        elif trig.kind == "scheduler":
            what = f"scheduler drive {trig.case}"
        else:
            what = f"{len(trig.steps)} steps"
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
        out.append((e.id, what, cells))
    return out


def bugs_plan_record(run: object) -> dict[str, Any]:
    from harness.commands.bugs import corpus as bugs

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    labels = [b.label for b in sweep.builds]
    entries = []
    by_id = {e.id: e for e in run.entries}
    for bug, trigger, cells in _bugs_expected(run):
        e = by_id[bug]
        entries.append(
            {
                "id": bug,
                "title": e.title,
                "trigger": trigger,
                "skipped": run.skipped.get(bug),
                "expected": dict(zip(labels, cells, strict=True)),
                "rerun": bugs.reproduction(e, sweep.release_order),
            }
        )
    return {
        "command": "bugs",
        "dist": sweep.dist,
        "host": host_state(),
        "builds": build_states(sweep),
        "entries": entries,
    }


def bugs_plan(console: Console, run: object) -> None:
    """The entries (trigger, ranges, why skipped), the builds, what each entry expects on
    each release, and the command that reruns each."""
    from rich.text import Text

    from harness.commands.bugs import corpus as bugs

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    say(
        console,
        f"bugs (dry run): {len(run.entries)} entries x {len(sweep.builds)} build(s), "
        "one server at a time",
        indent=0,
        bold="bugs",
    )
    host_line(console)
    _build_lines(console, sweep)
    labels = [b.label for b in sweep.builds]
    rows = [((bug, what), [Text(c) for c in cells]) for bug, what, cells in _bugs_expected(run)]
    releases = {b.label for b in sweep.builds if b.release}
    table = grid(
        "expected (from each entry's ranges)",
        ("bug", "trigger"),
        rows,
        labels,
        releases,
        width=console.width,
    )
    console.print(fit(console, table))
    for e in run.entries:
        why = f" (skipped: {run.skipped[e.id]})" if e.id in run.skipped else ""
        say(console, f"{e.id}: {e.title}{why}")
        say(console, bugs.reproduction(e, sweep.release_order), indent=4)


def _sweep_expected(run: Any) -> list[tuple[str, list[str]]]:
    from harness.commands import sweep as sw

    return [
        (
            c,
            [
                sw.expected_for(t, c, b.label, b.label, sw.build_device(b, run.dist))
                if b.release
                else "(by its version)"
                for b in run.builds
            ],
        )
        for t in run.targets
        for c in t.checks
    ]


def sweep_plan_record(run: object) -> dict[str, Any]:
    from harness.commands import sweep as sw

    assert isinstance(run, sw.SweepRun)
    labels = [b.label for b in run.builds]
    return {
        "command": "sweep",
        "host": host_state(),
        **run.describe(),
        "builds": build_states(run),
        "expected": {c: dict(zip(labels, cells, strict=True)) for c, cells in _sweep_expected(run)},
    }


def sweep_plan(console: Console, run: object) -> None:
    """The builds (and whether their environment exists), the checks, and what the
    scenarios' rules expect of each check on each release."""
    from rich.text import Text

    from harness.commands import sweep as sw

    assert isinstance(run, sw.SweepRun)
    say(
        console,
        f"sweep (dry run): {len(run.builds)} build(s), "
        f"{sum(len(t.checks) for t in run.targets)} check(s), one server at a time",
        indent=0,
        bold="sweep",
    )
    host_line(console)
    _build_lines(console, run)
    labels = [b.label for b in run.builds]
    rows = [((c,), [Text(x) for x in cells]) for c, cells in _sweep_expected(run)]
    table = grid(
        "expected (from the scenarios' rules, by version)",
        ("check",),
        rows,
        labels,
        {b.label for b in run.builds if b.release},
        width=console.width,
    )
    console.print(fit(console, table))


def stress_plan_record(plan: object) -> dict[str, Any]:
    from harness.commands.stress.plan import StressPlan

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


def stress_plan(console: Console, plan: StressPlan) -> None:
    from harness.commands.stress.plan import prompt_bounds

    d = plan.describe()
    base = plan.base
    _heading(
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


def pressure_plan_record(plan: object) -> dict[str, Any]:
    from harness.commands.pressure.plan import PressurePlan

    assert isinstance(plan, PressurePlan)
    return {
        "command": "pressure",
        "launches": len(plan.servers),
        "host": host_state(),
        **plan.describe(),
        "argv": {s.name: s.spec.argv(0) for s in plan.servers},
    }


def pressure_plan(console: Console, plan: object) -> None:
    from harness.commands.pressure.plan import PressurePlan

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


def mutate_plan_record(plan: object) -> dict[str, Any]:
    from harness.commands.mutate.plan import MergePlan

    if isinstance(plan, MergePlan):
        return {"command": "mutate", "merge": [str(r) for r in plan.runs], "launches": 0}
    assert hasattr(plan, "describe")
    return {"command": "mutate", "host": host_state(), **plan.describe()}


def mutate_plan(console: Console, plan: object) -> None:
    from harness.commands.mutate.plan import MergePlan, MutatePlan

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
    say(
        console,
        "commands, in order (the first that fails a mutant kills it): "
        + ", ".join(c.name for c in plan.commands)
        + "; each first once on the unmutated build with line coverage; "
        + f"{plan.timeout_s:g}s a command",
    )
    if plan.shard:
        say(console, f"shard {plan.shard[0]}/{plan.shard[1]}: the mutants whose id falls there")
    if plan.resume:
        say(console, f"resumes {plan.resume}")
    for m in plan.mutants:
        console.print(f"    {m.id} {m.one_line()}", highlight=False, markup=False)
