"""Judging a pressure server: each request's counters against the oracle's step, and the
run's totals against the sum of its requests.

Every figure is exact (no tolerance): with one request at a time, the GPU prefix cache
off and one store decision per request, vLLM's counters move by exactly what the tier
did, so a policy that evicts one wrong chunk shows as a hit one chunk short, and a
store that fails shows as stored bytes missing (docs/pressure-design.md §2.5). Only the
output comparison allows the bf16 noise of a prefill split differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.commands.pressure.plan import PlannedRequest, ServerPlan, TierGeometry
from harness.results.records import PressureCheck, PressureRequest
from harness.server.metrics import Snapshot
from harness.server.workload import Completion, within_tolerance

WHY = {
    "capacity": "the tier must hold the slots the plan sized (a wrong slot size, #56871's "
    "class, changes every later eviction)",
    "gpu-tier-silent": "with the GPU prefix cache off every hit must be the CPU tier's",
    "hit-tokens": "a hit is served only for chunks the policy kept: the wrong victim shows "
    "as a hit too short (or too long: an evicted chunk loaded)",
    "loaded-bytes": "a hit loads exactly its chunks' bytes, nothing of an evicted chunk",
    "stored-bytes": "admission, eviction room and the store threshold decide what is written",
    "stores-skipped": "the threshold turns away exactly the chunks offered fewer times "
    "than it asks (#52227)",
    "no-store-failure": "a store with evictable room must not fail (#55461); one without room must",
    "evicted-chunks": "the policy evicts exactly the chunks the oracle names, in its order "
    "(seen only by a replay of the build's manager: a live run sees bytes, not names)",
    "evictions": "the tier must really evict (stored chunks beyond its slots), or the "
    "run proved nothing about eviction",
    "output-after-hit": "a request served from the tier must answer as its cold run did",
    "ledger": "the requests' deltas must add up to the whole run's, and every prompt "
    "token be either computed or hit",
}


@dataclass
class Observed:
    """What one request did, from its completion and its counter delta."""

    completion: Completion
    delta: Snapshot


@dataclass
class Judged:
    row: PressureRequest
    failing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    """One request's observed figures, as pressure judges them: from a live server's
    counter delta, or from vLLM's manager replayed (``--replay``)."""

    ext_hits: int
    gpu_hits: int
    stored_bytes: int
    loaded_bytes: int
    stores_skipped: int
    store_failures: int


def judge_request(
    server: ServerPlan, tier: TierGeometry, req: PlannedRequest, obs: Observed
) -> Judged:
    """One request's row and the per-request checks it fails."""
    d, c = obs.delta, obs.completion
    got = Figures(
        int(d.ext_hits), int(d.gpu_hits), int(d.stored_bytes), int(d.loaded_bytes),
        int(d.stores_skipped), int(d.store_failures),
    )  # fmt: skip
    return judge_figures(server, tier, req, got, c.cached_tokens, c.seconds)


def judge_figures(
    server: ServerPlan,
    tier: TierGeometry,
    req: PlannedRequest,
    got: Figures,
    cached: int | None,
    seconds: float,
    also_failing: Sequence[str] = (),
) -> Judged:
    """A request's figures against its oracle step: its row and the checks it fails
    (``also_failing``: what the caller judged beyond these, e.g. the chunks evicted)."""
    exp = req.expected
    hit_tokens = exp.hit * tier.chunk_tokens
    stored_exp = len(exp.stored) * tier.chunk_bytes
    loaded_exp = exp.hit * tier.chunk_bytes
    failing = []
    if got.gpu_hits:
        failing.append("gpu-tier-silent")
    if got.ext_hits != hit_tokens or (cached is not None and cached != hit_tokens):
        failing.append("hit-tokens")
    if got.loaded_bytes != loaded_exp:
        failing.append("loaded-bytes")
    if got.stored_bytes != stored_exp:
        failing.append("stored-bytes")
    if server.store_threshold >= 2 and got.stores_skipped != len(exp.skipped):
        failing.append("stores-skipped")
    if bool(got.store_failures) != exp.failed:
        failing.append("no-store-failure")
    failing += also_failing
    row = PressureRequest(
        server=server.name,
        round=server.round,
        index=req.index,
        request=req.label,
        policy=server.policy,
        store_threshold=server.store_threshold,
        prompt_tokens=len(req.prompt.token_ids),
        hit_expected=hit_tokens,
        cached_tokens=cached,
        ext_hits=got.ext_hits,
        gpu_hits=got.gpu_hits,
        stored_expected=stored_exp,
        stored_bytes=got.stored_bytes,
        loaded_expected=loaded_exp,
        loaded_bytes=got.loaded_bytes,
        skipped_expected=len(exp.skipped),
        stores_skipped=got.stores_skipped,
        store_fails_expected=exp.failed,
        store_failures=got.store_failures,
        evicted_expected=" ".join(exp.evicted),
        failing=";".join(failing),
        seconds=seconds,
    )
    return Judged(row, failing)


def row_detail(name: str, r: PressureRequest) -> str:
    at = f"request {r.index} ({r.request})"
    if name == "hit-tokens":
        return (
            f"{at}: hit {r.ext_hits} tokens (cached_tokens {r.cached_tokens}), the oracle "
            f"{r.hit_expected}"
        )
    if name == "loaded-bytes":
        return f"{at}: loaded {r.loaded_bytes} B, the oracle {r.loaded_expected} B"
    if name == "stored-bytes":
        return f"{at}: stored {r.stored_bytes} B, the oracle {r.stored_expected} B"
    if name == "stores-skipped":
        return f"{at}: {r.stores_skipped} keys skipped, the oracle {r.skipped_expected}"
    if name == "no-store-failure":
        want = "a failed store" if r.store_fails_expected else "none"
        return f"{at}: {r.store_failures} failed store attempts, the oracle {want}"
    if name == "gpu-tier-silent":
        return f"{at}: {r.gpu_hits} GPU prefix-cache hit tokens"
    return at


PER_REQUEST = (
    "gpu-tier-silent",
    "hit-tokens",
    "loaded-bytes",
    "stored-bytes",
    "stores-skipped",
    "no-store-failure",
)


def check(
    server: ServerPlan, name: str, passed: bool, expected: str, observed: str, detail: str = ""
) -> PressureCheck:
    known = name in server.failing_checks
    must = name in server.must_fail  # a mutant's or fault's round must fail it
    return PressureCheck(
        server=server.name,
        round=server.round,
        check=name,
        passed=passed,
        expected=expected,
        observed=observed,
        why=WHY[name],
        detail=detail,
        known=", ".join(server.issues) if known and not passed else "",
        matched=(not passed) if must else (passed or known),
    )


def per_request_checks(
    server: ServerPlan, rows: Sequence[PressureRequest], names: Sequence[str], source: str = ""
) -> list[PressureCheck]:
    """One check per name of ``names``: every request's row as the oracle says
    (``stores-skipped`` only with a threshold); ``source`` says where the figures came
    from when it is not the live counters."""
    out = []
    for name in names:
        if name == "stores-skipped" and server.store_threshold < 2:
            continue
        bad = [r for r in rows if name in r.failing.split(";")]
        out.append(
            check(
                server,
                name,
                not bad,
                "every request as the oracle says",
                f"{len(rows) - len(bad)} of {len(rows)} requests agree{source}",
                row_detail(name, bad[0]) if bad else "",
            )
        )
    return out


def judge_server(
    server: ServerPlan,
    tier: TierGeometry,
    rows: Sequence[PressureRequest],
    completions: Sequence[Completion],
    whole: Snapshot,
    capacity: tuple[int, int] | None,
    logprob_tolerance: float,
) -> list[PressureCheck]:
    """Every check of one server, after its last request (``whole`` is the counters'
    delta from before the first request to after the last; ``capacity`` the engine's
    (slots, slot bytes), None when this backend does not report it)."""
    out = []
    if capacity is None:
        out.append(
            check(server, "capacity", True, f"{tier.slots} x {tier.slot_bytes} B",
                   "not reported by this backend", "judged by the requests alone")
        )  # fmt: skip
    else:
        want = (tier.slots, tier.slot_bytes)
        out.append(
            check(server, "capacity", capacity == want, f"{want[0]} x {want[1]} B",
                   f"{capacity[0]} x {capacity[1]} B")
        )  # fmt: skip
    out += per_request_checks(server, rows, PER_REQUEST)
    stored_chunks = sum(r.stored_bytes for r in rows) // max(1, tier.chunk_bytes)
    oracle_evicts = sum(len(p.expected.evicted) for p in server.requests)
    at_least = max(0, stored_chunks - tier.slots)
    out.append(
        check(
            server,
            "evictions",
            at_least > 0 or oracle_evicts == 0,
            f"{oracle_evicts} evictions (the oracle)",
            f"at least {at_least}: {stored_chunks} chunks stored into {tier.slots} slots",
        )
    )
    out.append(_outputs(server, completions, logprob_tolerance))
    out.append(_ledger(server, rows, whole))
    return out


def _outputs(
    server: ServerPlan, completions: Sequence[Completion], tolerance: float
) -> PressureCheck:
    """Each request that hit, against the first run of the same tokens (they repeat
    exactly: a name's chunks and tail are the same tokens each time)."""
    first: dict[tuple[int, ...], tuple[int, Completion]] = {}
    compared, worst, bad = 0, 0.0, ""
    for req, comp in zip(server.requests, completions, strict=False):
        key = tuple(req.prompt.token_ids)
        if key not in first:
            first[key] = (req.index, comp)
            continue
        if not comp.cached_tokens and not req.expected.hit:
            continue
        ref_index, ref = first[key]
        compared += 1
        close = within_tolerance(ref, comp, tolerance)
        worst = max(worst, close.max_delta)
        if close.divergence and not bad:
            dv = close.divergence
            bad = (
                f"request {req.index} ({req.label}) vs request {ref_index}: {dv.field} differ "
                f"at {dv.position}: {dv.left} vs {dv.right}"
            )
    return check(
        server,
        "output-after-hit",
        not bad,
        f"token ids equal, logprobs within {tolerance}",
        f"{compared} repeats compared, largest logprob delta {worst:.4g}",
        bad,
    )


def _ledger(server: ServerPlan, rows: Sequence[PressureRequest], whole: Snapshot) -> PressureCheck:
    sums = {
        "stored bytes": (sum(r.stored_bytes for r in rows), whole.stored_bytes),
        "loaded bytes": (sum(r.loaded_bytes for r in rows), whole.loaded_bytes),
        "hit tokens": (sum(r.ext_hits for r in rows), whole.ext_hits),
    }
    prompt = sum(r.prompt_tokens for r in rows)
    computed = prompt - sum(r.ext_hits for r in rows)
    off = [f"{k}: requests {a} vs run {b:.0f}" for k, (a, b) in sums.items() if a != int(b)]
    if whole.local_compute_tokens and int(whole.local_compute_tokens) != computed:
        off.append(
            f"computed tokens: {whole.local_compute_tokens:.0f}, prompts minus hits {computed}"
        )
    return check(
        server,
        "ledger",
        not off,
        "requests add up to the run; prompt tokens = computed + hit",
        f"{prompt} prompt tokens, {prompt - computed} hit, {computed} computed",
        "; ".join(off),
    )
