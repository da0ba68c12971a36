"""The server engine: a cell's sequence on a live vLLM server, one request at a time.

Before each request the GPU prefix cache is reset (``/reset_prefix_cache``, the tier
kept), so every lookup starts at token 0 as the model assumes; after it the counters are
let settle. What each request did is read three ways: the counters' deltas (hit, bytes,
the host tier's tokens, the tier's allocations and usage, lookups), the host backend's
transfer trace (per KV-cache group, blocks and the first block's index, per job), and
the answer (a prompt seen before that hit must answer as its first, whole prefill did).
A wave's requests are sent at once; each one's hit is then its answer's cached tokens,
the rest (no counter splits by request) judged as the wave's sum.
The model's layout is the one the engine reports building (``harness.engine.specs``),
so a group the engine built differently from the plan is judged as built (and named).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from harness.commands.oracle.drive import request_of
from harness.commands.oracle.judge import CellResult, Moved, Observed, judge
from harness.commands.oracle.plan import Cell, OraclePlan
from harness.commands.roundtrip.run import Endpoint, Status, start_server
from harness.errors import HarnessError, RuntimeFailure
from harness.names import LOG_TRANSFER
from harness.oracle.scheduler import KINDS, Group, Layout, Offloader, Served
from harness.oracle.workload import Step, waves_of
from harness.server import kv_layout, metrics
from harness.server.admin import reset_prefix_cache
from harness.server.workload import Completion, Prompt, complete, within_tolerance

_JOB = re.compile(r"job=\d+ (store|load) bytes=\d+ (.*?) block_indices=\[([0-9, ]*)\]")
_GROUP = re.compile(r"g(\d+):(\d+)@\d+=\d+")


class OracleReporter(Status, Protocol):
    def request_done(self, cell: str, index: int, failing: list[str]) -> None: ...


def moves_from_trace(lines: list[str], groups: int) -> tuple[list[Moved], list[Moved]]:
    """(loads, stores) per group from the host backend's trace lines of one request:
    blocks summed over its jobs, the first block the lowest a job started at."""
    acc: dict[str, list[Moved]] = {
        op: [Moved(0, 0, None) for _ in range(groups)] for op in ("load", "store")
    }
    seen: dict[str, set[int]] = {"load": set(), "store": set()}
    for line in lines:
        if LOG_TRANSFER not in line:
            continue
        for m in _JOB.finditer(line):
            op, body = m.group(1), m.group(2)
            starts = [int(x) for x in m.group(3).replace(" ", "").split(",") if x]
            for g in _GROUP.finditer(body):
                gi, n = int(g.group(1)), int(g.group(2))
                if gi >= groups or not n:
                    continue
                slot = acc[op][gi]
                first = starts[gi] if gi < len(starts) else 0
                slot.first_block = first if gi not in seen[op] else min(slot.first_block, first)
                seen[op].add(gi)
                slot.blocks += n
    return acc["load"], acc["store"]


def engine_layout(cell: Cell, log: Path) -> Layout:
    """The model's layout from the KV-cache groups the engine reported building."""
    report = kv_layout.parse_report(log.read_text(errors="replace").splitlines())
    if not report:
        raise RuntimeFailure(f"the engine reported no KV-cache groups; log: {log}")
    groups: list[Group] = []
    for g in report:
        kind = kv_layout.spec_kind(g)
        if kind not in KINDS:
            raise RuntimeFailure(f"the engine built a group the model has no rules for: {kind}")
        window = int(g.get("sliding_window") or g.get("attention_chunk_size") or 0)
        page = int(g.get("page_size_bytes") or 0) * int(g.get("layers") or 1)
        groups.append(Group(kind, int(g["block_size"]), window, page))
    lay = cell.layout
    chunk = cell.family.chunk_tokens
    return Layout(
        tuple(groups),
        chunk // groups[0].block,
        lay.offload_prompt_only,
        lay.retention_interval,
        lay.max_batched_tokens,
    )


def same_answer(tolerance: float) -> Callable[[Completion, Completion], tuple[bool, str]]:
    def compare(first: Completion, now: Completion) -> tuple[bool, str]:
        close = within_tolerance(first, now, tolerance)
        d = close.divergence
        if d is None:
            return True, f"max logprob difference {close.max_delta:.4g}"
        return False, f"{d.field} differ at {d.position}: {d.left} vs {d.right}"

    return compare


def _send(
    ep: Endpoint, cell: Cell, steps: Sequence[Step], phase: str, logprobs: int, seed: int
) -> list[Completion]:
    """The steps' requests, at once when there are several (each on its own thread, in
    flight together); their completions in order. The first failure is raised."""
    assert cell.spec is not None
    model = cell.spec.served_model_name or cell.spec.model

    def one(step: Step) -> Completion:
        extra: dict[str, Any] = {}
        if step.max_load_tokens is not None:
            extra["kv_transfer_params"] = {"max_load_tokens": step.max_load_tokens}
        return complete(
            ep.base,
            model,
            Prompt(step.request, "oracle", list(step.tokens)),
            phase,
            max_tokens=step.max_tokens,
            logprobs=logprobs,
            seed=seed,
            extra=extra,
        )

    if len(steps) == 1:
        return [one(steps[0])]
    with ThreadPoolExecutor(max_workers=len(steps)) as pool:
        futures = [pool.submit(one, step) for step in steps]
        return [f.result() for f in futures]


def _tier_figures(
    delta: Any, after: Any, names: str, lines: list[str], groups: int
) -> dict[str, Any]:
    """What the counters and the trace show the requests since the last reading did
    together, as ``Observed`` fields; a metric the release does not export is None."""
    loads, stores = moves_from_trace(lines, groups)
    return {
        "hit": int(delta.ext_hits),
        "loads": loads,
        "stores": stores,
        "loaded_bytes": delta.loaded_bytes,
        "stored_bytes": delta.stored_bytes,
        "host_tokens": (
            delta.host_hit_tokens if "vllm:prompt_tokens_cached_by_source" in names else None
        ),
        "allocated_chunks": (
            delta.allocated_chunks if "vllm:kv_offload_cpu_allocation_size" in names else None
        ),
        "usage_after": metrics.tier_usage(after, names),
        "async_lookups": (
            delta.async_lookups if "kv_offload_lookup_async_delay_seconds" in names else None
        ),
    }


def run_server_cell(
    plan: OraclePlan,
    cell: Cell,
    out_dir: Path,
    reporter: OracleReporter,
    on_update: Callable[[CellResult], None],
    port: int | None = None,
) -> CellResult:
    """Launch the cell's server, serve its sequence, judge each request as it lands;
    the server is stopped whatever happens."""
    scn = plan.scenario
    assert cell.spec is not None
    result = CellResult(cell.name, expected_failing=cell.failing_checks)
    log = out_dir / "logs" / f"{cell.name.replace('/', '__')}.log"
    server = cell.spec.server(log, port)
    t0 = time.monotonic()
    try:
        start_server(server, scn.server, reporter, f"server {cell.name}")
        ep = Endpoint(server.url, server)
        model = Offloader(engine_layout(cell, log), cell.deviations)
        n_groups = len(model.layout.groups)
        result.vllm_version = plan.env.vllm_version
        first_answers: dict[tuple[tuple[int, ...], int], Completion] = {}
        compare = same_answer(scn.logprob_tolerance)
        before, _ = ep.snapshot("start")
        offset = log.stat().st_size
        for members in waves_of(cell.steps):
            steps = [cell.steps[i] for i in members]
            phase = f"{cell.name} step {members[0]}"
            if steps[0].reset:
                reset_prefix_cache(server.url, external=True, poll_s=0.2)
                model.reset()
                before = ep.settle(phase, scn.settle_timeout_s)
                offset = log.stat().st_size
                continue
            reset_prefix_cache(server.url, external=False, poll_s=0.2)
            try:
                comps = _send(ep, cell, steps, phase, scn.logprobs, scn.seed)
            except HarnessError as err:
                failure = ep.failure(phase, err)
                obs = Observed(steps[0].request, raised=str(failure))
                result.requests.append(judge(members[0], steps[0].why, None, obs))
                on_update(result)
                break
            after = ep.settle(phase, scn.settle_timeout_s)
            with log.open(errors="replace") as fh:
                fh.seek(offset)
                lines = fh.read().splitlines()
                offset = fh.tell()
            tier = _tier_figures(after - before, after, ep.last_text, lines, n_groups)
            counted_hit = tier.pop("hit")
            before = after
            wave: list[Served] = []
            together = len(steps) > 1
            for pos, (index, step, comp) in enumerate(zip(members, steps, comps, strict=True)):
                last = pos == len(steps) - 1
                # No counter tells a wave's requests apart: each one's hit is its answer's
                # cached tokens (nothing else cached them: the GPU cache was reset, its
                # prompts share no block); the rest is the wave's, given once.
                obs = Observed(
                    step.request,
                    hit=comp.cached_tokens if together else counted_hit,
                    answer=comp,
                    generated=list(comp.token_ids),
                )
                if last:
                    for name, value in tier.items():
                        setattr(obs, name, value)
                    if together:
                        obs.wave_figures = frozenset(tier)
                served = model.serve(request_of(step), obs.generated)
                wave.append(served)
                key = (step.tokens, step.max_tokens)
                earlier = first_answers.get(key)
                judged = judge(
                    index,
                    step.why,
                    served,
                    obs,
                    earlier=earlier,
                    same_answer=compare,
                    wave=wave if together else (),
                )
                if earlier is None:
                    first_answers[key] = comp
                result.requests.append(judged)
                reporter.request_done(cell.name, index, judged.failing)
            on_update(result)
    except HarnessError as err:
        result.error = str(err)
    finally:
        server.stop()
        result.seconds = time.monotonic() - t0
        result.finished = True
    on_update(result)
    return result
