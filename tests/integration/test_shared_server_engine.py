"""Client-side variations of the round trip against one shared server (one launch).

Attach mode (``roundtrip --url``) against a server the harness did not launch, with and
without the model's config, and the eviction check's seeded fault (too little filler):
each test only changes what the client sends, so they share a server, each with its own
prompt seed so that no test can hit what an earlier one stored. The module owns the
server: nothing else runs while it is up (its own module, so no other test interleaves).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, SHARED_SERVER_PIDS, our_vllm_processes, run_cli
from tests.integration.test_roundtrip_engine import failed

pytestmark = pytest.mark.engine
CONFIG = str(ROOT / "scenarios" / "models" / "llama4-roundtrip.json")


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory) -> Iterator[str]:
    """The default round trip's server, launched as a user would, outside the harness."""
    from harness.commands import roundtrip as rt
    from harness.scenario.roundtrip import load_roundtrip

    # Per-request cached tokens in the usage: what `stress --url` judges prefix reuse by.
    plan = rt.plan_roundtrip(
        load_roundtrip(ROOT / "scenarios" / "roundtrip-cpu.toml"),
        extra_args=["--enable-prompt-tokens-details"],
    )
    rt.build_local_model(plan)
    sp = plan.server
    assert sp is not None
    log = tmp_path_factory.mktemp("shared") / "server.log"
    server = sp.server(log)
    with server:
        assert server.proc is not None
        SHARED_SERVER_PIDS.add(server.proc.pid)
        try:
            assert server.wait_ready(300).state == "started", log.read_text()[-3000:]
            yield server.url
        finally:
            SHARED_SERVER_PIDS.discard(server.proc.pid)
    left = our_vllm_processes()
    if left:
        psutil.wait_procs(left, timeout=15)
    assert not our_vllm_processes(), "the shared server left processes behind"


def attach(tmp_path: Path, url: str, *args: str) -> tuple[int, Path, str]:
    return run_cli(tmp_path, "roundtrip", "--url", url, *args, timeout=600)


def test_attach_mode_against_a_running_server(tmp_path, shared_server):
    """--url with --config: the same phases and exact checks as a launched run."""
    code, run, out = attach(tmp_path, shared_server, "--config", CONFIG, "--seed", "100")
    assert code == 0, out
    assert failed(run) == set()
    meta = json.loads((run / "run.json").read_text())
    assert meta["plan"]["variant"] == "attached"
    assert meta["plan"]["expected"]["loaded_bytes"] == 524_288


def test_too_small_filler_is_caught_by_the_eviction_check(tmp_path, shared_server):
    code, run, out = attach(
        tmp_path, shared_server, "--config", CONFIG, "--seed", "200", "--filler-count", "1"
    )
    assert code == 1, out
    # The GPU cache still holds the targets: the replay is all GPU hits, so the connector
    # serves and loads nothing.
    assert failed(run) == {"gpu-cache-evicted", "replay-external-hits", "replay-loaded-bytes"}


def test_attach_without_config_measures_bytes_per_token(tmp_path, shared_server):
    """No config: bytes per token come from the cold phase, the load is bounded."""
    code, run, out = attach(tmp_path, shared_server, "--seed", "300")
    assert code == 0, out
    assert failed(run) == set()
    meta = json.loads((run / "run.json").read_text())
    assert any("attach mode without --config" in n for n in meta["plan"]["notes"])


def test_stress_attached_judges_reuse_and_bytes_without_a_reference(tmp_path, shared_server):
    """``stress --url``: multi-turn traffic at concurrency 4 on a server launched outside
    the harness with vLLM's default connector (prompt blocks only, as the scenario then
    says). No reference is launched, so outputs are not compared; every other check
    that needs no engine log runs, with the byte ledger bounded instead of per kind."""
    scen = tmp_path / "stress.toml"
    scen.write_text(
        'name = "attached"\n'
        f'roundtrip = "{ROOT}/scenarios/roundtrip-cpu.toml"\n'
        'profile = "multi-turn"\n'
        "offload_decode = false\n"
        "[profiles.multi-turn]\nconversations = 4\nturns = 2\nturn_max_tokens = 64\n"
        # Fillers of 1.5 pools per round (the pool holds ~4,900 tokens): later turns find
        # their history evicted from the GPU, so external hits must happen.
        "fillers = 8\n"
    )
    code, run, out = run_cli(
        tmp_path / "results", "stress", "--url", shared_server, "--scenario", str(scen),
        "--seed", "400", timeout=600,
    )  # fmt: skip
    assert code == 0, out
    checks = {r["name"]: r for r in csv_rows(run / "checks.csv")}
    assert set(checks) == {
        "engine-survived",
        "no-request-errored",
        "prefix-reused",
        "loads-match-hits",
        "stores-match-chunks",
        "external-hits-happened",
    }
    assert "4/4 requests with a reusable prefix got it" in checks["prefix-reused"]["observed"]
    meta = json.loads((run / "run.json").read_text())
    assert meta["stress"]["reference_error"].startswith("attached (--url)")
    assert meta["stress"]["requests_sent"] == 24  # 8 turns + 8 fillers per round
    lines = (run / "requests.jsonl").read_text().splitlines()
    turn1 = [json.loads(x) for x in lines if json.loads(x)["id"].endswith("/t1")]
    assert all(r["cached_tokens"] >= 512 for r in turn1)  # 600-token first turns: 2 chunks


def csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as fh:
        return list(csv.DictReader(fh))
