"""An oracle run's plan: the cells (family x mode x engine), each with its layout, the
sequence drawn for it, and, for a server cell, its launch.

Everything is known before anything runs, so ``--dry-run`` shows every cell, its
requests and the rules each leans on, and an impossible plan (a family the mode does
not name, a prompt longer than the model) is one line, exit 2.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine.amx import cpu_flags
from harness.errors import BadInput
from harness.names import PATCHES
from harness.oracle.scheduler import KINDS, Group, Layout, cdiv
from harness.oracle.workload import Shape, Step, draw
from harness.scenario.oracle import Engine, OracleFamily, OracleMode, OracleRule, OracleScenario
from harness.scenario.rules import all_matches
from harness.scenario.schema import OffloadSettings, load_model_config, load_variants
from harness.server import kv_layout, model_builder
from harness.server.arguments import server_spec
from harness.server.interpreters import Environment, probe
from harness.server.launcher import ServerSpec

DRIVE_MODULE = "harness.engine.oracle_drive"
# vLLM's CPU platform ignores --block-size for MLA (16-token blocks without AMX).
DRIVE_PAGE_BYTES = 1  # the drive moves tags, not bytes: one "byte" per block per layer
# On a server: the GPU prefix cache is reset before each request (VLLM_SERVER_DEV_MODE's
# endpoint), the host backend traces every transfer job per KV-cache group, the usage
# reports cached tokens.
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "OFFLOAD_CHECK_TRACE": "1"}
SERVER_ARGS = ["--enable-prompt-tokens-details"]


def _seed(*parts: object) -> int:
    """A sequence's seed from the scenario's and the cell's names (the same everywhere)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def drive_groups(config: dict[str, Any], block: int) -> list[Group]:
    """The KV-cache groups vLLM builds for ``config``'s layers, as the drive makes them:
    one group for a model of one kind, else one group per layer of the rarest kind's
    count (vLLM's uniform-page grouping: 3 chunked-local + 1 full -> 4 groups of one)."""
    text = model_builder.text_config(config)
    kinds = kv_layout.layer_kinds(config)
    windows = {
        "sliding-window": int(text.get("sliding_window") or 0),
        "chunked-local": int(text.get("attention_chunk_size") or 0),
    }
    counts = {k: kinds.count(k) for k in KINDS if k in kinds}
    per = min(counts.values())
    out: list[Group] = []
    for kind, n in counts.items():
        out += [Group(kind, block, windows.get(kind, 0), DRIVE_PAGE_BYTES)] * (n // per)
    return out


@dataclass
class Cell:
    """One family x mode on one engine: a sequence and what judges it."""

    family: OracleFamily
    mode: OracleMode
    engine: Engine
    layout: Layout  # the model's layout (a server's is replaced by what its engine built)
    steps: list[Step]
    failing_checks: frozenset[str] = frozenset()  # what the rules let fail here
    deviations: frozenset[str] = frozenset()  # what the rules say this release does instead
    issues: tuple[str, ...] = ()
    skip: str = ""  # why a rule keeps it from running
    spec: ServerSpec | None = None
    model_path: Path | None = None
    geometry: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.family.name}/{self.mode.name}/{self.engine}"

    def drive_sequence(self) -> dict[str, Any]:
        """What the oracle drive serves (``harness.engine.oracle_drive``)."""
        lay, mode = self.layout, self.mode
        seq: dict[str, Any] = {
            "name": self.name,
            "groups": [{"kind": g.kind, "block": g.block, "window": g.window} for g in lay.groups],
            "blocks_per_chunk": lay.blocks_per_chunk,
            "offload_prompt_only": lay.offload_prompt_only,
            "max_batched_tokens": lay.max_batched_tokens,
            "max_model_len": self.family.max_prompt + 4 * lay.chunk(0) + 64,
            "store_delay": mode.store_delay,
            "overlap": mode.overlap,
            "defer_lookups": mode.defer_lookups,
            "steps": [s.record() for s in self.steps],
        }
        if mode.retention_interval is not None:
            seq["retention_interval"] = mode.retention_interval
        if mode.tight_pool:
            # The longest request's blocks and one chunk more: the next request's blocks
            # come from the last one's, freed while its stores may still be in flight.
            longest = max(len(s.tokens) for s in self.steps if not s.reset)
            need = cdiv(longest + 64, lay.groups[0].block) + lay.blocks_per_chunk
            seq["num_gpu_blocks"] = len(lay.groups) * need + 2
        return seq

    def describe(self) -> dict[str, Any]:
        reqs = [s for s in self.steps if not s.reset]
        return {
            "cell": self.name,
            "engine": self.engine,
            "groups": ", ".join(
                f"{g.kind}" + (f" {g.window}" if g.window else "") for g in self.layout.groups
            ),
            "chunk_tokens": self.layout.chunk(0),
            "requests": len(reqs),
            "wave": self.mode.wave or 1,
            "resets": sum(1 for s in self.steps if s.reset),
            "longest_prompt": max((len(s.tokens) for s in reqs), default=0),
            "failing_checks": sorted(self.failing_checks),
            "deviations": sorted(self.deviations),
            "skip": self.skip,
            "argv": self.spec.argv() if self.spec is not None else [],
        }


@dataclass
class OraclePlan:
    scenario: OracleScenario
    variant: str
    env: Environment
    cells: list[Cell]
    patch: str | None = None  # a seeded fault in vLLM, on the drive and every server

    @property
    def drive_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.engine == "drive" and not c.skip]

    @property
    def server_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.engine == "server" and not c.skip]

    def describe(self) -> dict[str, Any]:
        return {
            "scenario": str(self.scenario.source),
            "variant": self.variant,
            "vllm_version": self.env.vllm_version,
            "device": self.env.device,
            "seed": self.scenario.seed,
            "patch": self.patch,
            "cells": [c.describe() for c in self.cells],
        }


def _rules(
    scn: OracleScenario, family: str, mode: str, engine: str, env: Environment
) -> list[OracleRule]:
    facts = {
        "family": family,
        "mode": mode,
        "engine": engine,
        "vllm_version": env.vllm_version,
        "device": env.device,
        "cpu_flags": cpu_flags(),
    }
    return [
        m.rule for m in all_matches(scn.expectations, facts, fields=("family", "mode", "engine"))
    ]


def _layout(family: OracleFamily, mode: OracleMode, groups: Sequence[Group], block: int) -> Layout:
    if family.chunk_tokens % block:
        raise BadInput(
            f"family {family.name}: chunk_tokens {family.chunk_tokens} is not whole "
            f"{block}-token KV blocks"
        )
    return Layout(
        tuple(groups),
        blocks_per_chunk=family.chunk_tokens // block,
        offload_prompt_only=not mode.offload_decode,
        retention_interval=mode.retention_interval if mode.retention_interval is not None else 0,
        max_batched_tokens=mode.max_batched_tokens or 1 << 30,
    )


def plan_oracle(
    scn: OracleScenario,
    *,
    variant: str | None = None,
    families: Collection[str] = (),
    modes: Collection[str] = (),
    engines: Collection[str] = (),
    seed: int | None = None,
    requests: int | None = None,
    extra_args: Sequence[str] = (),
    extra_variants: Any = None,
    patch: str | None = None,
) -> OraclePlan:
    """Every cell the choices keep, its sequence drawn and its launch planned;
    ``patch`` (``harness.names.PATCHES``) seeds a fault in vLLM for the drive and every
    server, which the cells must then catch."""
    if patch is not None and patch not in PATCHES:
        raise BadInput(f"unknown patch {patch!r}; known: {', '.join(PATCHES)}")
    variants = load_variants(scn.resolve(scn.variants_file), extra_variants)
    name = variant or scn.variant
    if name not in variants:
        raise BadInput(f"unknown variant {name!r}; known: {', '.join(variants)}")
    for what, given, known in (
        ("family", families, [f.name for f in scn.families]),
        ("mode", modes, [m.name for m in scn.modes]),
        ("engine", engines, ["drive", "server"]),
    ):
        bad = [g for g in given if g not in known]
        if bad:
            raise BadInput(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    var = variants[name]
    env = probe(var.python)
    base_seed = scn.seed if seed is None else seed
    cells: list[Cell] = []
    for fam in scn.families:
        if families and fam.name not in families:
            continue
        path = scn.resolve(fam.geometry)
        config = load_model_config(path)
        model_builder.check_buildable(config, str(path))
        server_block = scn.server.block_size or 128
        drive_block = fam.drive_block or server_block
        for mode in scn.modes:
            if modes and mode.name not in modes:
                continue
            if mode.families and fam.name not in mode.families:
                continue
            for engine in mode.engines:
                if engines and engine not in engines:
                    continue
                if (
                    engine == "server"
                    and mode.server_families is not None
                    and fam.name not in mode.server_families
                ):
                    continue
                cells.append(
                    _cell(scn, fam, mode, engine, env, config, path, drive_block, server_block,
                          base_seed, requests, var, extra_args, patch)
                )  # fmt: skip
    if not cells:
        raise BadInput("the choices leave no cell to run")
    return OraclePlan(scn, name, env, cells, patch)


def _cell(
    scn: OracleScenario,
    fam: OracleFamily,
    mode: OracleMode,
    engine: Engine,
    env: Environment,
    config: dict[str, Any],
    path: Path,
    drive_block: int,
    server_block: int,
    seed: int,
    requests: int | None,
    var: Any,
    extra_args: Sequence[str],
    patch: str | None = None,
) -> Cell:
    block = drive_block if engine == "drive" else server_block
    groups = drive_groups(config, block)
    rules = _rules(scn, fam.name, mode.name, engine, env)
    layout = _layout(fam, mode, groups, block)
    windows = tuple(sorted({g.window for g in groups if g.window}))
    count = requests or (scn.requests if engine == "drive" else scn.server_requests)
    limit = fam.max_prompt
    if engine == "server":
        limit = min(limit, scn.server.max_model_len - scn.max_tokens - fam.chunk_tokens)
        if limit < 2:
            raise BadInput(f"family {fam.name}: server.max_model_len leaves no room for a prompt")
    shape = Shape(
        chunk=fam.chunk_tokens,
        block=block,
        windows=windows,
        max_prompt=limit,
        max_tokens=scn.max_tokens,
        aborts=engine == "drive",
        resets=True,
        resets_in_flight=mode.resets_in_flight,
        wave=mode.wave,
    )
    if mode.wave > 1 and any(g.kind == "mamba" for g in groups):
        # A Mamba group's stores follow the prefill's steps, which a wave shares out.
        raise BadInput(
            f"mode {mode.name}: family {fam.name} has a Mamba group, which a wave cannot "
            "judge one request at a time; leave it out of the mode's families"
        )
    steps = draw(shape, _seed(seed, fam.name, mode.name, engine), count)
    cell = Cell(
        fam,
        mode,
        engine,
        layout,
        steps,
        failing_checks=frozenset(c for r in rules for c in r.failing_checks),
        deviations=frozenset(d for r in rules for d in r.deviations),
        issues=tuple(str(r.issue) for r in rules if r.issue is not None),
        skip=next((r.why or "a rule skips it" for r in rules if r.skip), ""),
        geometry=config,
    )
    if engine == "server" and not cell.skip:
        cell.model_path = model_builder.model_dir(
            config, path.stem, weights=scn.weights, seed=scn.weight_seed
        )
        extra: dict[str, Any] = {}
        if mode.offload_decode:
            extra["offload_prompt_only"] = False
        offload = OffloadSettings(
            block_size=fam.chunk_tokens, cpu_bytes_to_use=scn.cpu_bytes_to_use, extra_config=extra
        )
        args = [*SERVER_ARGS, "--max-num-batched-tokens", str(scn.server.max_model_len)]
        args += ["--block-size", str(server_block)]
        if mode.retention_interval is not None:
            args += ["--prefix-cache-retention-interval", str(mode.retention_interval)]
        if mode.max_batched_tokens:
            args[args.index("--max-num-batched-tokens") + 1] = str(mode.max_batched_tokens)
        settings = scn.server.model_copy(update={"env": {**scn.server.env, **SERVER_ENV}})
        cell.spec = server_spec(
            env=env,
            model_path=str(cell.model_path),
            served_model_name=path.stem,
            server=settings,
            offload=offload,
            patch=patch,
            extra_args=[*args, *extra_args],
            amx=var.amx,
        )
    return cell


def build_local_models(plan: OraclePlan) -> None:
    """The servers' local models, each made once (cached by its geometry)."""
    scn = plan.scenario
    done: set[str] = set()
    for cell in plan.server_cells:
        if cell.family.geometry in done:
            continue
        done.add(cell.family.geometry)
        stem = Path(cell.family.geometry).stem
        model_builder.build_model(cell.geometry, stem, weights=scn.weights, seed=scn.weight_seed)
