"""The launches a GPU runner would make, planned here exactly as the CLI would plan them
there: the harness's own planners with the device forced to ``cuda`` (the argv built by the
same ``ServerSpec`` the launcher uses), and a local stand-in model for a hub checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from harness.errors import BadInput
from harness.names import ENV_DEVICE
from harness.server import interpreters, model_builder
from harness.server.model_builder import default_cache_dir
from harness.tools.gpu_rehearsal.launch import PlannedLaunch

if TYPE_CHECKING:
    from harness.commands.crash_repro import RunOptions
    from harness.scenario.schema import ServerSettings
    from harness.server.launcher import ServerSpec


DEVICE_ENV = ENV_DEVICE
# A real number where the launcher would put the free port it picks: the parser wants an int.
REHEARSAL_PORT = 8000


# --- planning, exactly as the CLI would on a GPU runner --------------------------------


@contextlib.contextmanager
def gpu_planning() -> Iterator[None]:
    """Every interpreter probed inside reports device ``cuda``, as on a GPU runner.

    ``probe`` is cached per interpreter, so its cache is cleared on the way in and out:
    a CPU answer must not leak into the GPU plan, nor the GPU answer out of it.
    """
    old = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = "cuda"
    interpreters.probe.cache_clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = old
        interpreters.probe.cache_clear()


def _intended(spec: ServerSpec, server: ServerSettings, tp: int) -> dict[str, Any]:
    """What vLLM's own parser must make of the argv: the engine arguments the harness
    meant, field by field (a flag vLLM renamed or dropped shows up as a difference)."""
    return {
        "model": spec.model,
        "served_model_name": [spec.served_model_name],
        "tensor_parallel_size": tp,
        "max_model_len": server.max_model_len,
        "gpu_memory_utilization": server.gpu_memory_utilization,
        # Unset, the CUDA platform's default applies: not knowable on a CPU build.
        "block_size": server.block_size,
        "load_format": server.load_format or None,
        "kv_transfer_config": spec.kv_transfer,
    }


def plan_roundtrip_launch(scenario: Path, **options: Any) -> PlannedLaunch:
    """The round trip's server on a GPU runner, planned by ``plan_roundtrip`` itself
    (``options`` are its keyword arguments: tp, variant, patch, config, fault, ...)."""
    from harness.commands import roundtrip as rt
    from harness.scenario.roundtrip import load_roundtrip

    scn = load_roundtrip(scenario)
    with gpu_planning():
        plan = rt.plan_roundtrip(scn, **options)
    # A disk tier's directory is the run's; the rehearsal's scheduler side (vLLM's fs
    # tier writes its config.json at start) gets one of its own.
    plan = rt.resolve_disk(plan, default_cache_dir() / "rehearsal")
    config = options.get("config")
    assert plan.server is not None and plan.env is not None
    intended = _intended(plan.server, scn.server, plan.tensor_parallel)
    geometry_path = Path(config) if config else scn.resolve(scn.geometry)
    return PlannedLaunch(
        label=f"roundtrip {scn.name} tp={plan.tensor_parallel} ({plan.variant})",
        python=plan.server.python,
        argv=plan.server.argv(REHEARSAL_PORT),
        env=dict(plan.server.env),
        intended=intended,
        geometry=plan.geometry,
        geometry_name=geometry_path.stem,
        kv_bytes_per_token=plan.expected.kv_bytes_per_token,
        cpu_capacity_tokens=plan.cpu_capacity_tokens,
    )


def plan_stress_launches(scenario: Path, **options: Any) -> list[PlannedLaunch]:
    """The stress run's two servers on a GPU runner, planned by ``plan_stress`` itself:
    the one under test and its connector-off reference (``stress.plan.reference_spec``).
    ``options`` are its keyword arguments (tp, variant, patch, profile, ...)."""
    from harness.commands.stress.plan import plan_stress, reference_spec
    from harness.scenario.stress import load_stress

    scn = load_stress(scenario)
    with gpu_planning():
        plan = plan_stress(scn, **options)
    base = plan.base  # its round-trip scenario holds the model and the server settings
    assert base.server is not None and base.env is not None
    rt_scn = base.scenario
    config = options.get("config")
    geometry_path = Path(config) if config else rt_scn.resolve(rt_scn.geometry)
    launches = []
    for what, spec in (("", base.server), (" reference", reference_spec(plan))):
        launches.append(
            PlannedLaunch(
                label=f"stress {scn.name}{what} tp={base.tensor_parallel} ({base.variant})",
                python=spec.python,
                argv=spec.argv(REHEARSAL_PORT),
                env=dict(spec.env),
                intended=_intended(spec, rt_scn.server, base.tensor_parallel),
                geometry=base.geometry,
                geometry_name=geometry_path.stem,
                kv_bytes_per_token=base.expected.kv_bytes_per_token,
                cpu_capacity_tokens=base.cpu_capacity_tokens,
            )
        )
    return launches


def plan_crash_repro_launches(scenario: Path, **options: Unpack[RunOptions]) -> list[PlannedLaunch]:
    """Every row of the crash matrix on a GPU runner, its weight-free models built for real.

    ``build_models`` is the launcher's own step, so the argv names the very directory a
    launch would serve (dummy weights: config and tokenizer only, cheap).
    """
    from harness.commands import crash_repro
    from harness.scenario.crash_repro import load_crash_repro

    scn = load_crash_repro(scenario)
    with gpu_planning():
        plan = crash_repro.plan_run(scn, **options)
    crash_repro.build_models(plan)
    geometries = {m.name: m.config for m in plan.models}
    launches = []
    for row in plan.rows:
        intended = _intended(row.plan, scn.server, 1)
        launches.append(
            PlannedLaunch(
                label=f"crash-repro {row.key}",
                python=row.plan.python,
                argv=row.plan.argv(REHEARSAL_PORT),
                env=dict(row.plan.env),
                intended=intended,
                geometry=geometries[row.model],
                geometry_name=row.model,
                skipped_here=str(getattr(row, "skip_reason", "") or ""),
            )
        )
    return launches


def plan_command(args: Sequence[str], root: Path) -> list[PlannedLaunch]:
    """The launches an ``offload-check`` command line makes on a GPU runner.

    The options are parsed by the CLI's own click command (so defaults and spellings are
    the CLI's), then handed to the planners as ``harness.cli.app`` hands them over; relative
    paths are taken from ``root``, where the CI jobs run. Commands that launch nothing
    (``--url`` attach mode, reports) plan nothing.
    """
    import typer.main

    from harness.cli import app as cli
    from harness.cli import launch_checks, options

    group = typer.main.get_command(cli.app)
    name, *rest = list(args)
    command = group.commands.get(name) if hasattr(group, "commands") else None
    if command is None:
        raise BadInput(f"offload-check has no command {name!r}")
    params = command.make_context(name, rest).params

    def rel(value: Path) -> Path:
        return value if value.is_absolute() else root / value

    def scenario(value: Path | None, default: str) -> Path:
        if value is not None:
            return rel(value)
        local = root / "scenarios" / default
        return local if local.is_file() else options.DEFAULT_SCENARIOS / default

    def launch_of() -> Any:
        """The launch options as the CLI hands them to ``plan_roundtrip`` (``roundtrip``
        and ``stress`` alike): --python becomes an ad-hoc variant (the GPU loan's runs
        name the image's interpreter so)."""
        config = params.get("config")
        return launch_checks.launch_options(
            params.get("variant"),
            params.get("python"),
            params.get("patch"),
            rel(config) if config else None,
            params.get("tp"),
            params.get("fault"),
            params.get("engine_arg") or None,
        )

    if name in ("roundtrip", "stress") and params.get("url"):
        return []
    if name == "roundtrip":
        where = scenario(params.get("scenario"), "roundtrip-cpu.toml")
        return [plan_roundtrip_launch(where, **launch_of())]
    if name == "stress":
        profile = params.get("profile")
        return plan_stress_launches(
            scenario(params.get("scenario"), "stress.toml"),
            profile=getattr(profile, "value", profile),
            requests=params.get("requests"),
            duration_s=params.get("duration"),
            concurrency=params.get("concurrency"),
            seed=params.get("seed"),
            **launch_of(),
        )
    if name == "crash-repro":
        connector = params.get("connector")
        modes = None if connector in (None, options.ConnectorChoice.both) else [connector.value]
        configs = [str(rel(c)) for c in params.get("config") or []]
        return plan_crash_repro_launches(
            scenario(params.get("scenario"), "crash-repro.toml"),
            variant_names=list(params.get("variant") or []) or None,
            patch=params.get("patch"),
            configs=configs or None,
            connector_modes=modes,
        )
    return []


def stand_in_model(launch: PlannedLaunch) -> Path | None:
    """A local model directory for ``create_engine_config`` when the launch names a hub id.

    The checkpoint's own ``config.json`` is on the (gated) hub; the scenario's geometry is
    what the harness plans with, so it is what the rehearsal configures the engine with,
    written by the same builder as every local model (no weights).
    """
    model = str(launch.intended.get("model") or "")
    if Path(model).is_dir():
        return Path(model)
    if launch.geometry is None:
        return None

    return model_builder.build_model(
        launch.geometry, f"rehearsal-{launch.geometry_name}", weights="dummy"
    )
