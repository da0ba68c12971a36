"""The content ledger: the host backend's digests of every stored and loaded block, and
the judge that holds each load to the store under its key (``content-matches``).

The worker is the real one over real torch tensors; the manager's half (which key each
slot was prepared for) is written as the manager's wrapper writes it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from harness.engine import content_ledger
from harness.engine.host_offload import HostOffloadingWorker
from harness.names import ENV_LEDGER
from harness.oracle.content import judge, judge_directory, read_events
from tests.unit.engine.test_host_offload import (
    LAYOUTS,
    NUM_BLOCKS,
    NUM_CHUNKS,
    block_ids_for,
    chunks_for,
    make_caches,
    zero,
)

MIXED = next(lay for lay in LAYOUTS if lay.name == "mixed-pages")


def test_a_digest_tells_blocks_apart_by_every_byte():
    gen = torch.Generator().manual_seed(3)
    rows = torch.randint(-128, 127, (4, 200), generator=gen, dtype=torch.int8)
    first = content_ledger.digests(rows)
    assert first == content_ledger.digests(rows.clone())
    assert len(set(first)) == 4
    for width in (200, 203):  # whole int64 words, and not
        block = torch.zeros((2, width), dtype=torch.int8)
        block[1, width - 1] = 1
        a, b = content_ledger.digests(block)
        assert a != b
    # Any dtype, any shape: a block is its bytes.
    bf = torch.ones((3, 2, 8), dtype=torch.bfloat16)
    assert len(set(content_ledger.digests(bf))) == 1


def _round_trip(tmp_path, monkeypatch, fault: str) -> object:
    """One store and one load of a mixed-page layout (three groups, a two-layer group),
    with the ledger on: the keys as the manager's wrapper writes them, then the worker's."""
    monkeypatch.setenv(ENV_LEDGER, str(tmp_path))
    caches, matrices = make_caches(MIXED, seed=5)
    worker = HostOffloadingWorker(
        caches, blocks_per_chunk=2, num_cpu_chunks=NUM_CHUNKS, fault=fault
    )
    n = len(MIXED.groups)
    sizes, starts = [3] * n, [1] * n
    chunk_ids = chunks_for(sizes, starts, 2, first=1)
    scheduler = content_ledger.Ledger(tmp_path, "scheduler")
    keys = [f"{slot:04x}" for slot in chunk_ids]
    scheduler.write({"op": "assign", "for": "store", "keys": keys, "slots": chunk_ids})
    worker.submit_store(
        1,
        GPULoadStoreSpec(block_ids_for(sizes, 0), group_sizes=sizes, block_indices=starts),
        CPULoadStoreSpec(chunk_ids),
    )
    zero(matrices)
    scheduler.write({"op": "assign", "for": "load", "keys": keys, "slots": chunk_ids})
    worker.submit_load(
        2,
        CPULoadStoreSpec(chunk_ids),
        GPULoadStoreSpec(
            block_ids_for(sizes, NUM_BLOCKS - sum(sizes)), group_sizes=sizes, block_indices=starts
        ),
    )
    scheduler.close()
    return judge_directory(tmp_path)


def test_a_clean_round_trip_matches_block_for_block(tmp_path, monkeypatch):
    report = _round_trip(tmp_path, monkeypatch, "none")
    assert report.files == 2  # the scheduler's and rank 0's
    assert report.stored_blocks == report.loaded_blocks == 9
    assert report.checked == 9 and report.passed, report.errors


@pytest.mark.parametrize(
    "fault", ["load-neighbour", "corrupt-load", "drop-store", "no-load", "partial-store"]
)
def test_every_fault_that_moves_the_wrong_kv_is_named_by_key_group_and_layer(
    tmp_path, monkeypatch, fault
):
    report = _round_trip(tmp_path, monkeypatch, fault)
    assert not report.passed
    first = report.errors[0]
    text = first.text()
    assert f"group {first.group}" in text and "layer" in text and "load job 2" in text
    if fault == "partial-store":  # the first group was stored: the others are wrong
        assert {e.group for e in report.errors} == {1, 2}
    else:
        assert first.group == 0 and first.layer == 0 and len(report.errors) == 9


def test_a_slot_is_judged_by_the_key_it_held_at_each_copy():
    """A slot reused for another key, a key loaded from another slot (a tier that moved
    it), a key stored before the ledger began, a slot nobody prepared."""

    def ev(t, op, **kw):
        return {"t": t, "op": op, **kw}

    events = [
        ev(1, "assign", keys=["a"], slots=[5]),
        ev(2, "store", rank=0, job=1, blocks=[[0, 5, 0, [10, 11]]]),
        ev(3, "assign", keys=["b"], slots=[5]),  # a evicted, b in its slot
        ev(4, "store", rank=0, job=2, blocks=[[0, 5, 0, [20, 21]]]),
        ev(5, "assign", keys=["a", "c"], slots=[7, 8]),  # a back (from disk), c never stored
        ev(6, "load", rank=0, job=3, blocks=[[0, 7, 0, [10, 11]], [0, 8, 0, [1, 2]]]),
        ev(7, "assign", keys=["b"], slots=[5]),
        ev(8, "load", rank=0, job=4, blocks=[[0, 5, 0, [20, 99]], [0, 9, 0, [0, 0]]]),
    ]
    report = judge(events)
    assert (report.stored_blocks, report.loaded_blocks) == (2, 4)
    assert (report.unverified, report.unmapped, report.checked) == (1, 1, 2)
    (err,) = report.errors
    assert (err.key, err.layer, err.job) == ("b", 1, 4)
    assert report.observed().startswith("2 of 4 loaded blocks held to their stores: 1 wrong,")
    assert not report.passed


def test_the_manager_wrapper_writes_keys_and_slots_in_order(tmp_path):
    calls = []

    class Manager:
        def prepare_store(self, keys, ctx):
            calls.append(("store", list(keys)))
            return SimpleNamespace(
                keys_to_store=list(keys)[1:], store_spec=SimpleNamespace(block_ids=[4, 6])
            )

        def prepare_load(self, keys, ctx):
            calls.append(("load", list(keys)))
            return SimpleNamespace(block_ids=[9])

    manager, ledger = Manager(), content_ledger.Ledger(tmp_path, "scheduler")
    content_ledger.record_assignments(manager, ledger)
    out = manager.prepare_store([b"\x00", b"\x01", b"\x02"], None)
    assert out.keys_to_store == [b"\x01", b"\x02"]
    manager.prepare_load(iter([b"\x01"]), None)
    ledger.close()
    events, files = read_events(tmp_path)
    assert files == 1 and calls == [("store", [b"\x00", b"\x01", b"\x02"]), ("load", [b"\x01"])]
    assert [(e["for"], e["keys"], e["slots"]) for e in events] == [
        ("store", ["01", "02"], [4, 6]),
        ("load", ["01"], [9]),
    ]
