"""What an in-process drive of vLLM's scheduler reports: one JSON line, read by the harness.

The drives (``scheduler_drive``: the corpus's scheduler-level bug triggers;
``oracle_drive``: generated sequences judged against the harness's model) run inside a
release's interpreter and print their result as JSON. The pieces both need to make that
line readable across runs and releases live here: the outcome record, the innermost vLLM
frame of a traceback, exception texts with run-specific bytes masked, chunk ranges, and
a standard output kept for the JSON alone.

Standard library only, importable without vLLM (the unit tests read it without).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from types import TracebackType
from typing import Any

OUTCOME_ASSERT = "assert"
OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
# No assertion fired, but vLLM did other than it should (a check of the case failed).
OUTCOME_FAIL = "fail"
OUTCOMES = (OUTCOME_ASSERT, OUTCOME_OK, OUTCOME_ERROR, OUTCOME_FAIL)
EXIT_OK = 0  # the drive ran: the outcome says whether the bug fired
EXIT_BAD_INPUT = 2  # unknown case, unreadable sequence
EXIT_NOT_SET_UP = 3  # the drive could not be set up (outcome "error")
MAX_EXCEPTION_CHARS = 400


class SetupError(Exception):
    """The drive could not reach the state it is about (outcome "error")."""


def is_vllm_file(path: str) -> bool:
    """Whether a frame's file is vLLM's own (``.../vllm/...``), not the harness's."""
    parts = Path(path).parts
    return "vllm" in parts[:-1]


def innermost_vllm_frame(frames: Sequence[tuple[str, int, str]]) -> str | None:
    """``file.py:line in func`` of the deepest vLLM frame, from (file, line, function)
    outermost first; None when no frame is vLLM's (the exception is the harness's)."""
    for filename, lineno, func in reversed(frames):
        if is_vllm_file(filename):
            return f"{Path(filename).name}:{lineno} in {func}"
    return None


def traceback_frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]


# A bytes literal in a message (an offload key: a block hash and a group index).
_BYTES_LITERAL = re.compile(r"(?<!\w)b(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def exception_text(exc: BaseException) -> str:
    """``Type: message`` on one line. Bytes literals (offload keys: hashes, different in
    every run) read ``b'...'``, so one bug gives one text in every run and release."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    text = _BYTES_LITERAL.sub("b'...'", text)
    if text.endswith(":"):  # a bare ``assert``
        text = text[:-1]
    return text if len(text) <= MAX_EXCEPTION_CHARS else text[: MAX_EXCEPTION_CHARS - 3] + "..."


def result_record(
    case: str,
    vllm_version: str | None,
    outcome: str,
    *,
    exception: str | None = None,
    frame: str | None = None,
    figures: dict[str, Any] | None = None,
    steps: Sequence[str] = (),
    failing: Sequence[str] = (),
) -> dict[str, Any]:
    """The one JSON object the drive prints; keys in this order, always all present."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {OUTCOMES}")
    return {
        "case": case,
        "vllm_version": vllm_version,
        "outcome": outcome,
        "exception": exception,
        "frame": frame,
        "figures": dict(figures or {}),
        "steps": list(steps),
        "failing": list(failing),
    }


def chunk_ranges(indices: Sequence[int]) -> str:
    """``0-51,61`` for [0..51, 61]: chunk lists read short in a JSON line."""
    out: list[str] = []
    for i in sorted(set(indices)):
        if out and (last := out[-1].rsplit("-", 1)[-1]).isdigit() and int(last) == i - 1:
            start = out[-1].split("-")[0]
            out[-1] = f"{start}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def ranges_of(present: Sequence[int]) -> str:
    return chunk_ranges(present) or "-"


@contextmanager
def stdout_kept_for_result() -> Iterator[Any]:
    """Standard output for the JSON line only: vLLM logs (and some C extensions print)
    to stdout, so while the case runs both ``sys.stdout`` and file descriptor 1 point at
    stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with os.fdopen(os.dup(saved), "w") as result, redirect_stdout(sys.stderr):
            yield result
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
