"""The matrix scenario file: a round trip per KV-cache spec family (its entries), on
every variant and CPU tier, judged by first-match cell rules."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from harness.scenario.roundtrip import RoundTripRule
from harness.scenario.schema import FileScenario, KnownCrash, StrictModel, _load

Family = Literal["full-attention", "sliding-window", "chunked-local", "mamba-hybrid", "mla"]
StartupOutcome = Literal["started", "crashed", "unsupported", "timeout", "error"]
RoundtripOutcome = Literal["pass", "fail", "skip"]
# The offload tiers a matrix cell runs on: ``roomy`` a CPU tier that holds targets +
# filler and never evicts (the round trip's own sizing); ``pressure`` a CPU tier of
# exactly the targets' chunks under LRU, so the filler's stores evict them all and the
# replay must load nothing; ``disk`` that CPU tier over vLLM's fs disk tier, so the
# replay must read every evicted target back from disk.
MatrixTier = Literal["roomy", "pressure", "disk"]


class MatrixEntry(StrictModel):
    """One model geometry standing for a KV-cache spec family, with its own workload."""

    family: Family
    geometry: str
    about: str = ""
    # Replace the base scenario's server.extra_args (pool size, block size, ...).
    server_args: list[str] | None = None
    max_model_len: int | None = Field(None, gt=0)
    target_tokens: list[int] | None = None
    filler_tokens: int | None = Field(None, gt=0)
    filler_margin: float | None = Field(None, ge=0.0, le=2.0)
    offload_block_size: int | None = Field(None, gt=0)
    offload_cpu_bytes: int | Literal["auto"] | None = Field(
        None, description="offload.cpu_bytes_to_use"
    )
    pool_tokens: int | None = Field(None, gt=0, description="server.pool_tokens")


class CellExpectation(RoundTripRule):
    """A rule for matrix cells; the first rule whose given fields all match wins.

    ``startup`` is the verdict at launch: ``crashed`` means a crash in offloading code
    (a bug the connector causes), ``unsupported`` a crash elsewhere (the build cannot
    run the family at all; ``error`` must then occur in the crash's message). When the
    server starts, ``roundtrip`` says whether every check must pass, or which checks
    are known to fail (``failing_checks``, all others must pass).
    """

    family: Family | None = None
    geometry: str | None = Field(None, description="geometry file stem, e.g. gemma3-interleaved")
    variant: str | None = None
    tier: MatrixTier | None = None
    startup: StartupOutcome = "started"
    known: int | str | None = Field(
        None, description="upstream issue (or label) the crash must be matched to"
    )
    error: str | None = Field(None, description="text the crash message must contain")
    roundtrip: RoundtripOutcome = "pass"


class MatrixScenario(FileScenario):
    name: str
    description: str = ""
    # The round trip every cell runs (server, offload, workload); entries override parts.
    roundtrip: str = "roundtrip-cpu.toml"
    variants: list[str] = Field(default_factory=lambda: ["stock", "current"], min_length=1)
    # Every entry x variant runs on each of these CPU tiers (``MatrixTier``).
    tiers: list[MatrixTier] = Field(
        default_factory=lambda: list[MatrixTier](["roomy"]), min_length=1
    )
    entries: list[MatrixEntry] = Field(min_length=1)
    expectations: list[CellExpectation] = Field(min_length=1)
    known_crashes: list[KnownCrash] = Field(default_factory=list)


def load_matrix(path: Path) -> MatrixScenario:
    return _load(path, MatrixScenario)
