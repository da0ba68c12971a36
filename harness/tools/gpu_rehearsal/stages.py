"""The rehearsal's stages in this process, on this interpreter's vLLM: the API server's own
parser (``parse``), ``AsyncEngineArgs`` (``engine-args``), ``create_engine_config()``
(``engine-config``) and the offloading connector's scheduler side (``offload``), on the
platform :func:`platform_note` says why this process runs on.

Each stage raises :class:`RehearsalError` with vLLM's own message: what the GPU runner's
server would say when it refuses the launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.engine.cuda_wheel import CPU_STAND_IN, choose_platform, waive_cpu_triton
from harness.server import kv_layout, model_builder
from harness.tools.gpu_rehearsal.homes import api_server_parser_home, vllm_function, vllm_version
from harness.tools.gpu_rehearsal.launch import (
    STAGES,
    OffloadSummary,
    PlannedLaunch,
    Rehearsal,
    RehearsalAPIError,
    RehearsalError,
    one_line,
    uses_vllm_offload_spec,
)
from harness.tools.gpu_rehearsal.planning import plan_roundtrip_launch, stand_in_model

PARSER_PROG = "vllm-api-server"
# KV-cache memory assumed per GPU (an H100 80 GB at 0.9 minus ~27 GB of FP8 weights, rounded
# down). The GPU's memory profile decides it on a runner; only the pool's block count
# depends on it, never a figure checked here.
ASSUMED_KV_BYTES_PER_GPU = 40 * 1024**3
OFFLOAD_KINDS = ("full", "chunked-local")


_PLATFORM_NOTE: str | None = None


def prepare_platform() -> str:
    """:func:`platform_note`, once per process, before vLLM resolves its platform."""
    global _PLATFORM_NOTE
    if _PLATFORM_NOTE is None:
        platforms = sys.modules.get("vllm.platforms")
        if platforms is not None and getattr(platforms, "_current_platform", None) is not None:
            _PLATFORM_NOTE = "vLLM's own choice (resolved before the rehearsal started)"
        else:
            _PLATFORM_NOTE = platform_note()
            if _PLATFORM_NOTE == CPU_STAND_IN:
                _PLATFORM_NOTE += waive_cpu_triton()
    return _PLATFORM_NOTE


def platform_note() -> str:
    """Which vLLM platform the stages run on in this process, and why
    (``harness.engine.cuda_wheel``: the CUDA wheel without a driver on its CPU platform).
    Called before vLLM resolves its platform."""
    return choose_platform()


def current_platform_name() -> str:
    from vllm.platforms import current_platform

    return type(current_platform).__name__


def make_parser() -> Any:
    """The API server's parser, from wherever this vLLM build keeps it (:data:`HOMES`),
    checked to be the one the API server itself builds."""
    prepare_platform()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser = vllm_function("make_arg_parser")
    validate = vllm_function("validate_parsed_serve_args")
    server_home = api_server_parser_home()
    if server_home != make_arg_parser.__module__:
        raise RehearsalAPIError(
            f"vLLM {vllm_version()}'s API server takes its parser from {server_home}, the "
            f"rehearsal from {make_arg_parser.__module__} (harness.tools.gpu_rehearsal.homes.HOMES)"
        )
    parser = make_arg_parser(
        FlexibleArgumentParser(
            prog=PARSER_PROG, description="vLLM OpenAI-Compatible RESTful API server."
        )
    )
    return parser, validate


def _argparse_message(stderr: str) -> str:
    """argparse's own complaint, without the few hundred lines of usage printed before it."""
    marker = f"{PARSER_PROG}: error: "
    text = stderr[stderr.find(marker) + len(marker) :] if marker in stderr else stderr
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())


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
        raise RehearsalError(label, "parse", one_line(err)) from None
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as err:
        raise RehearsalError(label, "engine-args", one_line(err)) from None
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
        raise RehearsalError(label, "engine-config", one_line(err)) from None
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
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    build_offloading_config = vllm_function("build_offloading_config")
    generate_scheduler_kv_cache_config = vllm_function("generate_scheduler_kv_cache_config")
    window_in_chunks = vllm_function("get_sliding_window_size_in_chunks")
    workers = vllm_config.parallel_config.world_size
    try:
        specs = kv_cache_specs(vllm_config, geometry)
        _resolve_layout(vllm_config, list(specs.values()), workers)
        worker_configs = plan_kv_caches(vllm_config, specs, workers, kv_bytes_per_gpu)
        kv_cache_config = generate_scheduler_kv_cache_config(worker_configs)
        # The engine core records the pool size before it builds the scheduler.
        vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        offloading = build_offloading_config(vllm_config, kv_cache_config)
        spec = OffloadingSpecFactory.create_spec(offloading)
        manager = spec.get_manager()
        connector = KVConnectorFactory.create_connector(
            config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
        )
    except RehearsalAPIError:
        raise
    except Exception as err:
        raise RehearsalError(label, "offload", one_line(err)) from None
    scheduler = connector.connector_scheduler
    groups = []
    for g in scheduler.config.kv_group_configs:
        window = g.sliding_window_size_in_chunks
        # The group's spec from the KV-cache config (0.26's group configs do not carry it).
        kv_spec = kv_cache_config.kv_cache_groups[g.group_idx].kv_cache_spec
        # #51150's function, asked directly: the scheduler must have used its answer.
        try:
            asked = window_in_chunks(kv_spec, int(g.tokens_per_chunk))
        except Exception as err:
            raise RehearsalError(label, "offload", one_line(err)) from None
        if asked != window:
            raise RehearsalError(
                label,
                "offload",
                f"group {g.group_idx}: the scheduler's window is {window} chunks, "
                f"get_sliding_window_size_in_chunks says {asked}",
            )
        groups.append(
            {
                "spec": type(kv_spec).__name__,
                "layers": len(kv_cache_config.kv_cache_groups[g.group_idx].layer_names),
                "sliding_window_size_in_chunks": window,
            }
        )
    return OffloadSummary(
        connector_class=type(connector).__name__,
        spec_class=type(spec).__name__,
        manager_class=type(manager).__name__,
        # The tier's chunk count: ``num_chunks`` from 0.27, ``num_blocks`` (the same
        # count, per offload chunk) up to 0.26.
        num_chunks=int(getattr(spec, "num_chunks", None) or spec.num_blocks),
        kv_bytes_per_chunk=int(spec.kv_bytes_per_chunk),
        worker_kv_bytes_per_block=int(offloading.worker_kv_bytes_per_block),
        world_size=int(offloading.parallel.world_size),
        tokens_per_block=int(offloading.groups[0].tokens_per_block),
        blocks_per_chunk=int(offloading.cache.blocks_per_chunk),
        groups=groups,
    )


def plan_kv_caches(
    vllm_config: Any, specs: Mapping[str, Any], workers: int, kv_bytes_per_gpu: int
) -> list[Any]:
    """Every rank's ``KVCacheConfig``, planned as this build's engine core plans them.

    Up to 0.32 ``get_kv_cache_configs`` groups the layers itself; from 0.33 the engine
    core asks ``get_global_kv_cache_groups`` first, lets the config adjust the DCP
    interleave to the groups, and passes them on (:data:`HOMES`).
    """
    get_kv_cache_configs = vllm_function("get_kv_cache_configs")
    params = list(inspect.signature(get_kv_cache_configs).parameters.values())
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    per_worker = [dict(specs) for _ in range(workers)]
    args: list[Any] = [vllm_config, per_worker, [kv_bytes_per_gpu] * workers]
    if "global_kv_cache_groups" in required:
        get_global_groups = vllm_function("get_global_kv_cache_groups")
        if get_global_groups is None:
            raise RehearsalAPIError(
                f"vLLM {vllm_version()}'s get_kv_cache_configs wants global_kv_cache_groups, "
                "and harness.tools.gpu_rehearsal.homes.HOMES knows no get_global_kv_cache_groups "
                "for it"
            )
        groups = get_global_groups(vllm_config, per_worker)
        adjust = getattr(vllm_config, "adjust_dcp_kv_cache_interleave_size", None)
        if adjust is not None:
            adjust(groups)
        args.append(groups)
    # A required parameter the rehearsal does not know of is the harness's problem, not
    # vLLM refusing the launch: say so instead of reporting a TypeError as a rejection.
    if len(required) > len(args):
        raise RehearsalAPIError(
            f"vLLM {vllm_version()}'s get_kv_cache_configs wants {', '.join(required)}; the "
            f"rehearsal passes {len(args)} (harness.tools.gpu_rehearsal.stages.plan_kv_caches)"
        )
    return list(get_kv_cache_configs(*args))


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
    note = prepare_platform()
    result = Rehearsal(launch.label, vllm_version())
    _, engine_args, result.parsed = parse_serve_args(launch.label, launch.server_args, parser)
    result.platform = f"{current_platform_name()} ({note})"
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
    return kv_layout.layer_kinds(dict(geometry))
