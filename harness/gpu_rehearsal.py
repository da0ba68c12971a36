"""Rehearse on CPU the vLLM servers the GPU runners launch, with vLLM's own checks.

The GPU scenarios (Llama-4-Scout FP8 at TP=4, the nightly crash matrix with vLLM's own
``CPUOffloadingSpec``) only run nightly on self-hosted GPU runners, so a server option the
CUDA build rejects would surface there, hours after the change. Most of what vLLM checks
before it touches a GPU is platform independent, so each GPU launch is planned here by the
harness's own planning code with the device forced to ``cuda`` (the argv is built by the
same ``ServerSpec`` the launcher uses) and handed, stage by stage, to the installed vLLM:

``parse``
    the API server's own parser (``make_arg_parser`` on a ``FlexibleArgumentParser``) and
    ``validate_parsed_serve_args``, as the server's ``main()`` does;
``engine-args``
    ``AsyncEngineArgs.from_cli_args`` (the kv-transfer JSON becomes a ``KVTransferConfig``
    at parse time already);
``engine-config``
    ``create_engine_config()``, with the model swapped for a local directory holding
    the geometry's ``config.json`` when the launch names a hub checkpoint;
``offload``
    per-rank KV-cache specs from the geometry, vLLM's ``get_kv_cache_configs``, vLLM's
    ``build_offloading_config`` and ``OffloadingSpecFactory`` (``CPUOffloadingSpec``,
    whose ``get_manager()`` is called), then the ``OffloadingConnector``'s scheduler side
    through ``KVConnectorFactory``, the path the engine's scheduler takes.

Where the CPU build stops, and so what this does *not* prove:

- ``current_platform`` is vLLM's CPU platform: ``create_engine_config`` runs the CPU
  platform's ``check_and_update_config``, not CUDA's; attention-backend selection (and so
  the CUDA block sizes a backend supports: ``--block-size 17`` passes here), FP8 kernel
  support by compute capability, NCCL and memory profiling are not rehearsed.
- The gated checkpoint's ``config.json`` cannot be downloaded: the stand-in is the
  scenario's geometry (the text config), so the checkpoint's multimodal wrapper and its
  ``quantization_config`` (auto-detected by vLLM; the argv passes no ``--quantization``)
  are not seen.
- KV-cache specs are built from the geometry the way vLLM's Llama 4 attention layers
  report them (``get_kv_cache_spec`` needs the model instantiated on a worker); the KV
  memory per GPU is assumed (only the pool's block count depends on it) and the KV-cache
  layout is vLLM's default preference, which is what FlashAttention (declaring none)
  reports on a GPU.
- ``CPUOffloadingSpec.get_worker`` refuses the CPU platform by design; it is never called.

Launches planned for another interpreter (the ``stock`` vLLM of the crash matrix) are
rehearsed in that interpreter (``python -m harness.gpu_rehearsal --worker``), so each argv
meets the vLLM build that would really parse it; that path stops after ``engine-config``.

vLLM is imported inside functions only: the harness's own process need not have it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, Unpack

from harness.errors import BadInput
from harness.names import ENV_DEVICE

if TYPE_CHECKING:
    from harness.crash_repro import RunOptions
    from harness.launcher import ServerSpec
    from harness.scenario import ServerSettings

STAGES = ("parse", "engine-args", "engine-config", "offload")
DEVICE_ENV = ENV_DEVICE
# A real number where the launcher would put the free port it picks: the parser wants an int.
REHEARSAL_PORT = 8000
PARSER_PROG = "vllm-api-server"
# Where the API server's main() takes its parser from: 0.32 moved it under launchers.
PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
# KV-cache memory assumed per GPU (an H100 80 GB at 0.9 minus ~27 GB of FP8 weights, rounded
# down). The GPU's memory profile decides it on a runner; only the pool's block count
# depends on it, never a figure checked here.
ASSUMED_KV_BYTES_PER_GPU = 40 * 1024**3
OFFLOAD_KINDS = ("full", "chunked-local")
WORKER_MARKER = "OFFLOAD_CHECK_REHEARSAL "


class RehearsalError(BadInput):
    """vLLM rejected a planned launch: the GPU runner's server would refuse it too."""

    def __init__(self, label: str, stage: str, message: str) -> None:
        super().__init__(f"{label}: vLLM rejects it at {stage}: {message}")
        self.label, self.stage, self.message = label, stage, message


@dataclass
class PlannedLaunch:
    """One server a GPU runner would start, as the harness plans it, plus what it meant."""

    label: str
    python: str
    argv: list[str]
    env: dict[str, str]
    # What the harness asked for, independently of the argv: vLLM must end up with these.
    intended: dict[str, Any]
    geometry: dict[str, Any] | None = None
    geometry_name: str = "model"
    # The harness's own byte figures, cross-checked against vLLM's offloading arithmetic.
    kv_bytes_per_token: int | None = None
    cpu_capacity_tokens: int | None = None
    # Why this host would not launch it (a CPU feature it lacks). A GPU runner's CPU may
    # have it, so the launch is rehearsed all the same.
    skipped_here: str = ""

    @property
    def tensor_parallel(self) -> int:
        return int(self.intended.get("tensor_parallel_size") or 1)

    @property
    def server_args(self) -> list[str]:
        """What the API server's parser sees: everything after ``-m <module>``."""
        return self.argv[self.argv.index("-m") + 2 :]


@dataclass
class OffloadSummary:
    """What vLLM's offloading built for the launch, scheduler side."""

    connector_class: str
    spec_class: str
    manager_class: str
    num_chunks: int
    kv_bytes_per_chunk: int  # 4 KiB aligned, over all ranks, one group's block(s)
    worker_kv_bytes_per_block: int
    world_size: int
    tokens_per_block: int
    blocks_per_chunk: int
    # per KV-cache group: spec class, layer count, sliding_window_size_in_chunks
    groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token stores over all groups and ranks (the pool pages are uniform)."""
        per_block = self.worker_kv_bytes_per_block * self.world_size * len(self.groups)
        return per_block // self.tokens_per_block

    @property
    def capacity_tokens(self) -> int:
        """Tokens the CPU tier holds: every stored chunk takes one slot per group."""
        groups = max(1, len(self.groups))
        return self.num_chunks // groups * self.blocks_per_chunk * self.tokens_per_block


@dataclass
class Rehearsal:
    """How far vLLM took one launch, and the values it ended up with at each stage."""

    label: str
    vllm_version: str
    passed: list[str] = field(default_factory=list)
    parsed: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    offload: OffloadSummary | None = None
    # Where the rehearsal stopped and why: a stage not requested, or the CPU build's limit.
    stopped: str = ""


# --- planning, exactly as the CLI would on a GPU runner --------------------------------


@contextlib.contextmanager
def gpu_planning() -> Iterator[None]:
    """Every interpreter probed inside reports device ``cuda``, as on a GPU runner.

    ``probe`` is cached per interpreter, so its cache is cleared on the way in and out:
    a CPU answer must not leak into the GPU plan, nor the GPU answer out of it.
    """
    from harness.environments import probe

    old = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = "cuda"
    probe.cache_clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = old
        probe.cache_clear()


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
    from harness import roundtrip as rt
    from harness.scenario import load_roundtrip

    scn = load_roundtrip(scenario)
    with gpu_planning():
        plan = rt.plan_roundtrip(scn, **options)
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


def plan_crash_repro_launches(scenario: Path, **options: Unpack[RunOptions]) -> list[PlannedLaunch]:
    """Every row of the crash matrix on a GPU runner, its weight-free models built for real.

    ``build_models`` is the launcher's own step, so the argv names the very directory a
    launch would serve (dummy weights: config and tokenizer only, cheap).
    """
    from harness import crash_repro
    from harness.scenario import load_crash_repro

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
    the CLI's), then handed to the planners as ``harness.cli`` hands them over; relative
    paths are taken from ``root``, where the CI jobs run. Commands that launch nothing
    (``--url`` attach mode, reports) plan nothing.
    """
    import typer.main

    from harness import cli

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
        return local if local.is_file() else cli.DEFAULT_SCENARIOS / default

    if name == "roundtrip":
        if params.get("url"):
            return []
        config = params.get("config")
        return [
            plan_roundtrip_launch(
                scenario(params.get("scenario"), "roundtrip-cpu.toml"),
                tp=params.get("tp"),
                variant=params.get("variant"),
                patch=params.get("patch"),
                config=str(rel(config)) if config else None,
                fault=params.get("fault"),
                extra_args=params.get("engine_arg") or None,
            )
        ]
    if name == "crash-repro":
        connector = params.get("connector")
        modes = None if connector in (None, cli.ConnectorChoice.both) else [connector.value]
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
    from harness import model_builder

    return model_builder.build_model(
        launch.geometry, f"rehearsal-{launch.geometry_name}", weights="dummy"
    )


# --- vLLM's side ----------------------------------------------------------------------


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def make_parser() -> Any:
    """The API server's parser, from whichever module this vLLM build keeps it in."""
    import importlib

    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "make_arg_parser") and hasattr(module, "validate_parsed_serve_args"):
            parser = module.make_arg_parser(
                FlexibleArgumentParser(
                    prog=PARSER_PROG, description="vLLM OpenAI-Compatible RESTful API server."
                )
            )
            return parser, module.validate_parsed_serve_args
    raise RuntimeError(f"none of {', '.join(PARSER_MODULES)} has the API server's parser")


def _argparse_message(stderr: str) -> str:
    """argparse's own complaint, without the few hundred lines of usage printed before it."""
    marker = f"{PARSER_PROG}: error: "
    text = stderr[stderr.find(marker) + len(marker) :] if marker in stderr else stderr
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _one_line(err: BaseException) -> str:
    text = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {text}"


def _kv_values(kv: Any) -> dict[str, Any] | None:
    if kv is None:
        return None
    return {
        "kv_connector": kv.kv_connector,
        "kv_role": kv.kv_role,
        "kv_connector_extra_config": dict(kv.kv_connector_extra_config),
        "kv_connector_module_path": kv.kv_connector_module_path,
        "kv_buffer_device": kv.kv_buffer_device,
    }


def parse_serve_args(
    label: str, server_args: Sequence[str], parser: Any = None
) -> tuple[Any, Any, dict[str, Any]]:
    """Stages ``parse`` and ``engine-args``: (namespace, AsyncEngineArgs, their values)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser, validate = parser or make_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(list(server_args))
    except SystemExit:
        raise RehearsalError(label, "parse", _argparse_message(stderr.getvalue())) from None
    try:
        validate(args)
    except Exception as err:
        raise RehearsalError(label, "parse", _one_line(err)) from None
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as err:
        raise RehearsalError(label, "engine-args", _one_line(err)) from None
    values = {
        "model": engine_args.model,
        "served_model_name": args.served_model_name,
        "host": args.host,
        "port": args.port,
        "tensor_parallel_size": engine_args.tensor_parallel_size,
        "max_model_len": engine_args.max_model_len,
        "gpu_memory_utilization": engine_args.gpu_memory_utilization,
        "block_size": engine_args.block_size,
        "load_format": engine_args.load_format,
        "quantization": engine_args.quantization,
        "enforce_eager": engine_args.enforce_eager,
        "kv_transfer_config": _kv_values(engine_args.kv_transfer_config),
        "kv_transfer_config_class": type(engine_args.kv_transfer_config).__name__,
    }
    return args, engine_args, values


def engine_config(
    label: str, engine_args: Any, model_dir: Path | None
) -> tuple[Any, dict[str, Any]]:
    """Stage ``engine-config``: ``create_engine_config()`` as the API server calls it."""
    from vllm.usage.usage_lib import UsageContext

    if model_dir is not None and engine_args.model != str(model_dir):
        engine_args = dataclasses.replace(engine_args, model=str(model_dir))
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as err:
        raise RehearsalError(label, "engine-config", _one_line(err)) from None
    values = {
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "world_size": config.parallel_config.world_size,
        "max_model_len": config.model_config.max_model_len,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "block_size": config.cache_config.block_size,
        "cache_dtype": str(config.cache_config.cache_dtype),
        "dtype": str(config.model_config.dtype),
        "architecture": config.model_config.architecture,
        "quantization": config.model_config.quantization,
        "enforce_eager": config.model_config.enforce_eager,
        "kv_transfer_config": _kv_values(config.kv_transfer_config),
    }
    return config, values


def kv_cache_specs(vllm_config: Any, geometry: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's KV-cache specs, as vLLM's Llama 4 attention layers would report them.

    ``get_kv_cache_spec`` needs the model instantiated on a worker, so the specs are made
    from the geometry with the values those layers pass: the cache block size, the KV
    heads this rank holds (replicated when TP exceeds them), the KV dtype, the chunk.
    """
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec

    from harness import kv_layout, model_builder

    text = model_builder.text_config(dict(geometry))
    kinds = kv_layout.layer_kinds(dict(geometry))
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    tp = vllm_config.parallel_config.tensor_parallel_size
    cache = vllm_config.cache_config
    dtype = vllm_config.model_config.dtype if cache.cache_dtype == "auto" else cache.cache_dtype
    common = {
        "block_size": cache.block_size,
        "num_kv_heads": max(1, kv_heads // tp),
        "head_size": head_dim,
        "dtype": dtype,
    }
    specs: dict[str, Any] = {}
    for i, kind in enumerate(kinds):
        name = f"model.layers.{i}.self_attn.attn"
        if kind == "chunked-local":
            specs[name] = ChunkedLocalAttentionSpec(
                attention_chunk_size=int(text["attention_chunk_size"]), **common
            )
        else:
            specs[name] = FullAttentionSpec(**common)
    return specs


def offload_side(
    label: str,
    vllm_config: Any,
    geometry: Mapping[str, Any],
    kv_bytes_per_gpu: int = ASSUMED_KV_BYTES_PER_GPU,
) -> OffloadSummary:
    """Stage ``offload``: the engine core's KV-cache config, then the scheduler's connector.

    The calls are the engine core's and the scheduler's (``get_kv_cache_configs``,
    ``generate_scheduler_kv_cache_config``, ``KVConnectorFactory.create_connector`` with
    the scheduler role); the spec is also built on its own, as ``OffloadingConnector``
    builds it, to read its chunk arithmetic and call ``get_manager()`` directly.
    """
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    workers = vllm_config.parallel_config.world_size
    try:
        specs = kv_cache_specs(vllm_config, geometry)
        _resolve_layout(vllm_config, list(specs.values()), workers)
        worker_configs = get_kv_cache_configs(
            vllm_config, [dict(specs) for _ in range(workers)], [kv_bytes_per_gpu] * workers
        )
        kv_cache_config = generate_scheduler_kv_cache_config(worker_configs)
        # The engine core records the pool size before it builds the scheduler.
        vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        offloading = build_offloading_config(vllm_config, kv_cache_config)
        spec = OffloadingSpecFactory.create_spec(offloading)
        manager = spec.get_manager()
        connector = KVConnectorFactory.create_connector(
            config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
        )
    except Exception as err:
        raise RehearsalError(label, "offload", _one_line(err)) from None
    scheduler = connector.connector_scheduler
    groups = [
        {
            "spec": type(g.kv_cache_spec).__name__,
            "layers": len(kv_cache_config.kv_cache_groups[g.group_idx].layer_names),
            "sliding_window_size_in_chunks": g.sliding_window_size_in_chunks,
        }
        for g in scheduler.config.kv_group_configs
    ]
    return OffloadSummary(
        connector_class=type(connector).__name__,
        spec_class=type(spec).__name__,
        manager_class=type(manager).__name__,
        num_chunks=int(spec.num_chunks),
        kv_bytes_per_chunk=int(spec.kv_bytes_per_chunk),
        worker_kv_bytes_per_block=int(offloading.worker_kv_bytes_per_block),
        world_size=int(offloading.parallel.world_size),
        tokens_per_block=int(offloading.groups[0].tokens_per_block),
        blocks_per_chunk=int(offloading.cache.blocks_per_chunk),
        groups=groups,
    )


def _resolve_layout(vllm_config: Any, specs: list[Any], workers: int) -> None:
    """The engine core resolves the KV-cache layout from what every worker reports.

    A worker reports its attention backends' layouts; FlashAttention declares none, so it
    reports vLLM's default preference, which is what an empty backend list yields here.
    Builds without layouts (0.27) have nothing to resolve.
    """
    try:
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )
    except ImportError:
        return
    names = [layout.name for layout in get_supported_kv_cache_layouts(())]
    resolve_kv_cache_layout(vllm_config, [names] * workers, specs)


def uses_vllm_offload_spec(launch: PlannedLaunch) -> bool:
    """vLLM's own spec (CPUOffloadingSpec) serves this launch, not the harness's host one."""
    kv = launch.intended.get("kv_transfer_config")
    return bool(kv and "spec_name" not in kv["kv_connector_extra_config"])


def rehearse(
    launch: PlannedLaunch,
    *,
    stages: Sequence[str] = STAGES,
    parser: Any = None,
    model_dir: Path | None = None,
) -> Rehearsal:
    """Run ``launch`` through vLLM in this process; raises RehearsalError with vLLM's message.

    ``model_dir`` replaces the launch's model for ``engine-config`` (default: the launch's
    own directory, or a stand-in built from its geometry).
    """
    result = Rehearsal(launch.label, vllm_version())
    _, engine_args, result.parsed = parse_serve_args(launch.label, launch.server_args, parser)
    result.passed += ["parse", "engine-args"]
    if "engine-config" not in stages:
        result.stopped = "engine-config not requested"
        return result
    directory = model_dir or stand_in_model(launch)
    if directory is None:
        result.stopped = "engine-config: no local config.json for the model and no geometry"
        return result
    config, result.engine = engine_config(launch.label, engine_args, directory)
    result.passed.append("engine-config")
    if "offload" not in stages:
        result.stopped = "offload not requested"
    elif not uses_vllm_offload_spec(launch):
        result.stopped = "offload: no connector, or the harness's host spec (CPU platform)"
    elif launch.geometry is None:
        result.stopped = "offload: no geometry to build KV-cache specs from"
    elif not set(_kinds(launch.geometry)) <= set(OFFLOAD_KINDS):
        result.stopped = (
            f"offload: KV kinds {sorted(set(_kinds(launch.geometry)))} are not "
            f"modelled here (only {', '.join(OFFLOAD_KINDS)})"
        )
    else:
        result.offload = offload_side(launch.label, config, launch.geometry)
        result.passed.append("offload")
        result.stopped = "worker side: CPUOffloadingSpec.get_worker refuses the CPU platform"
    return result


def rehearse_scenario(scenario: Path, tp: int | None = None) -> tuple[PlannedLaunch, Rehearsal]:
    """A round-trip scenario as a GPU runner would launch it, through every stage here.

    Raises RehearsalError (vLLM's message) when vLLM rejects it; the caller compares
    ``mismatches(launch.intended, ...)`` when vLLM accepted something else than planned.
    """
    launch = plan_roundtrip_launch(scenario, tp=tp)
    return launch, rehearse(launch)


def _kinds(geometry: Mapping[str, Any]) -> list[str]:
    from harness import kv_layout

    return kv_layout.layer_kinds(dict(geometry))


def mismatches(intended: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Where vLLM ended up with something other than what the harness planned.

    ``None`` in the plan means "vLLM's default" and is not compared; a planned dict is
    compared on its own keys only (vLLM adds defaults such as ``kv_port``).
    """
    out = []
    for key, want in intended.items():
        if want is None or key not in observed:
            continue
        have = observed[key]
        if isinstance(want, dict) and isinstance(have, dict):
            diff = {k: (v, have.get(k)) for k, v in want.items() if have.get(k) != v}
            if diff:
                out.append(f"{key}: {diff} (planned, vLLM)")
        elif have != want:
            out.append(f"{key}: planned {want!r}, vLLM has {have!r}")
    return out


# --- other interpreters ---------------------------------------------------------------


def is_this_interpreter(python: str) -> bool:
    """Launches of this interpreter can be rehearsed in process (the venv's own vLLM)."""
    # Not realpath: every venv's python links to the same system interpreter; the venv's
    # bin directory is what tells them apart.
    return Path(os.path.abspath(python)).parent == Path(os.path.abspath(sys.executable)).parent


def rehearse_elsewhere(
    launches: Sequence[PlannedLaunch], timeout_s: float = 300
) -> list[Rehearsal | RehearsalError]:
    """Rehearse launches in their own interpreter (one process per interpreter).

    Each gets the same ``parse``, ``engine-args`` and ``engine-config`` stages as here,
    run by the vLLM build it would really be launched with.
    """
    out: dict[int, Rehearsal | RehearsalError] = {}
    by_python: dict[str, list[int]] = {}
    for i, launch in enumerate(launches):
        by_python.setdefault(launch.python, []).append(i)
    for python, indices in by_python.items():
        request = {
            "launches": [
                {
                    "label": launches[i].label,
                    "server_args": launches[i].server_args,
                    "model_dir": str(stand_in_model(launches[i]) or ""),
                }
                for i in indices
            ]
        }
        env = {
            **os.environ,
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(_vllm_cache_root(python)),
        }
        proc = subprocess.run(
            [python, "-m", "harness.gpu_rehearsal", "--worker"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(WORKER_MARKER)), None)
        if line is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{python} could not rehearse: {tail}")
        for i, answer in zip(indices, json.loads(line[len(WORKER_MARKER) :]), strict=True):
            if answer["error"]:
                out[i] = RehearsalError(answer["label"], answer["stage"], answer["message"])
            else:
                out[i] = Rehearsal(
                    answer["label"],
                    answer["vllm_version"],
                    answer["passed"],
                    answer["parsed"],
                    answer["engine"],
                    None,
                    answer["stopped"],
                )
    return [out[i] for i in range(len(launches))]


def _vllm_cache_root(python: str) -> Path:
    """A vLLM cache of the interpreter's own, so that two vLLM builds do not thrash one.

    vLLM caches each model class's inspection under ``modelinfos/<class>.json`` keyed by
    the class's source hash; two builds sharing ``~/.cache/vllm`` overwrite each other's
    entry, and every switch costs a fresh inspection subprocess (~10 s, importing vLLM).
    """
    import hashlib

    from harness import model_builder

    venv = Path(os.path.abspath(python)).parent.parent
    key = hashlib.sha256(str(venv).encode()).hexdigest()[:12]
    return model_builder.default_cache_dir() / "vllm-cache" / f"{venv.name}-{key}"


def _worker(stream: TextIO) -> list[dict[str, Any]]:
    """The ``--worker`` side: requests as JSON on stdin, answers as one marked JSON line."""
    request = json.load(stream)
    parser = make_parser()
    answers = []
    for item in request["launches"]:
        launch = PlannedLaunch(
            item["label"],
            sys.executable,
            [sys.executable, "-m", "vllm", *item["server_args"]],
            {},
            {},
        )
        try:
            res = rehearse(
                launch,
                stages=("parse", "engine-args", "engine-config"),
                parser=parser,
                model_dir=Path(item["model_dir"]) if item["model_dir"] else None,
            )
            answers.append(
                {
                    "label": res.label,
                    "error": False,
                    "vllm_version": res.vllm_version,
                    "passed": res.passed,
                    "parsed": _plain(res.parsed),
                    "engine": _plain(res.engine),
                    "stopped": res.stopped,
                }
            )
        except RehearsalError as err:
            answers.append(
                {"label": err.label, "error": True, "stage": err.stage, "message": err.message}
            )
    return answers


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(values, default=str))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.gpu_rehearsal [offload-check command ...]``: rehearse it here.

    Without arguments, the nightly round trip. ``--worker`` is the other-interpreter side.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--worker"]:
        print(WORKER_MARKER + json.dumps(_worker(sys.stdin)), flush=True)
        return 0
    root = Path.cwd()
    command = args or ["roundtrip", "--scenario", "scenarios/scout-fp8-tp4.toml", "--tp", "4"]
    launches = plan_command(command, root)
    here = [x for x in launches if is_this_interpreter(x.python)]
    there = [x for x in launches if not is_this_interpreter(x.python)]
    results: list[tuple[PlannedLaunch, Rehearsal | RehearsalError]] = []
    for launch in here:
        try:
            results.append((launch, rehearse(launch)))
        except RehearsalError as err:
            results.append((launch, err))
    results += list(zip(there, rehearse_elsewhere(there), strict=True)) if there else []
    bad = 0
    for launch, res in results:
        if isinstance(res, RehearsalError):
            bad += 1
            print(f"REJECTED {res}")
            continue
        problems = mismatches(launch.intended, res.parsed) + mismatches(launch.intended, res.engine)
        bad += bool(problems)
        print(
            f"{'MISMATCH' if problems else 'ok'} {launch.label}: vLLM {res.vllm_version} "
            f"passed {', '.join(res.passed)}; stopped: {res.stopped or 'after every stage'}"
        )
        for problem in problems:
            print(f"  {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
