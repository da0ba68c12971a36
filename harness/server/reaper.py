"""A watchdog that takes a server's process group down if the harness dies first.

Signal handlers and ``finally`` blocks cannot run when the harness is SIGKILLed or
OOM-killed, and a parent-death signal is not enough either: vLLM's API server
swallows a SIGTERM that arrives while its engine is starting and goes on to serve.
So every server gets this small sidecar (stdlib only, started in its own session):
it polls the harness's pid and, the moment the harness is gone, terminates the
server's whole process group, then kills what is left. It exits by itself as soon
as the server group is gone, and the harness kills it on a normal stop.

    python -m harness.server.reaper <harness pid> <harness start time> <server pgid> [scratch dir]

The scratch directory (the server's ZMQ socket directory) is removed after the kill: the
harness's own ``stop`` removes it otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: tells a live process from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    harness_pid, harness_start, pgid = int(argv[0]), argv[1], int(argv[2])
    scratch = argv[3] if len(argv) > 3 else None
    while _group_alive(pgid):
        if _start_time(harness_pid) != harness_start:
            _take_down(pgid)
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            return 0
        time.sleep(POLL_S)
    return 0


def _take_down(pgid: int) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
