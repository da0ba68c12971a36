"""The ``offload-check`` command line: a thin layer over the library modules.

Each command parses options, loads a scenario, applies overrides, and hands off
to the library; all user-facing failures arrive here as HarnessError and leave as
one line on stderr with a distinct exit code, never as a traceback.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from harness.errors import ExitCode, HarnessError

app = typer.Typer(
    name="offload-check",
    help="Prove vLLM's KV-cache offloading is correct on Llama 4 models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Wide when piped (CI logs, files): rich's 80-column default folds every table cell.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIOS = REPO_ROOT / "scenarios"


class ConnectorChoice(str, Enum):
    both = "both"
    on = "on"
    off = "off"


def _version(value: bool) -> None:
    if value:
        from harness import __version__

        typer.echo(f"offload-check {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Prove vLLM's KV-cache offloading is correct on Llama 4 models."""


def _default_scenario(name: str) -> Path:
    local = Path("scenarios") / name
    return local if local.is_file() else DEFAULT_SCENARIOS / name


def _fail(err: HarnessError) -> typer.Exit:
    err_console.print(f"offload-check: error: {err}", highlight=False, markup=False)
    return typer.Exit(int(err.exit_code))


@app.command("crash-repro")
def crash_repro_cmd(
    scenario: Annotated[
        Path | None,
        typer.Option(help="crash-repro scenario (TOML)", show_default="scenarios/crash-repro.toml"),
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant", "-v", help="vLLM variant(s) to run (repeatable); default: the scenario's"
        ),
    ] = None,
    patch: Annotated[
        str | None,
        typer.Option(
            help="patch applied inside vLLM for every variant: chunked-local-fix, "
            "chunked-local-floor, hits-minus-chunk or none (overrides the variants' own)"
        ),
    ] = None,
    config: Annotated[
        list[Path] | None,
        typer.Option(
            "--config", "-c", help="model config.json to use instead of the scenario's (repeatable)"
        ),
    ] = None,
    connector: Annotated[
        ConnectorChoice,
        typer.Option(help="launch with the offloading connector on, off (control) or both"),
    ] = ConnectorChoice.both,
    results_dir: Annotated[Path, typer.Option(help="where run directories are created")] = Path(
        "results"
    ),
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 (default: a free one)")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="startup timeout per server, seconds")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="print the plan and commands; launch nothing")
    ] = False,
) -> None:
    """Launch vLLM with offloading on weight-free Llama 4 configs: which builds start, which crash.

    Every (model config x vLLM variant x connector on/off) row is launched, one server at
    a time, and judged against the scenario's expectations; crashes get their root-cause
    signature (exception, innermost vLLM frame, known upstream issue).
    """
    from harness import crash_repro
    from harness.launcher import check_port_free
    from harness.scenario import load_crash_repro

    try:
        scen = load_crash_repro(scenario or _default_scenario("crash-repro.toml"))
        if timeout is not None:
            scen.server.startup_timeout_s = timeout
        if port is not None:
            check_port_free(port)
        modes = None if connector is ConnectorChoice.both else [connector.value]
        plan = crash_repro.plan_run(
            scen,
            variant_names=variant or None,
            patch=patch,
            configs=[str(c) for c in config] if config else None,
            connector_modes=modes,
        )
    except HarnessError as err:
        raise _fail(err) from None

    if dry_run:
        _print_plan(plan)
        raise typer.Exit(0)
    raise typer.Exit(_run_crash_repro(plan, results_dir, port))


def _print_host() -> None:
    """The environment fixes every server gets on this host (dry-runs show them)."""
    from harness.engine.amx import ENV_AMX, planned_state

    state = planned_state()
    why = {
        "requested": "AMX tile permission requested in every vLLM process (vLLM's CPU "
        f"attention needs it and never asks; {ENV_AMX}=off to reproduce that)",
        "off": f"AMX present but {ENV_AMX}=off: vLLM's CPU attention may die by SIGILL",
        "not-needed": "no AMX on this CPU: nothing to request",
    }[state]
    console.print(
        f"  host: amx_permission={state} ({why}); servers run with PYTHONFAULTHANDLER=1",
        highlight=False,
    )


def _print_plan(plan: object) -> None:
    from harness.crash_repro import RunPlan, backends
    from harness.verdicts import known_label

    assert isinstance(plan, RunPlan)
    skipped = sum(1 for r in plan.rows if r.skip_reason)
    console.print(
        f"[bold]scenario[/] {plan.scenario.name}: {len(plan.rows) - skipped} launches, "
        "one at a time" + (f" ({skipped} rows skipped on this host)" if skipped else "")
    )
    _print_host()
    for n, env in plan.environments.items():
        console.print(
            f"  variant {n}: vLLM {env.vllm_version} ({env.vllm_dist}) on "
            f"{env.device}, offload backend {backends(plan)[n]}, python {env.python}",
            highlight=False,
        )
    for row in plan.rows:
        exp = row.expected + (f" ({known_label(row.expected_known)})" if row.expected_known else "")
        console.print(f"[bold]{row.key}[/] expect {exp}", highlight=False)
        if row.skip_reason:
            console.print(f"  skipped on this host: {row.skip_reason}", highlight=False)
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(row.plan.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(row.plan.argv()), highlight=False, markup=False)


class _Outcome:
    """How a run ended: set by ``_guard`` and read when the run directory is finished."""

    def __init__(self) -> None:
        self.status, self.code = "finished", ExitCode.OK


@contextlib.contextmanager
def _guard() -> Iterator[_Outcome]:
    """Ctrl-C and harness errors end a run cleanly: servers stopped, results kept."""
    from harness.launcher import stop_all

    outcome = _Outcome()
    try:
        yield outcome
    except KeyboardInterrupt:
        stop_all()
        outcome.status, outcome.code = "interrupted", ExitCode.INTERRUPTED
        err_console.print("offload-check: interrupted; servers stopped, partial results kept")
    except HarnessError as err:
        stop_all()
        outcome.status, outcome.code = "error", err.exit_code
        err_console.print(f"offload-check: error: {err}", highlight=False, markup=False)


def _open_run(results_dir: Path, command: str, scenario: Any) -> Any:
    """The run's directory, with what every run records about itself written at once."""
    from harness.doctor import host_record
    from harness.environments import git_revision, host_platform
    from harness.launcher import install_signal_handlers
    from harness.results import RunDirectory, new_run_dir

    install_signal_handlers()
    try:
        run_dir = RunDirectory(new_run_dir(results_dir, command), command)
    except OSError as err:
        raise _fail(HarnessError(f"cannot create results directory: {err}")) from None
    run_dir.update_meta(
        scenario=scenario.model_dump(mode="json"),
        scenario_file=str(scenario.source),
        platform=host_platform(),
        host=host_record(),
        git_revision=git_revision(REPO_ROOT),
    )
    return run_dir


def _run_crash_repro(plan: object, results_dir: Path, port: int | None) -> int:
    from harness import crash_repro
    from harness.reporting import CrashReproProgress, crash_repro_table
    from harness.results import JUnitCase, junit_xml

    assert isinstance(plan, crash_repro.RunPlan)
    run_dir = _open_run(results_dir, "crash-repro", plan.scenario)
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
    columns = [
        "model",
        "variant",
        "vllm_version",
        "patch",
        "patch_status",
        "connector",
        "chunked_local",
        "outcome",
        "seconds",
        "signature",
        "exception",
        "frame",
        "message",
        "known_issue",
        "answered",
        "answer",
        "returncode",
        "kernels",
        "expected",
        "expected_known",
        "matched",
        "why",
        "log",
        "command",
    ]

    def write_rows() -> None:
        done = [r for r in plan.rows if r.outcome]
        run_dir.write_csv("outcomes.csv", [r.record() for r in done], columns)
        cases = [
            JUnitCase(
                classname=f"crash-repro.{r.model}",
                name=f"{r.variant} connector={'on' if r.connector else 'off'}",
                seconds=r.seconds or 0.0,
                failure=None if r.matched else (r.why or "mismatch"),
                stdout=f"outcome={r.outcome} {r.signature}\nlog={r.log}",
                properties={
                    "outcome": r.outcome,
                    "expected": r.expected,
                    "vllm_version": r.vllm_version,
                },
            )
            for r in done
        ]
        run_dir.write_text("junit.xml", junit_xml("crash-repro", cases))

    class Reporter(CrashReproProgress):
        def row_finished(self, row: crash_repro.Row, index: int, total: int) -> None:
            super().row_finished(row, index, total)
            write_rows()

    with _guard() as outcome:
        try:
            crash_repro.build_models(plan)
            with Reporter(console) as reporter:
                crash_repro.execute(plan, run_dir.path, reporter, port=port)
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
        console.print(crash_repro_table(done))
    bad = sum(1 for r in done if not r.matched)
    verdict = (
        "[green]all rows as expected[/]"
        if not bad and status == "finished"
        else (f"[red]{bad} row(s) not as expected[/]" if bad else f"[yellow]{status}[/]")
    )
    console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)


@app.command("roundtrip")
def roundtrip_cmd(
    scenario: Annotated[
        Path | None,
        typer.Option(help="roundtrip scenario (TOML)", show_default="scenarios/roundtrip-cpu.toml"),
    ] = None,
    variant: Annotated[str | None, typer.Option(help="vLLM variant (default: scenario's)")] = None,
    patch: Annotated[
        str | None,
        typer.Option(
            help="patch inside vLLM: chunked-local-fix, chunked-local-floor, hits-minus-chunk "
            "or none"
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="model geometry (config.json) to use")] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="tensor parallel size")] = None,
    fault: Annotated[
        str | None,
        typer.Option(
            help="seeded fault in the host backend: corrupt-load, drop-store, no-load, "
            "partial-store, partial-load"
        ),
    ] = None,
    filler_count: Annotated[
        int | None,
        typer.Option(
            min=0, help="send exactly this many filler prompts instead of sizing from the pool"
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="prompt seed (default: the scenario's); another seed gives prompts no "
            "earlier run on the same server can hit"
        ),
    ] = None,
    url: Annotated[str | None, typer.Option(help="attach to a running server instead")] = None,
    results_dir: Annotated[Path, typer.Option(help="where run directories are created")] = Path(
        "results"
    ),
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 (default: a free one)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="print the plan and command; launch nothing")
    ] = False,
    baseline: Annotated[
        bool,
        typer.Option(
            help="also run the targets on a second server without the connector and compare"
        ),
    ] = False,
    engine_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-arg",
            help="extra argument passed to the server, e.g. "
            "--engine-arg=--distributed-executor-backend=ray (repeatable)",
        ),
    ] = None,
) -> None:
    """Offload, evict with unrelated traffic, replay: bytes, hits and output must be exact.

    Phases cold, warm, filler (sized from the live pool), replay; each followed by a
    metrics snapshot, then checks against figures planned from the model geometry.
    """
    from harness import roundtrip as rt
    from harness.launcher import check_port_free
    from harness.scenario import FAULTS, load_roundtrip

    try:
        scen = load_roundtrip(scenario or _default_scenario("roundtrip-cpu.toml"))
        if fault is not None and fault not in FAULTS:
            raise HarnessError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        if filler_count is not None:
            scen.workload.filler_count = filler_count
        if seed is not None:
            scen.workload.seed = seed
        if port is not None:
            check_port_free(port)
        if url:
            plan = rt.attach_plan(scen, url, str(config) if config else None)
        else:
            plan = rt.plan_roundtrip(
                scen,
                variant=variant,
                patch=patch,
                config=str(config) if config else None,
                tp=tp,
                fault=fault,
                extra_args=engine_arg,
            )
    except HarnessError as err:
        raise _fail(err) from None
    if dry_run:
        _print_roundtrip_plan(plan)
        raise typer.Exit(0)
    if baseline and url:
        raise _fail(
            HarnessError("--baseline launches its own server; it cannot be combined with --url")
        )
    raise typer.Exit(_run_roundtrip(plan, results_dir, url, port, baseline))


def _print_roundtrip_plan(plan: object) -> None:
    from harness.roundtrip import RoundtripPlan

    assert isinstance(plan, RoundtripPlan)
    d = plan.describe()
    exp = plan.expected
    console.print(
        f"[bold]roundtrip plan[/] {plan.scenario.name}: model {plan.model_ref}, "
        f"variant {plan.variant}, TP {plan.tensor_parallel}",
        highlight=False,
    )
    _print_host()
    kinds = ", ".join(
        f"{k.kind} x{k.layers} {k.bytes_per_token:,} B/token"
        + (f" window {k.window}" if k.window else "")
        for k in exp.layout
    )
    console.print(
        f"  KV layout: {kinds or 'unknown'}; offload chunk {exp.tokens_per_chunk} "
        f"tokens, KV block {exp.kv_block_size}",
        highlight=False,
    )
    if exp.mamba_state_bytes:
        console.print(
            f"  Mamba state {exp.mamba_state_bytes:,} B over all Mamba layers", highlight=False
        )
    for t in exp.targets:
        need = ", ".join(f"{kind} {n}" for kind, n in t.loaded_by_kind.items())
        console.print(
            f"  {t.name}: {t.prompt_tokens} tokens -> stores {t.stored_tokens}, "
            f"replay hit {t.hit_tokens}; each layer loads back ({need}) "
            f"= {t.loaded_bytes:,} B",
            highlight=False,
        )
    console.print(
        f"  expected: stored {exp.stored_bytes:,} B, loaded {exp.loaded_bytes:,} B, "
        f"external hits {exp.hit_tokens} tokens",
        highlight=False,
    )
    console.print(
        f"  filler: sized at launch from the live pool x "
        f"{1 + plan.scenario.workload.filler_margin:g}; CPU tier capacity "
        f"~{plan.cpu_capacity_tokens} tokens",
        highlight=False,
    )
    for note in plan.notes:
        console.print(f"  note: {note}", highlight=False)
    if plan.server is not None:
        env_txt = " ".join(f"{k}={v}" for k, v in sorted(plan.server.env.items()))
        console.print(f"  env: {env_txt}", highlight=False, markup=False)
        console.print("  argv: " + json.dumps(d["server_argv"]), highlight=False, markup=False)


def _run_roundtrip(
    plan: object, results_dir: Path, url: str | None, port: int | None, baseline: bool = False
) -> int:
    from harness import roundtrip as rt
    from harness.reporting import RoundtripProgress, checks_table, phase_table
    from harness.roundtrip_files import RoundtripWriter

    assert isinstance(plan, rt.RoundtripPlan)
    run_dir = _open_run(results_dir, "roundtrip", plan.scenario)
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
    with _guard() as outcome:
        rt.build_local_model(plan)
        result = rt.execute(
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
            console.print(phase_table([p.record() for p in result.phases]))
        if result.checks:
            console.print(checks_table([c.record() for c in (*result.checks, *result.info_checks)]))
        verdict = "[green]all checks passed[/]" if result.passed else "[red]some checks failed[/]"
        console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    else:
        console.print(f"results so far: {run_dir.path}", highlight=False)
    return int(code)


class BenchPart(str, Enum):
    all = "all"
    crash_repro = "crash-repro"
    copy = "copy"
    roundtrip = "roundtrip"


@app.command("matrix")
def matrix_cmd(
    scenario: Annotated[
        Path | None,
        typer.Option(help="matrix scenario (TOML)", show_default="scenarios/matrix.toml"),
    ] = None,
    family: Annotated[
        list[str] | None,
        typer.Option(
            "--family",
            "-f",
            help="only these families (repeatable): full-attention, "
            "sliding-window, chunked-local, mamba-hybrid, mla",
        ),
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option("--variant", "-v", help="only these vLLM variants (repeatable)"),
    ] = None,
    geometry: Annotated[
        list[str] | None,
        typer.Option(
            "--geometry", "-g", help="only these model geometries, by file stem (repeatable)"
        ),
    ] = None,
    results_dir: Annotated[Path, typer.Option(help="where run directories are created")] = Path(
        "results"
    ),
    dry_run: Annotated[
        bool, typer.Option(help="print the cells and expectations; launch nothing")
    ] = False,
) -> None:
    """Every KV-cache spec family x vLLM variant: engine spec classes, startup, round trip.

    One server at a time; each cell is a full round trip (roundtrip-cpu.toml unless the
    scenario says otherwise). Exit 0 when every cell matches its expectation.
    """
    from harness import matrix as mx
    from harness.scenario import load_matrix

    try:
        scen = load_matrix(scenario or _default_scenario("matrix.toml"))
        plan = mx.plan_matrix(
            scen, families=family or None, variants=variant or None, geometries=geometry or None
        )
    except HarnessError as err:
        raise _fail(err) from None
    if dry_run:
        console.print(
            f"[bold]matrix[/] {scen.name}: {len(plan.cells)} cells, one server at a time",
            highlight=False,
        )
        for cell in plan.cells:
            assert cell.plan is not None
            exp = cell.plan.expected
            console.print(
                f"  {cell.key} (vLLM {cell.vllm_version}): expect "
                f"{cell.expected_text()}; plan stores {exp.stored_bytes:,} B, loads "
                f"{exp.loaded_bytes:,} B, hits {exp.hit_tokens} tokens",
                highlight=False,
                markup=False,
            )
        raise typer.Exit(0)
    raise typer.Exit(_run_matrix(plan, results_dir))


def _run_matrix(plan: object, results_dir: Path) -> int:
    from harness import matrix as mx
    from harness.markdown import matrix_report
    from harness.reporting import MatrixProgress, matrix_table
    from harness.results import JUnitCase, RunDirectory, junit_xml
    from harness.roundtrip_files import RoundtripWriter

    assert isinstance(plan, mx.MatrixPlan)
    run_dir = _open_run(results_dir, "matrix", plan.scenario)
    run_dir.update_meta(base_scenario=str(plan.base.source), cells=[c.key for c in plan.cells])
    done: list[mx.Cell] = []
    writers: dict[str, RoundtripWriter] = {}

    def writer(cell: mx.Cell, cell_dir: Path) -> RoundtripWriter:
        assert cell.plan is not None
        sub = RunDirectory(cell_dir, "roundtrip")
        sub.update_meta(cell=cell.key, plan=cell.plan.describe())
        writers[cell.key] = RoundtripWriter(sub, cell.plan, chart=False)
        return writers[cell.key]

    def on_cell(cell: mx.Cell) -> None:
        done.append(cell)
        if cell.key in writers:
            # The cell's own run.json ends like a roundtrip run's, with the cell's verdict.
            writers[cell.key].run_dir.finish(
                "finished",
                int(ExitCode.OK if cell.matched else ExitCode.MISMATCH),
                passed=cell.roundtrip == "pass",
                cell_verdict=cell.record(),
            )
        cells = mx.ordered(done)
        records = [c.record() for c in cells]
        run_dir.write_csv("matrix.csv", records, list(records[0]))
        cases = [
            JUnitCase(
                classname=f"matrix.{c.family}",
                name=f"{c.geometry} / {c.variant}",
                seconds=c.seconds,
                failure=None
                if c.matched or c.roundtrip == "error"
                else f"expected {c.expected_text()}, observed {c.observed_text()}: {c.why}",
                error=f"{c.why}" if c.roundtrip == "error" and not c.matched else None,
                properties={
                    "spec_classes": c.specs,
                    "vllm_version": c.vllm_version,
                    "startup": c.startup,
                    "roundtrip": c.roundtrip,
                },
            )
            for c in cells
        ]
        run_dir.write_text("junit.xml", junit_xml("matrix", cases))
        run_dir.write_text("report.md", matrix_report(cells, {"results_dir": str(run_dir.path)}))

    with _guard() as outcome:
        mx.execute_matrix(plan, run_dir.path, MatrixProgress(console), writer, on_cell)
        if any(not c.matched for c in done):
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    run_dir.finish(
        outcome.status,
        int(code),
        cells_run=len(done),
        cells_matched=sum(1 for c in done if c.matched),
    )
    if done:
        console.print(matrix_table(mx.ordered(done)))
    verdict = (
        "[green]every cell as expected[/]"
        if done and all(c.matched for c in done)
        else "[red]some cells not as expected[/]"
    )
    console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)


@app.command("faults")
def faults_cmd(
    scenario: Annotated[
        Path | None,
        typer.Option(help="roundtrip scenario (TOML)", show_default="scenarios/roundtrip-cpu.toml"),
    ] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault",
            help="faults to run, in order (repeatable); default: none, corrupt-load, "
            "drop-store, no-load, partial-store, partial-load, segv-in-worker",
        ),
    ] = None,
    variant: Annotated[str | None, typer.Option(help="vLLM variant (default: scenario's)")] = None,
    config: Annotated[Path | None, typer.Option(help="model geometry (config.json) to use")] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="tensor parallel size")] = None,
    results_dir: Annotated[Path, typer.Option(help="where run directories are created")] = Path(
        "results"
    ),
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 (default: a free one)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="print the rounds and the server; launch nothing")
    ] = False,
    engine_arg: Annotated[
        list[str] | None,
        typer.Option("--engine-arg", help="extra argument passed to the server (repeatable)"),
    ] = None,
) -> None:
    """Prove every check catches its fault: one server, one round trip per seeded fault.

    The host backend takes its fault from a control file the harness rewrites between
    rounds; each round must fail exactly the checks its fault is for (the clean round,
    none). Exit 0 when every fault is caught by exactly its checks.
    """
    from harness import fault_sweep as fs
    from harness.launcher import check_port_free
    from harness.scenario import load_roundtrip

    try:
        scen = load_roundtrip(scenario or _default_scenario("roundtrip-cpu.toml"))
        faults = fs.parse_faults(fault)
        if port is not None:
            check_port_free(port)
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
        raise _fail(err) from None
    if dry_run:
        base = sweep.base
        console.print(
            f"[bold]faults[/] {scen.name}: {len(faults)} rounds on one server "
            f"({base.model_ref}, variant {base.variant}, TP {base.tensor_parallel})",
            highlight=False,
        )
        _print_host()
        for i, (name, plan) in enumerate(zip(faults, sweep.plans, strict=True)):
            must = ", ".join(sorted(fs.CAUGHT_BY[name])) or "nothing (every check passes)"
            console.print(
                f"  round {i}: {name} (seed {plan.scenario.workload.seed}) must fail: {must}",
                highlight=False,
                markup=False,
            )
        assert base.server is not None
        console.print("  argv: " + json.dumps(base.server.argv()), highlight=False, markup=False)
        raise typer.Exit(0)
    raise typer.Exit(_run_faults(sweep, results_dir, port))


def _run_faults(sweep: object, results_dir: Path, port: int | None) -> int:
    from harness import fault_sweep as fs
    from harness import roundtrip as rt
    from harness.markdown import faults_report
    from harness.reporting import RoundtripProgress, frame_table
    from harness.results import JUnitCase, RunDirectory, junit_xml
    from harness.roundtrip_files import RoundtripWriter

    assert isinstance(sweep, fs.SweepPlan)
    base = sweep.base
    run_dir = _open_run(results_dir, "faults", base.scenario)
    run_dir.update_meta(
        variant={"name": base.variant, **(base.env.as_dict() if base.env else {})},
        sweep=sweep.describe(),
    )
    writers: dict[int, RoundtripWriter] = {}
    done: list[fs.Round] = []

    def round_writer(rnd: fs.Round) -> RoundtripWriter:
        plan = sweep.plans[rnd.index]
        sub_path = fs.round_dir(run_dir.path, rnd)
        sub_path.mkdir(parents=True, exist_ok=True)
        sub = RunDirectory(sub_path, "roundtrip")
        sub.update_meta(fault=rnd.fault, plan=plan.describe())
        writers[rnd.index] = RoundtripWriter(sub, plan, chart=False)
        return writers[rnd.index]

    def on_round(rounds: list[fs.Round]) -> None:
        done[:] = [r for r in rounds if r.status != "pending"]
        for r in done:
            if r.index in writers and r.result is not None:
                writers[r.index].run_dir.finish(
                    "finished",
                    int(ExitCode.OK if r.matched else ExitCode.MISMATCH),
                    passed=r.result.passed,
                    fault_verdict=r.record(),
                )
        records = [r.record() for r in done]
        run_dir.write_csv("faults.csv", records, list(records[0]))
        cases = [
            JUnitCase(
                classname="faults",
                name=r.fault,
                seconds=0.0,
                failure=None if r.matched else f"{r.status}: {r.reason}",
                properties={"must_fail": " ".join(sorted(r.expected))},
            )
            for r in done
        ]
        run_dir.write_text("junit.xml", junit_xml("faults", cases))
        meta = {"results_dir": str(run_dir.path), "model": base.model_ref, "variant": base.variant}
        run_dir.write_text("report.md", faults_report(done, meta))

    console.print(
        f"[bold]faults[/] {len(sweep.faults)} rounds on one server: {base.model_ref} "
        f"(variant {base.variant})",
        highlight=False,
    )
    with _guard() as outcome:
        rt.build_local_model(base)
        fs.execute(
            sweep, run_dir.path, RoundtripProgress(console), round_writer, on_round, port=port
        )
        if len(done) < len(sweep.faults) or any(not r.matched for r in done):
            outcome.code = ExitCode.MISMATCH
    code = outcome.code
    run_dir.finish(
        outcome.status,
        int(code),
        rounds_run=len(done),
        rounds_matched=sum(1 for r in done if r.matched),
    )
    if done:
        records = [r.record() for r in done]
        cols = ["round", "fault", "status", "expected_failing", "failing", "reason"]
        console.print(frame_table("faults", records, cols))
    ok = done and len(done) == len(sweep.faults) and all(r.matched for r in done)
    verdict = (
        "[green]every fault caught by exactly its checks[/]"
        if ok
        else "[red]some faults not as expected[/]"
    )
    console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)


@app.command("bench")
def bench_cmd(
    repeats: Annotated[int, typer.Option(min=1, help="launches per side and case")] = 3,
    only: Annotated[BenchPart, typer.Option(help="run one part only")] = BenchPart.all,
    config: Annotated[Path | None, typer.Option(help="model config (default: small-chunk)")] = None,
    results_dir: Annotated[Path, typer.Option(help="where run directories are created")] = Path(
        "results"
    ),
) -> None:
    """Benchmarks as ratios measured side by side in one run (the machines are noisy).

    Harness overhead on crash-repro, host-backend copy throughput, round-trip filler and
    wall-time efficiency.
    """
    from rich.table import Table

    from harness.bench import Case, run_crash_repro_bench, run_roundtrip_bench
    from harness.launcher import install_signal_handlers
    from harness.results import RunDirectory, new_run_dir
    from harness.scenario import load_crash_repro

    install_signal_handlers()
    figures: list[dict[str, object]] = []
    try:
        run_dir = RunDirectory(new_run_dir(results_dir, "bench"), "bench")
        run_dir.update_meta(platform=_platform(), repeats=repeats, only=only.value)

        def say(msg: str) -> None:
            console.print(msg, highlight=False, markup=False)

        if only in (BenchPart.all, BenchPart.copy):
            from harness.bench_copy import measure_host_copy

            say("host backend copy throughput vs plain torch copy ...")
            copy = measure_host_copy()
            figures.append(
                {
                    "figure": "host copy throughput / plain torch copy",
                    "value": copy["ratio"],
                    "target": ">= 0.6",
                    "ok": float(copy["ratio"]) >= 0.6,
                    "detail": copy,
                }
            )
        if only in (BenchPart.all, BenchPart.roundtrip):
            say("one clean round trip ...")
            rtb = run_roundtrip_bench(
                _default_scenario("roundtrip-cpu.toml"), run_dir.path / "roundtrip"
            )
            figures.append(
                {
                    "figure": "filler tokens / GPU pool tokens",
                    "value": rtb["filler_over_pool"],
                    "target": "<= 1.5",
                    "ok": float(rtb["filler_over_pool"]) <= 1.5,
                    "detail": rtb,
                }
            )
            figures.append(
                {
                    "figure": "roundtrip wall / (server start + generation)",
                    "value": rtb["wall_over_engine"],
                    "target": "<= 1.3",
                    "ok": float(rtb["wall_over_engine"] or 99) <= 1.3,
                    "detail": rtb,
                }
            )
        if only in (BenchPart.all, BenchPart.crash_repro):
            scen = load_crash_repro(_default_scenario("crash-repro.toml"))
            cfg = str(config or scen.resolve("models/llama4-small-chunk.json"))
            cases = [
                Case("start (current, connector on)", "current", cfg, "on"),
                Case("crash (stock, connector on)", "stock", cfg, "on"),
            ]
            run_crash_repro_bench(scen, cases, repeats, run_dir.path / "crash-repro", progress=say)
            for c in cases:
                rec = c.record()
                figures.append(
                    {
                        "figure": f"crash-repro time to verdict / bare launch: {c.name}",
                        "value": rec["ratio"],
                        "target": "< 1.10",
                        "ok": bool(rec["within_target"]),
                        "detail": rec,
                    }
                )
                figures.append(
                    {
                        "figure": f"  harness seconds outside the server: {c.name}",
                        "value": rec["harness_overhead_median_s"],
                        "target": "-",
                        "ok": True,
                        "detail": rec,
                    }
                )
    except HarnessError as err:
        raise _fail(err) from None
    run_dir.write_json("bench.json", figures)
    run_dir.write_csv(
        "bench.csv",
        [{k: v for k, v in f.items() if k != "detail"} for f in figures],
        ["figure", "value", "target", "ok"],
    )
    run_dir.finish("finished", 0)
    table = Table(title="benchmarks (ratios measured side by side in this run)")
    for col in ("figure", "value", "target", "ok"):
        table.add_column(col)
    for f in figures:
        table.add_row(
            str(f["figure"]),
            str(f["value"]),
            str(f["target"]),
            "[green]yes[/]" if f["ok"] else "[red]no[/]",
        )
    console.print(table)
    console.print(f"results: {run_dir.path}", highlight=False)


def _platform() -> dict[str, object]:
    from harness.environments import host_platform

    return host_platform()


@app.command("report")
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a results directory (results/<run-id>)")],
) -> None:
    """Re-render the tables of a finished (or interrupted) run from its files."""
    import pandas as pd

    from harness.reporting import checks_table, frame_table, phase_table

    try:
        meta = _read_run(run_dir)
    except HarnessError as err:
        raise _fail(err) from None
    console.print(
        f"[bold]{meta.get('command')}[/] {run_dir}: status {meta.get('status')}, "
        f"exit code {meta.get('exit_code')}",
        highlight=False,
    )
    if meta.get("command") == "roundtrip":
        if (run_dir / "phases.csv").is_file():
            console.print(phase_table(pd.read_csv(run_dir / "phases.csv").to_dict("records")))
        if (run_dir / "checks.csv").is_file():
            console.print(checks_table(pd.read_csv(run_dir / "checks.csv").to_dict("records")))
    elif meta.get("command") == "matrix" and (run_dir / "matrix.csv").is_file():
        df = pd.read_csv(run_dir / "matrix.csv", keep_default_na=False)
        console.print(
            frame_table(
                "KV-cache spec family matrix",
                df.to_dict("records"),
                [
                    "family",
                    "geometry",
                    "variant",
                    "vllm_version",
                    "spec_classes",
                    "startup",
                    "roundtrip",
                    "failed_checks",
                    "expected",
                    "matched",
                    "why",
                ],
            )
        )
    elif (run_dir / "outcomes.csv").is_file():
        df = pd.read_csv(run_dir / "outcomes.csv", keep_default_na=False)
        console.print(
            frame_table(
                "crash-repro",
                df.to_dict("records"),
                [
                    "model",
                    "variant",
                    "vllm_version",
                    "patch",
                    "connector",
                    "outcome",
                    "signature",
                    "seconds",
                    "expected",
                    "matched",
                ],
            )
        )


@app.command("compare")
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="the earlier results directory")],
    run_b: Annotated[Path, typer.Argument(help="the later results directory")],
) -> None:
    """Show what changed between two runs of the same command (for nightly trends)."""
    from harness.compare import compare_runs
    from harness.reporting import frame_table

    try:
        tables, changed = compare_runs(run_a, run_b)
    except HarnessError as err:
        raise _fail(err) from None
    for title, records, columns in tables:
        console.print(frame_table(title, records, columns))
    console.print(f"{changed} row(s) changed", highlight=False)


def _read_run(run_dir: Path) -> dict[str, object]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise HarnessError(f"{run_dir} is not a results directory (no run.json)")
    try:
        return dict(json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise HarnessError(f"{path}: not valid JSON: {err}") from None


@app.command("validate")
def validate_cmd(
    paths: Annotated[list[Path], typer.Argument(help="scenario files to check")],
) -> None:
    """Check scenario files (crash-repro, roundtrip, matrix) and what they name, launching
    nothing: variants, model configs, expectation rules, and every round-trip plan."""
    from harness.scenario import read_toml

    try:
        for path in paths:
            data = read_toml(path)
            kind = (
                "matrix"
                if "entries" in data
                else "roundtrip"
                if "geometry" in data
                else "variants"
                if isinstance(data.get("variants"), dict)
                else "crash-repro"
            )
            console.print(f"{path}: ok ({kind}: {_validate(kind, path)})", highlight=False)
    except HarnessError as err:
        raise _fail(err) from None


def _validate(kind: str, path: Path) -> str:
    from harness.scenario import load_crash_repro, load_matrix, load_roundtrip, load_variants

    if kind == "variants":
        return f"{len(load_variants(path))} variants"
    if kind == "matrix":
        from harness.matrix import plan_matrix

        plan = plan_matrix(load_matrix(path))
        families = len({c.family for c in plan.cells})
        return f"{len(plan.cells)} cells over {families} families, all planned"
    if kind == "roundtrip":
        from harness.roundtrip import plan_roundtrip

        rt_plan = plan_roundtrip(load_roundtrip(path))
        return (
            f"variant {rt_plan.variant}, {len(rt_plan.targets)} targets, expects "
            f"{rt_plan.expected.stored_bytes:,} B stored"
        )
    from harness.crash_repro import load_models

    scen = load_crash_repro(path)
    variants = load_variants(scen.resolve(scen.variants_file))
    missing = [v for v in scen.variants if v not in variants]
    if missing:
        raise HarnessError(f"{path}: variant {missing[0]!r} is not in {scen.variants_file}")
    models = load_models(scen, None)
    return (
        f"{len(scen.variants)} variants, {len(models)} models, "
        f"{len(scen.expectations)} expectation rules"
    )


@app.command("doctor")
def doctor_cmd(
    variants_file: Annotated[
        Path | None,
        typer.Option(help="variants to check (TOML)", show_default="scenarios/variants.toml"),
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option("--variant", "-v", help="only these variants (repeatable); default: all"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Preflight: Python, CPU and AMX, memory, disk, loopback, model cache, each variant's
    vLLM and engine plugin, GPU. Run it first; exit 0 when nothing fails."""
    from rich.text import Text

    from harness import doctor

    try:
        checks = doctor.run_checks(
            variants_file or _default_scenario("variants.toml"), variant or None
        )
    except HarnessError as err:
        raise _fail(err) from None
    code = doctor.exit_code(checks)
    if as_json:
        typer.echo(
            json.dumps({"checks": [c.record() for c in checks], "exit_code": code}, indent=2)
        )
        raise typer.Exit(code)
    width = max(len(c.name) for c in checks)
    styles = {"ok": "green", "warn": "yellow", "fail": "red"}
    for c in checks:
        line = Text(f"{c.status:<4}", style=styles[c.status])
        line.append(f"  {c.name:<{width}}  {c.detail}")
        if c.fix:
            line.append(f"  fix: {c.fix}")
        console.print(line, highlight=False)
    counts = {s: sum(1 for c in checks if c.status == s) for s in styles}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()), highlight=False)
    raise typer.Exit(code)


def main() -> None:
    # Piped output (CI logs, `| tee`) is block-buffered by default; a run is long, and each
    # finished row should be visible the moment it is known.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("offload-check: interrupted")
        sys.exit(int(ExitCode.INTERRUPTED))
