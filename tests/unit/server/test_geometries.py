"""Llama 4's real KV geometry on a narrow body (harness.server.geometries): the derived
files in scenarios/models/ keep every KV field and the layer pattern of the checkpoint
they stand for, and the seed replica plans the seed's own figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.server import geometries
from harness.server.geometries import KV_FIELDS, PATTERN_FIELDS, derive, kv_bytes_per_token

MODELS = Path(__file__).resolve().parents[3] / "scenarios" / "models"
DERIVED = {
    "llama4-scout-narrow.json": "llama4-scout-17b-16e-text.json",
    "llama4-maverick-narrow.json": "llama4-maverick-17b-128e-text.json",
}
SEED_BYTES_PER_TOKEN = 196_608  # PR #51161: 48 layers x 2 x 8 KV heads x 128 x 2 B


@pytest.mark.parametrize("narrow,checkpoint", DERIVED.items())
def test_each_narrow_file_is_its_checkpoint_derived_and_keeps_its_kv(narrow, checkpoint):
    real = json.loads((MODELS / checkpoint).read_text())
    kept = json.loads((MODELS / narrow).read_text())
    assert kept == derive(real), (
        f"regenerate: python -m harness.server.geometries {checkpoint} {narrow}"
    )
    for key in (*KV_FIELDS, *PATTERN_FIELDS):
        assert kept[key] == real[key], key
    assert kv_bytes_per_token(kept) == kv_bytes_per_token(real) == SEED_BYTES_PER_TOKEN
    assert kept["hidden_size"] < real["hidden_size"] // 10


def test_scout_and_maverick_differ_where_their_checkpoints_do():
    scout = json.loads((MODELS / "llama4-scout-narrow.json").read_text())
    maverick = json.loads((MODELS / "llama4-maverick-narrow.json").read_text())
    assert (scout["interleave_moe_layer_step"], scout["num_local_experts"]) == (1, 16)
    assert (maverick["interleave_moe_layer_step"], maverick["num_local_experts"]) == (2, 128)
    # Maverick's 128 experts are kept, each small: together about Scout's width.
    assert maverick["intermediate_size"] * 128 == 2048 == scout["intermediate_size"] * 16
    assert scout["no_rope_layers"][3::4] == [0] * 12  # a NoPE layer every fourth


def test_a_config_without_its_kv_layout_is_refused():
    with pytest.raises(ValueError, match="no attention_chunk_size"):
        derive(
            {
                "num_hidden_layers": 2,
                "num_key_value_heads": 1,
                "head_dim": 8,
                "no_rope_layers": [1, 0],
                "torch_dtype": "bfloat16",
                "interleave_moe_layer_step": 1,
                "num_local_experts": 2,
                "num_experts_per_tok": 1,
            }
        )


def test_the_command_writes_the_file(tmp_path, capsys):
    out = tmp_path / "scout.json"
    assert geometries.main([str(MODELS / "llama4-scout-17b-16e-text.json"), str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(
        (MODELS / "llama4-scout-narrow.json").read_text()
    )
    assert "196,608 B of KV a token" in capsys.readouterr().out


def test_the_seed_replica_plans_the_seeds_own_figures():
    """1262 tokens, 32-token blocks (the CPU kernel's multiple): 1248 stored and hit,
    every layer loads all of it (one 8192-token attention chunk), 245,366,784 B."""
    from harness.commands.roundtrip.plan import plan_roundtrip
    from harness.scenario.roundtrip import load_roundtrip

    plan = plan_roundtrip(load_roundtrip(MODELS.parent / "seed-replica.toml"))
    exp = plan.expected
    assert exp.kv_bytes_per_token == SEED_BYTES_PER_TOKEN
    (target,) = exp.targets
    assert (target.prompt_tokens, target.stored_tokens, target.hit_tokens) == (1262, 1248, 1248)
    assert exp.stored_bytes == 245_366_784 == sum(t.loaded_bytes for t in exp.targets)
    assert exp.hit_tokens == 1248


@pytest.mark.parametrize(
    "scenario,hits,chunked_loads",
    [
        ("long-context-1.toml", (7936, 8192, 8448), (7936, 0, 256)),
        ("long-context-2.toml", (16128, 16384, 16640), (7936, 0, 256)),
        ("long-context-3.toml", (24320, 24576), (7936, 0)),
        ("long-context-32k.toml", (32512,), (7936,)),
    ],
)
def test_long_context_hits_end_before_on_and_after_a_real_attention_chunk(
    scenario, hits, chunked_loads
):
    """Scout's 8192-token attention chunk crossed once, twice and three times (to 32k
    tokens): each chunked-local
    layer loads ``hit - floor(hit / 8192) * 8192`` tokens (0 when the hit ends on the
    boundary), each full layer the whole hit."""
    from harness.commands.roundtrip.plan import plan_roundtrip
    from harness.scenario.roundtrip import load_roundtrip

    plan = plan_roundtrip(load_roundtrip(MODELS.parent / scenario))
    assert plan.expected.attention_chunk_size == 8192
    assert tuple(t.hit_tokens for t in plan.expected.targets) == hits
    assert tuple(t.chunked_needed_tokens for t in plan.expected.targets) == chunked_loads


def test_fillers_shorter_than_a_chunk_store_nothing_so_the_tier_holds_only_the_targets():
    from harness.commands.roundtrip.plan import filler_stored

    assert filler_stored([255] * 40, 256) == 0
    assert filler_stored([1024, 1024, 300], 256) == 2304
