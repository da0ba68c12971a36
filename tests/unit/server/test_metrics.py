"""Metrics parsing: summed over ranks, normalized across vLLM versions."""

from __future__ import annotations

from harness.server import metrics

NEW = """# HELP vllm:kv_offload_store_bytes_total Bytes stored
# TYPE vllm:kv_offload_store_bytes_total counter
vllm:kv_offload_store_bytes_total{engine="0",rank="0"} 1000.0
vllm:kv_offload_store_bytes_total{engine="0",rank="1"} 1000.0
vllm:kv_offload_store_bytes_created{engine="0",rank="0"} 1.7e9
# TYPE vllm:kv_offload_total_bytes_total counter
vllm:kv_offload_total_bytes_total{transfer_type="GPU_to_CPU"} 2000.0
vllm:kv_offload_total_bytes_total{transfer_type="CPU_to_GPU"} 512.0
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0"} 1248.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",kv_cache_size_tokens="3072",num_gpu_blocks="96"} 1.0
"""


def test_sums_ranks_and_ignores_created():
    snap, cache, names = metrics.parse(NEW)
    assert snap.stored_bytes == 2000.0  # two ranks, _created not counted
    assert snap.ext_hits == 1248.0
    assert cache is not None and cache.num_gpu_blocks == 96 and cache.block_size == 16
    assert cache.labels["kv_cache_size_tokens"] == "3072"
    assert metrics.offload_metrics_present(names)


def test_deprecated_twin_used_only_when_new_counter_is_absent():
    snap, _, _ = metrics.parse(NEW)
    # load has no new-style counter here: the deprecated CPU_to_GPU series is used,
    # and store is not double counted with its GPU_to_CPU twin.
    assert snap.loaded_bytes == 512.0
    assert snap.stored_bytes == 2000.0


def test_snapshot_subtraction():
    a = metrics.Snapshot(stored_bytes=10, ext_hits=5)
    b = metrics.Snapshot(stored_bytes=4, ext_hits=1)
    assert (a - b).stored_bytes == 6 and (a - b).ext_hits == 4


def test_no_offload_metrics():
    _, cache, names = metrics.parse(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
    )
    assert cache is None and not metrics.offload_metrics_present(names)


def test_queue_lengths_from_the_scheduler_gauges():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
    )
    assert metrics.queue_lengths(text) == (1.0, 2.0)
    only_running = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n"
    assert metrics.queue_lengths(only_running) == (3.0, 0.0)
    assert metrics.queue_lengths(NEW) is None  # a server exporting neither says so


def test_the_tier_usage_gauge_is_read_only_where_exported():
    gauge = (
        "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge\n"
        'vllm:kv_offload_cpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    )
    assert metrics.tier_usage(metrics.parse(gauge)[0], gauge) == 0.25
    # A release without the gauge: no reading (the snapshot's field says 0 there).
    assert metrics.tier_usage(metrics.parse(NEW)[0], NEW) is None
