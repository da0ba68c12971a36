"""The round trip's arithmetic and checks, against the PR's own numbers."""

from __future__ import annotations

from harness import checks as ck
from harness.workload import Completion, first_divergence


def scout() -> ck.Expected:
    # 48 layers: 12 full (NoPE) + 36 chunked; 4096 B per layer per token; chunk 8192.
    return ck.expected_for(prompt_lengths={"t": 1262}, max_tokens=2, tokens_per_chunk=16,
                           attention_chunk_size=8192, full_bpt=12 * 4096,
                           chunked_bpt=36 * 4096)


def test_pr_51161_arithmetic():
    exp = scout()
    assert exp.kv_bytes_per_token == 196_608
    assert exp.hit_tokens == 1248  # 78 full 16-token blocks of 1262
    assert exp.stored_bytes == 245_366_784
    assert exp.loaded_bytes == 245_366_784  # fits in one attention chunk: loaded == stored


def test_chunked_layers_need_only_the_current_attention_chunk():
    exp = ck.expected_for(prompt_lengths={"a": 700, "b": 1000}, max_tokens=16,
                          tokens_per_chunk=256, attention_chunk_size=512, full_bpt=256,
                          chunked_bpt=768)
    a, b = exp.targets
    assert (a.stored_tokens, a.hit_tokens, a.chunked_needed_tokens) == (512, 512, 0)
    assert (b.stored_tokens, b.hit_tokens, b.chunked_needed_tokens) == (768, 768, 256)
    assert exp.loaded_bytes == (512 + 768) * 256 + 256 * 768


def test_without_chunked_layers_everything_loads():
    exp = ck.expected_for(prompt_lengths={"a": 700}, max_tokens=16, tokens_per_chunk=256,
                          attention_chunk_size=None, full_bpt=1024, chunked_bpt=0)
    assert exp.loaded_bytes == exp.stored_bytes == 512 * 1024


def test_checks_pass_on_exact_figures_and_fail_otherwise():
    exp = scout()
    assert ck.check_stored(exp, 245_366_784).passed
    assert not ck.check_stored(exp, 0).passed
    assert "B/token" in ck.check_stored(exp, 245_366_784 - 196_608).detail
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


def comp(text, ids, lps):
    c = Completion("replay", "target-0", 10, {})
    c.text, c.token_ids = text, ids
    c.logprobs = {"tokens": text.split(), "token_logprobs": lps,
                  "top_logprobs": [{t: lp} for t, lp in zip(text.split(), lps, strict=True)],
                  "text_offset": list(range(len(ids)))}
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
