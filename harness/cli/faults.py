"""``offload-check faults``: every check catches its seeded fault, and only its own."""

from __future__ import annotations

from typing import Annotated, Any

from harness.cli import common
from harness.cli.help_texts import opt
from harness.cli.options import (
    EngineArgs,
    Geometry,
    RoundtripScenarioFile,
    RunOptions,
    TensorParallel,
    VariantName,
    run_options,
)
from harness.cli.runs import end_run, guard, open_roundtrip_run


@run_options(dry_run="faults.dry-run")
def faults_cmd(
    scenario: RoundtripScenarioFile = None,
    fault: Annotated[list[str] | None, opt("faults.fault", "--fault")] = None,
    variant: VariantName = None,
    config: Geometry = None,
    tp: TensorParallel = None,
    engine_arg: EngineArgs = None,
    *,
    opts: RunOptions,
) -> None:
    """Prove every check catches its fault: one server, one round trip per seeded fault.

    The host backend takes its fault from a control file the harness rewrites between
    rounds; each round must fail exactly the checks its fault is for (the clean round,
    none). Exit 0 when every fault is caught by exactly its checks.
    """
    from harness.commands import faults as fs
    from harness.scenario.roundtrip import load_roundtrip

    def make_plan() -> Any:
        scen = load_roundtrip(scenario or common.default_scenario("roundtrip-cpu.toml"))
        faults = fs.parse_faults(fault)
        sweep = fs.plan_sweep(
            scen,
            faults,
            fs.control_path(),
            variant=variant,
            config=str(config) if config else None,
            tp=tp,
            extra_args=engine_arg,
        )
        return sweep

    from harness.cli import faults_show as show

    common.plan_and_run(make_plan, show.PLAN, lambda planned: run_faults(planned, opts), opts)


def run_faults(sweep: object, opts: RunOptions) -> int:
    from harness.cli.roundtrip_show import RoundtripProgress
    from harness.commands import faults as fs
    from harness.commands import roundtrip as rt
    from harness.commands.faults import FAULT_ROUNDS, write_faults
    from harness.ui.terminal import frame_table

    assert isinstance(sweep, fs.SweepPlan)
    base = sweep.base
    run_dir = open_roundtrip_run(opts, "faults", base, base.scenario, sweep=sweep.describe())
    done: list[fs.Round] = []

    def on_round(rounds: list[fs.Round]) -> None:
        done[:] = [r for r in rounds if r.status != "pending"]
        write_faults(run_dir, done, {"model": base.model_ref, "variant": base.variant})

    common.console.print(
        f"[bold]faults[/] {len(sweep.faults)} rounds on one server: {base.model_ref} "
        f"(variant {base.variant})",
        highlight=False,
    )
    with guard() as outcome:
        rt.build_local_model(base)
        fs.execute_faults(
            sweep, run_dir.path, RoundtripProgress(common.console), on_round, port=opts.port
        )
    code = end_run(run_dir, outcome, done, "rounds", planned=len(sweep.faults))
    if done:
        records = [r.record() for r in done]
        common.show(frame_table(FAULT_ROUNDS.title, records, FAULT_ROUNDS.shown))
    ok = done and len(done) == len(sweep.faults) and all(r.matched for r in done)
    verdict = (
        "[green]every fault caught by exactly its checks[/]"
        if ok
        else "[red]some faults not as expected[/]"
    )
    common.console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)
