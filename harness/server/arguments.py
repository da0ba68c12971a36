"""What to launch for a row or a round trip: engine arguments, connector, environment.

Turns scenario settings (model, variant, connector, patch, fault, device) into a
``harness.server.launcher.ServerSpec``; the spec alone builds the argv, so planning
(``--dry-run``) and the real launch run exactly the same command.
"""

from __future__ import annotations

import os
from typing import Any

from harness.engine.amx import fix_enabled
from harness.errors import BadInput
from harness.names import (
    DISK_FAULT_STALL,
    ENGINE_DISK_FAULTS,
    ENV_AMX,
    ENV_PATCH,
    ENV_REPORT_SPECS,
    EXTRA_DISK_FAULT,
    EXTRA_FAULT,
    EXTRA_FAULT_CONTROL,
    HOST_SPEC_MODULE,
    HOST_SPEC_NAME,
    HOST_TIERING_SPEC_MODULE,
    HOST_TIERING_SPEC_NAME,
    PATCH_NONE,
    STALL_TIER_MODULE,
    STALL_TIER_TYPE,
    TIERING_SPEC_NAME,
)
from harness.scenario.schema import OffloadSettings, ServerSettings
from harness.server.interpreters import Environment
from harness.server.launcher import ServerSpec
from harness.server.modelinfo import vllm_cache_root


def offload_backend(settings: OffloadSettings, env: Environment) -> str:
    """``host`` (the harness's CPU-platform worker) or ``vllm`` (vLLM's own spec, untouched).

    vLLM's CPUOffloadingSpec refuses to build a worker on the CPU platform, so a CPU run
    needs the harness's backend to get as far as the scheduler; on GPUs nothing of the
    harness's should stand between vLLM and its own offloading code.
    """
    if settings.backend != "auto":
        return settings.backend
    return "host" if env.device == "cpu" else "vllm"


def kv_transfer_config(
    settings: OffloadSettings,
    env: Environment,
    fault: str | None = None,
    fault_control: str | None = None,
) -> dict[str, Any]:
    """The connector's JSON. ``fault`` fixes a seeded fault for the server's life;
    ``fault_control`` names a file the host backend re-reads, so the fault can change
    between round trips on one server (``harness.commands.faults``)."""
    if not isinstance(settings.cpu_bytes_to_use, int):
        raise BadInput(
            'offload.cpu_bytes_to_use = "auto" is sized from a round trip\'s '
            "pool and filler (server.pool_tokens); give a number of bytes here"
        )
    extra: dict[str, Any] = {"cpu_bytes_to_use": settings.cpu_bytes_to_use}
    if settings.block_size is not None:
        extra["block_size"] = settings.block_size
    host = offload_backend(settings, env) == "host"
    if settings.disk is not None:
        if settings.disk.dir is None:
            raise ValueError("the disk tier's directory is resolved before launch")
        extra["secondary_tiers"] = [
            {
                "type": "fs",
                "root_dir": settings.disk.dir,
                "n_read_threads": settings.disk.io_threads,
                "n_write_threads": settings.disk.io_threads,
            }
            if settings.disk.fault != DISK_FAULT_STALL
            # vLLM's own hook for an out-of-tree tier: its engine code waits on it.
            else {"type": STALL_TIER_TYPE, "module_path": STALL_TIER_MODULE}
        ]
        if settings.disk.fault in ENGINE_DISK_FAULTS:
            if not host:
                raise ValueError("a disk fault inside the engine needs the host backend")
            extra[EXTRA_DISK_FAULT] = settings.disk.fault
        if not host:
            extra["spec_name"] = TIERING_SPEC_NAME  # vLLM's own, untouched
    if host:
        tiered = settings.disk is not None
        extra["spec_name"] = HOST_TIERING_SPEC_NAME if tiered else HOST_SPEC_NAME
        extra["spec_module_path"] = HOST_TIERING_SPEC_MODULE if tiered else HOST_SPEC_MODULE
        if fault:
            extra[EXTRA_FAULT] = fault
        if fault_control:
            extra[EXTRA_FAULT_CONTROL] = fault_control
    elif fault or fault_control:
        raise ValueError("fault injection needs the harness's host backend")
    extra.update(settings.extra_config)
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def server_spec(
    *,
    env: Environment,
    model_path: str,
    served_model_name: str,
    server: ServerSettings,
    offload: OffloadSettings | None,
    patch: str | None,
    tensor_parallel: int = 1,
    fault: str | None = None,
    fault_control: str | None = None,
    local_model: bool = True,
    extra_args: list[str] | None = None,
    kv_cache_memory_bytes: int | None = None,
    amx: str = "auto",
) -> ServerSpec:
    """The argv and environment of one server; ``kv_cache_memory_bytes`` sizes the pool
    in bytes (a token intent times KV bytes per token), which holds the same number of
    tokens whatever block size the engine picks on this machine."""
    args = ["--max-model-len", str(server.max_model_len)]
    if server.load_format:
        args += ["--load-format", server.load_format]
    if tensor_parallel > 1:
        args += ["--tensor-parallel-size", str(tensor_parallel)]
    if env.device != "cpu" and server.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(server.gpu_memory_utilization)]
    if kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    kv = kv_transfer_config(offload, env, fault, fault_control) if offload is not None else None

    penv: dict[str, str] = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if local_model:
        # Models made locally must never trigger a hub lookup (there is no hub here).
        penv.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if env.device == "cpu":
        if kv_cache_memory_bytes is None:
            # vLLM's CPU platform lets this variable override --kv-cache-memory-bytes,
            # so it is set only when the pool is not sized in bytes.
            penv["VLLM_CPU_KVCACHE_SPACE"] = f"{server.cpu_kvcache_space_gib:g}"
        if tensor_parallel > 1:
            # One OpenMP core per CPU worker; without it TP>1 refuses to start on
            # machines with a single NUMA node (see FACTS.md). More workers than cores
            # (TP 4 on 2 cores) share them round robin: slow, but the layout is TP 4's.
            cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
            penv.setdefault(
                "VLLM_CPU_OMP_THREADS_BIND",
                "|".join(str(cores[i % len(cores)]) for i in range(tensor_parallel)),
            )
    if "VLLM_CACHE_ROOT" not in os.environ:
        # One vLLM cache per build: vLLM keys its model-class cache by one file name and
        # rewrites it whenever another version's source differs, so alternating stock and
        # current servers re-inspected the model in a subprocess at every launch (~10 s).
        penv["VLLM_CACHE_ROOT"] = str(vllm_cache_root(env.vllm_dist, env.vllm_version))
    penv[ENV_PATCH] = patch or PATCH_NONE
    # AMX tile permission in every vLLM process (harness.engine.amx): an environment
    # fix, on unless the variant or the user (OFFLOAD_CHECK_AMX=off) switches it off.
    penv[ENV_AMX] = "off" if amx == "off" or not fix_enabled() else "on"
    # A process killed by a signal (SIGILL in a kernel, SIGSEGV) leaves its Python stack
    # in the log instead of vanishing; harness.server.crash_signatures reads it as the root cause.
    penv["PYTHONFAULTHANDLER"] = "1"
    # Report the KV-cache groups the engine built (harness.engine.specs); print-only.
    penv[ENV_REPORT_SPECS] = "1"
    penv.update(server.env)
    return ServerSpec(
        python=env.python,
        model=model_path,
        served_model_name=served_model_name,
        args=args,
        env=penv,
        kv_transfer=kv,
        tail=list(server.extra_args) + list(extra_args or []),
    )
