"""pip's effective package sources as uv flags: uv does not read pip's config, so what
``pip config list`` says (find-links, index-url, extra-index-url, constraint, no-index)
is passed to uv as flags, by release environments (``harness.server.build_envs``) and
by the Makefile (``python -m harness.server.uv_flags uv-flags``): one translation, not two.

Standard library only (the Makefile runs this module with a bare bootstrap interpreter).
"""

from __future__ import annotations

import ast
import contextlib
import os
import shlex
import subprocess
import sys
import urllib.parse
from collections.abc import Sequence

_PIP_RANK = {":env:": 0, "install": 1, "global": 2}
_TRUE = ("1", "true", "yes", "on")


def _usable(location: str) -> bool:
    """A local location must exist (pip ignores a missing one, uv would fail on it)."""
    if location.startswith("file:"):
        return os.path.exists(urllib.parse.unquote(urllib.parse.urlparse(location).path))
    return "://" in location or os.path.exists(location)


def pip_config_list(python: str | None = None) -> str:
    """``pip config list`` as ``python`` (default: this interpreter) sees it; empty when
    pip cannot be run there."""
    try:
        proc = subprocess.run(
            [python or sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def uv_flags_from_pip_config(config_list: str | None = None) -> list[str]:
    """pip's effective find-links / index-url / extra-index-url / constraint / no-index as
    uv flags.

    ``config_list`` is ``pip config list`` output (asked of this interpreter when None):
    a setting from the environment (``:env:``, the ``PIP_*`` variables) wins over
    ``[install]``, which wins over ``[global]``. Local locations that do not exist are
    dropped (pip ignores them, uv would fail); constraint files are kept as they are (pip
    fails on a missing one too). No pip config gives no flags. The caller adds
    ``--index-strategy unsafe-best-match`` so uv picks across indexes as pip does.
    """
    text = pip_config_list() if config_list is None else config_list
    best: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        key, _, raw = line.partition("=")
        section, _, name = key.strip().partition(".")
        if section not in _PIP_RANK or _PIP_RANK[section] >= best.get(name, (9, ""))[0]:
            continue
        with contextlib.suppress(ValueError, SyntaxError):
            best[name] = (_PIP_RANK[section], str(ast.literal_eval(raw.strip())))

    def values(name: str) -> list[str]:
        return best.get(name, (9, ""))[1].split()

    flags: list[str] = []
    for url in values("index-url")[:1]:
        flags += ["--index-url", url]
    for url in values("extra-index-url"):
        flags += ["--extra-index-url", url] if _usable(url) else []
    for loc in values("find-links"):
        flags += ["--find-links", loc] if _usable(loc) else []
    flags += [f for path in values("constraint") for f in ("--constraint", path)]
    no_index = values("no-index")[:1]
    if no_index and no_index[0].lower() in _TRUE:
        flags.append("--no-index")
    return flags


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.server.uv_flags uv-flags``: pip's sources as uv flags
    (the Makefile)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["uv-flags"]:
        print(shlex.join(uv_flags_from_pip_config()))
        return 0
    print("usage: python -m harness.server.uv_flags uv-flags", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
