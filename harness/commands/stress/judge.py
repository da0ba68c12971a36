"""Stress runs: concurrent, multi-turn, preempting traffic through the connector, every
request judged against a connector-off reference.

A run has two servers, one after the other (never two at once):

1. the server under test (the connector on) serves the plan (``harness.commands.stress.workload``)
   at the chosen concurrency, through ``harness.commands.stress.driver``;
2. the reference server (the same engine, the connector off, prefix caching on) first
   serves the same plan at the same concurrency, which measures the noise floor the way
   the run under test is judged: how far a clean concurrent run's decoded tokens and
   their top-two gaps stray from the same tokens scored alone; then it scores every
   request of the run under test alone (teacher forcing, ``prompt_logprobs`` over the
   prompt and what was generated), and each generated token must be the reference's
   choice or within the tolerance the floor gives (``harness.commands.stress.reference``).

Why teacher forcing rather than a second generation: two generations part at the first
near-tie that two computations round apart, and everything after differs; scoring the
run's own tokens alone makes the comparison exact wherever the reference is not at a tie.
How far decode and teacher-forced prefill round apart depends on vLLM's CPU attention
kernel: not at all in one process on ``vec``, one bf16 step at most positions and now
and then ten on ``amx`` (docs/stress.md), so the floor is measured, on the kernel that
ran, never assumed.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.commands.stress.driver import Reply, drive, post_json
from harness.commands.stress.floor import (
    SCORE_TOP,
    Floor,
    Scorer,
    compared,
    floor_of,
    score_request,
    tolerance_for,
)
from harness.commands.stress.reference import (
    Scores,
    judge_tokens,
    parse_prompt_logprobs,
)
from harness.commands.stress.result import StressResult
from harness.commands.stress.workload import PlannedRequest


def http_scorer(base_url: str, model: str) -> Scorer:
    """A ``Scorer`` through ``/v1/completions`` with ``prompt_logprobs``."""

    def score(prompt: list[int], output: list[int]) -> Scores:
        req = score_request(prompt, output)
        body = post_json(
            f"{base_url}/v1/completions",
            {
                "model": model,
                "prompt": req.prompt,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": SCORE_TOP,
                "return_token_ids": True,
            },
            600.0,
        )
        return parse_prompt_logprobs(body["choices"][0].get("prompt_logprobs"))

    return score


def judge_run(result: StressResult, score: Scorer) -> None:
    """Every compared request of the run under test, scored alone, judged within the
    tolerance."""
    assert result.tolerance is not None
    for o in compared(result.outcomes):
        result.verdicts[o.id] = judge_tokens(
            len(o.prompt), o.output, score(o.prompt, o.output), result.tolerance
        )


def run_reference_side(result: StressResult, send: Callable[..., Reply], score: Scorer) -> None:
    """On the reference server: the plan at the same concurrency (the floor), then the
    run under test's requests scored alone."""
    plan = result.plan
    result.reference = drive(plan.requests, send, plan.concurrency)
    set_floor(result, floor_of(result.reference, score))
    judge_run(result, score)
    explain_divergences(result, send)


def set_floor(result: StressResult, fl: Floor) -> None:
    """The floor's figures on the result, and the tolerance it gives."""
    result.floor, result.floor_tokens = fl.value, fl.tokens
    result.floor_stray, result.floor_resolution = fl.stray, fl.resolution
    result.floor_pair, result.floor_lost = fl.pair, fl.lost
    result.tolerance = tolerance_for(fl)


# Tokens of each side shown from the first divergence on (divergence.md).
SHOWN_TOKENS = 12


def explain_divergences(result: StressResult, send: Callable[..., Reply]) -> None:
    """For each diverging request, what the reference says from the divergence on: its
    greedy continuation of the prompt and the run's tokens before the divergence, beside
    the run's own (both texts in ``divergence.md``)."""
    by = {o.id: o for o in result.outcomes}
    for rid, verdict in result.verdicts.items():
        d = verdict.divergence
        if d is None or rid not in by:
            continue
        o = by[rid]
        prompt = o.prompt + o.output[: d.index]
        ask = PlannedRequest(f"explain/{rid}", "explain", 0.0, prompt, max_tokens=SHOWN_TOKENS)
        try:
            reply = send(ask, prompt)
        except Exception as err:  # an explanation is a courtesy, never the verdict
            result.explanations[rid] = {"error": f"{type(err).__name__}: {err}"}
            continue
        result.explanations[rid] = {"reference_ids": reply.ids, "reference_text": reply.text}
