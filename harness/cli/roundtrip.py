"""``offload-check roundtrip``: offload, evict, replay; bytes, hits and output exact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt
from harness.cli.option_checks import check_url
from harness.cli.options import (
    DiskFaultName,
    EngineArgs,
    EvictionPolicy,
    Geometry,
    OnePython,
    RoundtripScenarioFile,
    RunOptions,
    TensorParallel,
    VariantName,
    run_options,
)
from harness.cli.runs import guard, open_roundtrip_run
from harness.errors import ExitCode


@run_options()
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
    baseline: Annotated[bool, opt("roundtrip.baseline", "--baseline")] = False,
    engine_arg: EngineArgs = None,
    python: OnePython = None,
    policy: Annotated[
        EvictionPolicy | None, opt("roundtrip.policy", "--policy", case_sensitive=False)
    ] = None,
    tier_dir: Annotated[
        Path | None, opt("roundtrip.tier-dir", "--tier-dir", file_okay=False, resolve_path=True)
    ] = None,
    disk_fault: Annotated[
        DiskFaultName | None, opt("roundtrip.disk-fault", "--disk-fault", metavar="FAULT")
    ] = None,
    stall_after: Annotated[
        float | None,
        opt(
            "roundtrip.stall-after",
            "--stall-after",
            min=10,
            max=3600,
            rich_help_panel="Stall watch",
        ),
    ] = None,
    *,
    opts: RunOptions,
) -> None:
    """Offload, evict with unrelated traffic, replay: bytes, hits and output must be exact.

    Phases cold, warm, filler (sized from the live pool), replay; each followed by a
    metrics snapshot, then checks against figures planned from the model geometry.
    """
    from harness.commands import roundtrip as rt
    from harness.scenario.roundtrip import load_roundtrip

    def make_plan() -> Any:
        launch_checks.refuse_on_attach(
            url, variant=variant, python=python, patch=patch, fault=fault, tp=tp,
            engine_arg=engine_arg, baseline=baseline, policy=policy, tier_dir=tier_dir,
            disk_fault=disk_fault, stall_after=stall_after,
        )  # fmt: skip
        scen = load_roundtrip(scenario or common.default_scenario("roundtrip-cpu.toml"))
        launch_checks.known_fault(fault)
        if filler_count is not None:
            scen.workload.filler_count = filler_count
        if seed is not None:
            scen.workload.seed = seed
        if url:
            plan = rt.attach_plan(scen, url, str(config) if config else None)
        else:
            launch = launch_checks.launch_options(
                variant, python, patch, config, tp, fault, engine_arg
            )
            launch["policy"] = policy.value if policy else None
            launch["tier_dir"] = str(tier_dir) if tier_dir else None
            launch["disk_fault"] = disk_fault.value if disk_fault else None
            plan = rt.plan_roundtrip(scen, **launch)
        return plan

    from harness.cli import roundtrip_show as show

    common.plan_and_run(
        make_plan,
        show.PLAN,
        lambda planned: run_roundtrip(planned, opts, baseline, stall_after),
        opts,
    )


def run_roundtrip(
    plan: object, opts: RunOptions, baseline: bool = False, stall_after: float | None = None
) -> int:
    from harness.cli.roundtrip_show import (
        RoundtripProgress,
        checks_table,
        phase_table,
        speed_table,
    )
    from harness.commands import roundtrip as rt
    from harness.commands.roundtrip.files import RoundtripWriter

    assert isinstance(plan, rt.RoundtripPlan)
    url = plan.url  # an attached plan's server (``--url``); None: the plan's launch
    run_dir = open_roundtrip_run(opts, "roundtrip", plan, plan.scenario, plan=plan.describe())
    on_record = RoundtripWriter(run_dir, plan)

    common.console.print(
        f"[bold]roundtrip[/] {plan.scenario.name} on {plan.model_ref} (variant {plan.variant})",
        highlight=False,
    )
    result = None
    with guard() as outcome:
        rt.build_local_model(plan)
        result = rt.execute_roundtrip(
            plan,
            run_dir.path,
            RoundtripProgress(common.console),
            on_record,
            url=url,
            port=opts.port,
            baseline=baseline,
            stall_after=stall_after,
            offload_speed=True,
        )
        if not result.passed:
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    run_dir.finish(outcome.status, int(code), passed=bool(result and result.passed))
    if result is not None:
        if result.phases:
            common.show(phase_table([p.record() for p in result.phases]))
        if result.checks:
            common.show(checks_table([c.record() for c in (*result.checks, *result.info_checks)]))
        show_reference(result)
        if result.offload_speed:
            common.show(speed_table([r.record() for r in result.offload_speed]))
        verdict = "[green]all checks passed[/]" if result.passed else "[red]some checks failed[/]"
        common.console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    else:
        common.console.print(f"results so far: {run_dir.path}", highlight=False)
    return int(code)


def show_reference(result: Any) -> None:
    """The scenario's reference figures (PR #51161's) beside this run's, one line each."""
    from harness.commands.roundtrip.files import reference_figures

    figures = reference_figures(result)
    if not figures:
        return
    common.console.print(f"against {result.plan.scenario.reference.source}:", highlight=False)
    for what, ref, got in figures:
        mark = "same" if got == ref else "DIFFERS"
        seen = "-" if got is None else f"{got:,}"
        common.console.print(f"  {what}: {ref:,} there, {seen} here ({mark})", highlight=False)
