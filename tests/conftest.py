"""Shared fixtures: paths, and the guarantee that no vLLM process outlives a test."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
STOCK_PY = ROOT / ".venv-stock" / "bin" / "python"
CLI = [str(ROOT / ".venv" / "bin" / "offload-check")]


def vllm_processes() -> list[psutil.Process]:
    """Every process on the machine that looks like a vLLM server or engine."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "name"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            name = proc.info["name"] or ""
        except (psutil.Error, TypeError):
            continue
        if proc.pid == os.getpid():
            continue
        if "vllm.entrypoints" in cmd or name.startswith("VLLM::") or cmd.startswith("VLLM::"):
            found.append(proc)
    return found


@pytest.fixture(autouse=True)
def no_vllm_left_behind(request: pytest.FixtureRequest):
    """After every test, no vLLM process it started may be left (the launcher's promise).

    Processes that existed before the test (another developer's server) are not ours.
    """
    before = {p.pid for p in vllm_processes()}
    yield
    left = [p for p in vllm_processes() if p.pid not in before and p.is_running()]
    if left:
        psutil.wait_procs(left, timeout=10)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"vLLM processes left behind: {[p.pid for p in left]}"


@pytest.fixture
def root() -> Path:
    return ROOT
