"""Stress verdicts on hand-made observations: each check fails on the fault it is for,
and names the first request that shows it."""

from __future__ import annotations

from harness.commands.stress.checks import check_happened, check_log, check_no_errors, check_outputs
from harness.commands.stress.driver import Outcome
from harness.commands.stress.reference import TokenDivergence, TokenVerdict


def ok(n: int = 4, near: int = 0, widest: float = 0.0) -> TokenVerdict:
    return TokenVerdict(None, near, n, widest)


def test_outputs_name_the_first_divergence_with_its_turn():
    outs = [Outcome("a", "x", [1]), Outcome("multi-turn/c0/t2", "multi-turn", [1], turn=2)]
    bad = TokenVerdict(TokenDivergence(3, 11, 12, 2.5, 0.01), 0, 3)
    got = check_outputs(outs, {"a": ok(near=1, widest=0.0039), "multi-turn/c0/t2": bad})
    assert not got.passed and got.observed == (
        "1/2 requests match (7 tokens, 1 near-ties within the floor, the widest 0.0039)"
    )
    assert got.detail.startswith("first: multi-turn/c0/t2, turn 2, token 3: got 11")
    assert check_outputs(outs, {"a": ok(), "multi-turn/c0/t2": ok()}).passed
    # nothing compared proves nothing
    assert not check_outputs(outs, {}).passed


def test_errors_count_the_root_not_the_chat_it_stopped():
    outs = [
        Outcome("t0", "multi-turn", [], error="RuntimeError: HTTP 500: dead"),
        Outcome("t1", "multi-turn", [], error="not sent: its parent t0 did not finish"),
        Outcome("ab", "abort", [1], aborted=True),
    ]
    got = check_no_errors(outs)
    assert not got.passed and got.observed == "1 failed, 1 not sent after them"
    assert got.detail == "first: t0: RuntimeError: HTTP 500: dead"
    assert check_no_errors(outs[2:]).passed


def test_the_log_check_finds_each_known_bad_line():
    lines = [
        "INFO all fine",
        "WARNING Cannot store blocks: out of space",
        "ERROR AssertionError: Block 0x1 not found in cache",
    ]
    got = check_log(lines)
    assert not got.passed and got.observed == "cannot-store, assertion, not-in-cache"
    assert check_log(["INFO Avg prompt throughput: 5 tokens/s"]).passed


def test_happened():
    assert not check_happened("preempted", "preemptions", 0, "w").passed
    assert check_happened("preempted", "preemptions", 3, "w").observed == "preemptions = 3"


# --- the byte ledger and prefix reuse --------------------------------------------------------
from harness.commands.stress.checks import (  # noqa: E402
    Ledger,
    check_ledger,
    check_prefix_reuse,
    parse_transfers,
    per_kind,
    stored_chunks,
)

TRACE = [
    "(EngineCore pid=1) offload-check transfer: job=1 store bytes=3072 g0:2@0=1024 "
    "g1:2@0=2048 block_indices=[0, 1]",
    "offload-check transfer: job=2 load bytes=1536 g0:1@0=512 g1:1@0=1024 block_indices=[0]",
    "unrelated line",
]


def test_transfers_are_summed_per_operation_and_group_then_per_kind():
    t = parse_transfers(TRACE)
    assert t == {("store", 0): 1024, ("store", 1): 2048, ("load", 0): 512, ("load", 1): 1024}
    kinds = per_kind(t, ["chunked-local", "full"])
    assert kinds == {
        "chunked-local": {"stored": 1024, "loaded": 512},
        "full": {"stored": 2048, "loaded": 1024},
    }


def test_a_shared_prefix_fills_its_chunks_once():
    a = list(range(10))
    b = [*range(8), 99, 98, 97, 96]
    assert stored_chunks([a], 4) == 2
    assert stored_chunks([a, b], 4) == 3  # [0..3], [4..7] shared; b's third chunk is its own
    assert stored_chunks([a, a], 4) == 2


def ledger(**over):
    base = dict(
        stored=2 * 4 * 10,
        loaded=3 * 10,
        ext_hits=3,
        kinds={"full": {"stored": 2 * 4 * 10, "loaded": 3 * 10}},
        full_bpt=10,
        kind_bpt={"full": 10},
        chunks_low=2,
        chunks_high=2,
        chunk=4,
    )
    base.update(over)
    return Ledger(**base)


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_clean_ledger_passes_every_byte_check():
    assert all(c.passed for c in check_ledger(ledger()))


def test_a_hit_without_its_load_fails_loads_match_hits():
    got = by_name(check_ledger(ledger(ext_hits=4)))
    assert not got["loads-match-hits"].passed
    assert got["stores-match-chunks"].passed


def test_a_lost_store_fails_stores_match_chunks():
    kinds = {"full": {"stored": 40, "loaded": 30}}
    got = by_name(check_ledger(ledger(stored=40, kinds=kinds)))
    assert not got["stores-match-chunks"].passed


def test_counters_that_disagree_with_the_trace_fail():
    got = by_name(check_ledger(ledger(loaded=31)))
    assert not got["ledger-matches-counters"].passed


def test_windowed_layers_may_load_less_but_never_more_than_hits():
    kinds = {
        "full": {"stored": 80, "loaded": 30},
        "chunked-local": {"stored": 80, "loaded": 12},
    }
    ok = ledger(kinds=kinds, stored=160, loaded=42, kind_bpt={"full": 10, "chunked-local": 10})
    assert all(c.passed for c in check_ledger(ok))
    kinds["chunked-local"]["loaded"] = 31
    bad = ledger(kinds=kinds, stored=160, loaded=61, kind_bpt={"full": 10, "chunked-local": 10})
    assert not by_name(check_ledger(bad))["loads-match-hits"].passed


def test_without_a_trace_the_load_is_bounded():
    got = by_name(check_ledger(ledger(kinds={}, loaded=35, kind_bpt={"full": 10, "x": 5})))
    assert "ledger-matches-counters" not in got
    assert got["loads-match-hits"].passed
    got = by_name(check_ledger(ledger(kinds={}, loaded=29)))
    assert not got["loads-match-hits"].passed


def done(id_, prompt, output, start, end, cached=None):
    return Outcome(id_, "p", prompt, output, started_s=start, ended_s=end, cached_tokens=cached)


def test_a_turn_must_get_the_chunks_its_finished_parent_computed():
    parent = done("t0", list(range(10)), [50, 51, 52], 0, 1, cached=0)
    child = done("t1", [*range(10), 50, 51, 60, 61], [7], 2, 3, cached=12)
    assert check_prefix_reuse([parent, child], 4).passed  # 12 of (10 + 2) computed, aligned
    child.cached_tokens = 10  # a GPU hit ending mid-chunk: the rest is less than a chunk
    assert check_prefix_reuse([parent, child], 4).passed
    child.cached_tokens = 8  # a whole chunk lost
    got = check_prefix_reuse([parent, child], 4)
    assert not got.passed and "t1 cached 8 of 12" in got.detail


def test_reuse_is_not_asked_of_a_request_that_started_before_its_donor_finished():
    early = done("a", list(range(10)), [1, 2], 0, 5, cached=0)
    late = done("b", list(range(10)), [1, 2], 1, 6, cached=0)
    got = check_prefix_reuse([early, late], 4)
    assert not got.passed and "0/0" in got.observed  # nothing judged is not a pass


def test_prompt_logprobs_requests_are_not_judged_for_reuse():
    a = done("a", list(range(10)), [1, 2], 0, 1, cached=0)
    b = done("b", list(range(10)), [1, 2], 2, 3, cached=0)
    c = done("c", list(range(10)), [1, 2], 2, 3, cached=9)
    assert check_prefix_reuse([a, b, c], 4, ["b"]).passed


def test_a_resumed_request_may_reload_without_a_counted_hit_but_no_more():
    """vLLM counts a preempted request's hits apart (not exported), so its reload shows
    as loaded bytes beyond hits, bounded by preemptions x the longest request."""
    extra = {"full": {"stored": 80, "loaded": 30 + 50}}
    got = by_name(check_ledger(ledger(kinds=extra, loaded=80)))
    assert not got["loads-match-hits"].passed
    ok = ledger(kinds=extra, loaded=80, preemptions=1, longest=5)
    assert by_name(check_ledger(ok))["loads-match-hits"].passed
    short = {"full": {"stored": 80, "loaded": 20}}
    bad = ledger(kinds=short, loaded=20, preemptions=1, longest=5)
    assert not by_name(check_ledger(bad))["loads-match-hits"].passed


def test_two_ranks_records_on_one_line_are_both_counted():
    merged = (
        "offload-check transfer: job=3 load bytes=512 g0:1@0=512 "
        "offload-check transfer: job=3 load bytes=512 g0:1@0=512 block_indices=[0]"
        "block_indices=[0]"
    )
    assert parse_transfers([merged]) == {("load", 0): 1024}
