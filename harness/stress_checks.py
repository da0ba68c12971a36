"""Verdicts of a stress run: pure functions from what the run observed to checks, each
with expected, observed and why (the round trip's ``CheckResult``), so a failing run
says which request went wrong where, and each check is tested without an engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from harness.checks import CheckResult
from harness.reference import TokenVerdict
from harness.stress_driver import Outcome

# Engine log lines no healthy offloading run prints (each from a fixed upstream bug).
BAD_LOG = (
    ("assertion", re.compile(r"\bAssertionError\b")),
    ("cannot-store", re.compile(r"Cannot store", re.IGNORECASE)),
    ("not-in-cache", re.compile(r"not found in cache")),
    ("engine-fatal", re.compile(r"EngineCore encountered a fatal error")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
)


def check_outputs(outcomes: Sequence[Outcome], verdicts: Mapping[str, TokenVerdict]) -> CheckResult:
    """Every compared request's tokens against the reference (teacher-forced, within the
    noise floor); the first divergence named by request, turn and token."""
    compared = [o for o in outcomes if o.id in verdicts]
    bad = [(o, verdicts[o.id]) for o in compared if verdicts[o.id].divergence is not None]
    near = sum(verdicts[o.id].near_ties for o in compared)
    tokens = sum(verdicts[o.id].scored for o in compared)
    observed = f"{len(compared) - len(bad)}/{len(compared)} requests match ({tokens} tokens"
    observed += f", {near} near-ties within the floor)" if near else ")"
    detail = ""
    if bad:
        o, v = bad[0]
        assert v.divergence is not None
        turn = f", turn {o.turn}" if o.turn is not None else ""
        detail = f"first: {o.id}{turn}, {v.divergence.text()}"
        if len(bad) > 1:
            detail += f"; {len(bad) - 1} more request(s) diverge"
    return CheckResult(
        "outputs-match-reference",
        not bad and bool(compared),
        "every request's tokens are the reference's choice (or within the noise floor)",
        observed,
        "a wrong byte loaded from the CPU tier changes what the model attends to",
        detail,
    )


def check_no_errors(outcomes: Sequence[Outcome]) -> CheckResult:
    """No request failed; one that was never sent because its parent failed is counted
    under its parent, whose error is the one named."""
    failed = [o for o in outcomes if o.error and not o.error.startswith("not sent")]
    skipped = [o for o in outcomes if o.error.startswith("not sent")]
    observed = f"{len(failed)} failed" + (
        f", {len(skipped)} not sent after them" if skipped else ""
    )
    return CheckResult(
        "no-request-errored",
        not failed and not skipped,
        "every request answered (aborted ones excepted)",
        observed,
        "offloading must never turn a request into an error",
        f"first: {failed[0].id}: {failed[0].error}" if failed else "",
    )


def check_log(lines: Iterable[str]) -> CheckResult:
    """The engine log holds none of the lines the fixed offload bugs printed."""
    seen: dict[str, str] = {}
    for line in lines:
        for name, pattern in BAD_LOG:
            if name not in seen and pattern.search(line):
                seen[name] = line.strip()[:200]
    return CheckResult(
        "engine-log-clean",
        not seen,
        "no " + ", ".join(n for n, _ in BAD_LOG),
        ", ".join(seen) or "clean",
        "an assertion or a refused store caught inside the engine is a bug even when the "
        "request survived it",
        next(iter(seen.values()), ""),
    )


def check_happened(name: str, what: str, count: float, why: str) -> CheckResult:
    """A condition the profile exists to create (preemptions, external hits on later
    turns) really happened: otherwise the run proved nothing about it."""
    return CheckResult(name, count > 0, f"{what} > 0", f"{what} = {count:g}", why)
