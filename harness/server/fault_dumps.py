"""Python's fault handler dumps, as several writers leave them in one log.

A process killed by a signal (SIGILL in a CPU kernel, SIGSEGV, ...) prints no Python
traceback: with ``PYTHONFAULTHANDLER=1`` it leaves a "Fatal Python error" dump of its
thread stacks on raw fd 2, with no vLLM prefix. ``Modules/faulthandler.c`` writes every
piece of it as its own ``write()``: "Fatal Python error: ", the signal's name, "\\n\\n",
then per thread "Thread 0x" (or "Current thread 0x"), the id, " (most recent call
first):\\n", and per frame "  File ", '"', the path, '"', ", line ", the number, " in ",
the function, "\\n"; last "\\nExtension modules: ", each module and ", ", " (total: ",
the count, ")", "\\n" (seen with strace on CPython 3.11).

When several threads take the signal at once (vLLM's CPU attention runs on every core of
an OpenMP pool) each of them runs the handler. The thread stacks are written once (the
traceback dump refuses re-entry), but every writer writes its header and its modules
list, and those pieces land *between any two pieces* of the dump: inside a thread's
header, inside a frame, with newlines of their own. Which writer dumps the stacks is a
race too: when it is a thread Python does not know (an OpenMP worker), no thread is
marked "Current thread".

So a dump is read as a stream, not as lines: one process's text from its first header
on, with the other writers' pieces taken out by their vocabulary (headers, signal
names, module names, the modules list's punctuation) and the stack structure read from
what is left with the dump's own fixed pieces as anchors. Names of functions and files
are single writes, so they are never torn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harness.server.log_lines import UNTAGGED, Frame, split_prefix

# Python's fault handler names the signal in words (Modules/faulthandler.c).
FATAL_SIGNALS = {
    "Illegal instruction": "SIGILL",
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Aborted": "SIGABRT",
}
HEADER = "Fatal Python error: "
# Longest first, so "Floating-point exception" is not read as a shorter name.
_SIGNAL_NAME = re.compile("|".join(map(re.escape, sorted(FATAL_SIGNALS, key=len, reverse=True))))
_MODULES = "Extension modules: "
# A list's count. A piece that starts a line can have lost its leading space to the
# vLLM prefix in front of it (the prefix takes the blanks after it).
_MODULE_LIST_END = re.compile(r" ?\(total: (?:\d+\))?")
# A module's dotted name; not a file's (a path's last part, "x.py"), which a list torn
# open by the stacks it landed in also holds.
_DOTTED = re.compile(r"(?<![/\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?<!\.py)(?![\w.])")
# What other writers leave between this dump's pieces once their words are taken out
# (newlines, a modules count's digits and parenthesis, a separator's comma), and in a
# log cut off before their lists were whole, module names too: any text up to the next
# fixed piece of the dump, but no quote (a path's) and no digit before a number. A
# function's name is the one piece a gap must not reach into: only the leftovers there.
_GAP = r'[^"]*?'
_BEFORE_NUMBER = r'[^"\d]*?'
_BEFORE_NAME = r"[\d\s),]*"
_TOKEN = re.compile(
    rf"(?P<which>Current thread|Thread) 0x{_BEFORE_NUMBER}(?P<id>[0-9a-fA-F]+){_GAP}"
    r" ?\(most recent call first\):"
    r"|(?P<stack>Stack \(most recent call first\):)"
    # A path is one write starting at "/" (or "<string>"): what comes before it is
    # another writer's (a module's name, taken out or not).
    rf'|File {_GAP}"[^"/<]*(?P<path>[/<][^"]*?)"{_GAP}line {_BEFORE_NUMBER}(?P<line>\d+)'
    # A name glued to a module's that could not be taken out is no function's name. A
    # frame whose name never came (the process died mid-line, another writer's log went
    # on from there) keeps its path and line: on an AMX host the dying worker's last,
    # innermost frame was cut so, and with it the only frame inside vLLM.
    rf"(?:{_GAP}(?: |(?m:^))in {_BEFORE_NAME}(?P<func>[A-Za-z_<][\w<>]*)(?![\w.]))?"
)
TRACEBACK = "Traceback (most recent call last):"


@dataclass
class ThreadStack:
    thread: str  # "0x00007f6c87a0ab80"; "" for frames whose thread header was lost
    current: bool  # marked "Current thread" by the fault handler
    frames: list[Frame] = field(default_factory=list)  # innermost FIRST, as printed

    @property
    def helper(self) -> bool:
        """A thread started by ``threading`` (a monitor, a pipe reader): its outermost
        frame is threading's bootstrap (the main thread's is a ``<module>`` or a spawn),
        or, for a stack cut off before its outermost frames, it sits in a blocking wait
        or a known monitor loop: a thread blocked there takes no synchronous signal."""
        if not self.frames:
            return False
        if _bootstrap(self.frames[-1]):
            return True
        return any(_waiting(f) for f in self.frames[:4])

    def innermost_vllm_frame(self) -> Frame | None:
        return next((f for f in self.frames if f.vllm_relpath), None)

    def calls(self, functions: Iterable[str]) -> bool:
        wanted = set(functions)
        return any(f.func in wanted for f in self.frames)


# Where a thread waits: a pipe or socket read, a condition, a selector, a queue, and the
# monitor loops vLLM and tqdm run in their own threads.
_WAITS = {
    "connection.py": ("_recv", "_recv_bytes", "recv", "poll", "_poll", "wait"),
    "threading.py": ("wait",),
    "selectors.py": ("select",),
    "queue.py": ("get",),
}
_MONITORS = ("death_pipe_monitor", "monitor_parent_death")


def _waiting(frame: Frame) -> bool:
    name = frame.path.rsplit("/", 1)[-1]
    return frame.func in _WAITS.get(name, ()) or frame.func in _MONITORS


def _bootstrap(frame: Frame) -> bool:
    return frame.path.endswith("threading.py") and "bootstrap" in frame.func


def _outermost(frame: Frame) -> bool:
    """A frame no other frame of its thread is printed after: threading's bootstrap (a
    ``<module>`` is not one: an import runs one inside another's)."""
    return frame.func == "_bootstrap" and frame.path.endswith("threading.py")


def _has_vllm(thread: ThreadStack) -> bool:
    return any(f.vllm_relpath for f in thread.frames)


_WORKER_FILES = ("gpu_worker.py", "cpu_worker.py", "worker_base.py")
# Code that runs where the model runs: a worker (or, with an in-process executor, the
# one process that is both). Read so that a dump cut off right below its kernel frame
# still names the worker.
_MODEL_CODE = ("vllm/model_executor/", "vllm/v1/attention/", "vllm/attention/", "vllm/_custom_ops")
# multiproc_executor's WorkerProc: its main loop and its parent-death monitor thread.
_WORKER_FUNCS = ("worker_main", "worker_busy_loop", "death_pipe_monitor")


def _runs_model(thread: ThreadStack) -> bool:
    """A frame of the model code read whole (its function named): a frame cut before
    its name says where the process was, not that the dump reached the kernel."""
    return any(
        f.func and (rel := f.vllm_relpath) and rel.startswith(_MODEL_CODE) for f in thread.frames
    )


@dataclass
class FatalSignal:
    """A fault handler dump: the only trace a process killed by a signal leaves."""

    signal: str  # "SIGILL", ...; a fatal error that is not a signal is kept verbatim
    message: str  # "Fatal Python error: Illegal instruction", however the writers interleaved
    line: int  # index in the log of the (first) "Fatal Python error" line
    prefix: str = ""  # the process tag on that line, when vLLM's prefix says who it was
    threads: list[ThreadStack] = field(default_factory=list)
    # Headers in this dump: threads of one process that took a signal at once, each
    # writing the fault handler's output into the same stream.
    writers: int = 1
    text: str = field(default="", repr=False)  # the process's text from its first header

    @property
    def stack(self) -> ThreadStack | None:
        """The thread that took the signal.

        The handler marks it "Current thread" only when a thread Python knows took the
        signal and won the race to dump; otherwise the thread that ran the model is
        taken (a kernel runs in the main thread of a worker, whatever OpenMP thread
        faulted), by its own frames rather than by where it was printed, never a helper
        (``ThreadStack.helper``: tqdm's monitor, vLLM's death-pipe monitor). Ties go to
        the last printed (the main thread is printed last).
        """
        current = [t for t in self.threads if t.current]
        if current:
            return next((t for t in current if _has_vllm(t)), current[0])
        if not self.threads:
            return None
        ranked = enumerate(self.threads)
        _, best = max(ranked, key=lambda it: (_rank(it[1]), it[0]))
        # Only helpers read, none marked: the faulting thread's stack was lost (a helper
        # blocked in a pipe or a wait takes no synchronous signal), so there is none.
        return None if best.helper else best

    @property
    def model_read(self) -> bool:
        """Whether any thread read has a frame of the code that runs the model; a dump
        cut off before its kernel's frames has none (the crash is then named by what
        the process reported, ``KnownCrash.kernels``)."""
        return any(_runs_model(t) for t in self.threads)

    def thread_calling(self, functions: Sequence[str]) -> ThreadStack | None:
        """The thread with one of ``functions`` on its stack, the marked one first."""
        calling = [t for t in self.threads if t.calls(functions)]
        return next((t for t in calling if t.current), calling[-1] if calling else None)

    def mentions(self, function: str) -> bool:
        """Whether the dump names ``function`` anywhere, however torn its frame was."""
        return function in self.text

    @property
    def process(self) -> str:
        """Who died: the line's process tag when it had one, else a role read from the
        frames (from the paths the dump names when no frame was read whole), since the
        handler's raw writes carry no vLLM prefix."""
        return self.prefix or _role(self.threads) or _role_named(self.text) or "unknown"

    def innermost_vllm_frame(self) -> Frame | None:
        stack = self.stack
        return stack.innermost_vllm_frame() if stack else None


def _rank(thread: ThreadStack) -> int:
    """How likely an unmarked thread is the one whose call faulted: the one running the
    model, then the main thread (by its vLLM frames, then without: a cut can leave only
    its innermost frames), then a helper (blocked in a pipe or a wait)."""
    if _runs_model(thread):
        return 4
    if not thread.helper:
        return 3 if _has_vllm(thread) else 2
    return 1 if _has_vllm(thread) else 0


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
    return ""


def _role_named(text: str) -> str:
    """``_role`` from the vLLM paths a dump's text names, frames whole or not."""
    named = [ThreadStack("", False, [Frame(p, 0, "") for p in re.findall(r'/vllm/[^"\s]+', text)])]
    return _role(named)


def _without_other_writers(text: str) -> str:
    """The dump's text with every writer's header, names and modules list taken out.

    What the lists leave (newlines, a count, a comma) is what the gaps of ``_TOKEN``
    skip. A module's name is dotted, unlike a function's, so taking one out never cuts
    into a frame.

    A list's word can be glued to anything ("_wrapped_call_implnumpy._core._x",
    "torch._Cregex._regex", a name to itself when two writers run in step), but every
    writer lists every module: a real name is written at least once per list, a glued
    word once. So the dotted words written as often as there are lists are taken out,
    and of a word written less often its longest such start and end, again in what that
    leaves, until none is left.
    """
    out = _SIGNAL_NAME.sub("", text.replace(HEADER, ""))
    out = _MODULE_LIST_END.sub("", out.replace(_MODULES, ""))
    lists = text.count(_MODULES)
    if lists < 2:
        return re.sub(r", (?!line )", "", out)  # one writer: no list inside the stacks
    taken: set[str] = set()
    while names := {n for w in set(_DOTTED.findall(out)) for n in _listed(w, text, lists)} - taken:
        taken |= names
        out = re.sub("|".join(map(re.escape, sorted(names, key=len, reverse=True))), "", out)
    return re.sub(r", (?!line )", "", out)


def _listed(word: str, text: str, lists: int) -> list[str]:
    """The module names ``word`` is, starts or ends with (see ``_without_other_writers``)."""

    def listed(part: str) -> bool:
        return _DOTTED.fullmatch(part) is not None and text.count(part) >= lists

    if listed(word):
        return [word]
    starts = (word[:k] for k in range(len(word) - 1, 2, -1))
    ends = (word[k:] for k in range(1, len(word) - 2))
    return [p for p in (next(filter(listed, starts), ""), next(filter(listed, ends), "")) if p]


def _path(raw: str) -> str:
    """A frame's path without a module name another writer glued after it
    ("/v/vllm/_custom_ops.pytorch._C"): a Python file's name ends at ".py"."""
    path = raw.strip()
    head, dot, rest = path.rpartition(".py")
    return head + dot if dot and rest and "/" not in rest and "." in rest else path


def _threads(text: str) -> list[ThreadStack]:
    """The thread stacks of one dump, in the order printed.

    A thread printed again (a second writer that dumped after the first had finished)
    is read and dropped unless the first copy lost all its frames; frames printed after
    an outermost frame with no thread header between (a header lost to a cut) start a
    thread of their own, so one thread's frames never join another's.
    """
    threads: list[ThreadStack] = []
    into: ThreadStack | None = None
    for m in _TOKEN.finditer(_without_other_writers(text)):
        if m["which"] or m["stack"]:
            tid = f"0x{m['id']}" if m["id"] else ""
            seen = next((t for t in threads if tid and t.thread == tid), None)
            if seen is not None:
                into = seen if not seen.frames else None
                continue
            into = ThreadStack(tid, m["stack"] is not None or m["which"] == "Current thread")
            threads.append(into)
            continue
        frame = Frame(_path(m["path"]), int(m["line"]), m["func"] or "")
        if into is None:
            if threads:
                continue  # a dropped copy's frame
            into = ThreadStack("", False)
            threads.append(into)
        elif into.frames and _outermost(into.frames[-1]):
            into = ThreadStack("", False)
            threads.append(into)
        into.frames.append(frame)
    return threads


@dataclass
class _Burst:
    """One process's fault handler output being read: its text from its first header."""

    line: int
    prefix: str
    parts: list[str] = field(default_factory=list)

    def signal(self) -> FatalSignal:
        text = "\n".join(self.parts)
        names = _SIGNAL_NAME.findall(text)
        if names:
            what, signal = names[0], FATAL_SIGNALS[names[0]]
        else:
            # A fatal error that is not a signal ("_enter_buffered_busy: ..."): as written.
            first = text.split(HEADER, 2)[1] if HEADER in text else ""
            what = signal = first.split("\n", 1)[0].strip() or "(no name)"
        return FatalSignal(
            signal=signal,
            message=f"{HEADER}{what}",
            line=self.line,
            prefix=self.prefix,
            threads=_threads(text),
            writers=max(1, text.count(HEADER)),
            text=text,
        )


class _DumpReader:
    """Fault handler dumps of one log, line by line, one burst per process.

    Lines of other processes are skipped by their vLLM prefix; untagged lines (raw
    writes on a shared fd 2) go to the burst of the process whose header came last; a
    survivor's traceback ends a process's burst; a burst cut off anywhere keeps what it
    had.
    """

    def __init__(self) -> None:
        self.found: list[_Burst] = []
        self.open: dict[str, _Burst] = {}  # process key -> its burst being read
        self.last_key = UNTAGGED

    def feed(self, lineno: int, raw: str) -> None:
        proc, text = split_prefix(raw)
        header = text.find(HEADER)
        if header >= 0:
            lead = text[:header]
            # Mid-line, a prefix belongs to whoever printed the progress bar before it,
            # unless that process is dumping already (the text before is another writer's).
            key = proc if proc != UNTAGGED and (not lead.strip() or proc in self.open) else UNTAGGED
            burst = self.open.get(key)
            if burst is None:
                burst = _Burst(lineno, key if key != UNTAGGED else "")
                self.found.append(burst)
                self.open[key] = burst
                text = text[header:]  # what came before is not this dump's
            burst.parts.append(text)
            self.last_key = key
            return
        routed = self._route(proc)
        if routed is None:
            return  # not in a dump, or another process's line interleaved into one
        if text.startswith(TRACEBACK):
            del self.open[routed]  # the log goes on: a survivor's traceback
            return
        self.open[routed].parts.append(text)

    def _route(self, proc: str) -> str | None:
        if proc in self.open:
            return proc
        if proc == UNTAGGED and self.open:
            # Raw writes of a process whose header carried its prefix (fd 2 is shared).
            return self.last_key if self.last_key in self.open else next(iter(self.open))
        return None

    def dumps(self) -> list[FatalSignal]:
        return [b.signal() for b in self.found]


def parse_fatal_signals(lines: Iterable[str]) -> list[FatalSignal]:
    """Every fault handler dump in a (multi-process, interleaved) log, in order."""
    reader = _DumpReader()
    for lineno, raw in enumerate(lines):
        reader.feed(lineno, raw)
    return reader.dumps()
