"""Host-memory KV offload backend for vLLM's ``OffloadingConnector`` on the CPU platform.

vLLM's stock ``CPUOffloadingSpec`` refuses to build its worker unless the platform is
CUDA-alike or XPU, so on a CPU-only machine the connector could never move a byte. This
module keeps the stock *scheduler* side untouched (``get_manager`` and everything it drives,
including the chunked-local-attention reachability logic this project studies) and swaps
only the *worker* side for one that copies bytes with plain torch indexing on CPU tensors.

Enable it with::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "HostOffloadingSpec",
        "spec_module_path": "harness.engine.host_offload",
        "cpu_bytes_to_use": 1073741824, "block_size": 256}}'

Extra-config keys read here (besides the stock ones): ``offload_check_fault`` (see
``host_faults.FAULT_MODES``), fixed for the server's life, or
``offload_check_fault_control``: the path of a file holding a fault mode, re-read whenever
it changes, so one server can prove the clean run and several faults in turn
(``offload-check faults`` writes it between round trips, while the server is idle).

The byte mapping mirrors ``vllm.v1.kv_offload.cpu.gpu_worker`` (direct, worker-private
layout) so ``transfer_size`` is the exact number of KV bytes this rank moved,
which is what vLLM's ``kv_offload_{store,load}_bytes`` counters sum across ranks.

Only the standard library, torch and vLLM may be imported: vLLM imports this module in its
API server, EngineCore and worker processes.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from harness.engine.content_ledger import Ledger, digests, open_ledger, record_assignments
from harness.engine.host_faults import FAULT_CONTROL_KEY, FAULT_KEY, FaultControl, parse_fault_mode
from harness.names import (
    ENV_TRACE,
    FAULT_CORRUPT_LOAD,
    FAULT_DROP_STORE,
    FAULT_LOAD_NEIGHBOUR,
    FAULT_NO_LOAD,
    FAULT_NONE,
    FAULT_OVERCOUNT_LOAD,
    FAULT_PARTIAL_LOAD,
    FAULT_PARTIAL_STORE,
    FAULT_SEGV,
    LOG_HOST_WORKER,
    LOG_TRANSFER,
)

__all__ = [
    "HostOffloadingSpec",
    "HostOffloadingWorker",
    "HostWorkerSpec",
]

# A logger under the "vllm" namespace: vLLM configures handlers only for that tree, so a
# plain module logger's INFO lines would be swallowed inside the engine processes.
logger = init_logger(f"vllm.offload_check.{__name__}")

_CORRUPT_XOR_MASK = 0x01
# OFFLOAD_CHECK_TRACE=1: print every transfer job (group, blocks, bytes) to the server log.
_TRACE = os.environ.get(ENV_TRACE) == "1"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _as_block_matrix(tensor: torch.Tensor, page_size_bytes: int) -> torch.Tensor:
    """Return an int8 (num_blocks, page_size_bytes) view, as the stock worker builds it.

    The stock worker does ``tensor.view(int8).view(-1, page)``; the connector already hands
    over 2-D int8 views whose row stride may exceed the page (packed layouts), where a plain
    ``view`` would fail, so those are used as they are.
    """
    if tensor.dtype == torch.int8 and tensor.ndim == 2 and tensor.shape[1] == page_size_bytes:
        return tensor
    return tensor.view(torch.int8).view(-1, page_size_bytes)


@dataclass(frozen=True)
class _GroupSlice:
    """Where one KV-cache group's blocks of a job live on each side of the copy."""

    group_idx: int
    engine_block_ids: torch.Tensor
    host_rows: torch.Tensor
    host_subs: torch.Tensor


class HostOffloadingWorker(OffloadingWorker):
    """Synchronous host-memory twin of vLLM's ``CPUOffloadingWorker``.

    The copies run inline in ``submit_*``: on the CPU platform the forward pass has finished
    writing the KV before the connector submits a store, and a load is submitted before the
    forward that reads it, so there is no stream to overlap with. Results are still queued
    for ``get_finished`` so the connector's bookkeeping sees the usual asynchronous contract.

    Host layout (mirrors the stock shared-region worker cell): one private buffer of shape
    ``(num_chunks, row_bytes)``; inside a row, the canonical tensors follow one another, each
    taking ``page_size_bytes * blocks_per_chunk`` bytes, and KV block ``j`` of a chunk sits at
    ``j * page_size_bytes`` within its tensor's slot. ``row_bytes`` is the spec's
    ``cpu_page_size_per_worker`` when given, so the budget in ``cpu_bytes_to_use`` holds.
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_cpu_chunks: int,
        *,
        cpu_page_size_per_worker: int | None = None,
        fault: str = FAULT_NONE,
        fault_control: str | None = None,
        rank: int = 0,
        host_rows: torch.Tensor | None = None,
        row_offset: int = 0,
        ledger_dir: str | None = None,
    ) -> None:
        """``host_rows``: an int8 ``(num_chunks, row_stride)`` tensor to hold the chunks in
        place of a private buffer, this rank's part of each row starting at ``row_offset``
        (``harness.engine.host_tiering`` passes vLLM's shared region, which the secondary
        tiers read and write from the scheduler process). ``ledger_dir``: where this
        rank's content ledger goes (default: ``OFFLOAD_CHECK_LEDGER``, or none)."""
        if blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
        if not kv_caches.tensors:
            raise ValueError("HostOffloadingWorker needs at least one KV cache tensor")
        self._fixed_fault = parse_fault_mode(fault)
        if fault_control and self._fixed_fault != FAULT_NONE:
            raise ValueError(f"give {FAULT_KEY} or {FAULT_CONTROL_KEY}, not both")
        self._control = FaultControl(fault_control) if fault_control else None
        self.rank = rank
        self.blocks_per_chunk = blocks_per_chunk
        self.num_cpu_chunks = max(int(num_cpu_chunks), 0)
        self.group_refs: list[list[CanonicalKVCacheRef]] = [
            list(refs) for refs in kv_caches.group_data_refs
        ]

        self.engine_tensors: list[torch.Tensor] = []
        self.page_sizes: list[int] = []
        for canonical in kv_caches.tensors:
            self.engine_tensors.append(
                _as_block_matrix(canonical.tensor, canonical.page_size_bytes)
            )
            self.page_sizes.append(canonical.page_size_bytes)

        for group_idx, refs in enumerate(self.group_refs):
            for ref in refs:
                padded = self.page_sizes[ref.tensor_idx]
                if ref.page_size_bytes > padded:
                    raise ValueError(
                        f"group {group_idx}: ref page {ref.page_size_bytes} B exceeds "
                        f"its tensor's page {padded} B"
                    )

        slot_sizes = [page * blocks_per_chunk for page in self.page_sizes]
        needed_row_bytes = sum(slot_sizes)
        if cpu_page_size_per_worker is None:
            self.row_bytes = needed_row_bytes
        elif cpu_page_size_per_worker >= needed_row_bytes:
            self.row_bytes = int(cpu_page_size_per_worker)
        else:
            # The stock shared-region worker asserts the same thing: the spec sized the host
            # budget from a per-block byte count that does not cover these KV tensors.
            raise ValueError(
                f"host chunk of {cpu_page_size_per_worker} B per worker cannot hold "
                f"{needed_row_bytes} B of KV ({len(slot_sizes)} tensors x "
                f"{blocks_per_chunk} blocks)"
            )

        if host_rows is None:
            self.host_buffer = torch.zeros(
                (self.num_cpu_chunks, self.row_bytes), dtype=torch.int8, device="cpu"
            )
            stride = self.row_bytes
        else:
            rows, stride = host_rows.shape
            if rows < self.num_cpu_chunks or row_offset + needed_row_bytes > stride:
                raise ValueError(
                    f"host rows {tuple(host_rows.shape)} cannot hold {self.num_cpu_chunks} "
                    f"chunks of {needed_row_bytes} B at offset {row_offset}"
                )
            self.host_buffer = host_rows
        # Per canonical tensor: (num_chunks, blocks_per_chunk, page) strided views into the
        # buffer, so a KV block maps to (chunk row, block-in-chunk) with no arithmetic on
        # raw pointers.
        self.host_views: list[torch.Tensor] = []
        offset = row_offset
        for page, slot in zip(self.page_sizes, slot_sizes, strict=True):
            self.host_views.append(
                torch.as_strided(
                    self.host_buffer,
                    size=(self.num_cpu_chunks, blocks_per_chunk, page),
                    stride=(stride, page, 1),
                    storage_offset=offset,
                )
            )
            offset += slot
        self._row_stride = stride

        self._finished: deque[TransferResult] = deque()
        self._ledger: Ledger | None = open_ledger(f"worker-rank{rank}", ledger_dir)
        logger.info(
            "%s rank %d, %d groups, %d tensors, "
            "%d host chunks x %d B, blocks_per_chunk %d, fault=%s",
            LOG_HOST_WORKER,
            rank,
            len(self.group_refs),
            len(self.engine_tensors),
            self.num_cpu_chunks,
            self.row_bytes,
            blocks_per_chunk,
            f"control:{fault_control}" if self._control else self._fixed_fault,
        )

    @property
    def fault(self) -> str:
        """The fault in force now: fixed at start, or the control file's current mode."""
        return self._control.mode() if self._control else self._fixed_fault

    def host_chunk_view(self, tensor_idx: int) -> torch.Tensor:
        """The stock worker's ``cpu_tensors[tensor_idx]``: (num_chunks, page * blocks_per_chunk).

        Exposed so tests can check the byte placement against vLLM's own pointer maths.
        """
        page = self.page_sizes[tensor_idx]
        view = self.host_views[tensor_idx]
        return torch.as_strided(
            self.host_buffer,
            size=(self.num_cpu_chunks, page * self.blocks_per_chunk),
            stride=(self._row_stride, 1),
            storage_offset=view.storage_offset(),
        )

    def _plan(self, engine_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec) -> list[_GroupSlice]:
        """Split a job into per-group index sets exactly as the stock ``transfer_async`` does.

        Engine-side blocks are listed group after group (``group_sizes``). Host-side chunk ids
        are too, but a group's first chunk may be entered part-way: ``block_indices[g] %
        blocks_per_chunk`` blocks are skipped at its start, and the last chunk may be cut short.
        """
        if not isinstance(host_spec, BlockIDsLoadStoreSpec):
            raise TypeError(f"host spec must carry block ids, got {type(host_spec).__name__}")
        engine_ids = torch.as_tensor(engine_spec.block_ids, dtype=torch.int64).reshape(-1)
        chunk_ids = torch.as_tensor(host_spec.block_ids, dtype=torch.int64).reshape(-1)
        group_sizes: Sequence[int] = engine_spec.group_sizes
        block_indices: Sequence[int] = engine_spec.block_indices
        if len(group_sizes) != len(self.group_refs) or len(block_indices) != len(self.group_refs):
            raise ValueError(
                f"job has {len(group_sizes)} group sizes / {len(block_indices)} block "
                f"indices, worker has {len(self.group_refs)} groups"
            )

        bpc = self.blocks_per_chunk
        plan: list[_GroupSlice] = []
        engine_offset = 0
        host_offset = 0
        for group_idx, (size, first_block) in enumerate(
            zip(group_sizes, block_indices, strict=True)
        ):
            size = int(size)
            if size == 0:
                continue
            skip = int(first_block) % bpc
            num_chunks = _cdiv(size + skip, bpc)
            group_chunks = chunk_ids[host_offset : host_offset + num_chunks]
            group_blocks = engine_ids[engine_offset : engine_offset + size]
            if len(group_chunks) != num_chunks or len(group_blocks) != size:
                raise ValueError(
                    f"group {group_idx}: job lists too few block ids "
                    f"(need {size} engine blocks and {num_chunks} host chunks)"
                )
            flat = torch.arange(skip, skip + size, dtype=torch.int64)
            plan.append(
                _GroupSlice(
                    group_idx=group_idx,
                    engine_block_ids=group_blocks,
                    host_rows=group_chunks[flat // bpc],
                    host_subs=flat % bpc,
                )
            )
            engine_offset += size
            host_offset += num_chunks
        if engine_offset != len(engine_ids) or host_offset != len(chunk_ids):
            raise ValueError(
                f"job block ids not fully consumed: engine {engine_offset}/{len(engine_ids)}, "
                f"host {host_offset}/{len(chunk_ids)}"
            )
        return plan

    def _transfer(
        self,
        job_id: int,
        engine_spec: LoadStoreSpec,
        host_spec: LoadStoreSpec,
        to_host: bool,
    ) -> bool:
        if not isinstance(engine_spec, GPULoadStoreSpec):
            raise TypeError(f"engine spec must be GPULoadStoreSpec, got {type(engine_spec)}")
        start = time.perf_counter()
        plan = self._plan(engine_spec, host_spec)
        fault = self.fault  # one read per job: a switch never splits a job
        skip_copy = (to_host and fault == FAULT_DROP_STORE) or (
            not to_host and fault == FAULT_NO_LOAD
        )
        corrupt = not to_host and fault == FAULT_CORRUPT_LOAD
        neighbour = not to_host and fault == FAULT_LOAD_NEIGHBOUR

        partial = (to_host and fault == FAULT_PARTIAL_STORE) or (
            not to_host and fault == FAULT_PARTIAL_LOAD
        )
        num_bytes = 0
        group_bytes: dict[int, int] = {}
        for group in plan:
            if partial and group.group_idx > 0:
                continue
            for ref in self.group_refs[group.group_idx]:
                page = ref.page_size_bytes
                # Counted like the stock worker: whole un-padded pages per block and ref.
                num_bytes += len(group.engine_block_ids) * page
                group_bytes[group.group_idx] = (
                    group_bytes.get(group.group_idx, 0) + len(group.engine_block_ids) * page
                )
                if skip_copy:
                    continue
                engine = self.engine_tensors[ref.tensor_idx]
                host = self.host_views[ref.tensor_idx]
                if to_host:
                    host[group.host_rows, group.host_subs, :page] = engine[
                        group.engine_block_ids, :page
                    ]
                else:
                    rows = group.host_rows
                    if neighbour:
                        rows = (rows + 1) % self.num_cpu_chunks
                    data = host[rows, group.host_subs, :page]
                    if corrupt:
                        data = torch.bitwise_xor(data, _CORRUPT_XOR_MASK)
                    engine[group.engine_block_ids, :page] = data

        if self._ledger is not None:
            self._write_ledger(job_id, plan, to_host)
        if _TRACE:
            # One line per job: per group, blocks moved @ first host slot = bytes. The
            # stress run's byte ledger reads it (harness.commands.stress.checks.parse_transfers),
            # and people reading server.log diagnose a byte check with it.
            groups = " ".join(
                f"g{g.group_idx}:{len(g.engine_block_ids)}@"
                f"{int(g.host_subs[0]) if len(g.host_subs) else 0}"
                f"={group_bytes.get(g.group_idx, 0)}"
                for g in plan
            )
            # One write per line: TP ranks share the log, and print() writes the text
            # and the newline apart, so two ranks' records could share a line.
            sys.stderr.write(
                f"{LOG_TRANSFER} job={job_id} {'store' if to_host else 'load'} "
                f"bytes={num_bytes} {groups} block_indices="
                f"{list(engine_spec.block_indices)}\n"
            )
            sys.stderr.flush()
        reported = num_bytes
        if not to_host and fault == FAULT_OVERCOUNT_LOAD:
            reported = 2 * num_bytes  # the counter lies; the trace above does not
        self._finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=reported,
                transfer_time=time.perf_counter() - start,
            )
        )
        return True

    def _write_ledger(self, job_id: int, plan: list[_GroupSlice], to_host: bool) -> None:
        """The job's blocks in the content ledger: per group, slot row and block within
        the chunk, a digest of each layer tensor's bytes of the engine's block (a store's
        source, a load's destination once copied), read where the KV lives."""
        assert self._ledger is not None
        blocks: list[list[Any]] = []
        for group in plan:
            per_ref = [
                digests(
                    self.engine_tensors[ref.tensor_idx][
                        group.engine_block_ids, : ref.page_size_bytes
                    ]
                )
                for ref in self.group_refs[group.group_idx]
            ]
            for i in range(len(group.engine_block_ids)):
                blocks.append(
                    [
                        group.group_idx,
                        int(group.host_rows[i]),
                        int(group.host_subs[i]),
                        [d[i] for d in per_ref],
                    ]
                )
        self._ledger.write(
            {
                "op": "store" if to_host else "load",
                "rank": self.rank,
                "job": job_id,
                "blocks": blocks,
            }
        )

    def submit_store(
        self,
        job_id: int,
        src_spec: GPULoadStoreSpec,
        dst_spec: LoadStoreSpec,
        **kwargs: Any,
    ) -> bool:
        """Engine KV -> host. ``**kwargs`` absorbs flags later vLLM versions add."""
        return self._transfer(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        **kwargs: Any,
    ) -> bool:
        """Host -> engine KV. ``**kwargs`` absorbs e.g. 0.33's ``expedited``."""
        return self._transfer(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        if self.fault == FAULT_SEGV:
            ctypes.string_at(0)  # SIGSEGV: a real invalid read, in vLLM's worker step
        results = list(self._finished)
        self._finished.clear()
        return results

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every submitted job finished inside ``submit_*``."""
        return

    def shutdown(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        self._finished.clear()
        self.host_views.clear()
        self.engine_tensors.clear()
        self.host_buffer = torch.empty(0, dtype=torch.int8)


class HostWorkerSpec:
    """What the harness's specs (this module's, and ``host_tiering``'s) share over the
    vLLM spec each subclasses: the fault keys, read before that spec allocates anything
    (so a bad one fails fast in every process that builds the spec: EngineCore and
    workers), the chunk count under either of vLLM's names, and a ``get_worker`` without
    the stock platform check. List it before the vLLM spec among the bases."""

    fault_mode: str
    fault_control: str | None
    _host_worker: HostOffloadingWorker | None = None
    _ledgered_manager: Any = None  # the manager whose preparations go to the ledger

    def read_fault_keys(self, config: OffloadingConfig) -> None:
        extra: Mapping[str, Any] = config.extra_config or {}
        self.fault_mode = parse_fault_mode(extra.get(FAULT_KEY))
        control = extra.get(FAULT_CONTROL_KEY)
        if control is not None and (not isinstance(control, str) or not control):
            raise ValueError(f"{FAULT_CONTROL_KEY} must be a file path, got {control!r}")
        if control and self.fault_mode != FAULT_NONE:
            raise ValueError(f"give {FAULT_KEY} or {FAULT_CONTROL_KEY}, not both")
        self.fault_control = control

    @property
    def num_host_chunks(self) -> int:
        """Host chunk count; vLLM renamed the attribute (``num_blocks`` -> ``num_chunks``)."""
        for name in ("num_chunks", "num_blocks"):
            value = getattr(self, name, None)
            if isinstance(value, int):
                return value
        return 0

    def create_worker(self, kv_caches: CanonicalKVCaches) -> HostOffloadingWorker:
        raise NotImplementedError

    def get_manager(self) -> Any:
        """The vLLM spec's manager, its store and load preparations written to the
        content ledger when the run keeps one (the scheduler process's half of it)."""
        manager = super().get_manager()  # type: ignore[misc]
        if manager is not self._ledgered_manager:
            ledger = open_ledger("scheduler")
            if ledger is not None:
                record_assignments(manager, ledger)
            self._ledgered_manager = manager
        return manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        # The stock method refuses non-GPU platforms before building anything; this one
        # has no platform requirement.
        if self._host_worker is None:
            self._host_worker = self.create_worker(kv_caches)
        return self._host_worker


class HostOffloadingSpec(HostWorkerSpec, CPUOffloadingSpec):
    """``CPUOffloadingSpec`` with a worker that runs on the CPU platform.

    Subclassing (rather than re-implementing) keeps the stock chunk sizing
    (``kv_bytes_per_chunk``, ``cpu_page_size_per_worker``, the chunk count) and the stock
    ``CPUOffloadingManager`` on the scheduler side, so what is under test is vLLM's own logic.
    """

    def __init__(self, config: OffloadingConfig) -> None:
        self.read_fault_keys(config)
        super().__init__(config)

    def _uses_shared_region(self) -> bool:
        # Each rank keeps a private buffer, so the single-copy replicated (MLA) layout, in
        # which only rank 0 stores, would leave the other ranks nothing to load.
        return False

    def create_worker(self, kv_caches: CanonicalKVCaches) -> HostOffloadingWorker:
        return HostOffloadingWorker(
            kv_caches=kv_caches,
            blocks_per_chunk=self.blocks_per_chunk,
            num_cpu_chunks=self.num_host_chunks,
            cpu_page_size_per_worker=self.cpu_page_size_per_worker or None,
            fault=self.fault_mode,
            fault_control=self.fault_control,
            rank=self.config.parallel.rank,
        )
