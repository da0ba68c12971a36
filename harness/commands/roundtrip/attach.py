"""Attach mode (``roundtrip --url``): plan against a server someone else runs."""

from __future__ import annotations

from pathlib import Path

from harness.commands.roundtrip.plan import RoundtripPlan, _validate_lengths, targets_and_expected
from harness.errors import BadInput, HarnessError
from harness.scenario.roundtrip import RoundtripScenario
from harness.scenario.schema import load_model_config
from harness.server import kv_layout, metrics, model_builder
from harness.server.launcher import http_json


def attach_plan(scn: RoundtripScenario, url: str, config: str | None = None) -> RoundtripPlan:
    """Plan against a server someone else runs: what a launch would know comes from it.

    The pool and KV block size come from ``/metrics``, the model and its length limit
    from ``/v1/models``. Without ``--config`` the layer kinds are unknown, so bytes per
    token are measured in the cold phase and the load can only be bounded.
    """
    if scn.offload.disk is not None:
        raise BadInput(
            "--url attaches to a server someone else launched: a disk tier's directory "
            "and its restart belong to a launch ([offload.disk])"
        )
    base = url.rstrip("/")
    try:
        models = http_json(f"{base}/v1/models", None, 30)
        text = http_json(f"{base}/metrics", None, 30)
    except HarnessError as err:
        raise BadInput(f"cannot reach {base}: {err}") from None
    data = (models or {}).get("data") if isinstance(models, dict) else None
    if not data:
        raise BadInput(f"{base}/v1/models lists no model")
    model = data[0]
    _, cache, names = metrics.parse(str(text))
    if not metrics.offload_metrics_present(names):
        raise BadInput(
            f"{base} exposes no vllm:kv_offload_* metrics: is the OffloadingConnector enabled?"
        )
    if cache is None:
        raise BadInput(f"{base} exposes no vllm:cache_config_info")
    scn.server.max_model_len = int(model.get("max_model_len") or scn.server.max_model_len)
    c = scn.offload.block_size or cache.block_size
    _validate_lengths(scn, c)
    geometry = None
    # Ids from [16, 1024): every real vocabulary has them; a known config allows more.
    vocab = 1024
    layout: list[kv_layout.KindLayout] = []
    state_bytes = 0
    if config:
        geometry = load_model_config(Path(config))
        model_builder.check_buildable(geometry, config)
        layout = kv_layout.predict(geometry)
        state_bytes = kv_layout.mamba_state_bytes(geometry)
        vocab = int(model_builder.text_config(geometry)["vocab_size"])
    targets, expected = targets_and_expected(scn, vocab, c, layout, cache.block_size, state_bytes)
    expected.exact_load = geometry is not None
    notes = () if geometry is not None else (ATTACH_WITHOUT_CONFIG,)
    mid, block = str(model["id"]), cache.block_size
    # Positional in field order: model_ref and served_name are both the served id.
    return RoundtripPlan(
        scn, "attached", geometry, mid, mid, block, c, expected, targets, vocab, notes, url=base
    )


ATTACH_WITHOUT_CONFIG = (
    "attach mode without --config: KV bytes per token measured from the cold phase "
    "(so the stored-bytes check holds by construction) and the replay load bounded, not exact"
)
