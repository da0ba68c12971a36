"""``offload-check matrix``: every KV-cache spec family x vLLM variant."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from harness.cli.common import (
    console,
    default_scenario,
    fail,
    json_needs_dry_run,
    launch_or_show,
    show,
)
from harness.cli.options import RESULTS, AsJson, Label, NoWait, ResultsDir, opt, scenario_opt
from harness.cli.runs import end_run, guard, open_run
from harness.errors import HarnessError


def matrix_cmd(
    scenario: Annotated[Path | None, scenario_opt("matrix")] = None,
    family: Annotated[list[str] | None, opt("matrix.family", "--family", "-f")] = None,
    variant: Annotated[list[str] | None, opt("matrix.variant", "--variant", "-v")] = None,
    geometry: Annotated[list[str] | None, opt("matrix.geometry", "--geometry", "-g")] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    dry_run: Annotated[bool, opt("matrix.dry-run", "--dry-run")] = False,
    label: Label = None,
    as_json: AsJson = False,
) -> None:
    """Every KV-cache spec family x vLLM variant: engine spec classes, startup, round trip.

    One server at a time; each cell is a full round trip (roundtrip-cpu.toml unless the
    scenario says otherwise). Exit 0 when every cell matches its expectation.
    """
    from harness.commands import matrix as mx
    from harness.scenario.schema import load_matrix

    try:
        json_needs_dry_run(as_json, dry_run)
        scen = load_matrix(scenario or default_scenario("matrix.toml"))
        plan = mx.plan_matrix(
            scen, families=family or None, variants=variant or None, geometries=geometry or None
        )
    except HarnessError as err:
        raise fail(err) from None
    launch_or_show(
        plan,
        "matrix_plan" if dry_run else None,
        lambda: run_matrix(plan, results_dir, label),
        as_json,
    )


def run_matrix(plan: object, results_dir: Path, label: str | None = None) -> int:
    from harness.commands import matrix as mx
    from harness.results.writers import write_matrix
    from harness.ui.terminal import MatrixProgress, matrix_table

    assert isinstance(plan, mx.MatrixPlan)
    run_dir = open_run(results_dir, "matrix", plan.scenario, label)
    run_dir.update_meta(base_scenario=str(plan.base.source), cells=[c.key for c in plan.cells])
    done: list[mx.Cell] = []

    def on_cell(cell: mx.Cell) -> None:
        done.append(cell)
        write_matrix(run_dir, mx.ordered(done))

    with guard() as outcome:
        mx.execute_matrix(plan, run_dir.path, MatrixProgress(console), on_cell)
    code = end_run(run_dir, outcome, done, "cells")
    if done:
        show(matrix_table(mx.ordered(done)))
    verdict = (
        "[green]every cell as expected[/]"
        if done and all(c.matched for c in done)
        else "[red]some cells not as expected[/]"
    )
    console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)
