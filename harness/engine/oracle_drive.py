"""A generated request sequence through vLLM's real scheduler, in one process: what it did.

The oracle judges what vLLM's offloading connector should have done for each request
(``harness.oracle.scheduler``). A live server shows that through its counters and the
host backend's transfer trace, one launch per model and a second or more per request.
Here vLLM's own ``Scheduler``, the ``OffloadingConnector``'s scheduler side and the CPU
manager (``scheduler_rig.Rig``) serve the same sequence with made-up KV-cache groups of
any family, thousands of requests a minute, so the model is held against the real
scheduler on far more sequences (and geometries) than servers could run, and a mutant of
the scheduler is judged in seconds. Only the worker is not vLLM's: a job is done at the
end of its step, and no model runs (every sampled token is 7).

``python -m harness.engine.oracle_drive SEQUENCE.json`` (a release's interpreter, the
checkout on ``PYTHONPATH``): the sequence names the groups, the offload settings and the
steps (requests and tier resets, served one at a time, the GPU prefix cache reset before
each request so every lookup starts at token 0). It prints one JSON line per step, then
one line with the vLLM version and the settings the scheduler really used. Per request:
the connector's hit, per group the chunks and blocks loaded and stored (chunk indices
are the request's own), the hit tokens vLLM attributes to the host tier, the generated
tokens, and where vLLM raised (an exception ends the sequence: the engine would be dead).

Loaded with a vLLM interpreter: the standard library, vLLM and ``harness.engine`` only.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.engine import reach
from harness.engine.drive_report import (
    EXIT_BAD_INPUT,
    EXIT_NOT_SET_UP,
    EXIT_OK,
    SetupError,
    exception_text,
    innermost_vllm_frame,
    stdout_kept_for_result,
    traceback_frames,
)
from harness.engine.oracle_worker import ContentWorker
from harness.engine.patches import apply
from harness.engine.scheduler_rig import Rig, kwargs_for, load_vllm
from harness.names import (
    ENV_PATCH,
    GAUGE_CPU_READ_USAGE,
    GAUGE_CPU_USAGE,
    GAUGE_CPU_WRITE_USAGE,
    PATCH_NONE,
)

MAX_STEPS_PER_REQUEST = 4096  # a request that needs more is a stalled scheduler
PAGE_HEAD = 64  # the full-attention group of the largest block: head size 64, float32


class _Log:
    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, text: str) -> None:
        self.steps.append(text)


def _specs(groups: Sequence[dict[str, Any]]) -> tuple[list[tuple[str, Any]], int]:
    """vLLM KV-cache specs for the sequence's groups, one layer each, every page the same
    size (the hybrid allocator's rule): head sizes are chosen to make it so."""
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    top = max(int(g["block"]) for g in groups)
    page = 2 * top * PAGE_HEAD * 4  # K and V, one KV head, float32
    out: list[tuple[str, Any]] = []
    for i, g in enumerate(groups):
        kind, block, window = g["kind"], int(g["block"]), int(g.get("window") or 0)
        if page % (8 * block):
            raise SetupError(f"group {i}: block {block} does not divide the page {page}")
        attn = {
            "block_size": block,
            "num_kv_heads": 1,
            "head_size": page // (8 * block),
            "dtype": torch.float32,
        }
        spec: Any
        if kind == "full":
            spec = FullAttentionSpec(**attn)
        elif kind == "mla":
            attn["head_size"] = page // (4 * block)
            spec = MLAAttentionSpec(**kwargs_for(MLAAttentionSpec, **attn))
        elif kind == "sliding-window":
            spec = SlidingWindowSpec(**attn, sliding_window=window)
        elif kind == "chunked-local":
            spec = ChunkedLocalAttentionSpec(**attn, attention_chunk_size=window)
        elif kind == "mamba":
            state = {
                "block_size": block,
                "shapes": ((page // 4,),),
                "dtypes": (torch.float32,),
                "mamba_cache_mode": "align",
            }
            spec = MambaSpec(**kwargs_for(MambaSpec, **state))
        else:
            raise SetupError(f"group {i}: unknown kind {kind!r}")
        if spec.page_size_bytes != page:
            raise SetupError(f"group {i} ({kind}): page {spec.page_size_bytes} B, not {page}")
        out.append((f"{kind}-{i}", spec))
    return out, page


class OracleRig:
    """The rig with spies on what the connector decided, per request, and a worker that
    moves KV content (``oracle_worker``)."""

    def __init__(self, seq: dict[str, Any]) -> None:
        groups, self.page = _specs(seq["groups"])
        self.log = _Log()
        extra: dict[str, Any] = {
            "blocks_per_chunk": int(seq.get("blocks_per_chunk", 1)),
            "offload_prompt_only": bool(seq.get("offload_prompt_only", True)),
        }
        cache: dict[str, Any] = {}
        if "retention_interval" in seq:
            cache["prefix_cache_retention_interval"] = seq["retention_interval"]
        has_mamba = any(g["kind"] == "mamba" for g in seq["groups"])
        self.rig = Rig(
            self.log,
            groups,
            extra_config=extra,
            enable_prefix_caching=True,
            mamba_cache_mode="align" if has_mamba else None,
            num_gpu_blocks=int(seq.get("num_gpu_blocks", 4096)),
            max_num_batched_tokens=int(seq.get("max_batched_tokens", 8192)),
            max_model_len=int(seq.get("max_model_len", 32768)),
            cache_extra=cache,
            log_stats=True,
        )
        self.worker = ContentWorker(
            self.rig,
            delay=int(seq.get("store_delay", 0)),
            content_groups=frozenset(
                i for i, g in enumerate(seq["groups"]) if g["kind"] != "mamba"
            ),
        )
        self.overlap = bool(seq.get("overlap", False))
        self.defer_lookups = int(seq.get("defer_lookups", 0))
        self._deferrals: dict[str, int] = {}
        self.stores: list[tuple[list[bytes], list[bytes] | None]] = []
        self.sources: list[tuple[str, dict[str, int]]] = []  # (request, tokens by source)
        self.stats: list[dict[str, float]] = []
        off, mgr = self.rig.offload, self.rig.manager
        prepare_store, sources, get_stats = (
            mgr.prepare_store,
            # Where vLLM says a hit's tokens came from (0.30 on); older: not reported.
            getattr(off, "get_external_cache_hit_sources", None),
            off.get_stats,
        )
        prepare_load, complete_load, complete_store = (
            mgr.prepare_load,
            mgr.complete_load,
            mgr.complete_store,
        )
        # The tier's gauges held against the harness's own count of the chunks the
        # connector asked it to write and to read and has not completed (``tier-gauges``).
        self.writing: set[Any] = set()
        self.reading: Counter[Any] = Counter()
        self.gauge_errors: list[dict[str, Any]] = []
        self.chunks = int(getattr(mgr, "_num_chunks", 0))
        lookup, matched = mgr.lookup, self.rig.connector.get_num_new_matched_tokens

        def spy_store(keys: Any, *args: Any, **kw: Any) -> Any:
            out = prepare_store(keys, *args, **kw)
            kept = None if out is None else list(out.keys_to_store)
            self.stores.append((list(keys), kept))
            self.writing.update(kept or ())
            return out

        def spy_complete_store(keys: Any, *args: Any, **kw: Any) -> Any:
            self.writing.difference_update(keys)
            return complete_store(keys, *args, **kw)

        def spy_load(keys: Any, *args: Any, **kw: Any) -> Any:
            out = prepare_load(keys, *args, **kw)
            self.reading.update(keys)
            return out

        def spy_complete_load(keys: Any, *args: Any, **kw: Any) -> Any:
            self.reading.subtract(keys)
            self.reading += Counter()  # drop the keys no load holds any more
            return complete_load(keys, *args, **kw)

        def spy_sources(request: Any, num_external: int) -> Any:
            assert sources is not None
            out = sources(request, num_external)
            counts = {str(getattr(k, "value", k)): int(v) for k, v in out.items()}
            self.sources.append((str(request.request_id), counts))
            return out

        def spy_stats() -> Any:
            out = get_stats()
            if out is not None and hasattr(out, "reduce"):
                snap = {k: float(v) for k, v in out.reduce().items()}
                self.stats.append(snap)
                self._check_gauges(snap)
            return out

        def deferring_matched(request: Any, *args: Any, **kw: Any) -> Any:
            # An asynchronous tier's first answers: every chunk's place is not known yet.
            left = self._deferrals.setdefault(request.request_id, self.defer_lookups)
            self._deferring = left > 0
            self._deferrals[request.request_id] = max(0, left - 1)
            try:
                return matched(request, *args, **kw)
            finally:
                self._deferring = False

        def deferring_lookup(key: Any, ctx: Any) -> Any:
            if self._deferring:
                from vllm.v1.kv_offload.base import LookupResult

                return LookupResult.RETRY
            return lookup(key, ctx)

        self._deferring = False
        mgr.prepare_store = spy_store
        mgr.prepare_load, mgr.complete_load = spy_load, spy_complete_load
        mgr.complete_store = spy_complete_store
        self.reports_sources = sources is not None
        if sources is not None:
            off.get_external_cache_hit_sources = spy_sources
        off.get_stats = spy_stats
        if self.defer_lookups:
            mgr.lookup = deferring_lookup
            self.rig.connector.get_num_new_matched_tokens = deferring_matched

    def settings(self) -> dict[str, Any]:
        cfg = self.rig.offload.config
        return {
            "tokens_per_chunk": self.rig.tokens_per_chunk,
            "block_size": self.rig.block_size,
            "hash_block_size": self.rig.hash_block_size,
            "retention_interval": getattr(cfg, "retention_interval", "absent"),
            "alignment_tokens": getattr(cfg, "alignment_tokens", "absent"),
            "page_bytes": self.page,
            # ``kv_transfer_params.max_load_tokens`` (0.30 on): an older connector never
            # reads it, and its requests hit what the tier holds.
            "max_load_tokens": _reads_max_load_tokens(self.rig.offload),
        }

    def reset_tier(self) -> bool:
        """``/reset_prefix_cache?reset_external=true``: the GPU prefix cache and the tier
        (no write or read of it completes after that). False where the release cannot
        reset a connector (before 0.30): only the GPU cache is reset, the tier kept."""
        sched = self.rig.scheduler
        args = kwargs_for(sched.reset_prefix_cache, reset_connector=True)
        sched.reset_prefix_cache(**args)
        if not args:
            return False
        self.writing.clear()
        self.reading.clear()
        return True

    def _check_gauges(self, snap: dict[str, float]) -> None:
        """The usage gauges of one stats snapshot against the chunks in flight: written
        (stored, not yet completed) and read (loaded, not yet completed), over the tier's
        chunks. A release without a gauge is not judged on it."""
        if not self.chunks:
            return
        writing, reading = len(self.writing), len(self.reading)
        want = {
            GAUGE_CPU_USAGE: (writing + reading) / self.chunks,
            GAUGE_CPU_WRITE_USAGE: writing / self.chunks,
            GAUGE_CPU_READ_USAGE: reading / self.chunks,
        }
        for name, expected in want.items():
            got = snap.get(name)
            if got is not None and abs(got - expected) > 1e-9:
                self.gauge_errors.append(
                    {
                        "gauge": name,
                        "expected": expected,
                        "observed": got,
                        "writing": writing,
                        "reading": reading,
                        "chunks": self.chunks,
                    }
                )

    def _step(self) -> Any:
        rig = self.rig
        out = rig.scheduler.schedule()
        rig.finish_step(out, done=self.worker.step(out))
        return out

    def serve(self, steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Requests served at once (a wave, or one alone) start to finish; what the
        connector did for each. A wave's requests share no block, so every job, key and
        lookup is one request's; the tier's stats are the wave's (on its last record)."""
        from vllm.v1.request import RequestStatus

        rig = self.rig
        rig.scheduler.reset_prefix_cache()
        reqs = []
        for step in steps:
            name = str(step["request"])
            req = rig.request(
                name, [int(t) for t in step["tokens"]], int(step.get("max_tokens", 1))
            )
            if step.get("max_load_tokens") is not None:
                req.kv_transfer_params = {"max_load_tokens": step["max_load_tokens"]}
            rig.scheduler.add_request(req)
            reqs.append(req)
        statuses = [rig.offload._req_status[str(s["request"])] for s in steps]
        n_lookups, n_stores, n_sources = len(rig.lookups), len(self.stores), len(self.sources)
        n_loads, n_stats, n_errors = len(rig.loads), len(self.stats), len(self.worker.errors)
        n_gauges = len(self.gauge_errors)
        loads: dict[str, list[tuple[list[int], list[int]]]] = {r.request_id: [] for r in reqs}
        store_jobs: dict[str, list[tuple[list[int], list[int]]]] = {r.request_id: [] for r in reqs}
        resets_done: set[str] = set()
        kept_tier: set[str] = set()  # a reset the release could not make reach the tier
        together = 0  # the most of these requests one step scheduled
        for _ in range(MAX_STEPS_PER_REQUEST):
            if all(r.is_finished() for r in reqs) and (
                self.overlap or not (rig.offload.has_pending_push_work() or self.worker.pending)
            ):
                break
            out = self._step()
            together = max(together, sum(r in out.num_scheduled_tokens for r in loads))
            meta = out.kv_connector_metadata
            if meta is not None:
                for jobs, into, side in (
                    (meta.load_jobs, loads, "dst_spec"),
                    (meta.store_jobs, store_jobs, "src_spec"),
                ):
                    for job in jobs.values():
                        if job.req_id in into:
                            spec = getattr(job, side)
                            into[job.req_id].append(
                                (list(spec.group_sizes), list(spec.block_indices))
                            )
            for step, req in zip(steps, reqs, strict=True):
                made = len(req.output_token_ids)
                abort_after, reset_after = step.get("abort_after"), step.get("reset_after")
                due = reset_after is not None and made >= int(reset_after)
                if due and req.request_id not in resets_done:
                    if not self.reset_tier():
                        kept_tier.add(req.request_id)
                    resets_done.add(req.request_id)
                if abort_after is not None and not req.is_finished() and made >= int(abort_after):
                    rig.scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
        else:
            names = ", ".join(r.request_id for r in reqs)
            raise RuntimeError(f"request(s) {names} not done after {MAX_STEPS_PER_REQUEST} steps")
        records = []
        for req, status in zip(reqs, statuses, strict=True):
            name = req.request_id
            status.update_offload_keys()
            where = {
                key: (g, i)
                for g, state in enumerate(status.group_states)
                for i, key in enumerate(state.offload_keys)
            }
            stored: dict[int, list[int]] = {}
            offered: dict[int, list[int]] = {}
            for keys, kept in self.stores[n_stores:]:
                for key in keys:
                    if key in where:
                        offered.setdefault(where[key][0], []).append(where[key][1])
                for key in kept or ():
                    if key in where:
                        stored.setdefault(where[key][0], []).append(where[key][1])
            loaded: dict[int, list[int]] = {}
            for keys in rig.loads[n_loads:]:
                for key in keys:
                    if key in where:
                        loaded.setdefault(where[key][0], []).append(where[key][1])
            lookups = [x for x in rig.lookups[n_lookups:] if x["req"] == name]
            n_groups = len(status.group_states)
            records.append(
                {
                    "request": name,
                    "hit": next((x["cpu_hit"] for x in lookups if x["cpu_hit"] is not None), 0),
                    "lookups": len(lookups),
                    "deferred": sum(1 for x in lookups if x["cpu_hit"] is None),
                    "loads": _per_group(n_groups, loads[name], loaded),
                    "stores": _per_group(n_groups, store_jobs[name], stored),
                    "offered": {str(g): sorted(v) for g, v in sorted(offered.items())},
                    "sources": [s for r, s in self.sources[n_sources:] if r == name]
                    if self.reports_sources
                    else None,
                    "stats": {},
                    "content_errors": [],
                    "generated": list(req.output_token_ids),
                    "status": req.status.name,
                    **({"reset_kept_tier": True} if name in kept_tier else {}),
                }
            )
        # A content error is its request's; one of a request served before (its store
        # landing late, in the overlap mode) is the wave's last.
        by_name = {r["request"]: r for r in records}
        for err in self.worker.errors[n_errors:]:
            by_name.get(str(err.get("request")), records[-1])["content_errors"].append(err)
        records[-1]["stats"] = _summed(self.stats[n_stats:])
        records[-1]["gauges"] = {
            "snapshots": len(self.stats) - n_stats if self.chunks else 0,
            "wrong": self.gauge_errors[n_gauges:][:3],
            "wrong_count": len(self.gauge_errors) - n_gauges,
        }
        if len(records) > 1:
            records[-1]["wave_stats"] = len(records)
            records[-1]["together"] = together
        return records


def _reads_max_load_tokens(scheduler: Any) -> bool:
    """Whether the connector's scheduler module reads ``max_load_tokens`` at all."""
    module = inspect.getmodule(type(scheduler))
    try:
        return module is None or "max_load_tokens" in inspect.getsource(module)
    except (OSError, TypeError):
        return True  # no source to read: judged as the current release


def _served_together(steps: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A reset alone, a request alone, or a wave's requests (consecutive steps with one
    ``wave`` number) together."""
    out: list[list[dict[str, Any]]] = []
    for step in steps:
        wave = step.get("wave")
        if out and wave is not None and out[-1][-1].get("wave") == wave:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def _summed(snapshots: Sequence[dict[str, float]]) -> dict[str, float]:
    """The request's stats: counters and histogram counts and sums added up, gauges the
    last value (``_perc`` names)."""
    out: dict[str, float] = {}
    for snap in snapshots:
        for key, value in snap.items():
            out[key] = value if key.endswith("_perc") else out.get(key, 0.0) + value
    return out


def _per_group(
    n: int, jobs: list[tuple[list[int], list[int]]], chunks: dict[int, list[int]]
) -> list[dict[str, Any]]:
    """Per group: the chunk indices moved, the blocks, the first block's index."""
    out = []
    for g in range(n):
        sizes = [(sizes[g], idx[g]) for sizes, idx in jobs if g < len(sizes) and sizes[g]]
        out.append(
            {
                "chunks": sorted(chunks.get(g, [])),
                "blocks": sum(s for s, _ in sizes),
                "first_block": min((i for _, i in sizes), default=0),
            }
        )
    return out


def run_sequence(seq: dict[str, Any], out: Any, index: int = 0) -> int:
    """Every step of one sequence, one JSON line each (tagged with the sequence's index),
    then its summary line. vLLM must be imported already (``load_vllm``)."""
    t0 = time.monotonic()

    def write(record: dict[str, Any]) -> None:
        out.write(json.dumps({"sequence": index, **record}) + "\n")
        out.flush()

    try:
        rig = OracleRig(seq)
    except Exception as exc:
        write({"summary": True, "error": exception_text(exc), "served": 0})
        return EXIT_NOT_SET_UP
    served = 0
    try:
        i = 0
        for group in _served_together(seq["steps"]):
            if group[0].get("reset"):
                write({"step": i, "reset": True, "tier": rig.reset_tier()})
                i += 1
                continue
            try:
                records = rig.serve(group)
            except Exception as exc:
                frames = traceback_frames(exc.__traceback__)
                write(
                    {
                        "step": i,
                        "request": group[0].get("request"),
                        "raised": exception_text(exc),
                        "frame": innermost_vllm_frame(frames),
                        "traceback": traceback.format_exc(limit=-6)[-2000:],
                    }
                )
                break
            for record in records:
                write({"step": i, **record})
                i += 1
                served += 1
    finally:
        write(
            {
                "summary": True,
                "served": served,
                "settings": rig.settings(),
                "wall_s": round(time.monotonic() - t0, 2),
            }
        )
        rig.rig.close()
    return EXIT_OK


def _sequences(doc: Any) -> list[dict[str, Any]]:
    seqs = doc.get("sequences") if isinstance(doc, dict) and "sequences" in doc else [doc]
    if not isinstance(seqs, list) or not all(isinstance(s, dict) and s.get("groups") for s in seqs):
        raise ValueError("a sequence needs its groups")
    return seqs


def main(argv: Sequence[str] | None = None) -> int:
    """Run a file's sequences (one, or ``{"sequences": [...]}``) in this one process, or,
    with ``-``, each sequence read from standard input as one JSON line until it closes
    (the shrinker asks many in a row and pays vLLM's import once). The first line out
    names the vLLM version."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.engine.oracle_drive",
        description="Serve request sequences through vLLM's scheduler; what it did.",
    )
    parser.add_argument("sequence", help="the sequence file (JSON), or - for JSON lines on stdin")
    args = parser.parse_args(argv)
    seqs: list[dict[str, Any]] = []
    if args.sequence != "-":
        try:
            seqs = _sequences(json.loads(Path(args.sequence).read_text()))
        except (OSError, ValueError) as exc:
            print(f"oracle_drive: {args.sequence}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    # mutate's baseline: which lines of the target file the drive executes (as the
    # plugin does in a server's processes).
    reach.install()
    with stdout_kept_for_result() as out:
        t0 = time.monotonic()
        version = load_vllm()
        head: dict[str, Any] = {
            "vllm_version": version,
            "import_s": round(time.monotonic() - t0, 2),
        }
        patch = os.environ.get(ENV_PATCH, "").strip()
        if patch and patch != PATCH_NONE:
            # A seeded fault in vLLM's own scheduler or manager, as the plugin applies it
            # in a server's processes; the first line says whether it took.

            try:
                report = apply(patch)
            except Exception as exc:  # a patch that cannot apply must not look like a pass
                print(f"oracle_drive: patch {patch}: {type(exc).__name__}: {exc}", file=sys.stderr)
                return EXIT_NOT_SET_UP
            if report.status == "not-found":
                print(f"oracle_drive: {report.line()}", file=sys.stderr)
                return EXIT_NOT_SET_UP
            head["patch"] = report.line()
        out.write(json.dumps(head) + "\n")
        out.flush()
        worst = EXIT_OK
        if args.sequence != "-":
            for i, seq in enumerate(seqs):
                worst = max(worst, run_sequence(seq, out, i))
            return worst
        for i, line in enumerate(sys.stdin):
            try:
                (seq,) = _sequences(json.loads(line))
            except ValueError as exc:
                out.write(json.dumps({"sequence": i, "summary": True, "error": str(exc)}) + "\n")
                out.flush()
                continue
            worst = max(worst, run_sequence(seq, out, i))
        return worst


if __name__ == "__main__":
    sys.exit(main())
