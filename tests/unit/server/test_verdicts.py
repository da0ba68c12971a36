"""Crash signatures and expectation rules, on a real vLLM 0.27.1 crash log."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.scenario.crash_repro import Expectation
from harness.scenario.schema import KnownCrash
from harness.server.crash_signatures import (
    RowContext,
    crash_signature,
    describe_exit,
    judge,
    match_expectation,
    parse_tracebacks,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
KNOWN = [
    KnownCrash(
        issue=51150, exception="AssertionError", functions=["get_sliding_window_size_in_chunks"]
    )
]


def crash_log() -> list[str]:
    return (FIXTURES / "stock-0.27.1-51150-crash.log").read_text().splitlines()


def test_root_cause_is_the_engine_core_assert_not_the_api_server_wrapper():
    sig = crash_signature(crash_log(), 1, KNOWN)
    assert sig.exception == "AssertionError"
    assert sig.frame == (
        "vllm/distributed/kv_transfer/kv_connector/v1/offloading/"
        "scheduler.py:get_sliding_window_size_in_chunks"
    )
    assert sig.known == 51150
    assert sig.process.startswith("EngineCore")
    assert sig.message == "assert isinstance(kv_cache_spec, FullAttentionSpec)"


def test_all_tracebacks_are_found_in_order():
    tbs = parse_tracebacks(crash_log())
    kinds = [(t.process.split()[0], t.exception) for t in tbs]
    assert kinds[0] == ("EngineCore", "AssertionError")
    assert ("APIServer", "RuntimeError") in kinds


def test_a_different_exception_is_not_called_51150():
    lines = [ln.replace("AssertionError", "ValueError: bad spec") for ln in crash_log()]
    sig = crash_signature(lines, 1, KNOWN)
    assert sig.exception == "ValueError"
    assert sig.known is None


def test_same_exception_elsewhere_is_not_called_51150():
    lines = [
        ln.replace("get_sliding_window_size_in_chunks", "some_other_function") for ln in crash_log()
    ]
    assert crash_signature(lines, 1, KNOWN).known is None


def test_no_traceback_reports_the_exit():
    sig = crash_signature(["INFO starting", "ERROR out of memory"], -9, KNOWN)
    assert "SIGKILL" in sig.exception
    assert sig.frame == ""


def test_chained_exception_keeps_the_first_cause():
    log = """Traceback (most recent call last):
  File "/x/vllm/a.py", line 1, in inner
    assert False
AssertionError

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/vllm/b.py", line 2, in outer
    raise RuntimeError("wrapped")
RuntimeError: wrapped""".splitlines()
    sig = crash_signature(
        log, 1, [KnownCrash(issue=1, exception="AssertionError", functions=["inner"])]
    )
    assert sig.exception == "AssertionError" and sig.frame == "vllm/a.py:inner"
    assert sig.known == 1


def test_describe_exit():
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-6) == "killed by SIGABRT"


RULES = [
    Expectation(
        variant="stock",
        patch="none",
        connector=True,
        chunked_local=True,
        outcome="crashed",
        known=51150,
    ),
    Expectation(
        vllm="<0.28",
        patch="none",
        connector=True,
        chunked_local=True,
        outcome="crashed",
        known=51150,
    ),
    Expectation(outcome="started"),
]


@pytest.mark.parametrize(
    ("ctx", "outcome"),
    [
        (RowContext("stock", "0.27.1", "none", True, True), "crashed"),
        (RowContext("stock", "0.27.1", "chunked-local-fix", True, True), "started"),
        (RowContext("stock", "0.27.1", "chunked-local-floor", True, True), "started"),
        (RowContext("stock", "0.27.1", "none", False, True), "started"),  # control
        (RowContext("stock", "0.27.1", "none", True, False), "started"),  # no chunked layers
        (RowContext("my-old", "0.26.0", "none", True, True), "crashed"),  # by version
        (RowContext("current", "0.32.0", "none", True, True), "started"),
    ],
)
def test_expectations_follow_the_row_not_the_name(ctx, outcome):
    found = match_expectation(ctx, RULES)
    assert found is not None and found.rule.outcome == outcome


def test_judge():
    crash = Expectation(outcome="crashed", known=51150)
    assert judge("crashed", 51150, None, crash) == (True, "")
    ok, why = judge("crashed", None, None, crash)
    assert not ok and "#51150" in why
    ok, why = judge("started", None, True, crash)
    assert not ok and "expected crashed" in why
    ok, why = judge("started", None, False, Expectation(outcome="started"))
    assert not ok and "did not answer" in why
    assert judge("started", None, True, None)[0] is False
