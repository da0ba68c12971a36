"""What vLLM's offloading connector must hit, load and store for each request: the rules.

The connector's scheduler side (vLLM's ``offloading/scheduler.py``) decides, for every
request, how many prompt tokens the CPU tier serves (the external hit), which offloaded
chunks each KV-cache group loads back, and which chunks it stores. Today's checks mostly
ask whether vLLM agrees with itself (bytes loaded match the hits it reported); an edit
that stores a chunk too few or loads a range one block short keeps all of that
consistent. This module predicts every one of those figures from the geometry and what
the tier holds, so the run can be judged against what *should* have happened.

The rules, read from vLLM 0.32's source and checked against its real scheduler (the
oracle drive) and live servers; docs/oracle.md derives each one. A request is served
alone, with nothing in the GPU prefix cache (the command resets it before each request),
so every lookup starts at token 0. Per KV-cache group ``g`` (block ``B``, chunk
``C = B x blocks_per_chunk``):

- **keys**: one per whole chunk of the request's tokens, named by the tokens up to the
  chunk's end (so prompts sharing a prefix share its chunks), one set per group.
- **lookup**: the hit is capped by the prompt (less one token when any group is not
  full attention), by ``max_load_tokens`` (then rounded down to a chunk), by a Mamba
  group's chunk alignment; full-attention groups hit the longest resident prefix, the
  other groups need a run of ``window`` resident chunks ending at the hit (scanning from
  the end: sliding window ``cdiv(W, C)``, widened for a hit inside a chunk; chunked local
  ``cdiv(A, C)``; Mamba 1); each group can only shorten the hit, and a shortened hit is
  looked up again by the windowed groups. A hit under one chunk is no hit.
- **load**: the blocks of ``[0, hit)`` the group still attends to at the hit: full
  attention all, sliding window those after ``hit - W + 1``, chunked local those of the
  attention chunk holding the hit, Mamba the state block; bytes = blocks x block bytes.
- **store**: after each step, the whole chunks of the offloadable tokens (the prompt, or
  every computed token with ``offload_prompt_only = false``; a finished request's last
  sampled token never has KV) not stored yet by this request and not resident; a sliding
  window group stores only the chunks a later hit can use (with ``retention_interval``
  0, the default from 0.30, the ``cdiv(W - 1, B)`` blocks before the prompt's last
  aligned boundary).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["full", "mla", "chunked-local", "sliding-window", "mamba"]
KINDS: tuple[Kind, ...] = ("full", "mla", "chunked-local", "sliding-window", "mamba")
FULL_KINDS = frozenset({"full", "mla"})
Key = tuple[int, bytes]  # (group index, the digest of the tokens up to the chunk's end)

# Where a release's scheduler does otherwise, exactly (a scenario rule's ``deviations``).
# 0.34+: with a windowed group the last prompt token is cut before ``max_load_tokens``
# caps the hit ("tighter caps are already supported boundaries and are not reduced"),
# so a cap on a chunk boundary is served whole; up to 0.33 the cut came after the cap
# and such a hit was one chunk short.
MAX_LOAD_WHOLE = "max-load-whole"
# 0.34+: where a windowed group cuts a hit below the full-attention groups' hit, that
# boundary becomes the request's shared-prefix junction
# (``_maybe_register_shared_prefix_junction``): under a retention interval (0 included)
# the sliding-window tail ending there is reachable, so it is stored too.
JUNCTION = "shared-prefix-junction"
DEVIATIONS: dict[str, str] = {
    MAX_LOAD_WHOLE: "max_load_tokens on a chunk boundary is served whole with windowed groups",
    JUNCTION: "a full-attention hit a windowed group cut short stores that boundary's window tail",
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Group:
    """One KV-cache group as the engine built it."""

    kind: Kind
    block: int  # tokens per KV block
    window: int = 0  # sliding window W, or chunked-local attention chunk A
    block_bytes: int = 0  # bytes one block of this group moves, over its layers and ranks

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown KV-cache group kind {self.kind!r}; known: {KINDS}")
        if self.block < 1:
            raise ValueError(f"a block holds at least one token, not {self.block}")
        if self.kind in ("chunked-local", "sliding-window") and self.window < 1:
            raise ValueError(f"a {self.kind} group needs its window, not {self.window}")

    @property
    def windowed(self) -> bool:
        return self.kind not in FULL_KINDS

    def window_chunks(self, chunk: int) -> int | None:
        """Consecutive resident chunks a hit needs (vLLM's
        ``get_sliding_window_size_in_chunks``); None for full attention."""
        if self.kind == "sliding-window":
            return max(cdiv(self.window, chunk), cdiv(self.window - 1, chunk))
        if self.kind == "chunked-local":
            return cdiv(self.window, chunk)
        if self.kind == "mamba":
            return 1
        return None

    def first_window_chunks(self, chunk: int, end: int) -> int:
        """The run the first (rightmost) window needs when the hit may end inside a chunk:
        the blocks the engine keeps reach one chunk further left (PR #55712)."""
        base = self.window_chunks(chunk) or 0
        if self.kind == "sliding-window":
            return max(base, cdiv(self.window - 1 + (-end % chunk), chunk))
        return base

    def skipped_tokens(self, computed: int) -> int:
        """Leading tokens the group no longer attends to once ``computed`` are computed
        (their blocks are null in the request's table)."""
        if self.kind == "sliding-window":
            return max(0, computed - self.window + 1)
        if self.kind == "chunked-local":
            return computed // self.window * self.window
        if self.kind == "mamba":
            return max(0, computed - 1)
        return 0


@dataclass(frozen=True)
class Layout:
    """The connector's view of a server: its groups and the offload settings it reads."""

    groups: tuple[Group, ...]
    blocks_per_chunk: int = 1
    offload_prompt_only: bool = True
    # vLLM's prefix_cache_retention_interval: 0 (the default from 0.30) keeps only the
    # replay boundary's sliding-window tail, N > 0 a tail every N tokens too, None all.
    retention_interval: int | None = 0
    max_batched_tokens: int = 1 << 30  # the scheduler's token budget per step
    hash_block: int = 0  # tokens per block hash (0: the smallest block)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a layout needs at least one KV-cache group")
        if self.blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk must be >= 1, not {self.blocks_per_chunk}")

    def chunk(self, g: int) -> int:
        return self.groups[g].block * self.blocks_per_chunk

    @property
    def tokens_per_hash(self) -> int:
        return self.hash_block or min(g.block for g in self.groups)

    @property
    def alignment_tokens(self) -> int | None:
        """The chunk every hit is aligned to: the full-attention groups' (one size), else
        the largest chunk of a model with no full-attention group."""
        full = {self.chunk(i) for i, g in enumerate(self.groups) if not g.windowed}
        if len(full) == 1:
            return full.pop()
        if not full:
            return max(self.chunk(i) for i in range(len(self.groups)))
        return None

    @property
    def lookup_order(self) -> list[int]:
        """Full-attention groups first, then the others by window (widest first)."""
        full = [i for i, g in enumerate(self.groups) if not g.windowed]
        other = [i for i, g in enumerate(self.groups) if g.windowed]
        other.sort(key=lambda i: self.groups[i].window_chunks(self.chunk(i)) or 0, reverse=True)
        return full + other


class ChunkKeys:
    """A request's offload keys: one per whole chunk of its tokens and group, named by a
    digest chained block by block over the tokens (prompts sharing a prefix share keys)."""

    def __init__(self, layout: Layout, tokens: Sequence[int]) -> None:
        self.layout = layout
        hb = layout.tokens_per_hash
        self._digests: list[bytes] = []
        prev = b""
        for start in range(0, len(tokens) - hb + 1, hb):
            block = ",".join(map(str, tokens[start : start + hb])).encode()
            prev = hashlib.blake2b(prev + b"|" + block, digest_size=12).digest()
            self._digests.append(prev)

    def count(self, g: int) -> int:
        """Whole chunks of group ``g`` the tokens fill."""
        per = self.layout.chunk(g) // self.layout.tokens_per_hash
        return len(self._digests) // per

    def key(self, g: int, chunk: int) -> Key:
        per = self.layout.chunk(g) // self.layout.tokens_per_hash
        return (g, self._digests[(chunk + 1) * per - 1])


@dataclass(frozen=True)
class Transfer:
    """What one group moved for one request: chunk indices (of the request's chunks),
    blocks, the first block's index in the request's table, bytes."""

    chunks: tuple[int, ...] = ()
    blocks: int = 0
    first_block: int = 0
    bytes: int = 0

    def plus(self, other: Transfer) -> Transfer:
        if not other.blocks and not other.chunks:
            return self
        if not self.blocks and not self.chunks:
            return other
        return Transfer(
            self.chunks + other.chunks,
            self.blocks + other.blocks,
            min(self.first_block, other.first_block),
            self.bytes + other.bytes,
        )


@dataclass(frozen=True)
class Request:
    """One request of a sequence. ``generated`` is what the engine answered (decode
    chunks are named by those tokens too); ``abort_after`` ends it aborted after that
    many generated tokens."""

    name: str
    tokens: tuple[int, ...]
    max_tokens: int = 1
    max_load_tokens: int | None = None
    skip_reading: bool = False  # prompt logprobs: the connector is not asked
    abort_after: int | None = None
    # The tier is reset (``reset_external=true``) once the request has generated this
    # many tokens, while it is still running.
    reset_after: int | None = None


@dataclass(frozen=True)
class Served:
    """What the model says one request does."""

    name: str
    prompt_tokens: int
    hit: int  # external hit tokens (the connector's answer)
    loads: tuple[Transfer, ...]  # per group
    stores: tuple[Transfer, ...]  # per group, over the request's store jobs
    host_tokens: int  # of the hit, tokens whose KV a loaded chunk covers (source "host")
    queried: bool = False  # the lookup asked the tier for at least one chunk

    @property
    def stored_chunks(self) -> int:
        """Chunks the tier allocated for the request (vLLM's allocation-size histogram)."""
        return sum(len(t.chunks) for t in self.stores)

    @property
    def loaded_bytes(self) -> int:
        return sum(t.bytes for t in self.loads)

    @property
    def stored_bytes(self) -> int:
        return sum(t.bytes for t in self.stores)

    def record(self) -> dict[str, object]:
        return {
            "request": self.name,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit,
            "loaded_bytes": self.loaded_bytes,
            "stored_bytes": self.stored_bytes,
            "host_tokens": self.host_tokens,
            "queried": self.queried,
            "loads": [_transfer_record(t) for t in self.loads],
            "stores": [_transfer_record(t) for t in self.stores],
        }


def _transfer_record(t: Transfer) -> dict[str, object]:
    return {"chunks": list(t.chunks), "blocks": t.blocks, "first_block": t.first_block}


@dataclass
class Offloader:
    """The connector over a CPU tier that never evicts, fed one request at a time;
    ``deviations`` (``DEVIATIONS``) are the rules a release follows instead."""

    layout: Layout
    deviations: frozenset[str] = frozenset()
    resident: set[Key] = field(default_factory=set)
    queried: bool = False  # the last lookup asked the tier for a chunk
    # The last lookup's full-attention hit boundary: the cap when it reached the first
    # windowed group (vLLM's ``full_attention_hit_boundary``; None: it never did).
    full_boundary: int | None = None

    def reset(self) -> None:
        """``/reset_prefix_cache?reset_external=true``: the tier empties."""
        self.resident.clear()

    # --- lookup ------------------------------------------------------------------------

    def lookup(self, keys: ChunkKeys, prompt: int, max_load: int | None) -> int:
        """The external hit, in tokens, of a request whose prompt is ``prompt`` tokens
        (``self.queried``: whether it asked the tier anything, so an asynchronous tier
        could defer it)."""
        lay = self.layout
        self.queried = False
        self.full_boundary = None
        has_full = any(not g.windowed for g in lay.groups)
        cap = prompt if max_load is None else min(prompt, max_load)
        if any(g.windowed for g in lay.groups):
            if MAX_LOAD_WHOLE in self.deviations:
                cap = prompt - 1 if max_load is None else min(prompt - 1, max_load)
            else:
                cap -= 1  # the last prompt token is recomputed (its logprobs, the window)
            mamba = [lay.chunk(i) for i, g in enumerate(lay.groups) if g.kind == "mamba"]
            if mamba:
                cap = cap // mamba[0] * mamba[0]
        order = lay.lookup_order
        windowed = [i for i in order if lay.groups[i].windowed]
        hit = 0
        pending = order
        while pending:
            looked_up_window = False
            todo, pending = pending, []
            for g in todo:
                group, c = lay.groups[g], lay.chunk(g)
                n_keys = keys.count(g)
                cap = min(cap, n_keys * c)
                if max_load is not None:
                    cap = cap // c * c
                if cap < c:
                    return 0
                if group.windowed and self.full_boundary is None:
                    # Groups before the first windowed one are full attention.
                    self.full_boundary = cap if has_full else 0
                n = min(cdiv(cap, c), n_keys)
                self.queried |= n > 0
                held = [keys.key(g, i) in self.resident for i in range(n)]
                if not group.windowed:
                    found = next((i for i, h in enumerate(held) if not h), n)
                else:
                    found = self._window_run(
                        held,
                        group.window_chunks(c) or 1,
                        group.first_window_chunks(c, min(cap, n * c)),
                    )
                if found == 0:
                    return 0
                cap = min(cap, c * found)
                if cap < c:
                    return 0
                if cap < hit and looked_up_window and not pending:
                    pending = windowed
                looked_up_window |= group.windowed
                hit = cap
        return hit

    @staticmethod
    def _window_run(held: Sequence[bool], window: int, first: int) -> int:
        """The end of the rightmost run of ``window`` resident chunks (the first run from
        the right may need ``first``); a run reaching chunk 0 may be shorter."""
        run, need = 0, first
        for idx in range(len(held) - 1, -1, -1):
            if held[idx]:
                run += 1
            else:
                run, need = 0, window
            if run == need:
                return idx + need
        return run

    # --- load --------------------------------------------------------------------------

    def load(self, keys: ChunkKeys, hit: int) -> tuple[tuple[Transfer, ...], int]:
        """Per group, what a hit of ``hit`` tokens loads; and the tokens of the hit some
        loaded chunk covers (what vLLM attributes to the host tier)."""
        lay, out, covered = self.layout, [], set[tuple[int, int]]()
        for g, group in enumerate(lay.groups):
            if not hit:
                out.append(Transfer())
                continue
            b, c = group.block, lay.chunk(g)
            blocks = cdiv(hit, b)
            first = min(group.skipped_tokens(hit) // b, blocks)
            chunks = tuple(range(first // lay.blocks_per_chunk, cdiv(hit, c)))
            if first == blocks:
                chunks = ()
            out.append(
                Transfer(chunks, blocks - first, first, (blocks - first) * group.block_bytes)
            )
            for ch in chunks:
                if group.kind == "mamba":
                    covered.add((0, hit))
                else:
                    covered.add((max(first * b, ch * c), min(hit, (ch + 1) * c)))
        return tuple(out), _union_length(covered)

    # --- store -------------------------------------------------------------------------

    def _sw_mask(
        self, g: int, prompt: int, horizon: int | None, junction: int = 0
    ) -> set[int] | None:
        """The blocks of a sliding-window group a later hit can use (vLLM's
        ``reachable_block_mask``); None: every block. ``junction``: the request's
        shared-prefix junction (0: none), a replay boundary like the prompt's."""
        lay, group = self.layout, self.layout.groups[g]
        align, b = lay.alignment_tokens, group.block
        if group.kind != "sliding-window" or align is None or align % b:
            return None
        need = cdiv(group.window - 1, b)
        ri = lay.retention_interval
        segment = align if ri is None else (ri or None)
        mask: set[int] = set()
        if segment is not None:
            per = segment // b
            if need >= per:
                return None
            top = max(horizon or 0, cdiv(prompt, b)) + per
            mask |= {i for i in range(top) if i % per >= per - need}
            if horizon is not None:
                end = horizon * lay.blocks_per_chunk
                size = end % per
                if size:
                    mask |= set(range(max(end - size, end - need), end))
        if ri is not None:
            for boundary in (prompt - 1, junction):
                if boundary > 0:
                    end = boundary // align * align // b
                    mask |= set(range(max(0, end - need), end))
        return mask

    def _junction(self, hit: int) -> int:
        """The request's shared-prefix junction (0: none): from 0.34, the full-attention
        hit boundary where a windowed group cut the hit below it, under a retention
        interval (a request served alone computes nothing locally first)."""
        f = self.full_boundary
        if JUNCTION not in self.deviations or self.layout.retention_interval is None:
            return 0
        return f if f is not None and f > hit else 0

    def serve(self, req: Request, generated: Sequence[int] = ()) -> Served:
        """One request served alone, start to finish: its lookup, load and stores; the
        tier is updated with what it stored."""
        lay = self.layout
        prompt = len(req.tokens)
        all_tokens = (*req.tokens, *generated)
        keys = ChunkKeys(lay, all_tokens)
        prompt_keys = ChunkKeys(lay, req.tokens)
        hit = 0 if req.skip_reading else self.lookup(prompt_keys, prompt, req.max_load_tokens)
        queried = self.queried and not req.skip_reading
        junction = 0 if req.skip_reading else self._junction(hit)
        loads, host = self.load(prompt_keys, hit)
        next_chunk = [cdiv(hit, lay.chunk(g)) if hit else 0 for g in range(len(lay.groups))]
        # A hit leaves the blocks a windowed group no longer attends to null in the
        # request's table: a chunk ending in one is never stored (after a reset too).
        nulls = [g.skipped_tokens(hit) // g.block if hit else 0 for g in lay.groups]
        stores = [Transfer() for _ in lay.groups]
        prev, reset_done = hit, req.reset_after is None
        for after, known, finished, made in self._steps(req, hit, len(generated)):
            off = min(after, known)
            if lay.offload_prompt_only:
                off = min(off, prompt)
            offered: list[tuple[int, int]] = []
            for g, group in enumerate(lay.groups):
                c = lay.chunk(g)
                storable = min(off // c, min(known, len(all_tokens)) // c, keys.count(g))
                if group.kind == "mamba" or storable <= next_chunk[g]:
                    next_chunk[g] = max(next_chunk[g], storable)
                    continue
                horizon_chunks = self._horizon(g, storable, prompt, finished)
                mask = self._sw_mask(g, prompt, horizon_chunks, junction)
                k = lay.blocks_per_chunk
                for ch in range(next_chunk[g], storable):
                    if ch * k + k - 1 < nulls[g]:
                        continue
                    if mask is not None and not mask & set(range(ch * k, ch * k + k)):
                        continue
                    offered.append((g, ch))
                next_chunk[g] = storable
            offered += self._state_handoffs(req, off, known, prev, after)
            prev = max(prev, after)
            fresh = [(g, ch) for g, ch in offered if keys.key(g, ch) not in self.resident]
            for g, ch in fresh:
                self.resident.add(keys.key(g, ch))
                k = lay.blocks_per_chunk
                if lay.groups[g].kind == "mamba":  # one state: the block ending the chunk
                    t = Transfer((ch,), 1, ch * k + k - 1, lay.groups[g].block_bytes)
                else:
                    first = max(ch * k, nulls[g])  # a chunk's null blocks are not copied
                    n = ch * k + k - first
                    t = Transfer((ch,), n, first, n * lay.groups[g].block_bytes)
                stores[g] = stores[g].plus(t)
            if not reset_done and req.reset_after is not None and made >= req.reset_after:
                # The tier empties; a running request stores again from chunk 0, a
                # finished one (its last token sampled) is forgotten before its last store.
                reset_done = True
                self.reset()
                if made >= len(generated):
                    break
                next_chunk = [0] * len(lay.groups)
        return Served(req.name, prompt, hit, loads, tuple(stores), host, queried)

    def _state_handoffs(
        self, req: Request, off: int, known: int, prev: int, after: int
    ) -> list[tuple[int, int]]:
        """Mamba states the KV-cache manager hands the connector in a step that computed
        tokens ``(prev, after]``: the prefill's checkpoint (the last block boundary
        before the prompt's last token), the state at the end of each earlier prefill
        step that ends on a block, and each block boundary from the prompt's end on that
        the request computes past; the connector stores those that end a chunk,
        within the offloadable tokens, as that chunk."""
        lay, prompt = self.layout, len(req.tokens)
        out: list[tuple[int, int]] = []
        for g, group in enumerate(lay.groups):
            if group.kind != "mamba":
                continue
            c, b = lay.chunk(g), group.block
            kept: set[int] = set()
            checkpoint = (prompt - 1) // b * b
            if prev < prompt <= after:
                kept.add(checkpoint)
            elif after < prompt and after % b == 0:
                kept.add(after)  # a chunked prefill's step ends on a block: its state
            first = max(prompt, prev + 1)
            kept |= {p for p in range(cdiv(first, b) * b, after + 1, b)}
            limit = min(off, known)
            for boundary in sorted(kept):
                if 0 < boundary <= limit and boundary % c == 0:
                    out.append((g, boundary // c - 1))
        return out

    def _horizon(self, g: int, storable: int, prompt: int, finished: bool) -> int | None:
        """The request's final segment end, in chunks, for the sliding-window mask."""
        lay = self.layout
        if lay.retention_interval is not None:
            return None
        if finished:
            return storable
        prompt_chunks = prompt // lay.chunk(g)
        return prompt_chunks if storable <= prompt_chunks else None

    def _steps(
        self, req: Request, hit: int, generated: int
    ) -> Iterable[tuple[int, int, bool, int]]:
        """(tokens computed after the step, tokens known, finished, tokens generated so
        far) for each schedule step of a request served alone: the prefill in
        budget-sized steps (its last samples the first token), one decode step per
        generated token after the first, then the finish (an aborted request's at the
        tokens it had computed)."""
        lay, prompt = self.layout, len(req.tokens)
        last = generated if req.abort_after is None else min(generated, req.abort_after)
        done = min(hit, prompt - 1)  # a whole-prompt hit recomputes its last token
        while done < prompt:
            done = min(prompt, done + lay.max_batched_tokens)
            yield done, prompt, False, (min(1, last) if done == prompt else 0)
        for g in range(1, last):
            yield prompt + g, prompt + g, False, g + 1
        # The last sampled token never has KV: a finished request stores up to the one
        # before it.
        yield max(prompt, prompt + last - 1), prompt + last, True, last


def _union_length(ranges: Iterable[tuple[int, int]]) -> int:
    total, end = 0, None
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total
