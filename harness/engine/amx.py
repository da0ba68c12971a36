"""AMX tile permission: an environment fix the harness applies in every vLLM process.

Linux hands out Intel AMX tile state only to a process that asked for it with
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; an AMX instruction executed
before that is a SIGILL. vLLM's CPU attention (``cpu_attention_with_kv_cache``, whose
``amx`` ISA ``vllm/v1/attention/backends/cpu_attn.py:_get_attn_isa`` picks when the
CPU has AMX tiles, dtype bf16 and a block size that is a multiple of 32) never asks.
It works only when something else in the process asked first (a oneDNN matmul of a
large enough model does), so small models die on their first forward pass on
Sapphire Rapids and newer Xeons, and run everywhere else. That is an engine bug, not
an offloading one; the harness requests the permission (PyTorch's own
``torch._C._cpu._init_amx()``) before any kernel runs so that offload results do
not depend on which CPU a user has. ``OFFLOAD_CHECK_AMX=off`` switches the fix off,
to reproduce the upstream bug itself.

Loaded in vLLM processes: standard library only (torch is imported lazily, and only
where the CPU has AMX).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path

from harness.names import ENV_AMX
from harness.names import LOG_AMX as LOG_PREFIX

# Flags worth recording: what vLLM's CPU kernels choose between.
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)

# arch_prctl(2) on x86-64: syscall number and the XSTATE permission requests.
_SYS_ARCH_PRCTL = 158
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo does not exist)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def has_amx(flags: frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return "amx_tile" in flags


def fix_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the harness should request AMX permission (anything but ``off``)."""
    value = (environ if environ is not None else os.environ).get(ENV_AMX, "on")
    return value.strip().lower() not in ("off", "0", "false", "no")


def planned_state(
    flags: frozenset[str] | None = None, environ: dict[str, str] | None = None
) -> str:
    """What the harness will do in vLLM processes on this host: for run.json and dry-runs.

    ``requested`` (AMX present, fix on), ``off`` (AMX present, fix switched off: the
    upstream SIGILL can happen), ``not-needed`` (no AMX on this CPU).
    """
    if not has_amx(flags) or platform.machine() not in ("x86_64", "AMD64"):
        return "not-needed"
    return "requested" if fix_enabled(environ) else "off"


def permission_granted() -> bool | None:
    """Whether this process may use AMX tiles now (None where it cannot be asked)."""
    if platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_ulong(0)
        rc = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask))
    except (OSError, AttributeError):
        return None
    if rc != 0:
        return None
    return bool(mask.value & (1 << _XFEATURE_XTILEDATA))


def _request_with_syscall() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


def request_permission() -> bool:
    """Ask Linux for AMX tile state in this process; True when granted.

    PyTorch's own request is preferred (it is what its AMX kernels rely on); the bare
    syscall is the fallback for builds that lack the binding.
    """
    try:
        import torch

        init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
        if init is not None:
            return bool(init())
    except Exception:  # a torch without the binding: fall through to the syscall
        pass
    try:
        return _request_with_syscall()
    except (OSError, AttributeError):
        return False


def apply_in_process() -> str | None:
    """Run in every vLLM process by the engine plugin; returns the line it printed.

    Acts only in servers the harness launched (the launcher always sets
    ``OFFLOAD_CHECK_AMX``), so installing the harness into a venv changes nothing for
    other users of that vLLM. Prints ``offload-check amx: <state> granted=<bool>
    pid=<pid>`` to stderr, so the server log shows what each process did; states as in
    :func:`planned_state`.
    """
    if ENV_AMX not in os.environ:
        return None
    state = planned_state()
    granted: bool | None = None
    if state == "requested":
        granted = request_permission()
    elif state == "off":
        granted = permission_granted()
    line = f"{LOG_PREFIX} {state} granted={granted} pid={os.getpid()}"
    if state != "not-needed":
        print(line, file=sys.stderr, flush=True)
    return line
