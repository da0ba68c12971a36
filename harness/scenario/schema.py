"""What every scenario file is made of: the strict base model, platforms, variants,
server and offload settings, known crashes, and the one loader of a TOML file.

Scenarios are pydantic models loaded from TOML, so that a typo in a key is an
error at load time (``extra="forbid"``) rather than a silently ignored setting
discovered after a 20-minute run. CLI options override fields after loading.
Expectations live in the files, as data, so a new vLLM build or a user's own variant
can be judged without touching code. Each file kind's own model is a module beside this
one (``crash_repro``, ``roundtrip``, ``matrix``, ``bugs``, ``stress``, ``pressure``,
``oracle``), so a reader of one kind reads only its fields.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import tomllib
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import BadInput
from harness.names import PATCHES, DiskFault


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


Device = Literal["cpu", "cuda"]
_CPU_FLAG = re.compile(r"[a-z0-9_]+")


class Platform(StrictModel):
    """Where an expectation rule, a bug entry or a variant holds: the device vLLM runs on
    (the variant's, as probed or forced by OFFLOAD_CHECK_DEVICE) and CPU flags the host
    must have, as /proc/cpuinfo spells them. A key left out holds everywhere.

    Written inline: ``platform = { device = ["cpu"], cpu_flags = ["amx_tile"] }``.
    """

    device: list[Device] = Field(
        default_factory=list, description="devices it holds on (any one); empty: every device"
    )
    cpu_flags: list[str] = Field(
        default_factory=list, description="CPU flags the host needs (all of them)"
    )

    @field_validator("device", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("cpu_flags")
    @classmethod
    def _flag_words(cls, value: list[str]) -> list[str]:
        bad = [f for f in value if not _CPU_FLAG.fullmatch(f)]
        if bad:
            raise ValueError(f"not a CPU flag as /proc/cpuinfo spells them: {bad[0]!r}")
        return value

    def holds(self, device: str, flags: Collection[str]) -> bool:
        return (not self.device or device in self.device) and all(
            f in flags for f in self.cpu_flags
        )

    def describe(self) -> str:
        """ "cpu with amx_tile", "cuda", "any device with avx512f"."""
        where = " or ".join(self.device) or "any device"
        return where + (f" with {', '.join(self.cpu_flags)}" if self.cpu_flags else "")

    def mismatch(self, device: str, flags: Collection[str]) -> str:
        """What of this host it does not hold on: "cuda", "cpu without amx_tile"."""
        if self.device and device not in self.device:
            return device
        missing = [f for f in self.cpu_flags if f not in flags]
        return f"{device} without {', '.join(missing)}" if missing else ""


def _patch_or_none(value: str | None) -> str | None:
    """A harness patch's name (``harness.engine.patches``), refused at load when unknown."""
    if value is not None and value not in PATCHES:
        raise ValueError(f"unknown patch {value!r}; known: {', '.join(PATCHES)}")
    return value


class Variant(StrictModel):
    """One vLLM build to launch: an interpreter plus an optional in-engine patch."""

    name: str = ""
    python: str = Field(description="interpreter of the environment holding this vLLM build")
    patch: str | None = Field(default=None, description="patch applied inside vLLM")
    description: str = ""
    # The AMX tile-permission fix (harness.engine.amx) in this variant's processes:
    # "auto" follows OFFLOAD_CHECK_AMX (on unless set to off), "off" reproduces the
    # upstream SIGILL in vLLM's CPU attention on AMX hosts.
    amx: Literal["auto", "off"] = "auto"
    # CPU flags (as /proc/cpuinfo spells them) the variant needs; rows of a variant whose
    # flags this host lacks are skipped with that reason instead of launched.
    requires_cpu: list[str] = Field(default_factory=list)
    # Where the variant means anything (e.g. the AMX fix off: CPU only); crash-repro rows
    # and matrix cells elsewhere are skipped with the reason, not launched.
    platform: Platform | None = None

    _known_patch = field_validator("patch")(_patch_or_none)


class VariantsFile(StrictModel):
    variants: dict[str, Variant]


class ServerSettings(StrictModel):
    """How each server is launched; the same for every row of a run."""

    max_model_len: int = Field(2048, gt=0)
    startup_timeout_s: float = Field(300.0, gt=0)
    health_poll_s: float = Field(0.2, gt=0)
    load_format: str = "dummy"
    # VLLM_CPU_KVCACHE_SPACE on the CPU platform: small pools start faster.
    cpu_kvcache_space_gib: float = Field(1.0, gt=0)
    # Only used on GPU platforms.
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # KV block size (--block-size); None keeps the platform default (CPU 128, CUDA 16).
    block_size: int | None = Field(None, gt=0)
    # The KV pool as an intent in tokens, whatever block size the engine picks on this
    # machine (vLLM's CPU MLA uses 16-token blocks, its AMX MLA 128): launched as
    # --kv-cache-memory-bytes = tokens x KV bytes per token, and checked against the live
    # pool. None keeps the platform's sizing (cpu_kvcache_space_gib, or the override in
    # extra_args).
    pool_tokens: int | None = Field(None, gt=0)
    probe_prompt: str = "t10 t11 t12 t13"
    probe_max_tokens: int = Field(4, gt=0)


class DiskTier(StrictModel):
    """vLLM's ``fs`` secondary tier under the CPU tier (``TieringOffloadingSpec``, vLLM's
    ``vllm/v1/kv_offload/tiering``): every chunk the CPU tier stores is written through to
    one file per chunk and KV-cache group; a chunk the CPU tier no longer holds is read
    back (promoted) on a later lookup."""

    # Where the chunk files go; None: ``disk-tier/`` in the run directory (``--tier-dir``
    # overrides both). A directory that already holds chunks serves them.
    dir: str | None = None
    # The replay runs on a new server over the same directory, with no warm pass there:
    # the KV must survive the restart (files, hashes and their lookup).
    restart: bool = False
    # vLLM's n_read_threads / n_write_threads (its default 16 each is for NVMe arrays;
    # these machines have 2 cores).
    io_threads: int = Field(2, ge=1, le=64)
    # A seeded fault of the disk tier (``harness.names.DiskFault``); the checks must name it.
    fault: DiskFault = "none"


class OffloadSettings(StrictModel):
    """The OffloadingConnector's configuration when the connector is on."""

    # auto: the harness's host backend on CPU (vLLM's own spec refuses CPU workers),
    # vLLM's untouched CPUOffloadingSpec on GPU platforms.
    backend: Literal["auto", "host", "vllm"] = "auto"
    # Offload chunk size in tokens; None keeps the connector's default (the KV block size).
    block_size: int | None = Field(None, gt=0)
    # Host tier size in bytes, or "auto" (round trips whose server.pool_tokens is set):
    # targets plus the planned filler with a margin, so the tier holds what the plan
    # needs whatever pool the engine builds; or "targets" (a round trip under pressure):
    # exactly the targets' chunks, so the filler's stores evict them and the replay must
    # load nothing (no evicted chunk is ever loaded).
    cpu_bytes_to_use: int | Literal["auto", "targets"] = Field(512 * 1024**2)

    @field_validator("cpu_bytes_to_use")
    @classmethod
    def _positive_bytes(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value <= 0:
            raise ValueError('must be a positive number of bytes, "auto" or "targets"')
        return value

    extra_config: dict[str, Any] = Field(default_factory=dict)
    # A disk tier under the CPU tier (``[offload.disk]``); None: the CPU tier alone.
    disk: DiskTier | None = None


def _spec_or_none(value: str | None) -> str | None:
    """A PEP 440 specifier refused at load when it cannot be parsed (a rule that could
    never match would otherwise judge nothing, silently)."""
    if value is not None:
        try:
            SpecifierSet(value)
        except InvalidSpecifier as err:
            raise ValueError(f"not a version specifier: {value!r}") from err
    return value


class KnownCrash(StrictModel):
    """A crash signature worth a name: the exception and the vLLM function raising it."""

    # An upstream issue number, or a label for engine bugs with none (e.g. "amx-sigill").
    issue: int | str
    title: str = ""
    exception: str
    functions: list[str]
    # When a fault handler dump lost the stack of the thread that ran the model (a second
    # thread in the handler re-raised the signal and killed the process mid-dump), the
    # crash is still this one if the process reported one of these kernels
    # (``harness.engine.specs``' "offload-check kernel:" lines, as ``key=value``).
    kernels: list[str] = Field(default_factory=list)


class FileScenario(StrictModel):
    """A scenario loaded from a file: its relative paths are relative to that file."""

    # Not part of the file: where it was loaded from, for resolving relative paths.
    source: Path | None = Field(default=None, exclude=True)

    def resolve(self, relative: str) -> Path:
        """Paths in a scenario are relative to the scenario file, not to the caller's cwd."""
        path = Path(os.path.expandvars(os.path.expanduser(relative)))
        if path.is_absolute() or self.source is None:
            return path
        return Path(os.path.normpath(self.source.parent / path))


def _one_line(err: ValidationError, path: Path) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{path}: {loc}: {first['msg']}{more}"


def read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BadInput(f"scenario file not found: {path}")
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"{path}: not valid TOML: {err}") from None


ScenarioT = TypeVar("ScenarioT", bound=FileScenario)


def _load(path: Path, model: type[ScenarioT]) -> ScenarioT:
    """Any scenario file: TOML, validated strictly, remembering where it came from."""
    data = read_toml(path)
    try:
        scenario = model.model_validate(data)
    except ValidationError as err:
        raise BadInput(_one_line(err, path)) from None
    scenario.source = path.resolve()
    return scenario


def effective_patch(*choices: str | None) -> str | None:
    """The first explicit choice wins (CLI, then scenario, then variant); "none" is none."""
    for choice in choices:
        if choice is None:
            continue
        if choice == "none":
            return None
        if choice not in PATCHES:
            raise BadInput(f"unknown patch {choice!r}; known: {', '.join(PATCHES)}, none")
        return choice
    return None


def load_variants(path: Path, extra: Mapping[str, Variant] | None = None) -> dict[str, Variant]:
    """The variants file's builds, plus ``extra`` ones made at run time (a sweep's release
    environments, an interpreter given with ``--python``), which win on a name clash."""
    variants = _variants_file(path)
    for name, variant in (extra or {}).items():
        variants[name] = variant.model_copy(update={"name": name})
    return variants


def _variants_file(path: Path) -> dict[str, Variant]:
    data = read_toml(path)
    try:
        variants = VariantsFile.model_validate(data).variants
    except ValidationError as err:
        raise BadInput(_one_line(err, path)) from None
    for name, variant in variants.items():
        variant.name = name
        # Interpreter paths are relative to the variants file.
        py = Path(os.path.expandvars(os.path.expanduser(variant.python)))
        if not py.is_absolute() and os.sep in variant.python:
            variant.python = os.path.abspath(path.parent / py)
    return variants


def load_model_config(path: Path) -> dict[str, Any]:
    """A model geometry: a Hugging Face ``config.json`` (possibly partial)."""
    if not path.is_file():
        raise BadInput(f"model config not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BadInput(f"{path}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a model config must be a JSON object")
    return data
