"""Scripted bug triggers: a few requests and admin calls on one server, each fact named.

Some upstream bugs show in no crash-repro row, matrix cell or round trip: a counter that
moves when it must not, an admin call that answers success and does nothing, a second
request that finds the engine in a state the first one left. A bug entry with a
``steps`` trigger spells that sequence as data (``harness.scenario.schema.Step``; the kinds are
documented in ``docs/bugs.md``), on a server whose model, engine and offload settings
come from a round-trip scenario. Each ``expect`` step is one named check, healthy
behaviour stated positively, so an affected build fails exactly the checks the entry's
symptom names and a fixed one passes them all.

Metrics are snapshotted before every step, so an ``expect`` can take a counter's change
since any named step began; asynchronous stores are let settle first.
"""

from __future__ import annotations

import json
import math
import operator
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands import sweep
from harness.commands.bugs.files import BUG_STEPS
from harness.commands.bugs.groups import EntryGroup
from harness.commands.roundtrip.files import CHECKS
from harness.commands.sweep import ERROR, Job
from harness.errors import BadInput, HarnessError
from harness.results.records import CheckResult, StepRecord, SweepCell
from harness.scenario.schema import BugEntry, RoundtripScenario, Step, StepsTrigger, load_roundtrip
from harness.server import metrics
from harness.server.launcher import http_post
from harness.server.workload import FIRST_ORDINARY_ID, Completion, Prompt, complete, make_fillers

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripPlan
    from harness.commands.roundtrip.run import Endpoint

OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
# expect quantities read from the metrics, by their name in metrics.Snapshot
COUNTER_OF = {
    "external_hits": "ext_hits",
    "external_queries": "ext_queries",
    "gpu_hits": "gpu_hits",
    "gpu_queries": "gpu_queries",
    "stored_bytes": "stored_bytes",
    "loaded_bytes": "loaded_bytes",
    "prompt_tokens": "prompt_tokens",
}


# --- checking a script before any launch ----------------------------------------------------
# The fields each step kind reads (docs/bugs.md); another one set is a mistake to refuse.
STEP_FIELDS = {
    "send": {"prompt", "tokens", "prefix", "prefix_tokens", "max_tokens", "prompt_logprobs"}
    | {"concurrent", "background", "after", "abort"},
    "evict": {"pools"},
    "settle": set(),
    "reset-prefix-cache": {"query"},
    "expect": {"what", "since", "of", "op", "value", "why"},
}


def check_script(entry: BugEntry) -> None:
    """Refuse a script that could not run as written, with one line naming the step:
    a prompt used before it is defined, a ``since`` naming no earlier step, an expect
    without a quantity, a symptom naming no expect."""
    trig = _steps(entry)
    lengths: dict[str, int] = {}
    names: list[str] = []
    expects: list[str] = []
    sends: list[str] = []
    for i, s in enumerate(trig.steps, 1):
        where = f"{entry.source}: step {i} ({s.do})"
        stray = sorted(s.model_fields_set - STEP_FIELDS[s.do] - {"do", "name"})
        if stray:
            raise BadInput(f"{where}: {stray[0]} is not a field of {s.do} steps")
        if s.name and s.name in names:
            raise BadInput(f"{where}: name {s.name!r} is used twice")
        if s.do == "send":
            if s.prompt is None:
                raise BadInput(f"{where}: a send needs a prompt name")
            if s.prompt not in lengths and s.tokens is None:
                raise BadInput(f"{where}: prompt {s.prompt!r} is new, so it needs tokens")
            if s.prompt in lengths and s.tokens not in (None, lengths[s.prompt]):
                raise BadInput(f"{where}: prompt {s.prompt!r} already has {lengths[s.prompt]}")
            if s.prefix is not None:
                if s.prefix not in lengths:
                    raise BadInput(f"{where}: prefix {s.prefix!r} is no earlier prompt")
                n = s.prefix_tokens or lengths[s.prefix]
                if n > lengths[s.prefix] or n > (s.tokens or 0):
                    raise BadInput(f"{where}: prefix_tokens {n} is longer than a prompt")
            if s.after is not None and s.after not in sends:
                raise BadInput(f"{where}: after {s.after!r} names no earlier send")
            if s.after is not None and s.concurrent != 1:
                raise BadInput(f"{where}: a next turn (after) is one request, not concurrent")
            if s.abort is not None and (s.concurrent != 1 or s.background or s.after):
                raise BadInput(f"{where}: an aborted send is one request of its own, waited for")
            lengths.setdefault(s.prompt, s.tokens or 0)
            sends.append(s.name or "")
        if s.do == "expect":
            if s.name is None:
                raise BadInput(f"{where}: an expect needs a name (the check it is)")
            if s.what is None:
                raise BadInput(f"{where}: an expect needs what (the quantity)")
            if s.what == "same_output":
                if len(s.of) != 2 or any(o not in sends for o in s.of):
                    raise BadInput(f"{where}: same_output needs of = two named earlier sends")
            elif s.value is None:
                raise BadInput(f"{where}: an expect needs a value")
            if s.since is not None and s.since not in names:
                raise BadInput(f"{where}: since {s.since!r} names no earlier step")
            expects.append(s.name)
        if s.name:
            names.append(s.name)
    missing = [c for c in entry.symptom.failing_checks if c not in expects]
    if missing:
        raise BadInput(f"{entry.source}: symptom names {missing[0]!r}, which no expect step is")


def _steps(entry: BugEntry) -> StepsTrigger:
    return entry.trigger_as(StepsTrigger)


def scenario_for(entry: BugEntry) -> RoundtripScenario:
    """The round-trip scenario the script's server comes from, with the entry's changes."""
    trig = _steps(entry)
    scn = load_roundtrip(entry.resolve(trig.scenario))
    server = scn.server.model_copy(update={"env": {**scn.server.env, **trig.env}})
    update: dict[str, Any] = {"server": server}
    if trig.geometry is not None:
        update["geometry"] = str(entry.resolve(trig.geometry))
    offload: dict[str, Any] = {}
    if trig.offload_block_size is not None:
        offload["block_size"] = trig.offload_block_size
    if trig.offload_config:
        offload["extra_config"] = {**scn.offload.extra_config, **trig.offload_config}
    if offload:
        update["offload"] = scn.offload.model_copy(update=offload)
    return scn.model_copy(update=update)


# --- prompts ------------------------------------------------------------------------------------
def prompt_tokens(name: str, n: int, vocab_size: int, seed: int, entry: str = "") -> list[int]:
    """A named prompt's tokens: the same for the same entry and name on every build and
    run, from the lower half of the vocabulary (the evictions' filler takes the upper
    half). The entry's id is part of the seed, so two entries' prompts of one name never
    share a prefix when they run on one server."""
    mid = (FIRST_ORDINARY_ID + vocab_size) // 2
    rng = random.Random(zlib.crc32(f"{entry}/{name}".encode()) + seed)
    return [rng.randrange(FIRST_ORDINARY_ID, mid) for _ in range(n)]


def build_prompts(
    steps: list[Step], vocab_size: int, seed: int, entry: str = ""
) -> dict[str, Prompt]:
    """Every prompt the script sends; one with a ``prefix`` starts with that prompt's
    first ``prefix_tokens`` tokens and goes on with its own."""
    out: dict[str, Prompt] = {}
    for s in steps:
        if s.do != "send" or s.prompt is None or s.prompt in out:
            continue
        n = s.tokens or 0
        own = prompt_tokens(s.prompt, n, vocab_size, seed, entry)
        if s.prefix is not None:
            head = out[s.prefix].token_ids[: s.prefix_tokens or len(out[s.prefix].token_ids)]
            own = head + own[len(head) :]
        out[s.prompt] = Prompt(s.prompt, "target", own)
    return out


# --- running --------------------------------------------------------------------------------
@dataclass
class Script:
    """A script's run on one server: its steps so far, the requests, the checks."""

    plan: RoundtripPlan
    prompts: dict[str, Prompt]
    records: list[StepRecord] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    sent: dict[str, list[Completion]] = field(default_factory=dict)  # by send name
    before: dict[str, metrics.Snapshot] = field(default_factory=dict)  # by step name
    checks: list[CheckResult] = field(default_factory=list)
    pending: list[tuple[str, list[Future[Completion]]]] = field(default_factory=list)
    last_reset: StepRecord | None = None
    turns: dict[str, Prompt] = field(default_factory=dict)  # by send name: what it sent


def run_script(script: Script, ep: Endpoint, steps: list[Step], out: Path) -> None:
    """The steps in order on a live server; raises the endpoint's failure (an engine that
    died is the script's verdict, judged by the caller)."""
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    start, _ = ep.snapshot("start")
    script.before["start"] = start
    with ThreadPoolExecutor(max_workers=16) as pool:
        for i, s in enumerate(steps, 1):
            label = s.name or f"step-{i}"
            snap, cache = ep.snapshot(label)
            script.before[label] = snap
            rec = StepRecord(i, s.do, label)
            t0 = time.perf_counter()
            if s.do == "send":
                _send(script, ep, s, label, pool, rec)
            elif s.do == "evict":
                _evict(script, ep, s, i, cache, rec)
            elif s.do == "settle":
                _join(script, ep)
                ep.settle(label, script.plan.scenario.workload.settle_timeout_s)
            elif s.do == "reset-prefix-cache":
                query = f"?{urllib.parse.urlencode(s.query)}" if s.query else ""
                try:
                    rec.http_status, rec.body = http_post(f"{ep.base}/reset_prefix_cache{query}")
                except HarnessError as err:
                    raise ep.failure(label, err) from None
                rec.detail = f"HTTP {rec.http_status} {rec.body[:200]}".strip()
                script.last_reset = rec
            elif s.do == "expect":
                _join(script, ep)
                now = ep.settle(label, script.plan.scenario.workload.settle_timeout_s)
                script.checks.append(_expect(script, s, now))
                rec.detail = "pass" if script.checks[-1].passed else script.checks[-1].observed
            rec.seconds = time.perf_counter() - t0
            after, _ = ep.snapshot(label)
            (out / "metrics" / f"{i:02d}-{label}.prom").write_text(ep.last_text)
            rec.counters = (after - snap).as_dict()
            script.records.append(rec)
        _join(script, ep)


def _send(script: Script, ep: Endpoint, s: Step, label: str, pool: Any, rec: StepRecord) -> None:
    assert s.prompt is not None
    prompt = script.prompts[s.prompt]
    if s.after is not None:
        # A next turn: what that send sent and got back, then this prompt's own tokens.
        _join(script, ep)
        before, answer = script.turns[s.after], script.sent[s.after][0]
        seen = before.token_ids + answer.token_ids
        prompt = Prompt(s.prompt, "target", seen + prompt.token_ids)
    script.turns[label] = prompt
    w = script.plan.scenario.workload

    def one() -> Completion:
        try:
            return complete(
                ep.base,
                script.plan.served_name,
                prompt,
                label,
                max_tokens=s.max_tokens,
                logprobs=w.logprobs,
                seed=w.seed,
                prompt_logprobs=s.prompt_logprobs,
            )
        except HarnessError as err:
            raise ep.failure(label, err) from None

    if s.abort == "queued":
        rec.detail = _abort_queued(script, ep, s, label, prompt)
        return
    futures = [pool.submit(one) for _ in range(s.concurrent)]
    turn = f" after {s.after}'s prompt and answer" if s.after else ""
    rec.detail = f"{s.concurrent} x {len(prompt.token_ids)} tokens of {s.prompt}{turn}"
    script.pending.append((label, futures))
    if not s.background:
        _join(script, ep)


# How long an aborted send waits for its request to show in the queue, then to leave it.
QUEUE_WAIT_S = 60.0
QUEUE_POLL_S = 0.2  # each scrape costs the API server a little: no faster


def _abort_queued(script: Script, ep: Endpoint, s: Step, label: str, prompt: Prompt) -> str:
    """Send ``prompt`` as a stream, hang up once the server shows it waiting behind a
    running request, and wait until the queue has let it go: a request aborted before it
    was ever scheduled (#49118's path), as a client that gives up on a full server does.

    Nothing here is judged: a request that never queued, or that the server still holds
    after the hang-up, is a script that did not do what it says (an error, never a pass).
    The record keeps what the queue showed."""
    payload = {
        "model": script.plan.served_name,
        "prompt": prompt.token_ids,
        "max_tokens": s.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    req = urllib.request.Request(
        f"{ep.base}/v1/completions",
        json.dumps(payload).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    try:
        # A stream answers its headers at once, queued or not: the request is in.
        resp = urllib.request.urlopen(req, timeout=QUEUE_WAIT_S)
    except (OSError, urllib.error.HTTPError) as err:
        raise ep.failure(label, HarnessError(f"{label}: {err}")) from None
    t0 = time.monotonic()
    try:
        seen = _wait_queue(ep, label, lambda run, wait: run >= 1 and wait >= 1)
    finally:
        resp.close()  # the hang-up vLLM sees as an abort
    if seen is None:
        raise HarnessError(f"{label}: the request never waited behind a running one")
    t1 = time.monotonic()
    left = _wait_queue(ep, label, lambda run, wait: wait == 0)
    if left is None:
        raise HarnessError(f"{label}: the server still holds the request after the hang-up")
    return (
        f"1 x {len(prompt.token_ids)} tokens of {s.prompt}, aborted while waiting "
        f"(queue: {seen[0]:g} running, {seen[1]:g} waiting after {t1 - t0:.1f}s; "
        f"{left[0]:g} running, 0 waiting {time.monotonic() - t1:.1f}s after the hang-up)"
    )


def _wait_queue(
    ep: Endpoint, label: str, ok: Callable[[float, float], bool]
) -> tuple[float, float] | None:
    """The scheduler's (running, waiting) once ``ok`` holds, polled from the metrics;
    None if it did not within :data:`QUEUE_WAIT_S`."""
    deadline = time.monotonic() + QUEUE_WAIT_S
    while time.monotonic() < deadline:
        ep.snapshot(label)
        queue = metrics.queue_lengths(ep.last_text)
        if queue is None:
            raise HarnessError(f"{label}: the server exports no vllm:num_requests_* gauges")
        if ok(*queue):
            return queue
        time.sleep(QUEUE_POLL_S)
    return None


def _join(script: Script, ep: Endpoint) -> None:
    """Wait for every request in flight; the first failure is raised."""
    while script.pending:
        label, futures = script.pending.pop(0)
        done = [f.result() for f in futures]
        script.sent[label] = done
        script.completions += done


def _evict(script: Script, ep: Endpoint, s: Step, index: int, cache: Any, rec: StepRecord) -> None:
    """Unrelated prompts worth ``pools`` times the live pool, one at a time, so the GPU
    prefix cache drops everything earlier steps left there."""
    if cache is None:
        raise HarnessError("evict: the server publishes no vllm:cache_config_info")
    w = script.plan.scenario.workload
    count = max(1, math.ceil(cache.pool_tokens * s.pools / w.filler_tokens))
    fillers = make_fillers([w.filler_tokens] * count, script.plan.vocab_size, w.seed + index)
    for f in fillers:
        try:
            comp = complete(
                ep.base, script.plan.served_name, f, rec.name, max_tokens=1, logprobs=0, seed=0
            )
        except HarnessError as err:
            raise ep.failure(rec.name, err) from None
        script.completions.append(comp)
    rec.detail = (
        f"{count} x {w.filler_tokens} tokens ({s.pools:g}x the {cache.pool_tokens}-token pool)"
    )


def observe(script: Script, s: Step, now: metrics.Snapshot) -> float:
    """The quantity an expect step reads (same_output: 1 when equal, 0 when not)."""
    what = s.what
    if what in COUNTER_OF:
        base = script.before[s.since or "start"]
        return float(getattr(now - base, COUNTER_OF[what]))
    if what in ("http_status", "reset_success"):
        reset = script.last_reset
        if reset is None:
            raise HarnessError(f"expect {s.name}: no reset-prefix-cache step came before")
        if what == "http_status":
            return float(reset.http_status or 0)
        try:
            body = json.loads(reset.body) if reset.body.strip() else {}
        except json.JSONDecodeError:
            body = {}
        ok = body.get("success") if isinstance(body, dict) else None
        # An answer without a verdict (older servers: a bare 200) counts by its status.
        return 1.0 if ok is True or (ok is None and reset.http_status == 200) else 0.0
    a, b = (script.sent[o][0] for o in s.of)
    return 1.0 if a.token_ids == b.token_ids else 0.0


def _expect(script: Script, s: Step, now: metrics.Snapshot) -> CheckResult:
    assert s.name is not None and s.what is not None
    got = observe(script, s, now)
    since = f" since {s.since}" if s.since else ""
    if s.what == "same_output":
        expected, ok = f"{s.of[0]} and {s.of[1]} give the same tokens", got == 1.0
        observed = "same tokens" if ok else "different tokens"
    else:
        assert s.value is not None
        expected = f"{s.what}{since} {s.op} {s.value:g}"
        ok = OPS[s.op](got, s.value)
        observed = f"{s.what}{since} = {got:g}"
    return CheckResult(s.name, bool(ok), expected, observed, s.why)


def open_entry_run(
    job: Job, kind: str, entry: BugEntry, where: Path | None = None, **cell: Any
) -> tuple[Any, SweepCell]:
    """A bug entry's own run directory on one build (``kind``: its ``run.json`` command;
    ``where``: the target's directory unless the entry shares it with others) and the
    one cell it will decide, as every entry runner makes them."""
    from harness.results.run_directory import RunDirectory

    path = where or job.out_dir
    path.mkdir(parents=True, exist_ok=True)
    run_dir = RunDirectory(path, kind)
    run_dir.update_meta(bug=entry.id, scenario_file=str(entry.source), sweep_build=job.build.label)
    return run_dir, SweepCell(
        job.build.label,
        f"bug/{entry.id}",
        job.target.kind,
        entry.id,
        "",
        run_dir=str(run_dir.path),
        **cell,
    )


def entry_dir(job: Job, entry: BugEntry) -> Path | None:
    """Where an entry's run goes: the target's directory when it is the target's only
    entry (as a lone entry always was), else a directory of its own inside it."""
    group: EntryGroup = job.target.scenario
    return None if len(group.entries) == 1 else job.out_dir / entry.id


# What clears a shared server between two entries' scripts: the GPU prefix cache and
# the connector's tiers (reset_external: honoured on every release, #57727's control).
RESET_BETWEEN = "/reset_prefix_cache?reset_external=true"


def run_steps(job: Job) -> list[SweepCell]:
    """A sweep runner (``harness.commands.sweep.run_target``) for bug entries' scripts:
    launch, each entry's steps and checks, one cell per entry, each ``pass``, ``fail``
    (the failing checks named), ``crashed`` (at start or during a step, with the crash's
    signature) or ``error``.

    Entries of one group (:mod:`harness.commands.bugs.groups`) share the server, one
    after another: between two scripts the server settles and both prefix caches are
    reset, and a new server is started instead when that reset is refused or the
    previous script left the server dead."""
    from harness.commands.roundtrip import build_local_model, plan_roundtrip

    group: EntryGroup = job.target.scenario
    cells: list[SweepCell] = []
    shared: _Shared | None = None
    try:
        for n, entry in enumerate(group.chosen(job.target.checks)):
            trig = _steps(entry)
            check_script(entry)
            scn = scenario_for(entry)
            plan = plan_roundtrip(
                scn,
                variant=job.build.label,
                extra_variants=job.variants,
                extra_args=trig.server_args,
            )
            assert plan.env is not None and plan.server is not None
            build_local_model(plan)
            where = entry_dir(job, entry)
            run_dir, cell = open_entry_run(
                job, "bug-steps", entry, where, vllm_version=plan.env.vllm_version
            )
            if shared is not None and not shared.cleared(job, entry):
                shared.server.stop()
                shared = None
            if shared is None:
                logs = (where.parent if where else run_dir.path) / "logs"
                name = "server.log" if n == 0 else f"server-{entry.id}.log"
                shared = _Shared(plan.server.server(logs / name, job.port), plan, needs_start=True)
            run_dir.update_meta(
                server_log=str(shared.server.log_path),
                shared_server=[e.id for e in shared.entries] or None,
            )
            shared.entries.append(entry)
            _run_one(job, entry, plan, scn, shared, run_dir, cell)
            cells.append(cell)
            job.on_cell(cell)
    finally:
        if shared is not None:
            shared.server.stop()
    return cells


@dataclass
class _Shared:
    """The server a group's scripts run on, and the entries it has served."""

    server: Any  # harness.server.launcher.VllmServer
    plan: RoundtripPlan
    needs_start: bool
    entries: list[BugEntry] = field(default_factory=list)

    def cleared(self, job: Job, entry: BugEntry) -> bool:
        """Ready for the next entry's script: alive, settled, both caches reset."""
        from harness.commands.roundtrip.run import Endpoint

        if self.needs_start or not self.server.alive():
            return False
        ep = Endpoint(self.server.url, self.server)
        try:
            job.reporter.status(f"bug {entry.id}: the shared server, reset for it")
            ep.settle("between entries", self.plan.scenario.workload.settle_timeout_s)
            status, body = http_post(f"{ep.base}{RESET_BETWEEN}")
        except HarnessError:
            return False
        return reset_accepted(status, body)


def reset_accepted(status: int | None, body: str) -> bool:
    """A ``/reset_prefix_cache`` answer that says the caches were cleared: HTTP 200 and,
    where the body gives a verdict (``{"success": ...}``, newer servers), that verdict."""
    if status != 200:
        return False
    try:
        value = json.loads(body) if body.strip() else {}
    except json.JSONDecodeError:
        return True  # a bare 200 with text (older servers): judged by its status
    return not isinstance(value, dict) or value.get("success", True) is True


def _run_one(
    job: Job,
    entry: BugEntry,
    plan: RoundtripPlan,
    scn: RoundtripScenario,
    shared: _Shared,
    run_dir: Any,
    cell: SweepCell,
) -> None:
    """One entry's script on the group's server (started here if it is not yet)."""
    from harness.commands.roundtrip import StartupFailure
    from harness.commands.roundtrip.run import Endpoint, EngineFailure, start_server
    from harness.server.crash_signatures import crash_signature, known_label

    trig = _steps(entry)
    script = Script(plan, build_prompts(trig.steps, plan.vocab_size, scn.workload.seed, entry.id))
    server = shared.server
    t0 = time.perf_counter()
    try:
        if shared.needs_start:
            shared.needs_start = False
            job.reporter.status(f"bug {entry.id}: starting the server")
            start_server(server, plan.scenario.server, job.reporter, "server")
        ep = Endpoint(server.url, server)
        job.reporter.status(f"bug {entry.id}: {len(trig.steps)} steps")
        run_script(script, ep, trig.steps, run_dir.path)
        failing = [c.name for c in script.checks if not c.passed]
        cell.outcome = "fail" if failing else "pass"
        cell.failing = ",".join(sorted(failing))
        cell.signature = f"fails {', '.join(failing)}" if failing else ""
        cell.detail = "; ".join(c.observed for c in script.checks)
    except StartupFailure as err:
        lines = err.log_path.read_text(errors="replace").splitlines()
        sig = crash_signature(lines, err.returncode, scn.known_crashes)
        cell.outcome = "timeout" if err.state == "timeout" else "crashed"
        cell.signature, cell.known = sig.summary(), known_label(sig.known) or ""
    except EngineFailure as err:
        cell.outcome, cell.signature = "crashed", err.signature
        cell.detail = f"during step {err.phase}: {err.message[:200]}"
    except HarnessError as err:
        if server.proc is not None and not server.alive():
            # Died without a Python frame to blame (a fatal signal): still the engine's.
            lines = server.log_path.read_text(errors="replace").splitlines()
            sig = crash_signature(lines, server.proc.returncode, scn.known_crashes)
            cell.outcome, cell.signature = "crashed", sig.summary()
            cell.known, cell.detail = known_label(sig.known) or "", str(err)[:200]
        else:
            cell.outcome, cell.why = ERROR, str(err)
    finally:
        if cell.outcome != "pass" and cell.outcome != "fail":
            server.stop()  # a crashed or unjudged server serves no further entry
        cell.seconds = time.perf_counter() - t0
        _write(run_dir, script)
        run_dir.finish(
            "finished", 0 if cell.outcome == "pass" else 1, passed=cell.outcome == "pass"
        )


def _write(run_dir: Any, script: Script) -> None:
    BUG_STEPS.write(run_dir, [r.record() for r in script.records])
    CHECKS.write(run_dir, [c.record() for c in script.checks])
    with (run_dir.path / "requests.jsonl").open("w") as fh:
        for comp in script.completions:
            fh.write(json.dumps(comp.record(), sort_keys=True) + "\n")


sweep.RUNNERS[sweep.KIND_STEPS] = run_steps
