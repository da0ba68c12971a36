"""The worker's half of a step for the oracle drive, with KV content instead of bytes.

vLLM's real scheduler decides what to store and load; the worker copies blocks. With no
model there are no KV bytes, so each GPU block holds a *tag* naming the KV it would hold
(its group and a digest of the tokens up to the block's end: two requests with the same
prefix write the same tag, as their KV would be the same), written when a step computes
the block's tokens, copied into a CPU slot by a store and back into a GPU block by a
load. A load that brings back a tag other than the one its block must hold is KV reused
wrongly; a store that reads a tag its request never wrote read a block someone else
already overwrote. Both are recorded as content errors (the oracle's ``content-matches``).

Stores behave as vLLM's worker does: a step's store jobs are submitted at the start of
the next step (``OffloadingConnectorWorker.prepare_store_kv``), and those the scheduler
names in ``jobs_to_flush`` (their GPU blocks are about to be reused) are finished before
that step computes. ``delay`` N > 0 holds every other store N steps more before its copy
runs, as an asynchronous copy engine may: a flush the scheduler forgets then lets a
reused block's new KV be stored under the old key.

Loaded with a vLLM interpreter: the standard library and vLLM only, vLLM inside
functions.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Tag = tuple[int, bytes]  # (group, digest of the tokens up to the block's end)


@dataclass
class _Pending:
    job: int
    req_id: str
    src: Any  # GPULoadStoreSpec
    dst: Any  # CPULoadStoreSpec
    age: int = 0


def _digest(tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", tokens).tobytes(), digest_size=10).digest()


@dataclass
class ContentWorker:
    """Content-tracking stand-in for the worker, one per rig."""

    rig: Any  # scheduler_rig.Rig
    delay: int = 0
    content_groups: frozenset[int] = frozenset()  # attention groups: those with KV per token
    gpu: dict[int, Tag] = field(default_factory=dict)
    cpu: dict[tuple[int, int], Tag] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    # Each request's tokens as last seen: a finished request leaves the scheduler before
    # the store of its last step runs.
    seen: dict[str, list[int]] = field(default_factory=dict)
    _digests: dict[tuple[str, int], bytes] = field(default_factory=dict)
    _queued: list[_Pending] = field(default_factory=list)  # built last step, not submitted
    _held: list[_Pending] = field(default_factory=list)  # submitted, copy not run yet

    # --- tags ----------------------------------------------------------------------------

    def _tokens(self, req_id: str) -> list[int]:
        req = self.rig.scheduler.requests.get(req_id)
        if req is not None:
            self.seen[req_id] = list(req.all_token_ids)
        return self.seen.get(req_id, [])

    def _tag(self, req_id: str, group: int, index: int, upto: int | None = None) -> Tag:
        block = self.rig.kv_cache_config.kv_cache_groups[group].kv_cache_spec.block_size
        end = (index + 1) * block if upto is None else min(upto, (index + 1) * block)
        # Tokens never change once there, so a prefix's digest is made once per request.
        key = (req_id, end)
        if key not in self._digests:
            self._digests[key] = _digest(self._tokens(req_id)[:end])
        return group, self._digests[key]

    def _block_table(self, req_id: str) -> Sequence[Sequence[int]]:
        return self.rig.scheduler.kv_cache_manager.get_block_ids(req_id)

    # --- the copies ------------------------------------------------------------------------

    def _cells(self, gpu_spec: Any, cpu_spec: Any) -> list[tuple[int, int, int, tuple[int, int]]]:
        """(group, request block index, GPU block id, CPU cell) for every block of a job,
        split by group as vLLM's worker does (``group_sizes``, ``block_indices``)."""
        bpc = self.rig.offload.config.blocks_per_chunk
        ids = [int(b) for b in gpu_spec.block_ids]
        chunks = [int(c) for c in cpu_spec.block_ids]
        out = []
        gpu_off = cpu_off = 0
        for g, (size, first) in enumerate(
            zip(gpu_spec.group_sizes, gpu_spec.block_indices, strict=True)
        ):
            size, first = int(size), int(first)
            if not size:
                continue
            skip = first % bpc
            for i in range(size):
                cell = (chunks[cpu_off + (skip + i) // bpc], (skip + i) % bpc)
                out.append((g, first + i, ids[gpu_off + i], cell))
            gpu_off += size
            cpu_off += -(-(size + skip) // bpc)
        return out

    def _store(self, p: _Pending) -> None:
        """The store's copy runs now: every GPU block into its CPU cell."""
        for g, index, block, cell in self._cells(p.src, p.dst):
            tag = self.gpu.get(block)
            self.cpu[cell] = tag if tag is not None else (g, b"")
            if g not in self.content_groups:
                continue
            n = len(self._tokens(p.req_id))
            spec = self.rig.kv_cache_config.kv_cache_groups[g].kv_cache_spec
            mine = {self._tag(p.req_id, g, j) for j in range(n // spec.block_size)}
            if tag not in mine:
                self.errors.append(
                    {
                        "phase": "store",
                        "request": p.req_id,
                        "group": g,
                        "block_index": index,
                        "why": "the block held KV its request never wrote (reused before "
                        "the store ran)"
                        if tag is not None
                        else "the block was never written",
                    }
                )

    def _load(self, req_id: str, job: Any) -> None:
        for g, index, block, cell in self._cells(job.dst_spec, job.src_spec):
            tag = self.cpu.get(cell)
            if tag is not None:
                self.gpu[block] = tag
            if g in self.content_groups and tag != self._tag(req_id, g, index):
                self.errors.append(
                    {
                        "phase": "load",
                        "request": req_id,
                        "group": g,
                        "block_index": index,
                        "why": "the CPU slot held other KV than the block's tokens"
                        if tag is not None
                        else "the CPU slot was never stored",
                    }
                )

    def _compute(self, output: Any) -> None:
        """Each scheduled request writes the blocks its step's tokens fall in."""
        for req_id, n in output.num_scheduled_tokens.items():
            req = self.rig.scheduler.requests[req_id]
            end = req.num_computed_tokens  # schedule() has already advanced it
            start = end - n
            for g, table in enumerate(self._block_table(req_id)):
                if g not in self.content_groups:
                    continue
                block = self.rig.kv_cache_config.kv_cache_groups[g].kv_cache_spec.block_size
                for j in range(start // block, -(-end // block)):
                    if j < len(table) and table[j]:
                        self.gpu[table[j]] = self._tag(req_id, g, j, upto=end)

    # --- one step ----------------------------------------------------------------------------

    def step(self, output: Any) -> dict[int, int]:
        """The worker's half of ``output``'s step; the jobs it completed."""
        meta = output.kv_connector_metadata
        done: dict[int, int] = {}
        flush = set(meta.jobs_to_flush or ()) if meta is not None else set()
        # Last step's stores are submitted now, before this step computes.
        submitted, self._queued = self._queued, []
        for p in submitted:
            if self.delay and p.job not in flush:
                self._held.append(p)
            else:
                self._store(p)
                done[p.job] = 1
        for p in [p for p in self._held if p.job in flush]:
            self._store(p)
            done[p.job] = 1
            self._held.remove(p)
        if meta is not None:
            for job_id, job in meta.load_jobs.items():
                self._load(job.req_id, job)
                done[job_id] = 1
        self._compute(output)
        for p in list(self._held):
            p.age += 1
            if p.age >= self.delay:
                self._store(p)
                done[p.job] = 1
                self._held.remove(p)
        if meta is not None:
            for job_id, job in meta.store_jobs.items():
                self._queued.append(_Pending(job_id, job.req_id, job.src_spec, job.dst_spec))
        return done

    @property
    def pending(self) -> bool:
        return bool(self._queued or self._held)
