"""The round trip's arithmetic and checks, against the PR's own numbers."""

from __future__ import annotations

from harness.commands.roundtrip import checks as ck
from harness.server.kv_layout import KindLayout
from harness.server.workload import Completion, first_divergence


def exp_for(lengths, kinds, *, g=16, c=256, b=128, state=0):
    return ck.expected_for(
        prompt_lengths=lengths,
        max_tokens=g,
        tokens_per_chunk=c,
        layout=[KindLayout(*k) for k in kinds],
        kv_block_size=b,
        mamba_state_bytes=state,
    )


def scout() -> ck.Expected:
    # 48 layers: 12 full (NoPE) + 36 chunked; 4096 B per layer per token; chunk 8192.
    return exp_for(
        {"t": 1262},
        [("full", 12, 12 * 4096), ("chunked-local", 36, 36 * 4096, 8192)],
        g=2,
        c=16,
        b=16,
    )


def test_pr_51161_arithmetic():
    exp = scout()
    assert exp.kv_bytes_per_token == 196_608
    assert exp.hit_tokens == 1248  # 78 full 16-token blocks of 1262
    assert exp.stored_bytes == 245_366_784
    assert exp.loaded_bytes == 245_366_784  # fits in one attention chunk: loaded == stored


def test_chunked_layers_need_only_the_current_attention_chunk():
    exp = exp_for({"a": 700, "b": 1000}, [("full", 1, 256), ("chunked-local", 3, 768, 512)])
    a, b = exp.targets
    assert (a.stored_tokens, a.hit_tokens, a.chunked_needed_tokens) == (512, 512, 0)
    assert (b.stored_tokens, b.hit_tokens, b.chunked_needed_tokens) == (768, 768, 256)
    assert exp.loaded_bytes == (512 + 768) * 256 + 256 * 768


def test_without_chunked_layers_everything_loads():
    exp = exp_for({"a": 700}, [("full", 4, 1024)])
    assert exp.loaded_bytes == exp.stored_bytes == 512 * 1024


# Sliding window, Mamba and MLA: the figures derived in docs/offload-rules.md.
def test_sliding_window_loads_only_what_the_window_reaches():
    gemma = exp_for({"a": 700, "b": 1000}, [("sliding-window", 3, 768, 512), ("full", 1, 256)])
    a, b = gemma.targets
    assert (a.stored_bytes, a.hit_tokens, a.loaded_bytes) == (524_288, 512, 524_288)
    # Measured on 0.32.0 (OFFLOAD_CHECK_TRACE): for 1000 tokens the window has left
    # blocks 0-1 behind at the chunk boundary 768 before the store, so the sliding-window
    # layers store chunks 1-2 only; the full layer stores all three.
    assert b.stored_by_kind == {"sliding-window": 512, "full": 768}
    assert (b.stored_bytes, b.hit_tokens, b.loaded_bytes) == (589_824, 768, 589_824)
    assert gemma.stored_bytes == 1_114_112
    # 0.27.1 stores chunk 0 as well: said in tokens of the kind that stored it.
    extra = ck.check_stored(gemma, 1_114_112 + 256 * 768)
    assert not extra.passed and "+256 tokens of the sliding-window layers" in extra.detail
    narrow = exp_for({"a": 700, "b": 1000}, [("sliding-window", 3, 768, 384), ("full", 1, 256)])
    assert [t.loaded_bytes for t in narrow.targets] == [425_984, 491_520]
    pure = exp_for({"a": 700, "b": 1000}, [("sliding-window", 4, 1024, 512)])
    assert [t.loaded_bytes for t in pure.targets] == [524_288, 524_288]


def test_mamba_hits_only_on_a_chunk_aligned_state_checkpoint():
    kinds = [("mamba", 2, 0), ("full", 2, 512)]
    none = exp_for({"a": 700, "b": 1000}, kinds, state=19_840)
    assert none.hit_tokens == 0 and none.loaded_bytes == 0  # checkpoints 640 and 896
    assert none.stored_bytes == (512 + 768) * 512  # attention stores, Mamba does not
    some = exp_for({"a": 600, "b": 800}, kinds, state=19_840)
    a, b = some.targets
    assert (a.hit_tokens, a.mamba_states_stored) == (512, 1)
    assert a.loaded_bytes == 512 * 512 + 19_840 and a.stored_bytes == 512 * 512 + 19_840
    assert (b.hit_tokens, b.loaded_bytes) == (768, 768 * 512 + 19_840)
    assert ck.check_loaded(none, 0).detail.startswith("nothing")


def test_mla_is_full_attention_at_its_latent_size():
    exp = exp_for({"a": 700, "b": 1000}, [("mla", 4, 640)], b=16)
    assert exp.stored_bytes == 327_680 + 491_520 == exp.loaded_bytes


def test_checks_pass_on_exact_figures_and_fail_otherwise():
    exp = scout()
    assert ck.check_stored(exp, 245_366_784).passed
    assert not ck.check_stored(exp, 0).passed
    assert "off by -196,608 B" in ck.check_stored(exp, 245_366_784 - 196_608).detail
    assert ck.check_loaded(exp, 245_366_784).passed
    failed = ck.check_loaded(exp, 245_366_784 - 4096)
    assert not failed.passed and "-4,096" in failed.detail
    assert ck.check_ext_hits(exp, 1248).passed
    assert "fewer hits" in ck.check_ext_hits(exp, 1232).detail
    assert "double counting" in ck.check_ext_hits(exp, 2496).detail
    assert ck.check_filler_loaded_nothing(0).passed
    assert not ck.check_filler_loaded_nothing(4096).passed
    assert ck.check_evicted(0).passed
    assert not ck.check_evicted(16).passed
    # The CPU tier's usage once idle: any share held is a chunk the tier lost count of.
    assert ck.check_tier_idle(0.0).passed
    idle = ck.check_tier_idle(2 / 36)
    assert not idle.passed and idle.name == "tier-idle" and idle.observed == "0.0555556"


def comp(text, ids, lps):
    c = Completion("replay", "target-0", 10, {})
    c.text, c.token_ids = text, ids
    c.logprobs = {
        "tokens": text.split(),
        "token_logprobs": lps,
        "top_logprobs": [{t: lp} for t, lp in zip(text.split(), lps, strict=True)],
        "text_offset": list(range(len(ids))),
    }
    return c


def test_first_divergence_reports_field_and_position():
    a = comp("t1 t2 t3", [1, 2, 3], [-1.0, -2.0, -3.0])
    assert first_divergence(a, comp("t1 t2 t3", [1, 2, 3], [-1.0, -2.0, -3.0])) is None
    d = first_divergence(a, comp("t1 t2 t4", [1, 2, 4], [-1.0, -2.0, -3.0]))
    assert d.field == "text" and d.position == 7
    d = first_divergence(a, comp("t1 t2 t3", [1, 2, 3], [-1.0, -2.0000001, -3.0]))
    assert d.field == "logprobs.token_logprobs" and d.position == 1
    check = ck.check_outputs([("target-0", d)], "replay-output-identical", "why")
    assert not check.passed and "target-0" in check.detail and "position 1" in check.detail
