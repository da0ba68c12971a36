"""Local weight-free models: deterministic, exact vocabulary, content-addressed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import BadInput
from harness.server import kv_layout
from harness.server import model_builder as models

ROOT = Path(__file__).resolve().parents[3]


def geometry(name: str) -> dict:
    return json.loads((ROOT / "scenarios" / "models" / f"{name}.json").read_text())


def test_chunked_layers_follow_no_rope_layers():
    assert models.chunked_local_layers(geometry("llama4-issue-51150")) == [0, 1, 2, 4, 5, 6]
    assert models.chunked_local_layers(geometry("llama4-small-chunk")) == [0, 1, 2]
    assert models.chunked_local_layers(geometry("llama4-no-chunk")) == []


def test_kv_bytes_per_token_matches_the_prs_scout_arithmetic():
    scout = {
        "model_type": "llama4_text",
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 5120,
        "vocab_size": 202048,
        "torch_dtype": "bfloat16",
    }
    assert bytes_per_token(scout) == 196_608
    assert bytes_per_token(scout) * 1248 == 245_366_784
    assert bytes_per_token(geometry("llama4-small-chunk")) == 1024


def bytes_per_token(config: dict) -> int:
    return sum(k.bytes_per_token for k in kv_layout.predict(config))


def test_unbuildable_configs_are_refused():
    with pytest.raises(BadInput, match="no default vLLM architecture"):
        models.check_buildable({"model_type": "gpt2", "hidden_size": 8}, "cfg")
    with pytest.raises(BadInput, match="hidden_size"):
        models.check_buildable({"model_type": "llama4_text"}, "cfg")
    models.check_buildable(geometry("llama4-small-chunk"), "cfg")


def test_build_is_deterministic_and_cached(tmp_path):
    cfg = geometry("llama4-small-chunk")
    a = models.build_model(cfg, "small", cache_dir=tmp_path)
    b = models.build_model(cfg, "small", cache_dir=tmp_path)
    assert a == b and (a / ".complete").is_file()
    written = json.loads((a / "config.json").read_text())
    assert written["model_type"] == "llama4_text"
    assert written["attention_chunk_size"] == 256
    assert written["architectures"] == ["Llama4ForCausalLM"]
    changed = dict(cfg, attention_chunk_size=512)
    assert models.build_model(changed, "small", cache_dir=tmp_path) != a


def test_tokenizer_has_the_exact_vocabulary_and_one_token_per_word(tmp_path):
    from transformers import AutoTokenizer

    path = models.build_model(geometry("llama4-small-chunk"), "small", cache_dir=tmp_path)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == 1024
    ids = tok("t10 t11 t1023").input_ids
    assert ids == [10, 11, 1023]
    assert tok.decode(ids) == "t10 t11 t1023"
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<s>", "</s>"]


def test_interrupted_build_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "build_tokenizer", boom)
    with pytest.raises(RuntimeError):
        models.build_model(geometry("llama4-small-chunk"), "small", cache_dir=tmp_path)
    assert not any((tmp_path / "models").iterdir())


def test_missing_architectures_default_to_vllms_native_llama4(tmp_path):
    cfg = {
        "model_type": "llama4_text",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
    }
    path = models.build_model(cfg, "bare", cache_dir=tmp_path)
    assert json.loads((path / "config.json").read_text())["architectures"] == ["Llama4ForCausalLM"]
