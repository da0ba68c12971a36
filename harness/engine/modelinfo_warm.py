"""Fill vLLM's model-class cache for several architectures in one process.

Before its engine starts, vLLM's API server inspects the model class (which interfaces
it implements) in a fresh subprocess, so as never to initialise CUDA in the server, and
keeps the answer in ``$VLLM_CACHE_ROOT/modelinfos/`` keyed by the model file's hash.
On an empty cache that subprocess is a cold import of vLLM and torch: 10-12 s here, once
per build and architecture, and a corpus run meets four or five architectures on each of
seven releases. This module, run in the build's own interpreter with the same cache
root, answers them all in one process: vLLM's own inspection and cache writing, with
only its subprocess step run in place (this process is thrown away, so initialising
anything in it is harmless). An architecture the build does not register, or whose
inspection fails, is reported and left for vLLM to inspect at launch as it would.

Run as ``python -m harness.engine.modelinfo_warm ARCH...``; prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def warm(archs: Sequence[str]) -> dict[str, Any]:
    """Inspect each architecture through vLLM's registry, its subprocess run here."""
    t0 = time.monotonic()
    import vllm
    from vllm.model_executor.models import registry

    def in_place(fn: Callable[[], Any]) -> Any:
        return fn()

    # The one private name used; where a build lacks it, each inspection spawns its own
    # subprocess as vLLM would at launch (slower, still right).
    in_process = hasattr(registry, "_run_in_subprocess")
    if in_process:
        registry._run_in_subprocess = in_place
    warmed: list[str] = []
    unknown: list[str] = []
    failed: dict[str, str] = {}
    for arch in dict.fromkeys(archs):
        model = registry.ModelRegistry.models.get(arch)
        if model is None:
            unknown.append(arch)
            continue
        try:
            model.inspect_model_cls()
        except Exception as exc:  # left for vLLM's own inspection at launch
            failed[arch] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        warmed.append(arch)
    return {
        "vllm_version": str(vllm.__version__),
        "in_process": in_process,
        "warmed": warmed,
        "unknown": unknown,
        "failed": failed,
        "seconds": round(time.monotonic() - t0, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    archs = list(sys.argv[1:] if argv is None else argv)
    print(json.dumps(warm(archs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
