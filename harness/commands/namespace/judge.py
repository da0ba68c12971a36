"""Judging one restarted server: did it reuse KV written under another configuration,
and if so, did the answers change?

The rule (a restarted server with exactly one change must find nothing, or answer as a
clean cache would) needs no model of vLLM: the server's own clean-cache answers are the
reference. They come from the same prompts under a ``cache_salt``, which changes every
block hash, so nothing written before can match; a second salted pass, served from the
GPU prefix cache, measures this engine's own noise between a cached and a computed
prefix (zero on the CPU kernels the harness has met), and the replay may stray from the
control by ``NOISE_FACTOR`` times that, as the round trip's replay check allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.server.workload import Completion, within_tolerance

NOISE_FACTOR = 4.0  # as roundtrip.evaluate.SPLIT_NOISE_FACTOR

# A row's outcome: the first three are the rule kept, the rest broken.
HIT_ALL = "hit-all"  # the unchanged restart found every target chunk, answers right
NO_REUSE = "no-reuse"  # a change, and nothing written before it was hit
REUSED_SAME = "reused-same"  # hit across a change, answers as a clean cache's
WRONG_REUSE = "wrong-reuse"  # hit across a change, answers not a clean cache's
MISSED = "missed"  # the unchanged restart hit less than every target chunk
WRONG_ANSWERS = "wrong-answers"  # answers changed with nothing (or all) reused as it should
NOT_STARTED = "not-started"  # the restarted server never became ready
ENGINE_FAILED = "engine-failed"  # it died or raised serving the replay
NOT_RUNNABLE = "not-runnable"  # the platform cannot make this change
KEPT = (HIT_ALL, NO_REUSE, REUSED_SAME)


@dataclass
class Served:
    """What a restarted server did: the replay's counters and the three passes' answers."""

    hit_tokens: float  # external prefix-cache hits over the replay (tokens)
    loaded_bytes: float
    disk_hits: float
    replay: list[Completion]
    control: list[Completion]  # the same prompts under a cache salt: a clean cache
    control_again: list[Completion]  # the salted prompts again: the engine's own noise


@dataclass
class Row:
    """One cell of the matrix: a build and a change."""

    build: str
    vllm_version: str
    change: str
    what: str
    outcome: str
    passed: bool | None  # None: not run
    expected_hit_tokens: int
    hit_tokens: int | None = None
    loaded_bytes: int | None = None
    disk_hits: int | None = None
    answers: str = ""
    known: str = ""  # the upstream bug a failing row is, where one is known
    detail: str = ""
    seconds: float = 0.0
    tolerance: float = 0.0
    diffs: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def noise(control: Sequence[Completion], again: Sequence[Completion]) -> float:
    """The largest |logprob| difference between a computed and a GPU-cached pass of the
    same prompts on one server, where their tokens agree."""
    return max(
        (
            within_tolerance(a, b, float("inf")).max_delta
            for a, b in zip(control, again, strict=True)
        ),
        default=0.0,
    )


def compare(
    reference: Sequence[Completion], observed: Sequence[Completion], tol: float
) -> tuple[str, list[dict[str, Any]]]:
    """``""`` when every answer agrees within ``tol`` (identical tokens); else the first
    difference in words, and every difference as records."""
    diffs = []
    for ref, obs in zip(reference, observed, strict=True):
        close = within_tolerance(ref, obs, tol)
        if close.divergence is not None:
            d = close.divergence
            diffs.append(
                {"prompt": ref.prompt, "field": d.field, "index": d.position,
                 "expected": d.left, "observed": d.right}
            )  # fmt: skip
    if not diffs:
        return "", []
    first = diffs[0]
    return (f"{first['prompt']}: {first['field']} differ from position {first['index']}", diffs)


def judge(
    unchanged: bool,
    expected_hit_tokens: int,
    served: Served,
    writer: Sequence[Completion] = (),
) -> tuple[str, bool, str, float, list[dict[str, Any]]]:
    """(outcome, kept, answers in words, tolerance, differences) of one restarted server.

    The unchanged restart must hit every target chunk and answer as its control and as
    the server that wrote the tier; a changed one must hit nothing or answer as its
    control."""
    tol = NOISE_FACTOR * noise(served.control, served.control_again)
    differs, diffs = compare(served.control, served.replay, tol)
    if unchanged and not differs and writer:
        differs, diffs = compare(writer, served.replay, tol)
        differs = f"against the writing server: {differs}" if differs else ""
    answers = differs or ("identical" if tol == 0 else f"within {tol:.2g}")
    hit = int(served.hit_tokens)
    if unchanged:
        if hit < expected_hit_tokens:
            return MISSED, False, answers, tol, diffs
        return (
            (WRONG_ANSWERS, False, answers, tol, diffs)
            if differs
            else (HIT_ALL, True, answers, tol, diffs)
        )
    if hit == 0:
        return (
            (WRONG_ANSWERS, False, answers, tol, diffs)
            if differs
            else (NO_REUSE, True, answers, tol, diffs)
        )
    return (
        (WRONG_REUSE, False, answers, tol, diffs)
        if differs
        else (REUSED_SAME, True, answers, tol, diffs)
    )
