"""Report the KV-cache groups the engine actually built, from inside EngineCore.

Which spec class a layer ends up with (full, sliding window, chunked local, Mamba,
MLA) is decided by vLLM from the config, the platform and the attention backend;
reading it back from the config would test our assumptions, not the engine. The
scheduler is the first place that sees the final ``KVCacheConfig`` and also where
the offloading connector is built (and where #51150 crashed); the workers build
their half of the connector even earlier. So the report is printed on entry to
``KVConnectorFactory.create_connector`` (worker and scheduler side) and to
``Scheduler.__init__`` (runs without a connector), before anything there can fail.

Loaded in vLLM processes: imports nothing of the harness beyond the standard library.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from typing import Any

from harness.names import LOG_KERNEL as KERNEL_PREFIX
from harness.names import LOG_KV_GROUPS as LOG_PREFIX  # the rest of the line is JSON

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
FACTORY_MODULE = "vllm.distributed.kv_transfer.kv_connector.factory"
MARK = "__offload_check_specs__"
_FIELDS = (
    "block_size",
    "page_size_bytes",
    "sliding_window",
    "attention_chunk_size",
    "head_size",
    "num_kv_heads",
    "dtype",
    "mamba_type",
    "mamba_cache_mode",
    "extra_retained_tokens",
    "cache_dtype_str",
)


def _spec_record(group: Any) -> dict[str, Any]:
    spec = group.kv_cache_spec
    cls = type(spec)
    bases = [
        c.__name__
        for c in cls.__mro__[1:]
        if c.__name__.endswith("Spec") and c.__name__ not in ("KVCacheSpec", "AttentionSpec")
    ]
    rec: dict[str, Any] = {
        "spec": cls.__name__,
        "bases": bases,
        "layers": len(getattr(group, "layer_names", []) or []),
    }
    for name in _FIELDS:
        try:
            value = getattr(spec, name)
        except Exception:  # properties may raise on specs they do not apply to
            continue
        if value is None or callable(value):
            continue
        rec[name] = value if isinstance(value, (int, float, str, bool)) else str(value)
    shapes, dtypes = getattr(spec, "shapes", None), getattr(spec, "dtypes", None)
    if shapes and dtypes:
        # A Mamba state's real size: its page is padded up to the attention page, and
        # the padding is never transferred.
        total = 0
        for shape, dtype in zip(shapes, dtypes, strict=False):
            n = 1
            for dim in shape:
                n *= int(dim)
            total += n * int(getattr(dtype, "itemsize", 0))
        rec["state_bytes"] = total
    return rec


def describe(kv_cache_config: Any) -> list[dict[str, Any]]:
    """One record per KV-cache group, in group order."""
    return [_spec_record(g) for g in getattr(kv_cache_config, "kv_cache_groups", [])]


def _report(kv_cache_config: Any, where: str) -> None:
    try:
        line = json.dumps(describe(kv_cache_config), sort_keys=True)
    except Exception as err:  # the report must never be what breaks the engine
        line = json.dumps({"error": f"{type(err).__name__}: {err}"})
    print(f"{LOG_PREFIX} {line} at={where} pid={os.getpid()}", file=sys.stderr, flush=True)


def _class(module_name: str, cls_name: str) -> Any:
    try:
        return getattr(importlib.import_module(module_name), cls_name, None)
    except ImportError:
        return None


def install() -> bool:
    """Wrap the two entry points once; returns False if this build has neither."""
    installed = False
    sched = _class(SCHEDULER_MODULE, "Scheduler")
    if sched is not None:
        orig_init = sched.__init__
        if not getattr(orig_init, MARK, False):

            @functools.wraps(orig_init)
            def __init__(
                self: Any, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any
            ) -> None:
                _report(kv_cache_config, "scheduler")
                orig_init(self, vllm_config, kv_cache_config, *args, **kwargs)

            setattr(__init__, MARK, True)
            sched.__init__ = __init__
        installed = True
    factory = _class(FACTORY_MODULE, "KVConnectorFactory")
    if factory is not None:
        orig_create = factory.create_connector.__func__
        if not getattr(orig_create, MARK, False):

            @functools.wraps(orig_create)
            def create_connector(
                cls: Any, config: Any, role: Any, kv_cache_config: Any, *args: Any, **kwargs: Any
            ) -> Any:
                _report(kv_cache_config, f"connector:{getattr(role, 'name', role)}")
                return orig_create(cls, config, role, kv_cache_config, *args, **kwargs)

            setattr(create_connector, MARK, True)
            factory.create_connector = classmethod(create_connector)
        installed = True
    return installed


# The kernels the engine chose; like the KV-group report, read from inside vLLM because
# the choice depends on the CPU (vLLM's CPU attention runs its ``amx`` ISA on AMX hosts,
# ``vec`` elsewhere; its MLA runs the AMX kernel with 128-token blocks or the reference
# one with 16), so the same scenario runs different code on different machines.
CPU_ATTN_MODULE = "vllm.v1.attention.backends.cpu_attn"
_SEEN: set[str] = set()


def _kernel(key: str, value: object) -> None:
    line = f"{key}={value}"
    if line in _SEEN:
        return
    _SEEN.add(line)
    print(f"{KERNEL_PREFIX} {line} pid={os.getpid()}", file=sys.stderr, flush=True)


def _wrap_attn_isa() -> None:
    """Report the ISA vLLM's CPU attention picks (its metadata builder calls this)."""
    module: Any = sys.modules.get(CPU_ATTN_MODULE)  # a vLLM module: patched by attribute
    if module is None:
        module = importlib.import_module(CPU_ATTN_MODULE)
    orig = getattr(module, "_get_attn_isa", None)
    if orig is None or getattr(orig, MARK, False):
        return

    @functools.wraps(orig)
    def _get_attn_isa(*args: Any, **kwargs: Any) -> Any:
        isa = orig(*args, **kwargs)
        _kernel("attention_isa", isa)
        return isa

    setattr(_get_attn_isa, MARK, True)
    module._get_attn_isa = _get_attn_isa


def install_kernel_report() -> bool:
    """Wrap the platform's attention-backend choice; False where it cannot be reached."""
    try:
        from vllm.platforms import current_platform
    except Exception:
        return False
    orig = getattr(current_platform, "get_attn_backend_cls", None)
    if orig is None or getattr(orig, MARK, False):
        return orig is not None

    @functools.wraps(orig)
    def get_attn_backend_cls(*args: Any, **kwargs: Any) -> Any:
        path = orig(*args, **kwargs)
        _kernel("attention_backend", str(path).rsplit(".", 1)[-1])
        if "cpu_attn" in str(path):
            try:
                _wrap_attn_isa()
            except Exception as err:  # the report must never be what breaks the engine
                _kernel("attention_isa", f"unknown ({type(err).__name__})")
        return path

    setattr(get_attn_backend_cls, MARK, True)
    # An instance attribute: vLLM calls it through ``current_platform``.
    current_platform.get_attn_backend_cls = get_attn_backend_cls
    return True
