"""The session store: one sqlite file a mutation run can stop, resume, shard and merge.

The file is a cosmic-ray work database (``WorkDB``: one work item per mutant, one result
per judged mutant), so cosmic-ray's own readers (``cr-report``, ``cr-html``) can open it,
plus three tables of our own in the same file: ``session_meta`` (what the session is of:
target, relpath, source_sha256, vllm version, operators, commands, seed, sample),
``mutants`` (each Mutant's full record; a MutationSpec has no room for the module, the
lines before and after) and ``verdicts`` (our richer judgement; it is the source of truth
for what is still pending).

Job ids are ``Mutant.id``, deterministic, so CI runners that each create the same session
and run one shard (``pending((i, n))``) hold databases ``merge`` can join back into one.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from cosmic_ray.work_db import WorkDB  # type: ignore[import-untyped]
from cosmic_ray.work_item import (  # type: ignore[import-untyped]
    MutationSpec,
    TestOutcome,
    WorkerOutcome,
    WorkItem,
    WorkResult,
)

from harness.commands.mutate.mutants import Mutant
from harness.errors import BadInput

VERDICTS = ("killed", "survived", "timeout", "incompetent", "equivalent")
VERDICT_FIELDS = ("command", "failed", "detail", "seconds", "reached", "diff")

# How each verdict reads to cosmic-ray's tools. A timeout is KILLED with output "timeout"
# (cosmic-ray's own convention in testing.run_tests); an equivalent mutant cannot be
# killed by any test, so it is SURVIVED, marked in the output.
_OUTCOMES = {
    "killed": TestOutcome.KILLED,
    "timeout": TestOutcome.KILLED,
    "survived": TestOutcome.SURVIVED,
    "incompetent": TestOutcome.INCOMPETENT,
    "equivalent": TestOutcome.SURVIVED,
}

_SCHEMA = """
CREATE TABLE session_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE mutants (job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE verdicts (
    job_id TEXT PRIMARY KEY, verdict TEXT NOT NULL, command TEXT, failed TEXT, detail TEXT,
    seconds REAL, reached TEXT, diff TEXT
);
"""


class Session:
    """One mutation session's file, open for reading and recording verdicts."""

    def __init__(self, path: Path) -> None:
        """Use ``Session.create`` or ``Session.open``."""
        self.path = path
        self._work = WorkDB(str(path), WorkDB.Mode.open)
        self._db = sqlite3.connect(path, timeout=60)

    @classmethod
    def create(cls, path: Path, mutants: Sequence[Mutant], meta: dict[str, Any]) -> Session:
        """A new session of these mutants; an existing file is refused, never overwritten
        (it may hold hours of verdicts)."""
        path = Path(path)
        if path.exists():
            raise BadInput(f"mutate session {path} exists (open it to resume, or remove it)")
        ids = [m.id for m in mutants]
        if len(set(ids)) != len(ids):
            raise ValueError("mutant ids are not unique")
        path.parent.mkdir(parents=True, exist_ok=True)
        WorkDB(str(path), WorkDB.Mode.create).close()
        session = cls(path)
        with session._db:
            session._db.executescript(_SCHEMA)
            session._db.executemany(
                "INSERT INTO session_meta VALUES (?, ?)",
                [(k, json.dumps(v, sort_keys=True)) for k, v in meta.items()],
            )
            session._db.executemany(
                "INSERT INTO mutants VALUES (?, ?, ?)",
                [(m.id, i, json.dumps(m.record())) for i, m in enumerate(mutants)],
            )
        session._work.add_work_items([_work_item(m) for m in mutants])
        return session

    @classmethod
    def open(cls, path: Path) -> Session:
        """An existing session, to resume or read."""
        path = Path(path)
        if not path.is_file():
            raise BadInput(f"mutate session {path} does not exist")
        try:
            with sqlite3.connect(path) as db:
                names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        except sqlite3.DatabaseError as err:
            raise BadInput(f"{path} is not a mutate session ({err})") from err
        if not {"session_meta", "mutants", "verdicts", "work_items"} <= names:
            raise BadInput(f"{path} is not a mutate session (no session_meta/mutants tables)")
        return cls(path)

    @property
    def meta(self) -> dict[str, Any]:
        rows = self._db.execute("SELECT key, value FROM session_meta ORDER BY key")
        return {k: json.loads(v) for k, v in rows}

    def mutants(self) -> list[Mutant]:
        """Every mutant of the session, in the order it was created with."""
        rows = self._db.execute("SELECT record FROM mutants ORDER BY seq")
        return [Mutant(**json.loads(r)) for (r,) in rows]

    def pending(self, shard: tuple[int, int] | None = None) -> list[Mutant]:
        """Mutants without a verdict yet; with ``shard=(i, n)`` only the i-th of n disjoint
        parts (by id, so every runner agrees without talking to the others)."""
        if shard is not None:
            i, n = shard
            if n < 1 or not 0 <= i < n:
                raise BadInput(f"mutate shard {i}/{n}: need 0 <= index < count")
        rows = self._db.execute(
            "SELECT record FROM mutants WHERE job_id NOT IN (SELECT job_id FROM verdicts)"
            " ORDER BY seq"
        )
        found = [Mutant(**json.loads(r)) for (r,) in rows]
        if shard is None:
            return found
        return [m for m in found if int(m.id, 16) % shard[1] == shard[0]]

    def record(
        self,
        mutant_id: str,
        verdict: str,
        *,
        command: str = "",
        failed: str = "",
        detail: str = "",
        seconds: float = 0.0,
        reached: str = "",
        diff: str = "",
    ) -> None:
        """A mutant's verdict (a second one replaces the first), in our table and as
        cosmic-ray's WorkResult."""
        row: dict[str, Any] = {"job_id": mutant_id, "verdict": verdict, "command": command}
        row |= {"failed": failed}
        row |= {"detail": detail, "seconds": seconds, "reached": reached, "diff": diff}
        self._store([row])

    def _store(self, rows: Sequence[dict[str, Any]]) -> None:
        """Verdict rows (job_id, verdict, VERDICT_FIELDS) checked, then written: results one
        by one (WorkDB has no bulk call for distinct results), ours in one transaction."""
        for row in rows:
            if row["verdict"] not in VERDICTS:
                raise BadInput(
                    f"unknown mutate verdict {row['verdict']!r} (one of {', '.join(VERDICTS)})"
                )
            known = self._db.execute("SELECT 1 FROM mutants WHERE job_id = ?", (row["job_id"],))
            if known.fetchone() is None:
                raise BadInput(f"mutant {row['job_id']} is not in session {self.path}")
        for row in rows:
            self._work.set_result(row["job_id"], _work_result(row))
        keys = ("job_id", "verdict", *VERDICT_FIELDS)
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [tuple(row[k] for k in keys) for row in rows],
            )

    def verdicts(self) -> list[dict[str, Any]]:
        """Every verdict so far, in mutant order: job_id, verdict and VERDICT_FIELDS."""
        rows = self._db.execute(
            "SELECT v.job_id, v.verdict, v.command, v.failed, v.detail, v.seconds, v.reached,"
            " v.diff FROM verdicts v JOIN mutants m ON m.job_id = v.job_id ORDER BY m.seq"
        )
        keys = ("job_id", "verdict", *VERDICT_FIELDS)
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def check_source(self, sha256: str) -> None:
        """Refuse to go on if the target file changed since the session began: cosmic-ray's
        occurrence numbers would then name other positions (or none)."""
        began = self.meta.get("source_sha256")
        if began is None:
            raise BadInput(f"mutate session {self.path} records no source_sha256")
        if began != sha256:
            target = self.meta.get("relpath", "the target")
            raise BadInput(
                f"{target} changed since session {self.path} began "
                f"(sha256 {began[:12]} then, {sha256[:12]} now): start a new session"
            )

    def close(self) -> None:
        self._db.close()
        self._work.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _work_result(row: dict[str, Any]) -> Any:
    """A verdict as cosmic-ray's result: the output is the verdict for a timeout or an
    equivalent mutant (what cosmic-ray's tools show), else what the run said."""
    verdict = row["verdict"]
    output = verdict if verdict in ("timeout", "equivalent") else row["detail"] or row["failed"]
    return WorkResult(
        worker_outcome=WorkerOutcome.NORMAL,
        test_outcome=_OUTCOMES[verdict],
        output=output,
        diff=row["diff"] or None,
    )


def _work_item(m: Mutant) -> Any:
    """The mutant as cosmic-ray's work item. Mutant keeps only where a mutation starts;
    end_pos is one column on (cosmic-ray's line filters read end_pos's line: the same)."""
    spec = MutationSpec(
        module_path=m.relpath,
        operator_name=m.operator,
        occurrence=m.occurrence,
        start_pos=(m.line, m.col),
        end_pos=(m.line, m.col + 1),
        definition_name=m.function,
    )
    return WorkItem.single(m.id, spec)


def merge(paths: Sequence[Path], out: Path) -> Session:
    """One session from shards of the same session (same meta, same mutants): verdicts
    unioned; one mutant judged two different ways is refused, naming it."""
    if not paths:
        raise BadInput("mutate merge: no sessions given")
    sessions = [Session.open(p) for p in paths]
    try:
        first = sessions[0]
        meta, mutants = first.meta, first.mutants()
        ids = [m.id for m in mutants]
        by_id = dict(zip(ids, mutants, strict=True))
        chosen: dict[str, tuple[dict[str, Any], Path]] = {}
        for s in sessions:
            if s.meta != meta:
                keys = sorted(k for k in {*meta, *s.meta} if meta.get(k) != s.meta.get(k))
                raise BadInput(
                    f"mutate merge: {s.path} is another session than {first.path} "
                    f"(differs in {', '.join(keys)})"
                )
            if [m.id for m in s.mutants()] != ids:
                raise BadInput(f"mutate merge: {s.path} has other mutants than {first.path}")
            for v in s.verdicts():
                seen = chosen.get(v["job_id"])
                if seen is None:
                    chosen[v["job_id"]] = (v, s.path)
                elif seen[0]["verdict"] != v["verdict"]:
                    m = by_id[v["job_id"]]
                    raise BadInput(
                        f"mutate merge: mutant {m.id} ({m.one_line()}) is {seen[0]['verdict']} "
                        f"in {seen[1]} but {v['verdict']} in {s.path}"
                    )
    finally:
        for s in sessions:
            s.close()
    merged = Session.create(out, mutants, meta)
    merged._store([chosen[job_id][0] for job_id in ids if job_id in chosen])
    return merged
