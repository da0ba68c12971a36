"""The machine-wide server lock: every launch of this harness queues on one file lock.

Two engines on a 2-core machine starve each other and every timing becomes noise, so all
launches (tests, benchmarks, a second terminal) take ``server_slot`` while their server
lives, and a run whose servers share the cores in lanes holds the lock once for all of
them (``hold_machine``). The holder is written into the file, so a run that waits, or is
told not to (``--no-wait``), names whom it waits for; ``doctor`` reads the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from harness.errors import RuntimeFailure
from harness.names import ENV_LOCK, ENV_LOCK_WAIT


def lock_path() -> str | None:
    value = os.environ.get(ENV_LOCK, "/tmp/offload-check-vllm.lock")
    return None if value in ("", "none") else value


# ``--no-wait`` (set by the CLI for the command it runs); None: ``OFFLOAD_CHECK_LOCK_WAIT``.
_LOCK_WAIT: list[bool | None] = [None]


_ANNOUNCED: set[str] = set()  # the holders this process has said it waits for


def refuse_if_lock_busy() -> None:
    """Told not to wait, a run fails before it starts when another holds the lock (one
    line naming the holder, exit 3); ``server_slot`` refuses the same way at a launch."""
    if lock_wait():
        return
    path = lock_path()
    holder = lock_holder(path) if path else None
    if holder is not None:
        raise RuntimeFailure(
            f"the server lock {path} is held by {holder.text()}; not waiting "
            "(--no-wait / OFFLOAD_CHECK_LOCK_WAIT=0)"
        )


def set_lock_wait(wait: bool | None) -> None:
    """Whether a launch waits for the server lock (None: as ``OFFLOAD_CHECK_LOCK_WAIT``)."""
    _LOCK_WAIT[0] = wait


def lock_wait() -> bool:
    if _LOCK_WAIT[0] is not None:
        return _LOCK_WAIT[0]
    return os.environ.get(ENV_LOCK_WAIT, "1").strip().lower() not in ("0", "no", "false", "off")


@dataclass(frozen=True)
class LockHolder:
    """Who holds the server lock, as the holder wrote it into the lock file."""

    pid: int | None
    since: str | None  # UTC, ISO 8601
    command: str | None

    def text(self) -> str:
        if self.pid is None:
            return "another process (it recorded no pid)"
        since = f" since {self.since}" if self.since else ""
        command = f" ({self.command})" if self.command else ""
        return f"pid {self.pid}{since}{command}"


def _read_holder(fh: Any) -> LockHolder:
    try:
        fh.seek(0)
        data = json.loads(fh.read() or "{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid = data.get("pid")
    return LockHolder(
        pid if isinstance(pid, int) else None,
        str(data["since"]) if data.get("since") else None,
        str(data["command"]) if data.get("command") else None,
    )


def _holder_from_proc_locks(path: str) -> LockHolder:
    """A holder that wrote nothing (an older harness): its pid from ``/proc/locks``."""
    try:
        st = os.stat(path)
        dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return LockHolder(None, None, None)
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != dev:
            continue
        pid = int(fields[4]) if fields[4].isdigit() else None
        if pid is None:
            break
        try:
            import psutil

            proc = psutil.Process(pid)

            since = datetime.fromtimestamp(proc.create_time(), timezone.utc)
            command = " ".join(proc.cmdline())[:200] or None
            return LockHolder(pid, since.isoformat(timespec="seconds"), command)
        except Exception:
            return LockHolder(pid, None, None)
    return LockHolder(None, None, None)


def lock_holder(path: str | None = None) -> LockHolder | None:
    """The holder of the server lock now, or None when nobody holds it (or it is off)."""
    path = path or lock_path()
    if path is None or not os.path.exists(path):
        return None

    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fh)
            return holder if holder.pid is not None else _holder_from_proc_locks(path)
        except OSError:
            return None
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


def _write_holder(fh: Any) -> None:
    record = {
        "pid": os.getpid(),
        "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["offload-check", *sys.argv[1:]])[:200],
    }
    with contextlib.suppress(OSError):
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(record) + "\n")
        fh.flush()


# Set while this process holds the server lock for a whole run split into lanes
# (``hold_machine``): its lanes' launches are already covered by it.
_HELD: list[bool] = [False]


@contextlib.contextmanager
def hold_machine() -> Iterator[None]:
    """Hold the server lock for a whole run whose servers run side by side, each on its
    own cores (``harness.server.lanes``): other runs queue as they would behind one
    server, and the run's own launches (in its threads) do not take the lock again."""
    if _HELD[0]:
        yield
        return
    with server_slot():
        _HELD[0] = True
        try:
            yield
        finally:
            _HELD[0] = False


@contextlib.contextmanager
def server_slot() -> Iterator[None]:
    """Hold the machine-wide server lock while a vLLM server lives.

    Two engines on a 2-core machine starve each other and every timing becomes noise,
    so all launches of this harness (tests, benchmarks, a second terminal) queue on one
    file lock. ``OFFLOAD_CHECK_LOCK=none`` opts out; another path scopes it. The holder
    writes its pid, start time and command into the file; a run that has to wait says
    once on stderr whom it waits for, or, told not to wait (``--no-wait``,
    ``OFFLOAD_CHECK_LOCK_WAIT=0``), fails at once naming the holder (exit 3).
    """
    path = lock_path()
    if path is None or _HELD[0]:
        yield
        return

    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            recorded = _read_holder(fh)
            holder = (recorded if recorded.pid else _holder_from_proc_locks(path)).text()
            if not lock_wait():
                raise RuntimeFailure(
                    f"the server lock {path} is held by {holder}; not waiting "
                    "(--no-wait / OFFLOAD_CHECK_LOCK_WAIT=0)"
                ) from None
            if holder not in _ANNOUNCED:  # once per holder, not at every launch of a run
                _ANNOUNCED.add(holder)
                print(
                    f"offload-check: waiting for the server lock {path}, held by {holder}",
                    file=sys.stderr,
                    flush=True,
                )
            fcntl.flock(fh, fcntl.LOCK_EX)
        _write_holder(fh)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fh.seek(0)
                fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)
