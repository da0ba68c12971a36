"""Stress verdicts on hand-made observations: each check fails on the fault it is for,
and names the first request that shows it."""

from __future__ import annotations

from harness.reference import TokenDivergence, TokenVerdict
from harness.stress_checks import check_happened, check_log, check_no_errors, check_outputs
from harness.stress_driver import Outcome


def ok(n: int = 4, near: int = 0) -> TokenVerdict:
    return TokenVerdict(None, near, n)


def test_outputs_name_the_first_divergence_with_its_turn():
    outs = [Outcome("a", "x", [1]), Outcome("multi-turn/c0/t2", "multi-turn", [1], turn=2)]
    bad = TokenVerdict(TokenDivergence(3, 11, 12, 2.5, 0.01), 0, 3)
    got = check_outputs(outs, {"a": ok(near=1), "multi-turn/c0/t2": bad})
    assert (
        not got.passed
        and got.observed == "1/2 requests match (7 tokens, 1 near-ties within the floor)"
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
