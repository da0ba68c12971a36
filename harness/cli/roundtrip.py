"""``offload-check roundtrip``: offload, evict, replay; bytes, hits and output exact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from harness.cli.common import (
    console,
    default_scenario,
    fail,
    json_needs_dry_run,
    known_fault,
    launch_options,
    port_free,
    refuse_on_attach,
    show,
    show_plan,
)
from harness.cli.options import (
    RESULTS,
    AsJson,
    DryRun,
    EngineArgs,
    Geometry,
    Label,
    NoWait,
    OnePython,
    Port,
    ResultsDir,
    RoundtripScenarioFile,
    TensorParallel,
    VariantName,
    check_url,
    opt,
)
from harness.cli.runs import guard, open_run
from harness.errors import ExitCode, HarnessError


def roundtrip_cmd(
    scenario: RoundtripScenarioFile = None,
    variant: VariantName = None,
    patch: Annotated[str | None, opt("roundtrip.patch")] = None,
    config: Geometry = None,
    tp: TensorParallel = None,
    fault: Annotated[str | None, opt("roundtrip.fault")] = None,
    filler_count: Annotated[int | None, opt("roundtrip.filler-count", min=0)] = None,
    seed: Annotated[int | None, opt("roundtrip.seed", min=0)] = None,
    url: Annotated[str | None, opt("roundtrip.url", callback=check_url)] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
    baseline: Annotated[bool, opt("roundtrip.baseline", "--baseline")] = False,
    engine_arg: EngineArgs = None,
    python: OnePython = None,
    label: Label = None,
    as_json: AsJson = False,
) -> None:
    """Offload, evict with unrelated traffic, replay: bytes, hits and output must be exact.

    Phases cold, warm, filler (sized from the live pool), replay; each followed by a
    metrics snapshot, then checks against figures planned from the model geometry.
    """
    from harness.commands import roundtrip as rt
    from harness.scenario.schema import load_roundtrip

    try:
        json_needs_dry_run(as_json, dry_run)
        refuse_on_attach(
            url, variant=variant, python=python, patch=patch, fault=fault, tp=tp,
            engine_arg=engine_arg, baseline=baseline,
        )  # fmt: skip
        scen = load_roundtrip(scenario or default_scenario("roundtrip-cpu.toml"))
        known_fault(fault)
        if filler_count is not None:
            scen.workload.filler_count = filler_count
        if seed is not None:
            scen.workload.seed = seed
        port_free(port)
        if url:
            plan = rt.attach_plan(scen, url, str(config) if config else None)
        else:
            plan = rt.plan_roundtrip(
                scen, **launch_options(variant, python, patch, config, tp, fault, engine_arg)
            )
    except HarnessError as err:
        raise fail(err) from None
    if dry_run:
        raise show_plan("roundtrip_plan", plan, as_json)
    raise typer.Exit(run_roundtrip(plan, results_dir, port, baseline, label))


def run_roundtrip(
    plan: object,
    results_dir: Path,
    port: int | None,
    baseline: bool = False,
    label: str | None = None,
) -> int:
    from harness.commands import roundtrip as rt
    from harness.commands.roundtrip.files import RoundtripWriter
    from harness.ui.terminal import RoundtripProgress, checks_table, phase_table

    assert isinstance(plan, rt.RoundtripPlan)
    url = plan.url  # an attached plan's server (``--url``); None: the plan's launch
    if plan.off_platform:
        console.print(f"[yellow]note:[/] {escape(plan.off_platform)}", highlight=False)
    run_dir = open_run(results_dir, "roundtrip", plan.scenario, label)
    run_dir.update_meta(
        variant={"name": plan.variant, **(plan.env.as_dict() if plan.env else {"url": url})},
        plan=plan.describe(),
    )
    on_record = RoundtripWriter(run_dir, plan)

    console.print(
        f"[bold]roundtrip[/] {plan.scenario.name} on {plan.model_ref} (variant {plan.variant})",
        highlight=False,
    )
    result = None
    with guard() as outcome:
        rt.build_local_model(plan)
        result = rt.execute_roundtrip(
            plan,
            run_dir.path,
            RoundtripProgress(console),
            on_record,
            url=url,
            port=port,
            baseline=baseline,
        )
        if not result.passed:
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    run_dir.finish(outcome.status, int(code), passed=bool(result and result.passed))
    if result is not None:
        if result.phases:
            show(phase_table([p.record() for p in result.phases]))
        if result.checks:
            show(checks_table([c.record() for c in (*result.checks, *result.info_checks)]))
        verdict = "[green]all checks passed[/]" if result.passed else "[red]some checks failed[/]"
        console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    else:
        console.print(f"results so far: {run_dir.path}", highlight=False)
    return int(code)
