"""Teacher-forced judging: a near-tie within the measured noise floor is not a divergence,
a token the reference clearly would not produce is, at its first position."""

from __future__ import annotations

import math

from harness.commands.stress.reference import judge_tokens, noise_floor, parse_prompt_logprobs

RAW = [
    None,
    {"5": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}},
    {"7": {"logprob": -0.69, "rank": 1}, "8": {"logprob": -0.70, "rank": 2}},
    {"9": {"logprob": -0.01, "rank": 1}, "3": {"logprob": -6.0, "rank": 2}},
]


def test_vllm_prompt_logprobs_are_read_by_token_id():
    scores = parse_prompt_logprobs(RAW)
    assert scores[0] is None and scores[1] == {5: -0.1}
    assert scores[2] == {7: -0.69, 8: -0.70}
    assert parse_prompt_logprobs(None) == []


def test_equal_tokens_pass():
    v = judge_tokens(2, [7, 9], parse_prompt_logprobs(RAW), 0.004)
    assert v.divergence is None and v.near_ties == 0 and v.scored == 2


def test_a_near_tie_within_the_floor_is_not_a_divergence():
    v = judge_tokens(2, [8, 9], parse_prompt_logprobs(RAW), 0.02)
    assert v.divergence is None and v.near_ties == 1
    assert math.isclose(v.widest, 0.01)  # how close the noise came to the tolerance


def test_a_clear_preference_is_a_divergence_at_its_first_position():
    v = judge_tokens(2, [7, 3], parse_prompt_logprobs(RAW), 0.02)
    d = v.divergence
    assert d is not None and (d.index, d.got, d.want) == (1, 3, 9)
    assert math.isclose(d.gap, 5.99)
    assert "token 1: got 3, the reference prefers 9 by 5.9900" in d.text()
    # below the gap, but a tolerance of zero calls the near-tie a divergence too
    assert judge_tokens(2, [8, 9], parse_prompt_logprobs(RAW), 0.0).divergence is not None


def test_tokens_the_reference_did_not_score_diverge():
    v = judge_tokens(2, [7, 9, 4], parse_prompt_logprobs(RAW), 0.02)
    assert v.divergence is not None and v.divergence.index == 2 and math.isinf(v.divergence.gap)
    assert "not in the reference's top" in v.divergence.text()


def test_noise_floor_is_the_largest_shared_difference():
    a = parse_prompt_logprobs(RAW)
    b = [None, {5: -0.1}, {7: -0.686, 8: -0.70, 11: -3.0}, {9: -0.01}]
    assert math.isclose(noise_floor(a, b), 0.004, abs_tol=1e-12)
