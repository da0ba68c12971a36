"""Launching ``vllm serve`` as a subprocess, waiting for it, and tearing it down.

Modelled on vLLM's own ``tests/utils.py`` ``RemoteOpenAIServer``, with what a
harness that launches many servers back to back needs on top: an early verdict
the moment the process dies (a crash is known in seconds, not at the timeout),
logs captured per launch, and teardown of the whole process tree whatever
happens, so that no EngineCore or worker ever outlives the harness.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.errors import BadInput, HarnessError
from harness.names import ENV_LEDGER
from harness.server import lanes, launch_timeline
from harness.server.reaper import _start_time
from harness.server.server_lock import server_slot

HOST = "127.0.0.1"
READY_GRACE_S = 15.0  # SIGTERM to SIGKILL for a serving server: time to exit cleanly
STARTING_GRACE_S = 3.0  # the same for one still starting, which ignores SIGTERM
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Every server the harness started and has not torn down yet; the signal and exit
# hooks below use it so that even an unexpected exit leaves no vLLM behind.
_LIVE: set[VllmServer] = set()
# The launch timeline of every server stopped in this process, in order; a run
# directory records those made during its run (harness.results.run_directory).
_FINISHED: list[dict[str, Any]] = []
_ANSWER_PATHS = ("/v1/completions", "/v1/chat/completions")


def finished_launches() -> list[dict[str, Any]]:
    """The timelines (``harness.server.launch_timeline``) of the servers stopped so far."""
    return list(_FINISHED)


def note_answer(url: str) -> None:
    """A completion came back from ``url``: the first one ends its server's launch.

    Every client of a launched server (the round trip's workload, crash-repro's probe,
    stress's driver) posts through ``http_json`` or calls this, so the launch
    timeline's last point needs no hook in each command."""
    for server in list(_LIVE):
        if server.first_answer_s is None and server.port and url.startswith(server.url + "/"):
            server.first_answer_s = time.monotonic() - server.started_at


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            raise BadInput(f"port {port} on {HOST} is busy; pick another or omit --port") from None


@dataclass
class ReadyResult:
    """How a wait for readiness ended."""

    state: str  # "started" | "exited" | "timeout"
    seconds: float
    returncode: int | None = None


@dataclass(frozen=True)
class ServerSpec:
    """What to launch, fixed before launch: the one place a server's argv is built.

    Dry-run output, every launch, the benchmark's bare launch and the GPU rehearsal all
    call ``argv``, so what is printed is what runs. The connector's config is kept apart
    from the other engine arguments so that a baseline is this spec without it
    (``without_offload``), not a finished argv with arguments deleted.
    """

    python: str
    model: str
    served_model_name: str | None = None
    args: list[str] = field(default_factory=list)  # engine arguments before the connector's
    env: dict[str, str] = field(default_factory=dict)  # on top of the harness's environment
    kv_transfer: dict[str, Any] | None = None  # --kv-transfer-config; None: no connector
    tail: list[str] = field(default_factory=list)  # the user's extra engine arguments, last
    # Keep the host backend's content ledger (harness.engine.content_ledger) beside the
    # log: what every chunk held when stored and loaded. Only the harness's backend
    # writes one.
    ledger: bool = False

    def argv(self, port: int | str = "<port>") -> list[str]:
        """The exact argv, as a list: nothing ever goes through a shell."""
        cmd = [self.python, "-m", API_SERVER_MODULE, "--model", self.model]
        cmd += ["--host", HOST, "--port", str(port)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        cmd += self.args
        if self.kv_transfer is not None:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer, sort_keys=True)]
        return cmd + self.tail

    def launch_key(self) -> str:
        """Identity of the server this spec launches: two specs with one key start the
        same processes with the same inputs, so one launch can serve both."""
        return json.dumps([self.argv(), sorted(self.env.items())])

    def without_offload(self) -> ServerSpec:
        """The same server with the connector off (a round trip's baseline)."""
        return replace(self, kv_transfer=None, args=list(self.args), tail=list(self.tail))

    def server(self, log_path: Path, port: int | None = None) -> VllmServer:
        """The one way to get a server from a spec."""
        return VllmServer(self, log_path, port)


@dataclass
class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process and everything it spawns."""

    spec: ServerSpec
    log_path: Path
    port: int | None = None

    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    started_at: float = field(default=0.0, init=False)
    ready: bool = field(default=False, init=False)  # answered /health at least once
    # The launch timeline's harness-side points, in seconds after the spawn.
    spawned_wall: float = field(default=0.0, init=False)
    health_s: float | None = field(default=None, init=False)
    first_answer_s: float | None = field(default=None, init=False)
    timeline: dict[str, Any] | None = field(default=None, init=False)  # set at stop
    _log: Any = field(default=None, init=False, repr=False)
    _slot: Any = field(default=None, init=False, repr=False)
    _reaper: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _rpc_dir: str | None = field(default=None, init=False, repr=False)
    cores: tuple[int, ...] | None = field(default=None, init=False)  # its lane's (--jobs)

    def __hash__(self) -> int:
        return id(self)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return self.spec.argv(self.port if self.port is not None else 0)

    @property
    def ledger_dir(self) -> Path:
        """Where this server's content ledger goes: beside its log (``server.ledger/``)."""
        return self.log_path.with_name(f"{self.log_path.stem}.ledger")

    def start(self) -> None:
        if _STOPPING[0]:
            raise KeyboardInterrupt("the run is stopping: no new server")
        if self.port is None:
            self.port = free_port()
        else:
            check_port_free(self.port)
        python = self.spec.python
        if not (os.path.isfile(python) or os.sep not in python):
            raise BadInput(f"interpreter not found: {python}")
        env = {**os.environ, **self.spec.env}
        if self.spec.ledger:
            shutil.rmtree(self.ledger_dir, ignore_errors=True)  # this server's alone
            env[ENV_LEDGER] = str(self.ledger_dir)
        cores = self.cores = lanes.current()
        if cores is not None:
            # A lane of a run split by --jobs: vLLM's OpenMP threads on the lane's cores.
            env[lanes.OMP_BIND] = lanes.omp_bind(cores, lanes.ranks_of(env.get(lanes.OMP_BIND)))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        slot = server_slot()
        slot.__enter__()  # may wait for another run's server, or refuse to (--no-wait)
        self._slot = slot
        self._log = self.log_path.open("wb")
        if "VLLM_RPC_BASE_PATH" not in env:
            # vLLM's ZMQ sockets go to /tmp/<uuid> by default and outlive a killed server
            # (thousands after a test run); a directory per server is removed at stop.
            self._rpc_dir = tempfile.mkdtemp(prefix="oc-rpc-")
            env["VLLM_RPC_BASE_PATH"] = self._rpc_dir
        self.started_at = time.monotonic()
        self.spawned_wall = time.time()
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                # Own process group: Ctrl-C in the terminal reaches only the harness,
                # which then tears the whole group down in order.
                start_new_session=True,
            )
        except OSError as err:
            self._log.close()
            if self._rpc_dir is not None:
                shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._release_slot()
            raise BadInput(f"cannot launch {python}: {err.strerror}") from None
        _LIVE.add(self)
        if cores is not None:
            # Before the API server spawns EngineCore (after ~10 s of imports): every
            # process of the server inherits the mask.
            with contextlib.suppress(OSError):
                lanes.pin_process(self.proc.pid, cores)
        self._reaper = _start_reaper(self.proc.pid, self._rpc_dir)

    def alive(self, grace_s: float = 0.0) -> bool:
        """Whether the server process runs; ``grace_s`` waits that long for it to exit.

        A killed server closes its sockets before it becomes a zombie, so a client that
        just saw its connection drop must give the exit a moment to become visible.
        """
        if self.proc is None:
            return False
        if grace_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        return self.proc.poll() is None

    def wait_ready(
        self,
        timeout_s: float,
        poll_s: float = 0.2,
        on_tick: Callable[[float], None] | None = None,
    ) -> ReadyResult:
        """Poll ``/health`` until 200, the process exits, or the timeout passes."""
        assert self.proc is not None, "start() first"
        deadline = self.started_at + timeout_s
        while True:
            elapsed = time.monotonic() - self.started_at
            code = self.proc.poll()
            if code is not None:
                return ReadyResult("exited", elapsed, code)
            if self._health_ok():
                self.ready = True
                self.health_s = time.monotonic() - self.started_at
                return ReadyResult("started", self.health_s)
            if time.monotonic() >= deadline:
                return ReadyResult("timeout", elapsed)
            if on_tick is not None:
                on_tick(elapsed)
            time.sleep(poll_s)

    def _health_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def request(
        self, path: str, payload: dict[str, Any] | None = None, timeout_s: float = 120.0
    ) -> Any:
        """POST (or GET without payload) JSON to the server; raises HarnessError on failure."""
        return http_json(f"{self.url}{path}", payload, timeout_s)

    def stop(self, grace_s: float | None = None) -> int | None:
        """Terminate the process group, then kill whatever is left, then reap.

        The grace before the kill is 15 s for a server that answered ``/health``, but
        only ``STARTING_GRACE_S`` for one that never did: vLLM's API server ignores a
        SIGTERM while its engine starts, so a longer wait only delays the kill (a
        startup-timeout verdict or a Ctrl-C during startup spent 15 s here).
        """
        if grace_s is None:
            grace_s = READY_GRACE_S if self.ready else STARTING_GRACE_S
        proc = self.proc
        if proc is None:
            self._release_slot()
            return None
        stop_requested = time.monotonic()
        ended = "exited" if proc.poll() is not None else "stopped"
        try:
            descendants = _descendants(proc.pid)
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
            # Children may linger after the API server exits (or may have left the
            # group); kill the group and every process we saw under it.
            _signal_group(proc.pid, signal.SIGKILL)
            for child in descendants:
                with contextlib.suppress(Exception):
                    child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
            _wait_gone(descendants, grace_s)
        finally:
            if self._reaper is not None:
                with contextlib.suppress(OSError):
                    self._reaper.kill()
                self._reaper.wait()
                self._reaper = None
            _LIVE.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._rpc_dir is not None:
                shutil.rmtree(self._rpc_dir, ignore_errors=True)
                self._rpc_dir = None
            self._release_slot()
            self._record_timeline(ended, stop_requested)
        return proc.returncode

    def _record_timeline(self, ended: str, stop_requested: float) -> None:
        """Read this launch's timeline from its log, once, after the last process is gone."""
        if self.timeline is not None:
            return
        now = time.monotonic()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        self.timeline = launch_timeline.build(
            lines,
            log=str(self.log_path),
            spawned_wall=self.spawned_wall,
            ended=ended,
            health_s=self.health_s,
            first_answer_s=self.first_answer_s,
            stopped_s=now - self.started_at,
            teardown_s=now - stop_requested,
            cores=self.cores,
        ).record()
        _FINISHED.append(self.timeline)

    def _release_slot(self) -> None:
        if self._slot is not None:
            slot, self._slot = self._slot, None
            slot.__exit__(None, None, None)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpRefusal(HarnessError):
    """The server answered with an HTTP error: ``status`` and the start of its body."""

    def __init__(self, url: str, status: int, detail: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {detail}")
        self.status, self.detail = status, detail


def http_json(url: str, payload: dict[str, Any] | None = None, timeout_s: float = 120.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json"},
        method="GET" if payload is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as err:
        detail = err.read()[:300].decode(errors="replace")
        raise HttpRefusal(url, err.code, detail) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise HarnessError(f"{url}: no answer ({reason})") from None
    if payload is not None and url.endswith(_ANSWER_PATHS):
        note_answer(url)
    ctype = resp.headers.get("Content-Type", "")
    if "json" in ctype:
        return json.loads(body)
    return body.decode(errors="replace")


def http_post(url: str, timeout_s: float = 60.0) -> tuple[int, str]:
    """POST with no body (an admin call): the status and body as they came, errors
    included, since a refusal is a fact to judge, not an exception; no answer at all is
    a ``HarnessError``."""
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()[:2000].decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()[:2000].decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
        raise HarnessError(f"{url}: no answer ({getattr(err, 'reason', err)})") from None


def _start_reaper(server_pgid: int, scratch: str | None = None) -> subprocess.Popen[bytes] | None:
    """The sidecar that kills the server group if this process dies without cleanup."""
    me = os.getpid()
    started = _start_time(me)
    if started is None:  # no /proc: nothing to watch with; teardown relies on handlers
        return None
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.server.reaper",
            str(me),
            started,
            str(server_pgid),
            *([scratch] if scratch else []),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil ships with vLLM's environments
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _wait_gone(procs: list[Any], timeout_s: float, poll_s: float = 0.05) -> None:
    """Wait until each process is gone or a zombie, at most ``timeout_s``.

    A zombie holds nothing (memory, sockets, the KV tier are released); it only awaits
    its parent's ``wait``. Orphans of a killed EngineCore are re-parented to the nearest
    subreaper, which may never reap them: a test session (``tests/conftest.py``), a
    systemd user manager, or a container whose PID 1 is a shell. ``psutil.wait_procs``
    counts such a zombie as running, so every teardown used to sit out the whole grace
    (15.4 s per launch measured under pytest, 1.5 s without a subreaper). Zombies that
    are this process's own children are reaped here.
    """
    if not procs:
        return
    import psutil

    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    while pending:
        still = []
        for proc in pending:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
                elif proc.ppid() == me:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(proc.pid, os.WNOHANG)
            except psutil.Error:
                continue  # gone (or reaped between the two calls)
        pending = still
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(poll_s)


def stop_all() -> None:
    """Tear down every live server; used on SIGTERM/SIGHUP and at interpreter exit."""
    for server in list(_LIVE):
        server.stop(grace_s=5.0)


# Set when a run split into lanes is interrupted: Ctrl-C reaches only the main thread,
# so the lanes' threads learn it here; a launch refused this way ends their work.
_STOPPING: list[bool] = [False]


def stop_lanes() -> None:
    """Interrupt a run's lanes (threads): no launch starts any more, and every live
    server is torn down, so a lane blocked on its server's answer returns."""
    _STOPPING[0] = True
    stop_all()


def stopping() -> bool:
    return _STOPPING[0]


def resume_launches() -> None:
    """Undo :func:`stop_lanes` (a later run in the same process, a test)."""
    _STOPPING[0] = False


def install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so ``with`` blocks tear servers down."""

    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, _raise)


import atexit  # noqa: E402  (registered last, after stop_all exists)

atexit.register(stop_all)
