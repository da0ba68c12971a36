"""Driving a stress plan against a server: arrivals, dependencies, concurrency, aborts.

A plan (``harness.commands.stress.workload``) says when each request arrives and which earlier
request it continues; this module sends them, at most ``concurrency`` in flight, each
as soon as it has arrived and its parent has finished (a later turn's prompt is the
parent's prompt, the parent's answer and its own new text). Aborting requests stream
and hang up after a few tokens, which is how a client disconnect reaches vLLM.

How one request is sent is a function handed in (``Send``), so the scheduling here is
tested without a server and the same loop drives the run under test and its reference.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from harness.commands.stress.workload import PlannedRequest
from harness.server.launcher import note_answer
from harness.server.workload import cached_tokens_of


@dataclass
class Outcome:
    """One request as it went: what was sent (the whole prompt) and what came back."""

    id: str
    profile: str
    prompt: list[int]
    output: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)  # each generated token's, as served
    # per generated position, the served top choices (token id -> logprob), when asked
    top: list[dict[int, float]] = field(default_factory=list)
    error: str = ""
    aborted: bool = False  # the client hung up on purpose (abort profile)
    started_s: float = 0.0  # since the run began
    ended_s: float = 0.0
    filler: bool = False
    turn: int | None = None  # multi-turn: the turn (0-based)
    cached_tokens: int | None = None  # prompt tokens served from a cache (GPU or CPU tier)

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "profile": self.profile,
            "turn": self.turn,
            "prompt_tokens": len(self.prompt),
            "prompt_ids": self.prompt,
            "output": self.output,
            "logprobs": [round(x, 6) for x in self.logprobs],
            "top_logprobs": [{str(t): round(v, 6) for t, v in d.items()} for d in self.top],
            "text": self.text,
            "error": self.error,
            "aborted": self.aborted,
            "started_s": round(self.started_s, 4),
            "ended_s": round(self.ended_s, 4),
            "filler": self.filler,
            "cached_tokens": self.cached_tokens,
        }


@dataclass
class Reply:
    """What came back for one request."""

    ids: list[int]
    text: str = ""
    logprobs: list[float] = field(default_factory=list)  # per generated token, if asked
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    top: list[dict[int, float]] = field(default_factory=list)  # per token: id -> logprob


Send = Callable[[PlannedRequest, list[int]], Reply]
"""Send one request with this whole prompt; what came back. Raises on error."""


def _turn(req: PlannedRequest) -> int | None:
    tail = req.id.rsplit("/", 1)[-1]
    return int(tail[1:]) if req.profile == "multi-turn" and tail.startswith("t") else None


def drive(
    plan: Sequence[PlannedRequest],
    send: Send,
    concurrency: int,
    *,
    on_done: Callable[[Outcome], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Outcome]:
    """Every request of the plan, in plan order in the result. A request whose parent
    failed is not sent (its error says so): its prompt does not exist."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    ids = [r.id for r in plan]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids must be unique")
    by_id = {r.id: r for r in plan}
    for r in plan:
        if r.parent is not None and r.parent not in by_id:
            raise ValueError(f"{r.id}: parent {r.parent} is not in the plan")
    done: dict[str, Outcome] = {}
    pending = list(plan)
    lock = threading.Lock()
    t0 = clock()

    def prompt_of(r: PlannedRequest) -> list[int] | None:
        if r.parent is None:
            return list(r.prompt)
        parent = done[r.parent]
        if parent.error or parent.aborted:
            return None
        return parent.prompt + parent.output + list(r.prompt)

    def run_one(r: PlannedRequest, prompt: list[int]) -> Outcome:
        out = Outcome(r.id, r.profile, prompt, filler=r.filler, turn=_turn(r))
        out.started_s = clock() - t0
        try:
            reply = send(r, prompt)
            out.output, out.text, out.logprobs = reply.ids, reply.text, reply.logprobs
            out.cached_tokens, out.top = reply.cached_tokens, reply.top
            out.aborted = r.abort_after is not None
        except Exception as err:  # a failed request is a result, not a crash
            out.error = f"{type(err).__name__}: {err}"
        out.ended_s = clock() - t0
        return out

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        running: dict[Future[Outcome], str] = {}
        while pending or running:
            now = clock() - t0
            ready = [r for r in pending if r.at_s <= now and (r.parent is None or r.parent in done)]
            for r in ready:
                if len(running) >= concurrency:
                    break
                pending.remove(r)
                prompt = prompt_of(r)
                if prompt is None:
                    o = Outcome(r.id, r.profile, [], filler=r.filler, turn=_turn(r))
                    o.error = f"not sent: its parent {r.parent} did not finish"
                    with lock:
                        done[r.id] = o
                    if on_done:
                        on_done(o)
                    continue
                running[pool.submit(run_one, r, prompt)] = r.id
            if running:
                finished, _ = wait(list(running), timeout=0.05, return_when=FIRST_COMPLETED)
                for f in finished:
                    running.pop(f)
                    o = f.result()
                    with lock:
                        done[o.id] = o
                    if on_done:
                        on_done(o)
            elif pending:
                nxt = min(r.at_s for r in pending)
                sleep(max(0.0, min(0.05, nxt - (clock() - t0))))
    return [done[i] for i in ids]


# --- sending through vLLM's OpenAI server ---------------------------------------------------
def http_sender(
    base_url: str, model: str, *, logprobs: int = 0, seed: int = 0, timeout_s: float = 600.0
) -> Send:
    """A ``Send`` for ``/v1/completions``: greedy, token ids in and out; an aborting
    request streams and closes the connection after ``abort_after`` tokens. With
    ``logprobs`` each generated token's logprob comes back, and from 2 on the top
    choices at each position too, keyed by token id (``return_tokens_as_token_ids``)."""

    def send(req: PlannedRequest, prompt: list[int]) -> Reply:
        payload: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": req.max_tokens,
            "temperature": 0.0,
            "seed": seed,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if logprobs:
            payload["logprobs"] = logprobs
            payload["return_tokens_as_token_ids"] = True
        if req.prompt_logprobs is not None:
            payload["prompt_logprobs"] = req.prompt_logprobs
        if req.abort_after is not None:
            payload["stream"] = True
            return _stream_and_hang_up(
                f"{base_url}/v1/completions", payload, req.abort_after, timeout_s
            )
        body = post_json(f"{base_url}/v1/completions", payload, timeout_s)
        choice = body["choices"][0]
        return Reply(
            list(choice.get("token_ids") or []),
            str(choice.get("text", "")),
            _token_logprobs(choice),
            cached_tokens_of(body),
            _top_logprobs(choice),
        )

    return send


def _token_logprobs(choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs") or {}
    return [float(x) for x in lp.get("token_logprobs") or [] if x is not None]


def _top_logprobs(choice: dict[str, Any]) -> list[dict[int, float]]:
    """``logprobs.top_logprobs`` as token id -> logprob per position (keys rendered
    ``token_id:N`` by ``return_tokens_as_token_ids``; a key of another shape is left out)."""
    lp = choice.get("logprobs") or {}
    out: list[dict[int, float]] = []
    for entry in lp.get("top_logprobs") or []:
        row: dict[int, float] = {}
        for key, value in (entry or {}).items():
            head, _, tail = str(key).partition(":")
            if head == "token_id" and tail.isdigit() and value is not None:
                row[int(tail)] = float(value)
        out.append(row)
    return out


def post_json(url: str, payload: dict[str, Any], timeout_s: float) -> Any:
    req = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
        note_answer(url)
        return body
    except urllib.error.HTTPError as err:
        raise RuntimeError(
            f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
        ) from None


def _stream_and_hang_up(url: str, payload: dict[str, Any], after: int, timeout_s: float) -> Reply:
    """Read server-sent events until ``after`` tokens came, then close the socket."""
    req = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    reply = Reply([])
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        raise RuntimeError(
            f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
        ) from None
    try:
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data:") :])
            for choice in event.get("choices") or []:
                reply.ids += list(choice.get("token_ids") or [])
                reply.text += str(choice.get("text", ""))
                reply.logprobs += _token_logprobs(choice)
                reply.top += _top_logprobs(choice)
            if len(reply.ids) >= after:
                break
    finally:
        resp.close()  # the disconnect vLLM sees as an abort
    return reply
