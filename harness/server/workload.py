"""The round trip's traffic: deterministic prompts as token ids, sent one at a time.

Prompts are lists of token ids, not text, so their lengths are exact and the block
arithmetic of the checks does not depend on a tokenizer (the harness's local models
map id i to word ``t<i>``; a real model in attach mode takes ids just the same).
Targets and fillers are drawn from disjoint id ranges, so no filler can ever share a
first block with a target and be mistaken for a prefix hit.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from harness.server.launcher import http_json

# Ids below this are left alone: special tokens live there in every tokenizer we build.
FIRST_ORDINARY_ID = 16


@dataclass
class Prompt:
    name: str  # "target-0", "filler-3", ...
    kind: str  # "target" | "filler"
    token_ids: list[int]


def make_prompts(
    target_lengths: list[int], filler_length: int, filler_count: int, vocab_size: int, seed: int
) -> tuple[list[Prompt], list[Prompt]]:
    """Targets from the lower half of the vocabulary, fillers from the upper half."""
    if vocab_size < 4 * FIRST_ORDINARY_ID:
        raise ValueError(f"vocabulary of {vocab_size} is too small for disjoint prompts")
    mid = (FIRST_ORDINARY_ID + vocab_size) // 2
    rng = random.Random(seed)
    targets = [
        Prompt(f"target-{i}", "target", [rng.randrange(FIRST_ORDINARY_ID, mid) for _ in range(n)])
        for i, n in enumerate(target_lengths)
    ]
    rng_f = random.Random(seed + 1)
    fillers = [
        Prompt(
            f"filler-{i}",
            "filler",
            [rng_f.randrange(mid, vocab_size) for _ in range(filler_length)],
        )
        for i in range(filler_count)
    ]
    return targets, fillers


def make_fillers(lengths: list[int], vocab_size: int, seed: int) -> list[Prompt]:
    """Fillers of the given lengths, from the upper half of the vocabulary."""
    mid = (FIRST_ORDINARY_ID + vocab_size) // 2
    rng = random.Random(seed + 1)
    return [
        Prompt(f"filler-{i}", "filler", [rng.randrange(mid, vocab_size) for _ in range(n)])
        for i, n in enumerate(lengths)
    ]


@dataclass
class Completion:
    """One request and what came back, kept whole for requests.jsonl and the diff."""

    phase: str
    prompt: str
    prompt_tokens: int
    request: dict[str, Any]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: Any = None
    seconds: float = 0.0
    started_at: float = 0.0
    error: str = ""
    # usage.prompt_tokens_details.cached_tokens: the prompt tokens served from a cache
    # (GPU prefix cache or connector); None when the server does not report it
    # (--enable-prompt-tokens-details).
    cached_tokens: int | None = None

    def record(self) -> dict[str, Any]:
        req = dict(self.request)
        req["prompt"] = f"<{self.prompt_tokens} token ids of {self.prompt}>"
        return {
            "phase": self.phase,
            "prompt": self.prompt,
            "prompt_tokens": self.prompt_tokens,
            "request": req,
            "text": self.text,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "seconds": round(self.seconds, 4),
            "started_at": self.started_at,
            "error": self.error,
            "cached_tokens": self.cached_tokens,
        }

    def canonical(self, field_name: str) -> str:
        """Byte-exact form of one output field, for comparison."""
        return json.dumps(getattr(self, field_name), sort_keys=True, separators=(",", ":"))


def complete(
    base_url: str,
    model: str,
    prompt: Prompt,
    phase: str,
    *,
    max_tokens: int,
    logprobs: int,
    seed: int,
    timeout_s: float = 600.0,
    prompt_logprobs: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Completion:
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompt.token_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": seed,
        "logprobs": logprobs,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if prompt_logprobs is not None:
        payload["prompt_logprobs"] = prompt_logprobs
    payload.update(extra or {})  # e.g. kv_transfer_params (max_load_tokens)
    out = Completion(phase, prompt.name, len(prompt.token_ids), payload, started_at=time.time())
    t0 = time.perf_counter()
    resp = http_json(f"{base_url}/v1/completions", payload, timeout_s)
    out.seconds = time.perf_counter() - t0
    choice = resp["choices"][0]
    out.text = choice.get("text", "")
    out.token_ids = list(choice.get("token_ids") or [])
    out.logprobs = choice.get("logprobs")
    out.cached_tokens = cached_tokens_of(resp)
    return out


def cached_tokens_of(response: dict[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a completion response: the prompt
    tokens a cache served; None when the server does not report it."""
    details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return int(cached) if cached is not None else None


@dataclass
class Divergence:
    field: str
    position: int | None
    left: Any
    right: Any


def first_divergence(a: Completion, b: Completion) -> Divergence | None:
    """Where two outputs first differ: text, then token ids, then logprobs."""
    if a.text != b.text:
        pos = next(
            (i for i, (x, y) in enumerate(zip(a.text, b.text, strict=False)) if x != y),
            min(len(a.text), len(b.text)),
        )
        return Divergence("text", pos, a.text[pos : pos + 40], b.text[pos : pos + 40])
    if a.token_ids != b.token_ids:
        pos = next(
            (i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y),
            min(len(a.token_ids), len(b.token_ids)),
        )
        return Divergence("token_ids", pos, a.token_ids[pos : pos + 8], b.token_ids[pos : pos + 8])
    if a.canonical("logprobs") != b.canonical("logprobs"):
        la, lb = a.logprobs or {}, b.logprobs or {}
        for key in ("token_logprobs", "top_logprobs", "tokens", "text_offset"):
            xa, xb = la.get(key) or [], lb.get(key) or []
            for i, (x, y) in enumerate(zip(xa, xb, strict=False)):
                if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
                    return Divergence(f"logprobs.{key}", i, x, y)
            if len(xa) != len(xb):
                return Divergence(f"logprobs.{key}", min(len(xa), len(xb)), len(xa), len(xb))
        return Divergence("logprobs", None, la, lb)
    return None


@dataclass
class Closeness:
    """How two outputs of different processes compare under a logprob tolerance."""

    divergence: Divergence | None  # beyond tolerance (a real difference), or None
    max_delta: float = 0.0  # largest |logprob difference| seen where tokens agreed
    near_tie: int | None = None  # token position where a near-tie flipped the choice


def _top(c: Completion, i: int) -> dict[str, float]:
    tops = (c.logprobs or {}).get("top_logprobs") or []
    return dict(tops[i] or {}) if i < len(tops) else {}


def within_tolerance(a: Completion, b: Completion, tol: float) -> Closeness:
    """Compare two greedy outputs whose numerics may differ by up to ``tol`` per logprob.

    Two processes need not compute bit-identically (bf16 accumulation order changes
    with kernels and block placement): on an AMX host two servers of one build gave
    logprobs up to 0.0039 apart and, at an exact tie, picked different tokens. So token
    ids must agree and logprobs stay within ``tol``, except at a near-tie: where both
    outputs list both candidates within ``tol`` of each other, a different choice is
    numerics, not a bug, and the rest (conditioned on different tokens) is not compared.
    """
    la, lb = a.logprobs or {}, b.logprobs or {}
    ta, tb = la.get("tokens") or [], lb.get("tokens") or []
    pa, pb = la.get("token_logprobs") or [], lb.get("token_logprobs") or []
    out = Closeness(None)
    for i, (xa, xb) in enumerate(zip(a.token_ids, b.token_ids, strict=False)):
        top_a, top_b = _top(a, i), _top(b, i)
        if xa != xb:
            sa = str(ta[i]) if i < len(ta) else ""
            sb = str(tb[i]) if i < len(tb) else ""
            tie = (
                bool(sa and sb)
                and sa != sb
                and all(s in top for s in (sa, sb) for top in (top_a, top_b))
                and all(abs(top[sa] - top[sb]) <= tol for top in (top_a, top_b))
            )
            if tie:
                out.near_tie = i
                return out
            out.divergence = Divergence(
                "token_ids", i, a.token_ids[i : i + 8], b.token_ids[i : i + 8]
            )
            return out
        pairs = [(pa[i], pb[i])] if i < len(pa) and i < len(pb) else []
        pairs += [(v, top_b[k]) for k, v in top_a.items() if k in top_b]
        for x, y in pairs:
            if x is None or y is None:
                continue
            delta = abs(float(x) - float(y))
            out.max_delta = max(out.max_delta, delta)
            if delta > tol:
                out.divergence = Divergence("logprobs", i, x, y)
                return out
    if len(a.token_ids) != len(b.token_ids):
        n = min(len(a.token_ids), len(b.token_ids))
        out.divergence = Divergence("token_ids", n, len(a.token_ids), len(b.token_ids))
    return out
