"""``offload-check faults``: every check catches its seeded fault, and only its own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from rich.markup import escape

from harness.cli.common import (
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
    EngineArgs,
    Geometry,
    Label,
    NoWait,
    Port,
    ResultsDir,
    RoundtripScenarioFile,
    TensorParallel,
    VariantName,
    opt,
)
from harness.cli.runs import end_run, guard, open_run
from harness.errors import HarnessError


def faults_cmd(
    scenario: RoundtripScenarioFile = None,
    fault: Annotated[list[str] | None, opt("faults.fault", "--fault")] = None,
    variant: VariantName = None,
    config: Geometry = None,
    tp: TensorParallel = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: Annotated[bool, opt("faults.dry-run", "--dry-run")] = False,
    engine_arg: EngineArgs = None,
    label: Label = None,
    as_json: AsJson = False,
) -> None:
    """Prove every check catches its fault: one server, one round trip per seeded fault.

    The host backend takes its fault from a control file the harness rewrites between
    rounds; each round must fail exactly the checks its fault is for (the clean round,
    none). Exit 0 when every fault is caught by exactly its checks.
    """
    from harness.commands import faults as fs
    from harness.scenario.schema import load_roundtrip

    try:
        json_needs_dry_run(as_json, dry_run)
        scen = load_roundtrip(scenario or default_scenario("roundtrip-cpu.toml"))
        faults = fs.parse_faults(fault)
        port_free(port)
        sweep = fs.plan_sweep(
            scen,
            faults,
            fs.control_path(),
            variant=variant,
            config=str(config) if config else None,
            tp=tp,
            extra_args=engine_arg,
        )
    except HarnessError as err:
        raise fail(err) from None
    launch_or_show(
        sweep,
        "faults_plan" if dry_run else None,
        lambda: run_faults(sweep, results_dir, port, label),
        as_json,
    )


def run_faults(sweep: object, results_dir: Path, port: int | None, label: str | None = None) -> int:
    from harness.commands import faults as fs
    from harness.commands import roundtrip as rt
    from harness.results.tables import FAULT_ROUNDS
    from harness.results.writers import write_faults
    from harness.ui.terminal import RoundtripProgress, frame_table

    assert isinstance(sweep, fs.SweepPlan)
    base = sweep.base
    if base.off_platform:
        console.print(f"[yellow]note:[/] {escape(base.off_platform)}", highlight=False)
    run_dir = open_run(results_dir, "faults", base.scenario, label)
    run_dir.update_meta(
        variant={"name": base.variant, **(base.env.as_dict() if base.env else {})},
        sweep=sweep.describe(),
    )
    done: list[fs.Round] = []

    def on_round(rounds: list[fs.Round]) -> None:
        done[:] = [r for r in rounds if r.status != "pending"]
        write_faults(run_dir, done, {"model": base.model_ref, "variant": base.variant})

    console.print(
        f"[bold]faults[/] {len(sweep.faults)} rounds on one server: {base.model_ref} "
        f"(variant {base.variant})",
        highlight=False,
    )
    with guard() as outcome:
        rt.build_local_model(base)
        fs.execute_faults(sweep, run_dir.path, RoundtripProgress(console), on_round, port=port)
    code = end_run(run_dir, outcome, done, "rounds", planned=len(sweep.faults))
    if done:
        records = [r.record() for r in done]
        show(frame_table(FAULT_ROUNDS.title, records, FAULT_ROUNDS.shown))
    ok = done and len(done) == len(sweep.faults) and all(r.matched for r in done)
    verdict = (
        "[green]every fault caught by exactly its checks[/]"
        if ok
        else "[red]some faults not as expected[/]"
    )
    console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)
