"""Seeded eviction-policy mutants, loaded by vLLM itself as out-of-tree cache policies.

vLLM's ``CachePolicyFactory`` imports any policy named by ``eviction_policy`` from
``cache_policy_module_path`` (``kv_connector_extra_config``), so a mutant runs inside
vLLM's own ``CPUOffloadingManager`` exactly where the stock policy would. Each one is a
small, plausible bug of the kind the pressure checks exist to catch; each subclasses
the build's own LRU or ARC and changes one decision, so everything else is vLLM's.
They follow the 0.31-0.33 policy internals (0.32's ``current`` and 0.33's CUDA build,
both replayed by tests/unit/commands/pressure/test_pressure_replay.py), like the other
seeded faults.

- ``LruEvictsNewest``: the heap is read from the wrong end: the most recent chunk goes.
- ``LruNeverRefreshes``: a reuse does not count as a use (FIFO by store time).
- ``ArcNoT1Fallback``: PR #55461 reintroduced: with T2 out of candidates ARC gives up
  although T1 holds evictable chunks, so the store fails.

``SwitchablePolicy`` runs them all on one server, as ``offload-check faults`` runs the
host backend's faults: it is whichever policy its control file names (``lru``, ``arc``
or a mutant's class), read at start and again whenever the manager resets the tier
(``POST /reset_prefix_cache?reset_external=true`` calls ``policy.clear()`` on an empty
tier), so a new policy starts on an empty tier, as a fresh server's would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from harness.names import ENV_POLICY_CONTROL, POLICY_MODULE, POLICY_MUTANTS

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


# The attributes a SwitchablePolicy keeps for itself; everything else is its inner policy's.
_OWN = frozenset({"_inner", "_capacity", "_mode", "_build", "clear", "__class__", "__dict__"})


class SwitchablePolicy(CachePolicy):
    """The policy its control file names, rebuilt empty at every ``clear()``. Every other
    attribute is the inner policy's, so vLLM's manager talks to LRU, ARC or a mutant
    exactly as it would if that policy had been configured at launch."""

    def __init__(self, cache_capacity: int, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_capacity", (cache_capacity, args, kwargs))
        self._build()

    def _build(self) -> None:
        path = os.environ.get(ENV_POLICY_CONTROL, "")
        try:
            with open(path) as f:
                mode = f.read().strip() or "lru"
        except OSError:
            mode = "lru"
        classes: dict[str, type[CachePolicy]] = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}
        cls = classes.get(mode) or getattr(sys.modules[__name__], mode, None)
        if cls is None or not (isinstance(cls, type) and issubclass(cls, CachePolicy)):
            raise ValueError(f"{path}: unknown policy {mode!r}")
        capacity, args, kwargs = object.__getattribute__(self, "_capacity")
        object.__setattr__(self, "_inner", cls(capacity, *args, **kwargs))
        object.__setattr__(self, "_mode", mode)
        print(f"offload-check policy: {mode}", file=sys.stderr, flush=True)

    def clear(self) -> None:
        self._build()

    def __getattribute__(self, name: str) -> Any:
        if name in _OWN:
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_inner"), name, value)


# Every abstract method is served by the inner policy (``__getattribute__``), whichever
# methods this release's CachePolicy declares.
SwitchablePolicy.__abstractmethods__ = frozenset()
