"""A pressure run's plan: the tier's geometry from the model, each server's launch, its
prompts and what the oracle says each request must hit, store, skip and evict.

Everything here is known before a launch, so ``--dry-run`` and ``validate`` show it and
an impossible plan (a prompt longer than the model, a chunk that is not whole KV blocks,
a model with more than one KV-cache group) is refused with one line before a server
costs a minute.
"""

from __future__ import annotations

import mmap
import random
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.commands.pressure.oracle import Policy, Step, predict
from harness.engine.amx import cpu_flags
from harness.errors import BadInput
from harness.names import POLICY_MODULE, POLICY_MUTANTS
from harness.scenario.rules import all_matches
from harness.scenario.schema import (
    OffloadSettings,
    PressureScenario,
    PressureServer,
    load_model_config,
    load_variants,
)
from harness.server import kv_layout, model_builder
from harness.server.arguments import server_spec
from harness.server.interpreters import Environment, probe, require_plugin
from harness.server.launcher import ServerSpec
from harness.server.workload import FIRST_ORDINARY_ID, Prompt

# Each prefill in one step, so each request makes exactly one store decision; the GPU
# prefix cache off, so every lookup reaches the CPU tier from token 0 and no GPU hit
# hides a CPU miss (docs/pressure-design.md §2.1).
ENGINE_ARGS = ["--no-enable-prefix-caching", "--enable-prompt-tokens-details"]


@dataclass(frozen=True)
class TierGeometry:
    """The CPU tier as vLLM will size it: ``slots`` slots of ``slot_bytes`` (one chunk of
    the KV group's blocks, rounded up to a page), ``bytes_per_token`` moved per token."""

    chunk_tokens: int
    slots: int
    slot_bytes: int
    bytes_per_token: int

    @property
    def cpu_bytes(self) -> int:
        return self.slots * self.slot_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes a chunk moves (a slot's size without its page padding)."""
        return self.chunk_tokens * self.bytes_per_token


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    prompt: Prompt
    chunks: int
    expected: Step

    @property
    def label(self) -> str:
        return f"{self.prompt.name}{self.chunks}"


@dataclass
class ServerPlan:
    """One launch: its settings, the rules that hold for its build, its requests."""

    name: str
    policy: Policy
    store_threshold: int
    mutant: str | None
    deviations: tuple[str, ...]
    failing_checks: tuple[str, ...]
    issues: tuple[str, ...]
    requests: list[PlannedRequest]
    spec: ServerSpec

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policy": self.policy,
            "store_threshold": self.store_threshold,
            "mutant": self.mutant,
            "deviations": list(self.deviations),
            "expected_failing_checks": list(self.failing_checks),
            "issues": list(self.issues),
            "requests": [
                {
                    "request": r.label,
                    "prompt_tokens": len(r.prompt.token_ids),
                    "hit_chunks": r.expected.hit,
                    "stored": list(r.expected.stored),
                    "evicted": list(r.expected.evicted),
                    "skipped": list(r.expected.skipped),
                    "store_fails": r.expected.failed,
                }
                for r in self.requests
            ],
        }


@dataclass
class PressurePlan:
    scenario: PressureScenario
    variant: str
    env: Environment
    geometry_path: Path
    geometry: dict[str, Any]
    served_name: str
    tier: TierGeometry
    servers: list[ServerPlan] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        t = self.tier
        return {
            "scenario": self.scenario.name,
            "variant": self.variant,
            "vllm_version": self.env.vllm_version,
            "device": self.env.device,
            "model": str(self.geometry_path),
            "tier": {
                "chunk_tokens": t.chunk_tokens,
                "slots": t.slots,
                "slot_bytes": t.slot_bytes,
                "cpu_bytes_to_use": t.cpu_bytes,
                "bytes_per_token": t.bytes_per_token,
            },
            "servers": [s.describe() for s in self.servers],
        }


def tier_geometry(
    geometry: dict[str, Any], chunk_tokens: int, slots: int, where: str
) -> TierGeometry:
    """The slots of a model with one KV-cache group: every layer full attention (a
    hybrid model's groups each take a slot per chunk, and their windows change what a
    hit loads; the oracle's ``groups`` keys are ready for it, the plan is not)."""
    layout = kv_layout.predict(geometry)
    kinds = [k.kind for k in layout]
    if kinds != ["full"]:
        raise BadInput(
            f"{where}: pressure plans models whose layers are all full attention (one KV "
            f"group); this one has {', '.join(kinds)}"
        )
    bpt = layout[0].bytes_per_token
    page = mmap.PAGESIZE
    slot = -(-chunk_tokens * bpt // page) * page
    return TierGeometry(chunk_tokens, slots, slot, bpt)


def prompts_for(
    sequence: list[tuple[str, int]],
    chunk_tokens: int,
    tail: int,
    vocab: int,
    seed: int,
    server: str,
) -> list[Prompt]:
    """Each request's token ids: a name's chunks are the same tokens whenever it comes
    back (more chunks extend it), its tail is shorter than a chunk (so it never completes a
    stored chunk), and no two names or servers share a token sequence. A request repeated
    (same name and chunk count) is the same tokens, so its answer can be compared with
    its first run's."""
    longest: dict[str, int] = {}
    for name, n in sequence:
        longest[name] = max(longest.get(name, 0), n)
    hi = vocab
    heads = {
        name: [
            random.Random(f"{seed}-{server}-{name}").randrange(FIRST_ORDINARY_ID, hi)
            for _ in range(n * chunk_tokens)
        ]
        for name, n in longest.items()
    }
    out = []
    for name, n in sequence:
        rng = random.Random(f"{seed}-{server}-{name}-tail-{n}")
        ids = heads[name][: n * chunk_tokens] + [
            rng.randrange(FIRST_ORDINARY_ID, hi) for _ in range(tail)
        ]
        out.append(Prompt(name, "target", ids))
    return out


@dataclass(frozen=True)
class Rules:
    """What the scenario's rules say of one server on one build (every matching rule)."""

    deviations: frozenset[str]
    failing_checks: frozenset[str]
    issues: tuple[str, ...]

    def known(self) -> str:
        return ", ".join(f"#{i}" if i.isdigit() else i for i in self.issues)

    def expected(self, visible: bool) -> str:
        """The sweep's expected cell: ``pass`` (the oracle's own semantics), ``deviates``
        and the known behaviours when a deviation changes this sequence's figures
        (``visible``), or either where a rule only lets checks fail (a set-order bug)."""
        if self.deviations and visible:
            return f"deviates {self.known()}"
        if self.failing_checks:
            return f"pass, or deviates {self.known()}"
        return "pass"


def deviation_visible(scn: PressureScenario, srv: PressureServer, rules: Rules) -> bool:
    """Whether the rules' deviations change any figure of this server's sequence (a
    deviation the sequence never reaches leaves the build judged as the clean one)."""
    if not rules.deviations:
        return False
    seq = srv.sequence()

    def figures(deviations: frozenset[str]) -> list[tuple[int, int, bool, int]]:
        steps = predict(seq, scn.slots, srv.policy, srv.store_threshold, sorted(deviations))
        return [(s.hit, len(s.stored), s.failed, len(s.skipped)) for s in steps]

    return figures(frozenset()) != figures(rules.deviations)


def rules_for(
    scn: PressureScenario,
    srv: PressureServer,
    version: str,
    device: str = "cpu",
    flags: Collection[str] | None = None,
) -> Rules:
    facts = {
        "policy": srv.policy,
        "threshold": srv.store_threshold >= 2,
        "vllm_version": version,
        "device": device,
        "cpu_flags": cpu_flags() if flags is None else flags,
    }
    deviations: set[str] = set()
    failing: set[str] = set()
    issues: list[str] = []
    for m in all_matches(scn.expectations, facts, fields=("policy", "threshold")):
        deviations.update(m.rule.deviations)
        failing.update(m.rule.failing_checks)
        if m.rule.issue is not None:
            issues.append(str(m.rule.issue))
    return Rules(frozenset(deviations), frozenset(failing), tuple(issues))


def plan_pressure(
    scn: PressureScenario,
    *,
    variant: str | None = None,
    servers: list[str] | None = None,
    mutant: str | None = None,
    extra_args: list[str] | None = None,
    extra_variants: Any = None,
) -> PressurePlan:
    """Everything knowable before launch. ``mutant`` (a ``POLICY_MUTANTS`` name) runs the
    servers of the policy it mutates with it instead; their checks must then fail."""
    variants = load_variants(scn.resolve(scn.variants_file), extra_variants)
    name = variant or scn.variant
    if name not in variants:
        raise BadInput(f"unknown variant {name!r}; known: {', '.join(variants)}")
    var = variants[name]
    env = probe(var.python)
    if mutant is not None:
        if mutant not in POLICY_MUTANTS:
            raise BadInput(f"unknown mutant {mutant!r}; known: {', '.join(POLICY_MUTANTS)}")
        require_plugin(name, mutant, env)
    geometry_path = scn.resolve(scn.geometry)
    geometry = load_model_config(geometry_path)
    model_builder.check_buildable(geometry, str(geometry_path))
    tier = tier_geometry(geometry, scn.chunk_tokens, scn.slots, str(geometry_path))
    if scn.tail_tokens + scn.max_tokens >= scn.chunk_tokens:
        raise BadInput(
            f"tail_tokens {scn.tail_tokens} + max_tokens {scn.max_tokens} must stay under "
            f"chunk_tokens {scn.chunk_tokens}: a prompt then stores exactly its whole chunks"
        )
    vocab = int(model_builder.text_config(geometry)["vocab_size"])
    chosen = scn.servers
    if servers:
        known = [s.name for s in scn.servers]
        unknown = [s for s in servers if s not in known]
        if unknown:
            raise BadInput(f"unknown server {unknown[0]!r}; known: {', '.join(known)}")
        chosen = [s for s in scn.servers if s.name in servers]
    if mutant is not None:
        base = POLICY_MUTANTS[mutant][1]
        chosen = [s for s in chosen if s.policy == base]
        if not chosen:
            raise BadInput(f"mutant {mutant} mutates {base}, and no chosen server runs {base}")
    model_path = model_builder.model_dir(
        geometry, geometry_path.stem, weights=scn.weights, seed=scn.weight_seed
    )
    plan = PressurePlan(scn, name, env, geometry_path, geometry, geometry_path.stem, tier)
    for srv in chosen:
        seq = srv.sequence()
        longest = max(n for _, n in seq) * scn.chunk_tokens + scn.tail_tokens + scn.max_tokens
        if longest > scn.server.max_model_len:
            raise BadInput(
                f"server {srv.name}: a {longest}-token request exceeds server.max_model_len "
                f"{scn.server.max_model_len}"
            )
        rules = rules_for(scn, srv, env.vllm_version, env.device)
        steps = predict(seq, scn.slots, srv.policy, srv.store_threshold, sorted(rules.deviations))
        prompts = prompts_for(seq, scn.chunk_tokens, scn.tail_tokens, vocab, scn.seed, srv.name)
        requests = [
            PlannedRequest(i, p, n, st)
            for i, (p, (_, n), st) in enumerate(zip(prompts, seq, steps, strict=True))
        ]
        extra: dict[str, Any] = {"eviction_policy": srv.policy}
        if mutant is not None:
            extra = {
                "eviction_policy": POLICY_MUTANTS[mutant][0],
                "cache_policy_module_path": POLICY_MODULE,
            }
        if srv.store_threshold:
            extra["store_threshold"] = srv.store_threshold
        offload = OffloadSettings(
            block_size=scn.chunk_tokens, cpu_bytes_to_use=tier.cpu_bytes, extra_config=extra
        )
        batched = ["--max-num-batched-tokens", str(scn.server.max_model_len)]
        block = ["--block-size", str(scn.server.block_size)] if scn.server.block_size else []
        spec = server_spec(
            env=env,
            model_path=str(model_path),
            served_model_name=plan.served_name,
            server=scn.server,
            offload=offload,
            patch=None,
            extra_args=[*ENGINE_ARGS, *batched, *block, *(extra_args or [])],
            amx=var.amx,
        )
        plan.servers.append(
            ServerPlan(
                srv.name, srv.policy, srv.store_threshold, mutant,
                tuple(sorted(rules.deviations)), tuple(sorted(rules.failing_checks)),
                rules.issues, requests, spec,
            )
        )  # fmt: skip
    return plan


def build_local_model(plan: PressurePlan) -> None:
    """The weight-free model the servers serve, made once (cached by its geometry)."""
    scn = plan.scenario
    model_builder.build_model(
        plan.geometry, plan.geometry_path.stem, weights=scn.weights, seed=scn.weight_seed
    )
