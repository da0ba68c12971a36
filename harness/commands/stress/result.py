"""What a stress run observed: each server of the run under test, where its reference
came from, the requests, verdicts and counters (``run.json``'s ``stress`` figures), and
where the run and the reference's replay served the same prompt differently."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.commands.stress.driver import Outcome
from harness.commands.stress.floor import compared
from harness.commands.stress.plan import StressPlan
from harness.commands.stress.workload import PlannedRequest
from harness.server.disk_tier import DiskInventory


@dataclass
class ServerRun:
    """One server of the run under test: the first, or one restarted over the disk tier
    (``--restarts``). Each counts from its own start and logs its own transfers, so the
    byte ledger is judged server by server."""

    label: str  # "server", "restart 1", ...
    log: str  # its log, relative to the run directory
    request_ids: list[str] = field(default_factory=list)  # what it was sent
    counters: dict[str, float] = field(default_factory=dict)  # its deltas, start to end
    disk_counters: bool = True  # it exports the tiering counters (0.28+)
    start_seconds: float | None = None  # to /health (None: the first, or it never started)
    alive: bool = True
    death: str = ""
    log_lines: list[str] = field(default_factory=list, repr=False)

    @property
    def restarted(self) -> bool:
        return self.label != "server"

    def record(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "log": self.log,
            "requests": len(self.request_ids),
            "start_seconds": self.start_seconds,
            "counters": self.counters,
            "alive": self.alive,
            "death": self.death or None,
        }


@dataclass
class ReferenceSource:
    """Where a run's reference came from (``run.json`` → ``stress.reference_source`` and
    ``reference_cache``; one line on the console and in ``divergence.md``)."""

    path: str  # the cache file
    launched: bool = False
    floor: str = "cache"  # "cache" or "measured" (by the launched reference)
    cached: int = 0  # compared requests whose scores the cache held
    scored: int = 0  # compared requests the launched reference scored
    reason: str = ""  # why it was launched
    warning: str = ""  # the cache was unreadable, or could not be written

    @property
    def label(self) -> str:
        return "launched" if self.launched else f"cache {self.path}"

    def record(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "launched": self.launched,
            "floor": self.floor,
            "scores_cached": self.cached,
            "scores_scored": self.scored,
            "reason": self.reason or None,
            "warning": self.warning or None,
        }

    def line(self) -> str:
        counts = f"{self.cached} scores cached, {self.scored} scored"
        if not self.launched:
            text = f"reference from cache {self.path} ({counts}; no reference server launched)"
        else:
            text = (
                f"reference launched ({self.reason}); floor from "
                f"{'the cache' if self.floor == 'cache' else 'its replay'}, {counts}; "
                f"cache {self.path}"
            )
        return f"{text}; {self.warning}" if self.warning else text


@dataclass
class StressResult:
    """What a stress run observed (written as it goes; ``checks`` last)."""

    plan: StressPlan
    outcomes: list[Outcome] = field(default_factory=list)  # the run under test
    reference: list[Outcome] = field(default_factory=list)  # the reference's own run
    floor: float | None = None
    floor_tokens: int = 0
    floor_stray: float | None = None  # the floor's parts (``Floor``)
    floor_resolution: float | None = None
    floor_pair: float | None = None
    floor_lost: float | None = None
    tolerance: float | None = None
    # each server's attention backend and kernel ISA, and the AMX permission, from its
    # log ("server", "reference"): decode and prefill round alike on some kernels only
    engine_kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    verdicts: dict[str, Any] = field(default_factory=dict)  # request id -> TokenVerdict
    counters: dict[str, float] = field(default_factory=dict)  # the run under test's deltas
    log_lines: list[str] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)
    sent: list[PlannedRequest] = field(default_factory=list)  # every round's requests
    rounds: int = 0
    traffic_seconds: float = 0.0
    longest_still_s: float = 0.0  # the stall watch's longest quiet (``run.Sampler``)
    server_alive: bool = True
    death: str = ""
    pool_tokens: int | None = None  # the live GPU pool
    engine_groups: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    reference_error: str = ""
    attached: bool = False  # --url: a server someone else launched, no reference
    # request id -> the reference's own continuation from the first divergence
    explanations: dict[str, dict[str, Any]] = field(default_factory=dict)
    disk_files: DiskInventory | None = None  # a disk tier's chunk files after the run
    disk_counters: bool = True  # the server exports the tiering counters (0.28+)
    # Every server of the run under test in order (``--restarts``: more than one);
    # ``counters`` and ``log_lines`` above are their sums.
    servers: list[ServerRun] = field(default_factory=list)
    # Where the reference came from with ``--reference-cache`` (None: launched, no cache)
    reference_source: ReferenceSource | None = None

    def compared_count(self) -> int:
        return len(compared(self.outcomes))

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def figures(self) -> dict[str, Any]:
        """``run.json``'s ``stress``: what the run did, in numbers."""
        outs = self.outcomes
        diffs = served_differences(self) if self.reference else []
        figures: dict[str, Any] = {
            "requests_sent": len(outs),
            "requests_compared": self.compared_count(),
            "requests_aborted": sum(o.aborted for o in outs),
            "requests_failed": sum(bool(o.error) for o in outs),
            "fillers": sum(o.filler for o in outs),
            "rounds": self.rounds,
            "traffic_seconds": round(self.traffic_seconds, 2),
            "longest_still_s": round(self.longest_still_s, 2),
            "stall_after_s": self.plan.stall_s,
            "generated_tokens": sum(len(o.output) for o in outs),
            "pool_tokens": self.pool_tokens,
            "noise_floor": self.floor,
            "floor_tokens": self.floor_tokens,
            "floor_stray": self.floor_stray,
            "floor_resolution": self.floor_resolution,
            "floor_pair": self.floor_pair,
            "floor_lost": self.floor_lost,
            "tolerance": self.tolerance,
            "engine_kernels": self.engine_kernels,
            "near_ties": sum(v.near_ties for v in self.verdicts.values()),
            "near_tie_widest": max((v.widest for v in self.verdicts.values()), default=0.0),
            "served_differ_requests": len(diffs) if self.reference else None,
            "served_max_diff": max((d.max_diff for d in diffs), default=0.0)
            if self.reference
            else None,
            "counters": self.counters,
            "disk_files": self.disk_files.record() if self.disk_files else None,
            "servers": [sv.record() for sv in self.servers],
            "reference_error": self.reference_error or None,
            "death": self.death or None,
        }
        if self.reference_source is not None:  # only with --reference-cache
            figures["reference_source"] = self.reference_source.label
            figures["reference_cache"] = self.reference_source.record()
        return figures


@dataclass(frozen=True)
class ServedDiff:
    """One request as served by the run under test and by the reference's replay, when
    both got the same prompt: where their logprobs or tokens first part. A diagnostic,
    not a verdict (the replay's batches differ), that shows which requests moved."""

    id: str
    cached_tokens: int | None
    reference_cached_tokens: int | None
    differing: int  # generated positions whose logprob differs (before any token does)
    max_diff: float
    first: int | None  # first differing position
    token_at: int | None  # first position where the tokens themselves differ


def served_differences(result: StressResult) -> list[ServedDiff]:
    ref = {o.id: o for o in result.reference}
    out = []
    for o in compared(result.outcomes):
        r = ref.get(o.id)
        if r is None or r.prompt != o.prompt or not o.logprobs or not r.logprobs:
            continue
        n, worst, first, token_at = 0, 0.0, None, None
        for i, (a, b) in enumerate(zip(o.output, r.output, strict=False)):
            if a != b:
                token_at = i
                first = i if first is None else first
                break
            if i < len(o.logprobs) and i < len(r.logprobs) and o.logprobs[i] != r.logprobs[i]:
                n += 1
                worst = max(worst, abs(o.logprobs[i] - r.logprobs[i]))
                first = i if first is None else first
        if first is not None:
            out.append(
                ServedDiff(o.id, o.cached_tokens, r.cached_tokens, n, worst, first, token_at)
            )
    return out
