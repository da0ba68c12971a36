"""The host's checks: Python, CPU and AMX, memory, disk for the environments and runs, the
cache, loopback, the server lock; and the host facts every ``run.json`` records
(:func:`host_record`). A ``Check`` is one line of the preflight."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from harness.engine.amx import (
    ISA_FLAGS,
    cpu_flags,
    has_amx,
    permission_granted,
    planned_state,
    request_permission,
)
from harness.errors import ExitCode
from harness.names import ENV_AMX, REPO_ROOT
from harness.server.interpreters import cpu_name
from harness.server.launcher import free_port
from harness.server.model_builder import default_cache_dir

Status = Literal["ok", "warn", "fail"]

GIB = 1024**3
# The environments ``make setup`` creates in the repo, each with its completion stamp.
SETUP_VENVS = (".venv", ".venv-stock")
# One vLLM environment is ~3.4 GB installed; pip needs room to unpack wheels on top.
ENV_BYTES = 4 * GIB
# What runs need once set up: results, server logs (MBs per launch), pip's temp files.
RUN_BYTES = 1 * GIB
# Below this a fresh ``make setup`` of both environments (a new VLLM_SPEC, the nightly)
# would not fit, even when the current ones are complete.
DISK_WARN_BYTES = 8 * GIB
# Local models are configs, tokenizers and seeded random weights of a few MB each.
CACHE_FAIL_BYTES = GIB // 2
CACHE_WARN_BYTES = 2 * GIB
# A tiny CPU vLLM server: ~1-2 GiB of process memory plus VLLM_CPU_KVCACHE_SPACE (1 GiB in
# the shipped scenarios).
MEM_FAIL_BYTES = 2 * GIB
MEM_WARN_BYTES = 3 * GIB


@dataclass(frozen=True)
class Check:
    """One line of the preflight; ``fix`` is empty for ``ok`` lines."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def record(self) -> dict[str, str]:
        return asdict(self)


def exit_code(checks: Sequence[Check]) -> int:
    """Warnings never fail the preflight: they describe slower or riskier runs, not broken ones."""
    return int(ExitCode.MISMATCH if any(c.status == "fail" for c in checks) else ExitCode.OK)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---------------------------------------------------------------------------- host checks


def check_python(version: Sequence[int], executable: str = "") -> Check:
    """The harness's own interpreter: it needs 3.11 (tomllib); the environments use 3.11."""
    text = ".".join(str(p) for p in version[:3])
    where = f" ({executable})" if executable else ""
    fix = "recreate the environments on 3.11: `make clean && make setup PYTHON=python3.11`"
    if tuple(version[:2]) < (3, 11):
        return Check("python", "fail", f"Python {text}{where}: offload-check needs >= 3.11", fix)
    if tuple(version[:2]) != (3, 11):
        return Check(
            "python",
            "warn",
            f"Python {text}{where}: supported, but the environments are set up and tested "
            "with 3.11 (the torch +cpu wheel used here is built for 3.11)",
            fix,
        )
    return Check("python", "ok", f"Python {text}{where}")


def check_cpu(flags: frozenset[str], model: str, machine: str) -> Check:
    """vLLM's x86 CPU kernels pick AVX2 / AVX-512 / AMX paths; a run without AVX2 cannot start."""
    present = [f for f in ISA_FLAGS if f in flags]
    detail = f"{model} ({machine}); ISA: {' '.join(present) or 'none of ' + '/'.join(ISA_FLAGS)}"
    if machine not in ("x86_64", "AMD64"):
        return Check("cpu", "ok", f"{model} ({machine}); not x86: no AVX/AMX flags to check")
    if not flags:
        return Check(
            "cpu",
            "warn",
            f"{model} ({machine}): CPU flags unreadable (no /proc/cpuinfo)",
            "run on Linux, where vllm-cpu and the harness's AMX handling work",
        )
    if "avx2" not in flags:
        return Check(
            "cpu",
            "fail",
            detail + ": no AVX2, which vllm-cpu's x86 kernels need at least",
            "use a CPU with AVX2 (AVX-512 recommended), or a GPU runner with `GPU=1`",
        )
    if "avx512f" not in flags:
        return Check(
            "cpu",
            "warn",
            detail + ": no AVX-512 (vLLM recommends avx512f); vllm-cpu falls back to its "
            "slower AVX2 kernels",
            "nothing for correctness; compare `make bench` figures only with AVX2-only hosts",
        )
    return Check("cpu", "ok", detail)


def check_amx(
    flags: frozenset[str],
    environ: Mapping[str, str] | None = None,
    request: Callable[[], bool] = request_permission,
    granted: Callable[[], bool | None] = permission_granted,
) -> Check:
    """AMX tiles need a permission nobody in vLLM requests; without it small models SIGILL.

    On an AMX host with the fix on, this process requests the permission the same way the
    engine plugin does in every vLLM process, so a kernel (or hypervisor) that refuses it
    is found here rather than as a dead EngineCore.
    """
    env = dict(os.environ if environ is None else environ)
    state = planned_state(flags, env)
    if state == "not-needed":
        why = "no AMX tiles on this CPU" if not has_amx(flags) else "not an x86-64 host"
        return Check(
            "amx",
            "ok",
            f"{why}: vLLM's CPU attention never takes its AMX path; the harness "
            "requests nothing (amx_permission=not-needed)",
        )
    if state == "off":
        now = granted()
        return Check(
            "amx",
            "warn",
            f"AMX present and {ENV_AMX}={env.get(ENV_AMX)}: the harness will not request tile "
            f"permission in vLLM processes (amx_permission=off; granted here: {now}), so vLLM's "
            "CPU attention can die with SIGILL on small bf16 models (the upstream bug)",
            f"unset {ENV_AMX} (set it to off only to reproduce the upstream bug)",
        )
    asked = request()
    # The kernel's answer is the truth; where it cannot be read, a successful request is.
    result = granted()
    if result is None and asked:
        result = True
    if result is None:
        return Check(
            "amx",
            "warn",
            "AMX present, but the kernel could not be asked for tile permission "
            "(arch_prctl unavailable); vLLM's CPU attention may die with SIGILL",
            "run on Linux x86-64 with kernel >= 5.16",
        )
    if not result:
        return Check(
            "amx",
            "fail",
            "AMX present, but Linux refused tile permission to this process: vLLM's CPU "
            "attention will die with SIGILL on small bf16 models",
            "use a kernel that grants AMX tile state (Linux >= 5.16, AMX not masked by the "
            "hypervisor)",
        )
    return Check(
        "amx",
        "ok",
        "AMX present; tile permission granted to this process, and the harness requests it "
        "in every vLLM process (amx_permission=requested)",
    )


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` in bytes, by key (its figures are kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def read_meminfo() -> dict[str, int]:
    try:
        return parse_meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        return {}


def check_memory(meminfo: Mapping[str, int]) -> Check:
    """Available, not total, memory: a second engine or a browser already takes its share."""
    avail, total = meminfo.get("MemAvailable"), meminfo.get("MemTotal")
    if avail is None:
        return Check(
            "memory",
            "warn",
            "MemAvailable unknown (no /proc/meminfo)",
            f"make sure ~{_gib(MEM_WARN_BYTES)} are free for one vLLM server",
        )
    detail = f"{_gib(avail)} available" + (f" of {_gib(total)}" if total else "")
    need = (
        f"a small vLLM server needs ~{_gib(MEM_FAIL_BYTES)}-{_gib(MEM_WARN_BYTES)} including "
        "VLLM_CPU_KVCACHE_SPACE"
    )
    fix = "free memory (stop other vLLM servers or large processes) or use a bigger machine"
    if avail < MEM_FAIL_BYTES:
        return Check("memory", "fail", f"{detail}; {need}", fix)
    if avail < MEM_WARN_BYTES:
        return Check("memory", "warn", f"{detail}; {need}", fix)
    return Check("memory", "ok", detail)


def _existing(path: Path) -> Path:
    """The path itself or its nearest existing ancestor: what exists to measure or write."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def missing_environments(repo: Path = REPO_ROOT) -> list[str]:
    """Repo environments ``make setup`` has not completed (no ``.stamp-*``)."""
    return [v for v in SETUP_VENVS if not any((repo / v).glob(".stamp-*"))]


def check_disk(
    name: str,
    path: Path,
    fail_below: int,
    warn_below: int,
    why: str,
    usage: Callable[[Path], Any] = shutil.disk_usage,
) -> Check:
    """Free space against what is still to be written there; ``why`` says what that is."""
    try:
        free = int(usage(_existing(path)).free)
    except OSError as err:
        return Check(name, "warn", f"{path}: free space unknown ({err})", "check the disk by hand")
    detail = f"{_gib(free)} free at {path}"
    fix = f"free space on that disk (at least {_gib(warn_below)})"
    if free < fail_below:
        return Check(name, "fail", f"{detail}; needs {_gib(fail_below)}: {why}", fix)
    if free < warn_below:
        return Check(name, "warn", f"{detail}; below {_gib(warn_below)}: {why}", fix)
    return Check(name, "ok", detail)


def check_repo_disk(
    repo: Path = REPO_ROOT,
    missing: Sequence[str] | None = None,
    usage: Callable[[Path], Any] = shutil.disk_usage,
) -> Check:
    """The repo holds both vLLM environments and results; what it needs depends on setup."""
    missing = missing_environments(repo) if missing is None else list(missing)
    if missing:
        fail_below = max(RUN_BYTES, len(missing) * ENV_BYTES)
        why = f"`make setup` still has to install {', '.join(missing)} (~3.4 GB each)"
    else:
        fail_below = RUN_BYTES
        why = (
            f"results and server logs need {_gib(RUN_BYTES)}; reinstalling the environments "
            f"(`make setup` with a new VLLM_SPEC) needs {_gib(DISK_WARN_BYTES)}"
        )
    return check_disk("disk repo", repo, fail_below, DISK_WARN_BYTES, why, usage)


def check_cache_disk(cache: Path, usage: Callable[[Path], Any] = shutil.disk_usage) -> Check:
    """Local models are small; a nearly full cache disk is still a build failing mid-write."""
    why = "local models (configs, tokenizers, seeded random weights)"
    return check_disk("disk cache", cache, CACHE_FAIL_BYTES, CACHE_WARN_BYTES, why, usage)


def check_cache_writable(cache: Path) -> Check:
    """Write where models are built, without creating the cache if it does not exist yet."""
    target = _existing(cache)
    fix = "make it writable, or point OFFLOAD_CHECK_CACHE at a writable directory"
    if not target.is_dir():
        return Check("cache writable", "fail", f"{target} is not a directory", fix)
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".offload-check-doctor-"):
            pass
    except OSError as err:
        return Check("cache writable", "fail", f"cannot write in {target}: {err}", fix)
    if target == cache.absolute():
        return Check("cache writable", "ok", f"{cache} is writable")
    return Check(
        "cache writable",
        "ok",
        f"{cache} does not exist yet; {target} is writable, so it can be created",
    )


def check_loopback(bind: Callable[[], int] | None = None) -> Check:
    """Every server listens on 127.0.0.1 only; sandboxes without loopback cannot run one."""
    if bind is None:
        bind = free_port
    try:
        port = bind()
    except OSError as err:
        return Check(
            "loopback",
            "fail",
            f"cannot bind a port on 127.0.0.1: {err}",
            "bring the loopback interface up (`ip link set lo up`) or run outside a sandbox "
            "that forbids binding",
        )
    return Check("loopback", "ok", f"127.0.0.1 binds (free port {port})")


def check_lock(path: str | None, holder: Any) -> Check:
    """The machine-wide server lock (``server_lock.server_slot``): a run holding it makes
    every launch of another wait. ``holder`` is a ``server_lock.LockHolder`` or None."""
    if path is None:
        return Check("server lock", "ok", "off (OFFLOAD_CHECK_LOCK=none): launches do not queue")
    if holder is None:
        return Check("server lock", "ok", f"{path} is free")
    return Check(
        "server lock",
        "warn",
        f"{path} is held by {holder.text()}: a launch now waits until it is released",
        "wait for that run to finish, or run with --no-wait (OFFLOAD_CHECK_LOCK_WAIT=0) to "
        "fail at once instead of waiting",
    )


def host_record() -> dict[str, Any]:
    """What ``run.json`` keeps about the host: cheap (no subprocess), never raising.

    A result that differs between two machines is explained by these facts (an AMX CPU,
    a harness that requested tiles or not, a nearly full disk), so every run records them.
    """
    flags = cpu_flags()
    mem = read_meminfo()
    cache = default_cache_dir()

    def free(path: Path) -> int | None:
        try:
            return int(shutil.disk_usage(_existing(path)).free)
        except OSError:
            return None

    return {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
        "amx": has_amx(flags),
        "amx_permission": planned_state(flags),
        "python": platform.python_version(),
        "mem_total_bytes": mem.get("MemTotal"),
        "mem_available_bytes": mem.get("MemAvailable"),
        "disk_free_bytes": {"repo": free(REPO_ROOT), "cache": free(cache)},
        "cache_dir": str(cache),
    }
