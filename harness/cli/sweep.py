"""``offload-check sweep``: every selected check on every vLLM build, and where it changed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt
from harness.cli.options import BuildOptions, RunOptions, build_options, run_options
from harness.cli.runs import guard, open_run, verdict_line
from harness.errors import ExitCode, HarnessError


@run_options()
@build_options()
def sweep_cmd(
    scenario: Annotated[
        list[Path] | None,
        opt("sweep.scenario", "--scenario", show_default="scenarios/crash-repro.toml"),
    ] = None,
    check: Annotated[list[str] | None, opt("sweep.check", "--check")] = None,
    bisect: Annotated[str | None, opt("sweep.bisect")] = None,
    merge: Annotated[list[Path] | None, opt("sweep.merge", "--merge")] = None,
    *,
    builds: BuildOptions,
    opts: RunOptions,
) -> None:
    """Every selected check on every vLLM release (and your builds), with where each changed.

    One environment per build (made with uv, reused, see `offload-check envs`), one
    server at a time, or --jobs N side by side, each on its own share of the
    cores. Each cell is judged by its scenario's expectation rules, which take version
    specifiers (vllm = "<0.28.0"); a release that cannot be installed is a cell
    `unavailable`, not an error. Exit 0 when every cell that ran is as expected.
    """
    from harness.commands import sweep as sw

    if merge:
        raise typer.Exit(merge_sweeps(merge, opts))

    def make_plan() -> Any:
        targets = sw.load_targets(
            scenario or [common.default_scenario("crash-repro.toml")], check or []
        )
        launch_checks.check_builds(builds.build or [])
        if bisect is not None and builds.jobs > 1:
            raise HarnessError("--bisect builds one release at a time: --jobs does not apply")
        launch_checks.check_jobs(builds.jobs, opts.port)
        run = sw.SweepRun(
            sw.choose_builds(builds.releases, builds.build or [], builds.dist), targets, builds.dist
        )
        if bisect is not None:
            sw.bisect_target(run.targets, bisect)
        return run

    from harness.cli import sweep_show as show

    common.plan_and_run(
        make_plan,
        show.PLAN,
        lambda planned: run_sweep(planned, bisect, opts, builds.torch_index, builds.jobs),
        opts,
    )


def run_sweep(
    run: Any, bisect: str | None, opts: RunOptions, torch_index: str | None, jobs: int = 1
) -> int:
    from harness.cli.sweep_show import SweepProgress
    from harness.commands import sweep as sw
    from harness.commands.sweep.files import write_sweep

    assert isinstance(run, sw.SweepRun)
    run_dir = open_run(opts, "sweep", None)
    run_dir.update_meta(**run.describe(), bisect=bisect, jobs=jobs)

    def write(chart: bool = False) -> None:
        write_sweep(run_dir, run.cells, run.envs, run.transitions(), run.report_meta(), chart=chart)

    n_checks = sum(len(t.checks) for t in run.targets)
    what = f"bisect {bisect}" if bisect else f"{n_checks} check(s) x {len(run.builds)} build(s)"
    common.console.print(f"[bold]sweep[/] {what}; results: {run_dir.path}", highlight=False)
    with guard() as outcome:
        try:
            with SweepProgress(common.console) as progress:
                if bisect:
                    result = sw.execute_bisect(
                        run,
                        bisect,
                        run_dir.path,
                        progress,
                        write,
                        port=opts.port,
                        torch_index=torch_index,
                    )
                    common.console.print(f"bisect: {result.text()}", highlight=False)
                else:
                    sw.execute_sweep(
                        run,
                        run_dir.path,
                        progress,
                        write,
                        port=opts.port,
                        torch_index=torch_index,
                        jobs=jobs,
                    )
        finally:
            if bisect is None:  # a bisect leaves unbuilt releases out on purpose
                run.fill_not_run("not reached: the sweep stopped before this cell")
            write(chart=True)
        if any(c.matched is False for c in run.cells):
            outcome.code = ExitCode.MISMATCH
    return finish_sweep(run, run_dir, outcome.status, outcome.code)


def finish_sweep(run: Any, run_dir: Any, status: str, code: ExitCode) -> int:
    """``run.json`` finished, the cells not as expected, the table, the transitions."""

    from harness.cli.sweep_show import sweep_table
    from harness.commands import sweep as sw

    ok, bad, unjudged = sw.judged(run.cells)
    transitions = run.transitions()
    run_dir.finish(
        status,
        int(code),
        summary={"cells": len(run.cells), "matched": ok, "mismatched": bad, "not_run": unjudged},
        transitions=[t.text() for t in transitions],
    )
    for c in sw.ordered(run.cells):
        if c.matched is False:
            what = f"{c.release} {c.check}: {c.state} (expected {c.expected}; {c.why})"
            common.console.print(f"[red]not as expected[/] {escape(what)}", highlight=False)
    if run.cells:
        common.show(
            sweep_table(sw.ordered(run.cells), [b.label for b in run.builds], common.console.width)
        )
    for t in transitions:
        common.console.print(f"  {t.text()}", highlight=False, markup=False)
    verdict_line(bad, status, "cell", run_dir.path, "every cell as expected")
    return int(code)


def merge_sweeps(dirs: list[Path], opts: RunOptions) -> int:
    """``--merge``: CI shards' sweeps as one run of their own."""
    from harness.commands import sweep as sw
    from harness.commands.sweep.files import write_sweep

    try:
        run = sw.merge(dirs)
    except HarnessError as err:
        raise common.fail(err) from None
    run_dir = open_run(opts, "sweep", None)
    run_dir.update_meta(merged_from=[str(d) for d in dirs], dist=run.dist)
    meta = {"builds": [b.label for b in run.builds], "release_order": run.release_order}
    write_sweep(run_dir, run.cells, run.envs, run.transitions(), meta)
    code = ExitCode.MISMATCH if any(c.matched is False for c in run.cells) else ExitCode.OK
    return finish_sweep(run, run_dir, "finished", code)
