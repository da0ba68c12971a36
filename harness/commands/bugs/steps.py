"""Scripted bug triggers: a few requests and admin calls on one server, each fact named.

Some upstream bugs show in no crash-repro row, matrix cell or round trip: a counter that
moves when it must not, an admin call that answers success and does nothing, a second
request that finds the engine in a state the first one left. A bug entry with a
``steps`` trigger spells that sequence as data (``harness.scenario.bugs.Step``; the kinds are
documented in ``docs/bugs.md``), on a server whose model, engine and offload settings
come from a round-trip scenario. Each ``expect`` step is one named check, healthy
behaviour stated positively, so an affected build fails exactly the checks the entry's
symptom names and a fixed one passes them all.

Here: a script checked before any launch, the server it runs on, and the sweep runner
(``KIND_STEPS``, registered in ``sweep.RUNNERS`` when imported) that runs each entry's
script (``harness.commands.bugs.script``) on it, entries of one group sharing the server.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.commands import sweep
from harness.commands.bugs.entry_runs import entry_dir, open_entry_run
from harness.commands.bugs.files import BUG_STEPS
from harness.commands.bugs.groups import EntryGroup
from harness.commands.bugs.script import Script, build_prompts, run_script
from harness.commands.roundtrip import StartupFailure, build_local_model, plan_roundtrip
from harness.commands.roundtrip.files import CHECKS
from harness.commands.roundtrip.run import Endpoint, EngineFailure, start_server
from harness.commands.sweep import ERROR, Job
from harness.errors import BadInput, HarnessError
from harness.results.records import SweepCell
from harness.scenario.bugs import BugEntry, StepsTrigger
from harness.scenario.roundtrip import RoundtripScenario, load_roundtrip
from harness.server.crash_signatures import crash_signature, known_label
from harness.server.launcher import http_post

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripPlan


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
