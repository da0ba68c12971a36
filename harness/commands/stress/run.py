"""Running a stress plan: the server under test, then the connector-off reference, one
after the other, with every request, metric and log line kept as the run goes.

The run under test sends the plan (``harness.commands.stress.driver``) while a sampler reads the
metrics twice a second (the timeline's stores and loads); when the traffic is done and
the store counters settle, the server stops. The reference server (same engine, same
arguments, no connector) then replays round 0 at the same concurrency to measure the
noise floor, and scores each answered request of the run under test alone
(``harness.commands.stress.judge.run_reference_side``). The checks come last
(``harness.commands.stress.judge.evaluate``); results written so far survive any failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Unpack

from harness.commands.stress.driver import Outcome, drive, http_sender
from harness.commands.stress.judge import StressResult, http_scorer, run_reference_side
from harness.commands.stress.plan import StressPlan
from harness.errors import HarnessError, RuntimeFailure
from harness.server import disk_tier, engine_log, kv_layout, metrics

if TYPE_CHECKING:
    from harness.commands.roundtrip.run import ServerChoice

SAMPLE_S = 0.5  # metrics sampling period for the timeline
# Each generated token comes back with the served top two: the floor measures how far
# a two-token gap moves between serving and scoring (``harness.commands.stress.judge.Floor.pair``).
SERVED_TOP = 2


def engine_kernels(lines: list[str]) -> dict[str, str]:
    """The attention backend and ISA a server's engine reported, and its AMX permission
    (as the round trip records them)."""
    return {**engine_log.kernels(lines), "amx_permission": engine_log.amx_permission(lines)}


class StressReporter(Protocol):
    def status(self, message: str) -> None: ...
    def request_done(self, outcome: Outcome, done: int, total: int) -> None: ...


class Sampler:
    """Reads ``/metrics`` every ``SAMPLE_S`` in the background: cumulative stored and
    loaded bytes and preemptions over time, for the timeline."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.points: list[tuple[float, metrics.Snapshot]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        from harness.server.launcher import http_json

        while not self._stop.wait(SAMPLE_S):
            try:
                text = http_json(f"{self.base}/metrics", None, 5)
            except HarnessError:
                continue  # a dying server: the run's own checks say so
            snap, _, _ = metrics.parse(str(text))
            self.points.append((time.monotonic() - self._t0, snap))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def execute_stress(
    plan: StressPlan,
    out_dir: Path,
    reporter: StressReporter,
    on_record: Callable[[StressResult], None],
    **at: Unpack[ServerChoice],
) -> StressResult:
    """The run under test, then (launched runs) the reference, then the checks."""
    url, port = at.get("url"), at.get("port")
    from harness.commands.roundtrip import resolve_disk
    from harness.commands.roundtrip.run import Endpoint, server_under_test, start_server
    from harness.commands.stress.judge import evaluate

    plan.base = resolve_disk(plan.base, out_dir)  # a disk tier in the run directory
    result = StressResult(plan)
    base = plan.base
    server = server_under_test(base, out_dir, url, port)
    try:
        if server is not None:
            start_server(server, base.scenario.server, reporter, "server under test")
            where = server.url
        else:
            assert url is not None
            where = url.rstrip("/")
        ep = Endpoint(where, server)
        _run_under_test(plan, result, ep, reporter, on_record, out_dir)
    finally:
        if server is not None:
            # The log as the run left it: stopping the server makes its API process log
            # the engine's exit (EngineDeadError and a traceback), which is not the run's.
            if server.log_path.is_file():
                lines = server.log_path.read_text(errors="replace").splitlines()
                result.log_lines = lines
                result.engine_groups = kv_layout.parse_report(lines) or []
                result.engine_kernels["server"] = engine_kernels(lines)
            server.stop()
            if base.disk is not None:
                result.disk_files = disk_tier.inventory(Path(base.disk.dir))
    on_record(result)
    if server is not None and base.server is not None and result.compared_count():
        from harness.commands.stress.plan import reference_spec

        rserver = reference_spec(plan).server(out_dir / "logs" / "reference-server.log", port)
        try:
            start_server(
                rserver, base.scenario.server, reporter, "reference server (connector off)"
            )
            reporter.status(
                f"reference: round 0 at concurrency {plan.concurrency} (the noise floor), "
                f"then {result.compared_count()} requests scored alone"
            )
            send = http_sender(rserver.url, base.served_name, logprobs=SERVED_TOP, seed=0)
            run_reference_side(result, send, http_scorer(rserver.url, base.served_name))
        except HarnessError as err:
            result.reference_error = str(err)
        finally:
            if rserver.log_path.is_file():
                lines = rserver.log_path.read_text(errors="replace").splitlines()
                result.engine_kernels["reference"] = engine_kernels(lines)
            rserver.stop()
    elif url is not None:
        result.attached = True
        result.reference_error = "attached (--url): outputs not compared, no reference launched"
    evaluate(result)
    on_record(result)
    return result


def _run_under_test(
    plan: StressPlan,
    result: StressResult,
    ep: object,
    reporter: StressReporter,
    on_record: Callable[[StressResult], None],
    out_dir: Path,
) -> None:
    from harness.commands.roundtrip.run import Endpoint

    assert isinstance(ep, Endpoint)
    metrics_dir = out_dir / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    start, cache = ep.snapshot("start")
    (metrics_dir / "start.prom").write_text(ep.last_text)
    if cache is not None:
        result.pool_tokens = int(cache.labels.get("kv_cache_size_tokens") or 0) or (
            cache.pool_tokens
        )
    send = http_sender(ep.base, plan.base.served_name, logprobs=SERVED_TOP, seed=0)
    sampler = Sampler(ep.base)
    sampler.start()
    t0 = time.monotonic()
    k = 0
    try:
        while True:
            reqs = plan.round(k)
            result.sent.extend(reqs)
            total = len(result.sent)
            offset = time.monotonic() - t0
            reporter.status(
                f"round {k}: {len(reqs)} requests at concurrency {plan.concurrency}"
                if plan.duration_s
                else f"{len(reqs)} requests at concurrency {plan.concurrency}"
            )

            def done(o: Outcome, offset: float = offset, total: int = total) -> None:
                o.started_s += offset
                o.ended_s += offset
                result.outcomes.append(o)
                reporter.request_done(o, len(result.outcomes), total)
                # Each answer on disk as it lands: an interrupted run keeps what it sent.
                on_record(result)

            drive(reqs, send, plan.concurrency, on_done=done)
            on_record(result)
            k += 1
            if ep.server is not None and not ep.server.alive():
                break
            if not plan.duration_s or time.monotonic() - t0 >= plan.duration_s:
                break
        result.rounds = k
        result.traffic_seconds = time.monotonic() - t0
        alive = ep.server.alive(grace_s=1.0) if ep.server is not None else True
        result.server_alive = alive
        if alive:
            try:
                end = ep.settle("end", plan.base.scenario.workload.settle_timeout_s)
                (metrics_dir / "end.prom").write_text(ep.last_text)
                result.counters = (end - start).as_dict()
                result.disk_counters = metrics.disk_counters_exported(ep.last_text)
            except (HarnessError, RuntimeFailure) as err:
                result.server_alive = False
                result.death = str(err)
        else:
            code = ep.server.proc.returncode if ep.server and ep.server.proc else None
            result.death = f"the server died during the run (exit code {code})"
            if ep.server is not None and ep.server.log_path.is_file():
                from harness.server.crash_signatures import crash_signature

                # Name what killed it, as the round trip does: the frame and the error.
                lines = ep.server.log_path.read_text(errors="replace").splitlines()
                sig = crash_signature(lines, code)
                if sig.frame or sig.exception:
                    result.death = f"{sig.summary()} (the server died during the run)"
    finally:
        sampler.stop()
        result.samples = [(t, s.as_dict()) for t, s in sampler.points]
        order = {r.id: i for i, r in enumerate(result.sent)}
        result.outcomes.sort(key=lambda o: order.get(o.id, 0))
