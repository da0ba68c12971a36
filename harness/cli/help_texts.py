"""Every option's help text, from ``help.toml`` by ``"<command>.<option>"``, with the
lists the code keeps (faults, patches, profiles, the bug corpus) filled in; ``opt`` is
``typer.Option`` with its help from there, so each declaration stays one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib
import typer
from rich.markup import escape

from harness.names import FAULTS, PATCHES, POLICY_MUTANTS, REPO_ROOT
from harness.scenario.stress_profiles import PROFILES


def generated_lists() -> dict[str, str]:
    """The lists help texts name, from where the code keeps them (``{faults}`` in
    help.toml): the seeded faults and patches (``harness.names``), the stress profiles,
    and the shipped bug corpus's ids (its files' stems, as ``load_corpus`` names them)."""

    def words(items: Any, last: str = "or") -> str:
        items = list(items)
        return ", ".join(items[:-1]) + f" {last} {items[-1]}" if len(items) > 1 else "".join(items)

    bugs = sorted(p.stem for p in (REPO_ROOT / "scenarios" / "bugs").glob("*.toml"))
    return {
        "faults": ", ".join(FAULTS[1:]),
        "all-faults": ", ".join(FAULTS),
        "patches": words([*PATCHES, "none"]),
        "profiles": words(PROFILES),
        "bugs": ", ".join(bugs),
        "mutants": words(POLICY_MUTANTS),
    }


def _help(raw: dict[str, Any]) -> dict[str, str]:
    lists = generated_lists()
    out: dict[str, str] = {}
    for key, text in raw.items():
        if isinstance(text, str):
            for name, value in lists.items():
                text = text.replace("{" + name + "}", value)
            # typer renders help as rich markup: "[offload.disk]" would vanish as a tag.
            out[key] = escape(text)
    return out


_HELP_FILE = tomllib.loads(Path(__file__).with_name("help.toml").read_text())
# Every option's help text, by "<command>.<option>": declarations stay one line each.
HELP: dict[str, str] = _help(_HELP_FILE)
# What ``--help`` shows as an option's value, by parameter name (``help_format.readable_help``).
METAVARS: dict[str, str] = dict(_HELP_FILE.get("metavar", {}))


def opt(key: str, *decls: str, **settings: Any) -> Any:
    """``typer.Option`` with its help from help.toml."""
    return typer.Option(*decls, help=HELP[key], **settings)


def scenario_opt(command: str) -> Any:
    """``--scenario`` of a command whose default is ``scenarios/<command>.toml``."""
    return opt(f"{command}.scenario", show_default=f"scenarios/{command}.toml")
