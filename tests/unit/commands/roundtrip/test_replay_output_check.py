"""The round trip's replay-vs-warm output check on engines whose numerics depend on how
much of a prompt was cached (vLLM's AMX MLA kernel): identical wherever the engine
computes the same thing, else within a multiple of its own measured cold-vs-warm noise.

Recorded on an AMX host (nightly, deepseek-mla on 0.32.0, `AMXMLABackend`): the first
logprob was -6.047116 cold, -6.047137 warm, -6.047127 replayed, with bytes stored and
loaded exact. The seeded faults (a corrupt, dropped or partial load) move logprobs by
orders more; those runs are tests/unit/tools/test_replay.py's fixtures."""

from __future__ import annotations

from harness.commands.roundtrip.evaluate import (
    SPLIT_NOISE_FACTOR,
    replay_output_check,
    split_noise_of,
)
from harness.server.workload import Completion, first_divergence


def completion(phase: str, first: float, tokens: tuple[int, ...] = (7, 8)) -> Completion:
    logprobs = {
        "token_logprobs": [first, -5.5],
        "top_logprobs": [{"t7": first}, {"t8": -5.5}],
        "tokens": ["t7", "t8"],
        "text_offset": [0, 2],
    }
    return Completion(phase, "target-0", 700, {}, "t7t8", list(tokens), logprobs)


def outputs(cold: float, warm: float, replay: float, **replay_kw) -> dict:
    return {
        ("cold", "target-0"): completion("cold", cold),
        ("warm", "target-0"): completion("warm", warm),
        ("replay", "target-0"): completion("replay", replay, **replay_kw),
    }


def judge(outs: dict, same_split: bool = False):
    pairs = [
        ("target-0", first_divergence(outs[("warm", "target-0")], outs[("replay", "target-0")]))
    ]
    return replay_output_check(
        outs, ["target-0"], pairs, split_noise_of(outs, ["target-0"]), same_split
    )


def test_the_amx_mla_run_passes_within_the_engines_own_split_noise():
    check = judge(outputs(-6.047116279602051, -6.047137260437012, -6.0471272468566895))
    assert check.passed, check
    assert "cold vs warm: 2.1e-05" in check.why and "within" in check.expected


def test_a_split_independent_engine_must_still_be_byte_identical():
    """Cold and warm agree to the bit (the vec kernel, Llama 4 on AMX): no tolerance."""
    check = judge(outputs(-6.0, -6.0, -6.00001))
    assert not check.passed
    assert check.expected.startswith("1 identical outputs")


def test_the_same_cached_length_must_be_byte_identical_whatever_the_noise():
    check = judge(outputs(-6.047116, -6.047137, -6.047127), same_split=True)
    assert not check.passed and "identical" in check.expected


def test_wrong_kv_is_far_beyond_the_noise():
    """Seeded fault, as a corrupt load leaves it: the replay's logprobs move by 0.4."""
    outs = outputs(-6.047116, -6.047137, -6.45)
    check = judge(outs)
    assert not check.passed and "beyond" in check.detail
    tol = SPLIT_NOISE_FACTOR * split_noise_of(outs, ["target-0"])
    assert 1000 * tol < 0.4


def test_a_different_token_is_caught():
    check = judge(outputs(-6.047116, -6.047137, -6.047127, tokens=(7, 9)))
    assert not check.passed and "token_ids" in check.detail
