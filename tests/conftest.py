"""Shared fixtures: paths, and the guarantee that no vLLM process outlives a test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
STOCK_PY = ROOT / ".venv-stock" / "bin" / "python"
CLI = [str(ROOT / ".venv" / "bin" / "offload-check")]


def _become_subreaper() -> None:
    """Orphans of anything this test session starts are re-parented to it, not to init.

    That makes "left behind" precise: a vLLM process descending from the test session
    after a test is a leak, whatever other servers run on the machine.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


_become_subreaper()


def _is_vllm(proc: psutil.Process) -> bool:
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return False
    return "vllm.entrypoints" in cmd or name.startswith("VLLM::") or cmd.startswith("VLLM::")


def vllm_processes() -> list[psutil.Process]:
    """Every process on the machine that looks like a vLLM server or engine."""
    return [p for p in psutil.process_iter() if p.pid != os.getpid() and _is_vllm(p)]


def our_vllm_processes() -> list[psutil.Process]:
    """vLLM processes descending from this test session (orphans included)."""
    _reap()
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and _is_vllm(p):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@pytest.fixture(autouse=True)
def no_vllm_left_behind():
    """After every test, no vLLM process it started may be left (the launcher's promise)."""
    yield
    left = our_vllm_processes()
    if left:
        psutil.wait_procs(left, timeout=15)
        left = our_vllm_processes()
    assert not left, f"vLLM processes left behind: {[p.pid for p in left]}"


def run_cli(results: Path, command: str, *args: str,
            timeout: float = 1800) -> tuple[int, Path, str]:
    """Run one offload-check command into an empty results dir; (exit code, run dir, output)."""
    proc = subprocess.run([*CLI, command, "--results-dir", str(results), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    runs = sorted(p for p in results.iterdir() if p.is_dir())
    assert len(runs) == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, runs[0], proc.stdout + proc.stderr


def wait_for_engine(before: set[int], proc: subprocess.Popen, timeout: float = 120
                    ) -> list[psutil.Process]:
    """The new vLLM processes, once the server has spawned its EngineCore."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ours = [p for p in vllm_processes() if p.pid not in before]
        if any(p.name().startswith("VLLM::") for p in ours):
            return ours
        time.sleep(0.5)
    proc.kill()
    pytest.fail("the server never spawned its engine")
