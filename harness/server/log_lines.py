"""One line of a vLLM server log: who printed it, and the frames it can hold.

vLLM tags every line a child process prints through Python with its process
("(EngineCore pid=3689) ", nested for grandchildren) and its logger's prefix; raw writes
to fd 2 (the fault handler's) carry neither. Tracebacks and fault handler dumps are read
on the text under those prefixes, so both parsers share this one split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "(EngineCore pid=3689) " possibly nested: "(APIServer pid=1) (Worker pid=2) ".
_PROC_PREFIX = re.compile(r"^((?:\((?P<proc>[A-Za-z_][\w ]*?)\s+pid=(?P<pid>\d+)\)\s*)+)")
_PROC_TAG = re.compile(r"\(([A-Za-z_][\w ]*?)\s+pid=(\d+)\)")
# vLLM's logger prefix: "ERROR 11-30 06:50:27 [core.py:123] ".
_LOG_PREFIX = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
UNTAGGED = "main"  # the process key of a line no vLLM prefix names


@dataclass
class Frame:
    path: str
    line: int
    func: str
    source: str = ""  # the code line Python printed under the frame

    @property
    def vllm_relpath(self) -> str | None:
        """``vllm/...`` part of the path when the frame is inside vLLM."""
        idx = self.path.rfind("/vllm/")
        return self.path[idx + 1 :] if idx >= 0 else None


def split_prefix(line: str) -> tuple[str, str]:
    """A log line as (process key, text without process and logger prefixes); the key of
    an untagged line is ``UNTAGGED``. The innermost (last) process tag names who printed
    the line."""
    proc = UNTAGGED
    m = _PROC_PREFIX.match(line)
    if m:
        name, pid = _PROC_TAG.findall(m.group(1))[-1]
        proc = f"{name} pid={pid}"
        line = line[m.end() :]
    line = _LOG_PREFIX.sub("", line, count=1)
    return proc, line.rstrip("\n")
