"""Scheduler-level cases about what the CPU tier admits and stores: no assertion fires,
vLLM quietly stores too little or too much, so each case judges what it saw against what
vLLM should have done (``Drive.fail``).

Run like every case, by ``python -m harness.engine.scheduler_drive CASE`` in a release's
interpreter (the cases here add themselves to ``drive_case.CASES`` when that module
imports this one). Requests are served one at a time, start to finish, through vLLM's own
``Scheduler``, the ``OffloadingConnector``'s scheduler side and the CPU manager
(``scheduler_rig.Rig``); the fake worker reports every transfer done at the end of its
step, and the GPU prefix cache is reset before each request, so every hit is the CPU
tier's.

Loaded with a vLLM interpreter: the standard library, vLLM and ``harness.engine`` only.
"""

from __future__ import annotations

from typing import Any

from harness.engine.drive_case import Drive, case
from harness.engine.drive_report import SetupError, ranges_of
from harness.engine.scheduler_rig import Rig

MAX_STEPS = 256  # one request alone, its prompt in a step or a few, then its decode


class StoreSpy:
    """Every ``prepare_store`` of the CPU manager: the keys offered and the keys it took
    (``keys_to_store``), in call order."""

    def __init__(self, rig: Rig) -> None:
        self.calls: list[tuple[list[bytes], list[bytes]]] = []
        prepare_store = rig.manager.prepare_store

        def spy(keys: Any, *args: Any, **kw: Any) -> Any:
            offered = list(keys)
            out = prepare_store(offered, *args, **kw)
            took = list(out.keys_to_store) if out is not None else []
            self.calls.append((offered, took))
            return out

        rig.manager.prepare_store = spy

    def stored_since(self, mark: int) -> list[bytes]:
        return [k for _, took in self.calls[mark:] for k in took]


def serve_alone(rig: Rig, req_id: str, tokens: list[int], max_tokens: int = 2) -> Any:
    """One request from an empty GPU prefix cache to finished, its stores landed."""
    rig.scheduler.reset_prefix_cache()
    req = rig.request(req_id, tokens, max_tokens)
    rig.scheduler.add_request(req)
    for _ in range(MAX_STEPS):
        if req.is_finished() and not rig.offload.has_pending_push_work():
            return req
        rig.finish_step(rig.scheduler.schedule())
    raise SetupError(f"request {req_id} not done after {MAX_STEPS} steps")


@case(
    "tracker-overflow",
    bug="PR #54759",
    fixed_in="0.30.0",
    judged_by="threshold-admits",
)
def tracker_overflow(drive: Drive) -> None:
    """An offer larger than the threshold tracker evicts its own candidates: nothing is stored.

    PR #54759 "[Bugfix][KV Offload] Ensure tracker progress for oversized offers" (in
    0.30.0). With ``store_threshold`` 2 a chunk is stored once it has been offered twice,
    and the offers are counted in an LRU table of ``max_tracker_size`` keys. From 0.29.0
    (PR #52227 moved the count from ``lookup`` to ``prepare_store``) each key of an offer
    was counted one at a time, evicting the oldest tracked key when the table was full:
    an offer of more chunks than the table holds evicts its own first candidates before
    the next request offers them again, so every count stays at 1 and the CPU tier never
    stores anything (the PR: "affected requests previously produced no CPU stores at
    all"). From 0.30.0 the keys already tracked are counted and protected first, and new
    keys are admitted only in place of keys the offer does not hold.

    The PR's own shape: a prompt of four whole chunks, ``max_tracker_size`` 3, threshold 2,
    sent three times. Whatever the table's order, the chunks offered by the first two
    requests are offered twice, so by the third request the tier must hold some of them
    and the third request must hit (``threshold-admits``). Before 0.29.0 the count lived
    in ``lookup``, one chunk a request (#52227's entry): not this bug, and not judged.
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    rig = Rig(
        drive,
        [("full", fa)],
        extra_config={"blocks_per_chunk": 16, "store_threshold": 2, "max_tracker_size": 3},
    )
    try:
        spy = StoreSpy(rig)
        tpc = rig.tokens_per_chunk[0]
        prompt = list(range(1000, 1000 + 4 * tpc + tpc // 4))  # four whole chunks and a tail
        manager_threshold = getattr(rig.manager, "store_threshold", None)
        tracker = getattr(rig.manager, "max_tracker_size", None)
        if manager_threshold != 2 or tracker != 3:
            raise SetupError(
                f"the CPU manager took store_threshold={manager_threshold}, "
                f"max_tracker_size={tracker} (asked 2, 3)"
            )
        drive.figures.update(
            prompt_tokens=len(prompt),
            tokens_per_chunk=tpc,
            store_threshold=2,
            max_tracker_size=3,
        )
        hits: list[int] = []
        stored: list[str] = []
        for i in range(3):
            name = f"r{i}"
            mark, seen = len(spy.calls), len(rig.lookups)
            serve_alone(rig, name, prompt)
            lookup = [x for x in rig.lookups[seen:] if x["req"] == name]
            hits.append(int(lookup[-1]["cpu_hit"] or 0) if lookup else 0)
            keys = rig.offload_keys(name)[0]
            took = set(spy.stored_since(mark))
            stored.append(ranges_of([j for j, k in enumerate(keys) if k in took]))
            drive.step(f"request {name}: CPU hit {hits[-1]} tokens, chunks stored {stored[-1]}")
        drive.figures.update(cpu_hit_tokens=hits, chunks_stored=stored)
        if all(s == "-" for s in stored) or hits[-1] == 0:
            drive.fail(
                "threshold-admits",
                f"the prompt's {len(prompt) // tpc} chunks offered in three requests: "
                f"stored {stored}, the third request hit {hits[-1]} tokens",
            )
    finally:
        rig.close()
