"""The preflight in order: the host's checks, then each selected variant's (an
environment shared by two variants is probed once), then the GPU line."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.commands.doctor.host import (
    Check,
    check_amx,
    check_cache_disk,
    check_cache_writable,
    check_cpu,
    check_lock,
    check_loopback,
    check_memory,
    check_python,
    check_repo_disk,
    read_meminfo,
)
from harness.commands.doctor.variants import (
    check_bytecode,
    check_gpu,
    check_plugin,
    check_plugin_allowlist,
    check_variant,
    variant_notes,
)
from harness.engine.amx import (
    cpu_flags,
)
from harness.errors import BadInput, HarnessError
from harness.scenario.schema import load_variants
from harness.server.interpreters import Environment, cpu_name, probe, resolve_interpreter
from harness.server.model_builder import default_cache_dir
from harness.server.server_lock import lock_holder, lock_path


def _select(variants: Mapping[str, Any], names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise BadInput(f"unknown variant {unknown[0]!r}; known: {', '.join(variants)}")
    return list(dict.fromkeys(names))


def run_checks(variants_file: Path, variant_names: Sequence[str] | None = None) -> list[Check]:
    """Every check, host first, then each selected variant; bad input raises ``BadInput``."""
    if not variants_file.is_file():
        raise BadInput(f"variants file not found: {variants_file}")
    try:
        variants = load_variants(variants_file)
    except (OSError, UnicodeDecodeError) as err:  # read_toml reports only TOML syntax
        raise BadInput(f"cannot read variants file {variants_file}: {err}") from None
    selected = _select(variants, variant_names)
    cache = default_cache_dir()
    flags = cpu_flags()
    checks = [
        check_python(sys.version_info[:3], sys.executable),  # the int part (no releaselevel)
        check_cpu(flags, cpu_name(), platform.machine()),
        check_amx(flags),
        check_memory(read_meminfo()),
        check_repo_disk(),
        check_cache_disk(cache),
        check_cache_writable(cache),
        check_loopback(),
        _lock_check(),
    ]
    envs: dict[str, Environment | None] = {}
    plugins: dict[str, Check] = {}
    compiled: dict[str, Check] = {}
    for name in selected:
        python = variants[name].python
        line, envs[name] = check_variant(name, python, variants_file=variants_file)
        checks.append(replace(line, detail=line.detail + variant_notes(variants[name], flags)))
        exe = _interpreter(python)
        if exe is None:
            continue  # nothing to import into; the variant line already says so
        if exe not in plugins:  # stock and stock+fix share one environment
            plugins[exe] = check_plugin(name, exe)
            compiled[exe] = check_bytecode(name, exe)
        checks.append(replace(plugins[exe], name=f"plugin {name}"))
        checks.append(replace(compiled[exe], name=f"bytecode {name}"))
    allowlist = check_plugin_allowlist(os.environ)
    if allowlist is not None:
        checks.append(allowlist)
    if "current" in envs:
        current = envs["current"]
    else:
        current = _probe_quietly(variants["current"].python) if "current" in variants else None
    checks.append(check_gpu(shutil.which("nvidia-smi"), current))
    return checks


def _lock_check() -> Check:
    path = lock_path()
    return check_lock(path, lock_holder(path) if path else None)


def _interpreter(python: str) -> str | None:
    try:
        return resolve_interpreter(python)
    except BadInput:
        return None


def _probe_quietly(python: str) -> Environment | None:
    """The GPU line's view of ``current`` when it was not selected; its failures are not ours."""
    try:
        return probe(python)
    except HarnessError:
        return None
