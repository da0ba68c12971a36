"""``offload-check stress`` against real servers: the clean mixed profile passes every
check, and each seeded fault fails it by the check that is for that fault.

Each run is two launches (the server under test, then the connector-off reference), so
these are nightly; the PR tier runs stress attached to the shared server
(``test_shared_server_engine.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.engine, pytest.mark.nightly]

# A short multi-turn run: 4 first turns, then their second turns, fillers between; the
# second turns load their history from the CPU tier.
SHORT = ("--profile", "multi-turn", "--requests", "8")


def stress(results: Path, *args: str) -> tuple[int, Path, str]:
    return run_cli(results, "stress", *args, timeout=1500)


def failed(run: Path) -> set[str]:
    df = pd.read_csv(run / "checks.csv")
    return {r.name for r in df.itertuples() if not r.passed}


@pytest.mark.launches(2)
def test_the_mixed_profile_passes_with_preemptions_and_external_hits(tmp_path):
    code, run, out = stress(tmp_path)
    assert code == 0, out
    assert failed(run) == set()
    meta = json.loads((run / "run.json").read_text())
    figures = meta["stress"]
    assert figures["requests_sent"] == 47 and figures["requests_aborted"] == 4
    assert figures["counters"]["preemptions"] > 0
    assert figures["counters"]["ext_hits"] > 0
    assert figures["floor_resolution"] > 0 and figures["tolerance"] < 0.05
    for name in ("requests.jsonl", "reference.jsonl", "divergence.md", "junit.xml"):
        assert (run / name).is_file(), name
    assert (run / "timeline.png").stat().st_size > 10_000


# Each seeded fault and the checks it must fail (and no others: a fault caught by the
# wrong check is a check that does not mean what it says).
CAUGHT = {
    ("--fault", "corrupt-load"): {"outputs-match-reference"},
    ("--patch", "hits-minus-chunk"): {"prefix-reused", "loads-match-hits"},
}


@pytest.mark.launches(2)
@pytest.mark.parametrize("fault", list(CAUGHT), ids=lambda f: f[1])
def test_a_seeded_fault_is_caught_by_its_check(tmp_path, fault):
    code, run, out = stress(tmp_path, *SHORT, *fault)
    assert code == 1, out
    assert failed(run) == CAUGHT[fault]
