"""The stress profiles a scenario may name, and each profile's numbers (a scenario's
``[profiles.<name>]`` table; unset: the defaults). What the numbers make is the stress
command's (``harness.commands.stress.workload``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROFILES = ("multi-turn", "shared-prefix", "preemption", "abort", "prompt-logprobs", "mixed")


@dataclass(frozen=True)
class ProfileSettings:
    """A profile's numbers (a scenario's ``[profiles.<name>]``; unset: the defaults)."""

    conversations: int = 4  # multi-turn: chats interleaved
    turns: int = 3  # multi-turn: turns per chat
    first_tokens: int = 600  # multi-turn: the first turn's prompt
    turn_tokens: int = 150  # multi-turn: new text per later turn
    turn_max_tokens: int = 300  # multi-turn: each answer (long: decode-phase stores)
    families: int = 3  # shared-prefix: prompt families
    members: int = 3  # shared-prefix: prompts per family
    prefix_tokens: Sequence[int] = (300, 517, 700)  # shared-prefix: one per family, cycled
    suffix_tokens: int = 120  # shared-prefix: each member's own text
    long_requests: int = 6  # preemption: concurrent long requests
    long_prompt: int = 600  # preemption: their prompt
    long_max_tokens: int = 400  # preemption: their generation (decode-phase stores)
    aborts: int = 4  # abort: requests cut off mid-generation
    abort_after: int = 8  # abort: streamed tokens before the client disconnects
    logprob_requests: int = 3  # prompt-logprobs: requests asking for prompt_logprobs
    max_tokens: int = 48  # generation of every other request
    fillers: int = 2  # unrelated prompts between rounds, so the GPU cache evicts
    filler_tokens: int = 900
    spread_s: float = 2.0  # arrivals spread over this many seconds (seeded)
