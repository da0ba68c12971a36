"""Whom a failed round-trip request blames (``roundtrip.run.Endpoint.failure``): the
engine under test (a verdict, exit 1) or the run's environment (exit 3)."""

from __future__ import annotations

from types import SimpleNamespace

from harness.commands.roundtrip.run import Endpoint, EngineFailure
from harness.errors import RuntimeFailure
from harness.server.launcher import HttpRefusal


def endpoint(tmp_path, answered: int) -> Endpoint:
    log = tmp_path / "server.log"
    log.write_text("INFO nothing raised\n")
    server = SimpleNamespace(alive=lambda grace_s=0.0: True, log_path=log, proc=None)
    ep = Endpoint("http://127.0.0.1:1", server)  # type: ignore[arg-type]
    ep.answered = answered
    return ep


NAN = HttpRefusal(
    "http://127.0.0.1:1/v1/completions", 400, '{"error":{"message":"Out of range float values'
)


def test_a_refusal_of_a_request_like_ones_it_answered_is_the_engines(tmp_path):
    """A flipped exponent bit in a loaded chunk made the logprobs inf: vLLM refused to
    serialise them (HTTP 400) on the replay after answering the same prompts before."""
    err = endpoint(tmp_path, answered=4).failure("replay", NAN)
    assert isinstance(err, EngineFailure)
    assert "refused a request it had answered before: HTTP 400" in err.signature


def test_a_refusal_before_any_answer_is_the_harnesss_to_explain(tmp_path):
    err = endpoint(tmp_path, answered=0).failure("cold", NAN)
    assert isinstance(err, RuntimeFailure) and not isinstance(err, EngineFailure)


def test_a_stall_the_watch_saw_is_the_verdict(tmp_path):
    ep = endpoint(tmp_path, answered=0)
    ep.stall = "the engine stalled: 1 request(s) outstanding ..."
    err = ep.failure("replay", RuntimeFailure("no answer"))
    assert isinstance(err, EngineFailure) and err.signature.startswith("the engine stalled")


def test_an_engine_that_raised_is_blamed_by_its_crash_not_by_the_refusal(tmp_path):
    """The segv-in-worker fault: the API server answers HTTP 500 after its engine died;
    the engine's own crash is the verdict's line (the faults round matches on it)."""
    ep = endpoint(tmp_path, answered=4)
    ep.server.log_path.write_text(  # type: ignore[union-attr]
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/v1/engine/core.py", line 10, in run_engine_core\n'
        "    raise RuntimeError('boom')\n"
        "RuntimeError: boom\n"
    )
    busy = HttpRefusal("http://127.0.0.1:1/v1/completions", 500, "EngineCore encountered an issue")
    err = ep.failure("cold", busy)
    assert isinstance(err, EngineFailure) and "refused" not in err.signature
