"""vLLM ``general_plugins`` entry point: applies the patch named by the launcher.

vLLM loads this in every process it starts (API server, EngineCore, workers), which
is the only place a patch can reach all of them. Without ``OFFLOAD_CHECK_PATCH`` it
applies no patch, so having the harness installed never changes a user's vLLM's
code. With ``OFFLOAD_CHECK_COVER`` set it records which lines of that one file the
process executes (``harness.engine.reach``, for mutate). With
``OFFLOAD_CHECK_REPORT_SPECS=1`` it also reports the KV-cache groups the engine built
(``harness.engine.specs``), which only prints and changes no behaviour.

One environment fix runs first, whatever the patch: on CPUs with AMX the process
asks Linux for AMX tile permission (``harness.engine.amx``), which vLLM's CPU
attention needs and never asks for; ``OFFLOAD_CHECK_AMX=off`` switches it off.
"""

from __future__ import annotations

import logging
import os
import sys

from harness.engine.amx import apply_in_process
from harness.engine.crash_handler import rearm
from harness.engine.patches import LOG_PREFIX, apply
from harness.engine.reach import install as trace_lines
from harness.engine.specs import install, install_kernel_report
from harness.names import ENV_COVER, ENV_PATCH, ENV_REPORT_SPECS

logger = logging.getLogger("vllm.offload_check.plugin")


def register() -> None:
    rearm()
    apply_in_process()
    if os.environ.get(ENV_COVER):
        trace_lines()  # offload-check mutate: which lines of its target this process ran
    if os.environ.get(ENV_REPORT_SPECS) == "1":
        install()
        install_kernel_report()
    patch = os.environ.get(ENV_PATCH, "").strip()
    if not patch or patch == "none":
        return

    try:
        report = apply(patch)
    except Exception as err:  # a patch that cannot apply must not look like a pass
        print(f"{LOG_PREFIX} {patch} failed: {type(err).__name__}: {err}", file=sys.stderr)
        raise
    # stderr directly, not only the logger: the harness greps the server log for it,
    # and logging may not be configured yet in every process.
    print(f"{report.line()} pid={os.getpid()}", file=sys.stderr, flush=True)
    if report.status == "not-found":
        raise RuntimeError(report.line())
