"""Process lifecycle of the launcher, with stand-in servers (no vLLM needed).

A stand-in "interpreter" is a shell script that spawns a child and ignores SIGTERM,
the worst case for teardown; the real-engine tests repeat these promises with vLLM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from harness.server.launcher import ServerSpec


def fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(
        p.status() != psutil.STATUS_ZOMBIE for p in psutil.process_iter() if _pgid(p) == pgid
    )


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


@pytest.fixture(autouse=True)
def no_lock(monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_LOCK", "none")


def test_crash_is_known_at_once_not_at_the_timeout(tmp_path):
    py = fake_python(tmp_path, "echo 'Traceback (most recent call last):'; exit 3\n")
    server = ServerSpec(py, "m").server(tmp_path / "log")
    server.start()
    t0 = time.monotonic()
    ready = server.wait_ready(timeout_s=60, poll_s=0.05)
    server.stop()
    assert ready.state == "exited" and ready.returncode == 3
    assert time.monotonic() - t0 < 5
    assert "Traceback" in (tmp_path / "log").read_text()


def test_timeout_tears_down_a_tree_that_ignores_sigterm(tmp_path):
    py = fake_python(
        tmp_path,
        """
        trap '' TERM
        sh -c "trap '' TERM; sleep 300" &
        sleep 300
    """,
    )
    server = ServerSpec(py, "m").server(tmp_path / "log")
    server.start()
    pgid = server.proc.pid
    assert server.wait_ready(timeout_s=1, poll_s=0.1).state == "timeout"
    server.stop(grace_s=1)
    assert not group_alive(pgid)


def test_sigkilled_harness_takes_its_server_along(tmp_path):
    """The reaper sidecar: no handler runs on SIGKILL, the server must still go."""
    py = fake_python(tmp_path, "trap '' TERM\nsleep 300 &\nsleep 300\n")
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from harness.server.launcher import ServerSpec
        s = ServerSpec({py!r}, "m").server(Path({str(tmp_path / "log")!r}))
        s.start()
        print(s.proc.pid, s._rpc_dir, flush=True)
        time.sleep(300)
    """)
    harness = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OFFLOAD_CHECK_LOCK": "none"},
    )
    pid, scratch = harness.stdout.readline().split()
    pgid = int(pid)
    assert group_alive(pgid) and Path(scratch).is_dir()
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (group_alive(pgid) or Path(scratch).exists()):
        time.sleep(0.2)
    assert not group_alive(pgid)
    assert not Path(scratch).exists()  # the server's ZMQ socket directory goes too


def test_missing_interpreter_is_bad_input(tmp_path):
    from harness.errors import BadInput

    server = ServerSpec(str(tmp_path / "nope" / "python"), "m").server(tmp_path / "log")
    with pytest.raises(BadInput, match="interpreter not found"):
        server.start()


def test_a_dropped_connection_is_blamed_on_a_server_that_exits_just_after(tmp_path):
    """A killed server closes its sockets before it is reapable: the blame must wait."""
    from harness.commands.roundtrip import Endpoint
    from harness.errors import RuntimeFailure

    py = fake_python(tmp_path, "sleep 0.7\nexit 9\n")
    server = ServerSpec(py, "m").server(tmp_path / "log")
    server.start()
    try:
        err = Endpoint(server.url, server).failure("cold", RuntimeError("connection closed"))
    finally:
        server.stop()
    assert isinstance(err, RuntimeFailure)
    assert "server died during the cold phase" in str(err) and "exit code 9" in str(err)


def test_one_argv_builder_and_a_baseline_without_the_connector():
    """Dry-run, launch and baseline share ``ServerSpec.argv``; the baseline only drops
    the connector, keeping the user's extra arguments last."""
    spec = ServerSpec(
        "py",
        "m",
        "served",
        ["--max-model-len", "2048"],
        {"A": "1"},
        {"kv_connector": "OffloadingConnector", "b": 2, "a": 1},
        ["--distributed-executor-backend", "ray"],
    )
    argv = spec.argv(8000)
    assert argv[:9] == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
        "--host", "127.0.0.1", "--port", "8000",
    ]  # fmt: skip
    i = argv.index("--kv-transfer-config")
    assert argv[i + 1] == '{"a": 1, "b": 2, "kv_connector": "OffloadingConnector"}'
    assert argv[-2:] == ["--distributed-executor-backend", "ray"]
    base = spec.without_offload()
    assert "--kv-transfer-config" not in base.argv(8000)
    assert [a for a in argv if a not in ("--kv-transfer-config", argv[i + 1])] == base.argv(8000)
    assert spec.kv_transfer is not None and base.env == spec.env
    server = spec.server(Path("log"), 8000)
    assert server.command() == argv


def test_teardown_does_not_wait_for_a_zombie_nobody_reaps():
    """An orphaned worker re-parented to a subreaper that never reaps it (a test session,
    a systemd user manager, a container's PID 1) is a zombie: gone for teardown. Waiting
    for it to vanish cost every launch the whole 15 s grace under pytest."""
    from harness.server.launcher import _wait_gone

    # A parent that starts a child, lets it exit, and never waits for it.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "c = subprocess.Popen(['true'])\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 10
        while child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.status() == psutil.STATUS_ZOMBIE
        started = time.monotonic()
        _wait_gone([child], timeout_s=30)
        assert time.monotonic() - started < 10
    finally:
        parent.kill()
        parent.wait()
