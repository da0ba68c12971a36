"""Running a pressure plan: one server at a time, its requests one at a time, each
followed by a settle of the counters, each judged as it lands (so an interrupted run
keeps every request it served)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.commands.pressure.checks import Judged, Observed, judge_request, judge_server
from harness.commands.pressure.plan import PressurePlan, ServerPlan
from harness.commands.roundtrip.run import Endpoint, Status, start_server
from harness.errors import HarnessError
from harness.results.records import PressureCheck, PressureRequest
from harness.server.workload import Completion, complete

# The host backend's start line (harness.engine.host_offload): the tier vLLM sized.
_HOST_CHUNKS = re.compile(r"(\d+) host chunks x (\d+) B")


@dataclass
class ServerResult:
    plan: ServerPlan
    rows: list[PressureRequest] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    checks: list[PressureCheck] = field(default_factory=list)
    startup_seconds: float = 0.0
    error: str = ""

    @property
    def matched(self) -> bool:
        return bool(self.checks) and not self.error and all(c.matched for c in self.checks)


class PressureReporter(Status, Protocol):
    def request_done(self, server: str, judged: Judged) -> None: ...


def engine_capacity(log: Path) -> tuple[int, int] | None:
    """(slots, slot bytes) as the engine sized them, from its log; None when the
    backend does not say (vLLM's own CPU spec on GPUs before 0.33)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    m = _HOST_CHUNKS.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def run_server(
    plan: PressurePlan,
    server_plan: ServerPlan,
    out_dir: Path,
    reporter: PressureReporter,
    on_update: Callable[[ServerResult], None],
    port: int | None = None,
) -> ServerResult:
    """Launch one server, serve its requests, judge it; the server is stopped whatever
    happens, and the result so far handed to ``on_update`` after every request."""
    scn = plan.scenario
    result = ServerResult(server_plan)
    server = server_plan.spec.server(out_dir / "logs" / f"{server_plan.name}.log", port)
    try:
        result.startup_seconds = start_server(
            server, scn.server, reporter, f"server {server_plan.name}"
        )
        ep = Endpoint(server.url, server)
        start = before = ep.settle("start", scn.settle_timeout_s)
        for req in server_plan.requests:
            phase = f"{server_plan.name} request {req.index} ({req.label})"
            try:
                comp = complete(
                    server.url,
                    plan.served_name,
                    req.prompt,
                    server_plan.name,
                    max_tokens=scn.max_tokens,
                    logprobs=scn.logprobs,
                    seed=scn.seed,
                )
            except HarnessError as err:
                raise ep.failure(phase, err) from None
            after = ep.settle(phase, scn.settle_timeout_s)
            judged = judge_request(server_plan, plan.tier, req, Observed(comp, after - before))
            before = after
            result.rows.append(judged.row)
            result.completions.append(comp)
            reporter.request_done(server_plan.name, judged)
            on_update(result)
        result.checks = judge_server(
            server_plan,
            plan.tier,
            result.rows,
            result.completions,
            before - start,
            engine_capacity(server.log_path),
            scn.logprob_tolerance,
        )
        on_update(result)
    except HarnessError as err:
        result.error = str(err)
        on_update(result)
        raise
    finally:
        server.stop()
    return result


def execute_pressure(
    plan: PressurePlan,
    out_dir: Path,
    reporter: PressureReporter,
    on_update: Callable[[list[ServerResult]], None],
    port: int | None = None,
) -> list[ServerResult]:
    """Every server of the plan in turn (never two at once)."""
    done: list[ServerResult] = []
    for sp in plan.servers:

        def update(result: ServerResult) -> None:
            on_update([*done, result])

        done.append(run_server(plan, sp, out_dir, reporter, update, port))
    return done
