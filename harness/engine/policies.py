"""Seeded eviction-policy mutants, loaded by vLLM itself as out-of-tree cache policies.

vLLM's ``CachePolicyFactory`` imports any policy named by ``eviction_policy`` from
``cache_policy_module_path`` (``kv_connector_extra_config``), so a mutant runs inside
vLLM's own ``CPUOffloadingManager`` exactly where the stock policy would. Each one is a
small, plausible bug of the kind the pressure checks exist to catch; each subclasses
the build's own LRU or ARC and changes one decision, so everything else is vLLM's.
They follow the 0.31-0.33 policy internals (0.32's ``current`` and 0.33's CUDA build,
both replayed by tests/unit/test_pressure_replay.py), like the other seeded faults.

- ``LruEvictsNewest``: the heap is read from the wrong end: the most recent chunk goes.
- ``LruNeverRefreshes``: a reuse does not count as a use (FIFO by store time).
- ``ArcNoT1Fallback``: PR #55461 reintroduced: with T2 out of candidates ARC gives up
  although T1 holds evictable chunks, so the store fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from harness.names import POLICY_MODULE, POLICY_MUTANTS

MODULE = __name__  # ``cache_policy_module_path`` for every mutant here
assert MODULE == POLICY_MODULE
MUTANTS = tuple(cls for cls, _ in POLICY_MUTANTS.values())  # each class defined below


class LruEvictsNewest(LRUCachePolicy):
    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        if n == 0:
            return []
        ranked = sorted(
            (k for k in self._evictable if k not in protected),
            key=self._ranks.__getitem__,
            reverse=True,
        )
        if len(ranked) < n:
            return None
        out = []
        for key in ranked[:n]:
            self._evictable.remove(key)
            del self._ranks[key]
            out.append((key, self.chunks.pop(key)))
        return out


class LruNeverRefreshes(LRUCachePolicy):
    def on_request_access(self, keys: Any, req_context: Any) -> None:
        """0.33 ranks a request's chunks as it reads them: not here (0.31-0.32 have no
        such hook, and never call this)."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        # Only the chunks this request stored get a rank; the reused ones keep theirs.
        fresh = [[k for k in group if k in insertion_only_keys] for group in key_groups]
        super().on_request_finished(fresh, insertion_only_keys, set(), req_context)


class ArcNoT1Fallback(ARCCachePolicy):
    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        if n == 0:
            return []
        size, picked = len(self.t1), []
        t1 = [k for k, c in self.t1.items() if c.ref_cnt == 0 and k not in protected]
        t2 = [k for k, c in self.t2.items() if c.ref_cnt == 0 and k not in protected]
        for _ in range(n):
            if size >= int(self.target_t1_size) and t1:
                picked.append((t1.pop(0), True))
                size -= 1
            elif t2:
                picked.append((t2.pop(0), False))
            else:
                return None  # the bug: T1 still has candidates
        out = []
        for key, from_t1 in picked:
            source, ghost = (self.t1, self.b1) if from_t1 else (self.t2, self.b2)
            out.append((key, source.pop(key)))
            ghost[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.cache_capacity:
                ghost.popitem(last=False)
        return out
