"""The round trip's checks: pure functions from measured figures to verdicts.

Each check states what it expected, what it observed, and why it exists, so a
failure reads as a diagnosis rather than a red cross. The expected figures come
from the plan (model geometry, offload chunk size, prompt lengths), never from the
run being judged.

Expected figures per KV-cache kind, derived from vLLM's offloading scheduler
(``get_sliding_window_size_in_chunks``, the lookup, and each kind's KV manager; the
derivation with code references is in ``docs/offload-rules.md``). L = prompt tokens,
G = generated tokens, C = offload chunk, B = KV block, H = external hit on replay:

- stores: every full offload chunk of every attention layer,
  ``floor((L + G - 1) / C) * C`` tokens, except that a sliding-window layer has
  already freed the blocks its window left behind at the prompt's last full chunk
  boundary, ``floor(max(0, floor(L / C) * C - W + 1) / B)`` blocks, which are then
  never stored (measured on 0.32.0: 1000-token prompts, W 512, lose chunk 0);
  Mamba layers store one state per chunk-aligned state position instead.
- the hit: block-aligned at C, the last prompt token always recomputed:
  ``H = floor((L - 1) / C) * C`` (the PR: 1248 of 1262). With a Mamba group in align
  mode the hit must also land on the prefill's state checkpoint
  ``P = floor((L - 1) / B) * B``, so ``H = 0`` unless ``P`` is a multiple of C.
- the load, per layer kind, is only what that layer can still attend to:
  full attention and MLA (a full-attention spec) ``H``; chunked local attention the
  part of the current attention chunk, ``H - floor(H / A) * A``; a sliding window W
  the blocks the window reaches, ``H - floor(max(0, H - W + 1) / B) * B``; Mamba one
  state when ``H > 0``. So loaded < stored is correct whenever prompts outrun a window.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from harness.oracle.content import ContentReport
from harness.results.records import CheckResult
from harness.server.kv_layout import KindLayout

ATTENTION_KINDS = ("full", "mla", "chunked-local", "sliding-window")


def hit_tokens(length: int, c: int, block: int, has_mamba: bool) -> int:
    hit = ((length - 1) // c) * c
    if has_mamba and (((length - 1) // block) * block) % c:
        return 0
    return hit


def stored_tokens(kind: KindLayout, length: int, stored: int, c: int, block: int) -> int:
    """Tokens' worth of KV one layer of ``kind`` stores on the cold pass."""
    if kind.kind == "sliding-window" and kind.window:
        gone = max(0, (length // c) * c - kind.window + 1) // block * block
        return max(0, stored - gone)
    return stored


def needed_tokens(kind: KindLayout, hit: int, block: int) -> int:
    """Tokens' worth of KV one layer of ``kind`` loads back for an external hit."""
    if kind.kind == "chunked-local" and kind.window:
        return hit - (hit // kind.window) * kind.window
    if kind.kind == "sliding-window" and kind.window:
        return hit - (max(0, hit - kind.window + 1) // block) * block
    return hit


def mamba_states_stored(length: int, max_tokens: int, c: int, block: int) -> int:
    """Chunk-aligned Mamba state positions of one request: the prefill checkpoint,
    and block boundaries the decode crosses."""
    positions = {((length - 1) // block) * block}
    positions |= {p for p in range(block, length + max_tokens, block) if p >= length}
    return sum(1 for p in positions if p > 0 and p % c == 0)


@dataclass
class TargetExpectation:
    name: str
    prompt_tokens: int
    stored_tokens: int  # full offload chunks of the cold request (attention layers)
    hit_tokens: int  # external hit on replay
    chunked_needed_tokens: int  # tokens a chunked-local layer needs from the hit
    stored_bytes: int = 0
    loaded_bytes: int = 0
    # per kind: tokens' worth (Mamba: states) each layer of that kind loads back
    loaded_by_kind: dict[str, int] = field(default_factory=dict)
    stored_by_kind: dict[str, int] = field(default_factory=dict)
    mamba_states_stored: int = 0


@dataclass
class Expected:
    """Everything the plan predicts; figures are totals over all layers and TP ranks."""

    kv_bytes_per_token: int  # attention layers of every kind
    full_bytes_per_token: int  # full attention and MLA layers
    chunked_bytes_per_token: int  # chunked-local layers
    tokens_per_chunk: int
    attention_chunk_size: int | None
    targets: list[TargetExpectation] = field(default_factory=list)
    # False when the layer kinds are unknown (attach mode without --config): the load
    # can then only be bounded, 0 < loaded <= hit x bytes per token.
    exact_load: bool = True
    kv_block_size: int = 0
    layout: list[KindLayout] = field(default_factory=list)
    mamba_state_bytes: int = 0  # one state over all Mamba layers

    @property
    def stored_bytes(self) -> int:
        return sum(t.stored_bytes for t in self.targets)

    @property
    def hit_tokens(self) -> int:
        return sum(t.hit_tokens for t in self.targets)

    @property
    def loaded_bytes(self) -> int:
        return sum(t.loaded_bytes for t in self.targets)

    def loaded_split(self) -> dict[str, int]:
        """Expected replay bytes per kind, summed over the targets."""
        out: dict[str, int] = {}
        for kind in self.layout:
            per = self.mamba_state_bytes if kind.kind == "mamba" else kind.bytes_per_token
            out[kind.kind] = sum(t.loaded_by_kind.get(kind.kind, 0) for t in self.targets) * per
        return out

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            stored_bytes=self.stored_bytes,
            hit_tokens=self.hit_tokens,
            loaded_bytes=self.loaded_bytes,
            loaded_by_kind=self.loaded_split(),
        )
        return data

    def recompute(self, prompt_lengths: dict[str, int], max_tokens: int) -> None:
        """(Re)derive every target's figures, e.g. once the engine reports its state size."""
        c, b = self.tokens_per_chunk, self.kv_block_size or self.tokens_per_chunk
        has_mamba = any(k.kind == "mamba" for k in self.layout)
        self.targets = []
        for name, length in prompt_lengths.items():
            # KV exists for every token but the last one generated.
            stored = ((length + max_tokens - 1) // c) * c
            hit = hit_tokens(length, c, b, has_mamba)
            t = TargetExpectation(name, length, stored, hit, hit)
            states = mamba_states_stored(length, max_tokens, c, b) if has_mamba else 0
            t.mamba_states_stored = states
            t.stored_bytes = states * self.mamba_state_bytes
            for kind in self.layout:
                if kind.kind != "mamba":
                    t.stored_by_kind[kind.kind] = stored_tokens(kind, length, stored, c, b)
                    t.stored_bytes += t.stored_by_kind[kind.kind] * kind.bytes_per_token
                if kind.kind == "mamba":
                    t.loaded_by_kind["mamba"] = 1 if hit else 0
                    t.loaded_bytes += t.loaded_by_kind["mamba"] * self.mamba_state_bytes
                else:
                    need = needed_tokens(kind, hit, b)
                    t.loaded_by_kind[kind.kind] = need
                    t.loaded_bytes += need * kind.bytes_per_token
                    if kind.kind == "chunked-local":
                        t.chunked_needed_tokens = need
            self.targets.append(t)


def expected_for(
    *,
    prompt_lengths: dict[str, int],
    max_tokens: int,
    tokens_per_chunk: int,
    layout: list[KindLayout],
    kv_block_size: int | None = None,
    mamba_state_bytes: int = 0,
) -> Expected:
    by_kind = {k.kind: k for k in layout}
    attn = sum(k.bytes_per_token for k in layout if k.kind in ATTENTION_KINDS)
    full = sum(k.bytes_per_token for k in layout if k.kind in ("full", "mla"))
    chunked = by_kind.get("chunked-local")
    exp = Expected(
        attn,
        full,
        chunked.bytes_per_token if chunked else 0,
        tokens_per_chunk,
        chunked.window if chunked else None,
        kv_block_size=kv_block_size or 0,
        layout=list(layout),
        mamba_state_bytes=mamba_state_bytes,
    )
    exp.recompute(prompt_lengths, max_tokens)
    return exp


def fmt_bytes(n: float) -> str:
    return f"{int(n):,} B"


def check_stored(exp: Expected, cold_stored: float) -> CheckResult:
    tokens = sum(t.stored_tokens for t in exp.targets)
    states = sum(t.mamba_states_stored for t in exp.targets)
    mamba = states * exp.mamba_state_bytes
    per_token = (cold_stored - mamba) / tokens if tokens else 0.0
    ok = int(cold_stored) == exp.stored_bytes and exp.stored_bytes > 0
    how = f"{tokens} tokens x {exp.kv_bytes_per_token} B"
    trimmed = {
        k.kind: sum(t.stored_by_kind.get(k.kind, 0) for t in exp.targets)
        for k in exp.layout
        if k.kind == "sliding-window"
    }
    if any(n != tokens for n in trimmed.values()):
        how += f", sliding-window layers {trimmed['sliding-window']} tokens"
    if exp.mamba_state_bytes:
        how += f" + {states} Mamba states x {exp.mamba_state_bytes:,} B"
    return CheckResult(
        "cold-stored-bytes",
        ok,
        f"{fmt_bytes(exp.stored_bytes)} ({how})",
        f"{fmt_bytes(cold_stored)} ({per_token:,.1f} B/token measured)",
        "the first pass must offload every full chunk of every layer, at the config's "
        "KV bytes per token",
        ""
        if ok
        else (
            "nothing was stored"
            if cold_stored == 0
            else _byte_diff(exp, int(cold_stored) - exp.stored_bytes)
        ),
    )


def _byte_diff(exp: Expected, diff: int) -> str:
    """A byte difference, and what it is worth in tokens of each layer kind."""
    worth = [
        f"{diff // k.bytes_per_token:+,} tokens of the {k.kind} layers"
        for k in exp.layout
        if k.bytes_per_token and diff % k.bytes_per_token == 0
    ]
    return f"off by {diff:+,} B" + (f" (= {' or '.join(worth)})" if worth else "")


def _must_be_zero(name: str, value: float, observed: str, expected: str, why: str) -> CheckResult:
    return CheckResult(name, value == 0, expected, observed, why)


def evicted_by_filler(exp: Expected) -> None:
    """Under pressure (a tier of exactly the targets' chunks) the filler's stores evict
    every target chunk: the replay hits and loads nothing, and a hit or a byte loaded
    is an evicted chunk served."""
    for t in exp.targets:
        t.hit_tokens = t.chunked_needed_tokens = t.loaded_bytes = 0
        t.loaded_by_kind = {}


def check_tier_evicted(tier_bytes: int, stored: float) -> CheckResult:
    """Under pressure (a tier of exactly the targets' chunks) the filler must have stored
    past the tier's size, or the targets were never evicted and the replay proves
    nothing about eviction."""
    return CheckResult(
        "tier-evicted",
        stored > tier_bytes,
        f"cold + filler stored > the tier's {fmt_bytes(tier_bytes)}",
        f"stored {fmt_bytes(stored)}",
        "a tier under pressure that never evicted proved nothing about eviction",
    )


def check_replay_restored(exp: Expected, replay_stored: float) -> CheckResult:
    """Under pressure every target chunk was evicted, so the replay stores every one of
    them again: a chunk not stored again was still held (or said to be) by the tier, yet
    the replay did not load it."""
    ok = int(replay_stored) == exp.stored_bytes
    return CheckResult(
        "replay-stored-bytes",
        ok,
        f"{fmt_bytes(exp.stored_bytes)} (every target chunk stored again)",
        fmt_bytes(replay_stored),
        "an evicted chunk must be stored again when recomputed; one the tier still holds "
        "must have been loaded",
        "" if ok else _byte_diff(exp, int(replay_stored) - exp.stored_bytes),
    )


def check_filler_loaded_nothing(filler_loaded: float) -> CheckResult:
    return _must_be_zero(
        "filler-loaded-nothing",
        filler_loaded,
        fmt_bytes(filler_loaded),
        "0 B",
        "unrelated prompts share no prefix with the targets: any load is a false hit",
    )


def check_tier_idle(usage: float) -> CheckResult:
    """Once the replay settled no request holds a chunk of the CPU tier and no store is
    in flight, so its usage gauge must read 0. A tier that counts a chunk it freed (a
    failed store or promotion) as used, or loses count of the chunks it holds, reads
    otherwise: the gauge is how operators size the tier."""
    return _must_be_zero(
        "tier-idle",
        usage,
        f"{usage:.6g}",
        "0 (vllm:kv_offload_cpu_cache_usage_perc once idle)",
        "an idle tier holds no chunk for a request: a usage above 0 is a chunk the tier "
        "lost count of",
    )


def check_evicted(replay_gpu_hits: float) -> CheckResult:
    result = _must_be_zero(
        "gpu-cache-evicted",
        replay_gpu_hits,
        f"{int(replay_gpu_hits)} tokens",
        "0 GPU prefix-cache hit tokens on replay",
        "the replay must come from the connector, so the filler must have evicted the "
        "targets from the GPU prefix cache",
    )
    if not result.passed:
        result.detail = (
            "the filler was too small to evict the GPU pool; the replay was "
            "served from GPU memory and proves nothing about offloading"
        )
    return result


def check_loaded(exp: Expected, replay_loaded: float, evicted: bool = False) -> CheckResult:
    """The replay's loaded bytes against the plan's; ``evicted`` (a round trip under
    pressure, whose filler evicted every target) expects nothing loaded, where otherwise
    a plan with nothing to load is itself refused as proving nothing."""
    if evicted:
        return CheckResult(
            "replay-loaded-bytes",
            replay_loaded == 0,
            "0 B (the filler evicted every target chunk from the tier)",
            fmt_bytes(replay_loaded),
            "no evicted chunk may ever be loaded",
            "" if replay_loaded == 0 else "bytes loaded for chunks the tier no longer holds",
        )
    if not exp.exact_load:
        bound = exp.hit_tokens * exp.kv_bytes_per_token
        ok = 0 < replay_loaded <= bound
        return CheckResult(
            "replay-loaded-bytes",
            ok,
            f"0 < loaded <= {bound:,} B (layer kinds unknown: pass --config for the exact figure)",
            fmt_bytes(replay_loaded),
            "the replay must load back what it hits, and never more",
            ""
            if ok
            else (
                "nothing was loaded back"
                if replay_loaded == 0
                else "more bytes loaded than the hit can need"
            ),
        )
    ok = int(replay_loaded) == exp.loaded_bytes and exp.loaded_bytes > 0
    detail = ""
    if not ok:
        detail = (
            "nothing was loaded back"
            if replay_loaded == 0
            else "nothing could be loaded: no target has an external hit"
            if exp.loaded_bytes == 0
            else f"off by {int(replay_loaded) - exp.loaded_bytes:+,} B"
        )
    split = " + ".join(f"{kind} {n:,}" for kind, n in exp.loaded_split().items())
    return CheckResult(
        "replay-loaded-bytes",
        ok,
        f"{fmt_bytes(exp.loaded_bytes)} ({split})",
        fmt_bytes(replay_loaded),
        "the replay must load back exactly what its hit needs: all of it for full "
        "attention, only what a window still reaches for chunked-local and sliding-window "
        "layers, one state for Mamba layers",
        detail,
    )


def check_ext_hits(exp: Expected, replay_ext_hits: float) -> CheckResult:
    ok = int(replay_ext_hits) == exp.hit_tokens
    per = ", ".join(f"{t.hit_tokens}/{t.prompt_tokens}" for t in exp.targets)
    return CheckResult(
        "replay-external-hits",
        ok,
        f"{exp.hit_tokens} tokens ({per})",
        f"{int(replay_ext_hits)} tokens",
        "the connector must serve every block-aligned prompt token but the last",
        ""
        if ok
        else (
            "fewer hits than stored: chunks stored but not found (or a window rounded down)"
            if replay_ext_hits < exp.hit_tokens
            else "more hits than possible: double counting"
        ),
    )


def check_layout(predicted: list[KindLayout], engine: list[KindLayout]) -> CheckResult:
    """The engine built the KV-cache kinds the config implies (no silent reclassification)."""

    def fmt(layout: list[KindLayout]) -> str:
        return ", ".join(
            f"{k.kind} x{k.layers} ({k.bytes_per_token} B/token"
            + (f", window {k.window}" if k.window else "")
            + ")"
            for k in layout
        )

    want = [(k.kind, k.layers, k.bytes_per_token, k.window) for k in predicted]
    got = [(k.kind, k.layers, k.bytes_per_token, k.window) for k in engine]
    ok = want == got
    return CheckResult(
        "kv-layout",
        ok,
        fmt(predicted),
        fmt(engine) or "no report",
        "the byte rules depend on each layer's spec kind: a layer the engine built as another "
        "kind (say a sliding window built as full attention) changes what must be offloaded",
        "" if ok else "the engine's KV-cache groups differ from what the config implies",
    )


def check_outputs(pairs: list[tuple[str, Any]], name: str, why: str) -> CheckResult:
    """``pairs``: (request name, Divergence or None) for each target."""
    bad = [(req, div) for req, div in pairs if div is not None]
    detail = ""
    if bad:
        req, div = bad[0]
        detail = (
            f"{req}: first difference in {div.field} at position {div.position}: "
            f"{div.left!r} vs {div.right!r}"
        )
    return CheckResult(
        name,
        not bad,
        f"{len(pairs)} identical outputs (text, token ids, logprobs)",
        f"{len(pairs) - len(bad)} identical",
        why,
        detail,
    )


def check_outputs_within(
    closeness: list[tuple[str, Any]], name: str, why: str, tol: float
) -> CheckResult:
    """``closeness``: (request name, ``workload.Closeness``) for each target; passes when
    no output differs beyond ``tol`` (near-tie token flips are reported, not failed)."""
    bad = [(req, c) for req, c in closeness if c.divergence is not None]
    detail = ""
    if bad:
        req, c = bad[0]
        div = c.divergence
        detail = (
            f"{req}: difference beyond {tol:g} in {div.field} at position "
            f"{div.position}: {div.left!r} vs {div.right!r}"
        )
    worst = max((c.max_delta for _, c in closeness), default=0.0)
    ties = [f"{req} token {c.near_tie}" for req, c in closeness if c.near_tie is not None]
    observed = (
        f"{len(closeness) - len(bad)} within tolerance; max |logprob delta| {worst:.2g}"
        if worst
        else f"{len(closeness) - len(bad)} identical"
    )
    if ties:
        observed += f"; near-tie flips at {', '.join(ties)}"
    return CheckResult(
        name,
        not bad,
        f"{len(closeness)} outputs with the same tokens and logprobs within {tol:g} "
        "(a near-tie may flip a token)",
        observed,
        why,
        detail,
    )


def check_content(report: ContentReport) -> CheckResult:
    """Every block the replay loaded holds what was stored under its key, by the content
    ledger's digests (per block and layer, read on the engine's side): the check a chunk
    served from the wrong slot, a stale file or a corrupting copy fails even when every
    count is right."""
    first = report.errors[0].text() if report.errors else ""
    out = CheckResult(
        "content-matches",
        report.passed,
        "every loaded block is the block stored under its key (per layer)",
        report.observed(),
        "bytes loaded must be the bytes stored, by content, not only by count",
        f"first: {first}" if first else "",
    )
    # Nothing held to a store (every load's key stored before the ledger began): said,
    # not passed.
    out.informational = report.passed and report.checked == 0
    return out
