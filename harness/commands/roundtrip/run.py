"""Running a round trip: launch (or attach), the four phases with a metrics snapshot
after each, the optional connector-off baseline, and the verdict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypedDict, Unpack

from harness.commands.roundtrip import checks as ck
from harness.commands.roundtrip.evaluate import evaluate
from harness.commands.roundtrip.plan import RoundtripPlan, resolve_disk, size_filler
from harness.commands.roundtrip.result import PhaseResult, RoundtripResult
from harness.commands.roundtrip.speed import measure_speed
from harness.errors import ExitCode, HarnessError, RuntimeFailure
from harness.names import DISK_FAULT_BITFLIP, DISK_FAULT_SWAP, DISK_FAULT_TRUNCATE
from harness.oracle.content import judge_directories
from harness.results.records import CheckResult
from harness.scenario.schema import ServerSettings
from harness.server import disk_tier, engine_log, kv_layout, metrics
from harness.server.crash_signatures import crash_signature
from harness.server.launcher import HttpRefusal, VllmServer, http_json
from harness.server.stall_watch import STALL_S, Sampler
from harness.server.workload import (
    Completion,
    Prompt,
    complete,
    make_fillers,
    within_tolerance,
)

PHASES = ("cold", "warm", "filler", "replay")


class EngineFailure(HarnessError):
    """vLLM itself raised during a phase: a failed round trip, not a broken harness.
    ``signature`` is the crash's (``crash_signatures``), ``message`` the engine's own.
    Where a command lets it end the run (pressure), the run exits 1, not as expected:
    the build under test failed, the input was fine (exit 2 made mutate call such a
    mutant incompetent instead of killed)."""

    exit_code = ExitCode.MISMATCH

    def __init__(self, phase: str, signature: str, message: str) -> None:
        self.phase = phase
        self.signature = signature
        self.message = message
        super().__init__(f"the engine failed during the {phase} phase: {signature}")


class StartupFailure(RuntimeFailure):
    """The server under test never became ready: the matrix judges this as a verdict."""

    def __init__(
        self, message: str, state: str, returncode: int | None, log_path: Path, seconds: float
    ) -> None:
        super().__init__(message)
        self.state, self.returncode, self.log_path = state, returncode, log_path
        self.seconds = seconds


class Status(Protocol):
    def status(self, message: str) -> None: ...


class RoundtripReporter(Status, Protocol):
    def phase_done(self, phase: PhaseResult) -> None: ...
    def request_done(self, completion: Completion) -> None: ...


class Endpoint:
    """Requests and metrics against a base URL, attributing failures to a dead server."""

    def __init__(self, base: str, server: VllmServer | None, stall_s: float = STALL_S) -> None:
        self.base = base
        self.server = server
        self.last_text = ""  # the raw exposition, kept per phase for diagnosis
        self.stall_s = stall_s  # the stall watch's window over each request
        self.stall = ""  # what the stall watch saw, once it stopped the server
        # Requests this run's servers answered: after one, a refusal of the same kind of
        # request is the engine's doing, not a request the harness built wrong.
        self.answered = 0

    def failure(self, phase: str, err: Exception) -> HarnessError:
        """Blame a failed request: the engine under test, or the run's environment."""
        if self.stall:
            # The watch stopped a server that had stopped moving: the engine under test
            # failed (a stalled tier is named in the line), not the connection.
            return EngineFailure(phase, self.stall, self.stall)
        if self.server is not None:
            # Give a dying server a moment: its exit and its traceback land after the
            # dropped connection that brought us here.
            alive = self.server.alive(grace_s=3.0)
            lines = self.server.log_path.read_text(errors="replace").splitlines()
            sig = crash_signature(lines, None)
            if sig.frame:
                # vLLM raised inside its own code: the system under test failed.
                return EngineFailure(phase, sig.summary(), sig.message)
            if not alive:
                code = self.server.proc.returncode if self.server.proc else None
                return RuntimeFailure(
                    f"the server died during the {phase} phase (exit "
                    f"code {code}); log: {self.server.log_path}"
                )
            if isinstance(err, HttpRefusal) and self.answered:
                # Alive, nothing raised in its log, and requests built the same way were
                # answered before: refusing this one is the engine's failure (KV that
                # made the logprobs inf or NaN: "Out of range float values are not JSON
                # compliant", HTTP 400), a verdict, not exit 3.
                why = f"the server refused a request it had answered before: HTTP {err.status}"
                return EngineFailure(phase, f"{why}: {err.detail[:160]}", err.detail)
        return RuntimeFailure(f"{phase} phase: {err}")

    def snapshot(self, phase: str) -> tuple[metrics.Snapshot, metrics.CacheConfig | None]:
        try:
            text = http_json(f"{self.base}/metrics", None, 30)
        except HarnessError as err:
            raise self.failure(phase, err) from None
        self.last_text = str(text)
        snap, cache, _ = metrics.parse(self.last_text)
        return snap, cache

    def settle(self, phase: str, timeout_s: float) -> metrics.Snapshot:
        """Wait for asynchronous stores/loads to land in the counters, and for a disk
        tier's writes and reads in flight to finish."""
        deadline = time.monotonic() + timeout_s
        last, _ = self.snapshot(phase)
        stable = 0
        while time.monotonic() < deadline:
            time.sleep(0.25)
            snap, _ = self.snapshot(phase)
            if snap == last and not metrics.disk_jobs_in_flight(self.last_text):
                stable += 1
                if stable >= 3:
                    break
            else:
                stable = 0
            last = snap
        return last

    def complete(
        self,
        plan: RoundtripPlan,
        prompt: Prompt,
        phase: str,
        max_tokens: int,
        extra: dict[str, Any] | None = None,
    ) -> Completion:
        """One request of ``plan``'s workload; ``extra`` goes into its body (a
        ``cache_salt``)."""
        w = plan.scenario.workload
        watch = self._watch()
        try:
            answer = complete(
                self.base,
                plan.served_name,
                prompt,
                phase,
                max_tokens=max_tokens,
                logprobs=w.logprobs,
                seed=w.seed,
                extra=extra,
            )
            self.answered += 1
            return answer
        except HarnessError as err:
            raise self.failure(phase, err) from None
        finally:
            if watch is not None:
                watch.stop()

    def _watch(self) -> Sampler | None:
        """The stall watch over one request of a server this run launched (someone
        else's is never stopped): if the engine stops moving, the server is stopped and
        the request fails with what the watch saw."""
        server = self.server
        if server is None:
            return None

        def stop(why: str) -> None:
            self.stall = why
            server.stop()

        watch = Sampler(self.base, outstanding=lambda: 1, on_stall=stop, stall_s=self.stall_s)
        watch.start()
        return watch


def start_server(
    server: VllmServer, settings: ServerSettings, reporter: Status, what: str
) -> float:
    """Start ``server`` and wait for ``/health``; a server that crashes or never answers
    raises ``StartupFailure`` with the crash's signature. The seconds it took."""
    reporter.status(f"starting {what} ...")
    server.start()
    ready = server.wait_ready(settings.startup_timeout_s, settings.health_poll_s)
    if ready.state != "started":
        lines = server.log_path.read_text(errors="replace").splitlines()
        sig = crash_signature(lines, ready.returncode)
        how = (
            "did not start in time"
            if ready.state == "timeout"
            else (f"crashed at start: {sig.summary()}")
        )
        raise StartupFailure(
            f"the {what} {how}; log: {server.log_path}",
            ready.state,
            ready.returncode,
            server.log_path,
            ready.seconds,
        )
    reporter.status(f"{what} ready in {ready.seconds:.1f}s")
    return ready.seconds


def server_under_test(
    plan: RoundtripPlan, out_dir: Path, url: str | None, port: int | None
) -> VllmServer | None:
    """The server a run launches, its log in ``out_dir/logs/``; None when it attaches to
    ``url`` (a server someone else launched)."""
    if url is not None:
        return None
    assert plan.server is not None  # a launched plan has its server's spec
    return plan.server.server(out_dir / "logs" / "server.log", port)


class ServerChoice(TypedDict, total=False):
    """Where a run's server is: ``url``, one someone else launched (attach mode), else
    one launched here on ``port`` (None: a free one)."""

    url: str | None
    port: int | None


def execute_roundtrip(
    plan: RoundtripPlan,
    out_dir: Path,
    reporter: RoundtripReporter,
    on_record: Callable[[RoundtripResult], None],
    *,
    baseline: bool = False,
    stall_after: float | None = None,
    offload_speed: bool = False,
    **at: Unpack[ServerChoice],
) -> RoundtripResult:
    """Run the four phases; ``on_record`` is called after each step to persist results.

    With a disk tier that restarts (``[offload.disk] restart``), the server is stopped
    cleanly after the filler and a new one, on the same directory, serves the replay.
    ``stall_after``: the stall watch's window over each request (default ``STALL_S``).
    ``offload_speed``: once the servers have stopped, time one bulk copy of the bytes the
    run moved and set vLLM's rate beside it (``roundtrip.speed``; a few seconds)."""
    url, port = at.get("url"), at.get("port")
    stall_s = stall_after or STALL_S
    plan = resolve_disk(plan, out_dir)
    result = RoundtripResult(plan)
    server = server_under_test(plan, out_dir, url, port)
    servers = [server] if server is not None else []

    def restart(answered: int) -> Endpoint:
        assert server is not None and plan.server is not None  # a launch restarts
        reporter.status("stopping the server; its disk tier stays ...")
        server.stop()
        second = plan.server.server(out_dir / "logs" / "server-restarted.log", port)
        servers.append(second)
        result.restart_seconds = start_server(
            second, plan.scenario.server, reporter, "restarted server"
        )
        fresh = Endpoint(second.url, second, stall_s)
        fresh.answered = answered
        return fresh

    try:
        if server is not None:
            result.startup_seconds = start_server(server, plan.scenario.server, reporter, "server")
            base = server.url
        else:
            assert url is not None  # server is None only in attach mode, which gives url
            base = url.rstrip("/")
        ep = Endpoint(base, server, stall_s)
        if server is not None:
            read_engine_layout(plan, result, server.log_path)
        before_replay = None
        if plan.disk is not None:
            disk = plan.disk

            def before_replay(current: Endpoint) -> Endpoint:
                damage_disk(disk.fault, Path(disk.dir), result, reporter)
                return restart(current.answered) if disk.restart else current

        if not run_round(plan, ep, result, reporter, on_record, out_dir / "metrics", before_replay):
            return result
    finally:
        for s in servers:
            s.stop()
    if offload_speed:
        measure_speed(result, reporter.status)
        on_record(result)
    if baseline and plan.server is not None and result.checks:
        _run_baseline(plan, out_dir, result, reporter)
        on_record(result)
    return result


def run_round(
    plan: RoundtripPlan,
    ep: Endpoint,
    result: RoundtripResult,
    reporter: RoundtripReporter,
    on_record: Callable[[RoundtripResult], None],
    metrics_dir: Path,
    before_replay: Callable[[Endpoint], Endpoint] | None = None,
) -> bool:
    """The four phases and their checks on a running server; False if the engine died.

    An engine error during a phase is the round trip's verdict (``engine-survived``
    fails), not an error of the harness; ``harness.commands.faults`` runs several rounds
    on one server through this. ``before_replay`` runs between the filler and the
    replay and may give another server (a restart: the replay's deltas are then the new
    server's, from its own start).
    """
    began = time.monotonic_ns()  # this round's loads are the ledger's to judge
    try:
        w = plan.scenario.workload
        metrics_dir.mkdir(parents=True, exist_ok=True)
        start, cache = ep.snapshot("start")
        (metrics_dir / "start.prom").write_text(ep.last_text)
        filler = result.filler = size_filler(plan, cache)
        result.note(filler.note)
        fillers = make_fillers(list(filler.lengths), plan.vocab_size, w.seed)
        reporter.status(
            f"pool {filler.pool_tokens} tokens; filler {filler.count} x "
            f"{w.filler_tokens} = {filler.tokens} tokens "
            f"({filler.tokens / max(filler.pool_tokens, 1):.2f}x pool)"
        )
        on_record(result)
        prev = start
        traffic: dict[str, list[Prompt]] = {
            "cold": plan.targets,
            "warm": plan.targets,
            "filler": fillers,
            "replay": plan.targets,
        }
        for phase in PHASES:
            t0 = time.perf_counter()
            if phase == "replay" and before_replay is not None:
                first = ep
                ep = before_replay(ep)
                if ep is not first:
                    fresh, _ = ep.snapshot("restart")
                    (metrics_dir / "restart.prom").write_text(ep.last_text)
                    # The new server counts from zero: its deltas are its own; the
                    # totals go on from the first server's.
                    start, prev = fresh - (prev - start), fresh
            max_tokens = 1 if phase == "filler" else w.max_tokens
            for prompt in traffic[phase]:
                comp = ep.complete(plan, prompt, phase, max_tokens)
                result.completions.append(comp)
                result.generation_seconds += comp.seconds
                reporter.request_done(comp)
            snap = ep.settle(phase, w.settle_timeout_s)
            (metrics_dir / f"{phase}.prom").write_text(ep.last_text)
            pr = PhaseResult(
                phase, len(traffic[phase]), snap - prev, snap - start, time.perf_counter() - t0
            )
            result.phases.append(pr)
            if phase == "replay":
                result.tier_usage_after = metrics.tier_usage(snap, ep.last_text)
            prev = snap
            reporter.phase_done(pr)
            on_record(result)
        if plan.disk is not None:
            result.disk_files = disk_tier.inventory(Path(plan.disk.dir))
            result.disk_counters = metrics.disk_counters_exported(ep.last_text)
        if ep.server is not None and ep.server.spec.ledger:
            # Every server of the run keeps its ledger beside its log.
            ledgers = sorted(ep.server.log_path.parent.glob("*.ledger"))
            result.content = judge_directories(ledgers, since=began)
        result.checks = evaluate(plan, result)
        on_record(result)
    except EngineFailure as err:
        reporter.status(str(err))
        result.checks = [
            CheckResult(
                "engine-survived",
                False,
                "every phase served without an engine error",
                f"{err.signature}",
                "offloading must never crash the engine; a crash during "
                "a phase is the round trip failing",
                f"{err.phase} phase: {err.message}",
            )
        ]
        on_record(result)
        return False
    return True


def damage_disk(fault: str, root: Path, result: RoundtripResult, reporter: Status) -> None:
    """A seeded fault on the disk tier's files, between the filler and the replay (the
    engine-side ones act inside vLLM's fs tier instead: ``harness.engine.host_tiering``)."""
    if fault == DISK_FAULT_TRUNCATE:
        n = disk_tier.truncate_chunks(root)
    elif fault == DISK_FAULT_SWAP:
        n = disk_tier.swap_chunks(root)
    elif fault == DISK_FAULT_BITFLIP:
        n = disk_tier.flip_bits(root)
    else:
        return
    reporter.status(f"disk fault {fault}: {n} chunk files")
    result.note(f"seeded disk fault {fault}: {n} chunk files damaged before the replay")


def read_engine_layout(plan: RoundtripPlan, result: RoundtripResult, log: Path) -> None:
    """Take the KV-cache groups the engine reported; its Mamba state size wins."""
    lines = log.read_text(errors="replace").splitlines()
    groups = kv_layout.parse_report(lines)
    result.engine_groups = groups
    _record_kernels(result, "server", lines)
    if not groups:
        return
    states = [
        g["state_bytes"] * int(g.get("layers") or 0) * plan.tensor_parallel
        for g in groups
        if kv_layout.spec_kind(g) == "mamba" and g.get("state_bytes")
    ]
    if states and sum(states) != plan.expected.mamba_state_bytes:
        result.engine_mamba_state_bytes = sum(states)
        result.note(
            f"Mamba state: the engine keeps {sum(states):,} B over all layers "
            f"(the config at its dtype gives {plan.expected.mamba_state_bytes:,})"
        )


def _record_kernels(result: RoundtripResult, server: str, lines: list[str]) -> None:
    result.engine_kernels[server] = {
        **engine_log.kernels(lines),
        "amx_permission": engine_log.amx_permission(lines),
    }


def _run_baseline(
    plan: RoundtripPlan, out_dir: Path, result: RoundtripResult, reporter: RoundtripReporter
) -> None:
    """The same prompts on a second server without the connector (after the first stopped).

    A cold pass must not depend on whether offloading is configured: compared with the
    connector run's cold pass, byte for byte.
    """
    assert plan.server is not None
    sp = plan.server
    server = sp.without_offload().server(out_dir / "logs" / "baseline-server.log")
    try:
        start_server(server, plan.scenario.server, reporter, "baseline server (connector off)")
        ep = Endpoint(server.url, server)
        for prompt in plan.targets:
            comp = ep.complete(plan, prompt, "baseline", plan.scenario.workload.max_tokens)
            result.completions.append(comp)
            reporter.request_done(comp)
    finally:
        server.stop()
        if server.log_path.is_file():
            _record_kernels(
                result, "baseline", server.log_path.read_text(errors="replace").splitlines()
            )
    outs = {(c.phase, c.prompt): c for c in result.completions}
    tol = plan.scenario.workload.baseline_logprob_tolerance
    close = [
        (p.name, within_tolerance(outs[("cold", p.name)], outs[("baseline", p.name)], tol))
        for p in plan.targets
    ]
    result.checks.append(
        ck.check_outputs_within(
            close,
            "baseline-output-equivalent",
            "a cold pass with the connector must equal the same pass on a server without it; "
            "two processes may round differently (bf16, kernels chosen per CPU), so logprobs "
            "get the measured cross-process tolerance, while replay vs warm in one server "
            "stays byte-exact",
            tol,
        )
    )


def save_requests(result: RoundtripResult, path: Path) -> None:
    with path.open("w") as fh:
        for comp in result.completions:
            fh.write(json.dumps(comp.record(), sort_keys=True) + "\n")
