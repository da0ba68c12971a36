"""Seeded rejections: one option of the nightly's Scout launch changed at a time, each of
which vLLM must refuse at its stage with its own message, on every rehearsed build. A
stage that stopped rejecting what it should would otherwise pass every launch unseen.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import BadInput
from harness.tools.gpu_rehearsal.launch import PlannedLaunch, Rehearsal, RehearsalError


def set_arg(argv: Sequence[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def _kv_index(argv: Sequence[str]) -> int:
    """Where the kv-transfer config's JSON is in an argv (ServerSpec.argv spells the flag)."""
    for i, arg in enumerate(argv):
        if arg.startswith("{") and '"kv_connector"' in arg:
            return i
    raise BadInput("the launch has no kv-transfer config to change")


def edit_kv(argv: Sequence[str], edit: Callable[[dict[str, Any]], None]) -> list[str]:
    out = list(argv)
    kv = json.loads(out[_kv_index(out)])
    edit(kv)
    out[_kv_index(out)] = json.dumps(kv)
    return out


def _kv_not_json(argv: Sequence[str]) -> list[str]:
    out = list(argv)
    out[_kv_index(out)] = "kv_connector=OffloadingConnector"
    return out


def _drop_cpu_bytes(kv: dict[str, Any]) -> None:
    del kv["kv_connector_extra_config"]["cpu_bytes_to_use"]


def _offload_block(kv: dict[str, Any]) -> None:
    kv["kv_connector_extra_config"]["block_size"] = 24


@dataclass(frozen=True)
class SeededRejection:
    """One option changed in the nightly's Scout launch, and how vLLM must refuse it."""

    name: str
    mutate: Callable[[list[str]], list[str]]
    stage: str
    message: str  # part of vLLM's own message, the same on every rehearsed build


SEEDED_REJECTIONS: tuple[SeededRejection, ...] = (
    SeededRejection(
        "misspelt-flag",
        lambda a: [x.replace("--tensor-parallel-size", "--tensor-paralel-size") for x in a],
        "parse",
        "unrecognized arguments: --tensor-paralel-size",
    ),
    SeededRejection(
        "kv-config-not-json",
        _kv_not_json,
        "parse",
        "Invalid JSON",
    ),
    SeededRejection(
        "kv-role-unknown",
        lambda a: edit_kv(a, lambda kv: kv.update(kv_role="kv_bothh")),
        "parse",
        "kv_role | Input should be 'kv_producer', 'kv_both' or 'kv_consumer'",
    ),
    SeededRejection(
        "kv-config-unknown-key",
        lambda a: edit_kv(a, lambda kv: kv.update(kv_rol="kv_both")),
        "parse",
        "kv_rol | Unexpected keyword argument",
    ),
    SeededRejection(
        "tp-zero",
        lambda a: set_arg(a, "--tensor-parallel-size", "0"),
        "engine-config",
        "tensor_parallel_size | Input should be greater than or equal to 1",
    ),
    SeededRejection(
        "tp-not-dividing-heads",
        lambda a: set_arg(a, "--tensor-parallel-size", "3"),
        "engine-config",
        "must be divisible by tensor parallel size (3)",
    ),
    SeededRejection(
        "gpu-memory-over-one",
        lambda a: set_arg(a, "--gpu-memory-utilization", "1.5"),
        "engine-config",
        "gpu_memory_utilization | Input should be less than or equal to 1",
    ),
    SeededRejection(
        "max-model-len-beyond-model",
        lambda a: set_arg(a, "--max-model-len", "20000000"),
        "engine-config",
        "is greater than the derived max_model_len",
    ),
    SeededRejection(
        "unknown-connector",
        lambda a: edit_kv(a, lambda kv: kv.update(kv_connector="OffloadConnector")),
        "engine-config",
        "Unsupported connector type: OffloadConnector",
    ),
    SeededRejection(
        "cpu-bytes-missing",
        lambda a: edit_kv(a, _drop_cpu_bytes),
        "offload",
        "cpu_bytes_to_use must be specified in kv_connector_extra_config",
    ),
    SeededRejection(
        "offload-block-not-a-block-multiple",
        lambda a: edit_kv(a, _offload_block),
        "offload",
        "must be a multiple of the GPU KV cache block size (16 tokens)",
    ),
)


def seeded_launches(launch: PlannedLaunch) -> list[PlannedLaunch]:
    """One launch per seeded rejection, each with one option of ``launch`` changed."""
    out = []
    for seeded in SEEDED_REJECTIONS:
        argv = seeded.mutate(list(launch.argv))
        if argv == launch.argv:
            raise BadInput(f"seeded rejection {seeded.name} changes nothing in {launch.label}")
        out.append(dataclasses.replace(launch, label=f"{launch.label} [{seeded.name}]", argv=argv))
    return out


def judge_seeded(
    results: Sequence[Rehearsal | RehearsalError | None],
) -> dict[str, dict[str, Any]]:
    """Per seeded rejection (results in :data:`SEEDED_REJECTIONS`' order): caught when
    vLLM refused it at its stage with its message."""
    out = {}
    for seeded, res in zip(SEEDED_REJECTIONS, results, strict=True):
        if isinstance(res, RehearsalError):
            caught = res.stage == seeded.stage and seeded.message in res.message
            out[seeded.name] = {
                "stage": seeded.stage,
                "caught": caught,
                "observed": f"{res.stage}: {res.message}"[:300],
            }
        else:
            passed = ", ".join(res.passed) if res is not None else "not run"
            out[seeded.name] = {"stage": seeded.stage, "caught": False, "observed": passed}
    return out
