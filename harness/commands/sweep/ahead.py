"""A sweep's next build prepared while the current build's servers run.

A launch is mostly one process importing vLLM and torch on one core. A build's
preparation (its environment: a uv install, the bytecode compile and an import check;
then vLLM's model-class inspection: 50-60 s on a fresh machine here) used to sit between
two builds' servers while the second core idled. Now the sweep hands the next build to a
worker process (``python -m harness.server.build_prep``) as soon as the current build is
ready, and takes the result when it gets there. The worker runs at a lower CPU priority
than the servers, prepares one build at most and starts no server, so the
one-server-at-a-time rule holds. Progress lines stay the sweep's own: what the worker
did is reported when the sweep reaches that build.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable

from harness.commands.sweep.builds import Build
from harness.server.build_prep import Prepared, worker_argv

Step = Callable[[str], None]


class Ahead:
    """At most one build being prepared in the background. Use as a context manager:
    leaving it (a finished sweep, Ctrl-C, an error) ends a worker still running, with its
    whole process group, so no install outlives the sweep."""

    def __init__(self, *, dist: str, uv: str | None, torch_index: str | None) -> None:
        self._options = {"dist": dist, "uv": uv, "torch_index": torch_index}
        self._build: Build | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self, build: Build, *, warm: bool) -> None:
        """Begin preparing ``build`` (replacing nothing: one at a time)."""
        assert self._proc is None, "one build ahead at most"
        argv = worker_argv(build.spec, build.label, warm=warm, **self._options)  # type: ignore[arg-type]
        self._proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own group: ended whole, never by a terminal's ^C
        )
        self._build = build

    def take(self, build: Build, waiting: Step) -> Prepared | None:
        """``build``'s preparation if it was begun ahead (waiting for it to end, with
        ``waiting`` told so), else None, and None too when the worker failed (the
        caller then prepares the build itself: the worker is only a head start)."""
        if self._proc is None or self._build != build:
            return None
        proc, self._proc, self._build = self._proc, None, None
        t0 = time.monotonic()
        if proc.poll() is None:
            waiting("prepared since the last build began: waiting for it")
        out, _ = proc.communicate()
        waited = time.monotonic() - t0
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            return None
        try:
            prepared = Prepared.from_record(json.loads(lines[-1]))
        except (ValueError, KeyError, TypeError):
            return None
        prepared.ahead = True
        if waited >= 1:
            prepared.steps.append(f"waited {waited:.0f}s for it")
        return prepared

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        proc, self._proc, self._build = self._proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
