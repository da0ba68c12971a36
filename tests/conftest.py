"""Shared fixtures: paths, and the guarantee that no vLLM process outlives a test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
STOCK_PY = ROOT / ".venv-stock" / "bin" / "python"
# The environment under test's own command line: the interpreter running pytest's (the
# lowest-direct environment in `make test-floors`), else the checkout's .venv.
_OWN_CLI = Path(sys.executable).parent / "offload-check"
CLI = [str(_OWN_CLI if _OWN_CLI.is_file() else ROOT / ".venv" / "bin" / "offload-check")]


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


# Servers a module fixture shares between tests (tests/integration/test_shared_server_engine.py):
# they and their engine processes outlive single tests by design, and are checked when
# the fixture stops them.
SHARED_SERVER_PIDS: set[int] = set()


def _of_shared_server(proc: psutil.Process) -> bool:
    try:
        chain = [proc, *proc.parents()]
    except psutil.Error:
        return False
    return any(p.pid in SHARED_SERVER_PIDS for p in chain)


@pytest.fixture(autouse=True)
def no_vllm_left_behind():
    """After every test, no vLLM process it started may be left (the launcher's promise)."""
    yield
    left = [p for p in our_vllm_processes() if not _of_shared_server(p)]
    if left:
        psutil.wait_procs(left, timeout=15)
        left = [p for p in our_vllm_processes() if not _of_shared_server(p)]
    assert not left, f"vLLM processes left behind: {[p.pid for p in left]}"


def run_cli(
    results: Path, command: str, *args: str, timeout: float = 1800
) -> tuple[int, Path, str]:
    """Run one offload-check command into an empty results dir; (exit code, run dir, output)."""
    proc = subprocess.run(
        [*CLI, command, "--results-dir", str(results), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    runs = sorted(p for p in results.iterdir() if p.is_dir())
    assert len(runs) == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, runs[0], proc.stdout + proc.stderr


def descendant_vllm(proc: subprocess.Popen) -> list[psutil.Process]:
    """The vLLM processes a harness process started: its descendants only, so a server
    anything else runs on the machine (another terminal, a concurrent test session) is
    never mistaken for, or killed as, the test's own."""
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in kids if _is_vllm(p)]


def wait_for_engine(proc: subprocess.Popen, timeout: float = 120) -> list[psutil.Process]:
    """The harness's vLLM processes, once its server has spawned its EngineCore."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        ours = descendant_vllm(proc)
        if any(_is_engine(p) for p in ours):
            return ours
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the server never spawned its engine (harness exit code {proc.poll()})")


def _is_engine(proc: psutil.Process) -> bool:
    """An EngineCore (or worker): vLLM renames them ``VLLM::...``; a process may exit
    between being listed and being asked its name, which is not an engine."""
    try:
        return proc.name().startswith("VLLM::") or proc.cmdline()[:1] == ["VLLM::EngineCore"]
    except (psutil.Error, IndexError):
        return False


# --- test tiers and the launch budget ---------------------------------------------------
# Server launches are what a tier costs (30-90 s each on 2 cores), so each engine test
# declares its own with @pytest.mark.launches(n), and module fixtures that several tests
# share declare theirs here (counted once however many tests use them). The totals are
# printed after collection and kept equal to docs/development.md's table by
# tests/unit/repo/test_tiers.py.
FIXTURE_LAUNCHES: dict[str, int] = {
    "small_chunk_matrix": 3,  # crash-repro on llama4-small-chunk, connector on (+1 on AMX)
    # the whole `make crash-repro` (+2 on AMX hosts): 20 rows, the two small models'
    # stock+fix controls served by their stock controls' launches (the same server);
    # Scout's and Maverick's narrow layouts on stock and current only
    "default_matrix": 18,
    "clean_run": 2,  # roundtrip --baseline: the connector server and the baseline server
    "subset": 2,  # matrix: MLA and Gemma 3 sliding window on stock
    "subset_current": 2,  # the same two on current (nightly)
    "rest_of_matrix": 8,  # matrix: the other four geometries x stock/current
    "shared_server": 1,  # one server for the attach-mode tests (client-side variations)
}
LAUNCH_SUMMARY = "offload-check: {n} server launches in {tests} tests"


def _shared_fixtures(item: pytest.Item) -> set[str]:
    """Shared fixtures a test uses: by name, or named by a parameter value (tests that
    take one of several fixtures through ``request.getfixturevalue``)."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names.update(v for v in callspec.params.values() if isinstance(v, str))
    return names & FIXTURE_LAUNCHES.keys()


# A fixture whose rows another's run holds, when a session runs both: it reads them there
# (tests/integration/test_crash_repro_engine.py's small_chunk_matrix).
SERVED_BY = {"small_chunk_matrix": "default_matrix"}


def launch_count(items: list[pytest.Item]) -> int:
    """Server launches the selected tests make (on a host without AMX)."""
    own = 0
    shared: set[str] = set()
    for item in items:
        marker = item.get_closest_marker("launches")
        if marker is not None:
            own += int(marker.args[0])
        shared |= _shared_fixtures(item)
    served = {f for f, by in SERVED_BY.items() if by in shared}
    return own + sum(FIXTURE_LAUNCHES[f] for f in shared - served)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An engine test that declares no launches would make the budget silently wrong; a
    weekly test not marked nightly would run in the PR tier (``-m "not nightly"``)."""
    bad = [
        i.nodeid
        for i in items
        if i.get_closest_marker("engine")
        and i.get_closest_marker("launches") is None
        and not _shared_fixtures(i)
    ]
    if bad:
        raise pytest.UsageError(f"engine tests without @pytest.mark.launches(n): {bad}")
    loose = [
        i.nodeid
        for i in items
        if i.get_closest_marker("weekly") and i.get_closest_marker("nightly") is None
    ]
    if loose:
        raise pytest.UsageError(f"weekly tests not marked nightly too: {loose}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With pytest-xdist (`make test`), every engine test runs on one worker, in collection
    order, so module fixtures are shared and two servers never overlap (the machine-wide
    server lock would serialise them anyway, but a test waiting for the lock would be timed
    as if its server were slow); the unit tests, by module, fill the other workers.

    A scheduler of our own rather than ``--dist loadgroup``: xdist 3.8 marks a group by
    rewriting ``item._nodeid``, which pytest 9 no longer reads, so every group was ignored
    and engine tests ran side by side.
    """
    from xdist.scheduler import LoadScopeScheduling

    class EngineTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/integration/"):
                return "engine"
            return nodeid.rsplit("::", 1)[0]

    return EngineTestsTogether(config, log)


TIERS_SUMMARY = "offload-check tiers: pr={pr} nightly={nightly} weekly={weekly}"

# Items a -m expression deselected: the nightly count is over everything collected.
_DESELECTED: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED.extend(items)


def pytest_report_collectionfinish(
    config: pytest.Config, start_path: Path, items: list[pytest.Item]
) -> list[str]:
    """The selection's launches, and each tier's out of what was collected (one collection
    gives tests/unit/repo/test_tiers.py every tier's number)."""
    collected = [*items, *_DESELECTED]
    pr = [i for i in collected if i.get_closest_marker("nightly") is None]
    nightly = [i for i in collected if i.get_closest_marker("weekly") is None]
    return [
        LAUNCH_SUMMARY.format(n=launch_count(items), tests=len(items)),
        TIERS_SUMMARY.format(
            pr=launch_count(pr), nightly=launch_count(nightly), weekly=launch_count(collected)
        ),
    ]
