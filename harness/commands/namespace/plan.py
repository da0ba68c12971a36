"""Planning a namespace matrix: per build, the server that writes the disk tier and one
restarted server per change, each a round-trip plan (``plan_roundtrip``) so that what a
server gets is built the one way every command builds it.

Every server of a build serves its model from one path, ``<run dir>/<build>/model`` (a
link, pointed at the weights a server is to load), and each restarted server reads its
own copy of the written directory, so one change's writes never reach another's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.commands.namespace.changes import Change, Inputs
from harness.commands.roundtrip.plan import RoundtripPlan, plan_roundtrip, with_disk_dir
from harness.errors import BadInput
from harness.scenario.roundtrip import RoundtripScenario
from harness.scenario.schema import Variant
from harness.server import model_builder

MODEL_LINK = "model"  # under the build's directory: the one model path every server has


@dataclass(frozen=True)
class Reader:
    """One restarted server: the change it makes and its plan (None: not runnable)."""

    change: Change
    plan: RoundtripPlan | None
    weight_seed: int
    skipped: str = ""  # why it does not run here

    def describe(self) -> dict[str, Any]:
        return {
            "change": self.change.name,
            "what": self.change.what,
            "weight_seed": self.weight_seed,
            "skipped": self.skipped,
            "tensor_parallel": self.plan.tensor_parallel if self.plan else None,
            "server_argv": self.plan.server.argv() if self.plan and self.plan.server else None,
            "server_env": self.plan.server.env if self.plan and self.plan.server else None,
        }


@dataclass(frozen=True)
class BuildPlan:
    """One vLLM build's column: the writing server and the readers."""

    label: str  # the variant (a release env's or the scenario's)
    vllm_version: str
    device: str
    writer: RoundtripPlan
    readers: tuple[Reader, ...]

    @property
    def slug(self) -> str:
        return "".join(ch if ch.isalnum() or ch in "._+-" else "_" for ch in self.label)

    def describe(self) -> dict[str, Any]:
        assert self.writer.server is not None
        return {
            "build": self.label,
            "vllm_version": self.vllm_version,
            "device": self.device,
            "writer_argv": self.writer.server.argv(),
            "expected_hit_tokens": self.writer.expected.hit_tokens,
            "readers": [r.describe() for r in self.readers],
        }


@dataclass(frozen=True)
class NamespacePlan:
    scenario: RoundtripScenario
    changes: tuple[Change, ...]
    builds: tuple[BuildPlan, ...]

    def describe(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "changes": [c.name for c in self.changes],
            "builds": [b.describe() for b in self.builds],
        }


def plan_namespace(
    scn: RoundtripScenario,
    changes: tuple[Change, ...],
    variants: dict[str, Variant] | None = None,
    extra_args: list[str] | None = None,
) -> NamespacePlan:
    """Plan every build (each ``variants`` entry, else the scenario's own variant): its
    writer and one reader per change. Refused: a scenario without a disk tier, or one
    whose CPU tier holds exactly the targets (a TP change cannot size that)."""
    if scn.offload.disk is None:
        raise BadInput(f"{scn.name}: the namespace matrix needs a disk tier ([offload.disk])")
    if scn.offload.cpu_bytes_to_use == "targets":
        raise BadInput(
            f'{scn.name}: offload.cpu_bytes_to_use = "targets" sizes one rank\'s tier; the '
            "matrix restarts at another TP: give the tier a size in bytes"
        )
    if scn.hub_model:
        raise BadInput(
            f"{scn.name}: the namespace matrix builds its model's weights (a geometry), "
            "not a hub model"
        )
    names = list(variants or {}) or [scn.variant]
    builds = []
    for name in names:
        base = Inputs(scn, {"variant": name, "extra_variants": variants, "extra_args": extra_args})
        writer = _plan(base)
        readers = []
        for change in changes:
            why = change.unavailable.get(writer.env.device if writer.env else "", "")
            inputs = change.apply(base)
            readers.append(Reader(change, None if why else _plan(inputs), inputs.weight_seed, why))
        assert writer.env is not None
        builds.append(
            BuildPlan(name, writer.env.vllm_version, writer.env.device, writer, tuple(readers))
        )
    return NamespacePlan(scn, changes, tuple(builds))


def _plan(inputs: Inputs) -> RoundtripPlan:
    """A server's round-trip plan with the shared model path and the change's env."""
    scn = inputs.scenario.model_copy(update={"weight_seed": inputs.weight_seed})
    plan = plan_roundtrip(scn, **inputs.options)
    assert plan.server is not None  # a launched plan
    server = replace(
        plan.server,
        model=str(Path("<build dir>") / MODEL_LINK),
        env={**plan.server.env, **inputs.env},
    )
    return replace(plan, server=server)


def for_build(plan: RoundtripPlan, build_dir: Path, tier: Path) -> RoundtripPlan:
    """``plan`` as launched in ``build_dir``: the model link there, the disk tier in
    ``tier``."""
    assert plan.server is not None
    placed = replace(plan, server=replace(plan.server, model=str(build_dir / MODEL_LINK)))
    return with_disk_dir(placed, tier)


def weights_dir(plan: RoundtripPlan) -> Path:
    """Build (or reuse) the plan's model with its scenario's weight seed; where it is."""
    assert plan.geometry is not None
    scn = plan.scenario
    return model_builder.build_model(
        plan.geometry, Path(plan.model_ref).stem, weights=scn.weights, seed=scn.weight_seed
    )
