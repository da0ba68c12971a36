"""vLLM's own CPU offloading manager and policy, fed a request sequence in its scheduler's
call order, with no engine: the pressure command's diagnosis (docs/pressure-design.md
§2.2).

When a pressure run differs from the harness's oracle
(``harness.commands.pressure.oracle``), this says where: if vLLM's manager in the same
order does what the run did, the manager or its policy differs from the oracle (an
upstream policy bug, or a rule the oracle does not know); if not, the scheduler, the
worker or the metrics deviate. It runs in the variant's interpreter (``python -m
harness.engine.manager_replay``, one JSON document on stdout) and is never a verdict.

The order, one request at a time with the GPU prefix cache off (scheduler.py of
0.31-0.33): the lookup from chunk 0 stops at the first miss; the hit chunks are loaded
(``prepare_load`` pins them, ``complete_load`` unpins them before the request computes);
the chunks after the hit are offered to ``prepare_store`` (``None``: no room, nothing
stored), whose store completes; the request finishes. Releases before 0.31 touch keys
from the scheduler instead and are not replayed here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from harness.engine import reach

CHUNK_TOKENS = 256  # only the order of the keys' positions matters to the manager
# The replay ran and vLLM's manager raised (an engine would have died of it): not a bad
# request (2), and told apart from an interpreter that cannot import vLLM at all.
EXIT_RAISED = 3


def replay(
    requests: Sequence[tuple[str, int]],
    capacity: int,
    policy: str = "lru",
    store_threshold: int = 0,
    policy_module: str | None = None,
) -> list[dict[str, Any]]:
    """Each request ``(prompt, chunks)`` through one manager of ``capacity`` slots; per
    request its hit, the chunks stored, evicted and skipped, and whether the store
    failed (chunk names as the oracle writes them: ``A1``..). ``policy_module`` loads
    ``policy`` out of tree, as ``cache_policy_module_path`` does (the seeded mutants of
    ``harness.engine.policies``)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(
        num_chunks=capacity,
        cache_policy=policy,
        cache_policy_module_path=policy_module,
        store_threshold=store_threshold,
    )
    names: dict[bytes, str] = {}
    steps = []
    for index, (prompt, chunks) in enumerate(requests):
        keys = []
        for i in range(1, chunks + 1):
            key = make_offload_key(f"{prompt}{i}".encode(), 0)
            names[key] = f"{prompt}{i}"
            keys.append(key)
        ctx = ReqContext(req_id=f"{index}-{prompt}")
        for i, key in enumerate(keys, 1):
            ctx.set_offload_key_position(key, i * CHUNK_TOKENS)
        manager.on_new_request(ctx)
        hit = 0
        while hit < len(keys) and manager.lookup(keys[hit], ctx) is LookupResult.HIT:
            hit += 1
        if hit:
            manager.prepare_load(keys[:hit], ctx)
            manager.complete_load(keys[:hit], ctx)
        skipped_before = manager.stores_skipped_in_current_batch
        out = manager.prepare_store(keys[hit:], ctx)
        skipped = manager.stores_skipped_in_current_batch - skipped_before
        if out is not None:
            manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
        steps.append(
            {
                "request": prompt,
                "hit": hit,
                "stored": [names[k] for k in out.keys_to_store] if out else [],
                "evicted": [names[k] for k in out.evicted_keys] if out else [],
                "skipped": skipped,
                "failed": out is None,
            }
        )
    return steps


Parsed = tuple[list[tuple[str, int]], int, str, int, str | None]


def _parse(spec: Any) -> Parsed:
    """One replay's request, or ValueError/KeyError/TypeError naming what is wrong."""
    requests = [(str(p), int(n)) for p, n in spec["requests"]]
    module = spec.get("policy_module")
    return (
        requests,
        int(spec["capacity"]),
        str(spec.get("policy", "lru")),
        int(spec.get("store_threshold", 0)),
        None if module is None else str(module),
    )


def main(argv: Sequence[str]) -> int:
    """``python -m harness.engine.manager_replay '<json>'``: the JSON holds ``requests``
    ([[prompt, chunks], ...]), ``capacity``, ``policy``, ``store_threshold`` and
    ``policy_module``; or is a list of such, answered by a list (one interpreter start
    for many replays)."""
    if len(argv) != 1:
        print("usage: python -m harness.engine.manager_replay '<json request>'", file=sys.stderr)
        return 2
    reach.install()  # mutate's line coverage, when it asks (OFFLOAD_CHECK_COVER)
    try:
        spec = json.loads(argv[0])
        many = isinstance(spec, list)
        parsed = [_parse(one) for one in (spec if many else [spec])]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        print(f"manager_replay: bad request {argv[0]!r}: {err!r}", file=sys.stderr)
        return 2
    try:
        results = [replay(*one) for one in parsed]
    except Exception as err:  # vLLM's manager or policy raised: what an engine would die of
        print(f"manager_replay: vLLM's manager raised {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_RAISED
    print(json.dumps(results if many else results[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
