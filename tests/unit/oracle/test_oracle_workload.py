"""Generated sequences (harness.oracle.workload): the same from one seed everywhere, and
leaning on the lengths where the offloading rules turn."""

from __future__ import annotations

import pytest

from harness.oracle.workload import Shape, Step, draw, requests_of, waves_of

SHAPE = Shape(chunk=256, block=128, windows=(512,), max_prompt=1800, max_tokens=4)


def test_a_seed_gives_the_same_sequence_and_another_seed_another():
    assert draw(SHAPE, 7, 40) == draw(SHAPE, 7, 40)
    assert draw(SHAPE, 7, 40) != draw(SHAPE, 8, 40)


def test_most_prompts_sit_on_a_boundary_or_one_token_beside_it():
    reqs = requests_of(draw(SHAPE, 1, 300))
    units = (256, 128, 512)
    near = [r for r in reqs if any(min(len(r.tokens) % u, -len(r.tokens) % u) <= 1 for u in units)]
    assert len(near) >= 0.7 * len(reqs)
    assert all(2 <= len(r.tokens) <= SHAPE.max_prompt for r in reqs)


def test_sequences_share_prefixes_repeat_prompts_and_cap_loads():
    reqs = requests_of(draw(SHAPE, 3, 200))
    heads = [r.tokens[:256] for r in reqs if len(r.tokens) >= 256]
    assert len(set(heads)) < len(heads)  # prefixes shared
    assert len({r.tokens for r in reqs}) < len(reqs)  # exact repeats
    assert any(r.max_load_tokens is not None for r in reqs)
    assert any(r.abort_after is not None for r in reqs)
    assert any("chunk boundary" in r.why for r in reqs)


def test_resets_in_flight_only_when_asked():
    plain = requests_of(draw(SHAPE, 4, 200))
    assert all(r.reset_after is None for r in plain)
    shape = Shape(chunk=256, block=128, max_prompt=1800, max_tokens=6, resets_in_flight=True)
    assert any(r.reset_after is not None for r in requests_of(draw(shape, 4, 200)))


def test_a_step_survives_its_record():
    for step in draw(SHAPE, 5, 50):
        assert Step.from_record(step.record()) == step


def test_bad_shapes_and_counts_are_refused():
    with pytest.raises(ValueError, match="positive"):
        Shape(chunk=0, block=128)
    with pytest.raises(ValueError, match="room"):
        Shape(chunk=256, block=128, max_prompt=1)
    with pytest.raises(ValueError, match="at least one"):
        draw(SHAPE, 0, 0)


def test_a_waves_requests_share_no_block_and_resets_fall_between_waves():
    shape = Shape(chunk=256, block=128, windows=(512,), max_prompt=1800, wave=4)
    steps = draw(shape, 6, 200)
    served = waves_of(steps)
    waves = [[steps[i] for i in group] for group in served if not steps[group[0]].reset]
    assert sum(len(w) for w in waves) == 200
    assert all(len(w) == 4 for w in waves)
    for w in waves:
        assert len({s.wave for s in w}) == 1
        assert len({s.tokens[0] for s in w}) == len(w), "a wave's prompts start apart"
    # A reset is served alone and never splits a wave.
    for group in served:
        if steps[group[0]].reset:
            assert len(group) == 1
    assert any(steps[g[0]].reset for g in served)
    # Prefixes are still shared across waves: what a wave hits, an earlier one stored.
    heads = [s.tokens[:256] for s in requests_of(steps) if len(s.tokens) >= 256]
    assert len(set(heads)) < len(heads)
    # No tier reset under a wave's requests, even where the shape asks for them.
    mid = Shape(chunk=256, block=128, max_prompt=1800, max_tokens=6, resets_in_flight=True, wave=3)
    assert all(r.reset_after is None for r in requests_of(draw(mid, 4, 200)))


def test_one_at_a_time_is_the_sequence_it_always_was():
    assert draw(SHAPE, 9, 60) == draw(Shape(**{**SHAPE.__dict__, "wave": 1}), 9, 60)
    assert all(len(g) == 1 for g in waves_of(draw(SHAPE, 9, 60)))
