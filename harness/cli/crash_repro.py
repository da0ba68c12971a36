"""``offload-check crash-repro``: which builds start, which crash."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from harness.cli import common, launch_checks
from harness.cli.help_texts import opt, scenario_opt
from harness.cli.option_checks import check_positive
from harness.cli.options import ConnectorChoice, Python, RunOptions, run_options
from harness.cli.runs import guard, open_run, verdict_line
from harness.errors import ExitCode


@run_options()
def crash_repro_cmd(
    scenario: Annotated[Path | None, scenario_opt("crash-repro")] = None,
    variant: Annotated[list[str] | None, opt("crash-repro.variant", "--variant", "-v")] = None,
    patch: Annotated[str | None, opt("crash-repro.patch")] = None,
    config: Annotated[list[Path] | None, opt("crash-repro.config", "--config", "-c")] = None,
    connector: Annotated[ConnectorChoice, opt("crash-repro.connector")] = ConnectorChoice.both,
    timeout: Annotated[float | None, opt("crash-repro.timeout", callback=check_positive)] = None,
    python: Python = None,
    *,
    opts: RunOptions,
) -> None:
    """Launch vLLM with offloading on weight-free Llama 4 configs: which builds start, which crash.

    Every (model config x vLLM variant x connector on/off) row is launched, one server at
    a time, and judged against the scenario's expectations; crashes get their root-cause
    signature (exception, innermost vLLM frame, known upstream issue).
    """
    from harness.commands import crash_repro
    from harness.scenario.crash_repro import load_crash_repro

    def make_plan() -> Any:
        scen = load_crash_repro(scenario or common.default_scenario("crash-repro.toml"))
        if timeout is not None:
            scen.server.startup_timeout_s = timeout
        modes = None if connector is ConnectorChoice.both else [connector.value]
        adhoc = launch_checks.adhoc_variants(python or [])
        plan = crash_repro.plan_run(
            scen,
            variant_names=[*(variant or []), *adhoc] or None,
            patch=patch,
            configs=[str(c) for c in config] if config else None,
            connector_modes=modes,
            extra_variants=adhoc,
        )
        return plan

    from harness.cli import crash_repro_show as show

    common.plan_and_run(make_plan, show.PLAN, lambda planned: run_crash_repro(planned, opts), opts)


def run_crash_repro(plan: object, opts: RunOptions) -> int:
    from harness.cli.crash_repro_show import CrashReproProgress, crash_repro_table
    from harness.commands import crash_repro
    from harness.commands.crash_repro.files import write_crash_repro

    assert isinstance(plan, crash_repro.RunPlan)
    run_dir = open_run(opts, "crash-repro", plan.scenario)
    run_dir.update_meta(
        variants={
            n: {
                **v.model_dump(),
                **plan.environments[n].as_dict(),
                "offload_backend": crash_repro.backends(plan)[n],
            }
            for n, v in plan.variants.items()
        },
        models=[
            {
                "name": m.name,
                "config_file": m.config_path,
                "chunked_local_layers": m.chunked_local_layers,
            }
            for m in plan.models
        ],
        gpus=sorted({g for e in plan.environments.values() for g in e.gpus}),
    )

    def write_rows() -> None:
        write_crash_repro(run_dir, [r for r in plan.rows if r.outcome])

    class ProgressThatWrites(CrashReproProgress):
        def row_finished(self, row: crash_repro.Row, index: int, total: int) -> None:
            super().row_finished(row, index, total)
            write_rows()

    with guard() as outcome:
        try:
            crash_repro.build_models(plan)
            with ProgressThatWrites(common.console) as reporter:
                crash_repro.execute_crash_repro(plan, run_dir.path, reporter, port=opts.port)
            if not all(r.matched for r in plan.rows):
                outcome.code = ExitCode.MISMATCH
        finally:
            write_rows()
    status, code = outcome.status, outcome.code
    done = [r for r in plan.rows if r.outcome]
    run_dir.finish(
        status,
        int(code),
        summary={
            "rows": len(plan.rows),
            "done": len(done),
            "matched": sum(1 for r in done if r.matched),
            "mismatched": sum(1 for r in done if not r.matched),
        },
    )
    if done:
        common.show(crash_repro_table(done))
    bad = sum(1 for r in done if not r.matched)
    verdict_line(bad, status, "row", run_dir.path, "all rows as expected")
    return int(code)
