"""``offload-check stress``: concurrent traffic judged against a connector-off reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt, scenario_opt
from harness.cli.option_checks import check_duration, check_fraction, check_url
from harness.cli.options import (
    EngineArgs,
    EvictionPolicy,
    Geometry,
    OnePython,
    RunOptions,
    TensorParallel,
    VariantName,
    run_options,
)
from harness.cli.runs import guard, open_roundtrip_run
from harness.errors import ExitCode


@run_options()
def stress_cmd(
    scenario: Annotated[Path | None, scenario_opt("stress")] = None,
    profile: Annotated[str | None, opt("stress.profile")] = None,
    requests: Annotated[int | None, opt("stress.requests", min=1)] = None,
    duration: Annotated[float | None, opt("stress.duration", callback=check_duration)] = None,
    concurrency: Annotated[int | None, opt("stress.concurrency", min=1, max=64)] = None,
    seed: Annotated[int | None, opt("stress.seed", min=0)] = None,
    tier_fraction: Annotated[
        float | None, opt("stress.tier", "--tier", callback=check_fraction)
    ] = None,
    eviction_policy: Annotated[
        EvictionPolicy | None, opt("stress.policy", "--policy", case_sensitive=False)
    ] = None,
    disk: Annotated[bool, opt("stress.disk", "--disk")] = False,
    restarts: Annotated[int | None, opt("stress.restarts", min=0, max=8)] = None,
    tp: TensorParallel = None,
    variant: VariantName = None,
    python: OnePython = None,
    patch: Annotated[str | None, opt("stress.patch")] = None,
    fault: Annotated[str | None, opt("stress.fault")] = None,
    config: Geometry = None,
    url: Annotated[str | None, opt("stress.url", callback=check_url)] = None,
    stall_after: Annotated[
        float | None,
        # A panel of its own, as --reference-cache: its metavar and range in the main
        # table would narrow every help text past --url's longest word at 80 columns.
        opt("stress.stall-after", "--stall-after", min=10, max=3600, rich_help_panel="Stall watch"),
    ] = None,
    engine_arg: EngineArgs = None,
    reference_cache: Annotated[
        Path | None,
        # Its help here rather than in help.toml only while that file is someone
        # else's to edit; it belongs there as "stress.reference-cache". A panel of its
        # own: a name this long in the main table narrows every help text (--url's
        # longest word would no longer fit at 80 columns).
        typer.Option(
            "--reference-cache",
            metavar="DIR",
            rich_help_panel="Reusing the reference",
            help="keep the connector-off reference's noise floor and scores in this "
            "directory and reuse them: a run whose tokens it already scored launches no "
            "reference (a divergence or a miss launches it, and fills the cache)",
        ),
    ] = None,
    *,
    opts: RunOptions,
) -> None:
    """Concurrent, multi-turn, preempting traffic through the connector, judged against a
    connector-off reference: every token, every byte, every hit.

    The server under test serves the profile's seeded plan; then a reference server
    (same engine, connector off) measures the noise floor and scores each answer alone.
    """
    from harness.commands.stress import plan as st
    from harness.scenario.stress import load_stress

    def make_plan() -> Any:
        launch_checks.refuse_on_attach(
            url, variant=variant, python=python, patch=patch, fault=fault, tp=tp,
            engine_arg=engine_arg, tier_fraction=tier_fraction, eviction_policy=eviction_policy,
            disk=disk, restarts=restarts, reference_cache=reference_cache,
        )  # fmt: skip
        scen = load_stress(scenario or common.default_scenario("stress.toml"))
        launch_checks.known_fault(fault)
        launch = launch_checks.launch_options(variant, python, patch, config, tp, fault, engine_arg)
        if url:
            launch_checks.reachable(url)
        plan = st.plan_stress(
            scen,
            profile=profile,
            requests=requests,
            duration_s=duration,
            concurrency=concurrency,
            seed=seed,
            url=url,
            tier_fraction=tier_fraction,
            eviction_policy=eviction_policy.value if eviction_policy else None,
            disk=disk,
            restarts=restarts,
            reference_cache=reference_cache,
            stall_s=stall_after,
            **launch,
        )
        return plan

    from harness.cli import stress_show as show

    common.plan_and_run(make_plan, show.PLAN, lambda planned: run_stress(planned, opts), opts)


def run_stress(plan: object, opts: RunOptions) -> int:
    from harness.cli.roundtrip_show import checks_table
    from harness.cli.stress_show import StressProgress
    from harness.commands.roundtrip import build_local_model
    from harness.commands.stress.files import write_stress
    from harness.commands.stress.plan import StressPlan
    from harness.commands.stress.run import execute_stress

    assert isinstance(plan, StressPlan)
    base = plan.base
    url = base.url  # an attached plan's server (``--url``); None: the plan's launches
    run_dir = open_roundtrip_run(opts, "stress", base, plan.scenario, plan=plan.describe())
    common.console.print(
        f"[bold]stress[/] {plan.profile} (seed {plan.seed}, concurrency {plan.concurrency}) "
        f"on {base.model_ref} (variant {base.variant})",
        highlight=False,
    )
    result = None
    with guard() as outcome:
        build_local_model(base)
        result = execute_stress(
            plan,
            run_dir.path,
            StressProgress(common.console),
            lambda r: write_stress(run_dir, r),
            url=url,
            port=opts.port,
        )
        if not result.passed:
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    run_dir.finish(outcome.status, int(code), passed=bool(result and result.passed))
    if result is not None and result.checks:
        f = result.figures()
        common.console.print(
            f"  {f['requests_sent']} requests ({f['requests_compared']} compared, "
            f"{f['requests_aborted']} aborted, {f['fillers']} fillers) in "
            f"{f['traffic_seconds']}s; noise floor {f['noise_floor']} -> tolerance "
            f"{f['tolerance']}",
            highlight=False,
        )
        if result.reference_source is not None:
            common.console.print(f"  {result.reference_source.line()}", highlight=False)
        common.show(checks_table([c.record() for c in result.checks]))
        verdict = "[green]all checks passed[/]" if result.passed else "[red]some checks failed[/]"
        common.console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    else:
        common.console.print(f"results so far: {run_dir.path}", highlight=False)
    return int(code)
