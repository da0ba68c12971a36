"""Recorded real runs, re-evaluated offline: each seeded fault fails exactly its checks.

The engine tests show that a fault makes vLLM misbehave; these show, in milliseconds and
on the numbers a real engine produced, that the evaluation turns each misbehaviour into
exactly the verdict written below: no check missing (a fault slipping through) and none
extra (a check firing for the wrong reason). The fixtures come from
``scripts/record-roundtrip-fixtures.py`` (see ``tests/fixtures/replay/README.md``); the
replay goes through the harness's own planning, parsing and checking code
(``harness.tools.replay``), so a change to any of them is judged against real runs.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from harness.commands.roundtrip import RoundtripResult
from harness.commands.roundtrip import checks as ck
from harness.server import kv_layout
from harness.tools.replay import failing, replay

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "replay"

# The verdict each recorded run must get: the failing (non-informational) checks, exactly.
EXPECTED: dict[str, set[str]] = {
    "clean": set(),
    "window-edge-clean": set(),
    # Report success and the full byte count but copy the wrong (or no) bytes: only the
    # output comparison can see it.
    "fault-corrupt-load": {"replay-output-identical"},
    "fault-drop-store": {"replay-output-identical"},
    "fault-no-load": {"replay-output-identical"},
    # Only the first KV-cache group stored (and honestly counted); the load still moves
    # and counts every group's blocks, so the replay's byte count is right while half its
    # bytes are stale.
    "fault-partial-store": {"cold-stored-bytes", "replay-output-identical"},
    "fault-partial-load": {"replay-loaded-bytes", "replay-output-identical"},
    # One chunk fewer admitted: the engine recomputes it, so the output stays right and
    # only the hit and byte checks see it.
    "patch-hits-minus-chunk": {"replay-external-hits", "replay-loaded-bytes"},
    # Too little filler: the replay is served from the GPU prefix cache, so the connector
    # neither hits nor loads.
    "filler-count-1": {"gpu-cache-evicted", "replay-external-hits", "replay-loaded-bytes"},
}


def _cases() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "manifest.json").is_file())


CASES = _cases()


@cache
def _replayed(case: str) -> RoundtripResult:
    """One replay per case for the read-only tests (planning probes the interpreter)."""
    return replay(FIXTURES / case)


def _observed(case: str) -> list[dict[str, str]]:
    with (FIXTURES / case / "checks.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _manifest(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / case / "manifest.json").read_text())


def test_every_recorded_case_has_an_expected_verdict() -> None:
    assert sorted(EXPECTED) == CASES


@pytest.mark.parametrize("case", CASES)
def test_replayed_verdict_is_the_expected_one(case: str) -> None:
    assert failing(replay(FIXTURES / case)) == EXPECTED[case]


@pytest.mark.parametrize("case", CASES)
def test_replayed_verdict_is_the_runs_own(case: str) -> None:
    """Same failing set as the engine run's checks.csv and manifest, row for row."""
    observed = {
        r["name"] for r in _observed(case) if r["passed"] != "True" and r["informational"] != "True"
    }
    assert failing(_replayed(case)) == observed == set(_manifest(case)["failing_checks"])


@pytest.mark.parametrize("case", CASES)
def test_replayed_checks_read_exactly_like_the_runs(case: str) -> None:
    """Every check's figures and diagnosis, not only its verdict, as the run wrote them:
    the replay rebuilt the very numbers the live run judged."""
    result = _replayed(case)
    got = [
        {k: str(v) for k, v in c.record().items()} for c in [*result.checks, *result.info_checks]
    ]
    assert got == _observed(case)


@pytest.mark.parametrize("case", CASES)
def test_replayed_phase_deltas_are_the_runs(case: str) -> None:
    with (FIXTURES / case / "phases.csv").open(newline="") as fh:
        rows = {r["phase"]: r for r in csv.DictReader(fh)}
    for phase in _replayed(case).phases:
        row = rows[phase.phase]
        assert phase.requests == int(row["requests"]), phase.phase
        for key, value in phase.record().items():
            if key.startswith(("d_", "cum_")):
                # A counter newer than the recording (preemptions) is not in its files.
                assert value == float(row.get(key, 0.0)), (phase.phase, key)
    assert [p.phase for p in _replayed(case).phases] == list(rows)


@pytest.mark.parametrize("case", CASES)
def test_replayed_plan_is_the_runs(case: str) -> None:
    """The plan remade from the CLI args predicts what the run's plan predicted."""
    recorded = json.loads((FIXTURES / case / "run.json").read_text())["plan"]
    plan = json.loads(json.dumps(_replayed(case).describe_plan()))
    for key in (
        "variant",
        "patch",
        "fault",
        "tensor_parallel",
        "kv_block_size",
        "offload_tokens_per_chunk",
        "targets",
        "filler_count",
        "filler_tokens",
        "pool_tokens",
        "expected",
        "notes",
    ):
        assert plan[key] == recorded[key], key


@pytest.mark.parametrize("case", CASES)
def test_report_line_is_the_groups_the_run_recorded(case: str) -> None:
    lines = (FIXTURES / case / "server.log").read_text().splitlines()
    groups = kv_layout.parse_report(lines)
    assert (
        groups
        and groups == json.loads((FIXTURES / case / "run.json").read_text())["engine_kv_groups"]
    )


def _always_pass(name: str) -> Callable[..., ck.CheckResult]:
    """A check whose logic was deleted: it still reports, and always passes."""

    def neutral(*args: Any, **kwargs: Any) -> ck.CheckResult:
        # check_outputs is told its name by the caller (its second argument).
        check = name or kwargs.get("name") or args[1]
        return ck.CheckResult(check, True, "deleted", "deleted", "deleted")

    return neutral


# Check function -> the check it produces ("" when the caller names it).
CHECK_FUNCTIONS = {
    "check_stored": "cold-stored-bytes",
    "check_evicted": "gpu-cache-evicted",
    "check_loaded": "replay-loaded-bytes",
    "check_ext_hits": "replay-external-hits",
    "check_outputs": "",
}


def test_deleting_the_load_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_loaded reduced to "pass": partial-load no longer gets its verdict, so the
    verdict test above fails for it."""
    case = "fault-partial-load"
    assert failing(replay(FIXTURES / case)) == EXPECTED[case]
    monkeypatch.setattr(ck, "check_loaded", _always_pass("replay-loaded-bytes"))
    assert failing(replay(FIXTURES / case)) == {"replay-output-identical"}
    with pytest.raises(AssertionError):
        test_replayed_verdict_is_the_expected_one(case)


@pytest.mark.parametrize("function", sorted(CHECK_FUNCTIONS))
def test_deleting_any_failing_checks_logic_is_caught(
    monkeypatch: pytest.MonkeyPatch, function: str
) -> None:
    """Each check that some recorded fault fails is load-bearing: neutralized, at least
    one recorded case stops getting its expected verdict."""
    monkeypatch.setattr(ck, function, _always_pass(CHECK_FUNCTIONS[function]))
    changed = [c for c in CASES if failing(replay(FIXTURES / c)) != EXPECTED[c]]
    assert changed, f"no recorded case notices {function} always passing"


def test_which_checks_the_recordings_prove() -> None:
    """The recorded faults fail these checks and no others: kv-layout and
    filler-loaded-nothing have no seeded fault, so only their own unit tests guard them."""
    recorded = set().union(*(_manifest(c)["failing_checks"] for c in CASES))
    assert recorded == {
        "cold-stored-bytes",
        "gpu-cache-evicted",
        "replay-loaded-bytes",
        "replay-external-hits",
        "replay-output-identical",
    }
