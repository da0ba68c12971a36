"""The crash-repro scenario file: which models, on which variants, with the connector on
and off, and the outcome each row is expected to end in (first-match rules)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

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

# crashed-on-first-request: /health answered, then the engine died serving the first
# completion (a kernel fault, say); skipped: the row needs a CPU feature this host lacks.
Outcome = Literal["started", "crashed", "crashed-on-first-request", "timeout", "error", "skipped"]
ConnectorMode = Literal["on", "off"]


class Expectation(StrictModel):
    """A rule: rows matching every given field are expected to end as ``outcome``.

    Rules are tried in order and the first match wins, so specific rules go first
    and a catch-all (no match fields) goes last.
    """

    variant: str | None = None
    vllm: str | None = Field(None, description="PEP 440 specifier on the variant's vLLM version")
    patch: str | None = Field(None, description='effective patch name, or "none"')
    connector: bool | None = None
    chunked_local: bool | None = Field(None, description="config has chunked local layers")
    model: str | None = Field(None, description="model config name (file stem)")
    outcome: Outcome
    known: int | str | None = Field(
        None, description="known crash the signature must match: upstream issue or label"
    )
    platform: Platform | None = Field(None, description="where the rule holds; none: anywhere")
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)


def _both_connector_modes() -> list[ConnectorMode]:
    # A typed function, not a lambda: mypy infers ``lambda: ["on", "off"]`` as list[str].
    return ["on", "off"]


class CrashReproScenario(FileScenario):
    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variants: list[str] = Field(min_length=1)
    models: list[str] = Field(min_length=1)
    connector: list[ConnectorMode] = Field(default_factory=_both_connector_modes, min_length=1)
    # Variants that run only some of the models (model files as in ``models``), e.g. a
    # reproduction of an engine bug that needs one geometry; others run every model.
    variant_models: dict[str, list[str]] = Field(default_factory=dict)
    server: ServerSettings = Field(default_factory=ServerSettings)
    offload: OffloadSettings = Field(default_factory=OffloadSettings)
    expectations: list[Expectation] = Field(min_length=1)
    known_crashes: list[KnownCrash] = Field(default_factory=list)

    @field_validator("offload")
    @classmethod
    def _tier_in_bytes(cls, value: OffloadSettings) -> OffloadSettings:
        # "auto" sizes the tier from a round trip's pool and filler; a crash-repro has none.
        if not isinstance(value.cpu_bytes_to_use, int):
            raise ValueError('cpu_bytes_to_use = "auto" needs a round trip; give bytes here')
        return value


def load_crash_repro(path: Path) -> CrashReproScenario:
    return _load(path, CrashReproScenario)
