"""Probe: one live server with a CPU tier of N chunks, a request sequence, each request's
hits and bytes against the pressure oracle (harness.commands.pressure.oracle).

The first engine evidence for the ``pressure`` command (docs/pressure-design.md §3, open
questions 1-3): does the tier hold the predicted slots, does the GPU prefix cache stay
silent with prefix caching off, and does a request evict the prefix it just loaded on
this build? Not a test: it prints a table and writes it as JSON.

    .venv/bin/python scripts/pressure_probe.py [--policy lru|arc] [--sequence s1|s2|extend]
        [--python PY] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness.commands.pressure.oracle import predict
from harness.names import REPO_ROOT
from harness.scenario.schema import OffloadSettings, ServerSettings, load_model_config
from harness.server import metrics, model_builder
from harness.server.arguments import server_spec
from harness.server.interpreters import probe
from harness.server.launcher import http_json

CHUNK = 256  # offload chunk, tokens (2 KV blocks of 128)
SLOT_BYTES = 4 * 32_768 * 2  # llama4-no-chunk: 4 layers x K,V x 128 tokens x 256 B... per chunk
SEQUENCES = {
    "s1": [
        ("A", 4),
        ("B", 4),
        ("A", 4),
        ("C", 4),
        ("D", 4),
        ("A", 4),
        ("E", 1),
        ("D", 4),
        ("D", 4),
    ],
    "s2": [("A", 4), ("B", 4), ("C", 4), ("A", 4), ("B", 4), ("B", 4)],
    "extend": [("A", 4), ("B", 4), ("A", 6), ("A", 6)],
}


def prompt_tokens(name: str, chunks: int, vocab: int) -> list[int]:
    """Prompt ``name``'s first ``chunks`` chunks plus 100 tokens: the same head for the
    same name (an extended prompt shares it), seeded by the name, so no two names share
    a chunk's hash."""
    import random

    rng = random.Random(f"pressure-{name}")
    hi = min(vocab, 1010)  # ordinary token ids of the local tokenizer
    head = [rng.randrange(10, hi) for _ in range(8 * CHUNK)]
    return head[: chunks * CHUNK] + [rng.randrange(10, hi) for _ in range(100)]


def snap(url: str) -> metrics.Snapshot:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return metrics.parse(resp.read().decode())[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="lru", choices=["lru", "arc"])
    ap.add_argument("--sequence", default="s1", choices=sorted(SEQUENCES))
    ap.add_argument("--python", default=str(REPO_ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--mutant", default=None, help="a policy of harness.engine.policies")
    ap.add_argument("--out", type=Path, default=Path("/tmp/pressure-probe"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = probe(a.python)
    geometry = load_model_config(REPO_ROOT / "scenarios" / "models" / "llama4-no-chunk.json")
    model = model_builder.build_model(geometry, "llama4-no-chunk")
    vocab = int(model_builder.text_config(geometry)["vocab_size"])
    server = ServerSettings(max_model_len=2048, block_size=128, startup_timeout_s=600)
    extra = {"eviction_policy": a.mutant or a.policy}
    if a.mutant:
        extra["cache_policy_module_path"] = "harness.engine.policies"
    offload = OffloadSettings(
        block_size=CHUNK, cpu_bytes_to_use=a.slots * SLOT_BYTES, extra_config=extra
    )
    spec = server_spec(
        env=env,
        model_path=str(model),
        served_model_name="m",
        server=server,
        offload=offload,
        patch=None,
        extra_args=[
            "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--max-num-batched-tokens",
            "2048",
            "--block-size",
            "128",
        ],
    )
    seq = SEQUENCES[a.sequence]
    expected = predict(seq, a.slots, a.policy)
    rows = []
    tag = f"{a.sequence}-{a.mutant or a.policy}"
    with spec.server(a.out / f"server-{tag}.log") as srv:
        ready = srv.wait_ready(600, 0.5)
        print(f"server {ready.state} in {ready.seconds:.1f}s (vLLM {env.vllm_version})")
        if ready.state != "started":
            return 3
        before = snap(srv.url)
        for (name, n), exp in zip(seq, expected, strict=True):
            toks = prompt_tokens(name, n, vocab)
            payload = {"model": "m", "prompt": toks, "max_tokens": 4, "temperature": 0.0}
            resp = http_json(f"{srv.url}/v1/completions", payload, 300)
            time.sleep(1.0)  # let stores complete before the next lookup
            after = snap(srv.url)
            d = after - before
            before = after
            cached = (resp.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens")
            rows.append(
                {
                    "request": f"{name}({n})",
                    "hit_expected": exp.hit * CHUNK,
                    "cached_tokens": cached,
                    "ext_hits": d.ext_hits,
                    "gpu_hits": d.gpu_hits,
                    "stored_B": d.stored_bytes,
                    "stored_expected_B": len(exp.stored) * SLOT_BYTES,
                    "loaded_B": d.loaded_bytes,
                    "evicted_expected": " ".join(exp.evicted),
                }
            )
            r = rows[-1]
            mark = "ok " if r["ext_hits"] == r["hit_expected"] else "NO "
            print(
                f"{mark}{r['request']:6} hit {r['ext_hits']:5.0f} (oracle {r['hit_expected']:4}) "
                f"cached {cached} gpu {r['gpu_hits']:.0f} stored {r['stored_B']:.0f} "
                f"(oracle {r['stored_expected_B']}) loaded {r['loaded_B']:.0f} "
                f"oracle evicts [{r['evicted_expected']}]"
            )
    (a.out / f"{tag}.json").write_text(json.dumps(rows, indent=1))
    log = (a.out / f"server-{tag}.log").read_text(errors="replace")
    start = [ln for ln in log.splitlines() if "host chunks" in ln]
    print(start[0] if start else "no host chunk line in the log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
