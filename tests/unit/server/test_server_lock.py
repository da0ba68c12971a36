"""The machine-wide server lock with a real second process holding the flock: the holder
is recorded and named, a waiting run says so once, ``--no-wait`` and
``OFFLOAD_CHECK_LOCK_WAIT=0`` refuse with exit 3, and ``doctor`` warns (issue 23)."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import app as cli
from harness.commands.doctor import host, preflight
from harness.errors import ExitCode, HarnessError
from harness.server import server_lock
from tests.conftest import ROOT

HOLD = """
import sys, time
from harness.server.server_lock import server_slot
with server_slot():
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
"""


@pytest.fixture
def lock(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "server.lock"
    monkeypatch.setenv("OFFLOAD_CHECK_LOCK", str(path))
    monkeypatch.delenv("OFFLOAD_CHECK_LOCK_WAIT", raising=False)
    monkeypatch.setattr(server_lock, "_ANNOUNCED", set())
    server_lock.set_lock_wait(None)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield path
    server_lock.set_lock_wait(None)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def holder(seconds: float = 30.0) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock (the path comes through the environment)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(seconds)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_the_holder_is_recorded_and_named(lock):
    assert server_lock.lock_holder() is None  # no file yet
    with holder() as proc:
        record = json.loads(lock.read_text())
        assert record["pid"] == proc.pid
        found = server_lock.lock_holder()
        assert found is not None
        assert found.pid == proc.pid
        assert found.since == record["since"]
        assert f"pid {proc.pid} since " in found.text()
    assert server_lock.lock_holder() is None  # released when its holder is gone


def test_released_lock_forgets_its_holder(lock):
    with server_lock.server_slot():
        assert json.loads(lock.read_text())["pid"] > 0
    assert lock.read_text() == ""
    assert server_lock.lock_holder() is None


def test_no_wait_refuses_naming_the_holder(lock):
    with holder() as proc:
        server_lock.set_lock_wait(False)
        t0 = time.monotonic()
        with pytest.raises(HarnessError) as err, server_lock.server_slot():
            pass
        assert time.monotonic() - t0 < 2
        assert err.value.exit_code == ExitCode.RUNTIME
        assert f"held by pid {proc.pid}" in str(err.value)


def test_env_var_refuses_too(lock, monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_LOCK_WAIT", "0")
    with holder() as proc, pytest.raises(HarnessError, match=f"pid {proc.pid}"):
        server_lock.refuse_if_lock_busy()
    server_lock.refuse_if_lock_busy()  # free: nothing to refuse


def test_a_waiting_run_says_so_once(lock, capsys):
    with holder(seconds=1.5) as proc:
        for _ in range(2):  # the second launch finds the lock free
            with server_lock.server_slot():
                assert json.loads(lock.read_text())["pid"] != proc.pid
        err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"offload-check: waiting for the server lock {lock}")
    assert f"held by pid {proc.pid} since" in lines[0]


def test_doctor_warns_while_a_run_holds_it(lock):
    assert host.check_lock(str(lock), None).status == "ok"
    assert host.check_lock(None, None).status == "ok"
    with holder() as proc:
        check = preflight._lock_check()
        assert check.status == "warn"
        assert f"pid {proc.pid}" in check.detail
        assert "--no-wait" in check.fix
    assert preflight._lock_check().status == "ok"


def test_cli_no_wait_exits_3_in_one_line_before_any_run(lock, tmp_path):
    results = tmp_path / "results"
    out, err = io.StringIO(), io.StringIO()
    with holder() as proc, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run(
            ["crash-repro", "--variant", "current", "--no-wait", "--results-dir", str(results)]
        )
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert code == 3
    assert len(lines) == 1, err.getvalue()
    assert f"held by pid {proc.pid}" in lines[0]
    assert not results.exists()
    assert server_lock.lock_wait()  # --no-wait held for that command only


def test_a_holder_that_wrote_nothing_is_found_in_proc_locks(lock):
    """An older harness holds the lock without recording itself: /proc/locks names it."""
    script = (
        "import fcntl, sys, time\n"
        "fh = open(sys.argv[1], 'a+')\n"
        "fcntl.flock(fh, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        found = server_lock.lock_holder()
        assert found is not None
        if Path("/proc/locks").exists():
            assert found.pid == proc.pid
            assert found.since is not None
    finally:
        proc.kill()
        proc.wait(timeout=10)
