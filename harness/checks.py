"""The round trip's checks: pure functions from measured figures to verdicts.

Each check states what it expected, what it observed, and why it exists, so a
failure reads as a diagnosis rather than a red cross. The expected figures come
from the plan (model geometry, offload chunk size, prompt lengths), never from the
run being judged.

Expected replay load, derived from vLLM's reachable-tail logic
(``get_sliding_window_size_in_chunks`` and the chunked-local KV manager):

- a full-attention layer needs every hit token: ``hit x bytes_per_token(layer)``;
- a chunked-local layer never attends past the start of the attention chunk that
  holds the hit boundary, so it needs only the tokens from that chunk start up to
  the boundary: ``(hit - floor(hit / A) * A) x bytes_per_token(layer)`` with A the
  ``attention_chunk_size``. When every prompt fits in one attention chunk this is
  the whole hit and loaded == stored (the PR's 245 MB = 245 MB); with a hit boundary
  on a multiple of A, chunked layers need nothing at all.
- the hit itself is block-aligned at the offload chunk C and the last prompt token
  is always recomputed: ``hit = floor((L - 1) / C) * C`` (the PR: 1248 of 1262).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TargetExpectation:
    name: str
    prompt_tokens: int
    stored_tokens: int  # full offload chunks of the cold request
    hit_tokens: int  # external hit on replay
    chunked_needed_tokens: int  # tokens a chunked-local layer needs from the hit


@dataclass
class Expected:
    """Everything the plan predicts; figures are totals over all layers and TP ranks."""

    kv_bytes_per_token: int
    full_bytes_per_token: int  # sum over full-attention layers
    chunked_bytes_per_token: int  # sum over chunked-local layers
    tokens_per_chunk: int
    attention_chunk_size: int | None
    targets: list[TargetExpectation] = field(default_factory=list)
    # False when the layer kinds are unknown (attach mode without --config): the load
    # can then only be bounded, 0 < loaded <= hit x bytes per token.
    exact_load: bool = True

    @property
    def stored_bytes(self) -> int:
        return sum(t.stored_tokens for t in self.targets) * self.kv_bytes_per_token

    @property
    def hit_tokens(self) -> int:
        return sum(t.hit_tokens for t in self.targets)

    @property
    def loaded_bytes(self) -> int:
        return sum(t.hit_tokens * self.full_bytes_per_token
                   + t.chunked_needed_tokens * self.chunked_bytes_per_token
                   for t in self.targets)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(stored_bytes=self.stored_bytes, hit_tokens=self.hit_tokens,
                    loaded_bytes=self.loaded_bytes)
        return data


def expected_for(
    *, prompt_lengths: dict[str, int], max_tokens: int, tokens_per_chunk: int,
    attention_chunk_size: int | None, full_bpt: int, chunked_bpt: int,
) -> Expected:
    c = tokens_per_chunk
    exp = Expected(full_bpt + chunked_bpt, full_bpt, chunked_bpt, c, attention_chunk_size)
    for name, length in prompt_lengths.items():
        # KV exists for every token but the last one generated.
        stored = ((length + max_tokens - 1) // c) * c
        hit = ((length - 1) // c) * c
        if attention_chunk_size and chunked_bpt:
            a = attention_chunk_size
            needed = hit - (hit // a) * a
        else:
            needed = hit
        exp.targets.append(TargetExpectation(name, length, stored, hit, needed))
    return exp


@dataclass
class CheckResult:
    name: str
    passed: bool
    expected: str
    observed: str
    why: str  # what the check guards against
    detail: str = ""  # on failure: where and how it went wrong
    informational: bool = False  # reported, never fails the run

    def record(self) -> dict[str, Any]:
        return asdict(self)


def _fmt_bytes(n: float) -> str:
    return f"{int(n):,} B"


def check_stored(exp: Expected, cold_stored: float) -> CheckResult:
    tokens = sum(t.stored_tokens for t in exp.targets)
    per_token = cold_stored / tokens if tokens else 0.0
    ok = int(cold_stored) == exp.stored_bytes and exp.stored_bytes > 0
    return CheckResult(
        "cold-stored-bytes", ok,
        f"{_fmt_bytes(exp.stored_bytes)} ({tokens} tokens x {exp.kv_bytes_per_token} B)",
        f"{_fmt_bytes(cold_stored)} ({per_token:,.1f} B/token measured)",
        "the first pass must offload every full chunk of every layer, at the config's "
        "KV bytes per token",
        "" if ok else ("nothing was stored" if cold_stored == 0 else
                       f"measured {per_token:,.1f} B/token vs config {exp.kv_bytes_per_token}"),
    )


def check_filler_loaded_nothing(filler_loaded: float) -> CheckResult:
    ok = filler_loaded == 0
    return CheckResult(
        "filler-loaded-nothing", ok, "0 B", _fmt_bytes(filler_loaded),
        "unrelated prompts share no prefix with the targets: any load is a false hit",
    )


def check_evicted(replay_gpu_hits: float) -> CheckResult:
    ok = replay_gpu_hits == 0
    return CheckResult(
        "gpu-cache-evicted", ok, "0 GPU prefix-cache hit tokens on replay",
        f"{int(replay_gpu_hits)} tokens",
        "the replay must come from the connector, so the filler must have evicted the "
        "targets from the GPU prefix cache",
        "" if ok else "the filler was too small to evict the GPU pool; the replay was "
                      "served from GPU memory and proves nothing about offloading",
    )


def check_loaded(exp: Expected, replay_loaded: float) -> CheckResult:
    if not exp.exact_load:
        bound = exp.hit_tokens * exp.kv_bytes_per_token
        ok = 0 < replay_loaded <= bound
        return CheckResult(
            "replay-loaded-bytes", ok, f"0 < loaded <= {bound:,} B (layer kinds unknown: "
            "pass --config for the exact figure)", _fmt_bytes(replay_loaded),
            "the replay must load back what it hits, and never more",
            "" if ok else ("nothing was loaded back" if replay_loaded == 0 else
                           "more bytes loaded than the hit can need"))
    ok = int(replay_loaded) == exp.loaded_bytes and exp.loaded_bytes > 0
    full = exp.hit_tokens * exp.full_bytes_per_token
    chunked = exp.loaded_bytes - full
    detail = ""
    if not ok:
        detail = ("nothing was loaded back" if replay_loaded == 0 else
                  f"off by {int(replay_loaded) - exp.loaded_bytes:+,} B")
    return CheckResult(
        "replay-loaded-bytes", ok,
        f"{_fmt_bytes(exp.loaded_bytes)} (full layers {full:,} + chunked-local {chunked:,})",
        _fmt_bytes(replay_loaded),
        "the replay must load back exactly what its hit needs: all of it for full "
        "attention, the current attention chunk's part for chunked-local layers",
        detail,
    )


def check_ext_hits(exp: Expected, replay_ext_hits: float) -> CheckResult:
    ok = int(replay_ext_hits) == exp.hit_tokens
    per = ", ".join(f"{t.hit_tokens}/{t.prompt_tokens}" for t in exp.targets)
    return CheckResult(
        "replay-external-hits", ok, f"{exp.hit_tokens} tokens ({per})",
        f"{int(replay_ext_hits)} tokens",
        "the connector must serve every block-aligned prompt token but the last",
        "" if ok else ("fewer hits than stored: chunks stored but not found (or a window "
                       "rounded down)" if replay_ext_hits < exp.hit_tokens else
                       "more hits than possible: double counting"),
    )


def check_outputs(pairs: list[tuple[str, Any]], name: str, why: str) -> CheckResult:
    """``pairs``: (request name, Divergence or None) for each target."""
    bad = [(req, div) for req, div in pairs if div is not None]
    detail = ""
    if bad:
        req, div = bad[0]
        detail = (f"{req}: first difference in {div.field} at position {div.position}: "
                  f"{div.left!r} vs {div.right!r}")
    return CheckResult(
        name, not bad, f"{len(pairs)} identical outputs (text, token ids, logprobs)",
        f"{len(pairs) - len(bad)} identical", why, detail)
