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

from harness.rules import Match, first_match
from harness.rules import version_matches as version_matches  # re-exported for callers
from harness.scenario import Expectation, KnownCrash

# "(EngineCore pid=3689) " possibly nested: "(APIServer pid=1) (Worker pid=2) ".
_PROC_PREFIX = re.compile(r"^((?:\((?P<proc>[A-Za-z_][\w ]*?)\s+pid=(?P<pid>\d+)\)\s*)+)")
# vLLM's logger prefix: "ERROR 11-30 06:50:27 [core.py:123] ".
_LOG_PREFIX = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
# Tracebacks print 'File "x.py", line 3, in f'; fault handler dumps the same without the comma.
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_EXC = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)?)"
    r"(?::\s?(?P<msg>.*))?$"
)
# Searched, not matched: the fault handler writes straight to fd 2, so its first line can
# land after a progress bar that ended in "\r" without a newline.
_FATAL = re.compile(r"Fatal Python error: (?P<what>.*\S)")
_THREAD = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+) \(most recent call first\):"
)
_STACK_ONLY = "Stack (most recent call first):"  # faulthandler with all_threads=False
_WORKER_DIED = re.compile(
    r"Worker proc (?P<name>\S+) died unexpectedly \(exit code: (?P<code>[^)]*)\)"
)
# Python's fault handler names the signal in words (Modules/faulthandler.c).
FATAL_SIGNALS = {
    "Illegal instruction": "SIGILL",
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Aborted": "SIGABRT",
}


@dataclass
class Frame:
    path: str
    line: int
    func: str
    source: str = ""  # the code line Python printed under the frame

    @property
    def vllm_relpath(self) -> str | None:
        """``vllm/...`` part of the path when the frame is inside vLLM."""
        idx = self.path.rfind("/vllm/")
        return self.path[idx + 1 :] if idx >= 0 else None


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


def _clean(line: str) -> tuple[str, str]:
    """Split a log line into (process key, text without process/logger prefixes)."""
    proc = "main"
    m = _PROC_PREFIX.match(line)
    if m:
        # The innermost (last) process tag names who printed the line.
        tags = re.findall(r"\(([A-Za-z_][\w ]*?)\s+pid=(\d+)\)", m.group(1))
        name, pid = tags[-1]
        proc = f"{name} pid={pid}"
        line = line[m.end() :]
    line = _LOG_PREFIX.sub("", line, count=1)
    return proc, line.rstrip("\n")


def parse_tracebacks(lines: Iterable[str]) -> list[Traceback]:
    """Every Python traceback in a (multi-process, interleaved) vLLM log, in order.

    Chained exceptions ("During handling of the above exception ...") are folded into
    the traceback that started the chain: the first one is the root cause.
    """
    open_tb: dict[str, Traceback] = {}
    chained: dict[str, Traceback] = {}
    done: list[Traceback] = []
    for lineno, raw in enumerate(lines):
        proc, text = _clean(raw)
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
class ThreadStack:
    thread: str  # "0x00007f6c87a0ab80"
    current: bool  # marked "Current thread" by the fault handler
    frames: list[Frame] = field(default_factory=list)  # innermost FIRST, as printed


@dataclass
class FatalSignal:
    """A fault handler dump: the only trace a process killed by a signal leaves."""

    signal: str  # "SIGILL", ...; a fatal error that is not a signal is kept verbatim
    message: str  # "Fatal Python error: Illegal instruction"
    line: int  # index in the log of the "Fatal Python error" line
    prefix: str = ""  # the process tag on that line, when vLLM's prefix says who it was
    threads: list[ThreadStack] = field(default_factory=list)

    @property
    def stack(self) -> ThreadStack | None:
        """The thread that took the signal.

        The handler marks it "Current thread" only when that thread held the GIL; a C
        kernel usually runs with the GIL released, so otherwise the last thread with vLLM
        frames is taken (the main thread is printed last; helper threads such as tqdm's
        monitor have no vLLM frames).
        """
        for thread in self.threads:
            if thread.current:
                return thread
        with_vllm = [t for t in self.threads if any(f.vllm_relpath for f in t.frames)]
        if with_vllm:
            return with_vllm[-1]
        return self.threads[-1] if self.threads else None

    @property
    def process(self) -> str:
        """Who died: the line's process tag when it had one, else a role read from the
        frames, since the handler's raw writes carry no vLLM prefix."""
        return self.prefix or _role(self.threads)

    def innermost_vllm_frame(self) -> Frame | None:
        stack = self.stack
        return next((f for f in stack.frames if f.vllm_relpath), None) if stack else None


_WORKER_FILES = ("gpu_worker.py", "cpu_worker.py", "worker_base.py")


def _role(threads: Sequence[ThreadStack]) -> str:
    """Worker or EngineCore, from code only that process runs.

    With an in-process executor one process runs both; the worker frames are where the
    model ran, so they win.
    """
    frames = [(rel, f) for t in threads for f in t.frames if (rel := f.vllm_relpath)]
    if any(
        rel.startswith("vllm/v1/worker/")
        or rel.rsplit("/", 1)[-1] in _WORKER_FILES
        or f.func in ("worker_main", "worker_busy_loop")  # multiproc_executor's WorkerProc
        for rel, f in frames
    ):
        return "worker"
    if any(rel == "vllm/v1/engine/core.py" for rel, _ in frames):
        return "EngineCore"
    return "unknown"


def parse_fatal_signals(lines: Iterable[str]) -> list[FatalSignal]:
    """Every fault handler dump in a (multi-process, interleaved) log, in order."""
    found: list[FatalSignal] = []
    dump: FatalSignal | None = None
    stack: ThreadStack | None = None
    for lineno, raw in enumerate(lines):
        proc, text = _clean(raw)
        fatal = _FATAL.search(text)
        if fatal:
            # Mid-line, a prefix belongs to whoever printed the progress bar before it.
            prefix = proc if proc != "main" and not text[: fatal.start()].strip() else ""
            what = fatal["what"]
            dump = FatalSignal(FATAL_SIGNALS.get(what, what), fatal.group(0), lineno, prefix)
            found.append(dump)
            stack = None
            continue
        if dump is None or proc not in ("main", dump.prefix or "main"):
            continue  # not in a dump, or another process's line interleaved into it
        body = text.strip()
        header = _THREAD.match(body)
        if header or body == _STACK_ONLY:
            current = header is None or header["current"] == "Current thread"
            stack = ThreadStack(header["id"] if header else "", current)
            dump.threads.append(stack)
            continue
        frame = _FRAME.match(text)
        if frame and stack is not None:
            stack.frames.append(Frame(frame["path"], int(frame["line"]), frame["func"]))
        elif not body:
            stack = None  # threads are separated by a blank line
        elif body in ("...", "<no Python frame>") or body.startswith("Python runtime state:"):
            continue
        else:  # "Extension modules: ...", or the log going on
            dump = stack = None
    return found


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
        proc, text = _clean(raw)
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
            return f"{self.process} died unexpectedly (no stack; exit code: {code}{how})"
        where = f" in {self.frame}" if self.frame else ""
        who = f" ({self.process})" if self.kind == "signal" and self.process else ""
        label = known_label(self.known)
        known = f" (known: {label})" if label else ""
        return f"{self.exception}{where}{who}{known}"


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
        return _signal_signature(fatal, known)
    if death is not None and death.line < first_tb:
        return CrashSignature(
            exception="worker died",
            message=death.message[:300],
            frame="",
            process=death.name,
            kind="died",
            exit_code=death.exit_code,
        )
    if not tracebacks:
        last_error = next(
            (_clean(ln)[1] for ln in reversed(log_lines) if " ERROR " in ln or "Error" in ln), ""
        )
        return CrashSignature(
            exception=f"no traceback ({describe_exit(returncode)})",
            message=last_error[:200],
            frame="",
            process="",
        )
    root = tracebacks[0]
    frame = root.innermost_vllm_frame()
    frame_txt = f"{frame.vllm_relpath}:{frame.func}" if frame else ""
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


def _signal_signature(fatal: FatalSignal, known: Sequence[KnownCrash]) -> CrashSignature:
    frames = fatal.stack.frames if fatal.stack else []
    frame = fatal.innermost_vllm_frame()
    return CrashSignature(
        exception=fatal.signal,
        message=fatal.message[:300],
        frame=f"{frame.vllm_relpath}:{frame.func}" if frame else "",
        process=fatal.process,
        known=_known_issue(fatal.signal, frames, known),
        paths=tuple(f.path for f in frames),
        kind="signal",
    )


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


# The Expectation fields compared with equality against the RowContext field of the same
# name; ``vllm`` is matched as a specifier against ``vllm_version`` (first_match's default).
EXPECTATION_FIELDS = ("variant", "patch", "connector", "chunked_local", "model")


def match_expectation(ctx: RowContext, rules: Sequence[Expectation]) -> Match[Expectation] | None:
    """The first rule matching the row, with its index in ``rules``; None when none does."""
    return first_match(rules, asdict(ctx), fields=EXPECTATION_FIELDS)


def expectation_for(ctx: RowContext, rules: Sequence[Expectation]) -> Expectation | None:
    """First matching rule wins; None when no rule matches (a scenario error)."""
    found = match_expectation(ctx, rules)
    return None if found is None else found.rule


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
