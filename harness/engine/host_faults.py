"""The host backend's seeded faults: which one a server runs, fixed at launch
(``offload_check_fault`` in the connector's extra config) or switched at run time through
a control file (``offload_check_fault_control``) that ``offload-check faults`` rewrites
between round trips while the server is idle. Kept apart from the copy code
(``host_offload``) so what a fault *is* reads in one place; how each one bends a copy is
the worker's.

Only the standard library, vLLM and ``harness.names`` may be imported: this runs inside vLLM's
worker processes.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.logger import init_logger

from harness.names import EXTRA_FAULT, EXTRA_FAULT_CONTROL, FAULT_NONE, FAULTS, LOG_FAULT_SWITCH

# A logger under the "vllm" namespace, as in ``host_offload``: vLLM configures handlers
# only for that tree.
logger = init_logger(f"vllm.offload_check.{__name__}")

FAULT_KEY = EXTRA_FAULT
"""``kv_connector_extra_config`` key that selects a seeded fault (off by default)."""

FAULT_CONTROL_KEY = EXTRA_FAULT_CONTROL
"""``kv_connector_extra_config`` key naming a file whose content is the current fault mode."""

FAULT_MODES: tuple[str, ...] = FAULTS
"""Accepted fault modes. corrupt-load, drop-store and no-load report success and the full
byte count, so only the output check can catch them; partial-store / partial-load move (and
honestly report) only the first KV-cache group's bytes, the shape of a connector that
forgets a group (hybrid models), which the byte checks must catch. overcount-load moves
the right bytes and reports twice as many (a counter that lies: the trace line keeps
the bytes moved), which only a check of the counters can catch. segv-in-worker reads
address 0 on the worker's first step, the way a broken copy kernel dies: the harness must
name the signal and the vLLM frame, not report a server that "did not answer".
load-neighbour copies each block from the slot after the one it was asked for (the last
slot's from the first), success and the byte count right: KV reused from another chunk,
which the content ledger's check is for."""


def parse_fault_mode(value: Any) -> str:
    """Validate a fault-mode setting, failing loudly so a typo never silently runs clean."""
    if value is None or value == "":
        return FAULT_NONE
    if not isinstance(value, str) or value not in FAULT_MODES:
        raise ValueError(
            f"unknown {FAULT_KEY}={value!r} in kv_connector_extra_config; "
            f"expected one of {', '.join(FAULT_MODES)}"
        )
    return value


class FaultControl:
    """The fault mode in a control file, re-read only when the file changes.

    Every rank reads the same file at every transfer job and engine step; a ``stat`` per
    call keeps that cheap. A mode the file names must be valid: an unreadable file or an
    unknown name raises inside the engine (a loud failure), never falls back to "none".
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._mode = FAULT_NONE
        self.mode()  # a missing or bad file fails at worker creation, not mid-run

    def mode(self) -> str:
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # the harness renames a new file in
        if stamp != self._stamp:
            with open(self.path, encoding="utf-8") as fh:
                mode = parse_fault_mode(fh.read().strip())
            if mode != self._mode:
                logger.info("%s %s", LOG_FAULT_SWITCH, mode)
            self._mode, self._stamp = mode, stamp
        return self._mode
