"""The release the GPU nightly installs (its pin read from the Makefile), rehearsed in an
environment of its own with every nightly launch and seeded rejection, and the record of
that rehearsal checked in (``tests/fixtures/gpu-rehearsal-record.json``): a pin changed
without rehearsing the new release fails the unit tests, never skipped.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.names import REPO_ROOT
from harness.results.run_directory import read_json_object
from harness.tools.gpu_rehearsal.launch import (
    STAGES,
    PlannedLaunch,
    Rehearsal,
    RehearsalError,
    mismatches,
    uses_vllm_offload_spec,
)
from harness.tools.gpu_rehearsal.planning import plan_command
from harness.tools.gpu_rehearsal.seeded import judge_seeded, seeded_launches
from harness.tools.gpu_rehearsal.worker import is_this_interpreter, rehearse_on, retarget
from harness.tools.release_watch import makefile_pin

RECORD = REPO_ROOT / "tests" / "fixtures" / "gpu-rehearsal-record.json"
# The nightly's commands that launch servers (tests/unit/tools/test_gpu_rehearsal.py keeps this
# equal to what .github/workflows/nightly-gpu.yml and .buildkite/nightly.yml run).
NIGHTLY_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("crash-repro", "--results-dir", "results"),
    ("roundtrip", "--scenario", "scenarios/scout-fp8-tp4.toml", "--tp", "4"),
    ("roundtrip", "--scenario", "scenarios/roundtrip-disk.toml", "--results-dir", "results"),
    ("roundtrip", "--scenario", "scenarios/roundtrip-restart.toml", "--results-dir", "results"),
)
SCOUT_COMMAND = NIGHTLY_COMMANDS[1]


def nightly_pin(root: Path = REPO_ROOT) -> tuple[str, str]:
    """(distribution, version) ``make setup GPU=1`` installs as ``current``: the GPU
    nightly's vLLM (the CI files run ``make setup GPU=1``)."""
    return makefile_pin("GPU=1", "the GPU nightly's vLLM", root)


def nightly_env_python(
    *,
    create: bool = False,
    on_step: Callable[[str], None] | None = None,
    release: str | None = None,
) -> str:
    """The interpreter of the nightly release's environment (``build_envs``:
    ``vllm-<pin>`` under ``envs_dir()``), or of ``release`` of the same distribution
    (the release watch's newer one); made when ``create``, else it must exist.
    Raises HarnessError saying how to make it."""
    from harness.server import build_envs, release_envs

    dist, version = nightly_pin()
    version = release or version
    name = release_envs.env_name(dist, version)
    if not create:
        path = release_envs.envs_dir() / name
        if release_envs.read_stamp(path) is None:
            raise HarnessError(
                f"no environment of {dist}=={version} (the GPU nightly's vLLM) at {path}: "
                "`.venv/bin/python -m harness.tools.gpu_rehearsal --nightly-release` makes it "
                "(about 10 GB, CUDA torch from PyPI)"
            )
        return str(path / "bin" / "python")
    status = build_envs.ensure_env(dist, version, on_step=on_step)
    if status.python is None:
        raise HarnessError(f"{dist}=={version} cannot be installed here: {status.reason}")
    return status.python


@dataclass
class ReleaseRehearsal:
    """The nightly's launches and the seeded rejections on one build."""

    dist: str
    release: str
    python: str
    build: dict[str, Any]
    launches: list[tuple[PlannedLaunch, Rehearsal | RehearsalError]]
    seeded: dict[str, dict[str, Any]]
    seconds: float
    # How the environment was made (release_envs' stamp: seconds, disk), when it was.
    environment: dict[str, Any] = field(default_factory=dict)
    # Results of extra launches asked for alongside, in their order.
    extra: list[Rehearsal | RehearsalError] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        out = []
        for launch, res in self.launches:
            if isinstance(res, RehearsalError):
                out.append(str(res))
                continue
            want = list(STAGES) if uses_vllm_offload_spec(launch) else list(STAGES[:3])
            if res.passed != want:
                out.append(f"{launch.label}: passed {res.passed}, not {want} ({res.stopped})")
            out += [
                f"{launch.label}: {m}"
                for m in mismatches(launch.intended, res.parsed)
                + mismatches(launch.intended, res.engine)
            ]
        out += [
            f"seeded rejection {name} not caught at {v['stage']}: {v['observed']}"
            for name, v in self.seeded.items()
            if not v["caught"]
        ]
        return out

    def record(self) -> dict[str, Any]:
        """What is checked in (RECORD): the release, when, and what passed."""

        def entry(launch: PlannedLaunch, res: Rehearsal | RehearsalError) -> dict[str, Any]:
            if isinstance(res, RehearsalError):
                return {"label": launch.label, "rejected": f"{res.stage}: {res.message}"}
            out: dict[str, Any] = {
                "label": launch.label,
                "passed": res.passed,
                "stopped": res.stopped,
            }
            if res.offload is not None:
                out["offload"] = dataclasses.asdict(res.offload)
            return out

        return {
            "dist": self.dist,
            "release": self.release,
            "recorded": datetime.date.today().isoformat(),
            "build": self.build,
            "environment": self.environment,
            "seconds": round(self.seconds, 1),
            "launches": [entry(launch, res) for launch, res in self.launches],
            "seeded_rejections": self.seeded,
            "problems": self.problems,
        }


def rehearse_release(
    python: str,
    *,
    dist: str = "",
    release: str = "",
    root: Path = REPO_ROOT,
    extra: Sequence[PlannedLaunch] = (),
) -> ReleaseRehearsal:
    """Every launch the nightly's commands make with the ``current`` build, and every
    seeded rejection, through ``python``'s vLLM (one worker process, every stage);
    ``extra`` launches go along in the same process (their results in ``.extra``)."""

    from harness.server import release_envs

    t0 = time.monotonic()
    launches: list[PlannedLaunch] = []
    for command in NIGHTLY_COMMANDS:
        launches += [
            retarget(x, python)
            for x in plan_command(command, root)
            if is_this_interpreter(x.python)
        ]
    scout = next(x for x in launches if x.label.startswith("roundtrip "))
    seeded = seeded_launches(scout)
    extras = [retarget(x, python) for x in extra]
    results, build = rehearse_on(python, [*launches, *seeded, *extras])
    n, m = len(launches), len(launches) + len(seeded)
    stamp = release_envs.read_stamp(Path(python).parent.parent) or {}
    return ReleaseRehearsal(
        dist or str(build.get("dist", "")),
        release or str(build.get("vllm_version", "")),
        python,
        build,
        list(zip(launches, results[:n], strict=True)),
        judge_seeded(results[n:m]),
        time.monotonic() - t0,
        {
            k: stamp[k]
            for k in ("requirement", "seconds", "disk_bytes", "apparent_bytes")
            if k in stamp
        },
        results[m:],
    )


def write_record(rehearsal: ReleaseRehearsal, path: Path = RECORD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rehearsal.record(), indent=2, sort_keys=True) + "\n")
    return path


def read_record(path: Path = RECORD) -> dict[str, Any]:
    if not path.is_file():
        raise HarnessError(f"no rehearsal record at {path}")
    return read_json_object(path, "a rehearsal record")
