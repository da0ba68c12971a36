"""``pressure --replay``: a build's own CPU manager and policies judged against the
oracle, with no server.

Why: a live pressure run needs an engine that runs here, which a CUDA wheel's does not on
a CPU host; but the manager, its policies and the store threshold are pure Python in
every build. Fed the scenario's sequences in the offloading scheduler's call order
(``harness.engine.manager_replay``, in the build's own interpreter), vLLM's manager says
for each request what it hit, stored, evicted and skipped, and whether its store failed;
the oracle, with the deviations the scenario's rules give that release, must say the
same. This judges the CUDA builds' (0.33.0, 0.34.0) policy logic on any machine, and
says more than a live run can: the chunks evicted, by name (a live run sees only how
many bytes moved).

What it cannot see: the scheduler, the worker, the copies and vLLM's counters (no engine
runs), and the answers. Releases before 0.31 touched keys from the scheduler instead of
the manager, so their order is not replayed (refused, one line). Mutant and fault rounds
need a server: a policy mutant's expected failures are themselves calibrated by this
replay, so judging it here would be circular.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from packaging.version import Version

from harness.commands.pressure.checks import (
    PER_REQUEST,
    Figures,
    check,
    judge_figures,
    per_request_checks,
)
from harness.commands.pressure.plan import PressurePlan, ServerPlan, TierGeometry, replay_mutants
from harness.commands.pressure.run import ServerResult
from harness.errors import BadInput
from harness.results.records import PressureCheck, PressureRequest

# The first release whose scheduler calls the manager in the order replayed.
FIRST_REPLAYED = Version("0.31")
# The per-request checks a replay can judge (no engine: no GPU tier, no bytes read from
# counters, which follow from the chunks), and the one only a replay can.
REPLAY_CHECKS = ("hit-tokens", "stored-bytes", "stores-skipped", "no-store-failure")
EVICTED = "evicted-chunks"
REPLAYED = " (vLLM's manager, replayed)"


def replayable(version: str) -> bool:
    """Whether a vLLM of this version calls the manager in the order replayed (0.31 on)."""
    return Version(version).release >= FIRST_REPLAYED.release


def check_replayable(plan: PressurePlan, rounds: int) -> None:
    """Refuse, one line each, what a replay cannot judge."""
    if not replayable(plan.env.vllm_version):
        raise BadInput(
            f"--replay needs vLLM {FIRST_REPLAYED} or later (this build is "
            f"{plan.env.vllm_version}): before 0.31 the scheduler, not the manager, records "
            "each request's accesses, and that order is not replayed"
        )
    if rounds:
        raise BadInput(
            "--replay judges the build's own manager; --mutant, --fault and --patch rounds "
            "need a server (a policy mutant's expected failures are calibrated by this "
            "very replay)"
        )


def replay_plan(plan: PressurePlan) -> list[ServerResult]:
    """Every server's requests through the build's own manager (one interpreter start),
    each judged against the oracle's step."""
    specs: list[dict[str, Any]] = [
        {
            "requests": [[r.prompt.name, r.chunks] for r in sp.requests],
            "capacity": plan.tier.slots,
            "policy": sp.policy,
            "store_threshold": sp.store_threshold,
        }
        for sp in plan.servers
    ]
    replayed = replay_mutants(plan.env, specs)
    return [
        judge_replay(sp, plan.tier, steps) for sp, steps in zip(plan.servers, replayed, strict=True)
    ]


def judge_replay(
    server: ServerPlan, tier: TierGeometry, replayed: Sequence[dict[str, Any]]
) -> ServerResult:
    """One server's replayed steps as pressure's rows, and its checks: each request's hit,
    store, skip and store failure as the oracle says, and the chunks it evicted by name."""
    result = ServerResult(server)
    evicted_off = ""
    for req, got in zip(server.requests, replayed, strict=True):
        exp, hit = req.expected, int(got["hit"])
        figures = Figures(
            ext_hits=hit * tier.chunk_tokens,
            gpu_hits=0,
            stored_bytes=len(got["stored"]) * tier.chunk_bytes,
            loaded_bytes=hit * tier.chunk_bytes,
            stores_skipped=int(got["skipped"]),
            store_failures=int(bool(got["failed"])),
        )
        wrong_victims = list(got["evicted"]) != list(exp.evicted)
        if wrong_victims and not evicted_off:
            evicted_off = (
                f"request {req.index} ({req.label}): evicted {' '.join(got['evicted']) or 'none'}"
                f", the oracle {' '.join(exp.evicted) or 'none'}"
            )
        extra = [EVICTED] if wrong_victims else []
        result.rows.append(judge_figures(server, tier, req, figures, None, 0.0, extra).row)
    result.checks = _checks(server, result.rows, evicted_off)
    return result


def _checks(
    server: ServerPlan, rows: Sequence[PressureRequest], evicted_off: str
) -> list[PressureCheck]:
    names = [n for n in PER_REQUEST if n in REPLAY_CHECKS]
    out = per_request_checks(server, rows, names, REPLAYED)
    bad = [r for r in rows if EVICTED in r.failing.split(";")]
    out.append(
        check(
            server,
            EVICTED,
            not bad,
            "every request evicts the chunks the oracle names, in its order",
            f"{len(rows) - len(bad)} of {len(rows)} requests agree{REPLAYED}",
            evicted_off,
        )
    )
    return out
