"""A pressure run's plan: the tier's geometry from the model, each server's launch, its
prompts and what the oracle says each request must hit, store, skip and evict.

Everything here is known before a launch, so ``--dry-run`` and ``validate`` show it and
an impossible plan (a prompt longer than the model, a chunk that is not whole KV blocks,
a model with more than one KV-cache group) is refused with one line before a server
costs a minute.
"""

from __future__ import annotations

import json
import mmap
import random
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.commands.pressure.oracle import Policy, Step, predict
from harness.engine.amx import cpu_flags
from harness.engine.manager_replay import EXIT_RAISED
from harness.errors import BadInput, RuntimeFailure
from harness.names import (
    ENV_POLICY_CONTROL,
    FAULT_CORRUPT_LOAD,
    FAULT_NONE,
    FAULT_OVERCOUNT_LOAD,
    PATCHES,
    POLICY_MODULE,
    POLICY_MUTANTS,
    SWITCHABLE_POLICY,
)
from harness.scenario.pressure import PressureRule, PressureScenario, PressureServer
from harness.scenario.rules import all_matches
from harness.scenario.schema import OffloadSettings, load_model_config, load_variants
from harness.server import control_files, kv_layout, model_builder
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


# The host-backend faults a pressure round can run, and what each must fail when its
# round can show it: corrupt-load reports success and the right count with wrong bytes,
# so only the answer of a request that hit a repeated prompt can show it; overcount-load
# loads the right bytes and reports twice as many.
FAULT_MUST_FAIL: dict[str, frozenset[str]] = {
    FAULT_CORRUPT_LOAD: frozenset({"output-after-hit"}),
    FAULT_OVERCOUNT_LOAD: frozenset({"loaded-bytes"}),
}
PRESSURE_FAULTS = tuple(FAULT_MUST_FAIL)


def fault_must_fail(fault: str, requests: Sequence[PlannedRequest]) -> tuple[frozenset[str], int]:
    """What a fault's round must fail on this sequence, and how many of its requests it
    needs to (up to the first that can show the fault); nothing when none can."""
    seen: set[tuple[int, ...]] = set()
    for i, r in enumerate(requests):
        key = tuple(r.prompt.token_ids)
        repeat = key in seen
        seen.add(key)
        if r.expected.hit and (repeat or fault != FAULT_CORRUPT_LOAD):
            return FAULT_MUST_FAIL[fault], i + 1
    return frozenset(), 0


def mutant_must_fail(
    expected: Sequence[Step], replayed: Sequence[dict[str, Any]], slots: int
) -> tuple[frozenset[str], int]:
    """The checks a policy mutant's round must fail, and how many of its requests it
    needs to: where vLLM's own manager, running the mutant on this sequence
    (``harness.engine.manager_replay``), parts from the oracle, up to the first request
    by which every such check has parted. Calibrated per scenario and build, so a mutant
    is held to exactly what it changes, at the least cost."""
    per: list[set[str]] = []
    for w, g in zip(expected, replayed, strict=True):
        out: set[str] = set()
        if g["hit"] != w.hit:
            out |= {"hit-tokens", "loaded-bytes"}
        if len(g["stored"]) != len(w.stored):
            out.add("stored-bytes")
        if bool(g["failed"]) != w.failed:
            out.add("no-store-failure")
        if int(g["skipped"]) != len(w.skipped):
            out.add("stores-skipped")
        per.append(out)
    full = set().union(*per) if per else set()
    seen: set[str] = set()
    for n, checks in enumerate(per, 1):
        seen |= checks
        if seen == full and full:
            evicts = sum(len(w.evicted) for w in expected[:n])
            if evicts and sum(len(g["stored"]) for g in replayed[:n]) <= slots:
                seen.add("evictions")
            return frozenset(seen), n
    return frozenset(), 0


def replay_mutants(env: Environment, specs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """vLLM's own manager with each mutant, in the variant's interpreter (one start)."""
    if not specs:
        return []
    proc = subprocess.run(
        [env.python, "-m", "harness.engine.manager_replay", json.dumps(list(specs))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode == EXIT_RAISED:  # the build's manager itself failed: a finding
        raise RuntimeFailure(f"the replay in {env.python}: {tail.removeprefix('manager_replay: ')}")
    if proc.returncode != 0 or not lines:
        raise BadInput(f"cannot replay the mutants in {env.python}: {tail}")
    result: list[list[dict[str, Any]]] = json.loads(lines[-1])
    return result


@dataclass
class ServerPlan:
    """One launch: its settings, the rules that hold for its build, its requests; with
    ``rounds``, more rounds on the same server after a reset of the tier, each under a
    seeded mutant or fault (switched by control files)."""

    name: str
    policy: Policy
    store_threshold: int
    mutant: str | None
    rules: Rules  # what the scenario's rules say of this server on this build
    requests: list[PlannedRequest]
    spec: ServerSpec
    round: str = "clean"  # the round's name: "clean", a mutant's or a fault's
    must_fail: frozenset[str] = frozenset()  # what this round must fail (exactly)
    policy_mode: str = ""  # the SwitchablePolicy's mode this round ("" = no switching)
    fault: str = FAULT_NONE  # the host backend's fault this round
    rounds: list[ServerPlan] = field(default_factory=list)
    policy_control: Path | None = None
    fault_control: Path | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "round": self.round,
            "policy": self.policy,
            "store_threshold": self.store_threshold,
            "mutant": self.mutant,
            "fault": self.fault,
            "must_fail": sorted(self.must_fail),
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
            "rounds": [r.describe() for r in self.rounds],
            "notes": list(self.notes),
        }

    @property
    def deviations(self) -> tuple[str, ...]:
        return tuple(sorted(self.rules.deviations))

    @property
    def failing_checks(self) -> tuple[str, ...]:
        return tuple(sorted(self.rules.failing_checks))

    @property
    def issues(self) -> tuple[str, ...]:
        return self.rules.issues

    def all_rounds(self) -> list[ServerPlan]:
        return [self, *self.rounds]


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


def _label(issue: int | str | None) -> str:
    text = str(issue) if issue is not None else "unnamed"
    return f"#{text}" if text.isdigit() else text


@dataclass(frozen=True)
class Rules:
    """What the scenario's rules say of one server on one build: every matching rule."""

    scenario: PressureScenario
    server: PressureServer
    matched: tuple[PressureRule, ...]

    @property
    def deviations(self) -> frozenset[str]:
        return frozenset(d for r in self.matched for d in r.deviations)

    @property
    def failing_checks(self) -> frozenset[str]:
        return frozenset(c for r in self.matched for c in r.failing_checks)

    @property
    def issues(self) -> tuple[str, ...]:
        return tuple(str(r.issue) for r in self.matched if r.issue is not None)

    def _figures(self, deviations: Collection[str]) -> list[tuple[int, int, bool, int]]:
        srv, scn = self.server, self.scenario
        steps = predict(srv.sequence(), scn.slots, srv.policy, srv.store_threshold, deviations)
        return [(s.hit, len(s.stored), s.failed, len(s.skipped)) for s in steps]

    def visible(self) -> list[PressureRule]:
        """The rules whose deviations change this server's figures (a deviation its
        sequence never reaches leaves the build judged as the clean one)."""
        every = self.deviations
        if not every:
            return []
        full = self._figures(sorted(every))
        return [
            r
            for r in self.matched
            if r.deviations and self._figures(sorted(every - set(r.deviations))) != full
        ]

    def shown(self, failing: Collection[str]) -> str:
        """The known behaviours a run showed: visible deviations, and rules whose
        expected failures failed; as the sweep's ``known`` ("#55461, self-eviction")."""
        loose = [r for r in self.matched if set(r.failing_checks) & set(failing)]
        return ", ".join(dict.fromkeys(_label(r.issue) for r in [*self.visible(), *loose]))

    def expected(self) -> str:
        """The sweep's expected cell: ``pass`` (the oracle's own semantics), ``deviates``
        and the behaviours a visible deviation shows, or either where a rule only lets
        checks fail (a set-order bug)."""
        visible = ", ".join(_label(r.issue) for r in self.visible())
        loose = ", ".join(_label(r.issue) for r in self.matched if r.failing_checks)
        if visible:
            return f"deviates {visible}" + (f" (or also {loose})" if loose else "")
        return f"pass, or deviates {loose}" if loose else "pass"


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
    matched = all_matches(scn.expectations, facts, fields=("policy", "threshold"))
    return Rules(scn, srv, tuple(m.rule for m in matched))


def _rounds(
    mutants: Sequence[str], faults: Sequence[str], patch: str | None
) -> list[tuple[str, str, str]]:
    """(round, policy mutant's class or "", fault) per round after the clean one; bad
    names are one line each."""
    for m in mutants:
        if m not in POLICY_MUTANTS:
            raise BadInput(f"unknown mutant {m!r}; known: {', '.join(POLICY_MUTANTS)}")
    for f in faults:
        if f not in PRESSURE_FAULTS:
            raise BadInput(
                f"fault {f!r} has no pressure round; known: {', '.join(PRESSURE_FAULTS)}"
            )
    named = [*mutants, *faults]
    dup = next((n for n in named if named.count(n) > 1), None)
    if dup:
        raise BadInput(f"{dup} is given twice")
    if named and patch:
        raise BadInput("--patch applies to the whole server: give it without --mutant or --fault")
    return [(m, POLICY_MUTANTS[m][0], FAULT_NONE) for m in mutants] + [(f, "", f) for f in faults]


def _requests(
    scn: PressureScenario, srv: PressureServer, steps: list[Step], vocab: int, round_name: str
) -> list[PlannedRequest]:
    """A round's requests: its own prompts (no chunk of one round can hit another's),
    the oracle's steps (every round starts on an empty tier)."""
    seq = srv.sequence()
    seed = srv.name if round_name == "clean" else f"{srv.name}/{round_name}"
    prompts = prompts_for(seq, scn.chunk_tokens, scn.tail_tokens, vocab, scn.seed, seed)
    return [
        PlannedRequest(i, p, n, st)
        for i, (p, (_, n), st) in enumerate(zip(prompts, seq, steps, strict=True))
    ]


def plan_pressure(
    scn: PressureScenario,
    *,
    variant: str | None = None,
    servers: list[str] | None = None,
    mutants: Sequence[str] = (),
    faults: Sequence[str] = (),
    patch: str | None = None,
    extra_args: list[str] | None = None,
    extra_variants: Any = None,
) -> PressurePlan:
    """Everything knowable before launch. Each of ``mutants`` (``POLICY_MUTANTS``) adds a
    round on every chosen server of the policy it mutates, each of ``faults`` a round on
    every chosen server: after the clean round, the tier is reset and the mutant or fault
    switched in by a control file; each such round must fail exactly its checks (where
    vLLM's own manager, replaying the mutant, parts from the oracle; ``fault_must_fail``).
    ``patch`` (``harness.names.PATCHES``) is applied for the servers' whole life."""
    variants = load_variants(scn.resolve(scn.variants_file), extra_variants)
    name = variant or scn.variant
    if name not in variants:
        raise BadInput(f"unknown variant {name!r}; known: {', '.join(variants)}")
    var = variants[name]
    extra_rounds = _rounds(mutants, faults, patch)
    if patch is not None and patch not in PATCHES:
        raise BadInput(f"unknown patch {patch!r}; known: {', '.join(PATCHES)}")
    env = probe(var.python)
    if extra_rounds or patch:
        require_plugin(name, patch or "the rounds' policy and faults", env)
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
    for m in mutants:
        base = POLICY_MUTANTS[m][1]
        if not any(s.policy == base for s in chosen):
            raise BadInput(f"mutant {m} mutates {base}, and no chosen server runs {base}")
    model_path = model_builder.model_dir(
        geometry, geometry_path.stem, weights=scn.weights, seed=scn.weight_seed
    )
    plan = PressurePlan(scn, name, env, geometry_path, geometry, geometry_path.stem, tier)
    if mutants and Version(env.vllm_version) < Version("0.31"):
        raise BadInput(
            f"the policy mutants follow the 0.31+ policies; variant {name} is vLLM "
            f"{env.vllm_version}"
        )
    pending: list[tuple[ServerPlan, list[Step]]] = []
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

        mine = [r for r in extra_rounds if not r[1] or POLICY_MUTANTS[r[0]][1] == srv.policy]
        extra: dict[str, Any] = {"eviction_policy": srv.policy}
        policy_control = fault_control = None
        penv: dict[str, str] = {}
        if mine:
            policy_control = control_files.control_path("policy")
            fault_control = control_files.control_path("fault")
            extra = {
                "eviction_policy": SWITCHABLE_POLICY,
                "cache_policy_module_path": POLICY_MODULE,
            }
            # The tier is reset between rounds (POST /reset_prefix_cache?reset_external).
            penv = {ENV_POLICY_CONTROL: str(policy_control), "VLLM_SERVER_DEV_MODE": "1"}
        if srv.store_threshold:
            extra["store_threshold"] = srv.store_threshold
        offload = OffloadSettings(
            block_size=scn.chunk_tokens, cpu_bytes_to_use=tier.cpu_bytes, extra_config=extra
        )
        batched = ["--max-num-batched-tokens", str(scn.server.max_model_len)]
        block = ["--block-size", str(scn.server.block_size)] if scn.server.block_size else []
        settings = scn.server.model_copy(update={"env": {**scn.server.env, **penv}})
        spec = server_spec(
            env=env,
            model_path=str(model_path),
            served_model_name=plan.served_name,
            server=settings,
            offload=offload,
            patch=patch,
            fault_control=str(fault_control) if fault_control else None,
            extra_args=[*ENGINE_ARGS, *batched, *block, *(extra_args or [])],
            amx=var.amx,
        )
        clean = ServerPlan(
            srv.name, srv.policy, srv.store_threshold, None, rules,
            _requests(scn, srv, steps, vocab, "clean"), spec,
            policy_mode=srv.policy if mine else "",
            policy_control=policy_control, fault_control=fault_control,
        )  # fmt: skip
        for round_name, mode, fault in mine:
            reqs = _requests(scn, srv, steps, vocab, round_name)
            must, needed = (frozenset(), len(reqs)) if mode else fault_must_fail(fault, reqs)
            rnd = replace(
                clean, round=round_name, requests=reqs[:needed], must_fail=must,
                mutant=round_name if mode else None, policy_mode=mode or srv.policy,
                fault=fault, rounds=[],
            )  # fmt: skip
            clean.rounds.append(rnd)
            if mode:
                pending.append((rnd, steps))
        plan.servers.append(clean)
    specs = [
        {
            "requests": [[r.prompt.name, r.chunks] for r in rnd.requests],
            "capacity": scn.slots,
            "policy": rnd.policy_mode,
            "store_threshold": rnd.store_threshold,
            "policy_module": POLICY_MODULE,
        }
        for rnd, _ in pending
    ]
    for (rnd, steps), replayed in zip(pending, replay_mutants(env, specs), strict=True):
        rnd.must_fail, needed = mutant_must_fail(steps, replayed, scn.slots)
        # The round stops at the request by which every check it must fail has failed.
        rnd.requests = rnd.requests[:needed]
    for sp in plan.servers:
        # A round that cannot show its mutant or fault on this sequence is left out.
        dropped = [r.round for r in sp.rounds if not r.must_fail]
        sp.rounds = [r for r in sp.rounds if r.must_fail]
        sp.notes.extend(f"{d}: this sequence cannot show it (no round)" for d in dropped)
    return plan


def build_local_model(plan: PressurePlan) -> None:
    """The weight-free model the servers serve, made once (cached by its geometry)."""
    scn = plan.scenario
    model_builder.build_model(
        plan.geometry, plan.geometry_path.stem, weights=scn.weights, seed=scn.weight_seed
    )
