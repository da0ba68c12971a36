"""Running a stress plan: the server under test, then the connector-off reference, one
after the other, with every request, metric and log line kept as the run goes.

The run under test sends the plan (``harness.commands.stress.driver``) while a sampler reads the
metrics twice a second (the timeline's stores and loads); when the traffic is done and
the store counters settle, the server stops. The reference server (same engine, same
arguments, no connector) then replays round 0 at the same concurrency to measure the
noise floor, and scores each answered request of the run under test alone
(``harness.commands.stress.judge.run_reference_side``). The checks come last
(``harness.commands.stress.evaluate.evaluate``); results written so far survive any failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Unpack

from harness.commands.roundtrip import resolve_disk
from harness.commands.roundtrip.run import Endpoint, server_under_test, start_server
from harness.commands.stress import reference_cache as rc
from harness.commands.stress.driver import Outcome, drive, http_sender
from harness.commands.stress.evaluate import evaluate
from harness.commands.stress.floor import SERVED_TOP
from harness.commands.stress.judge import http_scorer, run_reference_side
from harness.commands.stress.plan import StressPlan, reference_spec
from harness.commands.stress.reference_cache import LiveReference
from harness.commands.stress.result import ServerRun, StressResult
from harness.errors import HarnessError, RuntimeFailure
from harness.server import disk_tier, engine_log, kv_layout, metrics
from harness.server.crash_signatures import crash_signature
from harness.server.stall_watch import Sampler

if TYPE_CHECKING:
    from harness.commands.roundtrip.run import ServerChoice
    from harness.server.launcher import VllmServer


def engine_kernels(lines: list[str]) -> dict[str, str]:
    """The attention backend and ISA a server's engine reported, and its AMX permission
    (as the round trip records them)."""
    return {**engine_log.kernels(lines), "amx_permission": engine_log.amx_permission(lines)}


class StressReporter(Protocol):
    def status(self, message: str) -> None: ...
    def request_done(self, outcome: Outcome, done: int, total: int) -> None: ...


def execute_stress(
    plan: StressPlan,
    out_dir: Path,
    reporter: StressReporter,
    on_record: Callable[[StressResult], None],
    **at: Unpack[ServerChoice],
) -> StressResult:
    """The run under test (with ``--restarts``, its first server and then each restarted
    one over the same disk tier), then (launched runs) the reference, then the checks."""
    url, port = at.get("url"), at.get("port")

    plan.base = resolve_disk(plan.base, out_dir)  # a disk tier in the run directory
    result = StressResult(plan)
    base = plan.base
    server = server_under_test(base, out_dir, url, port)
    launched = [server] if server is not None else []
    try:
        run = ServerRun("server", "logs/server.log" if server is not None else str(url))
        result.servers.append(run)
        if server is not None:
            run.start_seconds = start_server(
                server, base.scenario.server, reporter, "server under test"
            )
            where = server.url
        else:
            assert url is not None
            where = url.rstrip("/")
        t0 = time.monotonic()
        _serve(plan, result, Endpoint(where, server), run, reporter, on_record, out_dir, t0)
        for k in range(1, plan.restarts + 1):
            if not run.alive or server is None or base.server is None:
                break
            _read_log(result, run, server)
            reporter.status(f"stopping the server; its disk tier stays (restart {k})")
            server.stop()
            log = f"logs/server-restart{k}.log"
            server = base.server.server(out_dir / log, port)
            launched.append(server)
            run = ServerRun(f"restart {k}", log)
            result.servers.append(run)
            try:
                run.start_seconds = start_server(
                    server, base.scenario.server, reporter, f"restarted server {k}"
                )
            except HarnessError as err:
                run.alive, run.death = False, str(err)
                break
            ep = Endpoint(server.url, server)
            _serve(plan, result, ep, run, reporter, on_record, out_dir, t0, restart=k)
    finally:
        if server is not None and result.servers:
            _read_log(result, result.servers[-1], server)
        for s in launched:
            s.stop()
        _totals(result)
        if base.disk is not None:
            result.disk_files = disk_tier.inventory(Path(base.disk.dir))
    on_record(result)
    if server is not None and base.server is not None and result.compared_count():
        if plan.reference_cache is not None:
            _cached_reference(plan, result, out_dir, reporter, port)
        else:
            try:
                with _live_reference(plan, result, out_dir, reporter, port) as live:
                    reporter.status(
                        f"reference: round 0 at concurrency {plan.concurrency} (the noise "
                        f"floor), then {result.compared_count()} requests scored alone"
                    )
                    run_reference_side(result, live.send, live.score)
            except HarnessError as err:
                result.reference_error = str(err)
    elif url is not None:
        result.attached = True
        result.reference_error = "attached (--url): outputs not compared, no reference launched"
    evaluate(result)
    on_record(result)
    return result


@contextmanager
def _live_reference(
    plan: StressPlan,
    result: StressResult,
    out_dir: Path,
    reporter: StressReporter,
    port: int | None,
) -> Iterator[LiveReference]:
    """The reference server (same engine and arguments, the connector off), started and
    ready; on exit its kernels are read from its log and it is stopped."""
    base = plan.base
    rserver = reference_spec(plan).server(out_dir / "logs" / "reference-server.log", port)
    try:
        start_server(rserver, base.scenario.server, reporter, "reference server (connector off)")
        send = http_sender(rserver.url, base.served_name, logprobs=SERVED_TOP, seed=0)
        yield LiveReference(send, http_scorer(rserver.url, base.served_name))
    finally:
        if rserver.log_path.is_file():
            lines = rserver.log_path.read_text(errors="replace").splitlines()
            result.engine_kernels["reference"] = engine_kernels(lines)
        rserver.stop()


def _cached_reference(
    plan: StressPlan,
    result: StressResult,
    out_dir: Path,
    reporter: StressReporter,
    port: int | None,
) -> None:
    """The reference through ``--reference-cache``: from the cache when it holds the
    floor and every score and nothing diverges, else launched for what it lacks
    (``harness.commands.stress.reference_cache.reference_side``); one line says which."""
    assert plan.reference_cache is not None
    inputs = rc.key_inputs(plan, host=rc.host_identity(), environ=os.environ)
    cache = rc.ReferenceCache.open(plan.reference_cache, inputs)
    if cache.warning:
        reporter.status(cache.warning)
    try:
        rc.reference_side(
            result,
            cache,
            lambda: _live_reference(plan, result, out_dir, reporter, port),
            reporter.status,
        )
    except HarnessError as err:
        result.reference_error = str(err)
    if result.reference_source is not None:
        reporter.status(result.reference_source.line())


def _read_log(result: StressResult, run: ServerRun, server: VllmServer) -> None:
    """A server's log as the run left it, read before it is stopped: stopping makes its
    API process log the engine's exit (EngineDeadError and a traceback), which is not
    the run's. The first server's log also gives the KV layout and the kernels."""
    if not server.log_path.is_file():
        return
    run.log_lines = server.log_path.read_text(errors="replace").splitlines()
    if run is result.servers[0]:
        result.engine_groups = kv_layout.parse_report(run.log_lines) or []
        result.engine_kernels["server"] = engine_kernels(run.log_lines)


def _totals(result: StressResult) -> None:
    """The run's sums over its servers: counters, log lines, and whether all survived."""
    totals: dict[str, float] = {}
    for sv in result.servers:
        for key, value in sv.counters.items():
            totals[key] = totals.get(key, 0.0) + value
    result.counters = totals
    result.log_lines = [line for sv in result.servers for line in sv.log_lines]
    result.disk_counters = all(sv.disk_counters for sv in result.servers)
    result.server_alive = all(sv.alive for sv in result.servers)
    dead = [sv for sv in result.servers if sv.death]
    if dead:
        many = len(result.servers) > 1
        result.death = f"{dead[0].label}: {dead[0].death}" if many else dead[0].death


def _serve(
    plan: StressPlan,
    result: StressResult,
    ep: object,
    run: ServerRun,
    reporter: StressReporter,
    on_record: Callable[[StressResult], None],
    out_dir: Path,
    t0: float,
    restart: int = 0,
) -> None:
    """One server's part of the run: the plan's rounds (``restart`` k: round 0 again, on
    the k-th restarted server), its metrics from its start to when its stores settle.
    Request times count from ``t0``, the run's start, across servers."""
    assert isinstance(ep, Endpoint)
    metrics_dir = out_dir / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"restart{restart}-" if restart else ""
    start, cache = ep.snapshot("start")
    (metrics_dir / f"{prefix}start.prom").write_text(ep.last_text)
    if cache is not None and not restart:
        result.pool_tokens = int(cache.labels.get("kv_cache_size_tokens") or 0) or (
            cache.pool_tokens
        )
    send = http_sender(ep.base, plan.base.served_name, logprobs=SERVED_TOP, seed=0)
    server = ep.server

    def stop_stalled(why: str) -> None:
        reporter.status(why)
        if server is not None:
            server.stop()  # the requests in flight fail now, the run ends

    sampler = Sampler(
        ep.base,
        outstanding=lambda: len(result.sent) - len(result.outcomes),
        on_stall=stop_stalled if server is not None else None,
        stall_s=plan.stall_s,
    )
    sampler.start()
    began = time.monotonic()
    carried = dict(result.samples[-1][1]) if result.samples else {}
    k = 0
    try:
        while True:
            reqs = plan.restart_round(restart) if restart else plan.round(k)
            result.sent.extend(reqs)
            run.request_ids.extend(r.id for r in reqs)
            total = len(result.sent)
            offset = time.monotonic() - t0
            where = f"restart {restart}: " if restart else ""
            reporter.status(
                f"{where}round {k}: {len(reqs)} requests at concurrency {plan.concurrency}"
                if plan.duration_s
                else f"{where}{len(reqs)} requests at concurrency {plan.concurrency}"
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
            if restart or (ep.server is not None and not ep.server.alive()):
                break
            if not plan.duration_s or time.monotonic() - t0 >= plan.duration_s:
                break
        if not restart:
            result.rounds = k
        result.traffic_seconds += time.monotonic() - began
        alive = ep.server.alive(grace_s=1.0) if ep.server is not None else True
        run.alive = alive
        if alive:
            try:
                end = ep.settle("end", plan.base.scenario.workload.settle_timeout_s)
                (metrics_dir / f"{prefix}end.prom").write_text(ep.last_text)
                run.counters = (end - start).as_dict()
                run.disk_counters = metrics.disk_counters_exported(ep.last_text)
            except (HarnessError, RuntimeFailure) as err:
                run.alive = False
                run.death = str(err)
        else:
            code = ep.server.proc.returncode if ep.server and ep.server.proc else None
            run.death = f"the server died during the run (exit code {code})"
            if sampler.stall:
                run.death = sampler.stall
            elif ep.server is not None and ep.server.log_path.is_file():
                # Name what killed it, as the round trip does: the frame and the error.
                lines = ep.server.log_path.read_text(errors="replace").splitlines()
                sig = crash_signature(lines, code)
                if sig.frame or sig.exception:
                    run.death = f"{sig.summary()} (the server died during the run)"
    finally:
        sampler.stop()
        result.longest_still_s = max(result.longest_still_s, sampler.longest_still_s)
        # A restarted server counts from zero: its samples go on from the last one's.
        shift = began - t0
        result.samples += [
            (t + shift, {k_: v + carried.get(k_, 0.0) for k_, v in s.as_dict().items()})
            for t, s in sampler.points
        ]
        _totals(result)  # so what is written while the next server runs has this one's
        order = {r.id: i for i, r in enumerate(result.sent)}
        result.outcomes.sort(key=lambda o: order.get(o.id, 0))
