"""faults: every seeded fault on one server, each judged by the checks it is for.

The round trip's checks are only worth something if each one fails when its fault is
present. This proves it on a live engine, in one launch: the server runs the harness's
host offload backend with its fault taken from a control file
(``offload_check_fault_control``), and the sweep runs one round trip per fault, writing
the fault into the file while the server is idle between rounds. Each round uses its
own prompts (its own seed), so nothing a previous round stored, corrupted or left in
the GPU prefix cache can be hit by the next one. A round passes when the set of failing
checks is exactly the fault's (``CAUGHT_BY``): a missing check is a blind harness, an
extra one a harness that blames the wrong thing.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from harness import names
from harness.commands import roundtrip as rt
from harness.commands.roundtrip.files import part_writer
from harness.errors import BadInput, ExitCode
from harness.results.markdown import table
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, register
from harness.scenario.roundtrip import RoundtripScenario
from harness.server import control_files
from harness.server.workload import make_prompts

CAUGHT_BY: dict[str, frozenset[str]] = {
    names.FAULT_NONE: frozenset(),
    # Success and the full byte count reported, wrong (or no) bytes moved: the content
    # ledger's digests and the output comparison see these, no count does.
    names.FAULT_CORRUPT_LOAD: frozenset({"content-matches", "replay-output-identical"}),
    names.FAULT_DROP_STORE: frozenset({"content-matches", "replay-output-identical"}),
    names.FAULT_NO_LOAD: frozenset({"content-matches", "replay-output-identical"}),
    # Only the first KV-cache group moved (and honestly counted).
    names.FAULT_PARTIAL_STORE: frozenset(
        {"content-matches", "cold-stored-bytes", "replay-output-identical"}
    ),
    names.FAULT_PARTIAL_LOAD: frozenset(
        {"content-matches", "replay-loaded-bytes", "replay-output-identical"}
    ),
    # The right bytes moved, twice as many reported: only the load counter check sees it.
    names.FAULT_OVERCOUNT_LOAD: frozenset({"replay-loaded-bytes"}),
    # Another chunk's KV loaded, success and the right bytes reported.
    names.FAULT_LOAD_NEIGHBOUR: frozenset({"content-matches", "replay-output-identical"}),
    # The worker dies on its next step: the round trip fails as a whole.
    names.FAULT_SEGV: frozenset({"engine-survived"}),
}
"""The checks each fault must fail, exactly, on a model with at least two KV-cache groups
(Llama 4: chunked-local and full). One group leaves a partial fault nothing to leave out."""

DEFAULT_FAULTS: tuple[str, ...] = names.FAULTS
"""The clean round first (a server that fails clean proves nothing), the killing fault last."""

PARTIAL = (names.FAULT_PARTIAL_STORE, names.FAULT_PARTIAL_LOAD)
# Rounds use seeds base, base + SEED_STRIDE, ...: targets take seed s and fillers s + 1.
SEED_STRIDE = 2


@dataclass
class Round:
    """One fault's round trip and its verdict."""

    index: int
    fault: str
    expected: frozenset[str]
    seed: int | None = None  # the round's prompts (targets seed, fillers seed + 1)
    result: rt.RoundtripResult | None = None
    status: str = "pending"  # pending | passed | caught | missed | not-applicable | not-run
    reason: str = ""

    @property
    def failing(self) -> frozenset[str] | None:
        if self.result is None or not self.result.checks:
            return None
        return frozenset(c.name for c in self.result.checks if not c.passed)

    @property
    def matched(self) -> bool:
        return self.status in ("passed", "caught", "not-applicable")

    def record(self) -> dict[str, Any]:
        failing = self.failing
        return {
            "round": self.index,
            "fault": self.fault,
            "status": self.status,
            "expected_failing": " ".join(sorted(self.expected)),
            "failing": "" if failing is None else " ".join(sorted(failing)),
            "missed": " ".join(sorted(self.expected - (failing or frozenset()))),
            "unexpected": " ".join(sorted((failing or frozenset()) - self.expected)),
            "seed": self.seed,
            "reason": self.reason,
        }


def judge(rnd: Round) -> None:
    """Caught when the failing checks are exactly the fault's, missed otherwise (the
    clean round: passed when nothing fails)."""
    failing = rnd.failing
    if failing is None:
        rnd.status, rnd.reason = "not-run", rnd.reason or "the round produced no checks"
        return
    if failing == rnd.expected:
        # The clean round has nothing to catch: it passes.
        rnd.status = "caught" if rnd.expected else "passed"
        return
    rnd.status = "missed"
    parts = []
    if rnd.expected - failing:
        parts.append("did not fail: " + ", ".join(sorted(rnd.expected - failing)))
    if failing - rnd.expected:
        parts.append("failed too: " + ", ".join(sorted(failing - rnd.expected)))
    rnd.reason = "; ".join(parts)


@dataclass
class SweepPlan:
    """The server (planned once, with the control file) and one round per fault."""

    base: rt.RoundtripPlan
    faults: list[str]
    control_path: Path
    plans: list[rt.RoundtripPlan] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "faults": self.faults,
            "fault_control": str(self.control_path),
            "seeds": [p.scenario.workload.seed for p in self.plans],
            "server": self.base.describe(),
        }


def parse_faults(chosen: Sequence[str] | None) -> list[str]:
    """The faults to run, in order; unknown names and repeated faults are refused. The
    clean round may repeat: ``--fault none`` N times is a soak, N clean round trips on one
    server, each with its own prompts, over a CPU tier the earlier rounds filled."""
    faults = list(chosen) if chosen else list(DEFAULT_FAULTS)
    unknown = [f for f in faults if f not in CAUGHT_BY]
    if unknown:
        raise BadInput(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(CAUGHT_BY)}")
    seeded = [f for f in faults if f != "none"]
    if len(set(seeded)) != len(seeded):
        raise BadInput("each seeded fault may be listed once (only none may repeat)")
    if names.FAULT_SEGV in faults[:-1]:
        raise BadInput(f"{names.FAULT_SEGV} kills the server: list it last")
    return faults


def plan_sweep(
    scn: RoundtripScenario,
    faults: list[str],
    control_path: Path,
    **options: Unpack[rt.RoundtripOptions],
) -> SweepPlan:
    """One server plan with a fault control file, and a round-trip plan per fault."""
    if scn.fault != "none":
        raise BadInput(
            f"scenario {scn.name} fixes fault = {scn.fault!r}; the sweep sets faults itself"
        )
    if options.get("fault") not in (None, "none") or options.get("fault_control"):
        raise BadInput("the faults sweep sets each round's fault itself")
    choices: rt.RoundtripOptions = {**options, "fault_control": str(control_path)}
    base = rt.plan_roundtrip(scn, **choices)
    sweep = SweepPlan(base, faults, control_path)
    for i, fault in enumerate(faults):
        s = copy.deepcopy(base.scenario)
        s.workload.seed = base.scenario.workload.seed + SEED_STRIDE * i
        targets, _ = make_prompts(s.workload.target_tokens, 1, 0, base.vocab_size, s.workload.seed)
        # Same lengths, so the same expected figures; only the prompts and the fault differ.
        sweep.plans.append(dataclasses.replace(base, scenario=s, targets=targets, fault=fault))
    return sweep


def control_path() -> Path:
    """A fresh path for the fault control file (``harness.server.control_files``)."""
    return control_files.control_path("faults")


write_control = control_files.write_control


def execute_faults(
    sweep: SweepPlan,
    out_dir: Path,
    reporter: rt.RoundtripReporter,
    on_round: Callable[[list[Round]], None],
    *,
    port: int | None = None,
) -> list[Round]:
    """Launch once, then one round trip per fault; every round judged as it ends, its
    files in ``rounds/NN-fault/`` (a roundtrip run's files, ending with its verdict)."""
    rounds = [
        Round(i, f, CAUGHT_BY[f], seed=p.scenario.workload.seed)
        for i, (f, p) in enumerate(zip(sweep.faults, sweep.plans, strict=True))
    ]
    base = sweep.base
    assert base.server is not None
    sweep.control_path.parent.mkdir(parents=True, exist_ok=True)
    write_control(sweep.control_path, names.FAULT_NONE)
    server = base.server.server(out_dir / "logs" / "server.log", port)
    try:
        rt.start_server(server, base.scenario.server, reporter, "server")
        ep = rt.Endpoint(server.url, server)
        alive = True
        for rnd, plan in zip(rounds, sweep.plans, strict=True):
            result = rt.RoundtripResult(plan)
            rt.read_engine_layout(plan, result, server.log_path)
            groups = len(result.engine_groups or [])
            if rnd.fault in PARTIAL and groups and groups < 2:
                rnd.status = "not-applicable"
                rnd.reason = f"the engine built {groups} KV-cache group: nothing to leave out"
            elif not alive:
                rnd.status, rnd.reason = "not-run", "the server died in an earlier round"
            else:
                reporter.status(f"round {rnd.index}: fault {rnd.fault}")
                write_control(sweep.control_path, rnd.fault)
                rnd.result = result
                writer = part_writer(round_dir(out_dir, rnd), plan, fault=rnd.fault)
                metrics_dir = round_dir(out_dir, rnd) / "metrics"
                alive = rt.run_round(plan, ep, result, reporter, writer, metrics_dir)
                judge(rnd)
                writer.run_dir.finish(
                    "finished",
                    int(ExitCode.OK if rnd.matched else ExitCode.MISMATCH),
                    passed=result.passed,
                    fault_verdict=rnd.record(),
                )
                reporter.status(f"round {rnd.index}: {rnd.fault} {rnd.status} {rnd.reason}")
            on_round(rounds)
    finally:
        server.stop()
        shutil.rmtree(sweep.control_path.parent, ignore_errors=True)
    return rounds


def _slug(rnd: Round) -> str:
    return f"{rnd.index:02d}-{rnd.fault}"


def round_dir(out_dir: Path, rnd: Round) -> Path:
    """Where a round's round-trip files go (the same files a ``roundtrip`` run writes)."""
    return out_dir / "rounds" / _slug(rnd)


# --- its files: faults.csv (a row per round), junit.xml, report.md ---------------------
FAULT_ROUNDS = TableFile(
    "faults.csv",
    (
        "round",
        "fault",
        "status",
        "expected_failing",
        "failing",
        "missed",
        "unexpected",
        "seed",
        "reason",
    ),
    # A soak repeats the clean round: a round is its number and its fault.
    key=("round", "fault"),
    compared=("status", "failing"),
    outcomes=("status",),
    junit=JUnitMap(
        "faults",
        "{fault}",
        lambda r: None if r.matched else f"{r.status}: {r.reason}",
        properties=("expected_failing",),
    ),
    shown=("round", "fault", "status", "expected_failing", "failing", "reason"),
    display=("round", "fault", "must fail", "failed", "verdict", "why"),
)
FAULTS_KIND = register(
    ResultsKind(
        "faults",
        (FAULT_ROUNDS,),
        ("junit.xml", "report.md", "logs/server.log", "rounds/<NN>-<fault>/"),
    )
)


def write_faults(run_dir: RunDirectory, rounds: Sequence[Any], meta: dict[str, Any]) -> None:
    FAULT_ROUNDS.write(run_dir, [r.record() for r in rounds])
    FAULT_ROUNDS.write_junit(run_dir, "faults", rounds)
    run_dir.write_text(
        "report.md", faults_report(rounds, {"results_dir": str(run_dir.path), **meta})
    )


def faults_report(rounds: Sequence[Any], meta: dict[str, Any]) -> str:
    """``report.md`` of a fault sweep: one row per fault, the failing checks beside the
    ones the fault is for."""
    bad = [r for r in rounds if not r.matched]
    verdict = (
        "every fault caught by exactly its checks" if not bad else f"{len(bad)} NOT as expected"
    )
    lines = [
        f"# offload-check faults: {verdict}",
        "",
        f"- one server: `{meta.get('model', '')}` (variant `{meta.get('variant', '')}`)",
        f"- results: `{meta.get('results_dir', '')}`",
        "",
    ]
    rows = []
    for r in rounds:
        rec = r.record()
        rows.append(
            [
                rec["round"],
                rec["fault"],
                rec["expected_failing"] or "(none)",
                rec["failing"] or ("(none)" if r.failing is not None else "-"),
                rec["status"] if r.matched else f"**{rec['status']}**",
                rec["reason"],
            ]
        )
    lines.append(table(FAULT_ROUNDS.display, rows))
    return "\n".join(lines) + "\n"
