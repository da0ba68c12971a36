"""Stress runs: concurrent, multi-turn, preempting traffic through the connector, every
request judged against a connector-off reference.

A run has two servers, one after the other (never two at once):

1. the server under test (the connector on) serves the plan (``harness.commands.stress.workload``)
   at the chosen concurrency, through ``harness.commands.stress.driver``;
2. the reference server (the same engine, the connector off, prefix caching on) first
   serves the same plan at the same concurrency, which measures the noise floor the way
   the run under test is judged: how far a clean concurrent run's decoded tokens and
   their top-two gaps stray from the same tokens scored alone; then it scores every
   request of the run under test alone (teacher forcing, ``prompt_logprobs`` over the
   prompt and what was generated), and each generated token must be the reference's
   choice or within the tolerance the floor gives (``harness.commands.stress.reference``).

Why teacher forcing rather than a second generation: two generations part at the first
near-tie that two computations round apart, and everything after differs; scoring the
run's own tokens alone makes the comparison exact wherever the reference is not at a tie.
How far decode and teacher-forced prefill round apart depends on vLLM's CPU attention
kernel: not at all in one process on ``vec``, one bf16 step at most positions and now
and then ten on ``amx`` (docs/stress.md), so the floor is measured, on the kernel that
ran, never assumed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.commands.stress.driver import Outcome, Reply, drive
from harness.commands.stress.plan import StressPlan
from harness.commands.stress.reference import (
    Scores,
    judge_tokens,
    noise_floor,
    parse_prompt_logprobs,
)
from harness.commands.stress.workload import PlannedRequest
from harness.server.disk_tier import DiskInventory

# The tolerance comes from measured numbers (``Floor``), and is never below the minimum
# (a floor measured as 0 on a short run must not make every near-tie a divergence):
#
# - FLOOR_FACTOR x the larger of the stray (one token's logprob, served vs scored) and
#   the logprobs' resolution (one bf16 step). Where decode and prefill compute alike
#   (vLLM's `vec` attention kernel: the reference's replay and its scores agreed to the
#   bit), two server processes still differ by one step (0.0039; the round trip's
#   --baseline saw the same) and a step compounds along a long answer: clean runs parted
#   from the reference by up to 3 steps (0.0117), so 4 steps.
# - PAIR_FACTOR x the largest move of a two-token gap between the reference replay's
#   decode and its own teacher-forced scores (``Floor.gap_move``): the very difference
#   the run under test is judged by. Where they differ (`amx`: decode and prefill round
#   the attention probabilities to bf16 in different tiles), one mixed-profile replay
#   moved 1,498 positions by one step, 63 by two and one each by 3, 4, 5 and 10 steps;
#   the run under test against the same scores: 1,452, 71, 2, and one each by 5 and 8.
#   The largest move is a sample maximum of that tail (3 to 10 steps between samples;
#   a clean run on another AMX host parted by 10, 0.0391), so 3x the replay's.
# The tolerance is the larger of the two, so never narrower than the stray rule that
# held on hosts without AMX. It came out 0.059 to 0.117 on the AMX host's clean mixed
# runs; the seeded faults' diverging requests parted by 0.105 and more there (27 steps
# and up; 0.08 and more without AMX), and every fault run had requests at 0.14 and more
# (docs/stress.md).
FLOOR_FACTOR = 4.0
PAIR_FACTOR = 3.0
MIN_TOLERANCE = 1e-3


# --- the reference --------------------------------------------------------------------------
def compared(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The requests judged against the reference: answered, not cut off, not filler."""
    return [o for o in outcomes if o.output and not o.error and not o.aborted and not o.filler]


def score_request(prompt: list[int], output: list[int]) -> PlannedRequest:
    """The reference's scoring request: the prompt and what was generated, one token asked
    for, ``prompt_logprobs`` over all of it (the actual token and the top choice)."""
    return PlannedRequest(
        "score", "score", 0.0, prompt + output, max_tokens=1, prompt_logprobs=SCORE_TOP
    )


# The reference scores each position's actual token and its top two: the gap between the
# two is what the logprobs' resolution is measured from.
SCORE_TOP = 2
# Each generated token comes back with the served top two: the floor measures how far
# a two-token gap moves between serving and scoring (``Floor.pair``).
SERVED_TOP = 2

Scorer = Callable[[list[int], list[int]], Scores]
"""Score prompt + output alone on the reference server: per position, token -> logprob."""


@dataclass(frozen=True)
class Floor:
    """The noise floor of a clean concurrent run, measured on the reference server the
    way the run under test is judged: each token as served (decode, in the replay's
    batches) against the same tokens scored alone (teacher-forced prefill)."""

    stray: float  # largest |logprob as served - as scored alone| of a generated token
    tokens: int  # generated tokens measured
    resolution: float  # smallest positive gap between two scored logprobs at a position
    # Largest change, between served and scored, of the gap between two tokens at one
    # position (both sides' top choices): the very quantity a verdict turns on, since a
    # run's token is judged by its gap to the reference's top choice there.
    pair: float = 0.0
    lost: float = 0.0  # largest gap of a near-tie the replay broke the other way
    paired: int = 0  # positions where both sides gave two tokens to compare

    @property
    def gap_move(self) -> float:
        """How far the replay's serving and its scores disagreed about a gap: the
        largest pair move and lost near-tie; without served top choices (``paired`` 0)
        twice the stray stands in for the pair (two tokens moving apart)."""
        pair = self.pair if self.paired else 2 * self.stray
        return max(pair, self.lost)

    @property
    def value(self) -> float:
        """The floor, per token (``noise_floor``; the tolerance is ``FLOOR_FACTOR`` x
        it): the stray; the gap move, weighted ``PAIR_FACTOR / FLOOR_FACTOR`` (it is
        already a gap, the quantity a verdict compares, so 3 x it rather than 4); and
        never less than the logprobs' resolution. Logits are rounded to the model's
        dtype (bf16 here), so two computations of one position that differ by less than
        a step can round to neighbouring steps: a tie broken the other way costs one
        step, whether or not the floor run happened to break one. Where decode and
        prefill compute alike (vLLM's ``vec`` attention kernel: stray and pair 0) this
        is the resolution; where they do not (``amx``), it is what they were measured to
        differ by."""
        return max(self.stray, self.gap_move * PAIR_FACTOR / FLOOR_FACTOR, self.resolution)


def pair_change(served: dict[int, float], scored: dict[int, float]) -> float:
    """The largest change, from ``served`` to ``scored``, of the gap between two tokens
    both report at one position (0 when fewer than two are common)."""
    common = sorted(served.keys() & scored.keys())
    worst = 0.0
    for a, b in itertools.combinations(common, 2):
        worst = max(worst, abs((served[a] - served[b]) - (scored[a] - scored[b])))
    return worst


def floor_of(outcomes: Sequence[Outcome], score: Scorer) -> Floor:
    """How far a clean concurrent run strays from the same tokens scored alone: the
    largest difference between a generated token's logprob as served and as scored; the
    largest gap by which scoring preferred another token (a near-tie the concurrent run
    resolved the other way); the largest change of a two-token gap between the served
    top choices and the scored ones; and the scored logprobs' resolution."""
    stray, lost, n, pair, paired = 0.0, 0.0, 0, 0.0, 0
    step = math.inf
    for o in compared(outcomes):
        scores = score(o.prompt, o.output)
        served: Scores = [None] * len(o.prompt) + [
            {tok: lp} for tok, lp in zip(o.output, o.logprobs, strict=False)
        ]
        stray = max(stray, noise_floor(served, scores))
        for i, tok in enumerate(o.output):
            pos = len(o.prompt) + i
            dist = scores[pos] if pos < len(scores) else None
            if dist and tok in dist:
                n += 1
                lost = max(lost, max(dist.values()) - dist[tok])
            if dist and i < len(o.top) and o.top[i]:
                mine = dict(o.top[i])
                if i < len(o.logprobs):
                    mine.setdefault(tok, o.logprobs[i])
                if len(mine.keys() & dist.keys()) > 1:
                    paired += 1
                    pair = max(pair, pair_change(mine, dist))
            if dist and len(dist) > 1:
                vals = sorted(dist.values())
                gaps = [b - a for a, b in itertools.pairwise(vals) if b - a > 1e-9]
                step = min(step, *gaps) if gaps else step
    return Floor(stray, n, 0.0 if math.isinf(step) else step, pair, lost, paired)


def tolerance_for(floor: Floor) -> float:
    """``FLOOR_FACTOR`` x the floor (never below ``MIN_TOLERANCE``): the larger of 4 x
    the stray or resolution and 3 x the gap move; plus a hair so a gap of exactly that,
    computed in floating point, is not a divergence."""
    return max(FLOOR_FACTOR * floor.value, MIN_TOLERANCE) + 1e-6


@dataclass
class ServerRun:
    """One server of the run under test: the first, or one restarted over the disk tier
    (``--restarts``). Each counts from its own start and logs its own transfers, so the
    byte ledger is judged server by server."""

    label: str  # "server", "restart 1", ...
    log: str  # its log, relative to the run directory
    request_ids: list[str] = field(default_factory=list)  # what it was sent
    counters: dict[str, float] = field(default_factory=dict)  # its deltas, start to end
    disk_counters: bool = True  # it exports the tiering counters (0.28+)
    start_seconds: float | None = None  # to /health (None: the first, or it never started)
    alive: bool = True
    death: str = ""
    log_lines: list[str] = field(default_factory=list, repr=False)

    @property
    def restarted(self) -> bool:
        return self.label != "server"

    def record(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "log": self.log,
            "requests": len(self.request_ids),
            "start_seconds": self.start_seconds,
            "counters": self.counters,
            "alive": self.alive,
            "death": self.death or None,
        }


@dataclass
class ReferenceSource:
    """Where a run's reference came from (``run.json`` → ``stress.reference_source`` and
    ``reference_cache``; one line on the console and in ``divergence.md``)."""

    path: str  # the cache file
    launched: bool = False
    floor: str = "cache"  # "cache" or "measured" (by the launched reference)
    cached: int = 0  # compared requests whose scores the cache held
    scored: int = 0  # compared requests the launched reference scored
    reason: str = ""  # why it was launched
    warning: str = ""  # the cache was unreadable, or could not be written

    @property
    def label(self) -> str:
        return "launched" if self.launched else f"cache {self.path}"

    def record(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "launched": self.launched,
            "floor": self.floor,
            "scores_cached": self.cached,
            "scores_scored": self.scored,
            "reason": self.reason or None,
            "warning": self.warning or None,
        }

    def line(self) -> str:
        counts = f"{self.cached} scores cached, {self.scored} scored"
        if not self.launched:
            text = f"reference from cache {self.path} ({counts}; no reference server launched)"
        else:
            text = (
                f"reference launched ({self.reason}); floor from "
                f"{'the cache' if self.floor == 'cache' else 'its replay'}, {counts}; "
                f"cache {self.path}"
            )
        return f"{text}; {self.warning}" if self.warning else text


@dataclass
class StressResult:
    """What a stress run observed (written as it goes; ``checks`` last)."""

    plan: StressPlan
    outcomes: list[Outcome] = field(default_factory=list)  # the run under test
    reference: list[Outcome] = field(default_factory=list)  # the reference's own run
    floor: float | None = None
    floor_tokens: int = 0
    floor_stray: float | None = None  # the floor's parts (``Floor``)
    floor_resolution: float | None = None
    floor_pair: float | None = None
    floor_lost: float | None = None
    tolerance: float | None = None
    # each server's attention backend and kernel ISA, and the AMX permission, from its
    # log ("server", "reference"): decode and prefill round alike on some kernels only
    engine_kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    verdicts: dict[str, Any] = field(default_factory=dict)  # request id -> TokenVerdict
    counters: dict[str, float] = field(default_factory=dict)  # the run under test's deltas
    log_lines: list[str] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)
    sent: list[PlannedRequest] = field(default_factory=list)  # every round's requests
    rounds: int = 0
    traffic_seconds: float = 0.0
    longest_still_s: float = 0.0  # the stall watch's longest quiet (``run.Sampler``)
    server_alive: bool = True
    death: str = ""
    pool_tokens: int | None = None  # the live GPU pool
    engine_groups: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    reference_error: str = ""
    attached: bool = False  # --url: a server someone else launched, no reference
    # request id -> the reference's own continuation from the first divergence
    explanations: dict[str, dict[str, Any]] = field(default_factory=dict)
    disk_files: DiskInventory | None = None  # a disk tier's chunk files after the run
    disk_counters: bool = True  # the server exports the tiering counters (0.28+)
    # Every server of the run under test in order (``--restarts``: more than one);
    # ``counters`` and ``log_lines`` above are their sums.
    servers: list[ServerRun] = field(default_factory=list)
    # Where the reference came from with ``--reference-cache`` (None: launched, no cache)
    reference_source: ReferenceSource | None = None

    def compared_count(self) -> int:
        return len(compared(self.outcomes))

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def figures(self) -> dict[str, Any]:
        """``run.json``'s ``stress``: what the run did, in numbers."""
        outs = self.outcomes
        diffs = served_differences(self) if self.reference else []
        figures: dict[str, Any] = {
            "requests_sent": len(outs),
            "requests_compared": self.compared_count(),
            "requests_aborted": sum(o.aborted for o in outs),
            "requests_failed": sum(bool(o.error) for o in outs),
            "fillers": sum(o.filler for o in outs),
            "rounds": self.rounds,
            "traffic_seconds": round(self.traffic_seconds, 2),
            "longest_still_s": round(self.longest_still_s, 2),
            "stall_after_s": self.plan.stall_s,
            "generated_tokens": sum(len(o.output) for o in outs),
            "pool_tokens": self.pool_tokens,
            "noise_floor": self.floor,
            "floor_tokens": self.floor_tokens,
            "floor_stray": self.floor_stray,
            "floor_resolution": self.floor_resolution,
            "floor_pair": self.floor_pair,
            "floor_lost": self.floor_lost,
            "tolerance": self.tolerance,
            "engine_kernels": self.engine_kernels,
            "near_ties": sum(v.near_ties for v in self.verdicts.values()),
            "near_tie_widest": max((v.widest for v in self.verdicts.values()), default=0.0),
            "served_differ_requests": len(diffs) if self.reference else None,
            "served_max_diff": max((d.max_diff for d in diffs), default=0.0)
            if self.reference
            else None,
            "counters": self.counters,
            "disk_files": self.disk_files.record() if self.disk_files else None,
            "servers": [sv.record() for sv in self.servers],
            "reference_error": self.reference_error or None,
            "death": self.death or None,
        }
        if self.reference_source is not None:  # only with --reference-cache
            figures["reference_source"] = self.reference_source.label
            figures["reference_cache"] = self.reference_source.record()
        return figures


def http_scorer(base_url: str, model: str) -> Scorer:
    """A ``Scorer`` through ``/v1/completions`` with ``prompt_logprobs``."""
    from harness.commands.stress.driver import post_json

    def score(prompt: list[int], output: list[int]) -> Scores:
        req = score_request(prompt, output)
        body = post_json(
            f"{base_url}/v1/completions",
            {
                "model": model,
                "prompt": req.prompt,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": SCORE_TOP,
                "return_token_ids": True,
            },
            600.0,
        )
        return parse_prompt_logprobs(body["choices"][0].get("prompt_logprobs"))

    return score


def judge_run(result: StressResult, score: Scorer) -> None:
    """Every compared request of the run under test, scored alone, judged within the
    tolerance."""
    assert result.tolerance is not None
    for o in compared(result.outcomes):
        result.verdicts[o.id] = judge_tokens(
            len(o.prompt), o.output, score(o.prompt, o.output), result.tolerance
        )


def run_reference_side(result: StressResult, send: Callable[..., Reply], score: Scorer) -> None:
    """On the reference server: the plan at the same concurrency (the floor), then the
    run under test's requests scored alone."""
    plan = result.plan
    result.reference = drive(plan.requests, send, plan.concurrency)
    set_floor(result, floor_of(result.reference, score))
    judge_run(result, score)
    explain_divergences(result, send)


def set_floor(result: StressResult, fl: Floor) -> None:
    """The floor's figures on the result, and the tolerance it gives."""
    result.floor, result.floor_tokens = fl.value, fl.tokens
    result.floor_stray, result.floor_resolution = fl.stray, fl.resolution
    result.floor_pair, result.floor_lost = fl.pair, fl.lost
    result.tolerance = tolerance_for(fl)


# Tokens of each side shown from the first divergence on (divergence.md).
SHOWN_TOKENS = 12


def explain_divergences(result: StressResult, send: Callable[..., Reply]) -> None:
    """For each diverging request, what the reference says from the divergence on: its
    greedy continuation of the prompt and the run's tokens before the divergence, beside
    the run's own (both texts in ``divergence.md``)."""
    by = {o.id: o for o in result.outcomes}
    for rid, verdict in result.verdicts.items():
        d = verdict.divergence
        if d is None or rid not in by:
            continue
        o = by[rid]
        prompt = o.prompt + o.output[: d.index]
        ask = PlannedRequest(f"explain/{rid}", "explain", 0.0, prompt, max_tokens=SHOWN_TOKENS)
        try:
            reply = send(ask, prompt)
        except Exception as err:  # an explanation is a courtesy, never the verdict
            result.explanations[rid] = {"error": f"{type(err).__name__}: {err}"}
            continue
        result.explanations[rid] = {"reference_ids": reply.ids, "reference_text": reply.text}


def group_kinds(groups: Sequence[dict[str, Any]]) -> list[str]:
    from harness.server.kv_layout import spec_kind

    return [spec_kind(g) for g in groups]


def ledger_of(result: StressResult, server: ServerRun | None = None) -> Any:
    """The byte ledger: vLLM's counters, the host backend's per-kind trace, and what the
    requests as sent and answered say should have moved; of one ``server`` (its own
    counters, log and requests) or of the whole run.

    A restarted server's CPU tier starts empty and its lookups promote prefixes from
    disk into it without a store from the GPU, so it stores up to one chunk fewer per
    chunk hit (``ext_hits / chunk``) than the chunks its requests filled."""
    from harness.commands.stress.checks import Ledger, parse_transfers, per_kind, stored_chunks

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
    from harness.commands.stress.checks import (
        check_happened,
        check_log,
        check_no_errors,
        check_outputs,
        check_prefix_reuse,
    )
    from harness.results.records import CheckResult

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
    from harness.commands.stress.checks import check_prefix_reuse

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
    from harness.results.records import CheckResult

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
    from harness.commands.stress.checks import check_ledger

    # Under pressure a chunk may be stored again after its eviction, or not at all when
    # the tier has no room: the store count is the policy's choice, not judged.
    stores = not result.plan.under_pressure
    return per_server(result, lambda sv: check_ledger(ledger_of(result, sv), stores=stores))


def check_disk_for(result: StressResult) -> list[Any]:
    """Over a disk tier: no write or read failed, the files are whole chunks, and under
    pressure the disk really served prefixes the CPU tier had evicted (each disk hit one
    file read); with a roomy CPU tier, the disk serves nothing."""
    from harness.commands.roundtrip import disk_checks as dc

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
    from harness.results.records import CheckResult

    tier = int(result.plan.connector_config.get("cpu_bytes_to_use") or 0)
    stored = float(result.counters.get("stored_bytes", 0.0))
    return CheckResult(
        "tier-evicted",
        stored > tier > 0,
        f"stored > the tier's {tier:,} B ({result.plan.tier_fraction:g} of what the plan stores)",
        f"stored {stored:,.0f} B",
        "a tier under pressure that never evicted proved nothing about eviction",
    )


@dataclass(frozen=True)
class ServedDiff:
    """One request as served by the run under test and by the reference's replay, when
    both got the same prompt: where their logprobs or tokens first part. A diagnostic,
    not a verdict (the replay's batches differ), that shows which requests moved."""

    id: str
    cached_tokens: int | None
    reference_cached_tokens: int | None
    differing: int  # generated positions whose logprob differs (before any token does)
    max_diff: float
    first: int | None  # first differing position
    token_at: int | None  # first position where the tokens themselves differ


def served_differences(result: StressResult) -> list[ServedDiff]:
    ref = {o.id: o for o in result.reference}
    out = []
    for o in compared(result.outcomes):
        r = ref.get(o.id)
        if r is None or r.prompt != o.prompt or not o.logprobs or not r.logprobs:
            continue
        n, worst, first, token_at = 0, 0.0, None, None
        for i, (a, b) in enumerate(zip(o.output, r.output, strict=False)):
            if a != b:
                token_at = i
                first = i if first is None else first
                break
            if i < len(o.logprobs) and i < len(r.logprobs) and o.logprobs[i] != r.logprobs[i]:
                n += 1
                worst = max(worst, abs(o.logprobs[i] - r.logprobs[i]))
                first = i if first is None else first
        if first is not None:
            out.append(
                ServedDiff(o.id, o.cached_tokens, r.cached_tokens, n, worst, first, token_at)
            )
    return out


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
