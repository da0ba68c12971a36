"""Every check of a stress run, each expected / observed / why: the engine survived, no
errors, outputs against the reference, the log, prefix reuse (and across restarts), the
byte ledger server by server, the tier's eviction under pressure, the disk tier, and that
the profile made happen what it exists to make happen."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.commands.roundtrip import disk_checks as dc
from harness.commands.stress.checks import (
    Ledger,
    check_happened,
    check_ledger,
    check_log,
    check_no_errors,
    check_outputs,
    check_prefix_reuse,
    parse_transfers,
    per_kind,
    stored_chunks,
)
from harness.commands.stress.plan import StressPlan
from harness.commands.stress.result import ServerRun, StressResult
from harness.results.records import CheckResult
from harness.server.kv_layout import spec_kind


def group_kinds(groups: Sequence[dict[str, Any]]) -> list[str]:

    return [spec_kind(g) for g in groups]


def ledger_of(result: StressResult, server: ServerRun | None = None) -> Any:
    """The byte ledger: vLLM's counters, the host backend's per-kind trace, and what the
    requests as sent and answered say should have moved; of one ``server`` (its own
    counters, log and requests) or of the whole run.

    A restarted server's CPU tier starts empty and its lookups promote prefixes from
    disk into it without a store from the GPU, so it stores up to one chunk fewer per
    chunk hit (``ext_hits / chunk``) than the chunks its requests filled."""

    plan = result.plan
    exp = plan.base.expected
    c = plan.base.tokens_per_chunk
    by = {r.id: r for r in result.sent}
    low: list[list[int]] = []
    high: list[list[int]] = []
    decode = plan.offloads_decode
    counters = server.counters if server is not None else result.counters
    lines = server.log_lines if server is not None else result.log_lines
    mine = set(server.request_ids) if server is not None else None
    outcomes = [o for o in result.outcomes if mine is None or o.id in mine]
    for o in outcomes:
        if not o.prompt or (o.error and not o.aborted):
            continue
        if not decode:
            low.append(o.prompt)
            high.append(o.prompt)
            continue
        # The last generated token's KV is never computed (it is sampled, not fed back).
        seen = o.prompt + o.output[:-1]
        low.append(seen)
        if o.aborted:
            # Generated past what the client read before hanging up: up to max_tokens.
            want = by[o.id].max_tokens if o.id in by else len(o.output)
            high.append(o.prompt + (o.output + [-1] * want)[: want - 1])
        else:
            high.append(seen)
    kinds = per_kind(parse_transfers(lines), group_kinds(result.engine_groups))
    kind_bpt = {k.kind: k.bytes_per_token for k in exp.layout if k.bytes_per_token}
    ext_hits = counters.get("ext_hits", 0.0)
    promoted = int(ext_hits // c) if server is not None and server.restarted else 0
    return Ledger(
        stored=counters.get("stored_bytes", 0.0),
        loaded=counters.get("loaded_bytes", 0.0),
        ext_hits=ext_hits,
        kinds=kinds,
        full_bpt=exp.full_bytes_per_token,
        kind_bpt=kind_bpt,
        chunks_low=max(0, stored_chunks(low, c) - promoted),
        chunks_high=stored_chunks(high, c),
        chunk=c,
        preemptions=counters.get("preemptions", 0.0),
        longest=max((len(o.prompt) + len(o.output) for o in outcomes), default=0),
    )


# The profiles whose traffic must make the scheduler preempt, and those whose later
# requests reuse earlier ones' prefixes (served from the CPU tier once the GPU evicted
# them): only those are judged on reuse and external hits.
PREEMPTING = ("preemption", "mixed")
REUSING = ("multi-turn", "shared-prefix", "mixed")
# What each kind of profile exists to make happen: (profiles, check, what, counter, why).
HAPPENED = (
    (
        PREEMPTING,
        "preemptions-happened",
        "vllm:num_preemptions",
        "preemptions",
        "the profile exists to make the scheduler preempt and resume requests; "
        "without a preemption it proved nothing about them",
    ),
    (
        REUSING,
        "external-hits-happened",
        "external prefix-cache hits",
        "ext_hits",
        "later turns and family members must find their prefix evicted from "
        "the GPU and served from the CPU tier, or the tier was never read",
    ),
)


def evaluate(result: StressResult) -> None:
    """Every check of a stress run, each expected / observed / why."""

    plan = result.plan
    checks: list[Any] = [
        CheckResult(
            "engine-survived",
            result.server_alive and not result.death,
            "the server answered to the end",
            result.death or "alive",
            "offloading must never bring the engine down",
        ),
        check_no_errors(result.outcomes),
    ]
    if result.attached:
        pass  # no reference to compare with; the figures say so (reference_error)
    elif result.reference_error and not result.verdicts:
        checks.append(
            CheckResult(
                "outputs-match-reference",
                False,
                "every request's tokens are the reference's choice",
                "not judged",
                "the reference server could not score the run",
                result.reference_error,
            )
        )
    elif result.verdicts or result.compared_count():
        checks.append(
            check_outputs(
                result.outcomes,
                result.verdicts,
                result.tolerance,
                kernels_text(result.engine_kernels) if result.engine_kernels else "",
            )
        )
    if result.log_lines:
        checks.append(check_log(result.log_lines))
    logprob_ids = [r.id for r in result.sent if r.prompt_logprobs is not None]
    if result.counters:
        if plan.profile in REUSING and reuse_is_modelled(plan) and not plan.under_pressure:
            server = server_index(result)
            checks.append(
                check_prefix_reuse(
                    result.outcomes,
                    plan.base.tokens_per_chunk,
                    logprob_ids,
                    decode=plan.offloads_decode,
                    # The CPU tier's reuse is a server's own; across a restart it is
                    # the disk's (restart-reused).
                    may_donate=lambda d, o: server.get(d.id) == server.get(o.id),
                )
            )
        if plan.restarts and reuse_is_modelled(plan):
            checks.append(check_restart_reuse(result, logprob_ids))
        checks += check_ledger_for(result)
        if plan.under_pressure:
            checks.append(check_tier_evicted(result))
        checks += check_disk_for(result)
        checks += [
            check_happened(name, what, result.counters.get(counter, 0.0), why)
            for profiles, name, what, counter, why in HAPPENED
            if plan.profile in profiles
        ]
    result.checks = checks


def reuse_is_modelled(plan: StressPlan) -> bool:
    """Whether ``prefix-reused`` can state what must be reused. Sliding-window layers
    keep in the CPU tier only the tail a hit at a request's prompt boundary reaches
    (vLLM's retention rule, PR #51886), so which later prefixes can hit depends on where
    each donor's prompt ended; the check is left out there rather than guessed (on
    Gemma 3: a 700-token shared prefix found no hit, by that rule)."""
    return not any(k.kind == "sliding-window" for k in plan.base.expected.layout)


def check_restart_reuse(result: StressResult, prompt_logprobs: Sequence[str]) -> Any:
    """Each request a restarted server was sent got from cache what the earlier servers
    had computed of its prompt: that server's CPU tier started empty, so the disk is
    where it came from (``prefix-reused``'s rule, on the restarted requests alone)."""

    later = {i for sv in result.servers if sv.restarted for i in sv.request_ids}
    server = server_index(result)
    return check_prefix_reuse(
        result.outcomes,
        result.plan.base.tokens_per_chunk,
        prompt_logprobs,
        decode=result.plan.offloads_decode,
        judged=later,
        may_donate=lambda d, o: server.get(d.id, 0) < server.get(o.id, 0),
        name="restart-reused",
        why="a restarted server must find on disk every prefix the servers before it "
        "stored; a miss is KV lost to the restart",
    )


def server_index(result: StressResult) -> dict[str, int]:
    """Request id -> which server of the run it was sent to (0: the first)."""
    return {i: n for n, sv in enumerate(result.servers) for i in sv.request_ids}


def per_server(result: StressResult, judge: Callable[[ServerRun | None], list[Any]]) -> list[Any]:
    """``judge`` on each server of the run, its checks of one name folded into one: passed
    when every server's did, expected and observed given server by server. One server:
    its checks as they are; none recorded (a result built by hand): ``judge(None)``, the
    whole run."""
    if len(result.servers) <= 1:
        return judge(result.servers[0] if result.servers else None)

    by_name: dict[str, list[tuple[str, Any]]] = {}
    for sv in result.servers:
        for c in judge(sv):
            by_name.setdefault(c.name, []).append((sv.label, c))
    out = []
    for name, parts in by_name.items():
        first = parts[0][1]
        bad = [(label, c) for label, c in parts if not c.passed]
        out.append(
            CheckResult(
                name,
                not bad,
                "; ".join(f"{label}: {c.expected}" for label, c in parts),
                "; ".join(f"{label}: {c.observed}" for label, c in parts),
                first.why,
                "; ".join(f"{label}: {c.detail}" for label, c in bad if c.detail),
            )
        )
    return out


def check_ledger_for(result: StressResult) -> list[Any]:
    """The byte ledger, server by server (each restarted server counts from its own
    start and logs its own transfers)."""

    # Under pressure a chunk may be stored again after its eviction, or not at all when
    # the tier has no room: the store count is the policy's choice, not judged.
    stores = not result.plan.under_pressure
    return per_server(result, lambda sv: check_ledger(ledger_of(result, sv), stores=stores))


def check_disk_for(result: StressResult) -> list[Any]:
    """Over a disk tier: no write or read failed, the files are whole chunks, and under
    pressure the disk really served prefixes the CPU tier had evicted (each disk hit one
    file read); with a roomy CPU tier, the disk serves nothing."""

    files, c = result.disk_files, result.counters
    if files is None:  # no disk tier (or the run never got as far as reading it)
        return []
    per_key = dc.key_bytes(result.engine_groups, result.plan.base.tokens_per_chunk)
    # 0.27 exports no tiering counters: the files alone are judged there.
    written = c.get("disk_written_bytes", 0.0) if result.disk_counters else None
    checks = [dc.check_whole_files(files, per_key, written)]
    if written is None:
        return checks
    size = files.file_size or per_key or 0

    def served(sv: ServerRun | None) -> list[Any]:
        # A restarted server's CPU tier starts empty: what it hits came from disk.
        counted = sv.counters if sv is not None else c
        hits, read = counted.get("disk_hits", 0.0), counted.get("disk_read_bytes", 0.0)
        again = sv is not None and sv.restarted
        return [dc.check_served(result.plan.under_pressure, hits, read, size, again)]

    checks += per_server(result, served)
    return [
        *checks,
        dc.check_failures(
            c.get("disk_write_failures", 0.0), c.get("disk_read_failures", 0.0), files.partial
        ),
    ]


def check_tier_evicted(result: StressResult) -> Any:
    """Under pressure the tier must really have evicted: more bytes stored than it holds."""

    tier = int(result.plan.connector_config.get("cpu_bytes_to_use") or 0)
    stored = float(result.counters.get("stored_bytes", 0.0))
    return CheckResult(
        "tier-evicted",
        stored > tier > 0,
        f"stored > the tier's {tier:,} B ({result.plan.tier_fraction:g} of what the plan stores)",
        f"stored {stored:,.0f} B",
        "a tier under pressure that never evicted proved nothing about eviction",
    )


def kernels_text(kernels: dict[str, dict[str, str]]) -> str:
    """``server CPUAttentionBackend/amx, reference CPUAttentionBackend/amx``."""
    parts = []
    for who in ("server", "reference"):
        k = kernels.get(who)
        if k is None:
            continue
        cell = "/".join(v for v in (k.get("attention_backend"), k.get("attention_isa")) if v)
        parts.append(f"{who} {cell or 'not reported'}")
    return ", ".join(parts) or "not reported"
