"""What a mutation session writes, rewritten after every verdict: ``mutants.csv``,
``junit.xml`` and ``report.md`` (the score, survivors first). The table and the session's
section of the CI summary are registered here (``harness.results.tables.register``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results import ci_summary as ci
from harness.results.records import MutantRecord
from harness.results.run_directory import RunDirectory
from harness.results.tables import JUnitMap, ResultsKind, TableFile, record_fields, register

MUTANTS = TableFile(
    "mutants.csv",
    record_fields(MutantRecord),
    key=("id",),
    compared=("verdict", "reached"),
    outcomes=("verdict",),
    shown=("id", "line", "function", "operator", "verdict", "command", "reached"),
    display=("id", "line", "function", "change", "verdict", "command", "reached"),
    junit=JUnitMap(
        "mutate.{target}",
        "{id} line {line} {operator}",
        lambda m: (
            f"survived ({'reached by ' + m.reached if m.reached else 'never reached'}): {m.change}"
            if m.verdict == "survived"
            else None
        ),
        stdout="{change}\nverdict={verdict} command={command} failed={failed}\n{detail}",
        properties=("verdict", "command", "reached"),
        seconds="seconds",
    ),
)
MAX_SURVIVORS = 50  # rows in the CI summary; report.md and mutants.csv list every one


def summary_section(run_dir: Path, run: dict[str, Any]) -> list[str]:
    """The score, then the survivors: reached ones first (a change no check noticed),
    then the unreached (a line no workload runs)."""
    frame, problem = ci.read_csv(run_dir / MUTANTS.name)
    raw_plan, raw_score = run.get("plan"), run.get("mutate")
    plan = raw_plan if isinstance(raw_plan, dict) else {}
    score = raw_score if isinstance(raw_score, dict) else {}
    passed = run.get("passed") if isinstance(run.get("passed"), bool) else None
    raw_commands = plan.get("commands")
    commands = raw_commands if isinstance(raw_commands, list) else []
    facts = [
        f"`{plan.get('target', '?')}` of vLLM {plan.get('vllm_version', '?')}",
        "through " + (", ".join(str(c) for c in commands) or "?"),
    ]
    shard = plan.get("shard")
    if isinstance(shard, list) and len(shard) == 2:
        facts.append(f"shard {shard[0]}/{shard[1]}")
    if isinstance(run.get("merged"), list):
        facts.append(f"merged from {len(run['merged'])} shard run(s)")
    if score.get("summary"):
        facts.append(f"score: {score['summary']}")
    lines = ci.headline(run_dir, run, ci.verdict(run, passed), "; ".join(facts))
    if problem:
        return [*lines, problem, ""]
    assert frame is not None
    if not len(frame):
        return [*lines, f"_`{MUTANTS.name}` has no rows yet._", ""]
    verdicts = ci.column(frame, "verdict")
    counts = verdicts.replace("", "not run").value_counts()
    lines += ["Verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())), ""]
    survivors = [r for _, r in frame.iterrows() if ci.col(r, "verdict") == "survived"]
    survivors.sort(
        key=lambda r: (
            not ci.col(r, "reached"),
            int(ci.col(r, "line")) if ci.col(r, "line").isdigit() else 0,
        )
    )
    lines += ["### Survivors", ""]
    if not survivors:
        lines.append("None.")
    else:
        rows = [
            [
                ci.col(r, "id"),
                ci.col(r, "line"),
                ci.col(r, "function"),
                ci.col(r, "change"),
                ci.col(r, "reached") or "not reached",
            ]
            for r in survivors[:MAX_SURVIVORS]
        ]
        lines += ci.table(["id", "line", "function", "change", "reached by"], rows)
        if len(survivors) > MAX_SURVIVORS:
            lines += ["", f"_and {len(survivors) - MAX_SURVIVORS} more in `report.md`._"]
    if (run_dir / "report.md").is_file():
        lines += ["", f"Files: full report `{run_dir / 'report.md'}`."]
    return [*lines, ""]


MUTATE = register(
    ResultsKind(
        "mutate",
        (MUTANTS,),
        (
            "session.sqlite",
            "junit.xml",
            "report.md",
            "baseline/<command>/",
            "mutants/<id>/<command>/",
        ),
        summary=summary_section,
    )
)

DETECTED = ("killed", "timeout")  # a mutant that hangs the engine was noticed
# Checks that say the engine died, raised or could not be driven, not what it did: a kill
# by these alone is a dead engine's, where any other check is an accounting, content or
# output check that judged what a living engine did.
ENGINE_CHECKS = frozenset(
    {
        "engine-survived",
        "engine-log-clean",
        "engine-fatal",
        "engine-failed",
        "no-request-errored",
        "ran",
    }
)
BY_CHECK, BY_ENGINE, BY_STALL = "check", "engine", "stall"
NOT_SCORED = ("incompetent", "equivalent", "")  # never a real change of behaviour, or not run


def records(session: Any) -> list[MutantRecord]:
    """Every mutant of the session with its verdict so far, in source order."""
    verdicts = {v["job_id"]: v for v in session.verdicts()}
    out = []
    for m in session.mutants():
        v = verdicts.get(m.id, {})
        out.append(
            MutantRecord(
                id=m.id,
                target=m.module,
                line=m.line,
                function=m.function or "",
                operator=m.operator,
                change=f"`{m.before}` -> `{m.after}`",
                verdict=v.get("verdict", ""),
                command=v.get("command", ""),
                failed=v.get("failed", ""),
                detail=v.get("detail", ""),
                reached=v.get("reached", ""),
                seconds=float(v.get("seconds") or 0.0),
            )
        )
    return out


def detected_by(row: MutantRecord) -> str:
    """How a detected mutant was noticed: ``check`` when an accounting, content or output
    check named it (one beside an engine check counts: the engine lived long enough to be
    judged), ``engine`` when only a dead engine or a refused run did (no check named, or
    only ``ENGINE_CHECKS``), ``stall`` past the time limit."""
    if row.verdict == "timeout":
        return BY_STALL
    names = {f.split(" (")[0].removesuffix(" passed").strip() for f in row.failed.split(",")}
    return BY_CHECK if names - ENGINE_CHECKS - {""} else BY_ENGINE


@dataclass(frozen=True)
class Score:
    """Killed (and timed out) over every mutant that really changed behaviour."""

    detected: int
    scored: int
    survived: int
    survived_reached: int
    by_verdict: dict[str, int]
    by_command: dict[str, int]
    by_kind: dict[str, int]  # ``detected_by``: check / engine / stall

    @property
    def value(self) -> float | None:
        return self.detected / self.scored if self.scored else None

    def text(self) -> str:
        if self.value is None:
            return "no mutant judged yet"
        return (
            f"{self.detected}/{self.scored} detected ({self.value:.0%}), "
            f"{self.by_kind.get(BY_CHECK, 0)} by an accounting or output check; "
            f"{self.survived} survived, {self.survived_reached} of them on lines a run executed"
        )


def score(rows: Sequence[MutantRecord]) -> Score:
    verdicts = Counter(r.verdict for r in rows)
    scored = [r for r in rows if r.verdict not in NOT_SCORED]
    survivors = [r for r in scored if r.verdict == "survived"]
    return Score(
        detected=sum(1 for r in scored if r.verdict in DETECTED),
        scored=len(scored),
        survived=len(survivors),
        survived_reached=sum(1 for r in survivors if r.reached),
        by_verdict=dict(sorted(verdicts.items())),
        by_command=dict(Counter(r.command for r in scored if r.verdict in DETECTED)),
        by_kind=dict(Counter(detected_by(r) for r in scored if r.verdict in DETECTED)),
    )


KIND_WORDS = {
    BY_CHECK: "an accounting or output check",
    BY_ENGINE: "a dead engine or a refused run",
    BY_STALL: "a stall",
}


def report_md(rows: Sequence[MutantRecord], meta: dict[str, Any]) -> str:
    """Survivors first (reached ones before unreached: those are the checks' misses),
    then every mutant."""
    s = score(rows)
    lines = [
        f"# mutate: {meta.get('target', '?')}",
        "",
        f"- build: vLLM {meta.get('vllm_version', '?')} (`{meta.get('python', '')}`)",
        f"- commands: {', '.join(meta.get('commands', []))}",
        f"- mutants: {len(rows)} of the file's {meta.get('total_mutants', '?')} "
        + (
            f"(sample of {meta['sample']}, seed {meta.get('seed')})"
            if meta.get("sample")
            else "(all)"
            if len(rows) == meta.get("total_mutants")
            else "(chosen by id)"
        ),
        f"- score: {s.text()}",
        "- verdicts: " + ", ".join(f"{k or 'not run'} {n}" for k, n in s.by_verdict.items()),
        "- detected by: "
        + (", ".join(f"{k} {n}" for k, n in sorted(s.by_command.items())) or "none"),
        "- how: "
        + (
            ", ".join(f"{KIND_WORDS[k]} {n}" for k, n in sorted(s.by_kind.items()))
            or "nothing detected"
        ),
        "",
        "## Survivors",
        "",
        "A survivor on a line some run executed is a change no check noticed; one on a "
        "line no run executed needs a workload that reaches it first.",
        "",
    ]
    survivors = sorted(
        (r for r in rows if r.verdict == "survived"), key=lambda r: (not r.reached, r.line)
    )
    if survivors:
        lines += ["| id | line | function | change | reached by |", "|---|---|---|---|---|"]
        lines += [
            f"| {r.id} | {r.line} | {r.function} | {r.change} | {r.reached or 'not reached'} |"
            for r in survivors
        ]
    else:
        lines.append("None.")
    lines += [
        "",
        "## Every mutant",
        "",
        "| id | line | operator | change | verdict | by | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.id} | {r.line} | {r.operator} | {r.change} | {r.verdict or 'not run'} | "
        f"{r.command} | {r.failed or r.detail[:80]} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def write_mutate(run_dir: RunDirectory, session: Any) -> Score:
    """Every file from the session as it stands."""
    rows = records(session)
    MUTANTS.write(run_dir, [r.record() for r in rows])
    MUTANTS.write_junit(run_dir, "mutate", rows)
    run_dir.write_text("report.md", report_md(rows, session.meta))
    s = score(rows)
    run_dir.update_meta(
        mutate={"score": s.value, "summary": s.text(), "detected_by": s.by_kind, **s.by_verdict}
    )
    return s
