"""What ``--dry-run`` prints, the shared part: each command renders its own plan (its show
module, ``cli/<command>_show.py``) and registers the renderers here under the name its
CLI module passes to ``common.plan_and_run``, as text (prose wrapped to the terminal, an
argv on one line to copy) and as one JSON document (``--dry-run --json``). Here: that
registry, prose wrapped to the console, the host's environment fixes every server gets,
a round trip's heading, and the builds of a run over many releases."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from harness.engine.amx import planned_state
from harness.names import ENV_AMX
from harness.server import release_envs as renv
from harness.ui.fit import release_ranges

_RENDERERS: dict[str, Callable[..., Any]] = {}


def register(
    name: str,
    text: Callable[[Console, Any], None],
    record: Callable[[Any], dict[str, Any]],
) -> str:
    """A command's plan renderers, found by ``name`` on this module (``common.show_plan``):
    ``name`` prints the plan, ``<name>_record`` is its ``--json`` document. Returns the
    name, for the command's CLI module to pass to ``common.plan_and_run``."""
    for key, fn in ((name, text), (f"{name}_record", record)):
        if _RENDERERS.setdefault(key, fn) is not fn:
            raise ValueError(f"plan renderer {key!r} registered twice")
    return name


def __getattr__(name: str) -> Any:
    """A registered renderer by name, as if defined here."""
    try:
        return _RENDERERS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def say(console: Console, text: str, indent: int = 2, bold: str = "") -> None:
    """A line of prose wrapped to the console's width, continuation lines indented two
    more; ``bold``: its first words, in bold."""
    lines = textwrap.wrap(
        text,
        width=max(20, console.width),
        initial_indent=" " * indent,
        subsequent_indent=" " * (indent + 2),
        break_on_hyphens=False,
    ) or [""]
    for i, line in enumerate(lines):
        if i == 0 and bold and line.lstrip().startswith(bold):
            pad = line[: len(line) - len(line.lstrip())]
            console.print(f"{pad}[bold]{escape(bold)}[/]", end="", highlight=False)
            console.print(line.lstrip()[len(bold) :], highlight=False, markup=False)
        else:
            console.print(line, highlight=False, markup=False)


def host_state() -> dict[str, str]:
    """The environment fixes every server gets on this host."""
    state = planned_state()
    why = {
        "requested": "AMX tile permission requested in every vLLM process (vLLM's CPU "
        f"attention needs it and never asks; {ENV_AMX}=off to reproduce that)",
        "off": f"AMX present but {ENV_AMX}=off: vLLM's CPU attention may die by SIGILL",
        "not-needed": "no AMX on this CPU: nothing to request",
    }[state]
    return {"amx_permission": state, "why": why, "PYTHONFAULTHANDLER": "1"}


def host_line(console: Console) -> None:
    """The environment fixes every server gets on this host (dry-runs show them)."""
    h = host_state()
    say(
        console,
        f"host: amx_permission={h['amx_permission']} ({h['why']}); servers run with "
        "PYTHONFAULTHANDLER=1",
    )


def _off_platform(console: Console, text: str) -> None:
    if text:
        say(console, f"note: {text}", indent=0, bold="note:")


def heading(console: Console, base: Any, bold: str, text: str, attached: str = "") -> None:
    """The first lines of a plan of round trips on ``base`` (a round-trip plan): a note
    when its variant is off its platform, ``bold`` then ``text``, and what is launched:
    the host line, or for an attached server (``--url``) nothing (``attached``: what is
    sent to it instead)."""
    _off_platform(console, base.off_platform)
    say(console, f"{bold} {text}", indent=0, bold=bold)
    if base.url is None:
        host_line(console)
    else:
        say(console, f"attach: {base.url} (a server someone else launched): nothing is {attached}")


def build_states(run: Any) -> list[dict[str, Any]]:
    """Each build of a sweep and what this machine knows of it: ``ready`` (its
    environment exists), ``to create``, ``known not to install`` (an install failed
    lately, with the reason, remembered a day) or ``your build``."""
    existing = {e.name: e for e in renv.list_envs(measure=False)}
    try:
        known = {r["release"]: r for r in renv.offline_releases(run.dist)[0]}
    except Exception:  # an unknown distribution: nothing is known of its releases
        known = {}
    out = []
    for b in run.builds:
        if not b.release:
            out.append({"label": b.label, "state": "your build", "where": b.spec})
            continue
        name = renv.env_name(run.dist, b.spec)
        entry = existing.get(name)
        reason = (known.get(b.label) or {}).get("unavailable")
        if entry is not None and entry.complete:
            state = "ready"
        elif reason:
            state = "known not to install"
        else:
            state = "to create"
        out.append(
            {
                "label": b.label,
                "state": state,
                "where": str(renv.envs_dir() / name),
                "reason": reason or None,
            }
        )
    return out


def build_lines(console: Console, run: Any) -> list[dict[str, Any]]:
    """The builds in a few lines: how many, then each state (and each reason a release
    cannot install) with its releases as ranges. Returns the states."""
    states = build_states(run)
    order = [b.label for b in run.builds]
    groups: dict[tuple[int, str, str], list[str]] = {}
    for st in states:
        rank = BUILD_STATES.index(st["state"])
        groups.setdefault((rank, st["state"], st.get("reason") or ""), []).append(st["label"])
    say(console, f"{len(states)} build(s) of {run.dist}, environments in {renv.envs_dir()}:")
    for (_, state, reason), labels in sorted(groups.items()):
        why = f"; {reason}" if reason else ""
        say(console, f"{state} ({len(labels)}{why}): {release_ranges(labels, order)}", indent=4)
    return states


BUILD_STATES = ("ready", "to create", "known not to install", "your build")
