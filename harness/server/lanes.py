"""Lanes: the machine's cores split between servers that run side by side (``--jobs``).

A launch is three Python processes importing vLLM and torch one after another, each on
one core; on these 2-core machines it is most of a long run's time, and the other core
idles through it. Two servers each pinned to its own cores import side by side at
nearly full speed (measured here: one cold ``import vllm.v1.engine.core`` pinned alone
8.0-8.2 s, two pinned to cores 0 and 1 at once 8.2-9.1 s each).

What keeps the timings honest is that each lane owns its cores: every process of a
lane's server is pinned to them (Linux CPU affinity, which vLLM's children inherit),
and vLLM's OpenMP threads are bound to them too (``VLLM_CPU_OMP_THREADS_BIND``: vLLM
0.32's ``auto`` follows the affinity mask, but an explicit list holds on every release).
So two engines never share a core; a lane's engine has fewer threads than a lone one.

The run that splits the machine holds the machine-wide server lock for its whole life
(``server_lock.hold_machine``): no other run launches meanwhile, and the lanes' own launches
do not queue on the lock they already hold. A lane is a thread of this process
(``pinned``) or a child process (``OFFLOAD_CHECK_CORES`` in its environment,
``lane_env``).

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Sequence

from harness.errors import BadInput
from harness.names import ENV_CORES, ENV_LOCK

OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"
_LOCAL = threading.local()


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask), in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split(jobs: int, cores: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """``jobs`` lanes of consecutive cores, as even as the count allows (the first lanes
    take one more when it does not divide). More lanes than cores is bad input: a lane
    without a core of its own is the starving this module exists to avoid."""
    have = list(usable_cores() if cores is None else cores)
    if jobs < 1:
        raise BadInput(f"--jobs {jobs}: at least 1")
    if jobs > len(have):
        raise BadInput(
            f"--jobs {jobs}: this machine gives {len(have)} core(s) to the run; "
            "each server side by side needs one of its own"
        )
    size, extra = divmod(len(have), jobs)
    lanes, at = [], 0
    for k in range(jobs):
        n = size + (1 if k < extra else 0)
        lanes.append(tuple(have[at : at + n]))
        at += n
    return lanes


def parse(text: str) -> tuple[int, ...]:
    """``"0"``, ``"2,3"`` or ``"0-3"`` as cores; malformed text is bad input."""
    out: list[int] = []
    bad = BadInput(f"{ENV_CORES}={text!r}: not a list of cores (e.g. 0 or 2,3 or 0-3)")
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out += range(lo, hi + 1)
            elif part:
                out.append(int(part))
    except ValueError:
        raise bad from None
    if not out or min(out) < 0:
        raise bad
    return tuple(dict.fromkeys(out))


def text(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores)


@contextlib.contextmanager
def pinned(cores: Sequence[int]) -> Iterator[None]:
    """Inside the block, this thread and every process it starts (a server, an install,
    a bytecode compile, a drive process) run on ``cores`` only: Linux keeps an affinity
    mask per thread, and a child inherits its parent thread's. A build's installation in
    one lane then never takes the core of the other lane's server."""
    before = getattr(_LOCAL, "cores", None)
    _LOCAL.cores = tuple(cores)
    mask = _thread_mask()
    _set_thread_mask(cores)
    try:
        yield
    finally:
        _LOCAL.cores = before
        if mask is not None:
            _set_thread_mask(mask)


def _thread_mask() -> set[int] | None:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _set_thread_mask(cores: Iterable[int]) -> None:
    """The calling thread's mask (pid 0 is the calling thread for the Linux call)."""
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(cores))


def current() -> tuple[int, ...] | None:
    """The cores this thread's launches are pinned to: its lane (``pinned``), else the
    process's (``OFFLOAD_CHECK_CORES``), else None (a launch uses the whole machine)."""
    cores = getattr(_LOCAL, "cores", None)
    if cores is not None:
        return tuple(cores)
    value = os.environ.get(ENV_CORES, "").strip()
    return parse(value) if value else None


def lane_env(cores: Sequence[int]) -> dict[str, str]:
    """The environment of a child ``offload-check`` that is one lane of this run: its
    servers pinned to ``cores``, and no wait on the lock this run holds for it."""
    return {ENV_CORES: text(cores), ENV_LOCK: "none"}


def omp_bind(cores: Sequence[int], ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers sharing ``cores``: each rank
    its own consecutive share (``"0"``; ``"0,1|2,3"``); too few cores is bad input."""
    if ranks > len(cores):
        raise BadInput(
            f"a server with {ranks} CPU worker(s) needs as many cores; its lane has "
            f"{len(cores)} ({text(cores)}): run it with fewer --jobs"
        )
    return "|".join(text(share) for share in split(ranks, cores))


def ranks_of(bind: str | None) -> int:
    """How many CPU workers a ``VLLM_CPU_OMP_THREADS_BIND`` value binds (1 if unset)."""
    if not bind or bind in ("auto", "nobind"):
        return 1
    return bind.count("|") + 1


def pin_process(pid: int, cores: Sequence[int]) -> None:
    """Pin a process just spawned (its children inherit the mask)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, set(cores))
