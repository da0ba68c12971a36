"""Scheduler-level triggers for the bug corpus: vLLM's real scheduler, in one process.

A bug in the offloading connector's scheduler side fires on a sequence of schedule
steps, not on a model's numbers. Launching a server to reach it costs a minute and
needs a model, a prompt and a CPU tier primed by earlier requests, and still only
reaches the state by luck. Here vLLM's own ``Scheduler`` (with its KV-cache manager),
the real ``OffloadingConnector`` scheduler side and the real CPU offloading manager are
driven step by step with made-up KV-cache specs, as vLLM's own
``tests/v1/kv_connector/unit`` do (those helpers are not in the wheel, so what they
do for this is here). Nothing runs a model: a fake "worker" reports every transfer job
done at the end of a step, and the CPU tier is filled by calling the manager directly
with the offload keys the connector itself derived for the request.

``python -m harness.engine.scheduler_drive CASE`` (with a release's interpreter and the
checkout on ``PYTHONPATH``) prints one JSON line: the case, the vLLM version, the
outcome (``assert``: an assertion fired in the call the bug lives in; ``ok``: that call
returned; ``error``, exit 3: the drive could not be set up, or something other than an
assertion was raised), the exception and its innermost vLLM frame, the case's figures
and the steps taken. Exit 0 means the drive ran, whichever way the bug went. The same
code runs in every release environment: where releases differ (dataclass fields,
signatures) it asks the installed vLLM.

Loaded with a vLLM interpreter: imports only the standard library, vLLM and
``harness.names``. Importing it does not import vLLM (the unit tests read it without).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import harness.engine.store_cases  # noqa: F401  (its cases add themselves to CASES)
from harness.engine.drive_case import CASES, Case, Drive, case
from harness.engine.drive_report import (
    EXIT_BAD_INPUT,
    EXIT_NOT_SET_UP,
    EXIT_OK,
    OUTCOME_ASSERT,
    OUTCOME_ERROR,
    OUTCOME_FAIL,
    OUTCOME_OK,
    SetupError,
    exception_text,
    innermost_vllm_frame,
    ranges_of,
    result_record,
    stdout_kept_for_result,
    traceback_frames,
)
from harness.engine.scheduler_rig import Rig, kwargs_for, load_vllm

# --- the cases (more in store_cases.py) -------------------------------------------------


@case("swa-unaligned-hit", bug="PR #55712", fixed_in="0.30.0", asserts_in="prepare_load")
def swa_unaligned_hit(drive: Drive) -> None:
    """A hit ending inside a sliding-window chunk loads a window chunk the lookup never checked.

    PR #55712 "[Bugfix][KV Offload] Validate SWA coverage at unaligned cache-hit
    boundaries" (in 0.30.0; 0.27-0.29 have the bug). With groups of different block
    sizes, the full-attention group can end its hit inside a sliding-window chunk: here
    full attention (16-token blocks) hits chunks 0-60, so the hit ends at token 976, a
    quarter into sliding-window chunk 15 (64-token blocks, window 128). The lookup
    checks the window as ``cdiv(sliding_window, tokens_per_chunk)`` = 2 chunks (14, 15),
    but the KV-cache manager keeps every block the last computed token attends to:
    tokens 848-975, chunks 13-15. Chunk 13 is not in the CPU tier, so on 0.27-0.29
    ``prepare_load`` asserts "Block ... not found in cache" (cpu/manager.py). From 0.30
    the lookup widens the first window to 3 chunks, finds 13 missing and settles on the
    window 11-12: the hit shrinks to 832 tokens and the load asks only for what is there.
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    swa = SlidingWindowSpec(
        block_size=64, num_kv_heads=1, head_size=16, dtype=torch.float32, sliding_window=128
    )
    rig = Rig(drive, [("full", fa), ("swa", swa)], extra_config={"blocks_per_chunk": 1})
    try:
        prompt = list(range(1000, 1000 + 4100))
        req = rig.request("r0", prompt)
        rig.scheduler.add_request(req)
        fa_keys, swa_keys = rig.offload_keys("r0")
        fa_present = list(range(61))
        swa_present = [11, 12, 14, 15]
        stored = rig.store([fa_keys[i] for i in fa_present] + [swa_keys[i] for i in swa_present])
        drive.step(
            f"request r0: {len(prompt)} tokens, {len(fa_keys)} full / {len(swa_keys)} window "
            f"chunk keys; CPU tier filled with full {ranges_of(fa_present)}, "
            f"window {ranges_of(swa_present)} ({stored} chunks)"
        )
        drive.figures.update(
            prompt_tokens=len(prompt),
            tokens_per_chunk=rig.tokens_per_chunk,
            cpu_full_chunks=ranges_of(fa_present),
            cpu_window_chunks=ranges_of(swa_present),
        )
        with drive.trigger("schedule()"):
            output = rig.scheduler.schedule()
            drive.figures["scheduled_tokens"] = dict(output.num_scheduled_tokens)
            drive.figures["computed_tokens"] = req.num_computed_tokens
        if rig.lookups:
            drive.figures["gpu_hit_tokens"] = rig.lookups[-1]["gpu_hit"]
            drive.figures["cpu_hit_tokens"] = rig.lookups[-1]["cpu_hit"]
        if rig.loads:
            drive.figures["load_chunks"] = rig.key_names(rig.loads[-1], "r0")
            drive.figures["load_chunks_missing"] = rig.key_names(rig.missing(rig.loads[-1]), "r0")
    finally:
        rig.close()


@case(
    "mamba-unhashed-block",
    bug="PR #52807",
    fixed_in="0.30.0",
    asserts_in="update_state_after_alloc",
)
def mamba_unhashed_block(drive: Drive) -> None:
    """A recurrent group's unhashed block below the GPU hit cuts the load boundary short.

    PR #52807 "[Bugfix][KV Offload] Do not let a recurrent group's unhashed block
    truncate the load boundary" (in 0.30.0; 0.27-0.29 have the bug). Before a load,
    ``update_state_after_alloc`` finds where each group's load starts as the first
    non-null block without a hash, scanning from block 0. A Mamba group needs no per-token
    KV, only a state, so it may hold a non-null unhashed block below the GPU prefix hit;
    the scan then stops inside the locally computed region and the bare
    ``assert num_locally_computed_tokens <= num_locally_computed_gpu_blocks *
    tokens_per_block`` fires (0.27-0.29). From 0.30 the scan starts at the computed
    boundary and the load covers exactly the CPU hit.

    Reached through ``schedule()`` with real state except one block: request S (the
    first 320 tokens) runs, so the GPU prefix cache holds 320 tokens; the CPU tier holds
    request B's chunks up to 960 (full attention 0-59, the Mamba state chunk 59); B (1280
    tokens) is scheduled and the connector looks up a 640-token CPU hit after a 320-token
    GPU hit, both for real. What no sequence of schedule steps tried here produced in any
    release (shared prefixes, GPU eviction, checkpoint and speculative Mamba blocks: the
    Mamba table below the GPU hit is all null blocks) is the unhashed block itself: the
    drive puts one, fresh from the block pool, in B's Mamba table at the GPU-hit
    boundary's last block just before the connector's ``update_state_after_alloc`` reads
    it, as a Mamba state block that kept its slot would sit there.
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    state = {
        "block_size": 16,
        "shapes": ((fa.page_size_bytes // 4,),),
        "dtypes": (torch.float32,),
        "mamba_cache_mode": "align",
    }
    mamba = MambaSpec(**kwargs_for(MambaSpec, **state))
    if getattr(mamba, "mamba_cache_mode", None) != "align":
        raise SetupError("this release's MambaSpec has no mamba_cache_mode='align'")
    rig = Rig(
        drive,
        [("full", fa), ("mamba", mamba)],
        extra_config={"blocks_per_chunk": 1},
        mamba_cache_mode="align",
        num_gpu_blocks=512,
    )
    try:
        prompt = list(range(1000, 1000 + 1280))
        gpu_hit, cpu_end = 320, 960
        s = rig.request("S", prompt[:gpu_hit], max_tokens=1)
        rig.scheduler.add_request(s)
        for _ in range(8):
            rig.finish_step(rig.scheduler.schedule())
            if s.is_finished() and not rig.offload.has_pending_push_work():
                break
        drive.step(f"request S ({gpu_hit} tokens, the shared prefix) ran: {s.status.name}")
        b = rig.request("B", prompt, max_tokens=1)
        rig.scheduler.add_request(b)
        fa_keys, mamba_keys = rig.offload_keys("B")
        tpb = rig.tokens_per_chunk
        fa_chunks = list(range(cpu_end // tpb[0]))
        mamba_chunks = [cpu_end // tpb[1] - 1]
        rig.store([fa_keys[i] for i in fa_chunks] + [mamba_keys[i] for i in mamba_chunks])
        drive.step(
            f"request B ({len(prompt)} tokens): CPU tier filled with full "
            f"{ranges_of(fa_chunks)}, Mamba {ranges_of(mamba_chunks)}"
        )
        drive.figures.update(
            prompt_tokens=len(prompt),
            tokens_per_chunk=tpb,
            cpu_full_chunks=ranges_of(fa_chunks),
            cpu_mamba_chunks=ranges_of(mamba_chunks),
        )
        alloc = rig.connector.update_state_after_alloc
        pool = rig.scheduler.kv_cache_manager.block_pool

        def with_unhashed_state_block(request: Any, blocks: Any, num_external: int) -> Any:
            if request.request_id == "B" and num_external:
                table = blocks.blocks[1]
                local = rig.lookups[-1]["gpu_hit"]
                idx = local // mamba.block_size - 1
                if 0 <= idx < len(table) and table[idx].is_null:
                    table[idx] = pool.get_new_blocks(1)[0]
                    drive.figures["unhashed_mamba_block_index"] = idx
                    drive.figures["mamba_table"] = "".join(
                        "." if blk.is_null else ("H" if blk.block_hash is not None else "u")
                        for blk in table
                    )
                    drive.step(
                        f"B's Mamba block {idx} (tokens {idx * mamba.block_size}-"
                        f"{(idx + 1) * mamba.block_size - 1}): null -> a non-null unhashed block"
                    )
            return alloc(request, blocks, num_external)

        rig.connector.update_state_after_alloc = with_unhashed_state_block
        with drive.trigger("schedule()"):
            output = rig.scheduler.schedule()
            drive.figures["computed_tokens"] = b.num_computed_tokens
            drive.figures["scheduled_tokens"] = dict(output.num_scheduled_tokens)
        lookup = [x for x in rig.lookups if x["req"] == "B"]
        if lookup:
            drive.figures["gpu_hit_tokens"] = lookup[-1]["gpu_hit"]
            drive.figures["cpu_hit_tokens"] = lookup[-1]["cpu_hit"]
        if "unhashed_mamba_block_index" not in drive.figures:
            raise SetupError(f"B's lookup did not give a GPU hit and a CPU hit: {lookup}")
        if rig.loads:
            drive.figures["load_chunks"] = rig.key_names(rig.loads[-1], "B")
    finally:
        rig.close()


@case(
    "missing-offload-key",
    bug="#52170 / PR #52923",
    fixed_in="0.30.0",
    asserts_in="_build_store_jobs",
)
def missing_offload_key(drive: Drive) -> None:
    """A store is built for a chunk whose block hash is not there yet.

    #52170 / PR #52923 "[Bugfix] Wait for offload keys before storing chunks" (in
    0.30.0; 0.27-0.29 have the bug). The connector's offload keys come from the
    request's block hashes, which can lag the blocks the scheduler has computed (here:
    the last of the 32 hashes of a 512-token prompt is held back before the request is
    added; prefix caching off, so nothing else reads them). The request asks for prompt
    logprobs, so it skips reading any cache and the connector does no lookup (a lookup
    would assert first, on every release: it requires a key for every whole chunk of
    the prompt). ``_build_store_jobs`` pairs
    each storable chunk (256 tokens, 16 blocks of 16) with its key and on 0.27-0.29
    asserts ``len(offload_keys) == len(offload_block_ids)`` (2 chunks computed, 1
    key). From 0.30 storable chunks are capped by the keys there are: chunk 0 is stored
    and chunk 1 waits; the step's sampled token makes the request hash its blocks again,
    and the next schedule stores chunk 1.
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    rig = Rig(
        drive,
        [("full", fa)],
        extra_config={"blocks_per_chunk": 16},
        enable_prefix_caching=False,
    )
    try:
        req = rig.request("r0", list(range(1000, 1000 + 512)), prompt_logprobs=1)
        del req.block_hashes[-1]
        drive.step(
            f"request r0: 512 tokens, {len(req.block_hashes)} of 32 block hashes "
            "(the last held back)"
        )
        rig.scheduler.add_request(req)
        stores: list[list[bytes]] = []
        prepare_store = rig.manager.prepare_store

        def spy_store(keys: Any, *args: Any, **kw: Any) -> Any:
            stores.append(list(keys))
            return prepare_store(keys, *args, **kw)

        rig.manager.prepare_store = spy_store
        drive.figures.update(
            prompt_tokens=512,
            tokens_per_chunk=rig.tokens_per_chunk,
            block_hashes=len(req.block_hashes),
            offload_keys=len(rig.offload_keys("r0")[0]),
        )
        with drive.trigger("schedule()"):
            output = rig.scheduler.schedule()
            drive.figures["scheduled_tokens"] = dict(output.num_scheduled_tokens)
            meta = output.kv_connector_metadata
            drive.figures["store_jobs"] = len(meta.store_jobs) if meta else 0
        drive.figures["stored_chunks"] = rig.key_names([k for ks in stores for k in ks], "r0")
        if drive.triggered is None:
            # The step's sampled token makes the request hash its blocks again: the held
            # back hash arrives, and the chunk that waited for it is stored now.
            stores.clear()
            rig.finish_step(output)
            drive.step(f"step done: r0 has {len(req.block_hashes)} block hashes; schedule()")
            rig.scheduler.schedule()
            drive.figures["stored_chunks_next_step"] = rig.key_names(
                [k for ks in stores for k in ks], "r0"
            )
    finally:
        rig.close()


# --- running a case ----------------------------------------------------------------------


def run_case(name: str) -> tuple[dict[str, Any], int]:
    """Run one case; (the JSON record, the exit code)."""
    drive = Drive(name)
    version: str | None = None
    t0 = time.monotonic()
    try:
        version = load_vllm()
        drive.step(f"vllm {version} imported ({time.monotonic() - t0:.1f} s)")
        CASES[name].run(drive)
    except Exception as exc:  # the drive could not be set up
        drive.figures["wall_s"] = round(time.monotonic() - t0, 2)
        record = result_record(
            name,
            version,
            OUTCOME_ERROR,
            exception=exception_text(exc),
            frame=innermost_vllm_frame(traceback_frames(exc.__traceback__)),
            figures=drive.figures,
            steps=drive.steps,
        )
        return record, EXIT_NOT_SET_UP
    drive.figures["wall_s"] = round(time.monotonic() - t0, 2)
    if drive.triggered is not None:
        record = result_record(
            name,
            version,
            OUTCOME_ASSERT,
            exception=exception_text(drive.triggered),
            frame=innermost_vllm_frame(traceback_frames(drive.trigger_tb)),
            figures=drive.figures,
            steps=drive.steps,
        )
    else:
        outcome = OUTCOME_FAIL if drive.failing else OUTCOME_OK
        record = result_record(
            name, version, outcome, figures=drive.figures, steps=drive.steps, failing=drive.failing
        )
    return record, EXIT_OK


def every_case() -> dict[str, Case]:
    """Every case by name: this module's and ``store_cases``' (imported above for it)."""
    return dict(CASES)


def list_lines() -> list[str]:
    """One line per case: name, upstream bug, fixed-in release, how it shows, summary."""
    return [
        f"{c.name}\t{c.bug}\tfixed in {c.fixed_in}\t{c.shows_as}\t{c.summary}"
        for c in CASES.values()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases named, in order, in this one process: one JSON line each.

    Importing vLLM and torch is most of a drive's time (10-21 s here, the cases a
    fraction of a second), so the corpus runs every case of a build in one process.
    Each case builds its own scheduler, connector and manager and closes them, so no
    state passes from one to the next; the exit code is the worst of the cases'."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.engine.scheduler_drive",
        description="Drive vLLM's scheduler and offloading connector into a known bug.",
    )
    parser.add_argument("cases", nargs="*", metavar="case", help="the cases to run (see --list)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(list_lines()))
        return EXIT_OK
    unknown = [c for c in args.cases if c not in CASES] or ([] if args.cases else [None])
    if unknown:
        print(f"unknown case {unknown[0]!r}; cases: {', '.join(CASES)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    worst = EXIT_OK
    with stdout_kept_for_result() as result:
        for name in dict.fromkeys(args.cases):
            record, code = run_case(name)
            result.write(json.dumps(record) + "\n")
            result.flush()
            worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main())
