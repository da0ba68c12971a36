"""Fault handler dumps as real logs shape them: recorded on an AMX host, and generated.

When two threads of a worker take SIGILL at once (vLLM's CPU attention runs on every
core of an OpenMP pool), each enters Python's fault handler. ``Modules/faulthandler.c``
writes every piece of its output as its own ``write()`` to fd 2 (seen with strace on
CPython 3.11: "Fatal Python error: ", the name, "\\n\\n"; "Current thread 0x", the id,
" (most recent call first):\\n"; "  File ", '"', the path, '"', ", line ", the number,
" in ", the function, "\\n"; "\\nExtension modules: ", each module and ", ", " (total: ",
the count, ")", "\\n"). The stacks are written once (the traceback dump refuses re-entry
while one runs, and a writer that comes after it has finished writes them again), each
writer writes its header and its modules list, and the thread that dumps may be one
Python does not know (an OpenMP worker), which marks no thread "Current".

The recorded logs in ``tests/fixtures/amx-host-2/`` (from ``../shared/evidence/amx-host-2/``,
as the harness wrote them) show two of the shapes that makes. The generators below make
all of them from that write model: any number of writers' pieces between any two pieces
of the dump, the thread blocks in any order with extra helper threads, the dump marked
or not, a second copy of the stacks, other processes' lines in between, vLLM's process
prefixes, and the log cut off anywhere. Each must read as the clean control log reads;
a log cut off may lose the frame, never the verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.scenario.bugs import load_bug
from harness.scenario.crash_repro import load_crash_repro
from harness.server.crash_signatures import (
    CrashSignature,
    crash_signature,
    known_label,
)
from harness.server.fault_dumps import parse_fatal_signals

ROOT = Path(__file__).resolve().parents[3]
AMX2 = ROOT / "tests" / "fixtures" / "amx-host-2"
CONTROL = AMX2 / "crash-repro-small-chunk-current-no-amx-connector-off.server.log"
# Line 130: "Fatal Python error: Fatal Python error: Illegal instruction", a blank line,
# then "Illegal instruction" on a line of its own.
SPLIT_NAME = AMX2 / "crash-repro-small-chunk-current-no-amx-connector-on.server.log"
# Line 130: "Fatal Python error: Fatal Python error: Illegal instructionIllegal instruction".
GLUED_NAMES = AMX2 / "test-run-small-chunk-current-no-amx-connector-on.server.log"
RECORDED = [CONTROL, SPLIT_NAME, GLUED_NAMES]
# The control's dump cut inside the kernel's frame, after its line number, with the
# engine core's next log line glued on: the shape `make test` met on this project's CI
# host (2026-12-06), where the row then read only "SIGILL (worker)".
CUT_MID_FRAME = AMX2 / "cut-mid-frame-small-chunk-current-no-amx-connector-on.server.log"

# The known crashes as the amx-sigill bug entry's trigger scenario lists them.
BUG = load_bug(ROOT / "scenarios" / "bugs" / "amx-sigill.toml")
assert BUG.trigger.kind == "check"
KNOWN = load_crash_repro(BUG.resolve(BUG.trigger.scenario)).known_crashes
CPU_ATTENTION = "vllm/_custom_ops.py:cpu_attention_with_kv_cache"
EXPECTED = f"SIGILL in {CPU_ATTENTION} (worker) (known: amx-sigill)"

HEADER, NAME = "Fatal Python error: ", "Illegal instruction"
THREAD_LINE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
FRAME_LINE = re.compile(r'^(  File ")([^"]+)(", line )(\d+)( in )(\S+)$')


def lines(path: Path) -> list[str]:
    # As crash_repro reads a server log.
    return path.read_text(errors="replace").splitlines()


def facts(sig: CrashSignature) -> tuple[str, str, str, str, str, str]:
    """Everything a verdict shows of a signature, except the files of its frames."""
    return (sig.exception, sig.message, sig.frame, sig.process, known_label(sig.known), sig.kind)


CONTROL_FACTS = facts(crash_signature(lines(CONTROL), None, KNOWN))


# --- recorded ---------------------------------------------------------------------------------


def test_the_control_reads_as_the_bug_entry_says():
    sig = crash_signature(lines(CONTROL), None, KNOWN)
    assert sig.summary() == EXPECTED
    assert sig.message == "Fatal Python error: Illegal instruction"
    assert known_label(sig.known) == known_label(BUG.symptom.known)


@pytest.mark.parametrize("log", [SPLIT_NAME, GLUED_NAMES], ids=["split-name", "glued-names"])
def test_recorded_interleaved_dumps_classify_as_the_control(log):
    text = lines(log)
    header = next(ln for ln in text if HEADER in ln)
    assert header.count(HEADER) == 2  # the shape this test is about
    sig = crash_signature(text, None, KNOWN)
    assert sig.summary() == EXPECTED
    assert facts(sig) == CONTROL_FACTS


@pytest.mark.parametrize(
    ("log", "after"),
    # A frame the recorded log has whole only after the other writer's modules list.
    [(SPLIT_NAME, ("gpu_model_runner.py", 3645)), (GLUED_NAMES, ("worker_base.py", 370))],
    ids=["split-name", "glued-names"],
)
def test_two_writers_make_one_dump_with_the_recorded_threads(log, after):
    (dump,) = parse_fatal_signals(lines(log))
    assert (dump.signal, dump.writers) == ("SIGILL", 2)
    # vLLM's death-pipe monitor first, then the thread that ran the kernel.
    monitor, current = dump.threads
    assert not monitor.current and monitor.frames[3].func == "death_pipe_monitor"
    assert dump.stack is current and current.current
    funcs = [f.func for f in current.frames[:3]]
    assert funcs == ["__call__", "cpu_attention_with_kv_cache", "forward"]
    # The other writer's "Extension modules" list landed inside this stack; the frames
    # after it are still read where they are whole.
    assert any((f.path.rsplit("/", 1)[-1], f.line) == after for f in current.frames)


# --- shapes, one at a time --------------------------------------------------------------------


def dump_text(log: Path = CONTROL) -> tuple[list[str], str, list[list[str]], str, list[str]]:
    """A recorded single-writer dump cut into (lines before, header, thread blocks,
    extension modules line, lines after), by the fault handler's layout alone."""
    text = lines(log)
    h = next(i for i, ln in enumerate(text) if HEADER in ln)
    i, blocks = h + 1, []
    while True:
        while i < len(text) and not text[i].strip():
            i += 1
        if i >= len(text) or not THREAD_LINE.match(text[i]):
            break
        j = i
        while j < len(text) and text[j].strip():
            j += 1
        blocks.append(text[i:j])
        i = j
    assert text[i].startswith("Extension modules: ")
    return text[:h], text[h], blocks, text[i], text[i + 1 :]


PRE, _, BLOCKS, EXTENSIONS, POST = dump_text()
CURRENT = next(b for b in BLOCKS if b[0].startswith("Current thread"))
INNERMOST = next(ln for ln in CURRENT if "/vllm/" in ln)  # the frame the signature names
assert CPU_ATTENTION.rsplit(":", 1)[1] in INNERMOST


def with_header(*header: str) -> list[str]:
    out = [*PRE, *header]
    for block in BLOCKS:
        out += [*block, ""]
    return [*out, EXTENSIONS, *POST]


TWO = HEADER * 2
SHAPES = {
    "clean": [HEADER + NAME, ""],
    "name on its own line": [TWO + NAME, "", NAME, ""],
    "names glued": [TWO + NAME + NAME, "", "", ""],
    "header glued after a name": [HEADER + NAME + HEADER + NAME, "", "", ""],
    "headers one after the other": [HEADER + NAME, "", HEADER + NAME, ""],
    "three writers": [HEADER * 3 + NAME, "", NAME + NAME, "", ""],
    "names after several blanks": [HEADER * 3, "", "", NAME, "", "", NAME + " " + NAME],
    "header after a progress bar": ["Processed prompts:   0%|   | 0/1\r" + TWO + NAME, "", NAME],
}


@pytest.mark.parametrize("header", SHAPES.values(), ids=SHAPES.keys())
def test_header_shapes(header):
    log = with_header(*header)
    (dump,) = parse_fatal_signals(log)
    assert dump.signal == "SIGILL"
    assert dump.writers == "\n".join(header).count(HEADER)
    assert [t.thread for t in dump.threads] == [THREAD_LINE.match(b[0])[2] for b in BLOCKS]
    assert facts(crash_signature(log, None, KNOWN)) == CONTROL_FACTS


def test_the_dump_goes_on_past_another_writers_extension_modules():
    log = with_header(TWO + NAME, "", NAME, "")
    at = log.index(INNERMOST) + 1
    log.insert(at, "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)")
    (dump,) = parse_fatal_signals(log)
    assert len(dump.stack.frames) == len(CURRENT) - 1  # every frame, the insertion skipped


def test_a_header_cut_off_before_its_name_still_finds_it_later():
    log = with_header(TWO, "", NAME + NAME, "")
    (dump,) = parse_fatal_signals(log)
    assert (dump.signal, dump.writers, dump.message) == (
        "SIGILL",
        2,
        "Fatal Python error: Illegal instruction",
    )


def test_a_dump_cut_off_right_after_its_header_is_still_a_signal():
    (dump,) = parse_fatal_signals([*PRE, TWO + NAME])
    assert (dump.signal, dump.threads) == ("SIGILL", [])


# --- generated --------------------------------------------------------------------------------

HELPER = [
    '  File "/usr/lib/python3.11/threading.py", line 324 in wait',
    '  File "/venv/site-packages/tqdm/_monitor.py", line 60 in run',
    '  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner',
    '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap',
]
MODULES = ["numpy._core._multiarray_umath", "torch._C", "regex._regex", "zmq.backend.cython._zmq"]
UNRELATED = [
    "(APIServer pid=18448) INFO 12-01 11:32:03 [launcher.py:195] Route: /ping, Methods: GET",
    "(APIServer pid=18448) ERROR 12-01 11:32:03 [serving.py:1] Error in preprocessing prompt",
    "(EngineCore_DP0 pid=18485) ERROR 12-01 11:32:03 [multiproc_executor.py:315] Worker proc "
    "VllmWorker-0 died unexpectedly (exit code: None), shutting down executor.",
    "(EngineCore_DP0 pid=18485) ERROR 12-01 11:32:03 [core.py:1512] Traceback (most recent call "
    "last):",
    '(EngineCore_DP0 pid=18485) ERROR 12-01 11:32:03 [core.py:1512]   File "/venv/site-packages'
    '/vllm/v1/engine/core.py", line 1496, in run_engine_core',
    "(Worker_TP1 pid=18490) INFO 12-01 11:32:03 [gpu_worker.py:1] still serving",
]
# vLLM's prefixes, when a process's fd 2 went through them: the innermost names who wrote.
PREFIXES = {
    "": "worker",
    "(Worker pid=4242) ": "Worker pid=4242",
    "(Worker_TP0 pid=4242) ": "Worker_TP0 pid=4242",
    "(APIServer pid=18448) (EngineCore_DP0 pid=18485) ": "EngineCore_DP0 pid=18485",
}


def frame_pieces(line: str) -> list[str]:
    """A frame as the handler writes it: path, line number and function apart."""
    m = FRAME_LINE.match(line)
    return [*m.groups(), "\n"] if m else [line, "\n"]


def extension_pieces(modules: list[str]) -> list[str]:
    out = ["\nExtension modules: "]
    for i, module in enumerate(modules):
        out += [", "] * bool(i) + [module]
    return [*out, f" (total: {len(modules)})", "\n"]


@st.composite
def thread_blocks(draw: st.DrawFn) -> list[list[str]]:
    """The recorded threads plus helper threads, in any order."""
    extra = draw(st.integers(0, 3))
    blocks = [*BLOCKS] + [
        [f"Thread 0x00007f68ba7d{i:04x} (most recent call first):", *HELPER] for i in range(extra)
    ]
    return draw(st.permutations(blocks))


@st.composite
def interleaved_dump(draw: st.DrawFn) -> str:
    """One worker's dump as ``writers`` threads write it at once (see the module doc)."""
    writers = draw(st.integers(1, 4))
    first = [HEADER, NAME, "\n\n"]  # the thread that dumps the stacks
    named = False  # the innermost vLLM frame's line is written
    for n, block in enumerate(draw(thread_blocks())):
        first += ["\n"] * bool(n)
        for line in block:
            if named:
                first += frame_pieces(line)  # below the named frame: torn apart at will
            else:
                first.append(line + "\n")  # others write only between these lines
                named = line == INNERMOST
    first += extension_pieces(MODULES)
    others = {
        w: [HEADER, NAME, "\n\n", *extension_pieces(draw(st.permutations(MODULES)))]
        for w in range(1, writers)
    }
    # The other writers' pieces in one order (each writer's own order kept), each put in
    # after some piece of the first writer's.
    order = draw(st.permutations([w for w, pieces in others.items() for _ in pieces]))
    gaps = sorted(
        draw(st.lists(st.integers(0, len(first)), min_size=len(order), max_size=len(order)))
    )
    after: dict[int, list[str]] = {}
    taken = dict.fromkeys(others, 0)
    for w, gap in zip(order, gaps, strict=True):
        after.setdefault(gap, []).append(others[w][taken[w]])
        taken[w] += 1
    out = after.get(0, [])
    for i, piece in enumerate(first, 1):
        out += [piece, *after.get(i, [])]
    return "".join(out)


def crash_log(dump: str, prefix: str, unrelated: list[tuple[int, int]], cut: int | None) -> str:
    """A generated dump inside the recorded log: maybe prefixed, other processes' lines
    put in after its first line (``unrelated``: (place, which)), maybe cut off ``cut``
    characters after the named frame."""
    body = [prefix + ln for ln in dump.split("\n")] + POST
    tag = prefix.rsplit("(", 1)[-1].split(" ")[0]
    others = [ln for ln in UNRELATED if not tag or f"({tag} " not in ln]
    for place, which in unrelated:
        body.insert(1 + place % len(body), others[which % len(others)])
    text = "\n".join([*PRE, *body])
    if cut is not None:
        start = text.rindex(INNERMOST) + len(INNERMOST)
        text = text[: start + cut % (len(text) - start + 1)]
    return text


SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(
    interleaved_dump(),
    st.sampled_from(sorted(PREFIXES)),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10)), max_size=6),
    st.none() | st.integers(0, 100_000),
)
def test_every_generated_shape_gives_the_recorded_signature(dump, prefix, unrelated, cut):
    text = crash_log(dump, prefix, unrelated, cut)
    sig = crash_signature(text.splitlines(), None, KNOWN)
    assert facts(sig) == (*CONTROL_FACTS[:3], PREFIXES[prefix], *CONTROL_FACTS[4:])
    if not prefix:
        assert sig.summary() == EXPECTED


@SETTINGS
@given(interleaved_dump(), st.data())
def test_a_dump_cut_off_anywhere_after_its_first_name_is_a_sigill(dump, data):
    """Never an exception, whatever the cut; once a name is written, the signal."""
    cut = data.draw(st.integers(dump.index(NAME) + len(NAME), len(dump)))
    dumps = parse_fatal_signals([*PRE, *dump[:cut].splitlines()])
    assert dumps and dumps[0].signal == "SIGILL"


@SETTINGS
@given(st.data())
def test_two_processes_dumping_at_once_keep_their_own_threads(data):
    """Two workers (TP 2) both dying, each line tagged by vLLM with its process."""
    ids = {"Worker_TP0 pid=4242": "0x00007f6", "Worker_TP1 pid=4243": "0x00007f7"}
    streams = []
    for tag, thread_ids in ids.items():
        dump = data.draw(interleaved_dump()).replace("0x00007f6", thread_ids)
        streams.append([f"({tag}) {ln}" for ln in dump.split("\n")])
    order = data.draw(st.permutations([n for n, s in enumerate(streams) for _ in s]))
    merged = [streams[n].pop(0) for n in order]
    log = [*PRE, *merged, *POST]
    dumps = parse_fatal_signals(log)
    assert {d.prefix for d in dumps} == set(ids)
    for tag, thread_ids in ids.items():
        first = next(d for d in dumps if d.prefix == tag)
        assert first.signal == "SIGILL"
        assert len(first.threads) >= len(BLOCKS)
        assert all(t.thread.startswith(thread_ids) for t in first.threads)
        frame = first.innermost_vllm_frame()
        assert frame is not None and f"{frame.vllm_relpath}:{frame.func}" == CPU_ATTENTION
    sig = crash_signature(log, None, KNOWN)
    assert (sig.process, sig.frame) == (dumps[0].prefix, CPU_ATTENTION)


# --- generated from the write model, torn anywhere ------------------------------------------

FUNCTION = CPU_ATTENTION.rsplit(":", 1)[1]
MODEL_CODE = ("vllm/_custom_ops.py:", "vllm/v1/attention/", "vllm/model_executor/")


def thread_pieces(blocks: list[list[str]], marked: bool) -> list[str]:
    """Thread blocks as the handler writes them, piece by piece; ``marked``: whether the
    thread that dumps is one Python knows (else no thread reads "Current")."""
    out: list[str] = []
    for n, block in enumerate(blocks):
        which, tid = THREAD_LINE.match(block[0]).groups()
        which = which if marked else "Thread"
        out += ["\n"] * bool(n) + [f"{which} 0x", tid[2:], " (most recent call first):\n"]
        for line in block[1:]:
            out += frame_pieces(line)
    return out


def scatter(draw: st.DrawFn, base: list[str], streams: list[list[str]]) -> list[str]:
    """``base`` with every stream's pieces put in between any two of its pieces, each
    stream in its own order."""
    order = draw(st.permutations([w for w, pieces in enumerate(streams) for _ in pieces]))
    gaps = sorted(
        draw(st.lists(st.integers(0, len(base)), min_size=len(order), max_size=len(order)))
    )
    after: dict[int, list[str]] = {}
    taken = [0] * len(streams)
    for w, gap in zip(order, gaps, strict=True):
        after.setdefault(gap, []).append(streams[w][taken[w]])
        taken[w] += 1
    out = list(after.get(0, []))
    for i, piece in enumerate(base, 1):
        out += [piece, *after.get(i, [])]
    return out


@st.composite
def torn_pieces(draw: st.DrawFn) -> list[str]:
    """One worker's output when 2-4 of its threads take SIGILL at once, write by write:
    the first writer's stacks, the others' pieces anywhere in them; maybe a late writer
    that dumps the stacks again once the first has finished them."""
    blocks = draw(thread_blocks())
    marked = draw(st.booleans())
    stacks = [HEADER, NAME, "\n\n", *thread_pieces(blocks, marked)]
    modules = extension_pieces(MODULES)
    others = [
        [HEADER, NAME, "\n\n", *extension_pieces(draw(st.permutations(MODULES)))]
        for _ in range(draw(st.integers(1, 3)))
    ]
    # Where each other writer is when the first finishes its stacks.
    cuts = [draw(st.integers(0, len(o))) for o in others]
    late: list[list[str]] = []
    if draw(st.booleans()):
        late = [[HEADER, NAME, "\n\n", *thread_pieces(blocks, not marked), *modules]]
    first = scatter(draw, stacks, [o[:c] for o, c in zip(others, cuts, strict=True)])
    rest = scatter(draw, modules, [o[c:] for o, c in zip(others, cuts, strict=True)] + late)
    return first + rest


def torn_dump() -> st.SearchStrategy[str]:
    return torn_pieces().map("".join)


def cut_after(text: str, what: str, cut: int | None) -> str:
    if cut is None:
        return text
    start = text.rindex(what) + len(what)
    return text[: start + cut % (len(text) - start + 1)]


@SETTINGS
@given(
    torn_dump(),
    st.sampled_from(sorted(PREFIXES)),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10)), max_size=6),
)
def test_a_dump_torn_anywhere_reads_as_the_control(dump, prefix, unrelated):
    text = crash_log(dump, prefix, unrelated, None)
    sig = crash_signature(text.splitlines(), None, KNOWN)
    assert facts(sig) == (*CONTROL_FACTS[:3], PREFIXES[prefix], *CONTROL_FACTS[4:])


@SETTINGS
@given(torn_dump(), st.sampled_from(sorted(PREFIXES)), st.integers(0, 100_000))
def test_a_torn_dump_cut_off_after_its_kernel_keeps_the_verdict(dump, prefix, cut):
    """Cut off after the kernel's name, a module name glued to it may not be taken out
    any more (its lists are not whole): the kernel's frame can be lost, and the frame
    named is then another of the thread that ran the model, never a helper's."""
    text = cut_after(crash_log(dump, prefix, [], None), FUNCTION, cut)
    sig = crash_signature(text.splitlines(), None, KNOWN)
    assert (sig.exception, known_label(sig.known), sig.process) == (
        "SIGILL",
        "amx-sigill",
        PREFIXES[prefix],
    )
    assert sig.frame == "" or sig.frame.startswith(MODEL_CODE), sig.frame


@SETTINGS
@given(torn_pieces(), st.data())
def test_a_dump_cut_off_before_the_kernel_keeps_the_verdict_by_the_kernel_report(pieces, data):
    """The second thread in the handler skips the stacks, writes its modules and re-raises
    the signal, which can kill the process while the first is still writing: the dump
    ends anywhere, the kernel's frame unwritten. The worker reported its attention kernel
    (``offload-check kernel: attention_isa=amx``, in the recorded log before the dump), so
    the crash is still the known one, and a helper's frame is never named."""
    assert any("attention_isa=amx" in ln for ln in PRE)
    # The process dies between two writes (a name is one write, never cut in half).
    start = pieces.index(NAME) + 1
    end = pieces.index(FUNCTION)
    cut = data.draw(st.integers(start, end))
    sig = crash_signature([*PRE, *"".join(pieces[:cut]).splitlines()], None, KNOWN)
    assert (sig.exception, known_label(sig.known)) == ("SIGILL", "amx-sigill")
    assert sig.frame == "" or sig.frame.startswith(MODEL_CODE), sig.frame
    assert sig.process in ("worker", "unknown")


def test_a_helper_alone_is_never_the_faulting_thread():
    """Only vLLM's death-pipe monitor read (the CI shape): no stack, not the monitor's."""
    monitor = next(b for b in BLOCKS if "death_pipe_monitor" in "".join(b))
    log = [*PRE, HEADER + NAME, "", *monitor]
    sig = crash_signature(log, None, KNOWN)
    assert (sig.frame, known_label(sig.known), sig.process) == ("", "amx-sigill", "worker")
    assert sig.summary() == "SIGILL (worker) (known: amx-sigill)"


def test_a_frame_cut_after_its_line_number_still_names_where_the_worker_died():
    """The dying worker wrote ``File ".../vllm/_custom_ops.py", line 3927`` and no more;
    the engine core's log went on from there. The frame keeps its path and line (the only
    frame inside vLLM), and the crash is still the known one, by the kernel the worker
    reported, since no frame of the model code was read whole."""
    lines = CUT_MID_FRAME.read_text().splitlines()
    assert not any("cpu_attention_with_kv_cache" in ln for ln in lines)
    sig = crash_signature(lines, None, KNOWN)
    assert sig.summary() == "SIGILL in vllm/_custom_ops.py:3927 (worker) (known: amx-sigill)"


@pytest.mark.parametrize("code", ["None", "-4"])
def test_a_worker_that_died_before_writing_any_dump_is_known_by_its_kernel(code):
    """The third shape one AMX host showed (2026-12-06): no fault handler line at all,
    only vLLM's "Worker proc VllmWorker-0 died unexpectedly", after the worker reported
    the AMX attention kernel. Known by that kernel when the exit code is SIGILL's or was
    never read; another exit code, or no kernel reported, is no known crash."""
    lines = CONTROL.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(HEADER))
    death = next(i for i, ln in enumerate(lines) if "died unexpectedly" in ln)
    log = [*lines[:start], *lines[death:]]
    log = [ln.replace("(exit code: None)", f"(exit code: {code})") for ln in log]
    sig = crash_signature(log, None, KNOWN)
    assert sig.kind == "died" and known_label(sig.known) == "amx-sigill"
    assert sig.summary() == (
        f"VllmWorker-0 died unexpectedly (no stack; exit code: {code}"
        + (", killed by SIGILL" if code == "-4" else "")
        + ") (known: amx-sigill, by its reported kernel)"
    )
    other = [ln.replace(f"(exit code: {code})", "(exit code: -11)") for ln in log]
    assert crash_signature(other, None, KNOWN).known is None
    no_kernel = [ln for ln in log if "attention_isa=amx" not in ln]
    assert crash_signature(no_kernel, None, KNOWN).known is None
