"""Host-copy throughput of the offload worker, as a ratio to a plain torch copy.

Why this exists: the harness's CPU offload backend (``HostOffloadingWorker``) replaces
vLLM's CUDA copy kernels with torch indexing, and a round-trip scenario only means
something if that path is not itself the bottleneck - a slow worker would stretch every
store and load and hide (or fake) the scheduling effects under study. Absolute GB/s on
these machines (2 shared, noisy cores) says little, so the figure that matters is the
worker's throughput divided by that of the plainest torch copy of the same bytes between
tensors of the same shapes, measured in the same process and interleaved (A B A B ...) so
that drift in machine load falls on both sides alike. The copied bytes are checked after
every sample, so a broken or short-circuited copy cannot pass for a fast one.

A third side, a per-block ``copy_`` loop, is there because torch's advanced indexing on
CPU is not the floor it looks like: it moves int8 rows element by element and measured
several times slower than one memcpy per KV page on the same data, so a worker that merely
keeps up with indexing can still be well short of what the machine does.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from harness.engine.host_offload import HostOffloadingWorker

__all__ = ["measure_host_copy"]

# Llama-4-like engine cache under the hybrid allocator: one bf16 tensor of shape
# (blocks, K/V, tokens, kv_heads, head_dim), aliased by 4 KV-cache groups of one layer each.
_KV, _TOKENS, _HEADS, _HEAD_DIM = 2, 16, 8, 64
_PAGE_BYTES = _KV * _TOKENS * _HEADS * _HEAD_DIM * 2  # bf16: 32 KiB per block per group
_NUM_GROUPS = 4
_BLOCKS_PER_CHUNK = 2
_SEED = 0


def _gbps(num_bytes: int, seconds: float) -> float:
    return num_bytes / seconds / 1e9 if seconds > 0 else float("inf")


def _zero_blocks(matrix: torch.Tensor, ids: list[int]) -> None:
    # One small op per block: indexing an int8 matrix is as slow as the copy under test.
    for block in ids:
        matrix[block].zero_()


def _blocks_equal(matrix: torch.Tensor, ids: list[int], expected: torch.Tensor) -> bool:
    return all(torch.equal(matrix[block], expected[i]) for i, block in enumerate(ids))


def measure_host_copy(repeats: int = 5, total_bytes: int = 64 * 2**20) -> dict[str, Any]:
    """Time ``HostOffloadingWorker`` store+load against a plain torch copy, interleaved.

    ``total_bytes`` is the KV volume of one store (rounded down to whole host chunks per
    group); the following load moves the same amount back into other engine blocks, so each
    sample moves ``2 * total_bytes``. Sides: ``worker``, ``plain`` (advanced indexing,
    ``host[rows] = engine[ids]`` and back) and ``blockwise`` (one ``copy_`` per KV page).
    Returns medians, GB/s, ``ratio = worker_gbps / plain_gbps``,
    ``ratio_vs_blockwise = worker_gbps / blockwise_gbps`` and every sample, in seconds.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    blocks_per_group = total_bytes // (_PAGE_BYTES * _NUM_GROUPS)
    blocks_per_group -= blocks_per_group % _BLOCKS_PER_CHUNK
    if blocks_per_group < _BLOCKS_PER_CHUNK:
        raise ValueError(
            f"total_bytes={total_bytes} is below one host chunk per group "
            f"({_PAGE_BYTES * _NUM_GROUPS * _BLOCKS_PER_CHUNK} B)"
        )
    num_moved = blocks_per_group * _NUM_GROUPS  # engine blocks per store (and per load)
    num_blocks = 2 * num_moved  # sources and destinations are disjoint
    num_chunks = num_moved // _BLOCKS_PER_CHUNK
    bytes_per_direction = num_moved * _PAGE_BYTES

    gen = torch.Generator().manual_seed(_SEED)
    # Scattered, as a block pool hands them out after some churn; groups get disjoint blocks.
    perm = torch.randperm(num_blocks, generator=gen)
    src_ids = perm[:num_moved]
    dst_ids = perm[num_moved:]
    chunk_ids = torch.randperm(num_chunks, generator=gen)

    # --- worker side: the engine tensor as the attention backend allocates it ----------
    engine_raw = torch.zeros((num_blocks, _PAGE_BYTES), dtype=torch.int8)
    engine_raw[src_ids] = torch.randint(
        -128, 128, (num_moved, _PAGE_BYTES), dtype=torch.int8, generator=gen
    )
    engine_kv = engine_raw.view(torch.bfloat16).view(num_blocks, _KV, _TOKENS, _HEADS, _HEAD_DIM)
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=engine_kv, page_size_bytes=_PAGE_BYTES)],
        group_data_refs=[
            [CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=_PAGE_BYTES)]
            for _ in range(_NUM_GROUPS)
        ],
    )
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=_BLOCKS_PER_CHUNK, num_cpu_chunks=num_chunks
    )
    # The same worker keeping the content ledger (a digest per block and layer at every
    # store and load, one JSON line per job): what the ledger adds to each copy.
    ledger_dir = tempfile.mkdtemp(prefix="oc-bench-ledger-")
    ledgered = HostOffloadingWorker(
        caches,
        blocks_per_chunk=_BLOCKS_PER_CHUNK,
        num_cpu_chunks=num_chunks,
        ledger_dir=ledger_dir,
    )
    sizes = [blocks_per_group] * _NUM_GROUPS
    starts = [0] * _NUM_GROUPS
    # Specs come from the scheduler in the real connector, so they are built untimed.
    store_src = GPULoadStoreSpec(src_ids.tolist(), group_sizes=sizes, block_indices=starts)
    load_dst = GPULoadStoreSpec(dst_ids.tolist(), group_sizes=sizes, block_indices=starts)
    host_spec = CPULoadStoreSpec(chunk_ids.tolist())

    # --- plain sides: same shapes, same block ids, same host row for every block -------
    # Chunk ids are listed group after group, blocks_per_chunk engine blocks per chunk.
    flat = torch.arange(num_moved)
    host_rows = chunk_ids[flat // _BLOCKS_PER_CHUNK] * _BLOCKS_PER_CHUNK + flat % _BLOCKS_PER_CHUNK
    plain_engine = engine_raw.clone()
    plain_host = torch.zeros_like(worker.host_buffer)
    plain_host_rows = plain_host.view(num_chunks * _BLOCKS_PER_CHUNK, _PAGE_BYTES)
    block_engine = engine_raw.clone()
    block_host = torch.zeros_like(worker.host_buffer)
    block_host_rows = block_host.view(num_chunks * _BLOCKS_PER_CHUNK, _PAGE_BYTES)
    src_list = src_ids.tolist()
    dst_list = dst_ids.tolist()
    row_list = host_rows.tolist()
    store_pairs = [
        (block_host_rows[r], block_engine[s]) for r, s in zip(row_list, src_list, strict=True)
    ]
    load_pairs = [
        (block_engine[d], block_host_rows[r]) for r, d in zip(row_list, dst_list, strict=True)
    ]

    expected_src = engine_raw[src_ids].clone()
    job_id = 0

    def reset() -> None:
        for matrix in (engine_raw, plain_engine, block_engine):
            _zero_blocks(matrix, dst_list)
        for host in (worker.host_buffer, plain_host, block_host):
            host.zero_()

    def check(engine: torch.Tensor, host: torch.Tensor, side: str) -> None:
        assert _blocks_equal(engine, dst_list, expected_src), f"{side} round trip lost bytes"
        # Same host placement as the worker's, so every side did the same byte movement.
        assert torch.equal(host, worker.host_buffer), f"{side} host differs from the worker's"

    def run_worker() -> tuple[float, int]:
        nonlocal job_id
        job_id += 2
        start = time.perf_counter()
        ok_store = worker.submit_store(job_id - 1, store_src, host_spec)
        ok_load = worker.submit_load(job_id, host_spec, load_dst)
        elapsed = time.perf_counter() - start
        results = worker.get_finished()
        assert ok_store and ok_load, "worker refused a job"
        assert sorted(r.job_id for r in results) == [job_id - 1, job_id], results
        assert all(r.success for r in results), results
        moved = sum(r.transfer_size or 0 for r in results)
        assert moved == 2 * bytes_per_direction, (moved, 2 * bytes_per_direction)
        assert _blocks_equal(engine_raw, dst_list, expected_src), "worker round trip lost bytes"
        return elapsed, moved

    def run_ledgered() -> float:
        nonlocal job_id
        job_id += 2
        _zero_blocks(engine_raw, dst_list)
        start = time.perf_counter()
        ledgered.submit_store(job_id - 1, store_src, host_spec)
        ledgered.submit_load(job_id, host_spec, load_dst)
        elapsed = time.perf_counter() - start
        assert len(ledgered.get_finished()) == 2
        assert _blocks_equal(engine_raw, dst_list, expected_src), "ledgered round trip lost bytes"
        return elapsed

    def run_plain() -> float:
        start = time.perf_counter()
        plain_host_rows[host_rows] = plain_engine[src_ids]
        plain_engine[dst_ids] = plain_host_rows[host_rows]
        elapsed = time.perf_counter() - start
        check(plain_engine, plain_host, "plain")
        return elapsed

    def run_blockwise() -> float:
        start = time.perf_counter()
        for dst, src in store_pairs:
            dst.copy_(src)
        for dst, src in load_pairs:
            dst.copy_(src)
        elapsed = time.perf_counter() - start
        check(block_engine, block_host, "blockwise")
        return elapsed

    # Warm-up: first touch of every page (and torch's kernel dispatch) is not a copy cost.
    reset()
    run_worker()
    run_ledgered()
    run_plain()
    run_blockwise()

    worker_s: list[float] = []
    plain_s: list[float] = []
    block_s: list[float] = []
    ledger_s: list[float] = []
    moved_bytes = 0
    for _ in range(repeats):  # A B C D A B C D ...
        reset()
        seconds, moved_bytes = run_worker()
        worker_s.append(seconds)
        ledger_s.append(run_ledgered())
        plain_s.append(run_plain())
        block_s.append(run_blockwise())
    worker.shutdown()
    ledgered.shutdown()
    shutil.rmtree(ledger_dir, ignore_errors=True)

    worker_median = statistics.median(worker_s)
    plain_median = statistics.median(plain_s)
    worker_gbps = _gbps(moved_bytes, worker_median)
    plain_gbps = _gbps(moved_bytes, plain_median)
    block_median = statistics.median(block_s)
    block_gbps = _gbps(moved_bytes, block_median)
    return {
        "repeats": repeats,
        "layout": (
            f"1 bf16 tensor ({num_blocks}, {_KV}, {_TOKENS}, {_HEADS}, {_HEAD_DIM}), "
            f"{_NUM_GROUPS} aliased groups, page {_PAGE_BYTES} B, "
            f"blocks_per_chunk {_BLOCKS_PER_CHUNK}"
        ),
        "blocks_per_store": num_moved,
        "host_chunks": num_chunks,
        "bytes_per_direction": bytes_per_direction,
        "bytes_moved": moved_bytes,
        "torch_threads": torch.get_num_threads(),
        "worker_median_s": worker_median,
        "plain_median_s": plain_median,
        "worker_gbps": worker_gbps,
        "plain_gbps": plain_gbps,
        "ratio": worker_gbps / plain_gbps,
        "blockwise_median_s": block_median,
        "blockwise_gbps": block_gbps,
        "ratio_vs_blockwise": worker_gbps / block_gbps,
        "ledger_median_s": statistics.median(ledger_s),
        # What the content ledger adds per byte moved (negative: within the noise).
        "ledger_extra_s_per_gb": (statistics.median(ledger_s) - worker_median) / moved_bytes * 1e9,
        "ledger_over_worker": statistics.median(ledger_s) / worker_median,
        "ledger_samples_s": ledger_s,
        "worker_samples_s": worker_s,
        "plain_samples_s": plain_s,
        "blockwise_samples_s": block_s,
    }
