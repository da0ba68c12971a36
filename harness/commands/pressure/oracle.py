"""What a CPU tier under pressure must do, request by request: the harness's own model.

vLLM's offloading manager keeps a fixed number of slots (``cpu_bytes_to_use`` over the
slot size) and, when a store needs more than are free, evicts by its policy (``lru`` or
``arc``); ``store_threshold`` N >= 2 admits a chunk only once it has been offered N
times. This module predicts, for a sequence of requests served one at a time with the
GPU prefix cache off, which chunks each request hits, stores, skips and evicts. It is
pure Python on purpose: it is the reference semantics a run is judged by, so a policy
bug in vLLM cannot hide in it (the build's own manager is a diagnosis, never the
verdict; docs/pressure-design.md §2.2).

The semantics, per request (the design's §2.2, which 0.33.0's and 0.34.0's LRU follow;
other releases and ARC differ by the behaviours the scenarios' rules name, each modelled
as a deviation: ``harness.names.DEVIATIONS``):

1. **Lookup**: the hit is the longest resident prefix of the request's chunks.
2. **Access**: the hit chunks are used now, before the same request stores: LRU ranks
   them most recent, tail oldest; ARC moves each from T1 to T2 (or to T2's MRU end).
3. **Offer**: the request's other chunks not resident are offered; with a threshold each
   offer counts once per request, and only chunks offered ``threshold`` times are
   admitted (the rest are skipped).
4. **Store**: the admitted chunks need free slots; the policy evicts the rest it needs
   from what is resident and not offered (the offered chunks are protected). If it
   cannot, the store fails and nothing is stored.
5. **Finish**: LRU ranks every chunk of the request most recent, tail oldest (a request
   is read head first, so its head stays longest); ARC keeps stored chunks in T1.

A chunk is a name (``"A1"`` for prompt A's first chunk); a model whose KV groups each
take a slot per chunk is a request of ``G`` names per chunk.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.names import DEVIATIONS

Policy = Literal["lru", "arc"]
POLICIES: tuple[Policy, ...] = ("lru", "arc")


@dataclass(frozen=True)
class Step:
    """What one request does to the tier, as predicted."""

    request: str
    hit: int  # leading chunks served from the tier
    stored: tuple[str, ...]  # chunks written, head first
    evicted: tuple[str, ...]  # chunks dropped to make room, in eviction order
    skipped: tuple[str, ...] = ()  # offered but under the store threshold
    failed: bool = False  # the store found no room: nothing stored
    resident: tuple[str, ...] = ()  # after the request, in eviction order (next first)


class _Lru:
    """Resident chunks, least recent first."""

    def __init__(self) -> None:
        self.order: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self.order

    def __len__(self) -> int:
        return len(self.order)

    def use(self, keys: Sequence[str], stored: Iterable[str] = ()) -> None:
        """The request's chunks, ranked most recent tail first, so its head is newest."""
        for key in reversed(keys):
            if key in self.order:
                self.order.move_to_end(key)

    def insert(self, keys: Sequence[str]) -> None:
        for key in reversed(keys):
            self.order[key] = None

    def victims(self, n: int, protected: set[str], fallback: bool = True) -> list[str] | None:
        found = [k for k in self.order if k not in protected][:n]
        return found if len(found) == n else None

    def evict(self, keys: Sequence[str]) -> None:
        for key in keys:
            del self.order[key]

    def listing(self) -> tuple[str, ...]:
        return tuple(self.order)


class _Arc:
    """ARC's recent (T1) and frequent (T2) lists, their ghosts B1 and B2, and T1's target
    size ``p``; each list least recent first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.p = 0.0
        self.t1: OrderedDict[str, None] = OrderedDict()
        self.t2: OrderedDict[str, None] = OrderedDict()
        self.b1: OrderedDict[str, None] = OrderedDict()
        self.b2: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def use(self, keys: Sequence[str], stored: Iterable[str] = ()) -> None:
        """A reuse is a frequency hit (T1 -> T2); a chunk this request stored is not."""
        fresh = set(stored)
        for key in reversed(keys):
            if key in fresh:
                if key in self.t1:
                    self.t1.move_to_end(key)
            elif key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in self.t2:
                self.t2.move_to_end(key)

    def offered(self, keys: Sequence[str]) -> None:
        """A miss remembered by a ghost list moves ``p`` towards that list's side."""
        for key in reversed(keys):
            if key in self.b1:
                self.p = min(self.p + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.p = max(self.p - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def insert(self, keys: Sequence[str]) -> None:
        for key in reversed(keys):
            self.t1[key] = None
            self.b1.pop(key, None)
            self.b2.pop(key, None)

    def victims(self, n: int, protected: set[str], fallback: bool = True) -> list[str] | None:
        """T1's oldest while T1 holds at least ``p``, else T2's, falling back to T1
        (``fallback``: PR #55461's fix)."""
        t1 = [k for k in self.t1 if k not in protected]
        t2 = [k for k in self.t2 if k not in protected]
        size, out = len(self.t1), []
        for _ in range(n):
            if size >= int(self.p) and t1:
                out.append(t1.pop(0))
                size -= 1
            elif t2:
                out.append(t2.pop(0))
            elif t1 and fallback:
                out.append(t1.pop(0))
                size -= 1
            else:
                return None
        return out

    def evict(self, keys: Sequence[str]) -> None:
        """Each victim leaves a ghost in its list's B; ghost lists stay within capacity."""
        for key in keys:
            if key in self.t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)

    def listing(self) -> tuple[str, ...]:
        return (*self.t1, *self.t2)


@dataclass
class Tier:
    """A CPU tier of ``capacity`` slots under ``policy``, fed one request at a time."""

    capacity: int
    policy: Policy = "lru"
    store_threshold: int = 0
    deviations: frozenset[str] = frozenset()  # names of ``DEVIATIONS`` this build has
    offers: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"a tier needs at least one slot, not {self.capacity}")
        unknown = sorted(set(self.deviations) - set(DEVIATIONS))
        if unknown:
            raise ValueError(f"unknown deviation {unknown[0]!r}; known: {', '.join(DEVIATIONS)}")
        self._lists: _Lru | _Arc = _Lru() if self.policy == "lru" else _Arc(self.capacity)

    def serve(self, request: str, chunks: Sequence[str]) -> Step:
        """One request whose prompt fills ``chunks`` (head first); what it does."""
        lists, dev = self._lists, self.deviations
        hit = next((i for i, key in enumerate(chunks) if key not in lists), len(chunks))
        if "touch-twice" in dev:
            lists.use([key for key in chunks if key in lists])
        elif "access-at-finish" not in dev:
            lists.use(chunks[:hit])
        offered = [key for key in chunks[hit:] if key not in lists]
        if isinstance(lists, _Arc):
            lists.offered(offered)
        admitted, skipped = offered, []
        if self.store_threshold >= 2:
            self.offers.update(offered[:1] if "threshold-at-lookup" in dev else offered)
            admitted = [k for k in offered if self.offers[k] >= self.store_threshold]
            skipped = [k for k in offered if self.offers[k] < self.store_threshold]
        need = len(admitted) - (self.capacity - len(lists))
        fallback = "arc-no-t1-fallback" not in dev
        victims = lists.victims(max(0, need), set(chunks[hit:]), fallback) if admitted else []
        if victims is None:
            return Step(request, hit, (), (), tuple(skipped), True, lists.listing())
        lists.evict(victims)
        lists.insert(admitted)
        if "touch-twice" in dev and admitted and isinstance(lists, _Arc):
            # The touch after the store: the chunks it just evicted are ghost hits.
            lists.offered([key for key in chunks if key not in lists])
        lists.use(chunks, stored=admitted)
        return Step(request, hit, tuple(admitted), tuple(victims), tuple(skipped), False,
                    lists.listing())  # fmt: skip


def chunks_of(prompt: str, n: int, groups: int = 1) -> list[str]:
    """Prompt ``prompt``'s first ``n`` chunks as the tier's keys: ``A1``..``An``, or with
    ``groups`` > 1 one key per KV group and chunk (``A1g0``, ``A1g1``, ...)."""
    if groups == 1:
        return [f"{prompt}{i}" for i in range(1, n + 1)]
    return [f"{prompt}{i}g{g}" for i in range(1, n + 1) for g in range(groups)]


def predict(
    requests: Sequence[tuple[str, int]],
    capacity: int,
    policy: Policy = "lru",
    store_threshold: int = 0,
    deviations: Iterable[str] = (),
) -> list[Step]:
    """Each request ``(prompt, chunks)`` in turn on a fresh tier (prompts that share a
    name share their chunks: ``("A", 6)`` after ``("A", 4)`` extends A)."""
    tier = Tier(capacity, policy, store_threshold, frozenset(deviations))
    return [tier.serve(name, chunks_of(name, n)) for name, n in requests]
