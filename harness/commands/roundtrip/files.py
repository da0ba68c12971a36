"""A round trip's files in a run directory, rewritten after every phase.

Shared by ``roundtrip`` (one run) and ``matrix`` (one sub-directory per cell), so a
cell's evidence has the same shape, and the same documented schema, as a run's. Its
tables (``phases.csv``, ``checks.csv``; stress and the scripted bug triggers write the
checks table too) are spelled here and registered with the results registry
(``harness.results.tables.register``) with its section of the CI summary; its
``report.md`` is rendered here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.commands.roundtrip import RoundtripPlan, RoundtripResult, save_requests
from harness.commands.roundtrip.result import SpeedRow
from harness.results import ci_summary as ci
from harness.results.chart import NO_MATPLOTLIB, phases_chart
from harness.results.ci_summary import Row
from harness.results.markdown import table
from harness.results.records import CheckResult
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, record_fields, register
from harness.server.metrics import Snapshot


def _phase_columns() -> tuple[str, ...]:
    counters = record_fields(Snapshot)
    deltas = tuple(f"d_{c}" for c in counters)
    totals = tuple(f"cum_{c}" for c in counters)
    return ("phase", "requests", "seconds", *deltas, *totals)


PHASE_TABLE = TableFile(
    "phases.csv",
    _phase_columns(),
    key=("phase",),
    compared=("d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits", "d_ext_queries"),
    display=("phase", "d_stored_bytes", "d_loaded_bytes", "d_gpu_hits", "d_ext_hits/d_ext_queries"),
)
# A check is a JUnit case by its name, failing with what it expected and saw.
CHECKS = TableFile(
    "checks.csv",
    record_fields(CheckResult),
    junit=JUnitMap(
        "roundtrip.{scenario}",
        "{name}",
        lambda c: None if c.passed else f"expected {c.expected}, observed {c.observed}. {c.detail}",
        stdout="{why}",
    ),
    key=("name",),
    compared=("passed", "observed"),
    passes=("passed",),
    display=("name", "passed", "expected", "observed", "detail"),
)

# vLLM's offload rate beside one bulk copy of the same bytes (``roundtrip.speed``). No
# key: ``compare`` leaves it out, as two runs' rates differ by the machine's noise alone
# and a run that did not measure (attached, from before) has no file.
SPEED_TABLE = TableFile(
    "offload-speed.csv",
    record_fields(SpeedRow),
    title="offload speed",
    display=("phase", "direction", "bytes", "vLLM GB/s", "bulk copy GB/s", "ratio"),
)


def is_informational(row: Row) -> bool:
    """A ``checks.csv`` row that is reported but never fails the run."""
    flag = ci.truthy(ci.col(row, "informational"))
    if flag is not None:
        return flag
    return ci.col(row, "why").strip().lower().startswith("informational")


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The CI summary's section: the checks counted, the phases, every check."""
    phases, phases_problem = ci.read_csv(run_dir / PHASE_TABLE.name)
    checks, checks_problem = ci.read_csv(run_dir / CHECKS.name)
    passed = run.get("passed") if isinstance(run.get("passed"), bool) else None
    counted = ""
    if checks is not None and "passed" in checks.columns:
        gating = [r for _, r in checks.iterrows() if not is_informational(r)]
        ok = sum(1 for r in gating if ci.truthy(ci.col(r, "passed")))
        counted = f"{ok}/{len(gating)} checks passed"
        if passed is None and gating:
            passed = ok == len(gating)
    raw_plan, raw_variant = run.get("plan"), run.get("variant")
    plan = raw_plan if isinstance(raw_plan, dict) else {}
    variant = raw_variant if isinstance(raw_variant, dict) else {}
    facts = [counted]
    if variant.get("vllm_version"):
        facts.append(
            f"vLLM {variant['vllm_version']} ({variant.get('vllm_dist', '?')}) on "
            f"{variant.get('device', '?')}"
        )
    if plan.get("tensor_parallel"):
        facts.append(f"TP {plan['tensor_parallel']}")
    if plan.get("fault") not in (None, "", "none"):
        facts.append(f"fault `{plan['fault']}`")
    lines = ci.headline(run_dir, run, ci.verdict(run, passed), "; ".join(f for f in facts if f))

    lines += ["### Phases", ""]
    lines += ci.rows_or_note(phases, phases_problem, PHASE_TABLE, _phase_row)
    lines += ["", "### Checks", ""]
    lines += ci.rows_or_note(checks, checks_problem, CHECKS, check_row)
    if (run_dir / SPEED_TABLE.name).is_file():
        speed, speed_problem = ci.read_csv(run_dir / SPEED_TABLE.name)
        lines += ["", "### Offload speed", ""]
        lines += ci.rows_or_note(speed, speed_problem, SPEED_TABLE, _speed_row)
    files = [
        f"{what} `{run_dir / name}`"
        for name, what in (("report.md", "full report"), ("logs/server.log", "server log"))
        if (run_dir / name).is_file()
    ]
    if files:
        lines += ["", "Files: " + ", ".join(files) + "."]
    return [*lines, ""]


def _phase_row(r: Row) -> list[str]:
    hits = ci.num(ci.col(r, "d_ext_hits"), "")
    queries = ci.num(ci.col(r, "d_ext_queries"), "")
    return [
        ci.col(r, "phase"),
        ci.num(ci.col(r, "d_stored_bytes")),
        ci.num(ci.col(r, "d_loaded_bytes")),
        ci.num(ci.col(r, "d_gpu_hits"), ""),
        f"{hits}/{queries}",
    ]


def _speed_row(r: Row) -> list[str]:
    return [
        ci.col(r, "phase"),
        ci.col(r, "direction"),
        ci.num(ci.col(r, "bytes")),
        rate(ci.col(r, "gbps"), unit=""),  # the columns' headers say GB/s
        rate(ci.col(r, "copy_gbps"), unit=""),
        percent(ci.col(r, "ratio")),
    ]


def check_row(r: Row) -> list[str]:
    """A ``checks.csv`` row as the CI summary shows it (stress's section too)."""
    row_ok = ci.truthy(ci.col(r, "passed"))
    if is_informational(r):
        result = "info: same" if row_ok else "info: differs"
    else:
        result = "pass" if row_ok else "**FAIL**"
    return [
        ci.col(r, "name"),
        result,
        ci.col(r, "expected"),
        ci.col(r, "observed"),
        ci.col(r, "detail"),
    ]


ROUNDTRIP = register(
    ResultsKind(
        "roundtrip",
        (PHASE_TABLE, CHECKS, SPEED_TABLE),
        (
            "requests.jsonl",
            "junit.xml",
            "report.md",
            "phases.png",
            "metrics/<phase>.prom",
            "logs/server.log",
            "logs/baseline-server.log",
            "logs/server-restarted.log",
            "disk-tier/",
        ),
        summary=summary_section,
    )
)


class RoundtripWriter:
    """Call with the result after each step; every file is replaced atomically."""

    def __init__(self, run_dir: RunDirectory, plan: RoundtripPlan, chart: bool = True) -> None:
        self.run_dir, self.plan, self.chart = run_dir, plan, chart

    def __call__(self, result: RoundtripResult) -> None:
        plan, run_dir = self.plan, self.run_dir
        run_dir.update_meta(
            plan=result.describe_plan(),
            startup_seconds=result.startup_seconds,
            engine_kv_groups=result.engine_groups,
            engine_kernels=result.engine_kernels,
            restart_seconds=result.restart_seconds,
            disk_files=result.disk_files.record() if result.disk_files else None,
        )
        rows: list[dict[str, Any]] = [p.record() for p in result.phases]
        if rows:
            PHASE_TABLE.write(run_dir, rows)
        save_requests(result, run_dir.path / "requests.jsonl")
        if result.offload_speed:
            SPEED_TABLE.write(run_dir, [r.record() for r in result.offload_speed])
        if not result.checks:
            return
        CHECKS.write(run_dir, [c.record() for c in (*result.checks, *result.info_checks)])
        CHECKS.write_junit(run_dir, "roundtrip", result.checks, scenario=plan.scenario.name)
        run_dir.write_text(
            "report.md", roundtrip_report(result, {"results_dir": str(run_dir.path)})
        )
        if rows and self.chart:
            title = f"{plan.scenario.name}: {plan.model_ref}"
            if phases_chart(rows, title, run_dir.path / "phases.png") is None:
                result.note(f"no phases.png: {NO_MATPLOTLIB}")


def part_writer(path: Path, plan: RoundtripPlan, **meta: Any) -> RoundtripWriter:
    """The files of one round trip inside a larger run (a matrix cell, a fault round):
    the same files and schema as a ``roundtrip`` run, no chart. The caller ends the part's
    ``run.json`` with its verdict (``writer.run_dir.finish``)."""
    path.mkdir(parents=True, exist_ok=True)
    sub = RunDirectory(path, "roundtrip")
    sub.update_meta(plan=plan.describe(), **meta)
    return RoundtripWriter(sub, plan, chart=False)


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


def _blank(value: Any) -> bool:
    """No figure: None, or what a CSV gives for one ("", NaN)."""
    return value is None or value == "" or value != value


def rate(gbps: Any, unit: str = " GB/s") -> str:
    """An offload rate as every table shows it (``-``: none exported)."""
    return "-" if _blank(gbps) else f"{float(gbps):.3g}{unit}"


def percent(ratio: Any) -> str:
    """vLLM's rate over the bulk copy's, as every table shows it (``-``: no rate)."""
    return "-" if _blank(ratio) else f"{float(ratio):.1%}"


def speed_section(rows: list[SpeedRow] | None) -> list[str]:
    """report.md's offload speed: vLLM's rate beside the bulk copy, a row per phase and
    direction that moved bytes."""
    if not rows:
        return []
    body = [
        [
            r.phase,
            r.direction,
            f"{r.bytes:,}",
            f"{r.seconds:.4f}",
            rate(r.gbps),
            f"{r.copy_bytes:,}",
            rate(r.copy_gbps),
            percent(r.ratio),
        ]
        for r in rows
    ]
    head = [
        "phase",
        "direction",
        "vLLM bytes",
        "vLLM s",
        "vLLM rate",
        "copy bytes",
        "bulk copy",
        "ratio",
    ]
    return [
        "",
        "## Offload speed",
        "",
        f"vLLM's transfer time per phase against one bulk copy of the cold pass's bytes on "
        f"{rows[0].device} ({rows[0].copy}), measured after the run; TP "
        f"{rows[0].tensor_parallel} (at TP > 1 the rate is one worker's mean while it "
        "transfers).",
        "",
        table(head, body),
    ]


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
    lines += speed_section(result.offload_speed)
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
