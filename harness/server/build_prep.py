"""One build made ready for its servers: its environment and vLLM's model-class cache.

A sweep (and the bug corpus) prepares each build before its first launch: the release
environment (``harness.server.build_envs``: a uv install with bytecode, an import
check) and vLLM's model-class cache for the harness's geometries
(``harness.server.modelinfo``). :func:`prepare` does both in the caller's process;
``python -m harness.server.build_prep`` does it in a process of its own and prints the
outcome as one JSON line, which is how a sweep prepares the next build while the current
one's servers run (``harness.commands.sweep.ahead``). Such a worker lowers its own CPU
priority first (its children inherit it) and ends its process group if the harness that
started it is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.errors import HarnessError
from harness.server import build_envs, interpreters
from harness.server.modelinfo import warm_build

# How much lower than the servers a background preparation runs (nice(1)'s default).
NICENESS = 10
PARENT_POLL_S = 0.5

Step = Callable[[str], None]


@dataclass
class Prepared:
    """A build made ready: its environment's status and what was done for it."""

    status: Any  # harness.server.build_envs.EnvStatus
    warm: str = ""  # the model-class cache, as a progress line ("" when not asked)
    steps: list[str] = field(default_factory=list)
    ahead: bool = False  # prepared while the build before it ran

    def record(self) -> dict[str, Any]:
        return {
            "status": dataclasses.asdict(self.status),
            "warm": self.warm,
            "steps": self.steps,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Prepared:
        return cls(build_envs.EnvStatus(**data["status"]), str(data["warm"]), list(data["steps"]))


def prepare(
    spec: str,
    label: str,
    *,
    dist: str,
    warm: bool,
    uv: str | None = None,
    torch_index: str | None = None,
    on_step: Step | None = None,
) -> Prepared:
    """Make (or reuse) the environment of build ``spec`` (``build_envs.ensure_build``)
    and, when ``warm``, fill vLLM's model-class cache for it. Never raises for the
    build's own faults: an unusable build is an ``unavailable`` status with the reason."""
    steps: list[str] = []

    def step(message: str) -> None:
        steps.append(message)
        if on_step is not None:
            on_step(message)

    try:
        status = build_envs.ensure_build(
            spec, dist=dist, uv=uv, torch_index=torch_index, on_step=step
        )
    except HarnessError as err:
        status = build_envs.EnvStatus(label, None, "unavailable", str(err))
    line = ""
    if warm and status.ok and status.python is not None:
        line = warm_model_classes(status.python, step)
    return Prepared(status, line, steps)


def warm_model_classes(python: str, on_step: Step) -> str:
    """vLLM's model-class cache for every architecture of the harness's geometries, in
    one process before the build's first launch (``harness.server.modelinfo``): on a
    fresh machine each architecture would otherwise cost every release a cold
    subprocess at its first launch. A failure only loses the saving. Returns the line
    saying what happened ("" when the build cannot be asked)."""
    try:
        env = interpreters.probe(python)
    except HarnessError:
        return ""
    if not env.vllm_version or not env.vllm_dist:
        return ""
    on_step("vLLM's model-class cache")
    got = warm_build(python, env.vllm_dist, env.vllm_version)
    if got["state"] == "warmed":
        what = f"{len(got.get('warmed', []))} architectures inspected in {got.get('seconds')} s"
    elif got["state"] == "cached":
        what = "already filled"
    else:
        what = f"not filled ({got.get('why')}); vLLM inspects at launch"
    return f"vLLM's model-class cache: {what}"


# --- the background worker ------------------------------------------------------------------


def worker_argv(
    spec: str, label: str, *, dist: str, warm: bool, uv: str | None, torch_index: str | None
) -> list[str]:
    """The command that prepares one build in a process of its own."""
    request = {
        "spec": spec,
        "label": label,
        "dist": dist,
        "warm": warm,
        "uv": uv,
        "torch_index": torch_index,
        "parent": os.getpid(),
    }
    return [sys.executable, "-m", "harness.server.build_prep", json.dumps(request)]


def _watch_parent(parent: int) -> None:
    """End this worker's process group (uv, compile workers, vLLM imports) once the
    harness that started it is gone: nothing prepared for nobody keeps running."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    request = json.loads(argv[0])
    # Below the servers: a launch's imports and a run's requests come first.
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    threading.Thread(target=_watch_parent, args=(int(request["parent"]),), daemon=True).start()
    prepared = prepare(
        request["spec"],
        request["label"],
        dist=request["dist"],
        warm=bool(request["warm"]),
        uv=request["uv"],
        torch_index=request["torch_index"],
    )
    print(json.dumps(prepared.record()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
