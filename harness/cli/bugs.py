"""``offload-check bugs``: real upstream offload bugs, run where they lived and were fixed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from rich.markup import escape

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt
from harness.cli.options import BuildOptions, RunOptions, build_options, run_options
from harness.cli.runs import guard, open_run, verdict_line
from harness.errors import ExitCode


@run_options()
@build_options()
def bugs_cmd(
    bug: Annotated[list[str] | None, opt("bugs.bug", "--bug")] = None,
    variant: Annotated[list[str] | None, opt("bugs.variant", "--variant")] = None,
    corpus: Annotated[Path | None, opt("bugs.corpus", show_default="scenarios/bugs")] = None,
    *,
    builds: BuildOptions,
    opts: RunOptions,
) -> None:
    """Real upstream offload bugs, each run where it lived and where it was fixed.

    Each entry of the corpus (scenarios/bugs/*.toml) names the releases the bug lives in
    and the ones with its fix, a trigger and the symptom. A cell is `reproduced` (the
    symptom, exactly), `passed`, `error` (something else), `unavailable` or `skipped`
    (this host lacks a GPU or CPU feature the entry needs). Exit 0 when every cell is as
    the entry says: reproduced where the bug lived, passed where it was fixed. --jobs N
    runs N servers side by side, each on its own share of the cores.
    """
    from harness.commands.bugs import corpus as bugs
    from harness.commands.bugs import plan

    def make_plan() -> Any:
        entries = bugs.load_corpus(corpus or common.scenarios_dir("bugs"), bug or [])
        variants_file = common.default_scenario("variants.toml")
        extra = [*(builds.build or []), *plan.variant_builds(variant or [], variants_file)]
        launch_checks.check_builds(extra)
        launch_checks.check_jobs(builds.jobs, opts.port)
        run = plan.plan_bugs(entries, builds.releases, extra, builds.dist)
        return run

    from harness.cli import bugs_show as show

    common.plan_and_run(
        make_plan,
        show.PLAN,
        lambda planned: run_bugs(planned, opts, builds.torch_index, builds.jobs),
        opts,
    )


def run_bugs(run: Any, opts: RunOptions, torch_index: str | None, jobs: int = 1) -> int:
    from harness.cli.bugs_show import BugsProgress, bugs_table
    from harness.commands import sweep as sw
    from harness.commands.bugs import corpus as bugs
    from harness.commands.bugs.report import write_bugs

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    run_dir = open_run(opts, "bugs", None)
    labels = [b.label for b in sweep.builds]
    run_dir.update_meta(
        dist=sweep.dist,
        builds=sweep.build_records(),
        bugs=[{"id": e.id, "file": str(e.source)} for e in run.entries],
        skipped=run.skipped,
        jobs=jobs,
    )
    meta = {"builds": labels, "release_order": sweep.release_order}

    def write() -> None:
        write_bugs(run_dir, run.cells(), sweep.envs, run.entries, meta)

    n = len(run.entries)
    common.console.print(
        f"[bold]bugs[/] {n} entr{'y' if n == 1 else 'ies'} x {len(labels)} build(s); "
        f"results: {run_dir.path}",
        highlight=False,
    )
    with guard() as outcome:
        try:
            if sweep.targets:
                with BugsProgress(common.console, run.judge_cell) as progress:
                    sw.execute_sweep(
                        sweep,
                        run_dir.path,
                        progress,
                        write,
                        port=opts.port,
                        torch_index=torch_index,
                        jobs=jobs,
                    )
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
            common.console.print(f"[red]unmatched[/] {escape(what)}", highlight=False)
    if cells:
        common.show(bugs_table(cells, labels, common.console.width))
    for e in run.entries:
        common.console.print(
            f"  {e.id}: {bugs.reproduction(e, sweep.release_order)}", highlight=False
        )
    verdict_line(bad, outcome.status, "cell", run_dir.path, "every entry as the corpus says")
    return int(outcome.code)
