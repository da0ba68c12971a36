"""What the rehearsal is about: a launch a GPU runner would make (:class:`PlannedLaunch`),
how far vLLM took it (:class:`Rehearsal`, :class:`OffloadSummary`), how it can fail, and
where vLLM ended up with something other than the harness planned (:func:`mismatches`).

Every other module of the rehearsal speaks these types: the planning makes launches, the
stages and the worker rehearse them, the nightly's record is written from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.errors import BadInput, RuntimeFailure
from harness.names import ENV_PATCH, PATCH_NONE, TIERING_SPEC_NAME

STAGES = ("parse", "engine-args", "engine-config", "offload")


class RehearsalError(BadInput):
    """vLLM rejected a planned launch: the GPU runner's server would refuse it too."""

    def __init__(self, label: str, stage: str, message: str) -> None:
        super().__init__(f"{label}: vLLM rejects it at {stage}: {message}")
        self.label, self.stage, self.message = label, stage, message


class RehearsalAPIError(RuntimeFailure):
    """The rehearsal cannot call this vLLM build (a function moved, a signature changed):
    the harness's fault, never the launch's, so it is not a :class:`RehearsalError`."""


@dataclass
class PlannedLaunch:
    """One server a GPU runner would start, as the harness plans it, plus what it meant."""

    label: str
    python: str
    argv: list[str]
    env: dict[str, str]
    # What the harness asked for, independently of the argv: vLLM must end up with these.
    intended: dict[str, Any]
    geometry: dict[str, Any] | None = None
    geometry_name: str = "model"
    # The harness's own byte figures, cross-checked against vLLM's offloading arithmetic.
    kv_bytes_per_token: int | None = None
    cpu_capacity_tokens: int | None = None
    # Why this host would not launch it (a CPU feature it lacks). A GPU runner's CPU may
    # have it, so the launch is rehearsed all the same.
    skipped_here: str = ""

    @property
    def tensor_parallel(self) -> int:
        return int(self.intended.get("tensor_parallel_size") or 1)

    @property
    def patch(self) -> str:
        """The engine patch the server's plugin would apply (``none``: none)."""
        return self.env.get(ENV_PATCH) or PATCH_NONE

    @property
    def server_args(self) -> list[str]:
        """What the API server's parser sees: everything after ``-m <module>``."""
        return self.argv[self.argv.index("-m") + 2 :]


@dataclass
class OffloadSummary:
    """What vLLM's offloading built for the launch, scheduler side."""

    connector_class: str
    spec_class: str
    manager_class: str
    num_chunks: int
    kv_bytes_per_chunk: int  # 4 KiB aligned, over all ranks, one group's block(s)
    worker_kv_bytes_per_block: int
    world_size: int
    tokens_per_block: int
    blocks_per_chunk: int
    # per KV-cache group: spec class, layer count, sliding_window_size_in_chunks
    groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token stores over all groups and ranks (the pool pages are uniform)."""
        per_block = self.worker_kv_bytes_per_block * self.world_size * len(self.groups)
        return per_block // self.tokens_per_block

    @property
    def capacity_tokens(self) -> int:
        """Tokens the CPU tier holds: every stored chunk takes one slot per group."""
        groups = max(1, len(self.groups))
        return self.num_chunks // groups * self.blocks_per_chunk * self.tokens_per_block


@dataclass
class Rehearsal:
    """How far vLLM took one launch, and the values it ended up with at each stage."""

    label: str
    vllm_version: str
    passed: list[str] = field(default_factory=list)
    parsed: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    offload: OffloadSummary | None = None
    # Where the rehearsal stopped and why: a stage not requested, or the CPU build's limit.
    stopped: str = ""
    # vLLM's platform class the stages ran on, and why that one (see platform_note()).
    platform: str = ""


def uses_vllm_offload_spec(launch: PlannedLaunch) -> bool:
    """vLLM's own spec (CPUOffloadingSpec, or TieringOffloadingSpec under a disk tier)
    serves this launch, not one of the harness's host specs."""
    kv = launch.intended.get("kv_transfer_config")
    if not kv:
        return False
    return kv["kv_connector_extra_config"].get("spec_name", TIERING_SPEC_NAME) == TIERING_SPEC_NAME


def mismatches(intended: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Where vLLM ended up with something other than what the harness planned.

    ``None`` in the plan means "vLLM's default" and is not compared; a planned dict is
    compared on its own keys only (vLLM adds defaults such as ``kv_port``).
    """
    out = []
    for key, want in intended.items():
        if want is None or key not in observed:
            continue
        have = observed[key]
        if isinstance(want, dict) and isinstance(have, dict):
            diff = {k: (v, have.get(k)) for k, v in want.items() if have.get(k) != v}
            if diff:
                out.append(f"{key}: {diff} (planned, vLLM)")
        elif have != want:
            out.append(f"{key}: planned {want!r}, vLLM has {have!r}")
    return out


def one_line(err: BaseException) -> str:
    """An error as one report line, its class first (vLLM's messages span lines)."""
    text = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {text}"
