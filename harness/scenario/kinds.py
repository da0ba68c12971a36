"""Which kind of file a scenario is, from the keys only that kind has, and loading it by
that kind's model. Below every command: ``validate`` plans what this loads, and the bug
corpus loads the scenarios its entries trigger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.scenario.bugs import load_bug
from harness.scenario.crash_repro import load_crash_repro
from harness.scenario.matrix import load_matrix
from harness.scenario.oracle import load_oracle
from harness.scenario.pressure import load_pressure
from harness.scenario.roundtrip import load_roundtrip
from harness.scenario.schema import load_variants, read_toml
from harness.scenario.stress import load_stress


def scenario_kind(data: dict[str, Any]) -> str:
    """``bug`` (a trigger), ``stress`` (names a round trip), ``matrix`` (has entries),
    ``pressure`` (has servers), ``oracle`` (has families),
    ``roundtrip`` (a geometry), ``variants`` (a variants table) or ``crash-repro``."""
    if "trigger" in data:
        return "bug"
    if "roundtrip" in data and "entries" not in data:
        return "stress"
    if "entries" in data:
        return "matrix"
    if "servers" in data:
        return "pressure"
    if "families" in data:
        return "oracle"
    if "geometry" in data:
        return "roundtrip"
    if isinstance(data.get("variants"), dict):
        return "variants"
    return "crash-repro"


def load_any(path: Path) -> tuple[str, Any]:
    """A scenario file of any kind, loaded by the model of the kind its keys say."""
    kind = scenario_kind(read_toml(path))
    load: dict[str, Any] = {
        "bug": load_bug,
        "stress": load_stress,
        "matrix": load_matrix,
        "pressure": load_pressure,
        "oracle": load_oracle,
        "roundtrip": load_roundtrip,
        "crash-repro": load_crash_repro,
        "variants": load_variants,
    }
    return kind, load[kind](path)
