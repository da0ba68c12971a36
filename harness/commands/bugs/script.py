"""A scripted bug trigger's steps run on one server: prompts named once and drawn from
a seed, each ``send``, ``evict``, ``settle`` and ``reset-prefix-cache`` step recorded, and
each ``expect`` step one named check (expected / observed / why).

Metrics are snapshotted before every step, so an ``expect`` can take a counter's change
since any named step began; asynchronous stores are let settle first.
"""

from __future__ import annotations

import http.client
import json
import math
import operator
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.results.records import CheckResult, StepRecord
from harness.scenario.bugs import Step
from harness.server import metrics
from harness.server.launcher import http_post
from harness.server.workload import FIRST_ORDINARY_ID, Completion, Prompt, complete, make_fillers

if TYPE_CHECKING:
    from harness.commands.roundtrip.plan import RoundtripPlan
    from harness.commands.roundtrip.run import Endpoint

OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
# expect quantities read from the metrics, by their name in metrics.Snapshot
COUNTER_OF = {
    "external_hits": "ext_hits",
    "external_queries": "ext_queries",
    "gpu_hits": "gpu_hits",
    "gpu_queries": "gpu_queries",
    "stored_bytes": "stored_bytes",
    "loaded_bytes": "loaded_bytes",
    "prompt_tokens": "prompt_tokens",
}


# --- prompts ------------------------------------------------------------------------------------
def prompt_tokens(name: str, n: int, vocab_size: int, seed: int, entry: str = "") -> list[int]:
    """A named prompt's tokens: the same for the same entry and name on every build and
    run, from the lower half of the vocabulary (the evictions' filler takes the upper
    half). The entry's id is part of the seed, so two entries' prompts of one name never
    share a prefix when they run on one server."""
    mid = (FIRST_ORDINARY_ID + vocab_size) // 2
    rng = random.Random(zlib.crc32(f"{entry}/{name}".encode()) + seed)
    return [rng.randrange(FIRST_ORDINARY_ID, mid) for _ in range(n)]


def build_prompts(
    steps: list[Step], vocab_size: int, seed: int, entry: str = ""
) -> dict[str, Prompt]:
    """Every prompt the script sends; one with a ``prefix`` starts with that prompt's
    first ``prefix_tokens`` tokens and goes on with its own."""
    out: dict[str, Prompt] = {}
    for s in steps:
        if s.do != "send" or s.prompt is None or s.prompt in out:
            continue
        n = s.tokens or 0
        own = prompt_tokens(s.prompt, n, vocab_size, seed, entry)
        if s.prefix is not None:
            head = out[s.prefix].token_ids[: s.prefix_tokens or len(out[s.prefix].token_ids)]
            own = head + own[len(head) :]
        out[s.prompt] = Prompt(s.prompt, "target", own)
    return out


# --- running --------------------------------------------------------------------------------
@dataclass
class Script:
    """A script's run on one server: its steps so far, the requests, the checks."""

    plan: RoundtripPlan
    prompts: dict[str, Prompt]
    records: list[StepRecord] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    sent: dict[str, list[Completion]] = field(default_factory=dict)  # by send name
    before: dict[str, metrics.Snapshot] = field(default_factory=dict)  # by step name
    checks: list[CheckResult] = field(default_factory=list)
    pending: list[tuple[str, list[Future[Completion]]]] = field(default_factory=list)
    last_reset: StepRecord | None = None
    turns: dict[str, Prompt] = field(default_factory=dict)  # by send name: what it sent


def run_script(script: Script, ep: Endpoint, steps: list[Step], out: Path) -> None:
    """The steps in order on a live server; raises the endpoint's failure (an engine that
    died is the script's verdict, judged by the caller)."""
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    start, _ = ep.snapshot("start")
    script.before["start"] = start
    with ThreadPoolExecutor(max_workers=16) as pool:
        for i, s in enumerate(steps, 1):
            label = s.name or f"step-{i}"
            snap, cache = ep.snapshot(label)
            script.before[label] = snap
            rec = StepRecord(i, s.do, label)
            t0 = time.perf_counter()
            if s.do == "send":
                _send(script, ep, s, label, pool, rec)
            elif s.do == "evict":
                _evict(script, ep, s, i, cache, rec)
            elif s.do == "settle":
                _join(script, ep)
                ep.settle(label, script.plan.scenario.workload.settle_timeout_s)
            elif s.do == "reset-prefix-cache":
                query = f"?{urllib.parse.urlencode(s.query)}" if s.query else ""
                try:
                    rec.http_status, rec.body = http_post(f"{ep.base}/reset_prefix_cache{query}")
                except HarnessError as err:
                    raise ep.failure(label, err) from None
                rec.detail = f"HTTP {rec.http_status} {rec.body[:200]}".strip()
                script.last_reset = rec
            elif s.do == "expect":
                _join(script, ep)
                now = ep.settle(label, script.plan.scenario.workload.settle_timeout_s)
                script.checks.append(_expect(script, s, now))
                rec.detail = "pass" if script.checks[-1].passed else script.checks[-1].observed
            rec.seconds = time.perf_counter() - t0
            after, _ = ep.snapshot(label)
            (out / "metrics" / f"{i:02d}-{label}.prom").write_text(ep.last_text)
            rec.counters = (after - snap).as_dict()
            script.records.append(rec)
        _join(script, ep)


def _send(script: Script, ep: Endpoint, s: Step, label: str, pool: Any, rec: StepRecord) -> None:
    assert s.prompt is not None
    prompt = script.prompts[s.prompt]
    if s.after is not None:
        # A next turn: what that send sent and got back, then this prompt's own tokens.
        _join(script, ep)
        before, answer = script.turns[s.after], script.sent[s.after][0]
        seen = before.token_ids + answer.token_ids
        prompt = Prompt(s.prompt, "target", seen + prompt.token_ids)
    script.turns[label] = prompt
    w = script.plan.scenario.workload

    def one() -> Completion:
        try:
            return complete(
                ep.base,
                script.plan.served_name,
                prompt,
                label,
                max_tokens=s.max_tokens,
                logprobs=w.logprobs,
                seed=w.seed,
                prompt_logprobs=s.prompt_logprobs,
            )
        except HarnessError as err:
            raise ep.failure(label, err) from None

    if s.abort == "queued":
        rec.detail = _abort_queued(script, ep, s, label, prompt)
        return
    futures = [pool.submit(one) for _ in range(s.concurrent)]
    turn = f" after {s.after}'s prompt and answer" if s.after else ""
    rec.detail = f"{s.concurrent} x {len(prompt.token_ids)} tokens of {s.prompt}{turn}"
    script.pending.append((label, futures))
    if not s.background:
        _join(script, ep)


# How long an aborted send waits for its request to show in the queue, then to leave it.
QUEUE_WAIT_S = 60.0
QUEUE_POLL_S = 0.2  # each scrape costs the API server a little: no faster


def _abort_queued(script: Script, ep: Endpoint, s: Step, label: str, prompt: Prompt) -> str:
    """Send ``prompt`` as a stream, hang up once the server shows it waiting behind a
    running request, and wait until the queue has let it go: a request aborted before it
    was ever scheduled (#49118's path), as a client that gives up on a full server does.

    Nothing here is judged: a request that never queued, or that the server still holds
    after the hang-up, is a script that did not do what it says (an error, never a pass).
    The record keeps what the queue showed."""
    payload = {
        "model": script.plan.served_name,
        "prompt": prompt.token_ids,
        "max_tokens": s.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    # The request running ahead (a background step) must hold the slot first: sent from
    # another thread an instant earlier, it may reach the server second, and this one
    # would then run at once instead of waiting (seen on a fast host, 2026-12-06).
    if _wait_queue(ep, label, lambda run, wait: run >= 1) is None:
        raise HarnessError(f"{label}: no request was running ahead of it to wait behind")
    # Sent on a connection of its own and never read: some releases answer a stream's
    # headers only once the request runs (0.32.0 does), so nothing may wait for them.
    url = urllib.parse.urlsplit(ep.base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=QUEUE_WAIT_S)
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps(payload).encode(),
            {"Content-Type": "application/json"},
        )
    except OSError as err:
        conn.close()
        raise ep.failure(label, HarnessError(f"{label}: {err}")) from None
    t0 = time.monotonic()
    try:
        seen = _wait_queue(ep, label, lambda run, wait: run >= 1 and wait >= 1)
    finally:
        conn.close()  # the hang-up vLLM sees as an abort
    if seen is None:
        raise HarnessError(f"{label}: the request never waited behind a running one")
    t1 = time.monotonic()
    left = _wait_queue(ep, label, lambda run, wait: wait == 0)
    if left is None:
        raise HarnessError(f"{label}: the server still holds the request after the hang-up")
    return (
        f"1 x {len(prompt.token_ids)} tokens of {s.prompt}, aborted while waiting "
        f"(queue: {seen[0]:g} running, {seen[1]:g} waiting after {t1 - t0:.1f}s; "
        f"{left[0]:g} running, 0 waiting {time.monotonic() - t1:.1f}s after the hang-up)"
    )


def _wait_queue(
    ep: Endpoint, label: str, ok: Callable[[float, float], bool]
) -> tuple[float, float] | None:
    """The scheduler's (running, waiting) once ``ok`` holds, polled from the metrics;
    None if it did not within :data:`QUEUE_WAIT_S`."""
    deadline = time.monotonic() + QUEUE_WAIT_S
    while time.monotonic() < deadline:
        ep.snapshot(label)
        queue = metrics.queue_lengths(ep.last_text)
        if queue is None:
            raise HarnessError(f"{label}: the server exports no vllm:num_requests_* gauges")
        if ok(*queue):
            return queue
        time.sleep(QUEUE_POLL_S)
    return None


def _join(script: Script, ep: Endpoint) -> None:
    """Wait for every request in flight; the first failure is raised."""
    while script.pending:
        label, futures = script.pending.pop(0)
        done = [f.result() for f in futures]
        script.sent[label] = done
        script.completions += done


def _evict(script: Script, ep: Endpoint, s: Step, index: int, cache: Any, rec: StepRecord) -> None:
    """Unrelated prompts worth ``pools`` times the live pool, one at a time, so the GPU
    prefix cache drops everything earlier steps left there."""
    if cache is None:
        raise HarnessError("evict: the server publishes no vllm:cache_config_info")
    w = script.plan.scenario.workload
    count = max(1, math.ceil(cache.pool_tokens * s.pools / w.filler_tokens))
    fillers = make_fillers([w.filler_tokens] * count, script.plan.vocab_size, w.seed + index)
    for f in fillers:
        try:
            comp = complete(
                ep.base, script.plan.served_name, f, rec.name, max_tokens=1, logprobs=0, seed=0
            )
        except HarnessError as err:
            raise ep.failure(rec.name, err) from None
        script.completions.append(comp)
    rec.detail = (
        f"{count} x {w.filler_tokens} tokens ({s.pools:g}x the {cache.pool_tokens}-token pool)"
    )


def observe(script: Script, s: Step, now: metrics.Snapshot) -> float:
    """The quantity an expect step reads (same_output: 1 when equal, 0 when not)."""
    what = s.what
    if what in COUNTER_OF:
        base = script.before[s.since or "start"]
        return float(getattr(now - base, COUNTER_OF[what]))
    if what in ("http_status", "reset_success"):
        reset = script.last_reset
        if reset is None:
            raise HarnessError(f"expect {s.name}: no reset-prefix-cache step came before")
        if what == "http_status":
            return float(reset.http_status or 0)
        try:
            body = json.loads(reset.body) if reset.body.strip() else {}
        except json.JSONDecodeError:
            body = {}
        ok = body.get("success") if isinstance(body, dict) else None
        # An answer without a verdict (older servers: a bare 200) counts by its status.
        return 1.0 if ok is True or (ok is None and reset.http_status == 200) else 0.0
    a, b = (script.sent[o][0] for o in s.of)
    return 1.0 if a.token_ids == b.token_ids else 0.0


def _expect(script: Script, s: Step, now: metrics.Snapshot) -> CheckResult:
    assert s.name is not None and s.what is not None
    got = observe(script, s, now)
    since = f" since {s.since}" if s.since else ""
    if s.what == "same_output":
        expected, ok = f"{s.of[0]} and {s.of[1]} give the same tokens", got == 1.0
        observed = "same tokens" if ok else "different tokens"
    else:
        assert s.value is not None
        expected = f"{s.what}{since} {s.op} {s.value:g}"
        ok = OPS[s.op](got, s.value)
        observed = f"{s.what}{since} = {got:g}"
    return CheckResult(s.name, bool(ok), expected, observed, s.why)
