"""roundtrip: offloaded KV must survive GPU eviction and come back exact.

The library half of the ``roundtrip`` command. A server runs with the offloading
connector; target prompts are sent cold (stored to the CPU tier) and warm (served
from the GPU prefix cache: the reference output); unrelated filler traffic sized
from the live pool evicts the GPU cache (never a reset endpoint, which can also drop
the connector's index); the targets are replayed and must now come from the
connector. Every phase ends with a metrics snapshot; the checks in
``harness.commands.roundtrip.checks`` compare the deltas with figures planned from the
model geometry.

By job: ``plan`` (before launch, and the filler sized from the live pool), ``run``
(launch or attach, phases, baseline), ``evaluate`` (the checks), ``attach`` (planning
against a running server), ``result`` (what a run observed).
"""

from harness.commands.roundtrip.attach import attach_plan
from harness.commands.roundtrip.evaluate import evaluate
from harness.commands.roundtrip.plan import (
    DISK_DIR_PLACEHOLDER,
    RoundtripOptions,
    RoundtripPlan,
    build_local_model,
    plan_roundtrip,
    resolve_disk,
    size_filler,
)
from harness.commands.roundtrip.result import PhaseResult, RoundtripResult
from harness.commands.roundtrip.run import (
    PHASES,
    Endpoint,
    EngineFailure,
    RoundtripReporter,
    StartupFailure,
    execute_roundtrip,
    read_engine_layout,
    run_round,
    save_requests,
    start_server,
)

__all__ = [
    "DISK_DIR_PLACEHOLDER",
    "PHASES",
    "Endpoint",
    "EngineFailure",
    "PhaseResult",
    "RoundtripOptions",
    "RoundtripPlan",
    "RoundtripReporter",
    "RoundtripResult",
    "StartupFailure",
    "attach_plan",
    "build_local_model",
    "evaluate",
    "execute_roundtrip",
    "plan_roundtrip",
    "read_engine_layout",
    "resolve_disk",
    "run_round",
    "save_requests",
    "size_filler",
    "start_server",
]
