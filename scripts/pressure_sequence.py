"""Send a pressure sequence to a running vLLM server and print what each request did to
the CPU offload tier, from vLLM's own counters: the plain-vLLM reproduction the bug
corpus's pressure entries give (scenarios/bugs/55461.toml, 52227.toml, 51787.toml).

Standard library only, no harness: it must run beside any vLLM release.

    python scripts/pressure_sequence.py http://127.0.0.1:8000 A4 B4 C4 A4 B4 B4

Each word is a prompt NAME and a chunk count: NAME's first n chunks of 256 tokens
(the same tokens whenever NAME comes back) and a 100-token tail. Requests go one at a
time; after each, the counters are read once they stop moving.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
import urllib.request

CHUNK, TAIL = 256, 100
COUNTERS = {
    "hit": "vllm:external_prefix_cache_hits_total",
    "stored": "vllm:kv_offload_store_bytes_total",
    "loaded": "vllm:kv_offload_load_bytes_total",
    "skipped": "vllm:kv_offload_stores_skipped_total",
    "failures": "vllm:kv_offload_allocation_failure_total",
}


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for key, name in COUNTERS.items():
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            out[key] += float(m.group(1))
    return out


def settled(url: str) -> dict[str, float]:
    last, same = counters(url), 0
    while same < 3:
        time.sleep(0.25)
        now = counters(url)
        same = same + 1 if now == last else 0
        last = now
    return last


def main() -> int:
    url, words = sys.argv[1].rstrip("/"), sys.argv[2:]
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as resp:
        model = json.load(resp)["data"][0]["id"]
    before = settled(url)
    for i, word in enumerate(words):
        m = re.fullmatch(r"([A-Za-z]+)([1-9][0-9]*)", word)
        if not m:
            print(f"not NAME then a chunk count: {word!r}", file=sys.stderr)
            return 2
        name, n = m.group(1), int(m.group(2))
        rng = random.Random(name)
        head = [rng.randrange(16, 1000) for _ in range(8 * CHUNK)][: n * CHUNK]
        tail = [random.Random(f"{name}-{n}").randrange(16, 1000) for _ in range(TAIL)]
        body = {"model": model, "prompt": head + tail, "max_tokens": 4, "temperature": 0.0}
        req = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
        after = settled(url)
        d = {k: int(after[k] - before[k]) for k in COUNTERS}
        before = after
        print(
            f"{i + 1:2} {word:5} hit {d['hit']:5} tokens  stored {d['stored']:8} B  "
            f"loaded {d['loaded']:8} B  skipped {d['skipped']}  store failures {d['failures']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
