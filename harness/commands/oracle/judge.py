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
    "tier-gauges",
    "async-lookups",
    "content-matches",
    "output-after-hit",
)
# What a count, not a crash or an answer, shows.
ACCOUNTING = frozenset(CHECKS) - {"engine-survived", "content-matches", "output-after-hit"}


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
    # The drive's usage gauges against the chunks in flight: snapshots, wrong ones.
    gauges: dict[str, Any] | None = None
    answer: Any = None  # a server's Completion
    generated: list[int] = field(default_factory=list)
    raised: str = ""  # where the engine died
    # The figures (these fields' names) that are a whole wave's, not this request's: an
    # engine that cannot tell a wave's requests apart in a counter gives it once.
    wave_figures: frozenset[str] = frozenset()


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
    wave: Sequence[Served] = (),
) -> Judged:
    """The verdicts on one request. ``deferring``: the engine's tier defers every first
    lookup (the drive's asynchronous-tier mode); ``earlier``: the answer a request with
    the same prompt gave before (``same_answer(earlier, now)`` -> (ok, detail));
    ``wave``: the requests served at once with this one, up to it: the tier's counters
    (``Observed``'s allocations, lookups, and a server's bytes, tokens and blocks) are
    then the wave's, given on its last request and judged against the wave's sum."""
    out: list[Verdict] = []
    whole = sum_of(wave) if wave else None
    note = f"the wave's {len(wave)} requests together" if wave else ""

    def check(name: str, exp: object, got: object, detail: str = "") -> None:
        out.append(Verdict(name, exp == got, str(exp), str(got), detail))

    if obs.raised or served is None:
        out.append(Verdict("engine-survived", False, "the request answered", obs.raised))
        return Judged(index, why, served, obs, out)
    alone: Served = served

    def of(figure: str) -> tuple[Served, str]:
        """The prediction a figure is judged against: the request's, or its wave's."""
        if whole is not None and figure in obs.wave_figures:
            return whole, note
        return alone, ""

    if obs.hit is not None:
        check("hit-tokens", served.hit, obs.hit)
    n = len(served.loads)
    for what, exp_moves, obs_moves in (
        ("loaded", of("loads")[0].loads, obs.loads),
        ("stored", of("stores")[0].stores, obs.stores),
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
        exp, detail = of("loaded_bytes")
        check("loaded-bytes", exp.loaded_bytes, int(obs.loaded_bytes), detail)
    if obs.stored_bytes is not None:
        exp, detail = of("stored_bytes")
        check("stored-bytes", exp.stored_bytes, int(obs.stored_bytes), detail)
    if obs.host_tokens is not None:
        exp, detail = of("host_tokens")
        check("host-tokens", exp.host_tokens, int(obs.host_tokens), detail)
    if obs.allocated_chunks is not None:
        exp, detail = of("allocated_chunks")
        check("allocated-chunks", exp.stored_chunks, int(obs.allocated_chunks), detail)
    if obs.usage_after is not None:
        check("tier-idle", 0.0, float(obs.usage_after), "no request holds a chunk once idle")
    if obs.gauges is not None and obs.gauges.get("snapshots"):
        wrong = obs.gauges.get("wrong") or []
        first = wrong[0] if wrong else {}
        out.append(
            Verdict(
                "tier-gauges",
                not obs.gauges.get("wrong_count"),
                "each step's usage gauges are the chunks being written and read / the tier's",
                f"{obs.gauges.get('wrong_count', 0)} of {obs.gauges['snapshots']} wrong"
                if wrong
                else f"all {obs.gauges['snapshots']}",
                (
                    f"first: {first.get('gauge')} {first.get('observed'):.6g}, expected "
                    f"{first.get('expected'):.6g} ({first.get('writing')} writing, "
                    f"{first.get('reading')} reading of {first.get('chunks')})"
                    if first
                    else ""
                ),
            )
        )
    if obs.async_lookups is not None:
        asked = sum(s.queried for s in wave) if "async_lookups" in obs.wave_figures else None
        check(
            "async-lookups",
            int(deferring) * (int(served.queried) if asked is None else asked),
            int(obs.async_lookups),
            note if asked is not None else "",
        )
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


def sum_of(wave: Sequence[Served]) -> Served:
    """The requests of a wave as one: what a counter that cannot tell them apart shows
    (per group the blocks and bytes added, the lowest first block)."""
    groups = len(wave[0].loads)
    loads, stores = [Transfer()] * groups, [Transfer()] * groups
    for s in wave:
        loads = [a.plus(b) for a, b in zip(loads, s.loads, strict=True)]
        stores = [a.plus(b) for a, b in zip(stores, s.stores, strict=True)]
    return Served(
        "+".join(s.name for s in wave),
        sum(s.prompt_tokens for s in wave),
        sum(s.hit for s in wave),
        tuple(loads),
        tuple(stores),
        sum(s.host_tokens for s in wave),
        any(s.queried for s in wave),
    )


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
