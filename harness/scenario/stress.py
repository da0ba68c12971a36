"""The stress scenario file (``scenarios/stress.toml``): a round trip's settings, traffic
from seeded profiles (``stress_profiles.py``), bounds and tier pressure."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, create_model, field_validator

from harness.scenario.schema import FileScenario, StrictModel, _load
from harness.scenario.stress_profiles import PROFILES, ProfileSettings


def _profile_table() -> type[StrictModel]:
    """A ``[profiles.<name>]`` table: any of ``ProfileSettings``'s numbers (unknown keys
    refused like everywhere else), plus engine arguments the profile needs."""
    hints = typing.get_type_hints(ProfileSettings)
    fields: dict[str, Any] = {
        f.name: (hints[f.name] | None, None) for f in dataclasses.fields(ProfileSettings)
    }
    fields["engine_args"] = (list[str], Field(default_factory=list))
    return create_model("ProfileTable", __base__=StrictModel, **fields)


ProfileTable = _profile_table()


class StressScenario(FileScenario):
    """A stress run: a round-trip scenario's model, engine and offload settings, traffic
    from seeded profiles, judged against a connector-off reference."""

    name: str
    description: str = ""
    roundtrip: str = Field(description="round-trip scenario: model, server, offload settings")
    profile: str = "mixed"
    concurrency: int = Field(4, ge=1, le=64)
    seed: int = 0
    # Bounds; none means the profile's plan once. requests caps the plan (turns kept
    # with their parents); duration_s repeats it with new seeds until the time is up.
    requests: int | None = Field(None, ge=1)
    duration_s: float | None = Field(None, gt=0, le=24 * 3600)
    # Engine arguments for every profile, then the profile's own (e.g. a small pool).
    engine_args: list[str] = Field(default_factory=list)
    # Headroom of the CPU tier over every token the plan can store: a stress run judges
    # hits on stored prefixes, so the tier must never evict one.
    cpu_tier_margin: float = Field(0.5, ge=0.0, le=10.0)
    # Offload generated tokens' blocks too (the connector's offload_prompt_only = false):
    # later turns then hit on KV stored during decode. False keeps vLLM's default
    # (prompt blocks only); the byte ledger follows either.
    offload_decode: bool = True
    # Pressure: a CPU tier holding only this fraction of what the plan can store, so it
    # evicts while requests run concurrently (docs/stress.md). Prefix reuse and the store
    # count are then the policy's choice, not judged; outputs, loads and survival are.
    cpu_tier_fraction: float | None = Field(None, gt=0, lt=1)
    # The tier's eviction policy (kv_connector_extra_config's eviction_policy); none
    # keeps the round trip's (vLLM's default: lru).
    eviction_policy: Literal["lru", "arc"] | None = None
    # Restarts over a disk tier: after the plan, the server is stopped cleanly this many
    # times and a new one on the same directory is sent the plan again, which must come
    # back from disk (docs/stress.md).
    restarts: int = Field(0, ge=0, le=8)
    profiles: dict[str, ProfileTable] = Field(default_factory=dict)  # type: ignore[valid-type]

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"unknown profile {value!r}; known: {', '.join(PROFILES)}")
        return value

    @field_validator("profiles")
    @classmethod
    def _known_profiles(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name not in PROFILES:
                raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
        return value


def load_stress(path: Path) -> StressScenario:
    return _load(path, StressScenario)
