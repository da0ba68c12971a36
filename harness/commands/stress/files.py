"""What a stress run writes, rewritten as the run goes: the requests each server was sent
and answered, the checks, ``divergence.md``, ``junit.xml`` and the timeline chart. Its
checks table (the round trip's, its JUnit cases classed by profile) and its section of
the CI summary are registered here (``harness.results.tables.register``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.commands.roundtrip.files import CHECKS, check_row
from harness.commands.stress.driver import Outcome
from harness.commands.stress.evaluate import kernels_text
from harness.commands.stress.judge import SHOWN_TOKENS
from harness.commands.stress.result import StressResult, served_differences
from harness.commands.stress.workload import PlannedRequest
from harness.results import ci_summary as ci
from harness.results.chart import pyplot
from harness.results.run_directory import RunDirectory
from harness.results.tables import ResultsKind, register

# The round trip's checks table, its JUnit cases classed by the stress profile.
assert CHECKS.junit is not None
STRESS_CHECKS = replace(CHECKS, junit=replace(CHECKS.junit, classname="stress.{profile}"))


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The profile and what it did in numbers, then every check."""
    checks, problem = ci.read_csv(run_dir / STRESS_CHECKS.name)
    passed = run.get("passed") if isinstance(run.get("passed"), bool) else None
    raw_plan, raw_figures = run.get("plan"), run.get("stress")
    plan = raw_plan if isinstance(raw_plan, dict) else {}
    f = raw_figures if isinstance(raw_figures, dict) else {}
    facts = [
        f"profile `{plan.get('profile', '?')}`, seed {plan.get('seed', '?')}, "
        f"concurrency {plan.get('concurrency', '?')}",
        f"{f.get('requests_sent', '?')} requests ({f.get('requests_compared', '?')} compared) "
        f"in {f.get('traffic_seconds', '?')} s",
        f"tolerance {f.get('tolerance')} (noise floor {f.get('noise_floor')})",
    ]
    if plan.get("fault") not in (None, "", "none"):
        facts.append(f"fault `{plan['fault']}`")
    if plan.get("patch") not in (None, "", "none"):
        facts.append(f"patch `{plan['patch']}`")
    lines = ci.headline(run_dir, run, ci.verdict(run, passed), "; ".join(facts))
    lines += ["### Checks", ""]
    lines += ci.rows_or_note(checks, problem, STRESS_CHECKS, check_row)
    files = [
        f"{what} `{run_dir / name}`"
        for name, what in (
            ("divergence.md", "divergences"),
            ("timeline.png", "timeline"),
            ("requests.jsonl", "requests"),
        )
        if (run_dir / name).is_file()
    ]
    if files:
        lines += ["", "Files: " + ", ".join(files) + "."]
    return [*lines, ""]


STRESS = register(
    ResultsKind(
        "stress",
        (STRESS_CHECKS,),
        (
            "requests.jsonl",
            "reference.jsonl",
            "divergence.md",
            "junit.xml",
            "timeline.png",
            "metrics/start.prom",
            "metrics/end.prom",
            "logs/server.log",
            "logs/reference-server.log",
        ),
        summary=summary_section,
    )
)


def write_stress(run_dir: RunDirectory, result: Any) -> None:
    """Every stress file from what is known so far (rewritten as the run goes)."""
    plan = result.plan
    save_requests(result.outcomes, run_dir.path / "requests.jsonl", result.sent)
    if result.reference:
        save_requests(result.reference, run_dir.path / "reference.jsonl", plan.requests)
    if plan.base is not None and plan.base.disk is not None:
        # The plan again: a disk tier's directory is named once the run directory exists.
        run_dir.update_meta(plan=plan.describe())
    run_dir.update_meta(stress=result.figures())
    if result.checks:
        STRESS_CHECKS.write(run_dir, [c.record() for c in result.checks])
        STRESS_CHECKS.write_junit(run_dir, "stress", result.checks, profile=plan.profile)
        run_dir.write_text("divergence.md", divergence_md(result))
        if result.outcomes:
            stress_timeline(result, run_dir.path / "timeline.png")


def stress_timeline(result: Any, out: Path) -> Path | None:
    """A stress run over time: requests in flight (top), and the CPU tier's cumulative
    stored and loaded bytes with preemptions (bottom), from the metrics sampled twice a
    second. Where a divergence or an error lands against this picture says whether it
    came with a burst of loads, a preemption or nothing in particular."""
    plt = pyplot()
    if plt is None:
        return None
    inflight = timeline(result.outcomes)
    fig, (ax_req, ax_bytes) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    if inflight:
        ax_req.step([t for t, _ in inflight], [n for _, n in inflight], where="post")
    bad = [o for o in result.outcomes if o.error and not o.aborted]
    diverged = [
        o
        for o in result.outcomes
        if o.id in result.verdicts and result.verdicts[o.id].divergence is not None
    ]
    for group, colour, label in ((bad, "red", "errored"), (diverged, "orange", "diverged")):
        if group:
            ax_req.scatter([o.ended_s for o in group], [0.2] * len(group), c=colour, label=label)
    ax_req.set_ylabel("requests in flight")
    ax_req.set_title(f"stress {result.plan.profile}, seed {result.plan.seed}")
    if any(True for _ in (bad or diverged)):
        ax_req.legend()
    if result.samples:
        t0 = result.samples[0][1]
        ts = [t for t, _ in result.samples]
        for key, label in (("stored_bytes", "stored"), ("loaded_bytes", "loaded")):
            ax_bytes.plot(ts, [(s[key] - t0[key]) / 1e6 for _, s in result.samples], label=label)
        ax_pre = ax_bytes.twinx()
        ax_pre.plot(
            ts,
            [s["preemptions"] - t0["preemptions"] for _, s in result.samples],
            color="grey",
            linestyle="--",
            label="preemptions",
        )
        ax_pre.set_ylabel("preemptions")
        ax_bytes.legend(loc="upper left")
    ax_bytes.set_ylabel("MB (cumulative)")
    ax_bytes.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def timeline(outcomes: Sequence[Outcome], step_s: float = 0.25) -> list[tuple[float, int]]:
    """Requests in flight over time (the timeline chart's first series)."""
    if not outcomes:
        return []
    end = max(o.ended_s for o in outcomes)
    points = []
    t = 0.0
    while t <= end + step_s:
        points.append((round(t, 3), sum(1 for o in outcomes if o.started_s <= t < o.ended_s)))
        t += step_s
    return points


def save_requests(outcomes: Sequence[Outcome], path: Path, plan: Sequence[PlannedRequest]) -> None:
    """``requests.jsonl``: every request as planned and as it went."""
    by = {r.id: r for r in plan}
    with path.open("w") as fh:
        for o in outcomes:
            rec = {**by[o.id].record(), **o.record()} if o.id in by else o.record()
            fh.write(json.dumps(rec, sort_keys=True) + "\n")


def divergence_md(result: StressResult) -> str:
    """``divergence.md``: each request the reference would not have generated, with the
    first token where they part and both texts around it."""
    plan = result.plan
    lines = [
        f"# Divergences: stress {plan.profile}, seed {plan.seed}",
        "",
        f"Noise floor {result.floor if result.floor is not None else 'not measured'} "
        f"(largest stray {result.floor_stray}, largest two-token gap move "
        f"{result.floor_pair}, largest near-tie lost {result.floor_lost}, logprob "
        f"resolution {result.floor_resolution}) "
        f"over {result.floor_tokens} tokens; tolerance {result.tolerance}.",
        "",
        f"Attention kernels: {kernels_text(result.engine_kernels)}.",
        "",
    ]
    if result.reference_source is not None:  # --reference-cache: where it came from
        lines += [f"Reference: {result.reference_source.line()}.", ""]
    bad = [
        (o, result.verdicts[o.id])
        for o in result.outcomes
        if o.id in result.verdicts and result.verdicts[o.id].divergence is not None
    ]
    if not bad:
        lines.append("No request diverged from the reference.")
    lines += _served_section(result)
    if not bad:
        return "\n".join(lines) + "\n"
    for o, v in bad:
        d = v.divergence
        turn = f", turn {o.turn}" if o.turn is not None else ""
        lines += [
            f"## {o.id}{turn}",
            "",
            f"- {d.text()}",
            f"- prompt {len(o.prompt)} tokens, cached {o.cached_tokens}, "
            f"started {o.started_s:.2f}s, ended {o.ended_s:.2f}s",
            f"- run's tokens from there: {o.output[d.index : d.index + SHOWN_TOKENS]}",
        ]
        ex = result.explanations.get(o.id, {})
        if "reference_ids" in ex:
            lines.append(f"- reference's tokens from there: {ex['reference_ids']}")
            lines.append(f"- reference's text from there: {ex['reference_text']!r}")
        elif "error" in ex:
            lines.append(f"- reference's continuation: not available ({ex['error']})")
        lines += [f"- run's whole answer: {o.text[:400]!r}", ""]
    return "\n".join(lines) + "\n"


def _served_section(result: StressResult) -> list[str]:
    """Requests whose served logprobs differ from the reference replay's (same prompt)."""
    diffs = served_differences(result)
    if not result.reference:
        return []
    head = [
        "",
        "## Served logprobs, run under test vs the reference's replay",
        "",
        "Same prompt, both served at the same concurrency; a diagnostic, not a verdict. "
        f"{len(diffs)} request(s) differ.",
        "",
    ]
    if not diffs:
        return head
    rows = [
        "| request | cached (run / reference) | positions differing | max difference | "
        "first position | first token differing |",
        "|---|---|---|---|---|---|",
    ]
    for d in diffs:
        rows.append(
            f"| {d.id} | {d.cached_tokens} / {d.reference_cached_tokens} | {d.differing} | "
            f"{d.max_diff:.6f} | {d.first} | {d.token_at if d.token_at is not None else ''} |"
        )
    return [*head, *rows, ""]
