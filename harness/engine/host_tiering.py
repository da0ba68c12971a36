"""vLLM's tiered offloading (CPU tier + secondary tiers such as ``fs``) on the CPU platform.

``TieringOffloadingSpec`` (vLLM 0.31+, ``vllm/v1/kv_offload/tiering``) keeps the CPU tier
as the primary and moves chunks between it and its secondary tiers from the scheduler
process, through a memoryview of the CPU tier's shared region (``SharedOffloadRegion``,
``/dev/shm/vllm_offload_<engine id>.mmap``). Its worker is the stock
``CPUOffloadingWorker``, which needs CUDA streams; so, as ``harness.engine.host_offload``
does for the plain CPU tier, this module swaps only the worker for the harness's
synchronous host worker, writing into the *same* shared region at the same offsets the
stock worker uses (``SharedOffloadRegion.create_next_worker_view``: rank ``r``'s part of
each chunk row starts at ``r * cpu_page_size_per_worker``). The tiering manager, the
secondary tiers (the ``fs`` files, their lookups, cascades and promotions) and every
counter they export are vLLM's own, untouched.

Enable it with ``spec_name = "HostTieringOffloadingSpec"``, ``spec_module_path =
"harness.engine.host_tiering"`` and vLLM's own keys (``secondary_tiers``, ...); the fault
keys of ``host_offload`` apply to the CPU tier's copies as there, and
``offload_check_disk_fault`` seeds a fault of the ``fs`` tier's own I/O in the scheduler
process (``delete-before-load``: each file is deleted after the lookup that found it,
before its read; ``disk-full``: every write fails with ENOSPC), by wrapping the two I/O
functions vLLM's fs tier calls (``tiering/fs/io.py``), so its own error handling runs.

Only the standard library, torch and vLLM may be imported: vLLM imports this module in its
API server, EngineCore and worker processes.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import CanonicalKVCaches
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.fs import manager as fs_manager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from harness.engine.host_offload import HostOffloadingWorker, HostWorkerSpec
from harness.names import (
    DISK_FAULT_DELETE,
    DISK_FAULT_EIO,
    DISK_FAULT_FULL,
    ENGINE_DISK_FAULTS,
    EXTRA_DISK_FAULT,
    FAULT_NONE,
    LOG_DISK_FAULT,
)

logger = init_logger(f"vllm.offload_check.{__name__}")


def _seed_disk_fault(fault: str) -> None:
    """Wrap the fs tier's I/O functions (as its manager module bound them) for ``fault``."""
    if fault == DISK_FAULT_DELETE:
        load = fs_manager.batch_load_block

        def delete_then_load(paths: list[str], *args: Any, **kwargs: Any) -> Any:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return load(paths, *args, **kwargs)

        fs_manager.batch_load_block = delete_then_load
    elif fault == DISK_FAULT_FULL:

        def disk_full(paths: list[str], *args: Any, **kwargs: Any) -> Any:
            raise OSError(errno.ENOSPC, f"No space left on device ({LOG_DISK_FAULT} {fault})")

        fs_manager.batch_store_block = disk_full
    elif fault == DISK_FAULT_EIO:

        def read_fails(paths: list[str], *args: Any, **kwargs: Any) -> Any:
            # The file stays: a device error, not a missing file. None loaded.
            err = OSError(errno.EIO, f"Input/output error ({LOG_DISK_FAULT} {fault})")
            err.num_succeeded = 0  # type: ignore[attr-defined]
            raise err

        fs_manager.batch_load_block = read_fails
    logger.info("%s %s", LOG_DISK_FAULT, fault)


__all__ = ["HostTieringOffloadingSpec"]


class _SharedRegionWorker(HostOffloadingWorker):
    """The host worker over a shared region it owns (as the stock worker owns its
    ``mmap_region``): released once the copies have stopped."""

    def __init__(self, region: SharedOffloadRegion, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._region: SharedOffloadRegion | None = region

    def shutdown(self) -> None:
        super().shutdown()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


class HostTieringOffloadingSpec(HostWorkerSpec, TieringOffloadingSpec):
    """``TieringOffloadingSpec`` with a worker that runs on the CPU platform."""

    def __init__(self, config: OffloadingConfig) -> None:
        self.read_fault_keys(config)
        disk_fault = (config.extra_config or {}).get(EXTRA_DISK_FAULT, FAULT_NONE)
        if disk_fault not in (FAULT_NONE, *ENGINE_DISK_FAULTS):
            raise ValueError(
                f"{EXTRA_DISK_FAULT} {disk_fault!r}: one of {', '.join(ENGINE_DISK_FAULTS)}"
            )
        self.disk_fault: str = disk_fault
        super().__init__(config)

    def get_manager(self) -> Any:
        # The scheduler side (EngineCore): where the fs tier's I/O threads run.
        if self.disk_fault != FAULT_NONE and self._manager is None:
            _seed_disk_fault(self.disk_fault)
        return super().get_manager()

    def _open_region(self, rank: int) -> SharedOffloadRegion:
        """The worker's side of the region, as ``TieringOffloadingSpec.create_worker``
        opens it (its keyword names changed in 0.28: blocks became chunks)."""
        params = inspect.signature(SharedOffloadRegion.__init__).parameters
        count = "num_chunks" if "num_chunks" in params else "num_blocks"
        size = "kv_bytes_per_chunk" if "kv_bytes_per_chunk" in params else "kv_bytes_per_block"
        sizing = {count: self.num_host_chunks, size: self.kv_bytes_per_chunk}
        return SharedOffloadRegion(
            engine_id=self._engine_id,
            rank=rank,
            cpu_page_size=self.cpu_page_size_per_worker,
            **sizing,
        )

    def create_worker(self, kv_caches: CanonicalKVCaches) -> HostOffloadingWorker:
        # The stock worker takes its rank from the CUDA device index (0.27) or the
        # parallel config (0.28+); on the CPU platform only the latter exists.
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        region = self._open_region(rank)
        try:
            # The whole region as (chunk, row) bytes: the memoryview the primary tier
            # hands its secondary tiers, over the same mapping.
            raw = torch.frombuffer(region.create_kv_memoryview().cast("B"), dtype=torch.int8)
            rows = raw.view(self.num_host_chunks, self.kv_bytes_per_chunk)
            return _SharedRegionWorker(
                region,
                kv_caches=kv_caches,
                blocks_per_chunk=self.blocks_per_chunk,
                num_cpu_chunks=self.num_host_chunks,
                cpu_page_size_per_worker=self.cpu_page_size_per_worker or None,
                fault=self.fault_mode,
                fault_control=self.fault_control,
                rank=self.config.parallel.rank,
                host_rows=rows,
                row_offset=rank * self.cpu_page_size_per_worker,
            )
        except Exception:
            region.cleanup()
            raise
