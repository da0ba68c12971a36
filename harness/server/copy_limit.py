"""The bulk-copy yardstick for an offload rate, measured in the variant's own interpreter.

``bulk_copy.py`` (beside this file) runs there by its path, on the device the variant's
engine ran on, once that engine has stopped: the same torch, the same device, the same
machine load as the round trip it is set beside. Capped at ``CAP_BYTES``: a copy's rate
is flat long before that, and two buffers of a long-context run's 6.4 GB would not fit
beside each other on every runner.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import RuntimeFailure
from harness.server.interpreters import tagged_report

SCRIPT = Path(__file__).with_name("bulk_copy.py")
TAG = "OFFLOAD_CHECK_COPY"  # bulk_copy.TAG: that file is a script and is not imported
CAP_BYTES = 2 << 30
REPEAT = 5


@dataclass(frozen=True)
class CopyLimit:
    """One bulk copy each way: the best of ``REPEAT`` timed copies of ``bytes``."""

    device: str  # "cuda" or "cpu"
    how: str  # what was copied, in words
    bytes: int
    store_seconds: float  # engine -> tier (device -> pinned host on CUDA)
    load_seconds: float  # tier -> engine
    torch: str

    def seconds(self, direction: str) -> float:
        """The best copy's seconds in ``direction`` ("store" or "load")."""
        return self.store_seconds if direction == "store" else self.load_seconds

    def gbps(self, direction: str) -> float:
        seconds = self.seconds(direction)
        return self.bytes / seconds / 1e9 if seconds > 0 else float("inf")


def copy_bytes(moved: int) -> int:
    """How many bytes to copy for a run that moved ``moved``: the same, up to the cap."""
    return min(moved, CAP_BYTES)


def from_report(data: dict[str, Any]) -> CopyLimit:
    """The script's JSON line as a ``CopyLimit``: the best (shortest) sample each way."""
    store, load = data["store"], data["load"]
    return CopyLimit(
        device=str(data["device"]),
        how=str(data["how"]),
        bytes=int(data["bytes"]),
        store_seconds=min(float(s) for s in store),
        load_seconds=min(float(s) for s in load),
        torch=str(data.get("torch", "")),
    )


def measure(python: str, device: str, nbytes: int, timeout_s: float = 300) -> CopyLimit:
    """One bulk copy of ``nbytes`` each way with ``python`` on ``device``; a failure is a
    ``RuntimeFailure`` whose line says why (the script's last line of stderr)."""
    argv = [python, str(SCRIPT), "--bytes", str(nbytes), "--device", device]
    argv += ["--repeat", str(REPEAT)]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeFailure(f"the bulk copy did not run: {err}") from None
    data = tagged_report(proc, TAG)
    if isinstance(data, str):
        raise RuntimeFailure(f"the bulk copy failed: {data}")
    try:
        return from_report(data)
    except (KeyError, TypeError, ValueError) as err:
        raise RuntimeFailure(f"the bulk copy reported no figures: {err!r}") from None
