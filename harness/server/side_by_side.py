"""Work items run side by side, one lane of cores each (``--jobs``).

The lanes (:mod:`harness.server.lanes`) are threads of this process. Each takes the next
item from a shared queue, runs it with its launches pinned to its cores, and hands the
result to the main thread, which records it (``done``): a store such as mutate's sqlite
session belongs to the thread that opened it, and results land in the order they end.

Stopping is the main thread's job, since Ctrl-C and the harness's SIGTERM/SIGHUP handler
reach only it: it then refuses further launches and tears the live servers down
(``launcher.stop_lanes``), so a lane waiting on its server's answer returns, and waits for
every lane to end before the interrupt goes on. A lane that fails with an error stops
the others the same way, and the error is raised once all have ended.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from harness.server import lanes, launcher, server_lock

Item = TypeVar("Item")
Result = TypeVar("Result")
_POLL_S = 0.5  # how often the main thread looks up from its wait (signals land then)


class _Failed(Generic[Item]):
    def __init__(self, item: Item, error: BaseException) -> None:
        self.item, self.error = item, error


def run_in_lanes(
    items: Sequence[Item],
    jobs: int,
    work: Callable[[Item, tuple[int, ...]], Result],
    done: Callable[[Item, Result], None] | None = None,
    pick: Callable[[Sequence[Item]], int] | None = None,
) -> None:
    """``work(item, cores)`` for every item, ``jobs`` at a time, each lane on its own
    cores, the machine's server lock held throughout; ``done(item, result)`` in the
    calling thread as each ends. A free lane takes the item ``pick(pending)`` names (one
    lane at a time asks it), else the first. Items not begun when the run stops stay
    undone."""
    cores = lanes.split(jobs)
    pending: list[Item] = list(items)
    take = threading.Lock()
    results: queue.Queue[tuple[Item, Result] | _Failed[Item] | None] = queue.Queue()

    def lane(k: int) -> None:
        try:
            with lanes.pinned(cores[k]):
                while True:
                    with take:
                        if not pending or launcher.stopping():
                            return
                        item = pending.pop(pick(pending) if pick is not None else 0)
                    try:
                        results.put((item, work(item, cores[k])))
                    except BaseException as err:
                        results.put(_Failed(item, err))
                        return
        finally:
            results.put(None)  # this lane has ended

    with server_lock.hold_machine():
        threads = [
            threading.Thread(target=lane, args=(k,), name=f"lane-{k}", daemon=True)
            for k in range(len(cores))
        ]
        for t in threads:
            t.start()
        running, error = len(threads), None
        try:
            while running:
                try:
                    got = results.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if got is None:
                    running -= 1
                elif isinstance(got, _Failed):
                    if error is None:
                        error = got.error
                    launcher.stop_lanes()
                elif done is not None:
                    done(*got)
        except BaseException:
            launcher.stop_lanes()
            for t in threads:
                t.join()
            raise
        finally:
            launcher.resume_launches()
        if error is not None:
            raise error
