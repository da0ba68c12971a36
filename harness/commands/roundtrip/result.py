"""What a round trip observed: per-phase counter deltas, every completion, the checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from harness.commands.roundtrip import checks as ck
from harness.oracle.content import ContentReport
from harness.results.records import CheckResult
from harness.server import metrics
from harness.server.disk_tier import DiskInventory
from harness.server.workload import Completion

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import Filler, RoundtripPlan


@dataclass
class PhaseResult:
    phase: str
    requests: int
    delta: metrics.Snapshot
    total: metrics.Snapshot
    seconds: float

    def record(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "phase": self.phase,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
        }
        for k, v in self.delta.as_dict().items():
            row[f"d_{k}"] = v
        for k, v in self.total.as_dict().items():
            row[f"cum_{k}"] = v
        return row


@dataclass(frozen=True)
class SpeedRow:
    """One phase's stores or loads: what vLLM's workers did, and the run's bulk copy."""

    phase: str
    direction: str  # "store" (engine -> tier) or "load" (tier -> engine)
    bytes: int  # vLLM's counter over the phase
    seconds: float  # vLLM's transfer time for them, summed over its workers
    gbps: float | None  # bytes / seconds; None where no time was exported
    copy_bytes: int
    copy_seconds: float
    copy_gbps: float
    ratio: float | None  # gbps / copy_gbps
    tensor_parallel: int
    device: str
    copy: str  # how the bulk copy was made

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RoundtripResult:
    plan: RoundtripPlan
    phases: list[PhaseResult] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    # Reported, never failing: cold vs warm may differ numerically on GPUs.
    info_checks: list[CheckResult] = field(default_factory=list)
    startup_seconds: float | None = None
    generation_seconds: float = 0.0
    engine_groups: list[dict[str, Any]] | None = None  # as harness.engine.specs reported
    # Per server ("server", "baseline"): the kernels it chose and its AMX permission.
    engine_kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    # Observations the plan could not know: the filler sized from the live pool, the
    # Mamba state size the engine keeps, and remarks on what was seen.
    filler: Filler | None = None
    engine_mamba_state_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    # The figures the run was judged by: the plan's, refined by the observations
    # (``roundtrip.evaluate.derive_expected``); None until evaluated.
    expected: ck.Expected | None = None
    restart_seconds: float | None = None  # the second server's start (a disk restart)
    disk_files: DiskInventory | None = None  # the disk tier's chunk files after the replay
    disk_counters: bool = True  # the server exports the tiering counters (0.28+)
    # The content ledger judged (harness.oracle.content): None where none was kept.
    content: ContentReport | None = None
    # The CPU tier's usage gauge once the replay settled (``metrics.tier_usage``): None
    # where the server does not export it.
    tier_usage_after: float | None = None
    # vLLM's offload rate beside one bulk copy of the same bytes, a row per phase and
    # direction that moved bytes (``roundtrip.speed``): None where it was not measured
    # (a note says why).
    offload_speed: list[SpeedRow] | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def note(self, text: str) -> None:
        if text and text not in self.notes and text not in self.plan.notes:
            self.notes.append(text)

    def describe_plan(self) -> dict[str, Any]:
        """``run.json``'s ``plan``: the plan with what the run has observed so far."""
        out = self.plan.describe(self.filler)
        if self.expected is not None:
            out["expected"] = self.expected.as_dict()
        out["notes"] = [*self.plan.notes, *self.notes]
        return out
