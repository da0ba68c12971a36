"""The in-engine patches, applied to the installed vLLM and called on real specs.

Runs under both environments (``make test`` runs it with 0.27.1 and 0.32.0): on a
build without PR #51161 the fix must add the branch, on a build with it the fix is
a no-op, and the floor mutant must round down on both.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

patches = pytest.importorskip("harness.engine.patches")
kv_iface = pytest.importorskip("vllm.v1.kv_cache_interface")
sched = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler")


def make_spec(cls, **overrides):
    values = {
        "block_size": 128,
        "num_kv_heads": 2,
        "head_size": 32,
        "dtype": torch.bfloat16,
        "attention_chunk_size": 384,
        "sliding_window": 384,
    }
    values.update(overrides)
    required = {
        f.name: values[f.name]
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }  # type: ignore[misc]
    return cls(**required)


def window_fn():
    return sched.get_sliding_window_size_in_chunks


@pytest.fixture(autouse=True)
def restore():
    original = getattr(window_fn(), "__wrapped_original__", window_fn())
    yield
    for name in patches.TARGET_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "get_sliding_window_size_in_chunks"):
            mod.get_sliding_window_size_in_chunks = original


def build_has_fix() -> bool:
    return patches._has_chunked_branch(window_fn())


def test_stock_behaviour_is_what_the_issue_says():
    chunked = make_spec(kv_iface.ChunkedLocalAttentionSpec)
    if build_has_fix():
        assert window_fn()(chunked, 256) == 2
    else:
        with pytest.raises(AssertionError):
            window_fn()(chunked, 256)


def test_fix_rounds_up_and_leaves_other_specs_alone():
    report = patches.apply("chunked-local-fix")
    assert report.status == ("no-op" if build_has_fix() else "applied")
    chunked = make_spec(kv_iface.ChunkedLocalAttentionSpec)
    assert window_fn()(chunked, 256) == 2  # cdiv(384, 256)
    assert window_fn()(chunked, 128) == 3
    full = make_spec(kv_iface.FullAttentionSpec)
    assert window_fn()(full, 256) is None
    swa = make_spec(kv_iface.SlidingWindowSpec)
    assert window_fn()(swa, 128) >= 3


def test_floor_mutant_rounds_down_on_every_build():
    report = patches.apply("chunked-local-floor")
    assert report.status == "applied"
    chunked = make_spec(kv_iface.ChunkedLocalAttentionSpec)
    assert window_fn()(chunked, 256) == 1  # floor(384 / 256): the straddling chunk is lost
    assert window_fn()(chunked, 128) == 3  # dividing sizes are unaffected


def test_patches_are_idempotent_and_switchable():
    patches.apply("chunked-local-floor")
    again = patches.apply("chunked-local-floor")
    assert "(already)" in again.line() or again.status == "applied"
    patches.apply("chunked-local-fix")
    chunked = make_spec(kv_iface.ChunkedLocalAttentionSpec)
    assert window_fn()(chunked, 256) == 2


def test_unknown_patch_is_refused():
    with pytest.raises(ValueError):
        patches.apply("chunked-local-ceil")


def test_plugin_is_inert_without_the_variable(monkeypatch):
    from harness.engine import plugin

    monkeypatch.delenv(plugin.ENV_PATCH, raising=False)
    before = window_fn()
    plugin.register()
    assert window_fn() is before


def test_hits_minus_chunk_wraps_the_connector_lookup_once():
    cls = sched.OffloadingConnectorScheduler
    original = cls.get_num_new_matched_tokens
    try:
        assert patches.apply("hits-minus-chunk").status == "applied"
        wrapped = cls.get_num_new_matched_tokens
        assert getattr(wrapped, patches.MARK) == "hits-minus-chunk"
        assert "(already)" in patches.apply("hits-minus-chunk").line()
        assert cls.get_num_new_matched_tokens is wrapped

        class FakeGroup:
            tokens_per_chunk = 256

        class FakeSelf:
            config = type("C", (), {"kv_group_configs": (FakeGroup(),)})()

        cls.get_num_new_matched_tokens = original
        orig_calls = []

        def fake_orig(self, request, num_computed_tokens, *a, **k):
            orig_calls.append(num_computed_tokens)
            return num_computed_tokens, True

        cls.get_num_new_matched_tokens = fake_orig
        patches.apply("hits-minus-chunk")
        assert cls.get_num_new_matched_tokens(FakeSelf(), None, 768) == (512, True)
        # A one-chunk hit becomes none, and no load: vLLM asserts an asynchronous load
        # has tokens (the first version of the mutant crashed the engine there).
        assert cls.get_num_new_matched_tokens(FakeSelf(), None, 256) == (0, False)
    finally:
        cls.get_num_new_matched_tokens = original


def test_aborted_stores_prompt_brings_back_49118_for_aborted_requests_only():
    """The real ``storable_chunks`` of this build, on a request state with no GPU block:
    stock caps an aborted request at what it was given (none); the mutant asks for its
    whole prompt's keyed chunks, which ``_build_store_jobs`` asserts on (#49118)."""
    from types import SimpleNamespace

    from vllm.v1.request import RequestStatus

    cls = sched.RequestOffloadState
    original = cls.storable_chunks
    group = SimpleNamespace(tokens_per_chunk=256, is_eagle_group=False)
    state = SimpleNamespace(block_ids=[], offload_keys=["k0", "k1"])

    def request_state(status, computed):
        req = SimpleNamespace(
            status=status, num_prompt_tokens=600, is_finished=lambda: status != "running"
        )
        config = SimpleNamespace(kv_group_configs=(group,), blocks_per_chunk=2)
        return SimpleNamespace(req=req, config=config, group_states=[state]), computed

    aborted = request_state(RequestStatus.FINISHED_ABORTED, 0)
    finished = request_state(RequestStatus.FINISHED_LENGTH_CAPPED, 600)
    try:
        assert original(aborted[0], group, state, aborted[1]) == 0
        assert patches.apply("aborted-stores-prompt").status == "applied"
        assert getattr(cls.storable_chunks, patches.MARK) == "aborted-stores-prompt"
        assert cls.storable_chunks(aborted[0], group, state, aborted[1]) == 2
        # Any other request is untouched: still capped at its (no) blocks.
        assert cls.storable_chunks(finished[0], group, state, finished[1]) == 0
    finally:
        cls.storable_chunks = original
