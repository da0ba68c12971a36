"""What a scheduler-level case is: its registry and the record of one run of it.

The corpus's scheduler-level triggers (``scheduler_drive``) are cases, each a function
that drives vLLM's real scheduler into one upstream bug. Cases live in more than one
module (``scheduler_drive``: asserts in the connector; ``store_cases``: what the CPU
tier admits and stores), so the registry they add themselves to is its own module, which
imports neither of them.

Standard library only, importable without vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from harness.engine.drive_report import exception_text


@dataclass(frozen=True)
class Case:
    name: str
    bug: str  # the upstream issue / PR
    fixed_in: str  # first release without the bug
    asserts_in: str  # the vLLM function the bug's assertion is in, where it fires ("": none)
    run: Callable[[Drive], None]
    judged_by: str = ""  # the case's own check, for a bug that asserts nowhere

    @property
    def shows_as(self) -> str:
        """How the bug shows: ``asserts in prepare_load``, ``fails threshold-admits``."""
        return f"asserts in {self.asserts_in}" if self.asserts_in else f"fails {self.judged_by}"

    @property
    def summary(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0]


CASES: dict[str, Case] = {}


def case(
    name: str, *, bug: str, fixed_in: str, asserts_in: str = "", judged_by: str = ""
) -> Callable[[Callable[[Drive], None]], Any]:
    """Register a case: its bug shows either as vLLM asserting (``asserts_in``) or as a
    check of the case's own failing (``judged_by``), never both."""
    if bool(asserts_in) == bool(judged_by):
        raise ValueError(f"case {name}: give exactly one of asserts_in, judged_by")

    def register(fn: Callable[[Drive], None]) -> Callable[[Drive], None]:
        CASES[name] = Case(name, bug, fixed_in, asserts_in, fn, judged_by)
        return fn

    return register


@dataclass
class Drive:
    """What one run did and saw: the steps and figures the JSON line reports.

    ``trigger()`` marks the one call the bug lives in: an AssertionError raised inside
    it is the outcome ``assert``; anything failing outside it means the drive could not
    be set up, so a setup assertion is never mistaken for the bug. A bug that asserts
    nowhere (vLLM doing the wrong thing quietly) is judged by the case against what vLLM
    should have done: ``fail()`` names the check that saw it (the outcome ``fail``)."""

    case: str
    steps: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    triggered: BaseException | None = None
    trigger_tb: TracebackType | None = None
    failing: list[str] = field(default_factory=list)

    def step(self, text: str) -> None:
        self.steps.append(text)

    def fail(self, check: str, why: str) -> None:
        """vLLM did other than it should: ``check`` failed, for the reason ``why``."""
        if check not in self.failing:
            self.failing.append(check)
        self.step(f"{check} failed: {why}")

    @contextmanager
    def trigger(self, what: str) -> Iterator[None]:
        self.step(what)
        try:
            yield
        except AssertionError as exc:
            self.triggered, self.trigger_tb = exc, exc.__traceback__
            self.step("-> " + exception_text(exc)[:120])
