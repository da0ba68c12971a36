"""Stress plans are pure data: the same seed gives the same plan, each profile has the
shape its bugs need (turns after their parents with fillers between, prefixes of unaligned
lengths, more long requests than a pool holds, aborts, prompt_logprobs twins)."""

from __future__ import annotations

import pytest

from harness.commands.stress.workload import plan_profile, plan_summary
from harness.scenario.stress_profiles import PROFILES, ProfileSettings

S = ProfileSettings()
VOCAB = 1000


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    a = plan_profile("mixed", S, VOCAB, 0)
    b = plan_profile("mixed", S, VOCAB, 0)
    c = plan_profile("mixed", S, VOCAB, 1)
    assert [(r.id, r.at_s, r.prompt) for r in a] == [(r.id, r.at_s, r.prompt) for r in b]
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_multi_turn_turns_follow_their_parents_with_fillers_between():
    plan = plan_profile("multi-turn", S, VOCAB, 0)
    by = {r.id: r for r in plan}
    turns = [r for r in plan if r.profile == "multi-turn"]
    assert len(turns) == S.conversations * S.turns
    for r in turns:
        t = int(r.id.rsplit("/t", 1)[1])
        if t == 0:
            assert r.parent is None and len(r.prompt) == S.first_tokens
        else:
            parent = by[r.parent]  # type: ignore[index]
            assert parent.id.endswith(f"/t{t - 1}") and r.at_s >= parent.at_s
            assert len(r.prompt) == S.turn_tokens
    fillers = [r for r in plan if r.filler]
    assert len(fillers) == S.fillers * S.turns and all(r.max_tokens == 1 for r in fillers)
    # fillers come from the other half of the vocabulary: no shared prefix with a chat
    mid = (16 + VOCAB) // 2
    assert all(min(r.prompt) >= mid for r in fillers)
    assert all(max(r.prompt) < mid for r in turns)


def test_shared_prefix_families_share_unaligned_prefixes():
    plan = [r for r in plan_profile("shared-prefix", S, VOCAB, 0) if not r.filler]
    assert len(plan) == S.families * S.members
    for f, n in enumerate(S.prefix_tokens):
        members = [r.prompt for r in plan if r.id.startswith(f"shared-prefix/f{f}/")]
        assert all(m[:n] == members[0][:n] for m in members)
        assert len({tuple(m[n:]) for m in members}) == S.members
    assert any(n % 16 for n in S.prefix_tokens)  # not a multiple of any block size


def test_preemption_asks_for_more_than_a_small_pool():
    plan = plan_profile("preemption", S, VOCAB, 0)
    need = sum(len(r.prompt) + r.max_tokens for r in plan)
    assert len(plan) == S.long_requests and need > 2048 * 2
    assert max(r.at_s for r in plan) <= 0.2  # all at once


def test_abort_and_prompt_logprobs_shapes():
    aborts = plan_profile("abort", S, VOCAB, 0)
    assert all(r.abort_after == S.abort_after and r.max_tokens > S.abort_after for r in aborts)
    pl = plan_profile("prompt-logprobs", S, VOCAB, 0)
    plain = {r.id.split("/")[1]: r for r in pl if r.id.endswith("/plain")}
    scored = {r.id.split("/")[1]: r for r in pl if r.id.endswith("/scored")}
    assert plain.keys() == scored.keys()
    for k, r in scored.items():
        assert r.prompt == plain[k].prompt and r.prompt_logprobs == 1
        assert r.at_s > plain[k].at_s


def test_mixed_holds_every_profile():
    summary = plan_summary(plan_profile("mixed", S, VOCAB, 3))
    assert set(summary) == {*PROFILES[:-1], "filler"}
    assert plan_profile("mixed", S, VOCAB, 3)[0].at_s <= S.spread_s


def test_unknown_profile_and_tiny_vocabulary():
    with pytest.raises(ValueError, match="unknown profile 'soak'"):
        plan_profile("soak", S, VOCAB, 0)
    with pytest.raises(ValueError, match="too small"):
        plan_profile("abort", S, 20, 0)
