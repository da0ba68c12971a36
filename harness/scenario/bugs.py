"""Bug corpus entries (``scenarios/bugs/*.toml``): an upstream bug as a regression row,
its trigger (a check, a script of steps on one server, or a scheduler drive) and the
symptom that shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, field_validator

from harness.errors import BadInput
from harness.scenario.schema import (
    FileScenario,
    Platform,
    StrictModel,
    _load,
    _patch_or_none,
    _spec_or_none,
)

TriggerT = TypeVar("TriggerT", bound=StrictModel)


class CheckTrigger(StrictModel):
    """A bug shown by a check another scenario already defines: a crash-repro row, a
    matrix cell or a round trip, named by the id ``offload-check sweep`` uses."""

    kind: Literal["check"] = "check"
    scenario: str = Field(description="crash-repro, matrix, roundtrip or pressure scenario")
    check: str = Field(description="the check's id, e.g. llama4-issue-51150/connector-on")
    # The AMX permission fix off in the engine (reproduces vLLM's CPU-attention SIGILL).
    amx: Literal["auto", "off"] = "auto"


StepKind = Literal["send", "evict", "settle", "reset-prefix-cache", "expect"]
StepQuantity = Literal[
    "external_hits",
    "external_queries",
    "gpu_hits",
    "gpu_queries",
    "stored_bytes",
    "loaded_bytes",
    "prompt_tokens",
    "http_status",
    "reset_success",
    "same_output",
]


class Step(StrictModel):
    """One step of a scripted trigger (docs/bugs.md lists the kinds and their fields).

    ``send`` a completion; ``evict`` the GPU prefix cache with unrelated prompts sized from
    the live pool; ``settle`` until the store counters stop moving; ``reset-prefix-cache``
    (POST ``/reset_prefix_cache``); ``expect`` one named fact, the unit a symptom names.
    Metrics are snapshotted before every step, so ``expect`` can take the change of a
    counter since any named step began.
    """

    do: StepKind
    name: str | None = Field(None, description="label other steps refer to (since, prompt)")
    # send
    prompt: str | None = Field(None, description="send: a prompt name; one name, one token list")
    tokens: int | None = Field(None, gt=0, description="send: the prompt's length in tokens")
    prefix: str | None = Field(None, description="send: start with an earlier prompt's tokens")
    prefix_tokens: int | None = Field(None, gt=0, description="send: how many of them")
    after: str | None = Field(
        None, description="send: a next turn: an earlier send's prompt and answer, then its own"
    )
    max_tokens: int = Field(8, gt=0)
    prompt_logprobs: int | None = Field(None, ge=0)
    concurrent: int = Field(1, ge=1, description="send: copies in flight at once")
    background: bool = Field(False, description="send: do not wait; the next steps run meanwhile")
    abort: Literal["queued"] | None = Field(
        None,
        description="send: hang up while the request waits in the scheduler's queue, never "
        "scheduled (the server must be full: another request running, --max-num-seqs 1)",
    )
    # evict
    pools: float = Field(1.5, gt=0, description="evict: the live pool's tokens times this")
    # reset-prefix-cache
    query: dict[str, str] = Field(default_factory=dict, description="reset: URL parameters")
    # expect
    what: StepQuantity | None = None
    since: str | None = Field(None, description="expect: counters' change since this step")
    of: list[str] = Field(default_factory=list, description="expect same_output: two sends")
    op: Literal["==", "!=", ">", ">=", "<", "<="] = "=="
    value: float | None = None
    why: str = ""

    @field_validator("name", "prompt", "prefix", "since", "after")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"names are letters, digits, '-' and '_': {value!r}")
        return value


class StepsTrigger(StrictModel):
    """A bug shown by a short script of requests and admin calls on one server, whose
    model, server and offload settings come from a round-trip scenario."""

    kind: Literal["steps"]
    scenario: str = Field(description="round-trip scenario giving model, server, offload")
    geometry: str | None = Field(None, description="another model geometry file instead")
    server_args: list[str] = Field(default_factory=list, description="appended to its args")
    env: dict[str, str] = Field(default_factory=dict, description="engine environment")
    offload_block_size: int | None = Field(None, gt=0)
    # kv_connector_extra_config entries over the scenario's (e.g. offload_prompt_only)
    offload_config: dict[str, Any] = Field(default_factory=dict)
    steps: list[Step] = Field(min_length=1)


class SchedulerTrigger(StrictModel):
    """A bug below a server's reach, shown by vLLM's real scheduler, the offloading
    connector's scheduler side and the real CPU manager driven step by step in one
    process of the build's interpreter, on made-up KV-cache specs
    (``harness.engine.scheduler_drive``; no weights, no worker, no server)."""

    kind: Literal["scheduler"]
    case: str = Field(
        description="the drive's case (python -m harness.engine.scheduler_drive --list)"
    )
    timeout_s: float = Field(600.0, gt=0, description="the drive's wall-time limit")


class Symptom(StrictModel):
    """How the bug shows on an affected build; anything healthy is a pass. Every field
    given must hold (the crash's known issue, text in its signature, the exact set of
    failing checks), so a different failure is an error, not a reproduction."""

    # deviates: a pressure check judged by the exact model of the known behaviour
    # ``known`` names (the scenario's rules), not by the oracle's own semantics.
    outcome: Literal["crashed", "crashed-on-first-request", "fail", "unsupported", "deviates"]
    known: int | str | None = Field(None, description="the known crash or deviation")
    error: str | None = Field(None, description="text the crash signature must contain")
    failing_checks: list[str] = Field(default_factory=list)


class BugEntry(FileScenario):
    """One upstream bug as a regression row any vLLM build can be checked against."""

    id: str = Field(description="short id, the issue number or a label: 51150, amx-sigill")
    title: str
    label: Literal["offload", "engine"] = Field(
        "offload", description="an offloading bug, or an engine bug this harness found"
    )
    issue: int | str | None = Field(None, description="upstream issue number")
    issue_title: str = ""
    fix_pr: int | None = Field(None, description="the upstream pull request that fixed it")
    fix_title: str = ""
    affected: str = Field(description="PEP 440 specifier: releases the bug lives in")
    fixed: str | None = Field(None, description="releases with the fix; none: still open")
    # What the host must have: "gpu", or CPU flags as /proc/cpuinfo spells them.
    requires: list[str] = Field(default_factory=list)
    # Where the bug lives: a build on another device (or a host without the flags) is
    # skipped with the reason, never judged (a CPU kernel's crash on a CUDA build).
    platform: Platform | None = None
    summary: str = ""
    trigger: CheckTrigger | StepsTrigger | SchedulerTrigger = Field(discriminator="kind")
    symptom: Symptom
    reproduce: str = Field("", description="the bug outside the harness: plain vLLM commands")
    notes: str = ""
    # A bug that lived only in releases no machine here can install is shown caught on a
    # build with its fix, with the fix undone by this harness patch (harness.engine.patches).
    seeded_by: str | None = Field(None, description="the patch that puts the bug back")

    _seeded_by = field_validator("seeded_by")(_patch_or_none)
    _specs = field_validator("affected", "fixed")(_spec_or_none)

    def trigger_as(self, kind: type[TriggerT]) -> TriggerT:
        """The trigger, which must be of ``kind`` (a runner handed another entry is bad input)."""
        if not isinstance(self.trigger, kind):
            raise BadInput(f"{self.source}: not a {kind.__name__} entry")
        return self.trigger

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not value or not value.replace("-", "").isalnum():
            raise ValueError(f"an id is letters, digits and '-': {value!r}")
        return value


def load_bug(path: Path) -> BugEntry:
    entry = _load(path, BugEntry)
    if entry.id != path.stem:
        raise BadInput(f"{path}: id {entry.id!r} must be the file's name ({path.stem})")
    return entry
