"""Planning a round trip: everything knowable before launch, and the sizing that needs
the live pool (the filler). Impossible plans are refused here with one clear line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict, Unpack

from harness.commands.roundtrip import checks as ck
from harness.errors import BadInput, RuntimeFailure
from harness.names import (
    ENGINE_DISK_FAULTS,
    ENV_DEVICE,
    HOST_SPEC_MODULE,
    HOST_TIERING_SPEC_MODULE,
)
from harness.scenario.roundtrip import RoundtripScenario
from harness.scenario.schema import (
    OffloadSettings,
    Variant,
    effective_patch,
    load_model_config,
    load_variants,
)
from harness.server import kv_layout, metrics, model_builder
from harness.server.arguments import offload_backend, server_spec
from harness.server.interpreters import Environment, probe, require_plugin
from harness.server.launcher import ServerSpec
from harness.server.workload import (
    Prompt,
    make_prompts,
)

DEFAULT_KV_BLOCK = {"cpu": 128, "cuda": 16}
# Host chunks are padded to this alignment; keep a margin so the plan never relies on
# the last few chunks (vLLM's CPU spec rounds each chunk up to 4 KiB).
CPU_CAPACITY_SAFETY = 0.9

# A disk tier's directory until the run directory exists (``resolve_disk``): what a
# dry run prints, never what a server gets.
DISK_DIR_PLACEHOLDER = "<run dir>/disk-tier"


@dataclass(frozen=True)
class DiskPlan:
    """The disk tier under the CPU tier, as a round trip uses it."""

    dir: str  # DISK_DIR_PLACEHOLDER until ``resolve_disk`` names the run's own
    restart: bool  # the replay runs on a new server over the same directory
    # The CPU tier holds exactly the targets' chunks, so the filler evicts them there and
    # every replay hit must be read back from disk.
    from_disk: bool
    fault: str = "none"  # a seeded disk fault (``harness.names.DISK_FAULTS``)

    def record(self) -> dict[str, Any]:
        return {
            "dir": self.dir,
            "restart": self.restart,
            "replay_from_disk": self.from_disk,
            "fault": self.fault,
        }


@dataclass(frozen=True)
class RoundtripPlan:
    """Everything known before launch; never changed after ``plan_roundtrip`` returns.

    What only the running server can tell (the live pool and the filler sized from it,
    the engine's Mamba state size, bytes per token measured in attach mode) goes into
    the ``RoundtripResult``, and the figures a run is judged by are derived from both
    (``roundtrip.evaluate.derive_expected``).
    """

    scenario: RoundtripScenario
    variant: str
    geometry: dict[str, Any] | None
    model_ref: str  # the geometry file, a hub id, or the attached model
    served_name: str
    kv_block_size: int
    tokens_per_chunk: int
    expected: ck.Expected  # as planned from the geometry (observations may refine it)
    targets: list[Prompt]
    vocab_size: int
    notes: tuple[str, ...] = ()  # planning remarks
    # What only a launch has; an attached plan (``roundtrip --url``) keeps the defaults.
    env: Environment | None = None
    patch: str | None = None
    fault: str = "none"
    tensor_parallel: int = 1
    server: ServerSpec | None = None
    cpu_capacity_tokens: int | None = None
    url: str | None = None  # the server an attached plan sends to (``roundtrip --url``)
    # What this build is not that the scenario was written for, and how to switch ("").
    off_platform: str = ""
    # Under pressure: the tier holds exactly the targets, the filler evicts them.
    evicts_targets: bool = False
    disk: DiskPlan | None = None  # a disk tier under the CPU tier

    def describe(self, filler: Filler | None = None) -> dict[str, Any]:
        """``run.json``'s ``plan``: the plan, with the filler once the live pool sized it."""
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
            "filler_count": filler.count if filler else None,
            "filler_tokens": filler.tokens if filler else 0,
            "pool_tokens": filler.pool_tokens if filler else None,
            "filler_over_pool": filler.over_pool if filler else None,
            "cpu_capacity_tokens": self.cpu_capacity_tokens,
            "evicts_targets": self.evicts_targets,
            "disk_tier": self.disk.record() if self.disk else None,
            "expected": self.expected.as_dict(),
            "server_argv": self.server.argv() if self.server else None,
            "server_env": self.server.env if self.server else None,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Filler:
    """The unrelated traffic that evicts the GPU prefix cache, sized from the live pool."""

    pool_tokens: int
    lengths: tuple[int, ...]
    note: str = ""  # when the engine built another pool than server.pool_tokens asked for

    @property
    def count(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def over_pool(self) -> float | None:
        return round(self.tokens / self.pool_tokens, 3) if self.pool_tokens else None


def targets_and_expected(
    scn: RoundtripScenario,
    vocab: int,
    tokens_per_chunk: int,
    layout: list[kv_layout.KindLayout],
    kv_block_size: int,
    mamba_state_bytes: int,
) -> tuple[list[Prompt], ck.Expected]:
    """The target prompts (from the scenario's seed) and the figures they must produce."""
    targets, _ = make_prompts(scn.workload.target_tokens, 1, 0, vocab, scn.workload.seed)
    expected = ck.expected_for(
        prompt_lengths={p.name: len(p.token_ids) for p in targets},
        max_tokens=scn.workload.max_tokens,
        tokens_per_chunk=tokens_per_chunk,
        layout=layout,
        kv_block_size=kv_block_size,
        mamba_state_bytes=mamba_state_bytes,
    )
    return targets, expected


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


class RoundtripOptions(TypedDict, total=False):
    """The launch choices a command forwards to ``plan_roundtrip`` (its keywords; each
    unset or None is the scenario's own)."""

    variant: str | None
    patch: str | None
    config: str | None  # a model geometry (config.json) instead of the scenario's
    tp: int | None
    fault: str | None
    # A file the host backend takes its fault from, switchable between round trips on
    # one server (``harness.commands.faults``).
    fault_control: str | None
    extra_args: list[str] | None
    extra_variants: Mapping[str, Variant] | None
    policy: str | None  # the CPU tier's eviction policy (lru, arc); None: the scenario's
    tier_dir: str | None  # the disk tier's directory; None: the scenario's, or the run's
    disk_fault: str | None  # a seeded disk fault; None: the scenario's


def plan_roundtrip(scn: RoundtripScenario, **choices: Unpack[RoundtripOptions]) -> RoundtripPlan:
    """Everything knowable before launch; refuses impossible plans with one clear line."""
    variant, patch, config = choices.get("variant"), choices.get("patch"), choices.get("config")
    tp, fault, fault_control = choices.get("tp"), choices.get("fault"), choices.get("fault_control")
    extra_args, extra_variants = choices.get("extra_args"), choices.get("extra_variants")
    policy, tier_dir = choices.get("policy"), choices.get("tier_dir")
    disk_fault = choices.get("disk_fault")
    if (tier_dir or disk_fault) and scn.offload.disk is None:
        what = "--tier-dir names a disk tier's directory" if tier_dir else "--disk-fault"
        raise BadInput(f"{what}: this scenario has no [offload.disk]")
    variants = load_variants(scn.resolve(scn.variants_file), extra_variants)
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
    targets, expected = targets_and_expected(
        scn, vocab, c, layout, kv_block, kv_layout.mamba_state_bytes(geometry)
    )
    chunk = expected.attention_chunk_size
    stored_target_tokens = sum(t.stored_tokens for t in expected.targets)
    kv_memory = _pool_bytes(scn, expected, tp_size)
    cpu_holds_targets = evicts_targets = scn.offload.cpu_bytes_to_use == "targets"
    if cpu_holds_targets and tp_size > 1:
        raise BadInput('offload.cpu_bytes_to_use = "targets" sizes one rank\'s tier: use TP 1')
    chosen_policy = policy or scn.offload.extra_config.get("eviction_policy", "lru")
    if cpu_holds_targets and chosen_policy == "arc":
        # Measured on 0.32.0: the warm pass's reuse moves the targets to ARC's T2, which
        # the filler's T1 traffic does not reach, so ARC keeps part of them by design and
        # the replay is not what this mode predicts (offload-check pressure is).
        raise BadInput(
            'offload.cpu_bytes_to_use = "targets" predicts LRU (the filler evicts every '
            "target); ARC keeps the targets the warm pass reused: use offload-check pressure"
        )
    offload = _sized_cpu_tier(scn, expected, stored_target_tokens)
    disk: DiskPlan | None = None
    if scn.offload.disk is not None:
        # The disk holds every chunk the CPU tier stored: what the filler evicted from
        # the CPU tier comes back from disk, so the replay hits as on a roomy tier.
        d = tier_dir or scn.offload.disk.dir or DISK_DIR_PLACEHOLDER
        fault_on_disk = disk_fault or scn.offload.disk.fault
        if fault_on_disk in ENGINE_DISK_FAULTS and offload_backend(scn.offload, env) != "host":
            raise BadInput(
                f"disk fault {fault_on_disk} acts inside the engine: it needs the harness's "
                'host offload backend (offload.backend = "host")'
            )
        disk = DiskPlan(d, scn.offload.disk.restart, cpu_holds_targets, fault_on_disk)
        offload = offload.model_copy(
            update={"disk": scn.offload.disk.model_copy(update={"dir": d, "fault": fault_on_disk})}
        )
        evicts_targets = False
    if policy:
        offload = offload.model_copy(
            update={"extra_config": {**offload.extra_config, "eviction_policy": policy}}
        )
    assert isinstance(offload.cpu_bytes_to_use, int)
    capacity = int(offload.cpu_bytes_to_use * CPU_CAPACITY_SAFETY) // max(
        1, expected.kv_bytes_per_token
    )
    if cpu_holds_targets:
        # Under pressure the targets' chunks fill the tier exactly and the filler evicts
        # them: the replay then hits and loads nothing (unless a disk tier holds them).
        capacity = stored_target_tokens
        if evicts_targets:
            ck.evicted_by_filler(expected)
    elif capacity < stored_target_tokens:
        raise BadInput(
            f"offload.cpu_bytes_to_use holds {capacity} tokens, fewer than the "
            f"{stored_target_tokens} the targets store"
        )
    if scn.server.pool_tokens is not None and not cpu_holds_targets:
        # The pool is known before launch: an impossible plan is refused now, not after
        # a server start.
        need = stored_target_tokens + filler_stored(_filler_lengths(scn, scn.server.pool_tokens), c)
        if need > capacity:
            raise BadInput(
                f"impossible eviction plan: the CPU tier holds ~{capacity} tokens "
                f"but targets + filler for a {scn.server.pool_tokens}-token pool "
                f"need {need}; raise offload.cpu_bytes_to_use (or set it to "
                '"auto") or lower server.pool_tokens'
            )
    served = scn.hub_model or geometry_path.stem
    extra = list(extra_args or [])
    off_platform = platform_mismatch(scn, env.device)
    if scn.server.block_size:
        extra = ["--block-size", str(scn.server.block_size), *extra]
    sp = server_spec(
        env=env,
        model_path=scn.hub_model
        or str(
            model_builder.model_dir(
                geometry, geometry_path.stem, weights=scn.weights, seed=scn.weight_seed
            )
        ),
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
    notes: list[str] = []
    if chunk and any(t.hit_tokens > chunk for t in expected.targets):
        notes.append(
            f"prompts cross attention_chunk_size {chunk}: chunked-local layers load only the "
            "current attention chunk's part of the hit, so loaded < stored by design"
        )
    model_ref = scn.hub_model or str(geometry_path)
    # The fields an attached plan has too, positional as in ``attach_plan``; then the launch.
    return RoundtripPlan(
        scn, name, geometry, model_ref, served, kv_block, c, expected, targets, vocab, tuple(notes),
        env=env, patch=eff_patch, fault=eff_fault, tensor_parallel=tp_size,
        server=replace(sp, tail=later_wins(sp.tail), ledger=writes_ledger(sp)),
        cpu_capacity_tokens=None if cpu_holds_targets else capacity,
        off_platform=off_platform, evicts_targets=evicts_targets, disk=disk,
    )  # fmt: skip


def writes_ledger(spec: ServerSpec) -> bool:
    """Whether a server's connector is the harness's host backend, the one that keeps a
    content ledger (vLLM's own worker, on a GPU, does not)."""
    extra = (spec.kv_transfer or {}).get("kv_connector_extra_config") or {}
    return extra.get("spec_module_path") in (HOST_SPEC_MODULE, HOST_TIERING_SPEC_MODULE)


def resolve_disk(plan: RoundtripPlan, run_dir: Path) -> RoundtripPlan:
    """The plan with its disk tier in ``run_dir/disk-tier`` when no directory was named
    (the server's connector config says so too); any other plan unchanged."""
    if plan.disk is None or plan.disk.dir != DISK_DIR_PLACEHOLDER or plan.server is None:
        return plan
    return with_disk_dir(plan, run_dir / "disk-tier")


def with_disk_dir(plan: RoundtripPlan, where: Path) -> RoundtripPlan:
    """The plan with its disk tier in ``where`` (its server's connector config too)."""
    assert plan.disk is not None and plan.server is not None
    assert plan.server.kv_transfer is not None
    extra = dict(plan.server.kv_transfer["kv_connector_extra_config"])
    extra["secondary_tiers"] = [{**t, "root_dir": str(where)} for t in extra["secondary_tiers"]]
    kv = {**plan.server.kv_transfer, "kv_connector_extra_config": extra}
    return replace(
        plan, server=replace(plan.server, kv_transfer=kv), disk=replace(plan.disk, dir=str(where))
    )


def later_wins(args: Sequence[str]) -> list[str]:
    """Engine arguments where an option given twice keeps only its later value, in the
    later place: the scenario's ``server.extra_args`` come before a command's own (the
    stress profile's ``--num-gpu-blocks-override 48`` after the round trip's 96), so the
    argv says once what the server gets. ``--x v``, ``--x=v`` and ``--no-x`` (for
    ``--x``) are one option; a flag takes no value; ``REPEATABLE`` options are kept."""
    groups: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            groups.append(("", [token]))  # a stray value: kept where it is
            i += 1
            continue
        name = token.split("=", 1)[0]
        j = i + 1
        if "=" not in token:
            while j < len(args) and not args[j].startswith("--"):
                j += 1  # its values (nargs options take several)
        key = name.removeprefix("--no-") if name.startswith("--no-") else name[2:]
        groups.append(("" if name in REPEATABLE else key, list(args[i:j])))
        i = j
    last = {key: k for k, (key, _) in enumerate(groups) if key}
    return [
        t for k, (key, tokens) in enumerate(groups) if not key or last[key] == k for t in tokens
    ]


# vLLM options that append rather than replace when given again.
REPEATABLE = frozenset({"--middleware", "--api-key"})


def platform_mismatch(scn: RoundtripScenario, device: str) -> str:
    """A scenario written for another device than this build's vLLM runs on, in one
    sentence with how to switch; "" when it fits. A scenario says so by its ``platform``
    (``device = ["cuda"]``), else by a GPU-only setting (``server.gpu_memory_utilization``,
    which a CPU build ignores)."""
    platform = getattr(scn, "platform", None)
    devices = list(getattr(platform, "device", None) or [])
    why = f"its platform is {' or '.join(devices)}"
    if not devices and scn.server.gpu_memory_utilization is not None:
        devices = ["cuda"]
        why = f"server.gpu_memory_utilization = {scn.server.gpu_memory_utilization:g}"
    if not devices or device in devices:
        return ""
    if device == "cpu":
        tier = scn.offload.cpu_bytes_to_use
        size = f"a {tier / 2**30:g} GiB" if isinstance(tier, int) else "an auto-sized"
        return (
            f"{scn.name} is written for GPUs ({why}) but this build's vLLM runs on cpu: "
            "planned with the CPU backend (the harness's host offload, CPU thread binding "
            f"at TP>1, {size} CPU tier in this host's memory); on a GPU runner set "
            f"{ENV_DEVICE}=cuda (or give a CUDA build's interpreter with --python)"
        )
    return (
        f"{scn.name} is written for {' or '.join(devices)} ({why}) but this build's vLLM "
        f"runs on {device}; {ENV_DEVICE}={devices[0]} plans it for {devices[0]}"
    )


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
    """The offload settings with an ``"auto"`` or ``"targets"`` CPU tier resolved to bytes."""
    if scn.offload.cpu_bytes_to_use == "targets":
        return scn.offload.model_copy(update={"cpu_bytes_to_use": expected.stored_bytes})
    if scn.offload.cpu_bytes_to_use != "auto":
        return scn.offload
    if scn.server.pool_tokens is None:
        raise BadInput(
            'offload.cpu_bytes_to_use = "auto" needs server.pool_tokens: the tier '
            "is sized from targets plus the filler the pool calls for"
        )
    chunk = scn.offload.block_size or expected.tokens_per_chunk
    need = stored_target_tokens + filler_stored(_filler_lengths(scn, scn.server.pool_tokens), chunk)
    size = math.ceil(
        need * expected.kv_bytes_per_token * (1 + CPU_TIER_MARGIN) / CPU_CAPACITY_SAFETY
    )
    return scn.offload.model_copy(update={"cpu_bytes_to_use": size})


def build_local_model(plan: RoundtripPlan) -> None:
    """Build (or reuse) the local model where the plan's server expects it."""
    if plan.scenario.hub_model or plan.server is None or plan.geometry is None:
        return
    name = Path(plan.model_ref).stem
    path = model_builder.build_model(
        plan.geometry, name, weights=plan.scenario.weights, seed=plan.scenario.weight_seed
    )
    assert str(path) == plan.server.model, (path, plan.server.model)
    if plan.scenario.weights == "random" and plan.scenario.server.load_format == "dummy":
        raise BadInput(
            'weights = "random" needs server.load_format = "auto": dummy '
            "loading would discard the weights"
        )


def filler_stored(lengths: Sequence[int], tokens_per_chunk: int) -> int:
    """The tokens the filler stores in the CPU tier: each prompt's full offload chunks
    (a one-token answer adds no KV). Fillers shorter than a chunk evict the GPU prefix
    cache and store nothing, so a tier of the targets alone is enough for them (the
    long-context scenarios, where each target is gigabytes)."""
    return sum(n // tokens_per_chunk * tokens_per_chunk for n in lengths)


def size_filler(
    plan: RoundtripPlan, cache: metrics.CacheConfig | None, pool_override: int | None = None
) -> Filler:
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
    intent = plan.scenario.server.pool_tokens
    note = ""
    if intent is not None and cache is not None and abs(pool - intent) > cache.block_size:
        note = (
            f"the engine built a {pool}-token pool for server.pool_tokens "
            f"{intent} (KV block {cache.block_size}); the filler follows the "
            "live pool"
        )
    filler = Filler(pool, tuple(_filler_lengths(plan.scenario, pool)), note)
    if plan.cpu_capacity_tokens is not None:
        need = sum(t.stored_tokens for t in plan.expected.targets) + filler_stored(
            filler.lengths, plan.tokens_per_chunk
        )
        if need > plan.cpu_capacity_tokens:
            raise BadInput(
                f"impossible eviction plan: the CPU tier holds ~{plan.cpu_capacity_tokens} "
                f"tokens but targets + filler need {need}; the filler would evict the "
                "targets from the CPU tier too. Raise offload.cpu_bytes_to_use or shrink "
                "the GPU pool (--num-gpu-blocks-override)"
            )
    return filler
