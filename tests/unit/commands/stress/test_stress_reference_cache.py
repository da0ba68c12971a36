"""``stress --reference-cache``: the connector-off reference's floor and scores kept under
a key of everything they depend on, a run judged from them alone when they hold every
sequence it must score and nothing diverges, the reference launched otherwise; a cache
that cannot be read is a miss with a warning; and mutate hands the cache to its stress
commands only. The live reference is a small fake (no server)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from harness.commands.stress import reference_cache as rc
from harness.commands.stress.driver import Outcome, Reply
from harness.commands.stress.evaluate import evaluate
from harness.commands.stress.files import divergence_md
from harness.commands.stress.judge import run_reference_side
from harness.commands.stress.plan import StressPlan, check_reference_cache
from harness.commands.stress.result import StressResult
from harness.commands.stress.workload import PlannedRequest
from harness.errors import BadInput
from harness.scenario.stress_profiles import ProfileSettings

ROOT = Path(__file__).resolve().parents[4]
SCENARIO = ROOT / "scenarios" / "stress.toml"
POISON = 13  # a token the fake reference prefers another to, by far more than any tolerance
KERNELS = {"attention_backend": "CPUAttentionBackend", "attention_isa": "vec"}


class FakeReference:
    """A reference server stand-in: greedy answers derived from the prompt, served with
    their top two; every position scored with its own token on top, except ``POISON``.
    It counts what it was asked, and records its kernels on exit as run.py's does."""

    def __init__(self, result: StressResult | None = None, *, refuse: bool = False) -> None:
        self.result = result
        self.refuse = refuse
        self.launches = 0
        self.sent: list[str] = []
        self.scored: list[list[int]] = []

    @contextmanager
    def launch(self) -> Iterator[rc.LiveReference]:
        if self.refuse:
            raise AssertionError("the reference was launched")
        self.launches += 1
        try:
            yield rc.LiveReference(self.send, self.score)
        finally:
            if self.result is not None:
                self.result.engine_kernels["reference"] = dict(KERNELS)

    def send(self, req: PlannedRequest, prompt: list[int]) -> Reply:
        self.sent.append(req.id)
        out = [20 + (sum(prompt) + i) % 40 for i in range(req.max_tokens)]
        top = [{t: -0.1, t + 1: -0.2} for t in out]
        return Reply(out, "t" * len(out), [-0.1] * len(out), 0, top)

    def score(self, prompt: list[int], output: list[int]) -> list[dict[int, float] | None]:
        self.scored.append(prompt + output)
        toks = prompt + output
        return [None] + [
            {POISON: -3.0, POISON + 1: -0.1} if t == POISON else {t: -0.1, t + 1: -0.2}
            for t in toks[1:]
        ]


def small_plan() -> StressPlan:
    reqs = [
        PlannedRequest("r0", "x", 0.0, [1, 2, 3], max_tokens=3),
        PlannedRequest("r1", "x", 0.0, [4, 5], max_tokens=2),
    ]
    return StressPlan(None, "x", ProfileSettings(), reqs, 2, 0)


def result_of(outputs: dict[str, list[int]]) -> StressResult:
    """A run under test that answered each request with ``outputs[id]``."""
    plan = small_plan()
    res = StressResult(plan)
    res.sent = list(plan.requests)
    res.outcomes = [
        Outcome(r.id, "x", list(r.prompt), output=list(outputs[r.id]), text="ab", turn=None)
        for r in plan.requests
    ]
    return res


CLEAN = {"r0": [30, 31, 32], "r1": [40, 41]}


def judged(res: StressResult, *, timing: bool = True) -> dict[str, object]:
    """What the checks and result files are made of, without where the reference came
    from: the figures, every check's record, divergence.md, the replay
    (``reference.jsonl``; its timing only with ``timing``: two live replays differ in
    it), the verdicts."""
    evaluate(res)
    figures = res.figures()
    figures.pop("reference_source", None)
    figures.pop("reference_cache", None)
    md = divergence_md(res)
    if res.reference_source is not None:
        md = md.replace(f"Reference: {res.reference_source.line()}.\n\n", "")
    replay = [rc.outcome_json(o) for o in res.reference]
    if not timing:
        replay = [{k: v for k, v in o.items() if not k.endswith("_s")} for o in replay]
    return {
        "figures": figures,
        "checks": [c.record() for c in res.checks],
        "divergence.md": md,
        "reference": replay,
        "verdicts": res.verdicts,
    }


def same_judgement(res: StressResult, other: StressResult) -> bool:
    return judged(res, timing=False) == judged(other, timing=False)


def live(outputs: dict[str, list[int]]) -> StressResult:
    """The run judged by a live reference, without the cache (as ``stress`` does)."""
    res = result_of(outputs)
    fake = FakeReference(res)
    with fake.launch() as ref:
        run_reference_side(res, ref.send, ref.score)
    return res


def cached_run(
    outputs: dict[str, list[int]], cache_dir: Path, *, refuse: bool = False
) -> tuple[StressResult, FakeReference]:
    res = result_of(outputs)
    fake = FakeReference(res, refuse=refuse)
    cache = rc.ReferenceCache.open(cache_dir, {"the": "key"})
    rc.reference_side(res, cache, fake.launch)
    return res, fake


# --- the key ----------------------------------------------------------------------------
HOST = {"machine": "x86_64", "cpu": "a CPU", "flags_sha256": "f" * 64, "cores": 2}


@pytest.fixture(scope="module")
def plan() -> StressPlan:
    from harness.commands.stress.plan import plan_stress
    from harness.scenario.stress import load_stress

    return plan_stress(load_stress(SCENARIO), profile="multi-turn", requests=4)


def key(p: StressPlan, **kw: object) -> str:
    args: dict[str, object] = {"host": HOST, "environ": {}, **kw}
    return rc.digest(rc.key_inputs(p, **args))  # type: ignore[arg-type]


def with_server(p: StressPlan, **changes: object) -> StressPlan:
    return replace(p, base=replace(p.base, server=replace(p.base.server, **changes)))


def test_the_key_changes_with_each_input_it_is_of(plan: StressPlan):
    server = plan.base.server
    first = plan.requests[0]
    rest = plan.requests[1:]
    other_prompt = replace(first, prompt=[first.prompt[0] + 1, *first.prompt[1:]])
    longer = replace(first, max_tokens=first.max_tokens + 1)
    old_vllm = replace(plan.base, env=replace(plan.base.env, vllm_version="0.1"))
    keys = {
        "as planned": key(plan),
        "interpreter": key(with_server(plan, python="/elsewhere/env/bin/python")),
        "vllm": key(replace(plan, base=old_vllm)),
        "engine args": key(with_server(plan, args=[*server.args, "--seed", "1"])),
        "server env": key(with_server(plan, env={**server.env, "VLLM_X": "1"})),
        "model": key(with_server(plan, model="/elsewhere/model")),
        "prompt": key(replace(plan, requests=[other_prompt, *rest])),
        "max_tokens": key(replace(plan, requests=[longer, *rest])),
        "requests": key(replace(plan, requests=plan.requests[:-1])),
        "seed": key(replace(plan, seed=plan.seed + 1)),
        "concurrency": key(replace(plan, concurrency=plan.concurrency + 1)),
        "scorer": key(plan, scorer={**rc.SCORER_SETTINGS, "score_top": 3}),
        "host": key(plan, host={**HOST, "flags_sha256": "a" * 64}),
        "engine environment": key(plan, environ={"VLLM_CPU_ATTN_SPLIT_KV": "0"}),
    }
    assert len(set(keys.values())) == len(keys), keys


def test_what_the_reference_never_sees_is_not_in_the_key(plan: StressPlan):
    """The connector's config (a fault, the tier's size) is off on the reference, and
    the line tracer's variables are set on mutate's baseline only: neither may make the
    mutants miss the baseline's reference."""
    kv = dict(plan.base.server.kv_transfer)
    kv["kv_connector_extra_config"] = {**kv["kv_connector_extra_config"], "cpu_bytes_to_use": 1}
    assert key(with_server(plan, kv_transfer=kv)) == key(plan)
    environ = {"OFFLOAD_CHECK_COVER": "vllm/x.py", "OFFLOAD_CHECK_COVER_OUT": "/tmp/l", "HOME": "/"}
    assert key(plan, environ=environ) == key(plan)


def fake_env(root: Path) -> Path:
    prefix = root / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (prefix / "lib" / "python3.11" / "site-packages" / "vllm").mkdir(parents=True)
    (prefix / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").write_text("")
    return prefix


def test_a_mutate_copy_is_keyed_as_the_environment_it_copies(tmp_path: Path):
    from harness.commands.mutate.sandbox import MARKER, make_copy

    assert rc.COPY_MARKER == MARKER
    prefix = fake_env(tmp_path)
    copy = make_copy(prefix, tmp_path / "mutants" / "m1" / "env", "lib/python3.11/site-packages")
    assert rc.environment_of(str(copy / "bin" / "python")) == str(prefix)
    assert rc.environment_of(str(prefix / "bin" / "python3")) == str(prefix)
    other = fake_env(tmp_path / "other")
    assert rc.environment_of(str(other / "bin" / "python")) != str(prefix)


# --- judged from the cache --------------------------------------------------------------
def test_a_full_hit_launches_nothing_and_judges_as_the_live_reference(tmp_path: Path):
    first, fake1 = cached_run(CLEAN, tmp_path)
    assert fake1.launches == 1 and first.reference_source is not None
    assert first.reference_source.launched and first.reference_source.floor == "measured"
    assert same_judgement(first, live(CLEAN))

    again, _ = cached_run(CLEAN, tmp_path, refuse=True)  # a launch would raise
    src = again.reference_source
    assert src is not None and not src.launched
    assert (src.cached, src.scored) == (2, 0) and src.label.startswith("cache ")
    assert judged(again) == judged(first)  # to the replay's timing: it is the same replay
    assert again.engine_kernels["reference"] == KERNELS
    assert again.figures()["reference_source"] == f"cache {src.path}"
    assert "no reference server launched" in src.line()
    assert "Reference: reference from cache" in divergence_md(again)


def test_a_sequence_not_in_the_cache_launches_the_reference_for_it_alone(tmp_path: Path):
    cached_run(CLEAN, tmp_path)
    changed = {**CLEAN, "r1": [40, 42]}
    res, fake = cached_run(changed, tmp_path)
    src = res.reference_source
    assert fake.launches == 1 and src is not None and src.launched
    assert fake.sent == []  # the floor came from the cache: no replay of round 0
    assert fake.scored == [[4, 5, 40, 42]]  # only what the cache lacked
    assert (src.floor, src.cached, src.scored) == ("cache", 1, 1)
    assert same_judgement(res, live(changed))
    # ... and the cache now holds it: the next such run launches nothing
    _, fake = cached_run(changed, tmp_path, refuse=True)
    assert fake.launches == 0


def test_a_divergence_launches_the_reference_to_explain_it(tmp_path: Path):
    poisoned = {**CLEAN, "r0": [30, POISON, 32]}
    cached_run(poisoned, tmp_path)
    res, fake = cached_run(poisoned, tmp_path)
    src = res.reference_source
    assert fake.launches == 1 and src is not None and src.launched
    assert "diverge" in src.reason and (src.cached, src.scored) == (2, 0)
    assert fake.scored == [] and fake.sent == ["explain/r0"]  # nothing scored again
    assert res.verdicts["r0"].divergence is not None and "reference_ids" in res.explanations["r0"]
    assert same_judgement(res, live(poisoned))


def test_no_cache_adds_nothing_to_the_figures_or_the_plan(plan: StressPlan):
    res = live(CLEAN)
    assert "reference_source" not in res.figures() and "reference_cache" not in res.figures()
    assert not any(ln.startswith("Reference:") for ln in divergence_md(res).splitlines())
    assert "reference_cache" not in plan.describe()
    cached = replace(plan, reference_cache=Path("/c"))
    assert cached.describe()["reference_cache"] == "/c"


# --- a cache that cannot be read, and how it is written ---------------------------------
def file_of(cache_dir: Path) -> Path:
    return rc.ReferenceCache.open(cache_dir, {"the": "key"}).path


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        "[]",
        json.dumps({"format": 1, "key": "another", "floor": None, "scores": {}}),
        json.dumps({"format": 99}),
        "KEY_BUT_NO_FIGURES",
        "KEY_BUT_BAD_SCORES",
    ],
)
def test_a_corrupt_cache_is_a_miss_with_a_warning(tmp_path: Path, body: str):
    path = file_of(tmp_path)
    k = rc.digest({"the": "key"})
    if body == "KEY_BUT_NO_FIGURES":
        body = json.dumps({"format": 1, "key": k, "floor": {"figures": {}}, "scores": {}})
    elif body == "KEY_BUT_BAD_SCORES":
        body = json.dumps({"format": 1, "key": k, "floor": None, "scores": {"a": [[["x", 1]]]}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    cache = rc.ReferenceCache.open(tmp_path, {"the": "key"})
    assert "treated as a miss" in cache.warning and cache.floor is None and not cache.scores
    res, fake = cached_run(CLEAN, tmp_path)
    assert fake.launches == 1 and res.reference_source is not None
    assert "unreadable" in res.reference_source.warning
    assert same_judgement(res, live(CLEAN))
    assert not rc.ReferenceCache.open(tmp_path, {"the": "key"}).warning  # written anew


def test_an_unreadable_unwritable_cache_warns_and_never_raises(tmp_path: Path):
    file_of(tmp_path).mkdir(parents=True)  # a directory where the file should be
    res, fake = cached_run(CLEAN, tmp_path)
    src = res.reference_source
    assert fake.launches == 1 and src is not None
    assert "unreadable" in src.warning and "not written" in src.warning
    assert same_judgement(res, live(CLEAN))


def test_the_file_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cached_run(CLEAN, tmp_path)
    path = file_of(tmp_path)
    before = path.read_text()
    json.loads(before)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rc.os, "replace", refuse)
    cache = rc.ReferenceCache.open(tmp_path, {"the": "key"})
    cache.scores["new"] = [None]
    assert "not written" in cache.save()
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_two_keys_are_two_files_never_shared(tmp_path: Path):
    a = rc.ReferenceCache.open(tmp_path, {"the": "key"})
    b = rc.ReferenceCache.open(tmp_path, {"the": "other key"})
    assert a.path != b.path
    cached_run(CLEAN, tmp_path)
    assert not rc.ReferenceCache.open(tmp_path, {"the": "other key"}).scores


def test_stored_outcomes_and_scores_come_back_exactly():
    o = Outcome("a", "x", [1, 2], [3], "t", [-0.123456789], [{3: -0.1, 7: float("-inf")}],
                started_s=1.5, ended_s=2.25, turn=2, cached_tokens=16)  # fmt: skip
    back = rc.outcome_of(json.loads(json.dumps(rc.outcome_json(o))))
    assert back == o
    scores = [None, {5: -0.1, 6: -1e-9}]
    assert rc.scores_of(json.loads(json.dumps(rc.scores_json(scores)))) == scores


def test_the_option_is_refused_where_it_cannot_apply(tmp_path: Path):
    (tmp_path / "f").write_text("")
    with pytest.raises(BadInput, match="not a directory"):
        check_reference_cache(tmp_path / "f", None)
    with pytest.raises(BadInput, match="attached run"):
        check_reference_cache(tmp_path, "http://127.0.0.1:8000")
    assert check_reference_cache(None, None) is None
    assert check_reference_cache(tmp_path / "new", None) == tmp_path / "new"


# --- mutate -------------------------------------------------------------------------------
def test_mutate_gives_stress_commands_the_cache_and_round_trips_none(tmp_path: Path):
    from harness.commands.mutate.execute import MutateCommand, command_argv

    cache = tmp_path / "session" / "reference-cache"
    out = tmp_path / "session" / "mutants" / "m1" / "stress"
    stress = command_argv(MutateCommand.parse("stress"), "/copy/bin/python", out, cache)
    at = stress.index("--reference-cache")
    assert stress[at + 1] == str(cache / "stress")
    scenario = MutateCommand.parse(str(ROOT / "scenarios" / "stress-window-edge.toml"))
    argv = command_argv(scenario, "/copy/bin/python", out, cache)
    assert argv[argv.index("--reference-cache") + 1] == str(cache / "stress-window-edge")
    for name in ("roundtrip", str(ROOT / "scenarios" / "roundtrip-pressure.toml")):
        assert "--reference-cache" not in command_argv(MutateCommand.parse(name), "/p", out, cache)
    assert "--reference-cache" not in command_argv(MutateCommand.parse("stress"), "/p", out)
