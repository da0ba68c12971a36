"""The stress run's stall watch (harness.server.stall_watch.Sampler): an engine that
takes and generates no token while requests wait is stopped at once, instead of every
request waiting out its timeout (a mutant that never completes a transfer job stalled
the engine 38 s into the traffic; the run then waited 20 minutes)."""

from __future__ import annotations

from harness.server.metrics import Snapshot
from harness.server.stall_watch import Sampler, stalled


def snap(prompt: float, generated: float) -> Snapshot:
    return Snapshot(prompt_tokens=prompt, generation_tokens=generated)


def watch(outstanding: int, stall_s: float = 10.0) -> tuple[Sampler, list[str]]:
    fired: list[str] = []
    return Sampler(
        "http://127.0.0.1:1",
        outstanding=lambda: outstanding,
        on_stall=fired.append,
        stall_s=stall_s,
    ), fired


def test_no_movement_with_requests_waiting_fires_once_after_the_window():
    s, fired = watch(outstanding=3)
    s._watch(snap(100, 5), 0.0)
    s._watch(snap(100, 5), 9.9)
    assert fired == []
    s._watch(snap(100, 5), 10.0)
    assert fired == [s.stall] and "3 request(s) outstanding" in s.stall
    s._watch(snap(100, 5), 30.0)
    assert len(fired) == 1  # once


def test_any_token_taken_or_generated_restarts_the_window():
    s, fired = watch(outstanding=2)
    s._watch(snap(100, 5), 0.0)
    s._watch(snap(100, 6), 9.0)  # a token generated
    s._watch(snap(612, 6), 18.0)  # a prefill chunk taken
    s._watch(snap(612, 6), 27.0)
    assert fired == []
    s._watch(snap(612, 6), 28.0)
    assert len(fired) == 1


def test_an_idle_engine_with_nothing_outstanding_never_stalls():
    s, fired = watch(outstanding=0)
    for t in range(0, 100, 5):
        s._watch(snap(100, 5), float(t))
    assert fired == [] and s.stall == ""


def test_the_verdict_line_says_what_was_seen():
    text = stalled(4, 121.4, (6120.0, 48.0))
    assert text.startswith("the engine stalled: 4 request(s) outstanding")
    assert "121 s" in text and "the harness stopped the server" in text


def test_the_longest_quiet_with_requests_waiting_is_measured():
    """What a stall window is calibrated from (mutate's baseline): only stillness while
    requests wait counts, and the longest of it."""
    s, fired = watch(outstanding=2, stall_s=100.0)
    s._watch(snap(100, 5), 0.0)
    s._watch(snap(100, 5), 3.0)  # 3 s still
    s._watch(snap(100, 6), 4.0)
    s._watch(snap(100, 6), 11.5)  # 7.5 s still
    s._watch(snap(100, 7), 12.0)
    assert s.longest_still_s == 7.5 and fired == []
    idle, _ = watch(outstanding=0)
    idle._watch(snap(1, 1), 0.0)
    idle._watch(snap(1, 1), 50.0)
    assert idle.longest_still_s == 0.0  # nothing waited: not a quiet


def test_a_stall_with_secondary_tier_loads_in_flight_names_the_tier():
    """A tier whose loads never complete (the tier-never-loads disk fault): the gauge of
    active promotion jobs stays up while nothing moves, and the line says so."""
    s, fired = watch(outstanding=1)
    stuck = Snapshot(prompt_tokens=100, generation_tokens=5, promotions_active=2)
    s._watch(stuck, 0.0)
    s._watch(stuck, 10.0)
    assert fired and "2 secondary-tier load (promotion) job(s) still active" in fired[0]
    assert "secondary-tier" not in stalled(1, 12.0, (100.0, 5.0))  # none in flight
