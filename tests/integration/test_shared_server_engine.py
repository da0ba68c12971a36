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
    from harness import roundtrip as rt
    from harness.scenario import load_roundtrip

    plan = rt.plan_roundtrip(load_roundtrip(ROOT / "scenarios" / "roundtrip-cpu.toml"))
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
