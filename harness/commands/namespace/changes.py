"""The changes a restarted server makes, one at a time, to the server that wrote the
disk tier: each is something a user changes between two launches over one cache
directory (vLLM's fs tier names its folder from a config digest, ``FileMapper``, so
whatever that digest leaves out is KV reused across the change).

Each change turns the base round trip's plan inputs (scenario and launch options) into
the restarted server's; a change the platform cannot make says why (``unavailable``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from harness.errors import BadInput
from harness.scenario.roundtrip import RoundtripScenario
from harness.scenario.schema import load_model_config
from harness.server.model_builder import text_config

# What the restarted server reads: Llama 3-style RoPE scaling (#56311's change), whose
# low-frequency bands differ past 256 positions, so every rotary layer's K changes.
ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
DEFAULT_ROPE_THETA = 10000.0  # transformers' default, for a geometry that names none


@dataclass(frozen=True)
class Inputs:
    """What one server is planned from: the scenario, its launch options and the weight
    seed its model directory (always one path, ``model``) points at."""

    scenario: RoundtripScenario
    options: dict[str, Any] = field(default_factory=dict)  # ``plan_roundtrip``'s keywords
    weight_seed: int = 0
    env: dict[str, str] = field(default_factory=dict)  # on top of the planned server's


@dataclass(frozen=True)
class Known:
    """An upstream bug a row's broken outcome is, on the releases ``vllm`` names."""

    vllm: str  # a version specifier (``>=0.29.0``)
    outcome: str  # the outcome the bug gives (``judge.WRONG_REUSE``)
    issue: int
    why: str


@dataclass(frozen=True)
class Change:
    name: str
    what: str  # one line: what the restarted server does differently
    apply: Callable[[Inputs], Inputs]
    # Why this change cannot be made on a device ("cpu" -> reason); absent: it can.
    unavailable: dict[str, str] = field(default_factory=dict)
    # The fs tier's namespace field that must tell the two servers apart (FileMapper).
    namespace_field: str = ""
    known: tuple[Known, ...] = ()


# Every release before 0.29.0 seeds its prefix-cache hashes per process: a restarted
# server finds nothing it wrote, changed or not (its own files' names differ).
PER_PROCESS_HASHES = Known(
    "<0.29.0",
    "missed",
    51875,
    "before PR #51875 (0.29.0) block hashes chain from a NONE_HASH seeded per process, "
    "so a restarted server's chunk file names differ from the writer's",
)


def _args(inputs: Inputs, *args: str) -> Inputs:
    extra = [*(inputs.options.get("extra_args") or []), *args]
    return replace(inputs, options={**inputs.options, "extra_args": extra})


def _scenario(inputs: Inputs, edit: Callable[[RoundtripScenario], None]) -> Inputs:
    scn = inputs.scenario.model_copy(deep=True)
    edit(scn)
    return replace(inputs, scenario=scn)


def _half_block(scn: RoundtripScenario) -> None:
    block = scn.server.block_size
    if not block or block % 2:
        raise BadInput("the block-size change halves server.block_size: give an even one")
    scn.server.block_size = block // 2
    # A pool given in blocks keeps its tokens: twice the blocks of half the size.
    args = scn.server.extra_args
    for i, arg in enumerate(args[:-1]):
        if arg == "--num-gpu-blocks-override":
            args[i + 1] = str(int(args[i + 1]) * 2)


def _double_chunk(scn: RoundtripScenario) -> None:
    chunk = scn.offload.block_size or scn.server.block_size
    if not chunk:
        raise BadInput("the offload-chunk change doubles offload.block_size: give one")
    scn.offload.block_size = chunk * 2


def _env(inputs: Inputs, **env: str) -> Inputs:
    return replace(inputs, env={**inputs.env, **env})


def _rope_scaling(inputs: Inputs) -> dict[str, Any]:
    """``ROPE_SCALING`` with the model's own ``rope_theta``: transformers 5 reads
    ``rope_scaling`` as its ``rope_parameters``, which carry the base too (without it
    vLLM 0.28.0's llama3 rotary embedding starts from a base of None)."""
    geometry = load_model_config(inputs.scenario.resolve(inputs.scenario.geometry))
    theta = text_config(geometry).get("rope_theta", DEFAULT_ROPE_THETA)
    return {**ROPE_SCALING, "rope_theta": float(theta)}


def _tp(inputs: Inputs) -> int:
    return int(inputs.options.get("tp") or inputs.scenario.tensor_parallel)


UNCHANGED = "unchanged"

CHANGES: tuple[Change, ...] = (
    Change(UNCHANGED, "the same server again", lambda i: i, known=(PER_PROCESS_HASHES,)),
    Change(
        "rope-scaling",
        "--hf-overrides with Llama 3 RoPE scaling (factor 8)",
        lambda i: _args(i, "--hf-overrides", json.dumps({"rope_scaling": _rope_scaling(i)})),
        namespace_field="none: the model's HF config is not in it (#56311)",
        known=(
            Known(
                ">=0.29.0",
                "wrong-reuse",
                56311,
                "FileMapper's namespace has the model's path, dtype, block sizes and "
                "parallelism but not its HF config; PR #56331 (open) adds it",
            ),
        ),
    ),
    Change(
        "weight-seed",
        "other weights under the same model path (a checkpoint updated in place)",
        lambda i: replace(i, weight_seed=i.weight_seed + 1),
        namespace_field="none: model_name is the path, not the weights",
        known=(
            Known(
                ">=0.29.0",
                "wrong-reuse",
                49261,
                "the namespace names the model by its path only: #49261 (open) for hub "
                "revisions; PR #49266 (closed unmerged) would have added the revision and "
                "still omitted it for a local directory, the case here",
            ),
        ),
    ),
    Change(
        "dtype",
        "--dtype float32 (the KV cache in float32)",
        lambda i: _args(i, "--dtype", "float32"),
        namespace_field="dtype",
    ),
    Change(
        "block-size",
        "half the KV block size (the pool keeps its tokens)",
        lambda i: _scenario(i, _half_block),
        namespace_field="kv_cache_groups[].tokens_per_block",
    ),
    Change(
        "offload-chunk",
        "twice the offload chunk (offload block_size)",
        lambda i: _scenario(i, _double_chunk),
        namespace_field="tokens_per_hash",
    ),
    Change(
        "tp",
        "the other tensor parallel size (TP 1 <-> 2)",
        lambda i: replace(i, options={**i.options, "tp": 1 if _tp(i) > 1 else 2}),
        namespace_field="tp_size",
    ),
    Change(
        "kv-layout",
        "VLLM_KV_CACHE_LAYOUT=HND instead of the backend's NHD",
        lambda i: _env(i, VLLM_KV_CACHE_LAYOUT="HND"),
        unavailable={
            "cpu": "vLLM's CPU attention backend has one KV layout "
            "(CPUAttentionBackend.supported_kv_cache_layouts: LBHNC)"
        },
        namespace_field="none for the direct layout (#55904)",
    ),
)
BY_NAME = {c.name: c for c in CHANGES}


def choose(names: list[str] | tuple[str, ...]) -> tuple[Change, ...]:
    """The changes named (all when none), in the catalogue's order, the unchanged restart
    always first: it is the control that says the directory is readable at all."""
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise BadInput(f"unknown change {unknown[0]!r}; known: {', '.join(BY_NAME)}")
    wanted = set(names) | {UNCHANGED} if names else set(BY_NAME)
    return tuple(c for c in CHANGES if c.name in wanted)
