"""A cache of the connector-off reference (``stress --reference-cache DIR``): its noise
floor and its scores, so a run whose tokens the reference already scored launches no
reference server at all.

Why this is sound where it is used (``offload-check mutate``): the reference runs without
the offloading connector, so it never imports the offloading module a mutant changed, and
its answers depend only on the build, its server's arguments, the plan's round 0, the
concurrency and how scoring asks (``key_inputs``). Scoring one request alone is
deterministic on one build (the same request scored twice: identical to the bit,
docs/stress.md), so a sequence of tokens scored once is scored the same again. What the
cache cannot give is a live server's continuation of a diverging request
(``explain_divergences``): a divergence, or any sequence it has not scored, launches the
reference as a run without the cache would, and what that server computes fills the
cache.

The orchestration (``reference_side``) takes the live reference as a function that
starts one (``Launch``), so it is tested with fakes and no server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.commands.stress.driver import Outcome, Send, drive
from harness.commands.stress.floor import SCORE_TOP, SERVED_TOP, Scorer, compared, floor_of
from harness.commands.stress.judge import explain_divergences, judge_run, set_floor
from harness.commands.stress.plan import StressPlan, reference_spec
from harness.commands.stress.reference import Scores
from harness.commands.stress.result import ReferenceSource, StressResult

# Bumped whenever what is stored, or what the key is of, changes meaning: an older file
# is then another key, never read as this one.
CACHE_FORMAT = 1
# ``harness.commands.mutate.sandbox.MARKER`` (stress may not import mutate; a unit test
# keeps the two equal): the file a mutate copy of an environment holds, naming the
# environment it copies.
COPY_MARKER = ".offload-check-copy"
# What the harness asks of the reference, beside the plan: the scorer's top choices, the
# replay's served top choices and sampling seed (``harness.commands.stress.run``), and
# the scoring request's shape (``floor.score_request``). Any change is another key.
SCORER_SETTINGS: dict[str, Any] = {
    "score_top": SCORE_TOP,
    "served_top": SERVED_TOP,
    "sender_seed": 0,
    "temperature": 0.0,
    "score_max_tokens": 1,
    "ignore_eos": True,
}
# Process environment a launched server inherits that can change its numerics (threads,
# kernels, vLLM's own switches); the harness's own variables are in the spec's env.
ENGINE_ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH_")
FLOOR_FIELDS = (
    "floor",
    "floor_tokens",
    "floor_stray",
    "floor_resolution",
    "floor_pair",
    "floor_lost",
    "tolerance",
)


# --- the key ----------------------------------------------------------------------------
def environment_of(python: str) -> str:
    """The environment an interpreter belongs to, as the key names it: ``<prefix>`` of
    ``<prefix>/bin/python``. A mutate copy (``COPY_MARKER`` in its prefix) is named by the
    environment it copies: it is that environment with one offloading module replaced,
    which the connector-off reference never imports, so its reference is the original's.
    Not the interpreter's file name: ``python`` and ``python3`` of one venv are one build."""
    prefix = Path(os.path.abspath(python)).parent.parent
    try:
        text = (prefix / COPY_MARKER).read_text()
    except (OSError, UnicodeDecodeError):
        return str(prefix)
    head, sep, original = text.strip().partition("copy of ")
    return original if sep and not head and original else str(prefix)


def host_identity() -> dict[str, Any]:
    """The machine as the reference's numerics see it: the CPU (its model and flags:
    ``amx`` or not picks vLLM's attention kernel, docs/stress.md) and the cores this
    process may use (the kernels split work by threads)."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "model name" and not model:
                    model = value.strip()
                elif name == "flags" and not flags:
                    flags = value.strip()
                if model and flags:
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    return {
        "machine": platform.machine(),
        "cpu": model,
        "flags_sha256": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest(),
        "cores": cores,
    }


def engine_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The process environment's variables that reach the engine and can move it."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENGINE_ENV_PREFIXES)}


def key_inputs(
    plan: StressPlan,
    *,
    host: Mapping[str, Any],
    environ: Mapping[str, str],
    scorer: Mapping[str, Any] = SCORER_SETTINGS,
) -> dict[str, Any]:
    """Everything a reference's floor and scores depend on: the build (its environment
    and the vLLM, its distribution and torch the run reports), the reference server's
    spec (``reference_spec``: model path and geometry, weights, engine arguments, env),
    the process environment the engine inherits, the host, the plan's round 0 (every
    request as planned), the seed, the concurrency, and how scoring asks."""
    base = plan.base
    spec = reference_spec(plan)
    env = base.env
    scen = getattr(base, "scenario", None)
    return {
        "format": CACHE_FORMAT,
        "build": {
            "environment": environment_of(spec.python),
            "vllm_version": getattr(env, "vllm_version", None),
            "vllm_dist": getattr(env, "vllm_dist", None),
            "torch": getattr(env, "torch", None),
            "device": getattr(env, "device", None),
        },
        "reference_server": {
            # argv[0] is the interpreter: the build above names it (a mutate copy too)
            "argv": spec.argv()[1:],
            "env": dict(sorted(spec.env.items())),
            "geometry": base.geometry,
            "weights": getattr(scen, "weights", None),
            "weight_seed": getattr(scen, "weight_seed", None),
        },
        "process_env": engine_environ(environ),
        "host": dict(host),
        "round0": [asdict(r) for r in plan.requests],
        "seed": plan.seed,
        "concurrency": plan.concurrency,
        "served_name": base.served_name,
        "scorer": dict(scorer),
    }


def digest(inputs: Mapping[str, Any]) -> str:
    """The key: sha256 of the inputs as canonical JSON."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sequence_key(prompt: Sequence[int], output: Sequence[int]) -> str:
    """A scored sequence's name: sha256 of its token ids (prompt + generated), which is
    all a teacher-forced score depends on for one key."""
    return hashlib.sha256(",".join(map(str, [*prompt, *output])).encode()).hexdigest()


# --- what is stored ---------------------------------------------------------------------
def outcome_json(o: Outcome) -> dict[str, Any]:
    data = asdict(o)
    data["top"] = [[[t, v] for t, v in d.items()] for d in o.top]
    return data


def outcome_of(data: Mapping[str, Any]) -> Outcome:
    """An ``Outcome`` back from ``outcome_json``, exactly (a bad shape raises)."""
    d = dict(data)
    d["top"] = [{int(t): float(v) for t, v in row} for row in d["top"]]
    d["prompt"] = [int(t) for t in d["prompt"]]
    d["output"] = [int(t) for t in d["output"]]
    d["logprobs"] = [float(x) for x in d["logprobs"]]
    o = Outcome(**d)
    if not isinstance(o.id, str):
        raise TypeError("an outcome's id is not a string")
    return o


def scores_json(scores: Scores) -> list[Any]:
    return [None if d is None else [[t, v] for t, v in d.items()] for d in scores]


def scores_of(data: Sequence[Any]) -> Scores:
    return [None if d is None else {int(t): float(v) for t, v in d} for d in data]


@dataclass
class CachedFloor:
    """What the reference's replay of round 0 gave: every floor figure ``run_reference_side``
    sets, the replay itself (``result.reference``: ``reference.jsonl``, the served
    differences in ``run.json`` and ``divergence.md``) and the reference server's kernels
    (``engine_kernels["reference"]``: the figures, the output check's detail)."""

    figures: dict[str, Any]  # FLOOR_FIELDS -> value
    reference: list[Outcome]
    kernels: dict[str, str] | None = None

    @classmethod
    def of(cls, result: StressResult) -> CachedFloor:
        return cls(
            {k: getattr(result, k) for k in FLOOR_FIELDS},
            list(result.reference),
            result.engine_kernels.get("reference"),
        )

    def apply(self, result: StressResult) -> None:
        for k in FLOOR_FIELDS:
            setattr(result, k, self.figures[k])
        result.reference = list(self.reference)
        if self.kernels is not None:
            result.engine_kernels["reference"] = dict(self.kernels)

    def record(self) -> dict[str, Any]:
        return {
            "figures": self.figures,
            "reference": [outcome_json(o) for o in self.reference],
            "kernels": self.kernels,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> CachedFloor:
        figures = {k: data["figures"][k] for k in FLOOR_FIELDS}
        if not isinstance(figures["tolerance"], int | float) or not all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in figures.values()
        ):
            raise TypeError("a cached floor figure is not a number")
        kernels = data.get("kernels")
        if kernels is not None and not isinstance(kernels, dict):
            raise TypeError("the cached kernels are not a table")
        return cls(figures, [outcome_of(o) for o in data["reference"]], kernels)


@dataclass
class ReferenceCache:
    """One key's cache file, ``DIR/reference-<key>.json``: the floor and the scores by
    ``sequence_key``. A file that cannot be read is a miss with a warning, never an
    error: the run launches the reference and writes the file anew."""

    path: Path
    key: str
    inputs: dict[str, Any]
    floor: CachedFloor | None = None
    scores: dict[str, Scores] = field(default_factory=dict)
    warning: str = ""

    @classmethod
    def open(cls, directory: Path, inputs: dict[str, Any]) -> ReferenceCache:
        key = digest(inputs)
        cache = cls(Path(directory) / f"reference-{key[:16]}.json", key, inputs)
        if not cache.path.exists():
            return cache
        try:
            cache.floor, cache.scores = _read(cache.path, key)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            cache.warning = (
                f"reference cache {cache.path} unreadable ({type(err).__name__}: {err}); "
                "treated as a miss"
            )
        return cache

    def save(self) -> str:
        """Write the file atomically (a temporary file in the same directory, then
        ``os.replace``), merged with what another writer saved meanwhile; "" or why it
        could not be written (a warning: the run's verdicts do not depend on it)."""
        try:
            if self.path.exists():
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
                    floor, scores = _read(self.path, self.key)
                    self.floor = self.floor or floor
                    self.scores = {**scores, **self.scores}
            body = {
                "format": CACHE_FORMAT,
                "key": self.key,
                "inputs": self.inputs,
                "floor": self.floor.record() if self.floor is not None else None,
                "scores": {k: scores_json(v) for k, v in sorted(self.scores.items())},
            }
            text = json.dumps(body, sort_keys=True, default=str)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, text)
        except OSError as err:
            return f"reference cache {self.path} not written ({type(err).__name__}: {err})"
        return ""

    def scorer(self, live: Scorer | None = None) -> Scorer:
        """Scores from the cache; a miss asks ``live`` and keeps its answer (without
        ``live`` a miss is a bug of the caller: it raises KeyError)."""

        def score(prompt: list[int], output: list[int]) -> Scores:
            k = sequence_key(prompt, output)
            if k not in self.scores:
                if live is None:
                    raise KeyError(f"sequence {k[:12]} is not in the reference cache")
                self.scores[k] = live(prompt, output)
            return self.scores[k]

        return score


def _read(path: Path, key: str) -> tuple[CachedFloor | None, dict[str, Scores]]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        raise ValueError(f"not a format-{CACHE_FORMAT} reference cache")
    if data.get("key") != key:
        raise ValueError("its key is another run's")
    raw = data["floor"]
    floor = CachedFloor.parse(raw) if raw is not None else None
    scores = {str(k): scores_of(v) for k, v in data["scores"].items()}
    return floor, scores


def atomic_write(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed over it: a reader sees the
    old file or the new one, never half of one; the temporary file never stays."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class LiveReference:
    """A launched reference server, as the cache logic uses it."""

    send: Send
    score: Scorer


Launch = Callable[[], AbstractContextManager[LiveReference]]
"""Start the reference server; the context's exit stops it (and records its kernels)."""


def reference_side(
    result: StressResult,
    cache: ReferenceCache,
    launch: Launch,
    status: Callable[[str], None] = lambda _: None,
) -> None:
    """``run_reference_side`` through the cache: judged from it alone when it holds the
    floor and every compared request's tokens and none diverges; else the reference is
    launched, and measures (the floor, when not cached), scores (what is not cached) and
    explains (every divergence). What it computed is saved either way. Errors of the
    launched reference propagate (the caller records them as today)."""
    plan = result.plan
    keys = [sequence_key(o.prompt, o.output) for o in compared(result.outcomes)]
    held = set(cache.scores)
    source = ReferenceSource(str(cache.path), warning=cache.warning)
    source.cached = sum(k in held for k in keys)
    source.scored = len(keys) - source.cached
    result.reference_source = source
    missing = len({k for k in keys if k not in held})
    if cache.floor is not None:
        cache.floor.apply(result)
        if not missing:
            judge_run(result, cache.scorer())
            diverging = sum(v.divergence is not None for v in result.verdicts.values())
            if not diverging:
                return
            source.reason = f"{diverging} request(s) diverge: a live reference explains them"
        else:
            source.reason = f"{missing} sequence(s) not in the cache"
    else:
        source.floor = "measured"
        source.reason = "no floor in the cache"
    source.launched = True
    measured = False
    try:
        with launch() as live:
            if cache.floor is None:
                status(
                    f"reference: round 0 at concurrency {plan.concurrency} (the noise floor), "
                    f"then {source.scored} requests scored alone ({source.cached} cached)"
                )
                result.reference = drive(plan.requests, live.send, plan.concurrency)
                set_floor(result, floor_of(result.reference, cache.scorer(live.score)))
                measured = True
            elif missing:
                status(
                    f"reference: the floor from the cache, {source.scored} requests scored "
                    f"alone ({source.cached} cached)"
                )
            else:
                status(f"reference: {source.reason}")
            if not result.verdicts:  # judged above only when every score was cached
                judge_run(result, cache.scorer(live.score))
            explain_divergences(result, live.send)
    finally:
        if measured:
            cache.floor = CachedFloor.of(result)  # the launch's exit recorded the kernels
        problem = cache.save()
        if problem:
            source.warning = "; ".join(w for w in (source.warning, problem) if w)
