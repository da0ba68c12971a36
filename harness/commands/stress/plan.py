"""A stress run's plan, everything known before launch: the base round-trip plan (model,
servers), the profile's seeded requests (capped, each prompt's longest length checked
against ``max_model_len``), the CPU tier sized to hold all the plan can store, and the
reference server's launch.

Planning is kept apart from judging (``harness.commands.stress.judge``) so that a dry run,
``validate`` and the CLI plan a run without loading what judges one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from harness.commands.roundtrip import attach_plan, plan_roundtrip
from harness.commands.stress.workload import PlannedRequest, plan_profile, plan_summary
from harness.errors import BadInput
from harness.names import ENV_TRACE
from harness.scenario.roundtrip import load_roundtrip
from harness.scenario.schema import DiskTier
from harness.scenario.stress_profiles import PROFILES, ProfileSettings
from harness.server.stall_watch import STALL_S

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripOptions


@dataclass
class StressPlan:
    """Everything known before launch: the base round-trip plan (model, servers), the
    profile's requests, and how they are sent."""

    base: Any  # harness.commands.roundtrip.RoundtripPlan
    profile: str
    settings: ProfileSettings
    requests: list[PlannedRequest]
    concurrency: int
    seed: int
    scenario: Any = None  # harness.scenario.stress.StressScenario
    duration_s: float | None = None  # repeat the plan with new seeds until this elapses
    request_limit: int | None = None
    storable_tokens: int = 0  # what one round can store at most (sizes the CPU tier)
    # Pressure: the tier holds this fraction of what the plan can store (None: all of it).
    tier_fraction: float | None = None
    # Over a disk tier: new servers on the same directory after the plan, each sent it again.
    restarts: int = 0
    # ``--reference-cache``: the directory of the reference's cache (None: no cache; the
    # reference is launched on every run, as it always was)
    reference_cache: Path | None = None
    # The stall watch's window (``--stall-after``)
    stall_s: float = STALL_S

    @property
    def under_pressure(self) -> bool:
        return self.tier_fraction is not None

    @property
    def connector_config(self) -> dict[str, Any]:
        """The launched connector's ``kv_connector_extra_config`` ({} when attached)."""
        server = self.base.server
        kv = (server.kv_transfer or {}) if server is not None else {}
        return dict(kv.get("kv_connector_extra_config") or {})

    @property
    def offloads_decode(self) -> bool:
        """Whether the connector stores generated tokens' blocks (vLLM's
        ``offload_prompt_only``, true unless the connector's config says false)."""
        return self.connector_config.get("offload_prompt_only", True) is False

    def round(self, k: int) -> list[PlannedRequest]:
        """Round ``k`` of a ``--duration`` run: the plan with seed + k, ids prefixed."""
        if k == 0:
            return self.requests
        reqs = plan_requests(
            self.profile,
            self.settings,
            self.base.vocab_size,
            self.seed + k,
            self.request_limit,
        )
        for r in reqs:
            r.id = f"round{k}/{r.id}"
            if r.parent is not None:
                r.parent = f"round{k}/{r.parent}"
        return reqs

    def restart_round(self, k: int) -> list[PlannedRequest]:
        """What the ``k``-th restarted server is sent: round 0 again, ids prefixed, so
        every prefix it asks for was stored (and written to disk) by the first server."""
        reqs = [replace(r, id=f"restart{k}/{r.id}") for r in self.requests]
        for r in reqs:
            if r.parent is not None:
                r.parent = f"restart{k}/{r.parent}"
        return reqs

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "scenario": self.scenario.name if self.scenario is not None else None,
            "profile": self.profile,
            "settings": dict(vars(self.settings)),
            "concurrency": self.concurrency,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "request_limit": self.request_limit,
            "requests": plan_summary(self.requests),
            "requests_total": len(self.requests),
            "storable_tokens": self.storable_tokens,
            "offloads_decode": self.offloads_decode,
            "variant": self.base.variant,
            "patch": self.base.patch or "none",
            "fault": self.base.fault,
            "tensor_parallel": self.base.tensor_parallel,
            "model": self.base.model_ref,
            "kv_block_size": self.base.kv_block_size,
            "offload_tokens_per_chunk": self.base.tokens_per_chunk,
            "kv_bytes_per_token": self.base.expected.kv_bytes_per_token,
            "cpu_bytes_to_use": self.connector_config.get("cpu_bytes_to_use"),
            "cpu_tier_fraction": self.tier_fraction,
            "disk_tier": self.base.disk.record() if self.base.disk else None,
            "restarts": self.restarts,
            "eviction_policy": self.connector_config.get("eviction_policy", "lru"),
            "server_argv": self.base.server.argv() if self.base.server else None,
            "reference_argv": reference_spec(self).argv() if self.base.server else None,
        }
        if self.reference_cache is not None:  # only then: a plan without it is as before
            described["reference_cache"] = str(self.reference_cache)
        if self.stall_s != STALL_S:
            described["stall_after_s"] = self.stall_s
        return described


def cap_requests(reqs: Sequence[PlannedRequest], limit: int | None) -> list[PlannedRequest]:
    """The first ``limit`` requests in arrival order, keeping a turn only with its parent
    (a turn without its history would be another request)."""
    if limit is None:
        return list(reqs)
    kept: list[PlannedRequest] = []
    ids: set[str] = set()
    for r in reqs:
        if len(kept) >= limit:
            break
        if r.parent is not None and r.parent not in ids:
            continue
        kept.append(r)
        ids.add(r.id)
    return kept


def plan_requests(
    profile: str,
    settings: ProfileSettings,
    vocab_size: int,
    seed: int,
    limit: int | None = None,
) -> list[PlannedRequest]:
    return cap_requests(plan_profile(profile, settings, vocab_size, seed), limit)


def settings_for(scenario: Any, profile: str) -> tuple[ProfileSettings, list[str]]:
    """A profile's numbers and engine arguments: the defaults, then what the scenario's
    ``[profiles.<name>]`` table sets. ``mixed`` takes every sub-profile's table first,
    then its own, so one file tunes each profile once."""
    names = [*PROFILES[:-1], "mixed"] if profile == "mixed" else [profile]
    values: dict[str, Any] = {}
    args = list(scenario.engine_args)
    for name in names:
        table = scenario.profiles.get(name)
        if table is None:
            continue
        values.update(table.model_dump(exclude_none=True, exclude={"engine_args"}))
        args += list(table.engine_args)
    if "prefix_tokens" in values:
        values["prefix_tokens"] = tuple(values["prefix_tokens"])
    return ProfileSettings(**values), args


def prompt_bounds(reqs: Sequence[PlannedRequest]) -> dict[str, int]:
    """Each request's longest possible prompt (a turn holds its parent's prompt and
    whole answer), known before launch so an impossible plan is refused then."""
    out: dict[str, int] = {}
    by = {r.id: r for r in reqs}
    for r in reqs:
        n = len(r.prompt)
        if r.parent is not None:
            n += out[r.parent] + by[r.parent].max_tokens
        out[r.id] = n
    return out


# Engine arguments every stress server gets: per-request cached tokens in the usage, the
# evidence the prefix-reuse check reads.
STRESS_ENGINE_ARGS = ("--enable-prompt-tokens-details",)


def plan_stress(
    scenario: Any,
    *,
    profile: str | None = None,
    requests: int | None = None,
    duration_s: float | None = None,
    concurrency: int | None = None,
    seed: int | None = None,
    url: str | None = None,
    tier_fraction: float | None = None,
    eviction_policy: str | None = None,
    disk: bool = False,
    restarts: int | None = None,
    reference_cache: Path | None = None,
    stall_s: float | None = None,
    **launch: Unpack[RoundtripOptions],
) -> StressPlan:
    """Everything known before launch; refuses what cannot run with one clear line.
    ``launch`` goes to ``plan_roundtrip``, the stress engine arguments before its own;
    with ``url`` the base is planned against that server (``attach_plan``: no launch,
    no reference), and only ``launch``'s ``config`` applies. ``disk`` puts vLLM's fs tier
    under the CPU tier (the round trip's ``[offload.disk]``); ``restarts`` sends the plan
    again to that many new servers over the same directory. ``reference_cache`` names the
    directory of the reference's cache (``harness.commands.stress.reference_cache``)."""
    name = profile or scenario.profile
    if name not in PROFILES:
        raise BadInput(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    settings, engine_args = settings_for(scenario, name)
    base_scn = load_roundtrip(scenario.resolve(scenario.roundtrip))
    if disk and base_scn.offload.disk is None:
        base_scn.offload.disk = DiskTier()
    launch["extra_args"] = [*engine_args, *STRESS_ENGINE_ARGS, *(launch.get("extra_args") or [])]
    n_restarts = scenario.restarts if restarts is None else restarts
    duration = duration_s if duration_s is not None else scenario.duration_s
    refuse_restarts(n_restarts, disk=base_scn.offload.disk is not None, url=url, duration=duration)
    cache_dir = check_reference_cache(reference_cache, url)
    if url is not None:
        # The scenario's geometry plans the byte ledger when no --config says otherwise,
        # as a launch plan would (the engine's log, and with it the per-kind trace, is not
        # the harness's to read).
        config = launch.get("config") or str(base_scn.resolve(base_scn.geometry))
        base = attach_plan(base_scn, url, config)
    else:
        base = plan_roundtrip(base_scn, **launch)
    seed_ = scenario.seed if seed is None else seed
    limit = requests if requests is not None else scenario.requests
    try:
        reqs = plan_requests(name, settings, base.vocab_size, seed_, limit)
    except ValueError as err:
        raise BadInput(f"profile {name}: {err}") from None
    if not reqs:
        raise BadInput(f"profile {name} plans no requests with these settings")
    bounds = prompt_bounds(reqs)
    max_len = base_scn.server.max_model_len
    for r in reqs:
        if bounds[r.id] + r.max_tokens > max_len:
            raise BadInput(
                f"{r.id}: up to {bounds[r.id]} prompt + {r.max_tokens} generated tokens "
                f"exceed max_model_len {max_len}; fewer turns or shorter texts"
            )
    storable = sum(bounds[r.id] + r.max_tokens for r in reqs)
    # Size the CPU tier to hold every byte the plan can store (twice for --duration,
    # whose rounds never share prefixes): a prefix evicted from the tier would make a
    # missed hit the tier's choice, not a bug. Under pressure, a fraction of that.
    rounds = 2 if duration else 1
    fraction = tier_fraction if tier_fraction is not None else scenario.cpu_tier_fraction
    policy = eviction_policy or scenario.eviction_policy
    need = storable * rounds * base.expected.kv_bytes_per_token
    tier = math.ceil(need * fraction if fraction else need * (1 + scenario.cpu_tier_margin))
    server = base.server
    if server is not None:
        kv = dict(server.kv_transfer or {})
        if kv:
            extra_cfg = dict(kv.get("kv_connector_extra_config") or {})
            given = extra_cfg.get("cpu_bytes_to_use")
            extra_cfg["cpu_bytes_to_use"] = tier if fraction else max(int(given or 0), tier)
            if policy:
                extra_cfg["eviction_policy"] = policy
            extra_cfg.setdefault("offload_prompt_only", not scenario.offload_decode)
            kv["kv_connector_extra_config"] = extra_cfg
        server = replace(server, kv_transfer=kv or None, env={**server.env, ENV_TRACE: "1"})
        base = replace(base, server=server)
    return StressPlan(
        base,
        name,
        settings,
        reqs,
        concurrency or scenario.concurrency,
        seed_,
        scenario=scenario,
        duration_s=duration,
        request_limit=limit,
        storable_tokens=storable,
        tier_fraction=fraction,
        restarts=n_restarts,
        reference_cache=cache_dir,
        **({"stall_s": stall_s} if stall_s is not None else {}),
    )


def check_reference_cache(directory: Path | None, url: str | None) -> Path | None:
    """``--reference-cache``: a directory (made at the first save), absolute so the plan
    names it wherever it is read; refused with one line on an attached run (no
    reference) or where a file is in the way."""
    if directory is None:
        return None
    if url is not None:
        raise BadInput("--reference-cache: an attached run (--url) launches no reference")
    path = Path(directory).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise BadInput(f"--reference-cache {directory}: not a directory")
    return path


def refuse_restarts(restarts: int, *, disk: bool, url: str | None, duration: float | None) -> None:
    """Restarts need what carries KV across them, a launch to restart, and one plan to
    send again: each refused with one line."""
    if not restarts:
        return
    if not disk:
        raise BadInput(
            "--restarts needs a disk tier (--disk, or [offload.disk] in the round trip): "
            "only the disk keeps KV across a restart"
        )
    if url is not None:
        raise BadInput("--restarts restarts the server it launched; --url attaches to one")
    if duration:
        raise BadInput(
            "--restarts sends the plan again to each new server; --duration's rounds have "
            "new prompts that share no prefix with the first server's, so not both"
        )


# The reference's GPU pool, in tokens, per token the plan can store: enough that its
# replay evicts nothing, so its later turns reuse their parents' KV as the run under
# test's do from the CPU tier (KV computed during decode, which teacher-forced scoring
# recomputes by prefill: the floor must measure that difference too).
REFERENCE_POOL_FACTOR = 3


def reference_spec(plan: StressPlan) -> Any:
    """The reference server: the run under test's engine and arguments, the connector
    off, and a GPU pool (``--num-gpu-blocks-override``, where the scenario sets one)
    large enough to hold everything the plan stores."""
    server = plan.base.server
    assert server is not None
    blocks = math.ceil(plan.storable_tokens * REFERENCE_POOL_FACTOR / plan.base.kv_block_size)

    def raised(args: list[str]) -> list[str]:
        out = list(args)
        for i, a in enumerate(out):
            if a == "--num-gpu-blocks-override" and i + 1 < len(out):
                out[i + 1] = str(max(int(out[i + 1]), blocks))
            elif a.startswith("--num-gpu-blocks-override="):
                out[i] = f"--num-gpu-blocks-override={max(int(a.split('=', 1)[1]), blocks)}"
        return out

    ref = server.without_offload()
    return replace(ref, args=raised(ref.args), tail=raised(ref.tail))
