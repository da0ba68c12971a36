"""vLLM's model-class cache, filled for a build's architectures before its launches.

vLLM keeps which interfaces a model class implements in ``$VLLM_CACHE_ROOT/modelinfos``;
on a miss its API server spends a cold subprocess (10-12 s here) to find out, once per
build and architecture. The harness gives every build its own cache root
(:func:`vllm_cache_root`: vLLM rewrites the file whenever another version's source
differs), so a fresh machine pays that for every architecture on every release a sweep
or the bug corpus launches. :func:`warm_build` answers all the architectures of the
harness's model geometries in one process of the build's interpreter
(``harness.engine.modelinfo_warm``), once per build: a stamp in the cache root says it
was done. Nothing here is a verdict: a failed warm-up leaves vLLM to inspect at launch.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from harness.names import REPO_ROOT
from harness.server.model_builder import default_cache_dir

MODULE = "harness.engine.modelinfo_warm"
STAMP = "offload-check-modelinfo.json"
TIMEOUT_S = 300.0


def vllm_cache_root(dist: str, version: str) -> Path:
    """The cache root a build's servers get (unless the user sets ``VLLM_CACHE_ROOT``)."""
    if os.environ.get("VLLM_CACHE_ROOT"):
        return Path(os.environ["VLLM_CACHE_ROOT"])
    return default_cache_dir() / "vllm" / f"{dist}-{version}"


# vLLM serves some geometries through its Transformers backend instead of the class
# they name (0.27.1 resolves mistral-swa's MistralForCausalLM to it), and inspects that
# class at launch the same way.
FALLBACKS = ("TransformersForCausalLM",)


def geometry_architectures(models_dir: Path | None = None) -> list[str]:
    """Every architecture the shipped model geometries name (scenarios/models/*.json),
    and the backend classes vLLM may resolve them to (:data:`FALLBACKS`)."""
    found: dict[str, None] = {}
    for path in sorted((models_dir or REPO_ROOT / "scenarios" / "models").glob("*.json")):
        try:
            archs = json.loads(path.read_text()).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            continue
        found.update((str(a), None) for a in archs)
    if found:
        found.update(dict.fromkeys(FALLBACKS))
    return list(found)


def parse_answer(stdout: str) -> dict[str, Any] | None:
    """The warm-up's JSON line (vLLM may log to stdout before it)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "warmed" in value:
                return value
    return None


def warm_build(
    python: str, dist: str, version: str, archs: list[str] | None = None
) -> dict[str, Any]:
    """Fill the build's model-class cache for ``archs`` (the geometries' by default),
    unless its stamp says that was done; what happened, for ``envs.csv`` and the log."""
    archs = geometry_architectures() if archs is None else archs
    root = vllm_cache_root(dist, version)
    stamp = root / STAMP
    try:
        done = json.loads(stamp.read_text())
        if set(archs) <= set(done.get("warmed", [])) | set(done.get("unknown", [])):
            return {"state": "cached", **done}
    except (OSError, ValueError, AttributeError):
        pass
    env = {
        **os.environ,
        "VLLM_CACHE_ROOT": str(root),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    try:
        proc = subprocess.run(
            [python, "-m", MODULE, *archs],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"state": "failed", "why": str(err)[:300]}
    answer = parse_answer(proc.stdout)
    if answer is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"state": "failed", "why": f"exit {proc.returncode}: {tail[:300]}"}
    if not answer.get("failed"):
        root.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(json.dumps(answer, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, stamp)
    return {"state": "warmed", **answer}
