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

from harness.scenario.rules import Match, first_match, platform_gap
from harness.scenario.rules import version_matches as version_matches  # re-exported for callers
from harness.scenario.schema import Expectation, KnownCrash

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
# The fault handler's header. Modules/faulthandler.c writes "Fatal Python error: ", the
# signal's name and "\n\n" as three separate writes to fd 2, so when two threads take a
# signal at once (an OpenMP pool in one CPU kernel) their pieces interleave: "Fatal Python
# error: Fatal Python error: Illegal instruction" with the second name on a line of its own
# after a blank, or both names glued ("...Illegal instructionIllegal instruction").
# Searched, not matched: a header can also land after a progress bar that ended in "\r".
_FATAL = re.compile(r"Fatal Python error: ")
# Searched too: another writer's text can precede a thread header or a frame on its line.
_THREAD = re.compile(
    r"(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+) \(most recent call first\):"
)
_STACK_ONLY = "Stack (most recent call first):"  # faulthandler with all_threads=False
_DUMP_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<func>[^\s,]+)')
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
# Longest first, so "Floating-point exception" is not read as a shorter name.
_SIGNAL_NAME = re.compile("|".join(map(re.escape, sorted(FATAL_SIGNALS, key=len, reverse=True))))
# A run of names, glued or spaced: "Illegal instructionIllegal instruction".
_NAME_RUN = re.compile(rf"\s*(?:(?:{_SIGNAL_NAME.pattern})\s*)+")
_NAMES_AT_END = re.compile(rf"(?:(?:{_SIGNAL_NAME.pattern})\s*)+$")


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

    @property
    def helper(self) -> bool:
        """A thread started by ``threading`` (a monitor, a pipe reader): its outermost
        frame is threading's bootstrap. The main thread's is a ``<module>`` or a spawn."""
        last = self.frames[-1] if self.frames else None
        return last is not None and last.path.endswith("threading.py") and "bootstrap" in last.func


@dataclass
class FatalSignal:
    """A fault handler dump: the only trace a process killed by a signal leaves."""

    signal: str  # "SIGILL", ...; a fatal error that is not a signal is kept verbatim
    message: str  # "Fatal Python error: Illegal instruction", however the writers interleaved
    line: int  # index in the log of the (first) "Fatal Python error" line
    prefix: str = ""  # the process tag on that line, when vLLM's prefix says who it was
    threads: list[ThreadStack] = field(default_factory=list)
    # Headers merged into this dump: threads of one process that took a signal at once,
    # each writing the fault handler's output into the same stream.
    writers: int = 1

    @property
    def stack(self) -> ThreadStack | None:
        """The thread that took the signal.

        The handler marks it "Current thread" only when that thread held the GIL; a C
        kernel usually runs with the GIL released, so otherwise the main thread with vLLM
        frames is taken, by its own frames rather than by where it was printed (helper
        threads such as tqdm's monitor or vLLM's death-pipe monitor start in threading's
        bootstrap), else the last thread with vLLM frames.
        """
        current = [t for t in self.threads if t.current]
        if current:
            return next((t for t in current if _has_vllm(t)), current[0])
        with_vllm = [t for t in self.threads if _has_vllm(t)]
        if with_vllm:
            main = [t for t in with_vllm if not t.helper]
            return (main or with_vllm)[-1]
        return self.threads[-1] if self.threads else None

    @property
    def process(self) -> str:
        """Who died: the line's process tag when it had one, else a role read from the
        frames, since the handler's raw writes carry no vLLM prefix."""
        return self.prefix or _role(self.threads)

    def innermost_vllm_frame(self) -> Frame | None:
        stack = self.stack
        return next((f for f in stack.frames if f.vllm_relpath), None) if stack else None


def _has_vllm(thread: ThreadStack) -> bool:
    return any(f.vllm_relpath for f in thread.frames)


_WORKER_FILES = ("gpu_worker.py", "cpu_worker.py", "worker_base.py")
# Code that runs where the model runs: a worker (or, with an in-process executor, the
# one process that is both). Read so that a dump cut off right below its kernel frame
# still names the worker.
_MODEL_CODE = ("vllm/model_executor/", "vllm/v1/attention/", "vllm/attention/", "vllm/_custom_ops")
# multiproc_executor's WorkerProc: its main loop and its parent-death monitor thread.
_WORKER_FUNCS = ("worker_main", "worker_busy_loop", "death_pipe_monitor")


def _role(threads: Sequence[ThreadStack]) -> str:
    """Worker or EngineCore, from code only that process runs.

    With an in-process executor one process runs both; the worker frames are where the
    model ran, so they win.
    """
    frames = [(rel, f) for t in threads for f in t.frames if (rel := f.vllm_relpath)]
    if any(
        rel.startswith(("vllm/v1/worker/", *_MODEL_CODE))
        or rel.rsplit("/", 1)[-1] in _WORKER_FILES
        or f.func in _WORKER_FUNCS
        for rel, f in frames
    ):
        return "worker"
    if any(rel == "vllm/v1/engine/core.py" for rel, _ in frames):
        return "EngineCore"
    return "unknown"


@dataclass
class _Dump:
    """A dump being read: its headers' signal names, and the thread ids it has."""

    dump: FatalSignal
    names: list[str] = field(default_factory=list)  # signal names read for its headers
    verbatim: str = ""  # a fatal error that is not a signal ("_enter_buffered_busy: ...")

    @property
    def pending(self) -> bool:
        """Some header's signal name is still to come (written after another's)."""
        return not self.verbatim and len(self.names) < self.dump.writers

    def has(self, thread: str) -> bool:
        return any(t.thread == thread for t in self.dump.threads)

    def finish(self) -> FatalSignal:
        if self.names:
            what, self.dump.signal = self.names[0], FATAL_SIGNALS[self.names[0]]
        else:
            what = self.dump.signal = self.verbatim or "(no name)"
        self.dump.message = f"Fatal Python error: {what}"
        return self.dump


def _structure(text: str) -> int:
    """Where a dump's own structure (a thread header, a frame) starts in a line; its
    length when there is none."""
    found = [m.start() for m in (_THREAD.search(text), _DUMP_FRAME.search(text)) if m]
    return min(found, default=len(text))


def _leading_names(text: str) -> list[str]:
    """The signal names a text starts with (a name cut off by the log's end is lost)."""
    m = _NAME_RUN.match(text)
    return _SIGNAL_NAME.findall(m.group(0)) if m else []


def _names(text: str) -> list[str] | None:
    """The signal names a text is made of (glued or spaced), None if it holds more."""
    return _SIGNAL_NAME.findall(text) if _NAME_RUN.fullmatch(text) else None


class _DumpReader:
    """Fault handler dumps of one log, line by line.

    Shapes, not samples: a line may hold any number of headers (each writer's), the names
    may come on the header line, on lines of their own after blank lines, or glued to the
    end of another line; thread blocks attach by their own structure (a header naming a
    thread id, then its frames), each to the earliest dump of its process still lacking
    that thread, so a second writer's copy never displaces the first's; lines of other
    processes are skipped by their vLLM prefix; a dump cut off anywhere keeps what it had.
    """

    def __init__(self) -> None:
        self.found: list[_Dump] = []
        self.open: dict[str, list[_Dump]] = {}  # process key -> its dumps still being read
        self.stack: dict[str, ThreadStack | None] = {}  # process key -> frames go here
        self.last_key = "main"

    def feed(self, lineno: int, raw: str) -> None:
        proc, text = _clean(raw)
        header = _FATAL.search(text)
        if header:
            self._header(lineno, proc, text, header.start())
            return
        key = self._route(proc)
        if key is None:
            return  # not in a dump, or another process's line interleaved into one
        if text.startswith("Traceback (most recent call last):"):
            del self.open[key]  # the log goes on: a survivor's traceback
            self.stack.pop(key, None)
            return
        self._body(key, text)

    def _route(self, proc: str) -> str | None:
        if proc in self.open:
            return proc
        if proc == "main" and self.open:
            # Raw writes of a process whose header carried its prefix (fd 2 is shared).
            return self.last_key if self.last_key in self.open else next(iter(self.open))
        return None

    def _header(self, lineno: int, proc: str, text: str, start: int) -> None:
        lead, rest = text[:start], text[start:]
        # Mid-line, a prefix belongs to whoever printed the progress bar before it, unless
        # that process is dumping already (the text before is another writer's).
        key = proc if proc != "main" and (not lead.strip() or proc in self.open) else "main"
        if lead.strip() and (names := _names(lead)):
            self._give_names(key, names)  # an earlier header's name, glued in front
        # The same line can go on with this process's dump: a thread header or a frame
        # written right after another writer's header.
        cut = _structure(rest)
        head, tail = rest[:cut], rest[cut:]
        pieces = _FATAL.split(head)[1:]
        names, verbatim = [], ""
        for piece in pieces:
            if found := _leading_names(piece):
                names += found  # what follows a name on this line is another writer's
            elif piece.strip() and not verbatim:
                verbatim = piece.strip()
        dumps = self.open.get(key, [])
        newest = dumps[-1] if dumps else None
        if newest is not None and not newest.dump.threads and not newest.verbatim:
            # Still the headers of one burst: another writer of the same process.
            newest.dump.writers += len(pieces)
            newest.names += names
            newest.verbatim = "" if newest.names else verbatim
        else:
            prefix = key if key != "main" else ""
            dump = _Dump(FatalSignal("", "", lineno, prefix, writers=len(pieces)), names, verbatim)
            self.found.append(dump)
            self.open.setdefault(key, []).append(dump)
            # The thread being printed stays open: only its writer's next thread header
            # ends it, and frames of it may follow another writer's header on this line.
        self.last_key = key
        if tail:
            self._body(key, tail)

    def _give_names(self, key: str, names: list[str]) -> bool:
        """Names written apart from their headers go to the first dump awaiting one."""
        for dump in self.open.get(key, []):
            if dump.pending:
                dump.names += names
                return True
        return False

    def _body(self, key: str, text: str) -> None:
        body = text.strip()
        if not body:
            return  # blank lines separate threads, and interleaved writers add more
        if (names := _names(body)) is not None:
            self._give_names(key, names)
            return
        # A later writer's name glued to the end of this line ("... in _recvAborted").
        end = _NAMES_AT_END.search(body) if any(d.pending for d in self.open[key]) else None
        if end and end.start() > 0 and self._give_names(key, _SIGNAL_NAME.findall(end[0])):
            body = body[: end.start()]
        cut = _structure(body)
        if 0 < cut < len(body) and (names := _names(body[:cut])):
            self._give_names(key, names)  # a name written just before this line's text
        thread = _THREAD.search(body)
        if thread or body == _STACK_ONLY:
            current = thread is None or thread["current"] == "Current thread"
            stack = ThreadStack(thread["id"] if thread else "", current)
            owner = next((d for d in self.open[key] if not d.has(stack.thread)), None)
            if owner is not None:
                owner.dump.threads.append(stack)
            # else: a thread every dump has already: a later writer's copy, read and dropped
            self.stack[key] = stack
            return
        frame = _DUMP_FRAME.search(body)
        into = self.stack.get(key)
        if frame and into is not None:
            into.frames.append(Frame(frame["path"], int(frame["line"]), frame["func"]))
        # Anything else ("Extension modules: ...", "<no Python frame>", another writer's
        # fragments) leaves the thread open: its frames can go on after the interruption.

    def dumps(self) -> list[FatalSignal]:
        return [d.finish() for d in self.found]


def parse_fatal_signals(lines: Iterable[str]) -> list[FatalSignal]:
    """Every fault handler dump in a (multi-process, interleaved) log, in order."""
    reader = _DumpReader()
    for lineno, raw in enumerate(lines):
        reader.feed(lineno, raw)
    return reader.dumps()


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
