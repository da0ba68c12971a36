"""Each request held against the model: what it should have hit, loaded and stored, and
what the drive or the server saw it do.

Both engines report a request the same way (``Observed``): the connector's hit, per
KV-cache group the blocks loaded and stored and the first block's index in the request's
table (the drive also the chunk indices; a server's come from the host backend's
transfer trace), the counters the engine exports, and what shows whether the right KV
came back (the drive's content ledger; a server's answer to a prompt it saw before).
A figure an engine does not report (an older release's missing metric) is None and its
check is not made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.oracle.scheduler import Served, Transfer

# The checks, in the order a request is judged; what each catches is in docs/oracle.md.
CHECKS = (
    "engine-survived",
    "hit-tokens",
    "loaded-blocks",
    "loaded-chunks",
    "stored-blocks",
    "stored-chunks",
    "loaded-bytes",
    "stored-bytes",
    "host-tokens",
    "allocated-chunks",
    "tier-idle",
    "async-lookups",
    "content-matches",
    "output-after-hit",
)
ACCOUNTING = frozenset(CHECKS[1:12])  # what a count, not a crash or an answer, shows


@dataclass
class Moved:
    """One group's blocks moved for one request, as an engine reports them."""

    blocks: int = 0
    first_block: int = 0
    chunks: list[int] | None = None  # the drive knows which chunks; a server does not

    @classmethod
    def of(cls, data: dict[str, Any]) -> Moved:
        return cls(
            int(data.get("blocks", 0)),
            int(data.get("first_block", 0)),
            list(data["chunks"]) if "chunks" in data else None,
        )


@dataclass
class Observed:
    request: str
    hit: int | None = None
    loads: list[Moved] = field(default_factory=list)
    stores: list[Moved] = field(default_factory=list)
    loaded_bytes: float | None = None
    stored_bytes: float | None = None
    host_tokens: float | None = None
    allocated_chunks: float | None = None
    usage_after: float | None = None
    async_lookups: float | None = None
    content_errors: list[dict[str, Any]] | None = None  # the drive's ledger
    answer: Any = None  # a server's Completion
    generated: list[int] = field(default_factory=list)
    raised: str = ""  # where the engine died


@dataclass(frozen=True)
class Verdict:
    """One check of one request."""

    check: str
    passed: bool
    expected: str
    observed: str
    detail: str = ""


@dataclass
class Judged:
    index: int
    why: str
    served: Served | None
    observed: Observed
    verdicts: list[Verdict]

    @property
    def failing(self) -> list[str]:
        return [v.check for v in self.verdicts if not v.passed]


def _moves(t: Sequence[Transfer]) -> list[tuple[int, int]]:
    return [(x.blocks, x.first_block if x.blocks else 0) for x in t]


def _fmt(moves: Sequence[tuple[int, int]]) -> str:
    return " ".join(f"g{g}:{b}@{f}" for g, (b, f) in enumerate(moves) if b) or "nothing"


def _chunks(t: Sequence[Transfer]) -> list[list[int]]:
    return [sorted(x.chunks) for x in t]


def _fmt_chunks(chunks: Sequence[Sequence[int]]) -> str:
    return " ".join(f"g{g}:{list(c)}" for g, c in enumerate(chunks) if c) or "none"


def judge(
    index: int,
    why: str,
    served: Served | None,
    obs: Observed,
    *,
    deferring: bool = False,
    earlier: Any = None,
    same_answer: Any = None,
) -> Judged:
    """The verdicts on one request. ``deferring``: the engine's tier defers every first
    lookup (the drive's asynchronous-tier mode); ``earlier``: the answer a request with
    the same prompt gave before (``same_answer(earlier, now)`` -> (ok, detail))."""
    out: list[Verdict] = []

    def check(name: str, exp: object, got: object, detail: str = "") -> None:
        out.append(Verdict(name, exp == got, str(exp), str(got), detail))

    if obs.raised or served is None:
        out.append(Verdict("engine-survived", False, "the request answered", obs.raised))
        return Judged(index, why, served, obs, out)
    if obs.hit is not None:
        check("hit-tokens", served.hit, obs.hit)
    n = len(served.loads)
    for what, exp_moves, obs_moves in (
        ("loaded", served.loads, obs.loads),
        ("stored", served.stores, obs.stores),
    ):
        if not obs_moves:
            continue
        check(
            f"{what}-blocks",
            _fmt(_moves(exp_moves)),
            _fmt([(m.blocks, m.first_block if m.blocks else 0) for m in obs_moves[:n]]),
        )
        if all(m.chunks is not None for m in obs_moves):
            check(
                f"{what}-chunks",
                _fmt_chunks(_chunks(exp_moves)),
                _fmt_chunks([sorted(m.chunks or []) for m in obs_moves[:n]]),
            )
    if obs.loaded_bytes is not None:
        check("loaded-bytes", served.loaded_bytes, int(obs.loaded_bytes))
    if obs.stored_bytes is not None:
        check("stored-bytes", served.stored_bytes, int(obs.stored_bytes))
    if obs.host_tokens is not None:
        check("host-tokens", served.host_tokens, int(obs.host_tokens))
    if obs.allocated_chunks is not None:
        check("allocated-chunks", served.stored_chunks, int(obs.allocated_chunks))
    if obs.usage_after is not None:
        check("tier-idle", 0.0, float(obs.usage_after), "no request holds a chunk once idle")
    if obs.async_lookups is not None:
        check("async-lookups", int(deferring and served.queried), int(obs.async_lookups))
    if obs.content_errors is not None:
        first = obs.content_errors[0] if obs.content_errors else {}
        out.append(
            Verdict(
                "content-matches",
                not obs.content_errors,
                "every block stored and loaded holds its own tokens' KV",
                f"{len(obs.content_errors)} blocks wrong" if obs.content_errors else "all",
                (
                    f"first: {first.get('phase')} of group {first.get('group')} block "
                    f"{first.get('block_index')} ({first.get('why')})"
                    if first
                    else ""
                ),
            )
        )
    if earlier is not None and obs.answer is not None and served.hit and same_answer:
        ok, detail = same_answer(earlier, obs.answer)
        out.append(
            Verdict(
                "output-after-hit",
                ok,
                "the answer the same prompt got computed whole",
                "the same" if ok else "different",
                detail,
            )
        )
    return Judged(index, why, served, obs, out)


@dataclass
class CellResult:
    """One cell's requests, judged as they land; ``error`` when it could not finish."""

    name: str
    requests: list[Judged] = field(default_factory=list)
    expected_failing: frozenset[str] = frozenset()
    error: str = ""
    seconds: float = 0.0
    vllm_version: str = ""
    shrunk: list[dict[str, Any]] = field(default_factory=list)  # the failing steps, cut short
    notes: list[str] = field(default_factory=list)
    finished: bool = False  # its sequence ended (served whole, stopped by a failure, or an error)

    @property
    def failing(self) -> frozenset[str]:
        return frozenset(c for r in self.requests for c in r.failing)

    @property
    def unexpected(self) -> frozenset[str]:
        return self.failing - self.expected_failing

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.requests) and not self.unexpected

    def first_failure(self, check: str) -> tuple[Judged, Verdict] | None:
        for r in self.requests:
            for v in r.verdicts:
                if v.check == check and not v.passed:
                    return r, v
        return None
