"""The pressure scenario file: a CPU tier smaller than its traffic, each server's
requests as ``NAMEn`` words, and the rules for releases that deviate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from harness.names import DEVIATIONS
from harness.scenario.schema import (
    FileScenario,
    Platform,
    ServerSettings,
    StrictModel,
    _load,
    _spec_or_none,
)

_REQUEST = re.compile(r"([A-Za-z]+)([1-9][0-9]*)")


class PressureRule(StrictModel):
    """What some releases do differently under pressure. Unlike a round trip's rules,
    every rule that matches a server applies (a release can have an ARC bug and a
    threshold bug at once): its ``deviations`` switch the oracle to the upstream
    behaviour it names, so that release is still judged exactly, request by request;
    ``failing_checks`` are checks expected to fail where no exact model exists (a bug
    whose effect depends on set order)."""

    vllm: str | None = Field(None, description="PEP 440 specifier on the build's vLLM version")
    policy: Literal["lru", "arc"] | None = None
    threshold: bool | None = Field(None, description="store_threshold >= 2")
    deviations: list[str] = Field(default_factory=list)
    failing_checks: list[str] = Field(default_factory=list)
    issue: int | str | None = Field(None, description="upstream issue or label")
    platform: Platform | None = Field(None, description="where the rule holds; none: anywhere")
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)

    @field_validator("deviations")
    @classmethod
    def _known_deviation(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in DEVIATIONS:
                raise ValueError(f"unknown deviation {name!r}; known: {', '.join(DEVIATIONS)}")
        return value


class PressureServer(StrictModel):
    """One server of a pressure run: a policy, a threshold, and the requests it serves,
    one at a time, as ``NAMEn`` words (prompt NAME's first n chunks; a name seen again
    with more chunks extends its prompt)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    policy: Literal["lru", "arc"] = "lru"
    store_threshold: int = Field(0, ge=0)
    requests: str

    @field_validator("requests")
    @classmethod
    def _words(cls, value: str) -> str:
        words = value.split()
        if not words:
            raise ValueError("a server needs at least one request")
        for word in words:
            if not _REQUEST.fullmatch(word):
                raise ValueError(f"request {word!r} is not NAME then a chunk count (e.g. A4)")
        return value

    def sequence(self) -> list[tuple[str, int]]:
        return [
            (m.group(1), int(m.group(2)))
            for m in (_REQUEST.fullmatch(w) for w in self.requests.split())
            if m
        ]


class PressureScenario(FileScenario):
    """A CPU tier smaller than what its traffic stores: each server's requests judged
    against the harness's model of the eviction policy and store threshold."""

    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variant: str = "current"
    geometry: str = Field(description="model config.json, made locally")
    # Seeded random weights at a real scale, so a chunk loaded from a wrong slot changes
    # the output (near-zero dummy weights would answer the same either way).
    weights: Literal["dummy", "random"] = "random"
    weight_seed: int = 0
    chunk_tokens: int = Field(256, gt=0, description="offload chunk (the connector's block_size)")
    slots: int = Field(8, ge=2, description="the CPU tier in slots (one chunk of one KV group)")
    tail_tokens: int = Field(100, gt=0, description="tokens after a prompt's last whole chunk")
    max_tokens: int = Field(4, gt=0)
    logprobs: int = Field(3, ge=0, le=20)
    # A hit request prefills only its tail over loaded KV; its cold run prefilled all of
    # it, which bf16 need not round identically (the round trip's baseline floor).
    logprob_tolerance: float = Field(0.008, ge=0.0)
    seed: int = 0
    settle_timeout_s: float = Field(15.0, gt=0)
    server: ServerSettings = Field(default_factory=ServerSettings)
    servers: list[PressureServer] = Field(min_length=1)
    expectations: list[PressureRule] = Field(default_factory=list)

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[PressureServer]) -> list[PressureServer]:
        names = [s.name for s in value]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"server {dup!r} is named twice")
        return value


def load_pressure(path: Path) -> PressureScenario:
    return _load(path, PressureScenario)
