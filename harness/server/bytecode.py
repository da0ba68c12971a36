"""Bytecode in the vLLM environments: without it every vLLM process compiles vLLM anew.

A launch is three Python processes started one after another (API server, EngineCore,
worker), and each imports vLLM and torch. Python caches what it compiles in
``__pycache__``, but only when it may write there: these machines, CI and many
container images set ``PYTHONDONTWRITEBYTECODE=1``, and uv (unlike pip) installs no
bytecode unless asked. Then nothing is ever cached and every process pays the compile:
``import vllm.entrypoints.openai.api_server`` measured 26.0 s without bytecode and
11.6 s with it (FACTS.md), three times per launch.

So every environment the harness makes is compiled at install (uv's
``--compile-bytecode``), and this module checks and repairs environments made before
that (``python -m harness.server.bytecode ensure [PYTHON]``, which the Makefile runs), and
tells ``doctor`` which variant lacks it. Standard library only: the bootstrap
interpreter and every variant's run it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from harness.server.interpreters import tagged_report

# The packages every vLLM process imports; the compile of these is the launch cost.
PACKAGES = ("vllm", "torch", "transformers")
# Below this share of a package's modules with bytecode, the environment is "without".
COMPILED_ENOUGH = 0.9

_CHECK = r"""
import importlib.util, json, os, sys, sysconfig
out = {"site": sysconfig.get_paths()["purelib"], "packages": {}}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        continue
    total = compiled = 0
    for root in spec.submodule_search_locations:
        for d, _, files in os.walk(root):
            for f in files:
                if f.endswith(".py"):
                    total += 1
                    compiled += os.path.exists(importlib.util.cache_from_source(os.path.join(d, f)))
    out["packages"][name] = [compiled, total]
print("OFFLOAD_CHECK_BYTECODE " + json.dumps(out))
"""


@dataclass
class BytecodeState:
    """How much of each package of one interpreter has bytecode."""

    python: str
    site: str  # the environment's site-packages (purelib)
    packages: dict[str, tuple[int, int]]  # name -> (modules with bytecode, modules)

    def share(self, name: str) -> float:
        compiled, total = self.packages.get(name, (0, 0))
        return compiled / total if total else 1.0

    @property
    def missing(self) -> list[str]:
        """The packages below ``COMPILED_ENOUGH``."""
        return [n for n in self.packages if self.share(n) < COMPILED_ENOUGH]


def check(python: str, packages: Sequence[str] = PACKAGES) -> BytecodeState:
    """Ask ``python`` (without importing anything heavy) how much bytecode it holds."""
    proc = subprocess.run(
        [python, "-c", _CHECK, *packages],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    data = tagged_report(proc, "OFFLOAD_CHECK_BYTECODE")
    if isinstance(data, str):
        raise RuntimeError(f"{python} could not report its bytecode: {data}")
    return BytecodeState(
        python,
        str(data["site"]),
        {k: (int(v[0]), int(v[1])) for k, v in data["packages"].items()},
    )


def compile_command(state: BytecodeState) -> list[str]:
    """What compiles the environment: its own interpreter (the bytecode must match its
    version), every core, quietly; a module that does not compile is skipped."""
    return [state.python, "-m", "compileall", "-q", "-j", "0", state.site]


def ensure(python: str) -> BytecodeState:
    """Compile ``python``'s site-packages when a package lacks bytecode; the state after."""
    state = check(python)
    if state.missing:
        # compileall exits 1 when some module has a syntax error (vLLM ships a few
        # templates named .py); those are not imported, so that is not a failure.
        subprocess.run(compile_command(state), stdin=subprocess.DEVNULL, check=False)
        state = check(python)
    return state


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.server.bytecode {check|ensure} [PYTHON]`` (default: this interpreter)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("check", "ensure") or len(args) > 2:
        print("usage: python -m harness.server.bytecode {check|ensure} [PYTHON]", file=sys.stderr)
        return 2
    python = args[1] if len(args) > 1 else sys.executable
    try:
        state = ensure(python) if args[0] == "ensure" else check(python)
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        print(f"bytecode: {err}", file=sys.stderr)
        return 2
    shares = ", ".join(f"{n} {state.share(n):.0%}" for n in state.packages)
    print(f"bytecode in {state.site}: {shares}")
    return 1 if state.missing else 0


if __name__ == "__main__":
    sys.exit(main())
