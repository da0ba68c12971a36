"""``stress --restarts``'s pure parts: what a restarted server is sent, what is refused,
and how a run of several servers is judged (server by server, and the restarted ones
on what only the disk can have kept)."""

from __future__ import annotations

import pytest

from harness.commands.roundtrip import disk_checks as dc
from harness.commands.stress.driver import Outcome
from harness.commands.stress.evaluate import check_restart_reuse, ledger_of, per_server
from harness.commands.stress.plan import StressPlan, refuse_restarts
from harness.commands.stress.result import ServerRun, StressResult
from harness.commands.stress.workload import PlannedRequest
from harness.errors import BadInput
from harness.results.records import CheckResult
from harness.scenario.stress_profiles import ProfileSettings

CHUNK = 4


def fake_plan(restarts: int = 1) -> StressPlan:
    base = type("B", (), {"tokens_per_chunk": CHUNK, "server": None})()
    base.expected = type("E", (), {"layout": [], "full_bytes_per_token": 10})()
    reqs = [
        PlannedRequest("multi-turn/c0/t0", "multi-turn", 0.0, [1] * 10),
        PlannedRequest("multi-turn/c0/t1", "multi-turn", 1.0, [2] * 3, parent="multi-turn/c0/t0"),
    ]
    return StressPlan(base, "multi-turn", ProfileSettings(), reqs, 2, 0, restarts=restarts)


def test_a_restarted_server_is_sent_round_0_again_under_its_own_ids():
    plan = fake_plan()
    again = plan.restart_round(2)
    assert [r.id for r in again] == ["restart2/multi-turn/c0/t0", "restart2/multi-turn/c0/t1"]
    assert again[1].parent == "restart2/multi-turn/c0/t0"
    assert [r.prompt for r in again] == [r.prompt for r in plan.requests]
    assert plan.requests[1].parent == "multi-turn/c0/t0"  # round 0 itself untouched


def test_restarts_without_a_disk_tier_an_attached_server_or_with_duration_are_refused():
    refuse_restarts(0, disk=False, url="http://x:1", duration=5.0)  # none asked: nothing to refuse
    refuse_restarts(2, disk=True, url=None, duration=None)
    with pytest.raises(BadInput, match="needs a disk tier"):
        refuse_restarts(1, disk=False, url=None, duration=None)
    with pytest.raises(BadInput, match="--url attaches"):
        refuse_restarts(1, disk=True, url="http://x:1", duration=None)
    with pytest.raises(BadInput, match="--duration"):
        refuse_restarts(1, disk=True, url=None, duration=60.0)


def outcome(id_: str, prompt: list[int], cached: int, at: float) -> Outcome:
    return Outcome(
        id_, "multi-turn", prompt, [7, 8], "t", started_s=at, ended_s=at + 1.0, cached_tokens=cached
    )


def two_server_result(cached_after_restart: int) -> StressResult:
    res = StressResult(fake_plan())
    prompt = [1] * 10
    res.outcomes = [
        outcome("multi-turn/c0/t0", prompt, 0, 0.0),  # cold on the first server: not judged
        outcome("restart1/multi-turn/c0/t0", prompt, cached_after_restart, 5.0),
    ]
    res.servers = [
        ServerRun("server", "logs/server.log", ["multi-turn/c0/t0"]),
        ServerRun("restart 1", "logs/server-restart1.log", ["restart1/multi-turn/c0/t0"]),
    ]
    return res


def test_a_restarted_server_must_find_what_the_first_one_computed():
    """The first server's prompt (10 tokens, chunk 4) computed 2 whole chunks the next
    request can reuse (9 tokens at most, one is always computed): 8 cached passes, 4 (a
    whole chunk missing) fails, and the first server's cold request is no donor-less
    failure."""
    ok = check_restart_reuse(two_server_result(8), [])
    assert ok.passed and ok.name == "restart-reused" and ok.observed.startswith("1/1")
    assert check_restart_reuse(two_server_result(5), []).passed  # less than a chunk short
    lost = check_restart_reuse(two_server_result(4), [])
    assert not lost.passed and "restart1/multi-turn/c0/t0 cached 4 of 8" in lost.detail
    assert not check_restart_reuse(two_server_result(0), []).passed


def test_checks_of_several_servers_fold_into_one_per_name():
    res = two_server_result(8)

    def judge(sv: ServerRun) -> list[CheckResult]:
        good = sv.label == "server"
        return [CheckResult("loads-match-hits", good, f"e{sv.label}", f"o{sv.label}", "why", "d")]

    (folded,) = per_server(res, judge)
    assert not folded.passed
    assert folded.observed == "server: oserver; restart 1: orestart 1"
    assert folded.detail == "restart 1: d"  # only the failing server's detail
    res.servers = res.servers[:1]
    (alone,) = per_server(res, judge)
    assert alone.passed and alone.observed == "oserver"  # one server: as it was


def test_a_restarted_servers_store_count_allows_the_chunks_it_promoted_from_disk():
    res = two_server_result(8)
    first, again = res.servers
    first.counters = {"stored_bytes": 80.0, "ext_hits": 0.0}
    again.counters = {"stored_bytes": 0.0, "ext_hits": 8.0}
    # Prompt blocks only (no connector config: vLLM's offload_prompt_only): 10 tokens
    # fill 2 chunks, each stored once by the first server.
    assert (ledger_of(res, first).chunks_low, ledger_of(res, first).chunks_high) == (2, 2)
    # The restarted server's 8 hit tokens are 2 chunks promoted from disk: it may store
    # none of its 2 again, and at most both.
    low_high = (ledger_of(res, again).chunks_low, ledger_of(res, again).chunks_high)
    assert low_high == (0, 2)
    assert ledger_of(res, again).stored == 0.0 and ledger_of(res, again).ext_hits == 8.0


def test_a_restarted_server_must_be_served_by_the_disk_even_with_a_roomy_cpu_tier():
    assert dc.check_served(False, 4, 4 * 65_536, 65_536, restarted=True).passed
    failed = dc.check_served(False, 0, 0, 65_536, restarted=True)
    assert not failed.passed and "restarted server's CPU tier started empty" in failed.expected
    assert dc.check_served(False, 0, 0, 65_536).passed  # the first server, roomy


def test_prefix_reuse_is_a_servers_own_and_reuse_across_a_restart_is_the_disks():
    """``prefix-reused`` takes donors from the same server only (the CPU tier), so a
    restarted request that missed is ``restart-reused``'s failure alone; and a donor on
    the restarted server itself does not count for ``restart-reused``."""
    from harness.commands.stress.checks import check_prefix_reuse
    from harness.commands.stress.evaluate import server_index

    res = two_server_result(0)
    server = server_index(res)
    same = check_prefix_reuse(
        res.outcomes, CHUNK, may_donate=lambda d, o: server.get(d.id) == server.get(o.id)
    )
    assert "0/0" in same.observed  # nothing judged: no donor on the same server
    prompt = [1] * 10
    res.outcomes.insert(1, outcome("restart1/warm", prompt, 0, 3.0))
    res.servers[1].request_ids.insert(0, "restart1/warm")
    res.outcomes[0] = outcome("multi-turn/c0/t0", [9] * 10, 0, 0.0)  # nothing to carry over
    assert "0/0" in check_restart_reuse(res, []).observed  # its only donor is its own server
