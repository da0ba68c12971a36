"""crash-repro: launch each (model, vLLM variant, connector on/off) and judge the start.

The library half of the ``crash-repro`` command: it plans the rows, launches one
server at a time (never two: a 2-core machine cannot host two engines honestly),
classifies each launch, and hands every finished row to a reporter immediately so
that an interrupted run keeps what it already learned.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

from harness.engine.amx import cpu_flags
from harness.errors import BadInput, HarnessError
from harness.names import LOG_PATCH as PATCH_LOG_PREFIX
from harness.scenario.crash_repro import CrashReproScenario, Expectation
from harness.scenario.schema import Variant, effective_patch, load_model_config, load_variants
from harness.server import engine_log, model_builder
from harness.server.arguments import offload_backend, server_spec
from harness.server.crash_signatures import (
    RowContext,
    crash_signature,
    expectation_gap,
    judge,
    match_expectation,
    parse_worker_deaths,
)
from harness.server.fault_dumps import parse_fatal_signals
from harness.server.interpreters import Environment, cpu_name, probe, require_plugin
from harness.server.launcher import ServerSpec


@dataclass
class ModelEntry:
    name: str
    config_path: str
    config: dict[str, Any]
    chunked_local_layers: list[int]
    path: str = ""  # filled when built


@dataclass
class Row:
    """One launch to make; filled in with its outcome as the run goes."""

    model: str
    variant: str
    connector: bool
    patch: str | None
    vllm_version: str
    chunked_local: bool
    plan: ServerSpec
    expected: str = ""
    expected_known: int | str | None = None
    expected_why: str = ""
    # outcome
    outcome: str = ""
    seconds: float | None = None
    signature: str = ""
    exception: str = ""
    frame: str = ""
    message: str = ""
    known_issue: int | str | None = None
    answered: bool | None = None
    answer: str = ""
    returncode: int | None = None
    patch_status: str = ""
    kernels: str = ""  # attention backend / ISA the engine chose (harness.server.engine_log)
    # Which launch of the run served the row (1, 2, ...): rows that would launch exactly
    # the same server share one launch (``launch_key``); 0 = not launched (skipped).
    launch: int = 0
    shared_with: str = ""  # the key of the row whose launch this row reused
    # Why the row is not launched on this host (a CPU feature it lacks); "" = launch it.
    skip_reason: str = ""
    matched: bool | None = None
    why: str = ""
    log: str = ""
    # The expectation rule the row matched at planning, and its place in the scenario.
    rule: Expectation | None = field(default=None, repr=False)
    rule_index: int | None = None
    # perf_counter() when the verdict was known (benchmarks measure overhead up to here).
    verdict_at: float = field(default=0.0, repr=False)

    @property
    def key(self) -> str:
        return f"{self.model} / {self.variant} / connector {'on' if self.connector else 'off'}"

    def record(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("plan")
        data.pop("verdict_at")
        data.pop("skip_reason")
        data.pop("rule")
        data.pop("rule_index")
        data.pop("shared_with")
        data["connector"] = "on" if self.connector else "off"
        data["patch"] = self.patch or "none"
        data["command"] = self.plan.argv()
        # Optional integers stay integers in CSV (pandas would turn 51150 into 51150.0).
        for key in ("known_issue", "expected_known", "returncode"):
            data[key] = "" if data[key] is None else str(data[key])
        return data


class CrashReproReporter(Protocol):
    def row_started(self, row: Row, index: int, total: int) -> None: ...
    def row_tick(self, row: Row, elapsed: float) -> None: ...
    def row_finished(self, row: Row, index: int, total: int) -> None: ...


@dataclass
class RunPlan:
    scenario: CrashReproScenario
    variants: dict[str, Variant]
    environments: dict[str, Environment]
    models: list[ModelEntry]
    rows: list[Row] = field(default_factory=list)


def load_models(scenario: CrashReproScenario, configs: list[str] | None) -> list[ModelEntry]:
    entries = []
    paths = (
        [Path(p) for p in configs] if configs else [scenario.resolve(m) for m in scenario.models]
    )
    for path in paths:
        config = load_model_config(path)
        model_builder.check_buildable(config, str(path))
        entries.append(
            ModelEntry(
                name=path.stem,
                config_path=str(path),
                config=config,
                chunked_local_layers=model_builder.chunked_local_layers(config),
            )
        )
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise BadInput(f"model configs must have distinct file names, got {names}")
    return entries


class RunOptions(TypedDict, total=False):
    """What a caller may narrow a crash-repro run to: ``plan_run``'s keywords."""

    variant_names: list[str] | None
    patch: str | None
    configs: list[str] | None
    connector_modes: list[str] | None
    extra_variants: Mapping[str, Variant] | None


def plan_run(
    scenario: CrashReproScenario,
    *,
    variant_names: list[str] | None = None,
    patch: str | None = None,
    configs: list[str] | None = None,
    connector_modes: list[str] | None = None,
    extra_variants: Mapping[str, Variant] | None = None,
) -> RunPlan:
    """Everything that can be checked before a single server starts.

    ``extra_variants`` are builds made at run time (a sweep's releases), launchable by
    name like the variants file's."""
    all_variants = load_variants(scenario.resolve(scenario.variants_file), extra_variants)
    names = variant_names or scenario.variants
    unknown = [n for n in names if n not in all_variants]
    if unknown:
        raise BadInput(f"unknown variant {unknown[0]!r}; known: {', '.join(all_variants)}")
    effective_patch(patch)  # an unknown name is bad input even before variants load
    variants = {n: all_variants[n] for n in names}
    environments = {n: probe(v.python) for n, v in variants.items()}
    for n, v in variants.items():
        require_plugin(n, effective_patch(patch, v.patch), environments[n])
    models = load_models(scenario, configs)
    modes = connector_modes or list(scenario.connector)
    plan = RunPlan(scenario, variants, environments, models)
    flags = cpu_flags()
    for entry in models:
        for n, variant in variants.items():
            env = environments[n]
            only = scenario.variant_models.get(n)
            if only is not None and entry.name not in {Path(m).stem for m in only}:
                continue
            missing = [f for f in variant.requires_cpu if f not in flags]
            for mode in modes:
                on = mode == "on"
                # Every patch acts on the offloading connector's code, which a
                # connector-off control never runs: the control carries none, so the
                # controls of a build and of that build + a patch are one server.
                effective = effective_patch(patch, variant.patch) if on else None
                row = Row(
                    model=entry.name,
                    variant=n,
                    connector=on,
                    patch=effective,
                    vllm_version=env.vllm_version,
                    chunked_local=bool(entry.chunked_local_layers),
                    plan=server_spec(
                        env=env,
                        model_path=str(_model_dir(entry, scenario)),
                        served_model_name=entry.name,
                        server=scenario.server,
                        offload=scenario.offload if on else None,
                        patch=effective,
                        amx=variant.amx,
                    ),
                )
                if missing:
                    row.skip_reason = (
                        f"needs a CPU with {', '.join(missing)}; this host ({cpu_name()}) has none"
                    )
                elif variant.platform and (off := variant.platform.mismatch(env.device, flags)):
                    where = variant.platform.describe()
                    row.skip_reason = f"variant {n} holds only on {where}, not on {off}"
                ctx = RowContext(
                    variant=n,
                    vllm_version=env.vllm_version,
                    patch=effective or "none",
                    connector=on,
                    chunked_local=row.chunked_local,
                    model=entry.name,
                    device=env.device,
                    cpu_flags=flags,
                )
                found = match_expectation(ctx, scenario.expectations)
                if found is None and (gap := expectation_gap(ctx, scenario.expectations)):
                    # Rules for other platforms only: the row says so and is not launched.
                    row.expected, row.expected_why = "skipped", gap
                    row.skip_reason = row.skip_reason or gap
                    plan.rows.append(row)
                    continue
                if found is None:
                    raise BadInput(
                        f"{scenario.source}: no expectation rule matches {row.key}; "
                        "add a catch-all [[expectations]] entry"
                    )
                rule = found.rule
                row.rule, row.rule_index = rule, found.index
                row.expected, row.expected_known, row.expected_why = (
                    rule.outcome,
                    rule.known,
                    rule.why,
                )
                plan.rows.append(row)
    return plan


def _weights(scenario: CrashReproScenario) -> str:
    return "dummy" if scenario.server.load_format == "dummy" else "random"


def _model_dir(entry: ModelEntry, scenario: CrashReproScenario) -> Path:
    """Where the row's model will be built: planned before any build, so the argv
    printed by ``--dry-run`` is the one launched."""
    return model_builder.model_dir(entry.config, entry.name, weights=_weights(scenario))


def build_models(plan: RunPlan) -> None:
    """Build (or reuse) every model the rows name, where the plan said it would be."""
    for entry in plan.models:
        path = model_builder.build_model(entry.config, entry.name, weights=_weights(plan.scenario))
        assert path == _model_dir(entry, plan.scenario), path
        entry.path = str(path)


def _patch_status(lines: list[str]) -> str:
    """What the engine plugin reported in each vLLM process (they should agree)."""
    statuses = set()
    for ln in lines:
        if PATCH_LOG_PREFIX in ln:
            words = ln.split(PATCH_LOG_PREFIX, 1)[1].split()
            if len(words) > 1:
                statuses.add(words[1])
    return ",".join(sorted(statuses))


def run_row(
    row: Row,
    scenario: CrashReproScenario,
    log_dir: Path,
    on_tick: Callable[[float], None] | None = None,
    port: int | None = None,
) -> Row:
    """Launch one server, classify how it ends, always tear it down."""
    safe = f"{row.model}__{row.variant}__connector-{'on' if row.connector else 'off'}"
    safe = safe.replace("/", "_").replace("+", "plus")
    log_path = log_dir / f"{safe}.log"
    row.log = str(log_path)
    server = row.plan.server(log_path, port)
    try:
        server.start()
    except BadInput:
        raise
    except HarnessError as err:
        row.outcome, row.why = "error", str(err)
        return row
    try:
        ready = server.wait_ready(
            scenario.server.startup_timeout_s, scenario.server.health_poll_s, on_tick
        )
        row.seconds = round(ready.seconds, 2)
        row.verdict_at = time.perf_counter()
        if ready.state == "started":
            row.outcome = "started"
            try:
                resp = server.request(
                    "/v1/completions",
                    {
                        "model": row.plan.served_model_name,
                        "prompt": scenario.server.probe_prompt,
                        "max_tokens": scenario.server.probe_max_tokens,
                        "temperature": 0.0,
                    },
                    timeout_s=120,
                )
                row.answer = str(resp["choices"][0]["text"])
                row.answered = True
            except (HarnessError, KeyError, IndexError, TypeError) as err:
                row.answered, row.answer = False, str(err)[:200]
                # A dying engine answers HTTP 500 (or drops the connection) before its
                # processes are gone: give it a moment, then tell a crash from a slow
                # or wrong answer.
                if not server.alive(grace_s=5.0) or _engine_died(log_path):
                    row.outcome = "crashed-on-first-request"
                    row.returncode = server.proc.returncode if server.proc else None
        elif ready.state == "timeout":
            row.outcome = "timeout"
            row.signature = f"no /health after {scenario.server.startup_timeout_s:g}s"
        else:
            row.outcome = "crashed"
            row.returncode = ready.returncode
    finally:
        code = server.stop()
        if row.returncode is None and row.outcome == "crashed":
            row.returncode = code
    lines = log_path.read_text(errors="replace").splitlines()
    row.patch_status = _patch_status(lines) if row.patch else ""
    row.kernels = engine_log.describe(lines)
    if row.outcome in ("crashed", "crashed-on-first-request"):
        sig = crash_signature(lines, row.returncode, scenario.known_crashes)
        row.exception, row.frame, row.message = sig.exception, sig.frame, sig.message
        row.known_issue, row.signature = sig.known, sig.summary()
        row.verdict_at = time.perf_counter()  # a crash's verdict includes its signature
    if row.patch and "failed" in row.patch_status and row.outcome == "started":
        row.why = "patch failed to apply"
    return row


def _engine_died(log_path: Path) -> bool:
    """Whether the log shows an engine process dead (a signal, a worker lost, a fatal
    EngineCore error) rather than a request the engine merely refused.

    Signals and lost workers are read by the same parsers the verdict uses, so a death
    counted here is one the signature can name.
    """
    lines = log_path.read_text(errors="replace").splitlines()
    if parse_fatal_signals(lines) or parse_worker_deaths(lines):
        return True
    return any(mark in line for line in lines for mark in _ENGINE_DEAD_MARKS)


# What vLLM prints when EngineCore itself is gone (no signal, no lost worker).
_ENGINE_DEAD_MARKS = ("EngineDeadError", "EngineCore encountered a fatal error")


def judge_row(row: Row) -> None:
    row.matched, why = judge(row.outcome, row.known_issue, row.answered, row.rule)
    if row.patch and row.patch_status in ("", "not-found") and row.outcome == "started":
        row.matched, why = False, f"patch {row.patch} was not reported applied by vLLM"
    row.why = row.why or why


# What a launch decides, copied to every row it serves (the rest is the row's own).
_LAUNCH_FIELDS = frozenset(
    {
        "answer",
        "answered",
        "exception",
        "frame",
        "kernels",
        "known_issue",
        "launch",
        "log",
        "message",
        "outcome",
        "patch_status",
        "returncode",
        "seconds",
        "signature",
    }
)


def launch_count(rows: list[Row]) -> int:
    """How many servers the rows need: one per distinct ``launch_key``, skips aside."""
    return len({row.plan.launch_key() for row in rows if not row.skip_reason})


def execute_crash_repro(
    plan: RunPlan, out_dir: Path, reporter: CrashReproReporter, port: int | None = None
) -> None:
    """Run every row in order; each row is judged and reported as soon as it ends.

    Two rows that would launch exactly the same server (interpreter, argv, environment,
    model) share one launch: the later row takes the earlier one's outcome and is judged
    against its own expectation."""
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    total = len(plan.rows)
    served: dict[str, Row] = {}
    for i, row in enumerate(plan.rows, 1):
        reporter.row_started(row, i, total)
        if row.skip_reason:
            row.outcome, row.matched, row.why, row.seconds = "skipped", True, row.skip_reason, 0.0
            reporter.row_finished(row, i, total)
            continue
        key = row.plan.launch_key()
        first = served.get(key)
        if first is not None:
            for name in _LAUNCH_FIELDS:
                setattr(row, name, getattr(first, name))
            row.shared_with = first.key
            judge_row(row)
            reporter.row_finished(row, i, total)
            continue
        served[key] = row
        row.launch = len(served)
        t0 = time.monotonic()
        run_row(
            row,
            plan.scenario,
            log_dir,
            # partial binds this row now, as the lambda's default did (mypy cannot
            # type a lambda with a default argument against Callable[[float], None])
            on_tick=functools.partial(reporter.row_tick, row),
            port=port,
        )
        if row.seconds is None:
            row.seconds = round(time.monotonic() - t0, 2)
        judge_row(row)
        reporter.row_finished(row, i, total)


def backends(plan: RunPlan) -> dict[str, str]:
    return {n: offload_backend(plan.scenario.offload, e) for n, e in plan.environments.items()}
