"""The noise floor and the tolerance a stress run is judged within: how far a clean
concurrent run's tokens stray from the same tokens scored alone on the reference server
(teacher-forced prefill), measured on the kernel that ran, never assumed; and the scoring
request the reference answers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.commands.stress.driver import Outcome
from harness.commands.stress.reference import (
    Scores,
    noise_floor,
)
from harness.commands.stress.workload import PlannedRequest

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
