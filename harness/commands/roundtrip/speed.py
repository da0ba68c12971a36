"""How fast the offload moved a round trip's KV, beside the machine's bulk-copy limit.

vLLM's counters give the bytes each direction moved and its workers' transfer time for
them (``vllm:kv_offload_{store,load}_{bytes,time}``, or their 0.27-0.32 twins; on CUDA the
time is the copy's CUDA events, with the harness's host backend on CPU its clock). Their
ratio is the rate a worker achieves while it transfers. Beside it, one bulk copy of the
same bytes (``harness.server.copy_limit``) measured in the same run once the servers have
stopped: the ratio of the two says how far the worker's block-by-block copies are from
what the machine does in one go (issue #43: per-block copies of the seed's bytes ran at
about 4% of one pinned copy on an H200).

Informational, never a check: rates vary with the machine and its load, and a ratio is
read, not judged. At TP > 1 both counters are summed over the workers, so the rate is one
worker's mean while it transfers, not the server's aggregate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.commands.roundtrip.result import RoundtripResult, SpeedRow
from harness.errors import HarnessError
from harness.server import copy_limit
from harness.server.copy_limit import CopyLimit


@dataclass(frozen=True)
class Moved:
    """What vLLM's counters say one phase moved in one direction."""

    phase: str
    direction: str  # "store" or "load"
    bytes: int
    seconds: float  # its workers' transfer time, summed over them


def moved(result: RoundtripResult) -> list[Moved]:
    """Each phase's stores and loads that moved bytes, in phase order (a restart's
    replay is the new server's)."""
    out = []
    for p in result.phases:
        d = p.delta
        for direction, nbytes, seconds in (
            ("store", d.stored_bytes, d.store_seconds),
            ("load", d.loaded_bytes, d.load_seconds),
        ):
            if nbytes > 0:
                out.append(Moved(p.phase, direction, int(nbytes), float(seconds)))
    return out


def yardstick_bytes(rows: list[Moved]) -> int:
    """How many bytes the bulk copy moves: the cold pass's stores (the round trip's own
    KV, what the replay loads back at most: the seed's 245,366,784 B), else the largest
    phase's; at most ``copy_limit.CAP_BYTES``."""
    cold = [m.bytes for m in rows if m.phase == "cold" and m.direction == "store"]
    return copy_limit.copy_bytes(cold[0] if cold else max((m.bytes for m in rows), default=0))


def speed_rows(moves: list[Moved], limit: CopyLimit, tensor_parallel: int) -> list[SpeedRow]:
    """A row for each phase and direction that moved bytes (``moved``)."""
    rows = []
    for m in moves:
        gbps = m.bytes / m.seconds / 1e9 if m.seconds > 0 else None
        copy_gbps = limit.gbps(m.direction)
        rows.append(
            SpeedRow(
                phase=m.phase,
                direction=m.direction,
                bytes=m.bytes,
                seconds=round(m.seconds, 6),
                gbps=None if gbps is None else round(gbps, 4),
                copy_bytes=limit.bytes,
                copy_seconds=round(limit.seconds(m.direction), 6),
                copy_gbps=round(copy_gbps, 4),
                ratio=None if gbps is None else round(gbps / copy_gbps, 5),
                tensor_parallel=tensor_parallel,
                device=limit.device,
                copy=limit.how,
            )
        )
    return rows


def measure_speed(result: RoundtripResult, status: Callable[[str], None]) -> None:
    """Measure the bulk copy for ``result``'s bytes and keep the rows on it; where that
    cannot be done (an attached server, nothing moved, the copy failed) a note says why.
    ``status`` shows a line of progress."""
    plan = result.plan
    if plan.env is None:
        result.note("offload speed: not measured (an attached server's machine is not this one)")
        return
    rows = moved(result)
    if not rows:
        result.note("offload speed: nothing was stored or loaded, so no rate")
        return
    nbytes = yardstick_bytes(rows)
    status(f"measuring one bulk copy of {nbytes:,} B each way on {plan.env.device} ...")
    try:
        limit = copy_limit.measure(plan.env.python, plan.env.device, nbytes)
    except HarnessError as err:
        result.note(f"offload speed: {err}")
        return
    result.offload_speed = speed_rows(rows, limit, plan.tensor_parallel)
    for row in result.offload_speed:
        if row.gbps is None:
            result.note(
                f"offload speed: vLLM exported no {row.direction} time for the "
                f"{row.phase} phase's {row.bytes:,} B, so no rate"
            )
