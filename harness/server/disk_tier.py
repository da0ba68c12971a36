"""vLLM's ``fs`` disk tier as files: what the harness reads of it, and seeded damage.

The tier (``vllm/v1/kv_offload/tiering/fs``, layout in ``vllm/v1/kv_offload/file_mapper.py``)
keeps one file per chunk and KV-cache group,
``<root>/<model>_<digest>_r<rank>/<hhh>/<hh>_g<group>/<hash>.bin``, each the CPU tier's
whole row for that chunk, written to ``<file>.tmp`` and renamed; a ``config.json`` beside
each rank's directory names the layout the files were written with. The directory name
depends on the runtime (model path, parallelism, whether the layout is portable), so
files are found by their suffix under the root, never by a predicted path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK_SUFFIX = ".bin"


@dataclass(frozen=True)
class DiskInventory:
    """The chunk files under a disk tier's root, at one moment."""

    root: str
    files: int = 0
    bytes: int = 0
    sizes: dict[int, int] = field(default_factory=dict)  # file size -> how many files
    partial: int = 0  # ``.tmp`` files: writes never renamed into place
    configs: int = 0  # config.json files (one per layout the tier was written with)

    @property
    def file_size(self) -> int | None:
        """The one size every chunk file has; None when they differ or there are none."""
        return next(iter(self.sizes)) if len(self.sizes) == 1 else None

    def record(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "files": self.files,
            "bytes": self.bytes,
            "sizes": {str(k): v for k, v in sorted(self.sizes.items())},
            "partial": self.partial,
            "configs": self.configs,
        }


def chunk_files(root: Path) -> list[Path]:
    """Every chunk file under ``root``, in a stable order."""
    return sorted(p for p in root.rglob(f"*{CHUNK_SUFFIX}") if p.is_file())


def inventory(root: Path) -> DiskInventory:
    """Count and size the chunk files under ``root`` (an absent root holds none)."""
    if not root.is_dir():
        return DiskInventory(str(root))
    sizes = Counter(p.stat().st_size for p in chunk_files(root))
    return DiskInventory(
        str(root),
        files=sum(sizes.values()),
        bytes=sum(size * n for size, n in sizes.items()),
        sizes=dict(sizes),
        partial=sum(1 for p in root.rglob("*.tmp") if p.is_file()),
        configs=sum(1 for p in root.rglob("config.json") if p.is_file()),
    )


def truncate_chunks(root: Path) -> int:
    """Seeded fault: cut every chunk file to half its size (a torn or lost write). The
    number of files cut."""
    files = chunk_files(root)
    for path in files:
        with path.open("r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
    return len(files)


def flip_bits(root: Path) -> int:
    """Seeded fault: one bit flipped in every chunk file, its size unchanged (bit rot, a
    bad sector: the fs tier keeps no checksum to notice, #54363). The bit is the lowest
    of the 16-bit value at the file's middle (an even byte: a little-endian value's low
    byte), one unit in the last place of one KV element: read back without complaint,
    every count exact, the answers most likely unchanged; only a digest of the content
    sees it. The number of files flipped."""
    files = chunk_files(root)
    for path in files:
        size = path.stat().st_size
        if size < 2:
            continue
        at = (size // 2) & ~1
        with path.open("r+b") as fh:
            fh.seek(at)
            byte = fh.read(1)[0]
            fh.seek(at)
            fh.write(bytes([byte ^ 0x01]))
    return len(files)


def swap_chunks(root: Path) -> int:
    """Seeded fault: every chunk file holds the bytes of the next one of its size (a file
    named by another chunk's hash), so a read succeeds with the wrong KV. The number of
    files rewritten (0 when no two files share a size)."""
    by_size: dict[int, list[Path]] = {}
    for path in chunk_files(root):
        by_size.setdefault(path.stat().st_size, []).append(path)
    moved = 0
    for paths in by_size.values():
        if len(paths) < 2:
            continue
        contents = [p.read_bytes() for p in paths]
        for path, data in zip(paths, contents[1:] + contents[:1], strict=True):
            path.write_bytes(data)
        moved += len(paths)
    return moved
