"""Weight-free (or seeded-random) models, made locally and deterministically.

There is no hub access on CPU machines or CI, so every model the harness serves
on CPU is written here from a geometry file: a ``config.json`` produced through
transformers' own config classes (so vLLM sees exactly what a real checkpoint
would give it) and a tokenizer built with the ``tokenizers`` library whose
vocabulary matches ``vocab_size`` exactly. Directories are content-addressed, so
an unchanged geometry is reused and a changed one can never be confused with a
stale build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.errors import BadInput
from harness.names import ENV_CACHE

# Bump when the files written for a given geometry change, to invalidate caches.
BUILDER_VERSION = 2
LLAMA4_TYPES = ("llama4_text", "llama4")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
# The vLLM implementation each model type is served with; without ``architectures``
# vLLM would fall back to its generic Transformers backend, whose KV specs are not
# the ones under test. One model type per KV-cache spec family the matrix covers.
DEFAULT_ARCHITECTURES = {
    "llama4_text": "Llama4ForCausalLM",  # chunked local + full attention
    "llama4": "Llama4ForConditionalGeneration",
    "llama": "LlamaForCausalLM",  # full attention
    "mistral": "MistralForCausalLM",  # sliding window on every layer
    "gemma3_text": "Gemma3ForCausalLM",  # interleaved sliding window / full
    "deepseek_v2": "DeepseekV2ForCausalLM",  # MLA
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",  # Mamba2 + full attention
}


def default_cache_dir() -> Path:
    root = os.environ.get(ENV_CACHE)
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "offload-check"


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (multimodal Llama 4 nests it)."""
    if config.get("model_type") == "llama4" and isinstance(config.get("text_config"), dict):
        return config["text_config"]
    return config


def check_buildable(config: dict[str, Any], where: str) -> None:
    """A geometry this module can turn into a model directory vLLM will serve."""
    model_type = config.get("model_type")
    if model_type not in DEFAULT_ARCHITECTURES and not config.get("architectures"):
        raise BadInput(
            f"{where}: model_type {model_type!r} has no default vLLM architecture "
            f'(known: {", ".join(DEFAULT_ARCHITECTURES)}); set "architectures"'
        )
    text = text_config(config)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(text.get(key), int) or text[key] <= 0:
            raise BadInput(f"{where}: {key} must be a positive integer")


def chunked_local_layers(config: dict[str, Any]) -> list[int]:
    """Layers vLLM builds with chunked local attention.

    vLLM's Llama 4 uses chunked attention on the RoPE layers
    (``no_rope_layers[i] == 1``) when ``attention_chunk_size`` is set; the NoPE
    layers are global. Without ``attention_chunk_size`` no layer is chunked.
    """
    text = text_config(config)
    if not text.get("attention_chunk_size"):
        return []
    n = int(text["num_hidden_layers"])
    no_rope = text.get("no_rope_layers")
    if not no_rope:
        # transformers' default: every ``no_rope_layer_interval``-th layer is NoPE.
        interval = int(text.get("no_rope_layer_interval", 4))
        no_rope = [int((i + 1) % interval != 0) for i in range(n)]
    return [i for i in range(n) if no_rope[i]]


def geometry_key(config: dict[str, Any], weights: str, seed: int) -> str:
    blob = json.dumps(
        {"config": config, "weights": weights, "seed": seed, "builder": BUILDER_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_tokenizer(vocab_size: int, out_dir: Path, model_max_length: int) -> None:
    """A word-level tokenizer over tokens ``t<i>``: one word is exactly one token.

    That makes prompt lengths exact and deterministic, which the round trip's
    block arithmetic depends on, and needs no training data.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(SPECIAL_TOKENS):
        raise BadInput(f"vocab_size {vocab_size} leaves no room for ordinary tokens")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), vocab_size):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
    )
    fast.save_pretrained(str(out_dir))


def _write_config(config: dict[str, Any], out_dir: Path) -> None:
    from transformers import AutoConfig

    fields = dict(config)
    model_type = fields.pop("model_type")
    # Without architectures vLLM falls back to its generic Transformers backend instead
    # of its own Llama 4 implementation (the one whose KV specs are under test).
    fields.setdefault("architectures", [DEFAULT_ARCHITECTURES[model_type]])
    hf_config = AutoConfig.for_model(model_type, **fields)
    hf_config.save_pretrained(str(out_dir))


def _write_random_weights(out_dir: Path, seed: int) -> None:
    """Weights at a real scale, for runs whose output must react to a corrupted KV.

    Dummy weights are near zero, so the output barely depends on the KV cache and a
    corrupted load can go unnoticed; a seeded random initialisation fixes that.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # A build is one line of the harness's own progress: transformers' advice about the
    # geometry ("Consider using AutoModel ...") and its shard-writing bar are not the
    # user's business, and they broke the sweep's and the corpus's progress lines.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hf_config = AutoConfig.from_pretrained(str(out_dir))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)


def model_dir(
    config: dict[str, Any],
    name: str,
    cache_dir: Path | None = None,
    weights: str = "dummy",
    seed: int = 0,
) -> Path:
    """Where the model for a geometry lives (built or not): keyed by its content, so a
    plan can name it before anything is built."""
    cache = (cache_dir or default_cache_dir()) / "models"
    return cache / f"{name}-{geometry_key(config, weights, seed)}"


def build_model(
    config: dict[str, Any],
    name: str,
    *,
    weights: str = "dummy",
    seed: int = 0,
    cache_dir: Path | None = None,
) -> Path:
    """Write (or reuse) ``model_dir(config, name, ...)``; returns its path.

    Keyword-only past the name: weights, seed and the cache directory are easy to swap
    when positional, and a swapped seed builds a valid model nobody asked for.
    """
    check_buildable(config, name)
    target = model_dir(config, name, cache_dir, weights, seed)
    cache = target.parent
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename: an interrupted build never looks complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        try:
            _write_config(config, tmp)
        except (TypeError, ValueError, KeyError) as err:
            raise BadInput(f"{name}: transformers cannot build a config from it: {err}") from None
        text = text_config(config)
        max_len = int(text.get("max_position_embeddings") or 8192)
        build_tokenizer(int(text["vocab_size"]), tmp, max_len)
        if weights == "random":
            _write_random_weights(tmp, seed)
        elif weights != "dummy":
            raise BadInput(f"unknown weights mode {weights!r} (dummy or random)")
        (tmp / "geometry.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / ".complete").write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.server.model_builder GEOMETRY [dummy|random]``: build (or reuse) the
    model and print its directory, so a reproduction outside the harness can ``vllm serve``
    the very model the harness ran (docs/bugs.md)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2 or args[-1] in ("-h", "--help"):
        print("usage: python -m harness.server.model_builder GEOMETRY.json [dummy|random]")
        return 2
    path = Path(args[0])
    weights = args[1] if len(args) > 1 else "dummy"
    try:
        config = json.loads(path.read_text())
        print(build_model(config, path.stem, weights=weights))
    except (OSError, ValueError, BadInput) as err:
        print(f"model_builder: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
