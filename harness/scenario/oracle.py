"""The oracle's scenario file: which model families, under which offload settings, are
judged request by request on generated sequences, by which engines.

``offload-check oracle`` draws sequences from a seed, serves them one request at a time,
and holds every request against the harness's model of the offloading scheduler
(``harness.oracle.scheduler``). Each family is a model geometry; each mode a set of
offload settings (decode stores, a retention interval, late stores, an asynchronous
tier). A (family, mode) runs on the ``drive`` (vLLM's real scheduler in one process:
seconds) and, where the mode and platform allow, on a live ``server``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from harness.oracle.scheduler import DEVIATIONS as MODEL_DEVIATIONS
from harness.scenario.schema import (
    FileScenario,
    Platform,
    ServerSettings,
    StrictModel,
    _load,
    _spec_or_none,
)

Engine = Literal["drive", "server"]
ENGINES: tuple[Engine, ...] = ("drive", "server")
_NAME = r"^[a-z0-9][a-z0-9-]*$"


class OracleFamily(StrictModel):
    """One model family: its geometry (layer kinds, windows, KV sizes) and chunk."""

    name: str = Field(pattern=_NAME)
    geometry: str = Field(description="model config.json, made locally")
    chunk_tokens: int = Field(256, gt=0, description="offload chunk (the connector's block_size)")
    max_prompt: int = Field(1800, gt=1, description="the longest prompt drawn")
    # The drive's KV block; None: the server's (--block-size), which vLLM's CPU MLA
    # forces to 16 without AMX.
    drive_block: int | None = Field(None, gt=0)
    about: str = ""


class OracleMode(StrictModel):
    """Offload settings a family is judged under."""

    name: str = Field(pattern=_NAME)
    engines: list[Engine] = Field(default_factory=lambda: list(ENGINES))
    families: list[str] = Field(
        default_factory=list, description="the families it runs on; empty: every family"
    )
    server_families: list[str] | None = Field(
        None, description="of those, the ones a live server runs (None: all of them)"
    )
    offload_decode: bool = Field(False, description="offload_prompt_only = false")
    retention_interval: int | None = Field(
        None, ge=0, description="--prefix-cache-retention-interval (None: the release's)"
    )
    resets_in_flight: bool = Field(False, description="draw tier resets mid-request (drive)")
    store_delay: int = Field(0, ge=0, description="drive: stores' copies run N steps late")
    overlap: bool = Field(False, description="drive: the next request arrives at a finish")
    tight_pool: bool = Field(False, description="drive: a GPU pool of the longest request")
    defer_lookups: int = Field(0, ge=0, description="drive: an asynchronous tier's deferrals")
    max_batched_tokens: int | None = Field(None, gt=0, description="chunked prefill budget")
    wave: int = Field(
        0,
        ge=0,
        description="requests served at once, sharing no block (0: one at a time)",
    )
    about: str = ""

    # Settings only the drive can honour, and of those the ones that keep a wave's
    # requests from being served as if alone (a tier reset under them, a request
    # arriving at another's finish, a pool for one).
    _DRIVE_ONLY: ClassVar[tuple[str, ...]] = (
        "store_delay",
        "overlap",
        "tight_pool",
        "defer_lookups",
        "resets_in_flight",
    )
    _NOT_IN_A_WAVE: ClassVar[tuple[str, ...]] = ("overlap", "tight_pool", "resets_in_flight")

    @model_validator(mode="after")
    def _drive_only(self) -> OracleMode:
        only = [name for name in self._DRIVE_ONLY if getattr(self, name)]
        if only and "server" in self.engines:
            raise ValueError(
                f"mode {self.name!r}: {', '.join(only)} only the drive can do: "
                'give engines = ["drive"]'
            )
        alone = [name for name in self._NOT_IN_A_WAVE if getattr(self, name)]
        if self.wave > 1 and alone:
            raise ValueError(f"mode {self.name!r}: wave cannot be combined with {alone[0]}")
        return self


class OracleRule(StrictModel):
    """Checks a release is expected to fail where the model holds no exact rule for it
    (every matching rule applies), or a (family, mode, engine) it cannot run."""

    vllm: str | None = Field(None, description="PEP 440 specifier on the build's vLLM version")
    family: str | None = None
    mode: str | None = None
    engine: Engine | None = None
    platform: Platform | None = None
    failing_checks: list[str] = Field(default_factory=list)
    deviations: list[str] = Field(
        default_factory=list, description="rules of the model this release follows instead"
    )
    skip: bool = Field(False, description="not run where the rule holds")
    issue: int | str | None = None
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)

    @field_validator("deviations")
    @classmethod
    def _known_deviations(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(MODEL_DEVIATIONS))
        if unknown:
            raise ValueError(
                f"unknown deviation {unknown[0]!r}; known: {', '.join(MODEL_DEVIATIONS)}"
            )
        return value


class OracleScenario(FileScenario):
    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variant: str = "current"
    seed: int = 0
    requests: int = Field(40, gt=0, le=2000, description="requests per sequence on the drive")
    server_requests: int = Field(12, gt=0, le=500, description="requests per sequence on a server")
    max_tokens: int = Field(4, gt=0)
    logprobs: int = Field(2, ge=0, le=20)
    # A request that hit prefills only its tail over loaded KV: bf16 need not round it as
    # the first, whole prefill did (pressure's tolerance).
    logprob_tolerance: float = Field(0.008, ge=0.0)
    weights: Literal["dummy", "random"] = "random"
    weight_seed: int = 0
    cpu_bytes_to_use: int = Field(1 << 30, gt=0)
    settle_timeout_s: float = Field(15.0, gt=0)
    server: ServerSettings = Field(default_factory=ServerSettings)
    families: list[OracleFamily] = Field(min_length=1)
    modes: list[OracleMode] = Field(min_length=1)
    expectations: list[OracleRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> OracleScenario:
        for what, names in (
            ("family", [f.name for f in self.families]),
            ("mode", [m.name for m in self.modes]),
        ):
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup:
                raise ValueError(f"{what} {dup!r} is named twice")
        known = {f.name for f in self.families}
        for mode in self.modes:
            for name in [*mode.families, *(mode.server_families or [])]:
                if name not in known:
                    raise ValueError(f"mode {mode.name!r} names no family {name!r}")
        return self


def load_oracle(path: Path) -> OracleScenario:
    return _load(path, OracleScenario)
