"""``offload-check stress``: concurrent traffic judged against a connector-off reference."""

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
    reachable,
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
    TensorParallel,
    VariantName,
    check_duration,
    check_url,
    opt,
    scenario_opt,
)
from harness.cli.runs import guard, open_run
from harness.errors import ExitCode, HarnessError


def stress_cmd(
    scenario: Annotated[Path | None, scenario_opt("stress")] = None,
    profile: Annotated[str | None, opt("stress.profile")] = None,
    requests: Annotated[int | None, opt("stress.requests", min=1)] = None,
    duration: Annotated[float | None, opt("stress.duration", callback=check_duration)] = None,
    concurrency: Annotated[int | None, opt("stress.concurrency", min=1, max=64)] = None,
    seed: Annotated[int | None, opt("stress.seed", min=0)] = None,
    tp: TensorParallel = None,
    variant: VariantName = None,
    python: OnePython = None,
    patch: Annotated[str | None, opt("stress.patch")] = None,
    fault: Annotated[str | None, opt("stress.fault")] = None,
    config: Geometry = None,
    url: Annotated[str | None, opt("stress.url", callback=check_url)] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
    engine_arg: EngineArgs = None,
    label: Label = None,
    as_json: AsJson = False,
) -> None:
    """Concurrent, multi-turn, preempting traffic through the connector, judged against a
    connector-off reference: every token, every byte, every hit.

    The server under test serves the profile's seeded plan; then a reference server
    (same engine, connector off) measures the noise floor and scores each answer alone.
    """
    from harness.commands.stress import plan as st
    from harness.scenario.schema import load_stress

    try:
        json_needs_dry_run(as_json, dry_run)
        refuse_on_attach(
            url, variant=variant, python=python, patch=patch, fault=fault, tp=tp,
            engine_arg=engine_arg,
        )  # fmt: skip
        scen = load_stress(scenario or default_scenario("stress.toml"))
        known_fault(fault)
        port_free(port)
        launch = launch_options(variant, python, patch, config, tp, fault, engine_arg)
        if url:
            reachable(url)
        plan = st.plan_stress(
            scen,
            profile=profile,
            requests=requests,
            duration_s=duration,
            concurrency=concurrency,
            seed=seed,
            url=url,
            **launch,
        )
    except HarnessError as err:
        raise fail(err) from None
    if dry_run:
        raise show_plan("stress_plan", plan, as_json)
    raise typer.Exit(run_stress(plan, results_dir, port, label))


def run_stress(plan: object, results_dir: Path, port: int | None, label: str | None = None) -> int:
    from harness.commands.roundtrip import build_local_model
    from harness.commands.stress.files import write_stress
    from harness.commands.stress.plan import StressPlan
    from harness.commands.stress.run import execute_stress
    from harness.ui.terminal import StressProgress, checks_table

    assert isinstance(plan, StressPlan)
    base = plan.base
    url = base.url  # an attached plan's server (``--url``); None: the plan's launches
    if base.off_platform:
        console.print(f"[yellow]note:[/] {escape(base.off_platform)}", highlight=False)
    run_dir = open_run(results_dir, "stress", plan.scenario, label)
    run_dir.update_meta(
        variant={"name": base.variant, **(base.env.as_dict() if base.env else {"url": url})},
        plan=plan.describe(),
    )
    console.print(
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
            StressProgress(console),
            lambda r: write_stress(run_dir, r),
            url=url,
            port=port,
        )
        if not result.passed:
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    run_dir.finish(outcome.status, int(code), passed=bool(result and result.passed))
    if result is not None and result.checks:
        f = result.figures()
        console.print(
            f"  {f['requests_sent']} requests ({f['requests_compared']} compared, "
            f"{f['requests_aborted']} aborted, {f['fillers']} fillers) in "
            f"{f['traffic_seconds']}s; noise floor {f['noise_floor']} -> tolerance "
            f"{f['tolerance']}",
            highlight=False,
        )
        show(checks_table([c.record() for c in result.checks]))
        verdict = "[green]all checks passed[/]" if result.passed else "[red]some checks failed[/]"
        console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    else:
        console.print(f"results so far: {run_dir.path}", highlight=False)
    return int(code)
