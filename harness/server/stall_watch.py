"""The stall watch: ``/metrics`` read in the background while requests are outstanding;
an engine that takes no prompt token and generates none for ``stall_s`` has stalled (a
transfer job that never completes, a lost wake-up, a secondary tier whose loads never
finish), and ``on_stall`` is told once, with what was seen, so the caller stops the
server and fails at once instead of every request waiting out its timeout (600 s).

On the server floor: the stress run (its timeline of stores and loads too) and every
round trip's requests (``roundtrip.run.Endpoint``) watch through it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from harness.errors import HarnessError
from harness.server import metrics
from harness.server.launcher import http_json

SAMPLE_S = 0.5  # metrics sampling period
# An engine that takes no prompt token and generates none for this long while requests
# are outstanding has stalled; a healthy step here is under a second. The stress run's
# ``--stall-after`` sets another window (mutate calibrates one from its baseline run:
# harness.commands.mutate.execute.calibrated_stall).
STALL_S = 120.0


def stalled(
    waiting: int, still_s: float, progress: tuple[float, float], promotions: float = 0.0
) -> str:
    """What the stall watch says of an engine that stopped moving (``run.death``):
    with a secondary tier's promotion (load) jobs active when it fired, that tier is
    named as the cause."""
    prompt, generated = progress
    tier = (
        f"; {promotions:.0f} secondary-tier load (promotion) job(s) still active: a tier "
        "whose loads never complete"
        if promotions
        else ""
    )
    return (
        f"the engine stalled: {waiting} request(s) outstanding and no token taken or "
        f"generated for {still_s:.0f} s (prompt tokens {prompt:.0f}, generated "
        f"{generated:.0f}){tier}; the harness stopped the server"
    )


class Sampler:
    """Reads ``/metrics`` every ``SAMPLE_S`` in the background: cumulative stored and
    loaded bytes and preemptions over time, for the timeline; and the stall watch: when
    ``outstanding()`` requests wait while the engine's prompt and generation token
    counters stay still for ``stall_s``, ``on_stall`` is called once with what was seen
    (:func:`stalled`)."""

    def __init__(
        self,
        base: str,
        *,
        outstanding: Callable[[], int] | None = None,
        on_stall: Callable[[str], None] | None = None,
        stall_s: float = STALL_S,
    ) -> None:
        self.base = base
        self.points: list[tuple[float, metrics.Snapshot]] = []
        self.stall: str = ""  # what the watch saw, once it fired
        # The longest the counters stayed still with requests outstanding: a healthy
        # run's (run.json's longest_still_s) is what a stall window is calibrated from.
        self.longest_still_s = 0.0
        self._outstanding = outstanding
        self._on_stall = on_stall
        self._stall_s = stall_s
        self._progress: tuple[float, float] | None = None
        self._moved = time.monotonic()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                text = http_json(f"{self.base}/metrics", None, 5)
            except HarnessError:
                continue  # a dying server: the run's own checks say so
            snap, _, _ = metrics.parse(str(text))
            now = time.monotonic()
            self.points.append((now - self._t0, snap))
            self._watch(snap, now)

    def _watch(self, snap: metrics.Snapshot, now: float) -> None:
        """The stall watch, one sample at a time (pure but for the callback)."""
        progress = (snap.prompt_tokens, snap.generation_tokens)
        waiting = self._outstanding() if self._outstanding is not None else 0
        if progress != self._progress or not waiting:
            self._progress, self._moved = progress, now
            return
        self.longest_still_s = max(self.longest_still_s, now - self._moved)
        if self.stall or now - self._moved < self._stall_s:
            return
        self.stall = stalled(waiting, now - self._moved, progress, snap.promotions_active)
        if self._on_stall is not None:
            self._on_stall(self.stall)

    def stop(self) -> None:
        """Stop sampling; wait for the thread, so a stall's server stop has finished
        before the run stops its servers itself."""
        self._stop.set()
        self._thread.join(timeout=60)
