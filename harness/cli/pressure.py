"""``offload-check pressure``: a CPU tier smaller than its traffic, every request judged
against the harness's model of the eviction policy and the store threshold."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt, scenario_opt
from harness.cli.options import EngineArgs, OnePython, RunOptions, VariantName, run_options
from harness.cli.runs import guard, open_run
from harness.errors import ExitCode, HarnessError


@run_options(dry_run="pressure.dry-run")
def pressure_cmd(
    scenario: Annotated[Path | None, scenario_opt("pressure")] = None,
    server: Annotated[list[str] | None, opt("pressure.server", "--server")] = None,
    mutant: Annotated[list[str] | None, opt("pressure.mutant", "--mutant")] = None,
    fault: Annotated[list[str] | None, opt("pressure.fault", "--fault")] = None,
    patch: Annotated[str | None, opt("pressure.patch")] = None,
    replay: Annotated[bool, opt("pressure.replay", "--replay")] = False,
    variant: VariantName = None,
    python: OnePython = None,
    engine_arg: EngineArgs = None,
    *,
    opts: RunOptions,
) -> None:
    """A CPU tier under eviction: LRU, ARC and store thresholds, every hit accounted for.

    Each server has a tier of a few slots and serves its requests one at a time with the
    GPU prefix cache off; each request's hit, stored, loaded and skipped figures must be
    exactly what the harness's model of the policy predicts (releases with known policy
    bugs are judged by an exact model of the bug). Each --mutant or --fault adds a round
    on the same server after a reset of the tier, which must fail exactly the checks
    that are for it. With --replay no server starts: the build's own manager and
    policies (any build from 0.31, CUDA wheels included) are fed the same sequences and
    judged request by request, evicted chunks by name. Exit 0 when every round is as
    expected; 1 when one is not.
    """
    from harness.commands.pressure.plan import plan_pressure
    from harness.scenario.pressure import load_pressure

    def make_plan() -> Any:
        scen = load_pressure(scenario or common.default_scenario("pressure.toml"))
        adhoc = launch_checks.adhoc_variants([python] if python else [])
        if adhoc and variant:
            raise HarnessError("give --variant or --python, not both")
        planned = plan_pressure(
            scen,
            variant=next(iter(adhoc), variant),
            extra_variants=adhoc,
            servers=server,
            mutants=mutant or (),
            faults=fault or (),
            patch=patch,
            extra_args=engine_arg,
        )
        if replay:
            from harness.commands.pressure.replay import check_replayable

            check_replayable(planned, len(mutant or ()) + len(fault or ()) + bool(patch))
        return planned

    from harness.cli import pressure_show as show

    common.plan_and_run(
        make_plan, show.PLAN, lambda planned: run_pressure(planned, opts, replay), opts
    )


def run_pressure(plan: object, opts: RunOptions, replay: bool = False) -> int:
    from harness.cli.pressure_show import PressureProgress
    from harness.commands.pressure.files import PRESSURE_CHECKS, server_verdict, write_pressure
    from harness.commands.pressure.plan import PressurePlan, build_local_model
    from harness.commands.pressure.replay import replay_plan
    from harness.commands.pressure.run import ServerResult, execute_pressure
    from harness.ui.terminal import frame_table

    assert isinstance(plan, PressurePlan)
    run_dir = open_run(opts, "pressure", plan.scenario)
    run_dir.update_meta(
        plan=plan.describe(), variant=plan.env.as_dict(), mode="replay" if replay else "live"
    )
    t = plan.tier
    rounds = sum(len(s.all_rounds()) for s in plan.servers)
    how = "replayed through its own manager, no server" if replay else f"{rounds} rounds"
    common.console.print(
        f"[bold]pressure[/] {len(plan.servers)} servers ({how}), {t.slots} slots of "
        f"{t.slot_bytes:,} B each: {plan.geometry_path.name} (variant {plan.variant}, vLLM "
        f"{plan.env.vllm_version})",
        highlight=False,
    )
    results: list[ServerResult] = []

    def on_update(done: list[ServerResult]) -> None:
        results[:] = done
        write_pressure(run_dir, plan, done)

    with guard() as outcome:
        if replay:
            on_update(replay_plan(plan))
        else:
            build_local_model(plan)
            execute_pressure(
                plan, run_dir.path, PressureProgress(common.console), on_update, opts.port
            )
        if not all(r.matched for r in results):
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    ok = len(results) == rounds and all(r.matched for r in results)
    run_dir.finish(outcome.status, int(code), passed=ok)
    bad = [c.record() for r in results for c in r.checks if not c.matched]
    if bad:
        common.show(frame_table("checks not as expected", bad, PRESSURE_CHECKS.shown))
    for r in results:
        where = r.plan.name if r.plan.round == "clean" else f"{r.plan.name} / {r.plan.round}"
        common.console.print(f"  {where}: {server_verdict(r)}", highlight=False)
    verdict = "[green]every round as expected[/]" if ok else "[red]not as expected[/]"
    common.console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)
