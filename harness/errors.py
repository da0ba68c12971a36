"""Exit codes and the one exception type the CLI turns into a single clear line.

Every failure a user can cause (a bad file, a missing environment, a busy port)
is raised as a :class:`HarnessError` so the CLI can print one line and exit with
a code that scripts can tell apart from "the check itself failed".
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # every row / check matched its expectation
    MISMATCH = 1  # the harness ran, and something did not match what was expected
    BAD_INPUT = 2  # scenario, config, interpreter, port: the user's input cannot be run
    RUNTIME = 3  # the harness could not finish (a server died mid-run, disk full, ...)
    INTERRUPTED = 130  # Ctrl-C; results written so far are kept


class HarnessError(Exception):
    """An error the user can act on; ``str(err)`` is the one line shown to them."""

    exit_code: ExitCode = ExitCode.BAD_INPUT

    def __init__(self, message: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(HarnessError):
    exit_code = ExitCode.BAD_INPUT


class RuntimeFailure(HarnessError):
    exit_code = ExitCode.RUNTIME
