"""Turning a launch into a verdict: what happened, why, and whether it was expected.

A vLLM server crash at start is spread over several processes (API server,
EngineCore, workers), each printing its own traceback into one interleaved log,
usually ending with a generic "Engine core initialization failed" from the API
server. The signature that matters is the *root cause*: the first traceback any
process printed, and its innermost frame inside vLLM.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.scenario import Expectation, KnownCrash

# "(EngineCore pid=3689) " possibly nested: "(APIServer pid=1) (Worker pid=2) ".
_PROC_PREFIX = re.compile(r"^((?:\((?P<proc>[A-Za-z_][\w ]*?)\s+pid=(?P<pid>\d+)\)\s*)+)")
# vLLM's logger prefix: "ERROR 11-30 06:50:27 [core.py:123] ".
_LOG_PREFIX = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)?)"
                  r"(?::\s?(?P<msg>.*))?$")


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
        return self.path[idx + 1:] if idx >= 0 else None


@dataclass
class Traceback:
    process: str
    frames: list[Frame] = field(default_factory=list)
    exception: str = ""
    message: str = ""

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
        line = line[m.end():]
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
    for raw in lines:
        proc, text = _clean(raw)
        if text.startswith("Traceback (most recent call last):"):
            if proc not in chained:
                open_tb[proc] = Traceback(process=proc)
            else:
                open_tb[proc] = chained[proc]  # keep filling the chain's root
            continue
        if proc in chained and (text.startswith("During handling of the above")
                                or text.startswith("The above exception was the direct")):
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
class CrashSignature:
    exception: str
    message: str
    frame: str  # "vllm/.../file.py:function", or "" when no vLLM frame was seen
    process: str
    known: int | None = None
    paths: tuple[str, ...] = ()  # every frame's file in the root-cause traceback

    def summary(self) -> str:
        where = f" in {self.frame}" if self.frame else ""
        known = f" (known: #{self.known})" if self.known else ""
        return f"{self.exception}{where}{known}"


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
    """The root-cause signature of a crash, matched against known upstream crashes."""
    tracebacks = parse_tracebacks(log_lines)
    if not tracebacks:
        last_error = next(
            (_clean(ln)[1] for ln in reversed(log_lines) if " ERROR " in ln or "Error" in ln), ""
        )
        return CrashSignature(
            exception=f"no traceback ({describe_exit(returncode)})",
            message=last_error[:200], frame="", process="",
        )
    root = tracebacks[0]
    frame = root.innermost_vllm_frame()
    frame_txt = f"{frame.vllm_relpath}:{frame.func}" if frame else ""
    # A bare ``assert`` has no message; the asserting line is the best one there is.
    message = root.message or (root.frames[-1].source if root.frames else "")
    sig = CrashSignature(root.exception, message[:300], frame_txt, root.process,
                         paths=tuple(f.path for f in root.frames))
    for kc in known:
        funcs = {f.func for f in root.frames}
        if root.exception == kc.exception and funcs.intersection(kc.functions):
            sig.known = kc.issue
            break
    return sig


@dataclass
class RowContext:
    """What expectation rules can match on."""

    variant: str
    vllm_version: str
    patch: str  # "none" when no patch
    connector: bool
    chunked_local: bool


def expectation_for(ctx: RowContext, rules: Sequence[Expectation]) -> Expectation | None:
    """First matching rule wins; None when no rule matches (a scenario error)."""
    for rule in rules:
        if rule.variant is not None and rule.variant != ctx.variant:
            continue
        if rule.patch is not None and rule.patch != ctx.patch:
            continue
        if rule.connector is not None and rule.connector != ctx.connector:
            continue
        if rule.chunked_local is not None and rule.chunked_local != ctx.chunked_local:
            continue
        if rule.vllm is not None and not version_matches(ctx.vllm_version, rule.vllm):
            continue
        return rule
    return None


def version_matches(version: str, specifier: str) -> bool:
    """Whether a vLLM version satisfies a PEP 440 specifier (dev builds included)."""
    try:
        return Version(version) in SpecifierSet(specifier, prereleases=True)
    except InvalidVersion:
        return False


def judge(
    outcome: str, known: int | None, answered: bool | None, rule: Expectation | None
) -> tuple[bool, str]:
    """Whether an outcome matches its rule, and a one-line reason when it does not."""
    if rule is None:
        return False, "no expectation rule matches this row"
    if outcome != rule.outcome:
        return False, f"expected {rule.outcome}, got {outcome}"
    if rule.known is not None and known != rule.known:
        got = f"#{known}" if known else "an unknown signature"
        return False, f"expected the #{rule.known} signature, got {got}"
    if outcome == "started" and answered is False:
        return False, "started but did not answer a completion"
    return True, ""
