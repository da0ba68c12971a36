"""Running a pressure plan: one server at a time, its requests one at a time, each
followed by a settle of the counters, each judged as it lands (so an interrupted run
keeps every request it served)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.commands.pressure.checks import Judged, Observed, judge_request, judge_server
from harness.commands.pressure.plan import PressurePlan, ServerPlan
from harness.commands.roundtrip.run import Endpoint, Status, start_server
from harness.errors import HarnessError
from harness.names import FAULT_NONE
from harness.results.records import PressureCheck, PressureRequest
from harness.server import control_files
from harness.server.admin import reset_prefix_cache
from harness.server.workload import Completion, complete

# The host backend's start line (harness.engine.host_offload): the tier vLLM sized.
_HOST_CHUNKS = re.compile(r"(\d+) host chunks x (\d+) B")


@dataclass
class ServerResult:
    """One round on one server: its rows, answers and checks."""

    plan: ServerPlan
    rows: list[PressureRequest] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    checks: list[PressureCheck] = field(default_factory=list)
    startup_seconds: float = 0.0
    error: str = ""

    @property
    def failing(self) -> frozenset[str]:
        return frozenset(c.check for c in self.checks if not c.passed)

    @property
    def matched(self) -> bool:
        """Every check as expected: the clean round passes them (or fails where a rule
        expects it); a mutant's or a fault's round fails exactly the ones it must."""
        return bool(self.checks) and not self.error and all(c.matched for c in self.checks)

    @property
    def status(self) -> str:
        if self.error:
            return "error"
        if not self.checks:
            return "running"
        if self.plan.round == "clean":
            return "passed" if self.matched else "failed"
        if self.matched:
            return "caught"
        return "missed" if not self.failing else "caught by other checks"


class PressureReporter(Status, Protocol):
    def request_done(self, server: str, judged: Judged) -> None: ...


def engine_capacity(log: Path) -> tuple[int, int] | None:
    """(slots, slot bytes) as the engine sized them, from its log; None when the
    backend does not say (vLLM's own CPU spec on GPUs before 0.33)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    m = _HOST_CHUNKS.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def reset_tier(url: str, timeout_s: float = 60.0) -> None:
    """Empty the CPU tier between rounds (and the GPU prefix cache with it)."""
    reset_prefix_cache(url, external=True, timeout_s=timeout_s)


def _serve_round(
    plan: PressurePlan,
    rnd: ServerPlan,
    ep: Endpoint,
    reporter: PressureReporter,
    result: ServerResult,
    on_update: Callable[[ServerResult], None],
    capacity: tuple[int, int] | None,
) -> None:
    scn = plan.scenario
    start = before = ep.settle("start", scn.settle_timeout_s)
    for req in rnd.requests:
        phase = f"{rnd.name} {rnd.round} request {req.index} ({req.label})"
        try:
            comp = complete(
                ep.base,
                plan.served_name,
                req.prompt,
                rnd.round,
                max_tokens=scn.max_tokens,
                logprobs=scn.logprobs,
                seed=scn.seed,
            )
        except HarnessError as err:
            raise ep.failure(phase, err) from None
        after = ep.settle(phase, scn.settle_timeout_s)
        judged = judge_request(rnd, plan.tier, req, Observed(comp, after - before))
        before = after
        result.rows.append(judged.row)
        result.completions.append(comp)
        reporter.request_done(
            rnd.name if rnd.round == "clean" else f"{rnd.name}/{rnd.round}", judged
        )
        on_update(result)
    result.checks = judge_server(
        rnd, plan.tier, result.rows, result.completions, before - start, capacity,
        scn.logprob_tolerance,
    )  # fmt: skip
    on_update(result)


def run_server(
    plan: PressurePlan,
    server_plan: ServerPlan,
    out_dir: Path,
    reporter: PressureReporter,
    on_update: Callable[[list[ServerResult]], None],
    port: int | None = None,
) -> list[ServerResult]:
    """Launch one server, serve each round (the clean one, then each mutant's or
    fault's after a reset of the tier), judge each; the server is stopped whatever
    happens, and the results so far handed to ``on_update`` after every request."""
    scn = plan.scenario
    results: list[ServerResult] = []
    sp = server_plan
    for path, value in ((sp.policy_control, sp.policy_mode), (sp.fault_control, FAULT_NONE)):
        if path is not None:
            control_files.write_control(path, value)
    server = sp.spec.server(out_dir / "logs" / f"{sp.name}.log", port)
    try:
        startup = start_server(server, scn.server, reporter, f"server {sp.name}")
        ep = Endpoint(server.url, server)
        capacity = engine_capacity(server.log_path)
        for i, rnd in enumerate(sp.all_rounds()):
            result = ServerResult(rnd, startup_seconds=startup if i == 0 else 0.0)
            results.append(result)
            if i:
                reporter.status(f"server {sp.name}: round {rnd.round}")
                if sp.policy_control is not None:
                    control_files.write_control(sp.policy_control, rnd.policy_mode)
                reset_tier(server.url)
                if sp.fault_control is not None:
                    control_files.write_control(sp.fault_control, rnd.fault)
            try:
                _serve_round(
                    plan, rnd, ep, reporter, result,
                    lambda _r: on_update(results), capacity,
                )  # fmt: skip
            except HarnessError as err:
                result.error = str(err)
                on_update(results)
                raise
            if i:
                reporter.status(
                    f"server {sp.name}: round {rnd.round} {result.status}"
                    + (f" ({', '.join(sorted(result.failing))})" if result.failing else "")
                )
    finally:
        server.stop()
        for path in (sp.policy_control, sp.fault_control):
            if path is not None:
                shutil.rmtree(path.parent, ignore_errors=True)
    return results


def execute_pressure(
    plan: PressurePlan,
    out_dir: Path,
    reporter: PressureReporter,
    on_update: Callable[[list[ServerResult]], None],
    port: int | None = None,
) -> list[ServerResult]:
    """Every server of the plan in turn (never two at once), every round of each."""
    done: list[ServerResult] = []
    for sp in plan.servers:

        def update(results: list[ServerResult]) -> None:
            on_update([*done, *results])

        done.extend(run_server(plan, sp, out_dir, reporter, update, port))
    return done
