"""A failing sequence cut short: the fewest steps that still fail the same check.

A generated sequence of sixty requests that fails at request 41 says little by itself;
the two or three requests that make it fail say what is wrong. The drive answers a
candidate sequence in a fraction of a second once vLLM is imported, so one drive process
reads candidates from its standard input (``oracle_drive -``) and the steps are removed
by delta debugging (Zeller's ddmin: halves, then quarters, ... of what is left, keeping
each removal after which the check still fails). hypothesis's shrinker needs the test
inside its own process, which vLLM's import cost and the build's own interpreter rule
out. A server's failure is shrunk the same way when the drive reproduces it; when it
does not, the requests that share no chunk with the failing one are dropped (the model
says they cannot matter) and the report says it was not replayed.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.commands.oracle.drive import drive_env, judge_lines
from harness.commands.oracle.plan import DRIVE_MODULE, Cell
from harness.names import REPO_ROOT
from harness.oracle.workload import Step

MAX_TRIES = 120
MAX_SECONDS = 240.0


class DriveSession:
    """One drive process serving candidate sequences one at a time (JSON lines)."""

    def __init__(self, python: str, patch: str | None = None) -> None:
        self.proc = subprocess.Popen(
            [python, "-m", DRIVE_MODULE, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=drive_env(patch),
            cwd=str(REPO_ROOT),
        )
        self.index = 0
        self._read_until(lambda line: "vllm_version" in line and "sequence" not in line)

    def _read_until(self, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        assert self.proc.stdout is not None
        out = []
        for raw in self.proc.stdout:
            raw = raw.strip()
            if not raw.startswith("{"):
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue
            out.append(line)
            if done(line):
                return out
        raise RuntimeError("the drive ended")

    def serve(self, seq: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A sequence's step lines and its summary line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(seq) + "\n")
        self.proc.stdin.flush()
        i = self.index
        self.index += 1
        lines = self._read_until(lambda line: line.get("sequence") == i and "summary" in line)
        mine = [x for x in lines if x.get("sequence") == i]
        return [x for x in mine if "step" in x], mine[-1]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Shrunk:
    check: str
    steps: list[Step]
    tries: int
    replayed: bool  # each candidate was served by the drive (else: the model's relevance)
    seconds: float

    def record(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "replayed": self.replayed,
            "tries": self.tries,
            "seconds": round(self.seconds, 1),
            "steps": [
                {**s.record(), "tokens": len(s.tokens)} if not s.reset else s.record()
                for s in self.steps
            ],
            "sequence": [s.record() for s in self.steps],
        }


def fails(session: DriveSession, cell: Cell, steps: Sequence[Step], check: str) -> bool:
    seq = replace(cell, steps=list(steps)).drive_sequence()
    lines, summary = session.serve(seq)
    if summary.get("error"):
        return False
    judged = judge_lines(replace(cell, steps=list(steps)), lines, summary["settings"])
    return any(check in j.failing for j in judged)


def ddmin(
    steps: list[Step], still_fails: Callable[[list[Step]], bool], budget: int
) -> tuple[list[Step], int]:
    """Zeller's ddmin over the steps; (the smallest failing list found, tries used)."""
    tries, n = 0, 2
    while len(steps) >= 2 and tries < budget:
        size = max(1, len(steps) // n)
        chunks = [steps[i : i + size] for i in range(0, len(steps), size)]
        reduced = False
        for i in range(len(chunks)):
            rest = [s for j, c in enumerate(chunks) if j != i for s in c]
            tries += 1
            if rest and still_fails(rest):
                steps, n, reduced = rest, max(n - 1, 2), True
                break
            if tries >= budget:
                break
        if not reduced:
            if n >= len(steps):
                break
            n = min(len(steps), n * 2)
    return steps, tries


def relevant(steps: Sequence[Step], failing_index: int, chunk: int) -> list[Step]:
    """The steps up to the failing one that share its first chunk (and the resets)."""
    target = steps[failing_index]
    head = target.tokens[:chunk]
    return [
        s
        for i, s in enumerate(steps[: failing_index + 1])
        if s.reset or i == failing_index or s.tokens[:chunk] == head
    ]


def shrink(
    python: str, cell: Cell, failing_index: int, check: str, patch: str | None = None
) -> Shrunk:
    """The drive cell's steps up to the failing request, cut down by ddmin."""
    t0 = time.monotonic()
    steps = list(cell.steps[: failing_index + 1])
    session = DriveSession(python, patch)
    try:
        if not fails(session, cell, steps, check):
            return Shrunk(check, relevant(steps, failing_index, cell.layout.chunk(0)), 1, False,
                          time.monotonic() - t0)  # fmt: skip

        def still(candidate: list[Step]) -> bool:
            return time.monotonic() - t0 < MAX_SECONDS and fails(session, cell, candidate, check)

        small, tries = ddmin(steps, still, MAX_TRIES)
    finally:
        session.close()
    return Shrunk(check, small, tries + 1, True, time.monotonic() - t0)
