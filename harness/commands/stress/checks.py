"""Verdicts of a stress run: pure functions from what the run observed to checks, each
with expected, observed and why (the round trip's ``CheckResult``), so a failing run
says which request went wrong where, and each check is tested without an engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from harness.commands.stress.driver import Outcome
from harness.commands.stress.reference import TokenVerdict
from harness.results.records import CheckResult

# Engine log lines no healthy offloading run prints (each from a fixed upstream bug).
BAD_LOG = (
    ("assertion", re.compile(r"\bAssertionError\b")),
    ("cannot-store", re.compile(r"Cannot store", re.IGNORECASE)),
    ("not-in-cache", re.compile(r"not found in cache")),
    ("engine-fatal", re.compile(r"EngineCore encountered a fatal error")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
)


def check_outputs(
    outcomes: Sequence[Outcome],
    verdicts: Mapping[str, TokenVerdict],
    tolerance: float | None = None,
    kernels: str = "",
) -> CheckResult:
    """Every compared request's tokens against the reference (teacher-forced, within the
    noise floor); the first divergence named by request, turn and token. The tolerance
    and both servers' attention kernels, when given, are part of what was observed: the
    floor they come from is measured on the kernel that ran."""
    compared = [o for o in outcomes if o.id in verdicts]
    bad = [(o, verdicts[o.id]) for o in compared if verdicts[o.id].divergence is not None]
    near = sum(verdicts[o.id].near_ties for o in compared)
    tokens = sum(verdicts[o.id].scored for o in compared)
    observed = f"{len(compared) - len(bad)}/{len(compared)} requests match ({tokens} tokens"
    widest = max((verdicts[o.id].widest for o in compared), default=0.0)
    observed += f", {near} near-ties within the floor, the widest {widest:.4f})" if near else ")"
    if tolerance is not None:
        observed += f"; tolerance {tolerance:.4f}"
    if kernels:
        observed += f"; kernels: {kernels}"
    detail = ""
    if bad:
        o, v = bad[0]
        assert v.divergence is not None
        turn = f", turn {o.turn}" if o.turn is not None else ""
        detail = f"first: {o.id}{turn}, {v.divergence.text()}"
        if len(bad) > 1:
            detail += f"; {len(bad) - 1} more request(s) diverge"
    return CheckResult(
        "outputs-match-reference",
        not bad and bool(compared),
        "every request's tokens are the reference's choice (or within the noise floor)",
        observed,
        "a wrong byte loaded from the CPU tier changes what the model attends to",
        detail,
    )


def check_no_errors(outcomes: Sequence[Outcome]) -> CheckResult:
    """No request failed; one that was never sent because its parent failed is counted
    under its parent, whose error is the one named."""
    failed = [o for o in outcomes if o.error and not o.error.startswith("not sent")]
    skipped = [o for o in outcomes if o.error.startswith("not sent")]
    observed = f"{len(failed)} failed" + (
        f", {len(skipped)} not sent after them" if skipped else ""
    )
    return CheckResult(
        "no-request-errored",
        not failed and not skipped,
        "every request answered (aborted ones excepted)",
        observed,
        "offloading must never turn a request into an error",
        f"first: {failed[0].id}: {failed[0].error}" if failed else "",
    )


def check_log(lines: Iterable[str]) -> CheckResult:
    """The engine log holds none of the lines the fixed offload bugs printed."""
    seen: dict[str, str] = {}
    for line in lines:
        for name, pattern in BAD_LOG:
            if name not in seen and pattern.search(line):
                seen[name] = line.strip()[:200]
    return CheckResult(
        "engine-log-clean",
        not seen,
        "no " + ", ".join(n for n, _ in BAD_LOG),
        ", ".join(seen) or "clean",
        "an assertion or a refused store caught inside the engine is a bug even when the "
        "request survived it",
        next(iter(seen.values()), ""),
    )


def check_happened(name: str, what: str, count: float, why: str) -> CheckResult:
    """A condition the profile exists to create (preemptions, external hits on later
    turns) really happened: otherwise the run proved nothing about it."""
    return CheckResult(name, count > 0, f"{what} > 0", f"{what} = {count:g}", why)


# --- the byte ledger --------------------------------------------------------------------------
_TRANSFER = re.compile(r"offload-check transfer: job=\d+ (store|load) bytes=(\d+) (.*?) block_")
_GROUP = re.compile(r"g(\d+):\d+@\d+=(\d+)")


def parse_transfers(lines: Iterable[str]) -> dict[tuple[str, int], int]:
    """Bytes moved per (store|load, KV-cache group) from the host backend's trace lines
    (``harness.engine.host_offload``, one per job and rank); empty without a trace."""
    out: dict[tuple[str, int], int] = {}
    for line in lines:
        # Every record on the line: ranks share the log, and a line written by one rank
        # can hold another's record (older backends printed text and newline apart).
        for m in _TRANSFER.finditer(line):
            for g in _GROUP.finditer(m.group(3)):
                key = (m.group(1), int(g.group(1)))
                out[key] = out.get(key, 0) + int(g.group(2))
    return out


def per_kind(
    transfers: Mapping[tuple[str, int], int], group_kinds: Sequence[str]
) -> dict[str, dict[str, int]]:
    """The trace's bytes per KV kind: {kind: {"stored": B, "loaded": B}}."""
    out: dict[str, dict[str, int]] = {}
    for (op, group), n in transfers.items():
        kind = group_kinds[group] if group < len(group_kinds) else f"group{group}"
        slot = out.setdefault(kind, {"stored": 0, "loaded": 0})
        slot["stored" if op == "store" else "loaded"] += n
    return out


def stored_chunks(sequences: Iterable[Sequence[int]], chunk: int) -> int:
    """Distinct offload chunks these token sequences fill: a chunk is its whole prefix,
    so two requests sharing a prefix store its chunks once."""
    seen: set[int] = set()
    for seq in sequences:
        h = 0
        for end in range(chunk, len(seq) + 1, chunk):
            h = hash((h, tuple(seq[end - chunk : end])))
            seen.add(h)
    return len(seen)


FULL_KINDS = ("full", "mla")  # layers that attend to every earlier token: load every hit


@dataclass(frozen=True)
class Ledger:
    """What the run moved and what it should have, in bytes; totals over TP ranks."""

    stored: float  # vLLM's counter
    loaded: float
    ext_hits: float  # external prefix-cache hits, tokens
    kinds: dict[str, dict[str, int]]  # from the trace, per KV kind ({} without one)
    full_bpt: int  # bytes per token of full-attention (and MLA) layers
    kind_bpt: dict[str, int]  # bytes per token per KV kind
    chunks_low: int  # distinct chunks the requests filled (aborted ones: what was seen)
    chunks_high: int  # ... (aborted ones: as if they generated every token they asked for)
    chunk: int  # offload chunk, tokens
    preemptions: float = 0.0  # vllm:num_preemptions over the run
    longest: int = 0  # the longest request's tokens (prompt + generated)

    @property
    def readmitted_tokens(self) -> float:
        """The most a resumed request can load again: vLLM counts a preempted request's
        hits apart (``preempted_hits``, not exported), so its reload has no counted hit."""
        return self.preemptions * self.longest


def check_ledger(ledger: Ledger, stores: bool = True) -> list[CheckResult]:
    """Every byte accounted for. Loads: a full-attention layer loads every hit token, so
    its loaded bytes are hits x its bytes per token exactly; a chunked-local or sliding
    layer loads only its window's part, so at most that. Stores: each distinct chunk the
    requests filled is stored once per layer (``stores``: judged only when the tier never
    evicts). The trace and vLLM's counters must agree."""
    fulls = [v for k, v in ledger.kinds.items() if k in FULL_KINDS]
    full = (
        {"stored": sum(v["stored"] for v in fulls), "loaded": sum(v["loaded"] for v in fulls)}
        if fulls
        else None
    )
    out = []
    if ledger.kinds:
        traced_s = sum(k["stored"] for k in ledger.kinds.values())
        traced_l = sum(k["loaded"] for k in ledger.kinds.values())
        out.append(
            CheckResult(
                "ledger-matches-counters",
                traced_s == ledger.stored and traced_l == ledger.loaded,
                "bytes the backend moved = vLLM's store/load counters",
                f"traced {traced_s:,}/{traced_l:,} B, counters {ledger.stored:,.0f}/"
                f"{ledger.loaded:,.0f} B (stored/loaded)",
                "a counter that disagrees with what moved hides lost or invented bytes",
            )
        )
    want = ledger.ext_hits * ledger.full_bpt
    slack = ledger.readmitted_tokens * ledger.full_bpt
    resumed = (
        f" + up to {ledger.preemptions:g} preemption(s) x {ledger.longest} tokens reloaded"
        if ledger.preemptions
        else ""
    )
    if full is not None:
        over = {
            k: v["loaded"]
            for k, v in ledger.kinds.items()
            if k not in FULL_KINDS
            and v["loaded"]
            > (ledger.ext_hits + ledger.readmitted_tokens) * ledger.kind_bpt.get(k, 0)
        }
        ok = want <= full["loaded"] <= want + slack and not over
        observed = f"full-attention loaded {full['loaded']:,} B for {ledger.ext_hits:,.0f} hits"
        observed += "".join(f"; {k} loaded {v:,} B, over its bound" for k, v in over.items())
        expected = f"full-attention loaded = hits x {ledger.full_bpt} B = {want:,.0f} B{resumed}"
        expected += "; windowed kinds <= hits x their bytes per token"
    else:
        top = (ledger.ext_hits + ledger.readmitted_tokens) * sum(ledger.kind_bpt.values())
        ok = want <= ledger.loaded <= top
        observed = f"loaded {ledger.loaded:,.0f} B for {ledger.ext_hits:,.0f} hits"
        expected = f"{want:,.0f} <= loaded <= {top:,.0f} B (no per-kind trace){resumed}"
    out.append(
        CheckResult(
            "loads-match-hits",
            ok,
            expected,
            observed,
            "a hit counted without its load (or a load without its hit) means a request "
            "computed on KV that was never there",
        )
    )
    if not stores:
        return out
    stored_full = full["stored"] if full is not None else None
    per_chunk = ledger.chunk * ledger.full_bpt
    low, high = ledger.chunks_low * per_chunk, ledger.chunks_high * per_chunk
    if stored_full is not None:
        ok = low <= stored_full <= high
        observed = f"full-attention stored {stored_full:,} B = {stored_full / per_chunk:g} chunks"
    else:
        ok = ledger.stored >= low
        observed = f"stored {ledger.stored:,.0f} B (no per-kind trace)"
    span = f"{ledger.chunks_low}" + (
        f"..{ledger.chunks_high}" if ledger.chunks_high != ledger.chunks_low else ""
    )
    out.append(
        CheckResult(
            "stores-match-chunks",
            ok,
            f"{span} distinct chunks x {per_chunk:,} B",
            observed,
            "every full chunk a request computed (prompt and generated tokens, preempted "
            "ones included) is offloaded once; fewer is a lost store, more a duplicate",
        )
    )
    return out


def check_prefix_reuse(
    outcomes: Sequence[Outcome],
    chunk: int,
    prompt_logprobs: Iterable[str] = (),
    *,
    decode: bool = True,
    judged: Collection[str] | None = None,
    may_donate: Callable[[Outcome, Outcome], bool] | None = None,
    name: str = "prefix-reused",
    why: str = "a stored prefix the connector does not offer again is a lost hit",
) -> CheckResult:
    """Each request served from cache the chunks an earlier, finished request had
    computed of its prompt (of its prompt alone, when ``decode`` is off: the connector
    then stores prompt blocks only), less at most part of one chunk. The CPU tier holds
    everything (it is sized so), so a whole chunk missing is a hit the connector failed
    to admit. ``judged``: only these requests; ``may_donate(d, o)``: whether ``d``'s KV
    can serve ``o`` at all (a restart: only what the disk carried over)."""
    skip = set(prompt_logprobs)
    done = [o for o in outcomes if o.output and not o.error]
    short: list[tuple[Outcome, int]] = []
    n_judged = 0
    for o in outcomes:
        if o.error or o.aborted or o.id in skip or o.cached_tokens is None:
            continue
        if judged is not None and o.id not in judged:
            continue
        best = 0
        for d in done:
            if d is o or d.ended_s > o.started_s:
                continue
            if may_donate is not None and not may_donate(d, o):
                continue
            computed = d.prompt + d.output[:-1] if decode else d.prompt
            n = 0
            for a, b in zip(computed, o.prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, min(n, len(o.prompt) - 1) // chunk * chunk)
        if best:
            n_judged += 1
            # A GPU hit ending inside a chunk leaves less than a chunk to load, which the
            # connector skips by design ("We can only load less than a chunk, so skip",
            # vLLM's _lookup_complete_chunks): so up to a chunk less, never a whole one.
            if o.cached_tokens <= best - chunk:
                short.append((o, best))
    detail = ""
    if short:
        o, best = short[0]
        detail = f"first: {o.id} cached {o.cached_tokens} of {best} reusable tokens"
    return CheckResult(
        name,
        not short and n_judged > 0,
        "cached tokens > (the chunks an earlier finished request computed of the prompt) - 1 chunk",
        f"{n_judged - len(short)}/{n_judged} requests with a reusable prefix got it",
        why,
        detail,
    )
