"""Turning a launch into a verdict: what happened, why, and whether it was expected.

A vLLM server crash at start is spread over several processes (API server,
EngineCore, workers), each printing its own traceback into one interleaved log,
usually ending with a generic "Engine core initialization failed" from the API
server. The signature that matters is the *root cause*: the first failure any
process printed, and its innermost frame inside vLLM.

A process killed by a signal (SIGILL in a CPU kernel, SIGSEGV, ...) prints no Python
traceback: with ``PYTHONFAULTHANDLER=1`` it leaves a "Fatal Python error" dump of its
thread stacks on raw stderr, and vLLM's executor may log "Worker proc ... died
unexpectedly". The survivors' tracebacks that follow (``RuntimeError: cancelled``,
``EngineDeadError``) are consequences, so a dump or a death line printed before them is
the root cause. Order, not kind, decides: a worker death logged during teardown *after*
a Python exception (the #51150 log has one) is a consequence of that exception.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from harness.scenario.crash_repro import Expectation
from harness.scenario.rules import Match, first_match, platform_gap
from harness.scenario.rules import version_matches as version_matches  # re-exported for callers
from harness.scenario.schema import KnownCrash
from harness.server import engine_log
from harness.server.fault_dumps import FatalSignal, parse_fatal_signals
from harness.server.log_lines import Frame, split_prefix

# Tracebacks print 'File "x.py", line 3, in f'; fault handler dumps the same without the comma.
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_EXC = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)?)"
    r"(?::\s?(?P<msg>.*))?$"
)
_WORKER_DIED = re.compile(
    r"Worker proc (?P<name>\S+) died unexpectedly \(exit code: (?P<code>[^)]*)\)"
)


@dataclass
class Traceback:
    process: str
    frames: list[Frame] = field(default_factory=list)
    exception: str = ""
    message: str = ""
    line: int = -1  # index in the log of its "Traceback" line: root causes are ordered

    def innermost_vllm_frame(self) -> Frame | None:
        for frame in reversed(self.frames):
            if frame.vllm_relpath is not None:
                return frame
        return None


def parse_tracebacks(lines: Iterable[str]) -> list[Traceback]:
    """Every Python traceback in a (multi-process, interleaved) vLLM log, in order.

    Chained exceptions ("During handling of the above exception ...") are folded into
    the traceback that started the chain: the first one is the root cause.
    """
    open_tb: dict[str, Traceback] = {}
    chained: dict[str, Traceback] = {}
    done: list[Traceback] = []
    for lineno, raw in enumerate(lines):
        proc, text = split_prefix(raw)
        if text.startswith("Traceback (most recent call last):"):
            if proc not in chained:
                open_tb[proc] = Traceback(process=proc, line=lineno)
            else:
                open_tb[proc] = chained[proc]  # keep filling the chain's root
            continue
        if proc in chained and (
            text.startswith("During handling of the above")
            or text.startswith("The above exception was the direct")
        ):
            continue
        tb = open_tb.get(proc)
        if tb is None:
            if text.strip() and not text.startswith(" "):
                chained.pop(proc, None)
            continue
        fm = _FRAME.match(text)
        if fm:
            if tb.exception:  # frames after the exception line belong to a chained one
                continue
            tb.frames.append(Frame(fm["path"], int(fm["line"]), fm["func"]))
            continue
        if text.startswith((" ", "\t")) and tb.frames and not tb.exception:
            code = text.strip()
            if code and not set(code) <= set("^~ ") and not tb.frames[-1].source:
                tb.frames[-1].source = code
            continue
        if text.startswith((" ", "\t", "^", "~")) or not text.strip():
            continue  # carets, blank lines
        em = _EXC.match(text.strip())
        if em and tb.frames:
            if not tb.exception:
                tb.exception = em["type"].rsplit(".", 1)[-1]
                tb.message = (em["msg"] or "").strip()
                done.append(tb)
            del open_tb[proc]
            chained[proc] = tb
    return done


@dataclass
class WorkerDeath:
    """vLLM's executor noticing a worker gone; all there is when the worker left no dump."""

    name: str  # "VllmWorker-0"
    exit_code: str  # as vLLM printed it: "None" (not reaped yet) or "-4"
    process: str  # who logged it: "EngineCore pid=8421"
    message: str
    line: int


def parse_worker_deaths(lines: Iterable[str]) -> list[WorkerDeath]:
    deaths = []
    for lineno, raw in enumerate(lines):
        proc, text = split_prefix(raw)
        m = _WORKER_DIED.search(text)
        if m:
            deaths.append(WorkerDeath(m["name"], m["code"], proc, text.strip(), lineno))
    return deaths


def known_label(known: int | str | None) -> str:
    """One spelling of a known crash everywhere a verdict is shown or compared: upstream
    issues read "#51150" (also when they come back from a CSV as "51150"), labels for
    bugs with no issue number ("amx-sigill") read as they are, none reads ""."""
    if known is None:
        return ""
    text = str(known).strip().removeprefix("#")
    return f"#{text}" if text.isdigit() else text


@dataclass
class CrashSignature:
    exception: str  # exception type, signal name ("SIGILL"), or "worker died"
    message: str
    frame: str  # "vllm/.../file.py:function", or "" when no vLLM frame was seen
    process: str
    known: int | str | None = None  # upstream issue number or label
    paths: tuple[str, ...] = ()  # every frame's file in the root-cause traceback or stack
    kind: Literal["exception", "signal", "died"] = "exception"  # "died": no stack to show
    exit_code: str = ""  # "died": the exit code vLLM logged

    def summary(self) -> str:
        if self.kind == "died":
            code = self.exit_code
            how = describe_exit(int(code)) if code.lstrip("-").isdigit() else ""
            how = f", {how}" if how.startswith("killed") else ""
            label = known_label(self.known)
            known = f" (known: {label}, by its reported kernel)" if label else ""
            return f"{self.process} died unexpectedly (no stack; exit code: {code}{how}){known}"
        where = f" in {self.frame}" if self.frame else ""
        who = f" ({self.process})" if self.kind == "signal" and self.process else ""
        label = known_label(self.known)
        known = f" (known: {label})" if label else ""
        return f"{self.exception}{where}{who}{known}"


def frame_text(frame: Frame | None) -> str:
    """``vllm/x.py:function``; ``vllm/x.py:line`` for a frame whose name was cut off."""
    if frame is None:
        return ""
    return f"{frame.vllm_relpath}:{frame.func or frame.line}"


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def crash_signature(
    log_lines: Sequence[str], returncode: int | None, known: Sequence[KnownCrash] = ()
) -> CrashSignature:
    """The root-cause signature of a crash, matched against known crashes.

    The first failure printed is the root cause: a fault handler dump or a worker death
    printed before the first traceback wins over it (the tracebacks are the survivors'
    reactions); a traceback printed first keeps winning over a death or an abort during
    the teardown it caused.
    """
    tracebacks = parse_tracebacks(log_lines)
    first_tb = tracebacks[0].line if tracebacks else len(log_lines)
    signals, deaths = parse_fatal_signals(log_lines), parse_worker_deaths(log_lines)
    fatal = signals[0] if signals else None
    death = deaths[0] if deaths else None
    if fatal is not None and fatal.line < first_tb and (death is None or fatal.line < death.line):
        reported = frozenset(f"{k}={v}" for k, v in engine_log.kernels(log_lines).items())
        return _signal_signature(fatal, known, reported)
    if death is not None and death.line < first_tb:
        reported = frozenset(f"{k}={v}" for k, v in engine_log.kernels(log_lines).items())
        return CrashSignature(
            exception="worker died",
            message=death.message[:300],
            frame="",
            process=death.name,
            known=_known_death(death.exit_code, known, reported),
            kind="died",
            exit_code=death.exit_code,
        )
    if not tracebacks:
        last_error = next(
            (split_prefix(ln)[1] for ln in reversed(log_lines) if " ERROR " in ln or "Error" in ln),
            "",
        )
        return CrashSignature(
            exception=f"no traceback ({describe_exit(returncode)})",
            message=last_error[:200],
            frame="",
            process="",
        )
    root = tracebacks[0]
    frame = root.innermost_vllm_frame()
    frame_txt = frame_text(frame)
    # A bare ``assert`` has no message; the asserting line is the best one there is.
    message = root.message or (root.frames[-1].source if root.frames else "")
    return CrashSignature(
        root.exception,
        message[:300],
        frame_txt,
        root.process,
        known=_known_issue(root.exception, root.frames, known),
        paths=tuple(f.path for f in root.frames),
    )


def _signal_signature(
    fatal: FatalSignal, known: Sequence[KnownCrash], reported: frozenset[str] = frozenset()
) -> CrashSignature:
    """A dump as a signature: a known crash is its signal with one of its functions
    named anywhere in the dump (however another writer tore its frame), or, when the
    dump holds no frame of the model code (cut before it), with one of its kernels reported by the
    process (``reported``: "key=value"); the stack shown is the thread calling it when
    one was read whole, else the dump's own pick (none when only helpers were read)."""
    issue, stack = None, fatal.stack
    for kc in known:
        if kc.exception != fatal.signal:
            continue
        functions = [f for f in kc.functions if fatal.mentions(f)]
        if functions:
            issue, stack = kc.issue, fatal.thread_calling(functions) or stack
            break
        if not fatal.model_read and reported.intersection(kc.kernels):
            issue = kc.issue
            break
    frames = stack.frames if stack else []
    frame = stack.innermost_vllm_frame() if stack else None
    return CrashSignature(
        exception=fatal.signal,
        message=fatal.message[:300],
        frame=frame_text(frame),
        process=fatal.process,
        known=issue,
        paths=tuple(f.path for f in frames),
        kind="signal",
    )


# The exit code a process killed by each fatal signal reports (minus its number).
_SIGNAL_EXIT = {"SIGILL": "-4", "SIGABRT": "-6", "SIGBUS": "-7", "SIGFPE": "-8", "SIGSEGV": "-11"}


def _known_death(
    exit_code: str, known: Sequence[KnownCrash], reported: frozenset[str]
) -> int | str | None:
    """A worker that died leaving no fault dump at all (on one AMX host the signal killed
    it before the handler wrote a line, 2026-12-06) is a known signal crash only when it
    reported one of that crash's kernels and its exit code is the signal's, or was never
    read (vLLM logs ``None`` when it notices the death before reaping the process)."""
    for kc in known:
        want = _SIGNAL_EXIT.get(kc.exception)
        if want and exit_code in (want, "None") and reported.intersection(kc.kernels):
            return kc.issue
    return None


def _known_issue(
    exception: str, frames: Sequence[Frame], known: Sequence[KnownCrash]
) -> int | str | None:
    """A known crash is its exception (or signal) raised with one of its functions on the
    stack; the same exception elsewhere is a different bug."""
    funcs = {f.func for f in frames}
    for kc in known:
        if exception == kc.exception and funcs.intersection(kc.functions):
            return kc.issue
    return None


@dataclass
class RowContext:
    """What expectation rules can match on."""

    variant: str
    vllm_version: str
    patch: str  # "none" when no patch
    connector: bool
    chunked_local: bool
    model: str = ""
    # The platform, for rules that say where they hold: the variant's device and the
    # host's CPU flags.
    device: str = "cpu"
    cpu_flags: frozenset[str] = frozenset()


# The Expectation fields compared with equality against the RowContext field of the same
# name; ``vllm`` is matched as a specifier against ``vllm_version`` (first_match's default),
# ``platform`` against ``device`` and ``cpu_flags``.
EXPECTATION_FIELDS = ("variant", "patch", "connector", "chunked_local", "model")


def match_expectation(ctx: RowContext, rules: Sequence[Expectation]) -> Match[Expectation] | None:
    """The first rule matching the row, with its index in ``rules``; None when none does."""
    return first_match(rules, asdict(ctx), fields=EXPECTATION_FIELDS, platform_field="platform")


def expectation_gap(ctx: RowContext, rules: Sequence[Expectation]) -> str:
    """With no rule matching the row: "no expectation on <platform>: ..." when rules for
    another platform would have; "" when none would (a missing catch-all)."""
    return platform_gap(rules, asdict(ctx), fields=EXPECTATION_FIELDS)


def judge(
    outcome: str, known: int | str | None, answered: bool | None, rule: Expectation | None
) -> tuple[bool, str]:
    """Whether an outcome matches its rule, and a one-line reason when it does not."""
    if rule is None:
        return False, "no expectation rule matches this row"
    if outcome != rule.outcome:
        return False, f"expected {rule.outcome}, got {outcome}"
    if rule.known is not None and known_label(known) != known_label(rule.known):
        got = known_label(known) or "an unknown signature"
        return False, f"expected the {known_label(rule.known)} signature, got {got}"
    if outcome == "started" and answered is False:
        return False, "started but did not answer a completion"
    return True, ""
