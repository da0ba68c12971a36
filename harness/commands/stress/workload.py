"""Stress workloads: seeded request plans for the traffic where offload bugs live.

The round trip sends one request at a time through fixed phases; the bugs vLLM fixed
this year lived in concurrency, preemption, multi-turn chats, aborted requests and
accounting of unusual requests. Each profile here turns a few numbers (a scenario's
``[profiles.<name>]`` table) and a seed into a plan: every request, when it arrives,
what it sends, and what it depends on. The plan is pure data, made before any launch,
so a run can be replayed exactly on a reference server and a failing seed rerun.

A multi-turn request's prompt is its previous turn's prompt, that turn's answer and new
text; the answer is only known at run time, so the plan names the parent and the new
tokens, and the driver assembles the prompt when the parent has finished.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.scenario.stress_profiles import PROFILES, ProfileSettings
from harness.server.workload import FIRST_ORDINARY_ID


@dataclass
class PlannedRequest:
    """One request of a plan; ``prompt`` is whole unless ``parent`` is set."""

    id: str  # "multi-turn/c1/t2", "shared-prefix/f0/m1", "filler/3"
    profile: str
    at_s: float  # arrival, seconds after the run starts
    prompt: list[int] = field(
        default_factory=list
    )  # the whole prompt, or new text after the parent's
    parent: str | None = None  # multi-turn: previous turn (its prompt + answer come first)
    max_tokens: int = 48
    abort_after: int | None = None  # disconnect after this many streamed tokens
    prompt_logprobs: int | None = None
    filler: bool = False  # unrelated traffic: not compared, only there to evict

    def record(self) -> dict[str, Any]:
        data = asdict(self)
        data["prompt"] = f"<{len(self.prompt)} token ids>"
        return data


class _Tokens:
    """Seeded token streams: prompts from the lower half of the vocabulary, fillers from
    the upper half, so unrelated traffic never shares a prefix with what it evicts."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        if vocab_size < 4 * FIRST_ORDINARY_ID:
            raise ValueError(f"vocabulary of {vocab_size} is too small for disjoint prompts")
        self.mid = (FIRST_ORDINARY_ID + vocab_size) // 2
        self.top = vocab_size
        self.rng = random.Random(seed)

    def text(self, n: int) -> list[int]:
        return [self.rng.randrange(FIRST_ORDINARY_ID, self.mid) for _ in range(n)]

    def filler(self, n: int) -> list[int]:
        return [self.rng.randrange(self.mid, self.top) for _ in range(n)]


def plan_profile(
    profile: str, s: ProfileSettings, vocab_size: int, seed: int
) -> list[PlannedRequest]:
    """Every request of one profile, in arrival order; the same inputs give the same
    plan on every machine."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    tok = _Tokens(vocab_size, seed)
    rng = random.Random(seed + 7)
    if profile == "mixed":
        out: list[PlannedRequest] = []
        for i, p in enumerate(PROFILES[:-1]):
            out += plan_profile(p, s, vocab_size, seed + 1000 * (i + 1))
        for r in out:  # seeded random arrivals across the whole run
            r.at_s = round(rng.uniform(0.0, s.spread_s), 3)
        return _ordered(out)
    make = {
        "multi-turn": _multi_turn,
        "shared-prefix": _shared_prefix,
        "preemption": _preemption,
        "abort": _abort,
        "prompt-logprobs": _prompt_logprobs,
    }[profile]
    return _ordered(make(s, tok, rng))


def _ordered(reqs: list[PlannedRequest]) -> list[PlannedRequest]:
    """Arrival order; a turn never arrives before its parent (it waits for it anyway)."""
    by = {r.id: r for r in reqs}
    for r in reqs:
        if r.parent is not None:
            r.at_s = max(r.at_s, by[r.parent].at_s)
    return sorted(reqs, key=lambda r: (r.at_s, r.id))


def _fillers(s: ProfileSettings, tok: _Tokens, name: str, at_s: float) -> list[PlannedRequest]:
    return [
        PlannedRequest(
            f"filler/{name}/{i}",
            "filler",
            at_s,
            tok.filler(s.filler_tokens),
            max_tokens=1,
            filler=True,
        )
        for i in range(s.fillers)
    ]


def _multi_turn(s: ProfileSettings, tok: _Tokens, rng: random.Random) -> list[PlannedRequest]:
    """K chats interleaved; after each round of turns, unrelated fillers, so turn t+1
    finds its history evicted from the GPU and served from the CPU tier."""
    out: list[PlannedRequest] = []
    for t in range(s.turns):
        at = t * s.spread_s
        for c in range(s.conversations):
            rid = f"multi-turn/c{c}/t{t}"
            parent = f"multi-turn/c{c}/t{t - 1}" if t else None
            n = s.first_tokens if t == 0 else s.turn_tokens
            out.append(
                PlannedRequest(
                    rid,
                    "multi-turn",
                    round(at + rng.uniform(0, s.spread_s / 2), 3),
                    tok.text(n),
                    parent=parent,
                    max_tokens=s.turn_max_tokens,
                )
            )
        out += _fillers(s, tok, f"mt{t}", at + s.spread_s * 0.75)
    return out


def _shared_prefix(s: ProfileSettings, tok: _Tokens, rng: random.Random) -> list[PlannedRequest]:
    """Families of prompts sharing a prefix of varied length (also not a multiple of any
    block or chunk), so hits end inside chunks and windows at unaligned positions."""
    out: list[PlannedRequest] = []
    for f in range(s.families):
        prefix = tok.text(s.prefix_tokens[f % len(s.prefix_tokens)])
        for m in range(s.members):
            out.append(
                PlannedRequest(
                    f"shared-prefix/f{f}/m{m}",
                    "shared-prefix",
                    round(m * s.spread_s + rng.uniform(0, s.spread_s / 2), 3),
                    prefix + tok.text(s.suffix_tokens),
                    max_tokens=s.max_tokens,
                )
            )
    for m in range(1, s.members):
        out += _fillers(s, tok, f"sp{m}", m * s.spread_s - s.spread_s / 4)
    return out


def _preemption(s: ProfileSettings, tok: _Tokens, rng: random.Random) -> list[PlannedRequest]:
    """More long requests at once than the pool holds to the end of their generation:
    the scheduler preempts some and resumes them (their stores must still be right)."""
    return [
        PlannedRequest(
            f"preemption/r{i}",
            "preemption",
            round(rng.uniform(0, 0.2), 3),
            tok.text(s.long_prompt),
            max_tokens=s.long_max_tokens,
        )
        for i in range(s.long_requests)
    ]


def _abort(s: ProfileSettings, tok: _Tokens, rng: random.Random) -> list[PlannedRequest]:
    """Clients that disconnect mid-generation, next to ones that do not."""
    out = []
    for i in range(s.aborts):
        out.append(
            PlannedRequest(
                f"abort/r{i}",
                "abort",
                round(rng.uniform(0, s.spread_s), 3),
                tok.text(s.first_tokens),
                max_tokens=s.max_tokens * 4,
                abort_after=s.abort_after,
            )
        )
    return out


def _prompt_logprobs(s: ProfileSettings, tok: _Tokens, rng: random.Random) -> list[PlannedRequest]:
    """Requests with prompt_logprobs (they skip reading the prefix cache), after the same
    prompt was sent plainly: the accounting of both tiers must stay exact."""
    out = []
    for i in range(s.logprob_requests):
        prompt = tok.text(s.first_tokens)
        at = round(rng.uniform(0, s.spread_s), 3)
        out.append(
            PlannedRequest(
                f"prompt-logprobs/r{i}/plain",
                "prompt-logprobs",
                at,
                prompt,
                max_tokens=s.max_tokens,
            )
        )
        out.append(
            PlannedRequest(
                f"prompt-logprobs/r{i}/scored",
                "prompt-logprobs",
                at + s.spread_s,
                list(prompt),
                max_tokens=s.max_tokens,
                prompt_logprobs=1,
            )
        )
    return out


def plan_summary(reqs: Sequence[PlannedRequest]) -> dict[str, int]:
    """Requests per profile (fillers apart): what a dry run and the results show."""
    out: dict[str, int] = {}
    for r in reqs:
        out[r.profile] = out.get(r.profile, 0) + 1
    return out
