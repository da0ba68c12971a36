"""``offload-check mutate`` against real vLLM servers: two mutants of vLLM 0.32.0's CPU
offloading manager through the round trip, each in its own copy of the environment.

One is a mutant the round trip must kill (``lookup`` inverting its ``chunk is None``
test: it then reads a chunk that is not there, and the engine dies), the other one it
cannot: on a tier that
never fills, ``num_chunks_to_evict`` is never positive, so ``> 1`` for ``> 0`` changes
nothing; its line runs on every store, so it is a survivor the coverage calls reached.
Weekly: three launches (the baseline and one per mutant).

Then two mutants only a disk tier whose reads fail can tell apart, through the round
trip and ``roundtrip-read-eio`` (the default suite's restart round trip with every disk
read failing, judged by the checks its scenario expects to fail): ``get_stats`` adding
the free list to the usage it should subtract it from, seen by ``tier-idle`` only where
a failed promotion's chunks stay freed, and the failed store's loop emptied, on a line
only that command's unmutated run executed, so it runs that command alone.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.commands.mutate.sandbox import file_sha256
from tests.conftest import ROOT, run_cli

pytestmark = [pytest.mark.engine, pytest.mark.nightly, pytest.mark.weekly]

TARGET = "vllm.v1.kv_offload.cpu.manager"
KILLED = "55649a3f55f8"  # manager.py lookup: `if chunk is None:` -> `if chunk is not None:`
SURVIVOR = "08d5da6d2846"  # prepare_store: `if num_chunks_to_evict > 0:` -> `> 1:`
MANAGER = (
    ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "vllm" / "v1" / "kv_offload"
    / "cpu" / "manager.py"
)  # fmt: skip


@pytest.mark.launches(3)
def test_a_mutant_the_round_trip_must_catch_is_killed_and_a_blind_one_survives(tmp_path):
    before = file_sha256(MANAGER)
    code, run, out = run_cli(
        tmp_path, "mutate", "--target", TARGET, "--command", "roundtrip",
        "--mutant", KILLED, "--mutant", SURVIVOR, timeout=2400,
    )  # fmt: skip
    # A finished session with a survivor exits 1, as a run whose checks did not all hold
    # (cli/mutate.py survivors_mismatch): the survivor is an edit no command noticed.
    assert code == 1, out
    assert "score: 1/2 detected" in out
    assert file_sha256(MANAGER) == before  # the build itself never changed
    df = pd.read_csv(run / "mutants.csv", keep_default_na=False).set_index("id")
    killed, survivor = df.loc[KILLED], df.loc[SURVIVOR]
    assert (killed.verdict, killed.command) == ("killed", "roundtrip"), killed.detail
    # Measured on 0.32.0: the lookup then reads a missing chunk's fields and the engine
    # dies on the first cold request; the round trip names it.
    assert killed.failed == "engine-survived" and "AttributeError" in killed.detail
    assert survivor.verdict == "survived" and survivor.reached == "roundtrip"
    meta = json.loads((run / "run.json").read_text())
    assert meta["mutate"]["score"] == 0.5
    report = (run / "report.md").read_text()
    assert report.index(SURVIVOR) < report.index("## Every mutant")  # survivors first
    assert not list((run / "mutants").glob("*/env"))  # every copy removed
    lines = json.loads((run / "baseline" / "coverage.json").read_text())["roundtrip"]
    assert int(survivor.line) in lines


FREED_COUNTED = "a05abdaa3fee"  # get_stats: `- len(self._free_list)` -> `+ len(...)`
FAILED_STORE_KEPT = "58a1164d8c31"  # complete_store's failure loop: `for key in []:`


@pytest.mark.launches(8)
def test_a_failed_promotions_freed_chunks_are_counted_and_a_mutant_runs_what_reached_it(
    tmp_path,
):
    """Measured on 0.32.0: the chunks a failed promotion frees stay on the free list of
    the restarted server's roomy tier, so the usage gauge once idle reads them twice;
    the clean round trip reaches ``get_stats`` too but never frees a chunk, so it passes.
    The failure loop's line runs only in the read-EIO round trip: the clean one is not
    run on that mutant at all (``commands_reaching``); with the loop emptied the failed
    chunks stay write-pending, the request waits on them and the stall watch stops the
    engine after 120 s (``engine-survived``). Launches: the baselines 1 + 2 (the
    restart), the first mutant 1 + 2, the second 2."""
    before = file_sha256(MANAGER)
    code, run, out = run_cli(
        tmp_path, "mutate", "--target", TARGET, "--command", "roundtrip",
        "--command", "roundtrip-read-eio",
        "--mutant", FREED_COUNTED, "--mutant", FAILED_STORE_KEPT, timeout=3000,
    )  # fmt: skip
    assert code == 0, out  # both killed: every mutant noticed
    assert "score: 2/2 detected" in out
    assert file_sha256(MANAGER) == before
    df = pd.read_csv(run / "mutants.csv", keep_default_na=False).set_index("id")
    freed, kept = df.loc[FREED_COUNTED], df.loc[FAILED_STORE_KEPT]
    assert (freed.verdict, freed.command) == ("killed", "roundtrip-read-eio"), freed.detail
    assert freed.failed == "tier-idle", freed.detail  # the only difference from the fault's
    assert freed.reached == "roundtrip,roundtrip-read-eio"
    assert (kept.verdict, kept.command) == ("killed", "roundtrip-read-eio"), kept.detail
    assert kept.reached == "roundtrip-read-eio"
    # The clean round trip never ran on the second mutant: no run directory of it.
    assert not (run / "mutants" / FAILED_STORE_KEPT / "roundtrip").exists()
    assert (run / "mutants" / FREED_COUNTED / "roundtrip").is_dir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["plan"]["expect_failing"]["roundtrip-read-eio"] == [
        "disk-errors", "disk-read-bytes", "disk-written-bytes", "replay-external-hits",
        "replay-loaded-bytes",
    ]  # fmt: skip
