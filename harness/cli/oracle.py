"""``offload-check oracle``: generated request sequences, every request's hit, load and
store held against the harness's model of vLLM's offloading scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt, scenario_opt
from harness.cli.options import EngineArgs, RunOptions, VariantName, run_options
from harness.cli.runs import guard, open_run
from harness.errors import ExitCode, HarnessError


@run_options(dry_run="oracle.dry-run")
def oracle_cmd(
    scenario: Annotated[Path | None, scenario_opt("oracle")] = None,
    family: Annotated[list[str] | None, opt("oracle.family", "--family")] = None,
    mode: Annotated[list[str] | None, opt("oracle.mode", "--mode")] = None,
    engine: Annotated[list[str] | None, opt("oracle.engine", "--engine")] = None,
    seed: Annotated[int | None, opt("oracle.seed")] = None,
    requests: Annotated[int | None, opt("oracle.requests", min=1, max=2000)] = None,
    shrink: Annotated[bool, opt("oracle.shrink", "--shrink/--no-shrink")] = True,
    fail_fast: Annotated[bool, opt("oracle.fail-fast", "--fail-fast")] = False,
    python: Annotated[str | None, opt("oracle.python")] = None,
    patch: Annotated[str | None, opt("oracle.patch")] = None,
    variant: VariantName = None,
    engine_arg: EngineArgs = None,
    *,
    opts: RunOptions,
) -> None:
    """Generated sequences, every request judged against the model of the scheduler.

    Sequences are drawn from a seed at the lengths where the offloading rules turn
    (block, chunk, window and attention-chunk boundaries and one token either side,
    shared prefixes, decodes across a chunk, max_load_tokens caps, aborts, tier resets).
    Each request's external hit, the blocks every KV-cache group loads and stores, the
    host tier's hit tokens, the tier's allocations and usage, and whether the right KV
    came back must be exactly what the harness's model says. The drive serves each cell
    through vLLM's real scheduler in one process (seconds); a server cell through a live
    engine. A failing sequence is shrunk to the few requests that fail it. Exit 0 when
    every cell passes; 1 when one does not.
    """
    from harness.commands.oracle.plan import plan_oracle
    from harness.scenario.oracle import load_oracle

    def make_plan() -> Any:
        scen = load_oracle(scenario or common.default_scenario("oracle.toml"))
        adhoc = launch_checks.adhoc_variants([python] if python else [])
        if adhoc and variant:
            raise HarnessError("give --variant or --python, not both")
        return plan_oracle(
            scen,
            variant=next(iter(adhoc), variant),
            families=family or (),
            modes=mode or (),
            engines=engine or (),
            seed=seed,
            requests=requests,
            extra_args=engine_arg or (),
            extra_variants=adhoc,
            patch=patch,
        )

    common.plan_and_run(
        make_plan,
        show_oracle_plan,
        lambda planned: run_oracle(planned, opts, shrink, fail_fast),
        opts,
    )


def show_oracle_plan(console: Any, plan: Any) -> None:
    """``--dry-run``: every cell, its sequence's size and what it leans on."""
    from harness.commands.oracle.plan import OraclePlan
    from harness.ui.terminal import frame_table

    assert isinstance(plan, OraclePlan)
    d = plan.describe()
    console.print(
        f"[bold]oracle[/] {d['scenario']}: vLLM {d['vllm_version']} (variant {d['variant']}, "
        f"{d['device']}), seed {d['seed']}, {len(plan.cells)} cells",
        highlight=False,
    )
    rows = [
        {
            "cell": c["cell"],
            "groups": c["groups"],
            "chunk": c["chunk_tokens"],
            "requests": c["requests"],
            "resets": c["resets"],
            "longest": c["longest_prompt"],
            "note": c["skip"] or ", ".join(c["failing_checks"]),
        }
        for c in d["cells"]
    ]
    common.show(frame_table("cells", rows, tuple(rows[0])))
    for cell in plan.server_cells:
        console.print(f"  {cell.name}: {' '.join(cell.spec.argv()) if cell.spec else ''}",
                      highlight=False, markup=False)  # fmt: skip


class _Progress:
    """Progress lines: each cell's verdict as it lands, and what is running."""

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def status(self, text: str) -> None:
        common.console.print(f"  {text}", highlight=False, markup=False)

    def request_done(self, cell: str, index: int, failing: list[str]) -> None:
        if failing:
            self.status(f"{cell}: request {index} fails {', '.join(failing)}")


def run_oracle(plan: object, opts: RunOptions, do_shrink: bool, fail_fast: bool) -> int:
    from harness.commands.oracle.files import verdict, write_oracle, write_sequences
    from harness.commands.oracle.judge import CellResult
    from harness.commands.oracle.plan import OraclePlan, build_local_models
    from harness.commands.oracle.run import execute_oracle

    assert isinstance(plan, OraclePlan)
    run_dir = open_run(opts, "oracle", plan.scenario)
    run_dir.update_meta(plan=plan.describe(), variant=plan.env.as_dict())
    write_sequences(run_dir, plan)
    common.console.print(
        f"[bold]oracle[/] {len(plan.drive_cells)} drive cells, {len(plan.server_cells)} "
        f"server cells (vLLM {plan.env.vllm_version}, variant {plan.variant})",
        highlight=False,
    )
    progress = _Progress()
    results: list[CellResult] = []

    def on_update(done: list[CellResult]) -> None:
        results[:] = done
        write_oracle(run_dir, plan, done)
        for r in done:
            if r.finished and r.name not in progress.reported:
                progress.reported.add(r.name)
                progress.status(f"{r.name}: {verdict(r)} ({len(r.requests)} requests)")

    with guard() as outcome:
        build_local_models(plan)
        execute_oracle(plan, run_dir.path, progress, on_update, port=opts.port,
                       do_shrink=do_shrink, fail_fast=fail_fast)  # fmt: skip
        ran = len(plan.drive_cells) + len(plan.server_cells)
        if not all(r.passed for r in results) or (len(results) < ran and not fail_fast):
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    ok = code == ExitCode.OK
    run_dir.finish(outcome.status, int(code), passed=ok)
    for r in results:
        if not r.passed:
            common.console.print(f"  {r.name}: {verdict(r)}", highlight=False, markup=False)
            for s in r.shrunk:
                common.console.print(
                    f"    shrunk to {len(s['steps'])} steps ({s['check']}): see report.md",
                    highlight=False,
                )
    word = "[green]every cell passed[/]" if ok else "[red]not as the model says[/]"
    common.console.print(f"{word}; results: {run_dir.path}", highlight=False)
    return int(code)
