"""Named patches to vLLM's offloading scheduler, applied inside vLLM's processes.

The function under study maps a KV-cache spec to the tail (in offload chunks) the
scheduler may store and load. Stock vLLM < 0.28 asserts that every spec other than
sliding-window and Mamba is full attention, which kills Llama 4 (chunked local
attention) at start: vLLM issue #51150. PR #51161 adds a chunked-local branch.

- ``chunked-local-fix``: PR #51161's branch, for builds that lack it. On builds that
  already have it the patch changes nothing and says so, so that ``stock+fix`` and
  ``current`` can share one scenario.
- ``chunked-local-floor``: a mutant that rounds the window DOWN. It starts fine and
  silently loses the chunk that straddles the window edge whenever the offload chunk
  does not divide ``attention_chunk_size``: the round trip must catch it.
- ``hits-minus-chunk``: a mutant whose connector admits one offload chunk fewer than it
  could serve on every external hit (an off-by-one-chunk lookup, the shape of vLLM
  #54362). Output stays right, so only the hit and byte checks can catch it.
- ``store-threshold-plus-one``: a mutant CPU manager that, given ``store_threshold`` N >=
  2, admits a chunk only at its (N+1)-th offer (an off-by-one in the admission count).
  Only the threshold's own figures move: stores, skips, and the hits they feed.
- ``aborted-stores-prompt``: vLLM #49118 brought back (PRs #49146 and #49285 undone, on
  builds that have them: every installable one). Up to 0.26 a finished request's store
  covered its whole prompt, computed or not, and nothing capped the chunks at the blocks
  it was given, so aborting a request that was never scheduled asked to store chunks
  with no GPU block and ``_build_store_jobs`` asserted. The bug corpus's #49118 trigger
  must catch it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.names import (
    LOG_PATCH,
    PATCH_ABORTED_STORES_PROMPT,
    PATCH_FIX,
    PATCH_FLOOR,
    PATCH_HITS_MINUS_CHUNK,
    PATCH_THRESHOLD_PLUS_ONE,
)

# Where the function has lived: 0.33 moved it to offloading/config.py and imports it
# into the scheduler; 0.26-0.32 define it in offloading/scheduler.py; up to 0.25 it was
# called ..._in_blocks in the single-file connector. Both the defining module and
# every importer must be patched, since ``from x import f`` binds a second name.
TARGET_MODULES = (
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.config",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
)
FUNCTION_NAMES = ("get_sliding_window_size_in_chunks", "get_sliding_window_size_in_blocks")
MARK = "__offload_check_patch__"
# A stable prefix the harness greps server logs for.
LOG_PREFIX = LOG_PATCH

logger = logging.getLogger("vllm.offload_check.patches")


SCHEDULER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"


@dataclass
class PatchReport:
    patch: str
    status: str  # "applied" | "no-op" | "not-found"
    targets: list[str]
    detail: str = ""

    def line(self) -> str:
        where = ", ".join(self.targets) or "-"
        return f"{LOG_PREFIX} {self.patch} {self.status} [{where}] {self.detail}".rstrip()


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _has_chunked_branch(fn: Callable[..., Any]) -> bool:
    """Whether a build already handles chunked local attention (PR #51161 or later)."""
    try:
        return "ChunkedLocalAttentionSpec" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def _wrap(orig: Callable[..., Any], patch: str, chunked_cls: type[Any]) -> Callable[..., Any]:
    if patch == PATCH_FIX:

        def window(kv_cache_spec: Any, tokens_per_chunk: int, *args: Any, **kwargs: Any) -> Any:
            if isinstance(kv_cache_spec, chunked_cls):
                # Chunked local attention never looks back past one attention chunk,
                # so its reachable tail is a window of attention_chunk_size tokens,
                # rounded UP so that a straddling chunk is still stored and loaded.
                assert kv_cache_spec.attention_chunk_size > 0
                return _cdiv(kv_cache_spec.attention_chunk_size, tokens_per_chunk)
            return orig(kv_cache_spec, tokens_per_chunk, *args, **kwargs)

    elif patch == PATCH_FLOOR:

        def window(kv_cache_spec: Any, tokens_per_chunk: int, *args: Any, **kwargs: Any) -> Any:
            if isinstance(kv_cache_spec, chunked_cls):
                # The seeded fault: rounding down drops the straddling chunk.
                return kv_cache_spec.attention_chunk_size // tokens_per_chunk
            return orig(kv_cache_spec, tokens_per_chunk, *args, **kwargs)

    else:
        raise ValueError(f"unknown patch {patch!r}")
    window.__name__ = orig.__name__
    window.__qualname__ = orig.__qualname__
    window.__doc__ = orig.__doc__
    setattr(window, MARK, patch)
    return window


def _patch_method(
    patch: str, module_name: str, cls_name: str, attr: str, wrap: Callable[[Any], Any]
) -> PatchReport:
    """Replace ``module.cls.attr`` with ``wrap(original)``, marked, once per process."""
    cls = getattr(importlib.import_module(module_name), cls_name)
    orig = getattr(cls, attr)
    target = [f"{module_name}.{cls_name}.{attr}"]
    if getattr(orig, MARK, None) == patch:
        return PatchReport(patch, "applied", target, "(already)")
    new = wrap(orig)
    setattr(new, MARK, patch)
    setattr(cls, attr, new)
    return PatchReport(patch, "applied", target)


def _hits_minus_chunk(orig: Any) -> Any:
    def get_num_new_matched_tokens(
        self: Any, request: Any, num_computed_tokens: int, *args: Any, **kwargs: Any
    ) -> Any:
        hits, is_async = orig(self, request, num_computed_tokens, *args, **kwargs)
        if hits:
            chunk = max(g.tokens_per_chunk for g in self.config.kv_group_configs)
            hits = hits - chunk if hits > chunk else 0
            # No hit left, no load: vLLM asserts an asynchronous load has tokens to load
            # (found by `stress`: a one-chunk hit made the first version of this mutant
            # crash the engine instead of losing a hit).
            is_async = bool(hits) and is_async
        return hits, is_async

    return get_num_new_matched_tokens


MANAGER_MODULE = "vllm.v1.kv_offload.cpu.manager"


def _threshold_plus_one(orig: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        if self.store_threshold >= 2:
            # The seeded fault: one offer more than the configuration asks for.
            self.store_threshold += 1

    return __init__


def _aborted_stores_prompt(orig: Any) -> Any:
    def storable_chunks(self: Any, group_config: Any, *args: Any, **kwargs: Any) -> Any:
        chunks = orig(self, group_config, *args, **kwargs)
        req = self.req
        if getattr(req.status, "name", "") == "FINISHED_ABORTED":
            # The seeded fault (0.26's code): an aborted request's cutoff is its prompt,
            # whatever it computed, and the blocks it holds do not cap it.
            groups = list(self.config.kv_group_configs)
            keys = self.group_states[groups.index(group_config)].offload_keys
            prompt_chunks = req.num_prompt_tokens // group_config.tokens_per_chunk
            chunks = max(chunks, min(prompt_chunks, len(keys)))
        return chunks

    return storable_chunks


def apply(patch: str) -> PatchReport:
    """Apply ``patch`` in this process; idempotent (vLLM may load plugins twice)."""
    if patch == PATCH_HITS_MINUS_CHUNK:
        return _patch_method(
            patch, SCHEDULER_MODULE, "OffloadingConnectorScheduler",
            "get_num_new_matched_tokens", _hits_minus_chunk,
        )  # fmt: skip
    if patch == PATCH_THRESHOLD_PLUS_ONE:
        return _patch_method(
            patch, MANAGER_MODULE, "CPUOffloadingManager", "__init__", _threshold_plus_one
        )
    if patch == PATCH_ABORTED_STORES_PROMPT:
        return _patch_method(
            patch, SCHEDULER_MODULE, "RequestOffloadState", "storable_chunks",
            _aborted_stores_prompt,
        )  # fmt: skip
    if patch not in (PATCH_FIX, PATCH_FLOOR):
        raise ValueError(f"unknown patch {patch!r}")
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

    found: list[tuple[Any, str, Callable[..., Any]]] = []
    for mod_name in TARGET_MODULES:
        try:
            module = importlib.import_module(mod_name)
        except ImportError:
            continue
        for fn_name in FUNCTION_NAMES:
            fn = getattr(module, fn_name, None)
            if callable(fn):
                found.append((module, fn_name, fn))
    if not found:
        return PatchReport(patch, "not-found", [], "no offloading window function in this build")

    targets = [f"{m.__name__}.{n}" for m, n, _ in found]
    if patch == PATCH_FIX:
        originals = [getattr(fn, "__wrapped_original__", fn) for _, _, fn in found]
        if all(_has_chunked_branch(fn) for fn in originals):
            # Undo an earlier mutant in this process, so "fix" always means the fixed code.
            for (module, fn_name, _), orig in zip(found, originals, strict=True):
                setattr(module, fn_name, orig)
            return PatchReport(patch, "no-op", targets, "this build already has PR #51161")

    # Wrap one original and bind the same wrapper everywhere it is visible.
    fn0 = found[0][2]
    if getattr(fn0, MARK, None) == patch:
        return PatchReport(patch, "applied", targets, "(already)")
    orig = getattr(fn0, "__wrapped_original__", fn0)
    wrapper = _wrap(orig, patch, ChunkedLocalAttentionSpec)
    wrapper.__wrapped_original__ = orig  # type: ignore[attr-defined]
    for module, fn_name, _ in found:
        setattr(module, fn_name, wrapper)
    return PatchReport(patch, "applied", targets)
