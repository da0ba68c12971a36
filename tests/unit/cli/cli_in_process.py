"""The command line run in this process, for tests of its contract: the exit code and
both streams of one ``offload-check`` call, and the one-line error the contract wants.
A module that imports ``keep_signal_handlers`` gets it as an autouse fixture."""

from __future__ import annotations

import contextlib
import io
import signal
from collections.abc import Iterator

import pytest

from harness.cli import app as cli


@pytest.fixture(autouse=True)
def keep_signal_handlers() -> Iterator[None]:
    """A run installs SIGTERM/SIGHUP handlers; the test process keeps its own."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def invoke(*args: str) -> tuple[int, str, str]:
    """``offload-check args`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run(list(args))
    return code, out.getvalue(), err.getvalue()


def one_line(stderr: str) -> str:
    """The only non-blank line of ``stderr``; never a traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
