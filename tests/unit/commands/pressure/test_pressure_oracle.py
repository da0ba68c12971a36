"""The pressure oracle against the worked examples of docs/pressure-design.md §2.4.

Each table there was derived by hand from the design's semantics and cross-checked by
driving vLLM's own manager and policy classes (0.33.0's LRU, 0.30.0's ARC, 0.32.0's
threshold); the oracle must reproduce every row: hits, stores, evictions, skips and
what stays resident, in order.
"""

from __future__ import annotations

import pytest

from harness.commands.pressure.oracle import Tier, chunks_of, predict

N = 8  # slots: cpu_bytes_to_use 2 MiB of 256 KiB chunks (llama4-no-chunk)
S1 = [("A", 4), ("B", 4), ("A", 4), ("C", 4), ("D", 4), ("A", 4), ("E", 1), ("D", 4), ("D", 4)]


def keys(*prompts: str) -> tuple[str, ...]:
    """``keys("A4-1", "B4-1")``: prompt chunks in the order written (tail to head)."""
    out: list[str] = []
    for spec in prompts:
        name, hi, lo = spec[0], int(spec[1]), int(spec[-1])
        step = -1 if hi > lo else 1
        out += [f"{name}{i}" for i in range(hi, lo + step, step)]
    return tuple(out)


def test_s1_under_lru_row_by_row():
    steps = predict(S1, N, "lru")
    table = [(s.hit, len(s.stored), s.evicted, s.resident) for s in steps]
    assert table == [
        (0, 4, (), keys("A4-1")),
        (0, 4, (), keys("A4-1", "B4-1")),
        (4, 0, (), keys("B4-1", "A4-1")),
        (0, 4, keys("B4-1"), keys("A4-1", "C4-1")),
        (0, 4, keys("A4-1"), keys("C4-1", "D4-1")),
        (0, 4, keys("C4-1"), keys("D4-1", "A4-1")),
        (0, 1, ("D4",), (*keys("D3-1", "A4-1"), "E1")),  # the tail goes first
        (3, 1, ("A4",), (*keys("A3-1"), "E1", *keys("D4-1"))),  # the hit was used first
        (4, 0, (), (*keys("A3-1"), "E1", *keys("D4-1"))),
    ]
    assert steps[7].stored == ("D4",)


def test_s1_under_arc_row_by_row():
    steps = predict(S1, N, "arc")
    assert [(s.hit, len(s.stored), s.evicted) for s in steps] == [
        (0, 4, ()),
        (0, 4, ()),
        (4, 0, ()),  # A: T1 -> T2
        (0, 4, keys("B4-1")),  # |T1| = 4 >= p = 0: from T1
        (0, 4, keys("C4-1")),
        (4, 0, ()),  # A is frequent: where LRU hit 0 and stored 4, the policies split
        (0, 1, ("D4",)),
        (3, 1, ("E1",)),  # D4 was a B1 ghost: p = 1, and |T1| = 1 >= 1
        (4, 0, ()),
    ]


def test_s2_arc_falls_back_to_t1_when_t2_has_nothing():
    """#55461: with T2 empty and |T1| below p, ARC must still evict from T1."""
    tier = Tier(N, "arc")
    steps = [tier.serve(p, chunks_of(p, 4)) for p in "ABCABB"]
    assert [(s.hit, len(s.stored), s.evicted, s.failed) for s in steps] == [
        (0, 4, (), False),
        (0, 4, (), False),
        (0, 4, keys("A4-1"), False),
        (0, 4, keys("B4-1"), False),  # four B1 ghost hits: p = 4
        (0, 4, ("C4", "C3", "C2", "C1"), False),  # C4 by p, then the fallback
        (4, 0, (), False),
    ]


def test_s3_store_threshold_two_admits_on_the_second_offer():
    steps = predict([("A", 4)] * 4, N, "lru", store_threshold=2)
    assert [(s.hit, len(s.stored), len(s.skipped)) for s in steps] == [
        (0, 0, 4),
        (0, 4, 0),
        (4, 0, 0),
        (4, 0, 0),
    ]


@pytest.mark.parametrize(("threshold", "last_hit"), [(2, 4), (0, 0)])
def test_s3b_one_offer_never_evicts_a_reused_prompt(threshold, last_hit):
    """A, A, X, Y, Z, A: with threshold 2 the one-offer prompts are skipped and A stays;
    without it Y evicts A."""
    seq = [("A", 4), ("A", 4), ("X", 4), ("Y", 4), ("Z", 4), ("A", 4)]
    steps = predict(seq, N, "lru", store_threshold=threshold)
    assert steps[-1].hit == last_hit
    if threshold:
        assert all(len(s.skipped) == 4 and not s.stored for s in steps[2:5])


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_request_never_evicts_the_prefix_it_just_loaded(policy):
    """A(4), B(4), then A extended to 6 chunks on 8 slots: the two new chunks must take
    B's place, not A's own loaded head (vLLM 0.31-0.32 evict A3, A4: design §1.6)."""
    steps = predict([("A", 4), ("B", 4), ("A", 6), ("A", 6)], N, policy)
    assert steps[2].hit == 4 and steps[2].stored == ("A5", "A6")
    assert all(k.startswith("B") for k in steps[2].evicted)
    assert steps[3].hit == 6


def test_a_store_with_no_room_fails_whole():
    tier = Tier(2, "lru")
    step = tier.serve("A", chunks_of("A", 3))  # three chunks, two slots, nothing to evict
    assert step.failed and step.stored == () and step.resident == ()


def test_groups_take_a_slot_each():
    assert chunks_of("A", 2, groups=2) == ["A1g0", "A1g1", "A2g0", "A2g1"]
    with pytest.raises(ValueError):
        Tier(0)


# --- upstream behaviours, modelled exactly (harness.names.DEVIATIONS) -------------------


def test_access_at_finish_evicts_the_prefix_a_request_just_loaded():
    """0.31-0.32 LRU (and ARC from 0.31): S1 row 8 hits D1-D3 and evicts D3 for D4, so
    row 9 hits two chunks and stores D3 again (replayed on vLLM's own manager)."""
    for policy, second in (("lru", ("A4",)), ("arc", ("E1",))):
        steps = predict(S1, N, policy, deviations=["access-at-finish"])
        assert [(s.hit, s.stored, s.evicted) for s in steps[7:]] == [
            (3, ("D4",), ("D3",)),
            (2, ("D3",), second),
        ]


def test_arc_without_t1_fallback_fails_the_store_of_s2():
    """#55461 (0.27-0.29): S2 row 5 finds T2 empty and gives up; B is never stored and
    row 6 hits nothing."""
    s2 = [("A", 4), ("B", 4), ("C", 4), ("A", 4), ("B", 4), ("B", 4)]
    steps = predict(s2, N, "arc", deviations=["arc-no-t1-fallback"])
    assert [(s.hit, len(s.stored), s.failed) for s in steps[4:]] == [(0, 0, True), (0, 0, True)]
    assert not any(s.failed for s in predict(s2, N, "arc"))


def test_threshold_at_lookup_takes_two_n_plus_one_requests():
    """#52022/PR #52227 (0.27-0.28): offers counted in lookup(), which stops at the first
    miss, so A reaches a full hit only at the 9th request (the PR's 2N+1)."""
    steps = predict([("A", 4)] * 9, N, "lru", 2, deviations=["threshold-at-lookup"])
    assert [s.hit for s in steps] == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert [len(s.skipped) for s in steps] == [4, 3, 3, 2, 2, 1, 1, 0, 0]


def test_an_unknown_deviation_is_refused():
    with pytest.raises(ValueError, match="unknown deviation 'nope'"):
        predict(S1, N, "lru", deviations=["nope"])


def test_touch_twice_makes_a_chunk_the_store_evicted_a_ghost_hit():
    """0.27-0.30 touch a request's chunks again after its store: K4 (K1-K3 resident,
    just promoted to T2) stores K4 by evicting K3 from T2, and the second touch finds K3
    in B2, a ghost hit that lowers T1's target from 8 to 7; the next eviction then takes
    N3 from T1 where the oracle of 0.31+ takes K2, and K4 later hits two chunks, not one
    (what vLLM 0.30.0 served, live, on scenarios/pressure.toml's ARC server)."""
    words = "A4 B4 A4 C4 D4 A4 E1 D4 D4 H4 I4 J4 H4 I4 I4 L4 K3 L4 N4 K4 L3 L1 O2 K1 K4"
    seq = [(w[0], int(w[1:])) for w in words.split()]
    plain = predict(seq, 8, "arc")
    twice = predict(seq, 8, "arc", deviations=["touch-twice"])
    assert plain[:20] == twice[:20]
    assert (plain[20].evicted, twice[20].evicted) == (("H1", "N4", "K2"), ("H1", "N4", "N3"))
    assert (plain[24].hit, twice[24].hit) == (1, 2)
