"""Llama 4 geometries at their real KV layout with a narrow body, derived from a
checkpoint's text config.

The KV bytes a model offloads depend on its layers, KV heads, head size, dtype and which
layers are chunked-local (``attention_chunk_size``, ``no_rope_layers``), never on the
hidden size, the query heads, the experts' width or the vocabulary. So a model with
Scout's exact KV geometry and a body a few hundred wide moves Scout's 196,608 B a token
through the connector on any CPU, in a few hundred MB of weights (seeded random at a real
scale, so that a wrong load changes the answers). ``derive`` keeps every KV field of the
checkpoint's config and the layer pattern (MoE every ``interleave_moe_layer_step``-th
layer, its expert count) and narrows the rest; the derived files in ``scenarios/models/``
are checked against it (``tests/unit/server/test_geometries.py``), so they cannot drift from the
checkpoint they stand for.

``python -m harness.server.geometries CHECKPOINT.json OUT.json`` writes one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# What decides the KV cache (and so every byte the connector moves): kept as is.
KV_FIELDS = (
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "attention_chunk_size",
    "no_rope_layers",
    "torch_dtype",
)
# The layer pattern the issue asks to keep (MoE placement and expert count).
PATTERN_FIELDS = ("interleave_moe_layer_step", "num_local_experts", "num_experts_per_tok")
# The narrow body: widths a 2-core CPU prefills a few thousand tokens through in seconds.
NARROW = {
    "hidden_size": 256,
    "intermediate_size_mlp": 256,  # the dense layers' MLP and the shared expert
    "vocab_size": 4096,
}
# Each expert's width: the experts together about as wide as Scout's 16 x 128 (Maverick's
# 128 are kept, each small).
EXPERTS_WIDTH = 2048
EXPERT_WIDTH_RANGE = (16, 128)
# Prompts up to 32k tokens (three 8192-token attention chunks and a margin).
MAX_POSITIONS = 40960
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def derive(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The narrow-body geometry of a Llama 4 checkpoint's (text) config."""
    text = checkpoint.get("text_config", checkpoint)
    missing = [k for k in (*KV_FIELDS, *PATTERN_FIELDS) if k not in text]
    if missing:
        raise ValueError(f"not a Llama 4 text config with its KV layout: no {', '.join(missing)}")
    kv_heads = int(text["num_key_value_heads"])
    out: dict[str, Any] = {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "llama4_text",
        **{k: text[k] for k in KV_FIELDS},
        **{k: text[k] for k in PATTERN_FIELDS},
        **NARROW,
        "intermediate_size": expert_width(int(text["num_local_experts"])),
        # As many query heads as KV heads: the query width is not the KV's business.
        "num_attention_heads": kv_heads,
        "max_position_embeddings": min(
            int(text.get("max_position_embeddings", 0)) or MAX_POSITIONS, MAX_POSITIONS
        ),
        "rope_theta": text.get("rope_theta", 500000.0),
        "use_qk_norm": bool(text.get("use_qk_norm", False)),
        **SPECIAL_IDS,
    }
    return out


def expert_width(experts: int) -> int:
    low, high = EXPERT_WIDTH_RANGE
    return max(low, min(high, EXPERTS_WIDTH // max(1, experts)))


def kv_bytes_per_token(config: dict[str, Any]) -> int:
    """Every layer's K and V for one token at the config's dtype, all ranks together."""
    text = config.get("text_config", config)
    size = {"bfloat16": 2, "float16": 2, "float32": 4}[str(text.get("torch_dtype", "bfloat16"))]
    return (
        int(text["num_hidden_layers"])
        * 2
        * int(text["num_key_value_heads"])
        * int(text["head_dim"])
        * size
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(
            "usage: python -m harness.server.geometries CHECKPOINT.json OUT.json", file=sys.stderr
        )
        return 2
    src, dst = (Path(a) for a in argv)
    derived = derive(json.loads(src.read_text()))
    dst.write_text(json.dumps(derived, separators=(",", ":")) + "\n")
    print(f"{dst}: {kv_bytes_per_token(derived):,} B of KV a token, as {src.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
