"""What environment directories take on disk, three ways: uv hard-links files from its
shared cache into each environment, so a plain sum of sizes (what a copy would take)
says neither what is on disk nor what removing an environment would free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DiskUsage:
    """Bytes under a directory. ``apparent``: every path's size, hard links each time (what
    a copy would take); ``allocated``: blocks on disk, each file (inode) once, like
    ``du``; ``exclusive``: the allocated bytes of files with no link outside the
    directory (what removing it frees: files uv hard-linked from its cache stay there)."""

    apparent: int = 0
    allocated: int = 0
    exclusive: int = 0


# (device, inode) -> [allocated bytes, links on disk, links seen under the directory]
_Inodes = dict[tuple[int, int], list[int]]


def _scan(path: Path, inodes: _Inodes) -> int:
    """Walk ``path`` (symlinks not followed), recording inodes; returns the apparent size."""
    try:
        st = path.stat(follow_symlinks=False)
    except OSError:
        return 0
    apparent = st.st_size
    inodes.setdefault((st.st_dev, st.st_ino), [st.st_blocks * 512, 1, 0])[2] += 1
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            apparent += st.st_size
            is_dir = entry.is_dir(follow_symlinks=False)
            # A directory's link count is its subdirectories, not other names for it.
            links = 1 if is_dir else st.st_nlink
            seen = inodes.setdefault((st.st_dev, st.st_ino), [st.st_blocks * 512, links, 0])
            seen[2] += 1
            if is_dir:
                stack.append(Path(entry.path))
    return apparent


def _usage(apparent: int, inodes: _Inodes) -> DiskUsage:
    return DiskUsage(
        apparent=apparent,
        allocated=sum(alloc for alloc, _, _ in inodes.values()),
        exclusive=sum(alloc for alloc, nlink, seen in inodes.values() if seen >= nlink),
    )


def disk_usage(*paths: Path) -> DiskUsage:
    """What ``paths`` hold together: a file hard-linked from two of them counts once."""
    inodes: _Inodes = {}
    apparent = sum(_scan(p, inodes) for p in paths)
    return _usage(apparent, inodes)
