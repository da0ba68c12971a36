"""``offload-check matrix``: every KV-cache spec family x vLLM variant."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common
from harness.cli.help_texts import opt, scenario_opt
from harness.cli.options import RunOptions, run_options
from harness.cli.runs import end_run, guard, open_run


@run_options("results_dir", "no_wait", "dry_run", "label", "as_json", dry_run="matrix.dry-run")
def matrix_cmd(
    scenario: Annotated[Path | None, scenario_opt("matrix")] = None,
    family: Annotated[list[str] | None, opt("matrix.family", "--family", "-f")] = None,
    variant: Annotated[list[str] | None, opt("matrix.variant", "--variant", "-v")] = None,
    geometry: Annotated[list[str] | None, opt("matrix.geometry", "--geometry", "-g")] = None,
    tier: Annotated[list[str] | None, opt("matrix.tier", "--tier")] = None,
    *,
    opts: RunOptions,
) -> None:
    """Every KV-cache spec family x vLLM variant x CPU tier: engine spec classes, startup,
    round trip.

    One server at a time; each cell is a full round trip (roundtrip-cpu.toml unless the
    scenario says otherwise), on a roomy CPU tier or one under pressure. Exit 0 when
    every cell matches its expectation.
    """
    from harness.commands import matrix as mx
    from harness.scenario.matrix import load_matrix

    def make_plan() -> Any:
        scen = load_matrix(scenario or common.default_scenario("matrix.toml"))
        plan = mx.plan_matrix(
            scen,
            families=family or None,
            variants=variant or None,
            geometries=geometry or None,
            tiers=tier or None,
        )
        return plan

    from harness.cli import matrix_show as show

    common.plan_and_run(make_plan, show.PLAN, lambda planned: run_matrix(planned, opts), opts)


def run_matrix(plan: object, opts: RunOptions) -> int:
    from harness.cli.matrix_show import MatrixProgress, matrix_table
    from harness.commands import matrix as mx
    from harness.commands.matrix.files import write_matrix

    assert isinstance(plan, mx.MatrixPlan)
    run_dir = open_run(opts, "matrix", plan.scenario)
    run_dir.update_meta(base_scenario=str(plan.base.source), cells=[c.key for c in plan.cells])
    done: list[mx.Cell] = []

    def on_cell(cell: mx.Cell) -> None:
        done.append(cell)
        write_matrix(run_dir, mx.ordered(done))

    with guard() as outcome:
        mx.execute_matrix(plan, run_dir.path, MatrixProgress(common.console), on_cell)
    code = end_run(run_dir, outcome, done, "cells")
    if done:
        common.show(matrix_table(mx.ordered(done)))
    verdict = (
        "[green]every cell as expected[/]"
        if done and all(c.matched for c in done)
        else "[red]some cells not as expected[/]"
    )
    common.console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)
