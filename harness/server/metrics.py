"""Reading vLLM's Prometheus metrics into one normalized snapshot.

The text format is parsed by prometheus_client's own parser (never by regex), and
names are normalized across vLLM 0.27-0.33: the offload byte counters have a
deprecated twin (``vllm:kv_offload_total_bytes{transfer_type=...}``) in 0.27-0.32,
used only when the new counters are absent so nothing is counted twice. Counters
are summed over every label set (engines, TP ranks), since the round trip's
arithmetic is about what the whole server moved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness.names import DISK_TIER_LABEL, GAUGE_CPU_USAGE

Sources = list[tuple[str, dict[str, str]]]


def _offload(op: str, unit: str) -> Sources:
    """An offload counter, then its deprecated twin (see the module docstring)."""
    direction = "GPU_to_CPU" if op == "store" else "CPU_to_GPU"
    return [
        (f"vllm:kv_offload_{op}_{unit}", {}),
        (f"vllm:kv_offload_total_{unit}", {"transfer_type": direction}),
    ]


# normalized field -> (family name, label filter); first family present wins.
COUNTERS: dict[str, Sources] = {
    "stored_bytes": _offload("store", "bytes"),
    "loaded_bytes": _offload("load", "bytes"),
    "store_seconds": _offload("store", "time"),
    "load_seconds": _offload("load", "time"),
    "ext_hits": [("vllm:external_prefix_cache_hits", {})],
    "ext_queries": [("vllm:external_prefix_cache_queries", {})],
    "gpu_hits": [("vllm:prefix_cache_hits", {})],
    "gpu_queries": [("vllm:prefix_cache_queries", {})],
    "prompt_tokens": [("vllm:prompt_tokens", {})],
    "generation_tokens": [("vllm:generation_tokens", {})],
    "preemptions": [("vllm:num_preemptions", {})],
    # The CPU tier under pressure (commands/pressure): keys the store threshold turned
    # away (registered only with store_threshold >= 2), and prepare_store calls that
    # found no room (counted per attempt, retried each step).
    "stores_skipped": [("vllm:kv_offload_stores_skipped", {})],
    "store_failures": [("vllm:kv_offload_allocation_failure", {})],
    "local_compute_tokens": [("vllm:prompt_tokens_by_source", {"source": "local_compute"})],
    # The disk tier under the CPU tier (vLLM's tiering counters, 0.28+, labelled by
    # tier): bytes the CPU tier wrote through to it and read back (promoted) from it,
    # chunk lookups it answered with a hit, and failed writes (cascades) and reads.
    "disk_written_bytes": [("vllm:kv_offload_tiering_write_bytes", {"tier": DISK_TIER_LABEL})],
    "disk_read_bytes": [("vllm:kv_offload_tiering_read_bytes", {"tier": DISK_TIER_LABEL})],
    "disk_hits": [("vllm:kv_offload_tiering_chunk_hits", {"tier": DISK_TIER_LABEL})],
    "disk_write_failures": [
        ("vllm:kv_offload_tiering_cascade_job_failures", {"tier": DISK_TIER_LABEL})
    ],
    "disk_read_failures": [
        ("vllm:kv_offload_tiering_promotion_job_failures", {"tier": DISK_TIER_LABEL})
    ],
    # Hit tokens by the tier the connector says served them (0.32+): the CPU tier's
    # must be every external hit token a loaded chunk covers (commands/oracle).
    "host_hit_tokens": [("vllm:prompt_tokens_cached_by_source", {"source": "host"})],
    # The CPU tier's share in use (a gauge: read it, never subtract it): chunks held by a
    # request or a store in flight, so 0 whenever the server is idle.
    "cpu_usage": [(GAUGE_CPU_USAGE, {})],
    # A secondary tier's loads in flight (a gauge): the stall watch names such a tier
    # when the engine stops moving while they stay active.
    "promotions_active": [("vllm:kv_offload_tiering_active_promotion_jobs", {})],
}

# Histograms read as one of their samples: field -> (family, sample suffix). The CPU
# tier's allocations (the sum is the chunks it allocated), and the connector's lookups:
# each one made (sync) and each deferred request's wait for an asynchronous tier (async).
HISTOGRAMS: dict[str, tuple[str, str]] = {
    "allocated_chunks": ("vllm:kv_offload_cpu_allocation_size", "_sum"),
    "sync_lookups": ("vllm:kv_offload_lookup_sync_delay_seconds", "_count"),
    "async_lookups": ("vllm:kv_offload_lookup_async_delay_seconds", "_count"),
}

# Gauges of the disk tier's jobs in flight: a phase has settled only when both are 0.
DISK_JOBS = (
    "vllm:kv_offload_tiering_active_cascade_jobs",
    "vllm:kv_offload_tiering_active_promotion_jobs",
)


@dataclass
class Snapshot:
    """Cumulative counters at one moment; subtract two to get a phase's deltas."""

    stored_bytes: float = 0.0
    loaded_bytes: float = 0.0
    store_seconds: float = 0.0
    load_seconds: float = 0.0
    ext_hits: float = 0.0
    ext_queries: float = 0.0
    gpu_hits: float = 0.0
    gpu_queries: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0  # requests the scheduler preempted (stress: it must happen)
    stores_skipped: float = 0.0
    store_failures: float = 0.0
    local_compute_tokens: float = 0.0  # prompt tokens the engine computed itself
    disk_written_bytes: float = 0.0
    disk_read_bytes: float = 0.0
    disk_hits: float = 0.0
    disk_write_failures: float = 0.0
    disk_read_failures: float = 0.0
    host_hit_tokens: float = 0.0
    cpu_usage: float = 0.0  # a gauge
    promotions_active: float = 0.0  # a gauge: secondary-tier loads in flight
    allocated_chunks: float = 0.0
    sync_lookups: float = 0.0
    async_lookups: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def __sub__(self, other: Snapshot) -> Snapshot:
        return Snapshot(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )


@dataclass
class CacheConfig:
    """The live KV pool, from the ``vllm:cache_config_info`` gauge's labels."""

    num_gpu_blocks: int
    block_size: int
    labels: dict[str, str]

    @property
    def pool_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


def _counter_value(families: dict[str, Any], family: str, match: dict[str, str]) -> float | None:
    fam = families.get(family)
    if fam is None:
        return None
    total, seen = 0.0, False
    for sample in fam.samples:
        # Counters expose "<name>_total" (and "<name>_created", which is not a count).
        if sample.name not in (family + "_total", family):
            continue
        if any(sample.labels.get(k) != v for k, v in match.items()):
            continue
        total += float(sample.value)
        seen = True
    return total if seen else None


def parse(text: str) -> tuple[Snapshot, CacheConfig | None, set[str]]:
    """Snapshot, pool config and the metric family names present (for diagnostics)."""
    families = {fam.name: fam for fam in text_string_to_metric_families(text)}
    snap = Snapshot()
    for field_name, candidates in COUNTERS.items():
        for family, match in candidates:
            value = _counter_value(families, family, match)
            if value is not None:
                setattr(snap, field_name, value)
                break
    for field_name, (family, suffix) in HISTOGRAMS.items():
        fam = families.get(family)
        if fam is not None:
            values = [float(s.value) for s in fam.samples if s.name == family + suffix]
            if values:
                setattr(snap, field_name, sum(values))
    cache = None
    info = families.get("vllm:cache_config_info")
    if info is not None and info.samples:
        labels = dict(info.samples[0].labels)
        try:
            cache = CacheConfig(
                int(float(labels["num_gpu_blocks"])), int(float(labels["block_size"])), labels
            )
        except (KeyError, ValueError):
            cache = None
    return snap, cache, set(families)


# Exported from vLLM 0.28 (0.27's tiering counts only its lookup delays).
DISK_COUNTERS_FAMILY = "vllm:kv_offload_tiering_write_bytes"


def disk_counters_exported(text: str) -> bool:
    """Whether the server exports the disk tier's byte and hit counters."""
    return DISK_COUNTERS_FAMILY in text


def tier_usage(snap: Snapshot, text: str) -> float | None:
    """The CPU tier's usage gauge in ``snap`` (parsed from ``text``: the share of its
    chunks some request holds or is writing), or None where the server does not export
    it (``Snapshot.cpu_usage`` reads 0 then)."""
    return snap.cpu_usage if GAUGE_CPU_USAGE in text else None


def disk_jobs_in_flight(text: str) -> float:
    """The disk tier's cascade and promotion jobs still running (0 without a disk tier)."""
    families = {fam.name: fam for fam in text_string_to_metric_families(text)}
    return sum(_counter_value(families, name, {}) or 0.0 for name in DISK_JOBS)


# The scheduler's queues, as gauges (every release 0.27-0.33).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def queue_lengths(text: str) -> tuple[float, float] | None:
    """The scheduler's (running, waiting) requests; None when the server exports neither."""
    families = {fam.name: fam for fam in text_string_to_metric_families(text)}
    running, waiting = _counter_value(families, RUNNING, {}), _counter_value(families, WAITING, {})
    if running is None and waiting is None:
        return None
    return running or 0.0, waiting or 0.0


def offload_metrics_present(names: set[str]) -> bool:
    return any(n.startswith("vllm:kv_offload_") for n in names)
