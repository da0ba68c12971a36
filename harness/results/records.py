"""The records a run's tables are made of: one dataclass per row kind.

``harness.results.tables`` takes each table's columns from these fields, and the commands
build these rows; the schema imports no command, and a command imports its rows from here
(outputs import their schema, never the reverse).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


def csv_row(
    record: Any, *, blank_if_none: tuple[str, ...] = (), seconds_digits: int = 2
) -> dict[str, Any]:
    """A record as a CSV row: None written as an empty cell where "not judged" or "no
    answer" is meant, and ``seconds`` rounded (the tables compare and show them)."""
    data = asdict(record)
    for key in blank_if_none:
        if data[key] is None:
            data[key] = ""
    data["seconds"] = round(data["seconds"], seconds_digits)
    return data


@dataclass
class CheckResult:
    name: str
    passed: bool
    expected: str
    observed: str
    why: str  # what the check guards against
    detail: str = ""  # on failure: where and how it went wrong
    informational: bool = False  # reported, never fails the run

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepCell:
    """One check on one build: a row of ``sweep.csv`` (results/README.md)."""

    release: str
    check: str
    kind: str
    scenario: str
    outcome: str
    known: str = ""  # the known bug the outcome was matched to (#51150, a label)
    signature: str = ""
    expected: str = ""
    matched: bool | None = None  # None: not judged (the build is unavailable, not run)
    seconds: float = 0.0
    vllm_version: str = ""
    detail: str = ""  # bytes, hits, output, failing checks: how this build behaved
    failing: str = ""  # the checks that failed, comma-separated (a round trip, a script)
    why: str = ""  # why it did not match, or why it was not run
    rule: int | None = None  # the scenario's expectation rule that judged it (0-based)
    run_dir: str = ""  # the command's own results for this build (releases/...)

    @property
    def state(self) -> str:
        """What transitions compare: the outcome, and the known bug it was matched to."""
        return f"{self.outcome} {self.known}" if self.known else self.outcome

    def record(self) -> dict[str, Any]:
        return csv_row(self, blank_if_none=("matched", "rule"))


@dataclass
class BugCell:
    """One entry on one build: a row of ``bugs.csv`` (results/README.md)."""

    bug: str
    release: str
    outcome: str  # reproduced | passed | error | unavailable | skipped | not-run
    expected: str = ""  # reproduced (affected) | passed (fixed) | "" (neither: not judged)
    matched: bool | None = None
    signature: str = ""  # the crash or the failing checks seen
    observed: str = ""  # the trigger's own outcome (crashed, started, fail ...)
    detail: str = ""
    why: str = ""
    check: str = ""
    vllm_version: str = ""
    seconds: float = 0.0
    run_dir: str = ""

    def record(self) -> dict[str, Any]:
        return csv_row(self, blank_if_none=("matched",))


@dataclass
class StepRecord:
    """What one step did: a row of ``steps.csv`` in the script's run directory."""

    index: int
    do: str
    name: str
    seconds: float = 0.0
    detail: str = ""
    http_status: int | None = None
    body: str = ""
    counters: dict[str, float] = field(default_factory=dict)  # change during the step

    def record(self) -> dict[str, Any]:
        data = csv_row(self, blank_if_none=("http_status",), seconds_digits=3)
        data["counters"] = json.dumps({k: int(v) for k, v in self.counters.items() if v})
        return data


@dataclass
class PressureRequest:
    """One request of a pressure run against the oracle: a row of ``pressure.csv``
    (results/README.md). Token and byte figures are the request's own counter deltas."""

    server: str
    round: str  # "clean", or the seeded mutant's or fault's round
    index: int
    request: str  # prompt name and chunk count, e.g. "A4"
    policy: str
    store_threshold: int
    prompt_tokens: int
    hit_expected: int  # tokens: the oracle's hit chunks x chunk tokens
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens
    ext_hits: int  # Δ vllm:external_prefix_cache_hits
    gpu_hits: int
    stored_expected: int  # bytes
    stored_bytes: int
    loaded_expected: int
    loaded_bytes: int
    skipped_expected: int  # keys under the store threshold
    stores_skipped: int
    store_fails_expected: bool
    store_failures: int
    evicted_expected: str  # the oracle's victims, in eviction order
    failing: str  # checks this request failed, ";"-joined
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return csv_row(self, blank_if_none=("cached_tokens",), seconds_digits=3)


@dataclass
class PressureCheck:
    """One check over one server's requests: a row of ``pressure-checks.csv``."""

    server: str
    round: str
    check: str
    passed: bool
    expected: str
    observed: str
    why: str
    detail: str = ""
    known: str = ""  # the rule's issue when the scenario expects this check to fail here
    matched: bool = True  # passed, or failed where a rule expects it

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MutantRecord:
    """One mutant of a mutation session and its verdict: a row of ``mutants.csv``."""

    id: str  # deterministic: the same mutant has the same id on every machine
    target: str  # the mutated module, dotted
    line: int
    function: str  # the definition it sits in ("" at module level)
    operator: str  # cosmic-ray's operator name
    change: str  # the one-line diff: `before` -> `after`
    # killed | survived | timeout | incompetent | equivalent | "" (not run yet)
    verdict: str = ""
    command: str = ""  # the command that noticed it (killed, timeout) or "import"
    failed: str = ""  # the checks that command failed, comma-separated
    detail: str = ""
    # the commands whose unmutated run executed its line; "" for none: not reached
    reached: str = ""
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return csv_row(self)
