"""``offload-check pressure`` on real servers: a CPU tier of eight slots under LRU, ARC
and store thresholds 2 and 3, every request's hit, store, load and skip exactly as the
oracle predicts (with this release's known deviations, modelled exactly); and each
seeded policy mutant, loaded by vLLM's own manager, failed by the checks it is for, at
the request the replay of vLLM's manager says it first parts (tests/unit/
test_pressure_replay.py). Four launches, then one per mutant: nightly.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.engine, pytest.mark.nightly]


def checks(run):
    return pd.read_csv(run / "pressure-checks.csv", keep_default_na=False)


@pytest.mark.launches(4)
def test_every_server_is_as_the_oracle_says_with_evictions(tmp_path):
    code, run, out = run_cli(tmp_path, "pressure", timeout=1500)
    assert code == 0, out
    df = checks(run)
    assert df["matched"].all() and df["passed"].all(), df[~df["passed"]].to_string()
    reqs = pd.read_csv(run / "pressure.csv", keep_default_na=False)
    assert len(reqs) == 18 + 15 + 13 + 8
    ev = df[df["check"] == "evictions"].set_index("server")["observed"]
    # The LRU and ARC tiers evict (stored chunks beyond the eight slots), and so does the
    # threshold-2 tier once X is stored on its second offer.
    for server in ("lru", "arc", "threshold-2"):
        assert int(ev[server].split()[2].rstrip(":")) > 0, ev[server]
    thr = reqs[reqs["server"].str.startswith("threshold")]
    assert thr["stores_skipped"].sum() == thr["skipped_expected"].sum() > 0
    assert (reqs["ext_hits"] == reqs["hit_expected"]).all()
    assert (reqs["cached_tokens"] == reqs["hit_expected"]).all()
    meta = json.loads((run / "run.json").read_text())
    assert [s["verdict"] for s in meta["servers"]] == ["as expected"] * 4
    for name in ("junit.xml", "report.md", "requests.jsonl", "logs/lru.log"):
        assert (run / name).is_file(), name


# Each mutant, the server of the policy it mutates, the checks it must fail (and no
# others) and the first request each fails at.
MUTANTS = {
    "lru-evicts-newest": ("lru", {"hit-tokens", "loaded-bytes", "stored-bytes"}, 7),
    "lru-never-refreshes": ("lru", {"hit-tokens", "loaded-bytes", "stored-bytes"}, 17),
    "arc-no-t1-fallback": (
        "arc",
        {"hit-tokens", "loaded-bytes", "stored-bytes", "no-store-failure"},
        12,
    ),
}


@pytest.mark.launches(1)
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_policy_mutant_is_caught_by_its_checks(tmp_path, mutant):
    server, must_fail, first = MUTANTS[mutant]
    code, run, out = run_cli(
        tmp_path, "pressure", "--server", server, "--mutant", mutant, timeout=900
    )
    assert code == 1, out
    df = checks(run)
    assert set(df[~df["matched"]]["check"]) == must_fail, df.to_string()
    reqs = pd.read_csv(run / "pressure.csv", keep_default_na=False)
    assert reqs[reqs["failing"] != ""]["index"].min() == first
