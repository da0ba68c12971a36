"""KV-cache layout by spec family: predicted from a config, and as the engine built it.

The offloading scheduler treats each KV-cache group by its spec class
(``get_sliding_window_size_in_chunks``): full attention (MLA included, a subclass),
sliding window, chunked local, Mamba. The harness predicts that split from the model
config, because the expected bytes must come from the plan; and it reads the split
the engine really built from the report of ``harness.engine.specs``, because a
layer silently built with the wrong spec is itself one of the faults to catch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from harness.names import LOG_KV_GROUPS as REPORT_PREFIX
from harness.server import model_builder

# Offloading-relevant kinds, in the order the scheduler's classifier tests them.
KINDS = ("sliding-window", "chunked-local", "mamba", "mla", "full")
"""Layer kinds, one per KV-cache spec family the offloading scheduler treats apart; the
most specific first (a model's family is named by its first kind present)."""
FAMILY_OF_KIND = {
    "sliding-window": "sliding-window",
    "chunked-local": "chunked-local",
    "mamba": "mamba-hybrid",  # Mamba layers always come with attention layers
    "mla": "mla",
    "full": "full-attention",
}
"""A model's family (the matrix's word) from its layer kinds (this module's word): the
two vocabularies meet here and nowhere else."""
SPEC_KINDS = {  # spec class (or a base of it) -> kind; the first match in the MRO wins
    "SlidingWindowSpec": "sliding-window",
    "SlidingWindowMLASpec": "sliding-window",
    "ChunkedLocalAttentionSpec": "chunked-local",
    "MambaSpec": "mamba",
    "MLAAttentionSpec": "mla",
    "FullAttentionSpec": "full",
}


@dataclass
class KindLayout:
    """All layers of one kind: what they cost per token and how far back they reach."""

    kind: str
    layers: int
    bytes_per_token: int  # over all these layers; 0 for Mamba (state, not per token)
    window: int | None = None  # sliding_window / attention_chunk_size

    def record(self) -> dict[str, Any]:
        return asdict(self)


def _dtype_bytes(text: dict[str, Any], config: dict[str, Any]) -> int:
    dtype = str(
        text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16"
    )
    return 4 if "32" in dtype else 2


def _attention_bpt(text: dict[str, Any], dtype: int) -> int:
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    return 2 * kv_heads * head_dim * dtype


def family(config: dict[str, Any]) -> str:
    """The model's family: its most specific layer kind, as the matrix names it."""
    kinds = set(layer_kinds(config))
    return FAMILY_OF_KIND[next(k for k in KINDS if k in kinds)]


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """The offloading kind of every layer, as vLLM's model code would build it."""
    text = model_builder.text_config(config)
    n = int(text["num_hidden_layers"])
    model_type = text.get("model_type") or config.get("model_type")
    if model_type in model_builder.LLAMA4_TYPES:
        chunked = set(model_builder.chunked_local_layers(config))
        return ["chunked-local" if i in chunked else "full" for i in range(n)]
    if text.get("kv_lora_rank"):
        return ["mla"] * n
    types = text.get("layer_types") or text.get("layers_block_type")
    if isinstance(types, list) and len(types) == n:
        kinds = []
        for t in types:
            if t in ("sliding_attention", "sliding"):
                kinds.append("sliding-window" if text.get("sliding_window") else "full")
            elif t in ("linear_attention", "mamba"):
                kinds.append("mamba")
            else:
                kinds.append("full")
        return kinds
    return ["full"] * n


def predict(config: dict[str, Any]) -> list[KindLayout]:
    """The per-kind layout the engine should build for ``config``."""
    text = model_builder.text_config(config)
    dtype = _dtype_bytes(text, config)
    kinds = layer_kinds(config)
    out = []
    for kind in KINDS:
        n = kinds.count(kind)
        if not n:
            continue
        if kind == "mla":
            bpt = (int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])) * dtype
        elif kind == "mamba":
            bpt = 0
        else:
            bpt = _attention_bpt(text, dtype)
        window = (
            int(text["sliding_window"])
            if kind == "sliding-window"
            else int(text["attention_chunk_size"])
            if kind == "chunked-local"
            else None
        )
        out.append(KindLayout(kind, n, n * bpt, window))
    return out


def mamba_state_bytes(config: dict[str, Any]) -> int:
    """One Mamba2 state (conv + SSM) over all Mamba layers, at the model dtype.

    The engine's own figure (``state_bytes`` in its report) wins when there is one:
    platforms may keep the SSM state in another dtype.
    """
    text = model_builder.text_config(config)
    layers = layer_kinds(config).count("mamba")
    if not layers:
        return 0
    dtype = _dtype_bytes(text, config)
    d_inner = int(text.get("mamba_expand", 2)) * int(text["hidden_size"])
    d_state = int(text.get("mamba_d_state", 128))
    conv_dim = d_inner + 2 * int(text.get("mamba_n_groups", 1)) * d_state
    conv = (int(text.get("mamba_d_conv", 4)) - 1) * conv_dim
    ssm = (
        int(text["mamba_n_heads"])
        * int(text.get("mamba_d_head") or d_inner // int(text["mamba_n_heads"]))
        * d_state
    )
    return layers * (conv + ssm) * dtype


def spec_kind(record: dict[str, Any]) -> str:
    for name in [record.get("spec", ""), *record.get("bases", [])]:
        if name in SPEC_KINDS:
            return SPEC_KINDS[name]
    return f"other:{record.get('spec')}"


def parse_report(lines: list[str]) -> list[dict[str, Any]] | None:
    """The engine's KV-cache groups from a server log (the first report), or None."""
    for line in lines:
        if REPORT_PREFIX not in line:
            continue
        payload = line.split(REPORT_PREFIX, 1)[1].rsplit(" pid=", 1)[0]
        payload = payload.rsplit(" at=", 1)[0].strip()
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if isinstance(data, list):
            return data
    return None


def from_engine(groups: list[dict[str, Any]], ranks: int = 1) -> list[KindLayout]:
    """Aggregate the engine's groups per kind, in the same shape as ``predict``.

    The engine reports one rank's pages (its share of the KV heads); the plan, like the
    byte counters, is summed over the ``ranks`` of tensor parallelism.
    """
    acc: dict[str, KindLayout] = {}
    for g in groups:
        kind = spec_kind(g)
        layers = int(g.get("layers") or 0)
        block = int(g.get("block_size") or 0)
        page = int(g.get("page_size_bytes") or 0)
        bpt = 0 if kind == "mamba" or not block else page // block * layers * ranks
        window = g.get("sliding_window") or g.get("attention_chunk_size")
        cur = acc.setdefault(kind, KindLayout(kind, 0, 0, window))
        cur.layers += layers
        cur.bytes_per_token += bpt
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(acc.values(), key=lambda k: order.get(k.kind, len(KINDS)))


def spec_summary(groups: list[dict[str, Any]]) -> str:
    """``ChunkedLocalAttentionSpec x3, FullAttentionSpec x1``: classes by layer count."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g.get("spec", "?")] = counts.get(g.get("spec", "?"), 0) + int(g.get("layers") or 0)
    return ", ".join(f"{name} x{n}" for name, n in counts.items())
