"""Which lines of one vLLM source file the engine's processes executed.

``offload-check mutate`` must tell a surviving mutant that no run ever executed (no
workload reaches its line: a statement about the workloads) from one that ran and went
unnoticed (a statement about the checks). Coverage of the engine processes answers
that, but those are vLLM's processes in vLLM's environment, which has no coverage
package; this tracer is small enough to need none. The harness's plugin
(``harness.engine.plugin``) installs it in every process vLLM starts when
``OFFLOAD_CHECK_COVER`` names a file (by its path under site-packages, so a copy of the
environment matches as the original does). Each process appends every line of that
file it executes for the first time to ``<OFFLOAD_CHECK_COVER_OUT>/<pid>.lines`` as it
happens (a server is stopped by a signal: nothing may wait for exit), and frames of
every other file are not traced at all, so the cost is one call per function entered.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from harness.names import ENV_COVER, ENV_COVER_OUT


def install() -> bool:
    """Trace the file ``OFFLOAD_CHECK_COVER`` names, in this process and the threads it
    starts from now on; False (and nothing installed) when it names none."""
    relpath = os.environ.get(ENV_COVER, "").strip().lstrip("/")
    out = os.environ.get(ENV_COVER_OUT, "").strip()
    if not relpath or not out:
        return False
    Path(out).mkdir(parents=True, exist_ok=True)
    suffix = "/" + relpath
    seen: set[int] = set()
    sink = open(Path(out) / f"{os.getpid()}.lines", "a", buffering=1)  # noqa: SIM115 (process-long)
    lock = threading.Lock()

    def record(line: int) -> None:
        if line in seen:
            return
        with lock:
            if line not in seen:
                seen.add(line)
                sink.write(f"{line}\n")

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            record(frame.f_lineno)
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename.endswith(suffix):
            record(frame.f_code.co_firstlineno)
            return local
        return None

    sys.settrace(calls)
    threading.settrace(calls)
    return True


def read_lines(out: Path) -> set[int]:
    """Every line any traced process recorded under ``out``."""
    lines: set[int] = set()
    for path in sorted(out.glob("*.lines")) if out.is_dir() else []:
        lines |= {int(t) for t in path.read_text().split() if t.isdigit()}
    return lines
