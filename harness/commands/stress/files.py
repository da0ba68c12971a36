"""What a stress run writes, rewritten as the run goes: the requests each server was sent
and answered, the checks, ``divergence.md``, ``junit.xml`` and the timeline chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.commands.stress.judge import divergence_md, save_requests, timeline
from harness.results.run_directory import RunDirectory
from harness.results.tables import STRESS_CHECKS


def write_stress(run_dir: RunDirectory, result: Any) -> None:
    """Every stress file from what is known so far (rewritten as the run goes)."""
    plan = result.plan
    save_requests(result.outcomes, run_dir.path / "requests.jsonl", result.sent)
    if result.reference:
        save_requests(result.reference, run_dir.path / "reference.jsonl", plan.requests)
    run_dir.update_meta(stress=result.figures())
    if result.checks:
        STRESS_CHECKS.write(run_dir, [c.record() for c in result.checks])
        STRESS_CHECKS.write_junit(run_dir, "stress", result.checks, profile=plan.profile)
        run_dir.write_text("divergence.md", divergence_md(result))
        if result.outcomes:
            stress_timeline(result, run_dir.path / "timeline.png")


def stress_timeline(result: Any, out: Path) -> Path:
    """A stress run over time: requests in flight (top), and the CPU tier's cumulative
    stored and loaded bytes with preemptions (bottom), from the metrics sampled twice a
    second. Where a divergence or an error lands against this picture says whether it
    came with a burst of loads, a preemption or nothing in particular."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
