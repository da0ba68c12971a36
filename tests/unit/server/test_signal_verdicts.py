"""Deaths by signal as verdicts with a cause, on recorded vLLM logs.

A worker killed by a signal prints no Python traceback; the tracebacks that do follow
(``RuntimeError: cancelled``, ``EngineDeadError``) are the survivors' reactions. These
logs were recorded on an AMX host (vLLM's CPU attention kernel dies with SIGILL) and on
a server whose worker was killed by SIGSEGV.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.scenario.crash_repro import Expectation
from harness.scenario.schema import KnownCrash
from harness.server.crash_signatures import (
    crash_signature,
    judge,
    known_label,
    parse_tracebacks,
    parse_worker_deaths,
)
from harness.server.fault_dumps import parse_fatal_signals

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
AMX = FIXTURES / "amx-host"
SIGSEGV_LOG = FIXTURES / "signals" / "server-sigsegv-worker.log"
AMX_SIGILL = KnownCrash(
    issue="amx-sigill", exception="SIGILL", functions=["cpu_attention_with_kv_cache"]
)
ISSUE_51150 = KnownCrash(
    issue=51150, exception="AssertionError", functions=["get_sliding_window_size_in_chunks"]
)
KNOWN = [ISSUE_51150, AMX_SIGILL]
CPU_ATTENTION = "vllm/_custom_ops.py:cpu_attention_with_kv_cache"
OFFLOAD_WORKER = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py:get_finished"


def lines(path: Path) -> list[str]:
    # As crash_repro reads a server log.
    return path.read_text(errors="replace").splitlines()


# --- recorded: offline LLM on an AMX host, one process, fault handler on ----------------


def test_offline_sigill_is_the_cpu_attention_kernel():
    sig = crash_signature(lines(AMX / "offline-llm-faulthandler-sigill.log"), -4, KNOWN)
    assert sig.exception == "SIGILL"
    assert sig.frame == CPU_ATTENTION
    assert sig.process == "worker"
    assert sig.message == "Fatal Python error: Illegal instruction"
    assert sig.known == "amx-sigill"
    assert sig.summary() == f"SIGILL in {CPU_ATTENTION} (worker) (known: amx-sigill)"
    assert any(p.endswith("vllm/v1/attention/backends/cpu_attn.py") for p in sig.paths)


def test_offline_sigill_stack_is_the_thread_running_the_model():
    (dump,) = parse_fatal_signals(lines(AMX / "offline-llm-faulthandler-sigill.log"))
    # Three threads, none marked current (the kernel ran without the GIL): two tqdm
    # monitors and the main thread, printed last.
    assert [t.current for t in dump.threads] == [False, False, False]
    assert dump.stack is dump.threads[-1]
    first, second = dump.stack.frames[:2]  # innermost first, as the handler prints them
    assert (first.func, first.line) == ("__call__", 1279)
    assert first.path.endswith("torch/_ops.py")
    assert (second.vllm_relpath, second.func) == (
        "vllm/_custom_ops.py",
        "cpu_attention_with_kv_cache",
    )
    assert dump.stack.frames[-1].func == "<module>"


def test_offline_sigill_without_known_crashes_still_names_the_signal():
    sig = crash_signature(lines(AMX / "offline-llm-faulthandler-sigill.log"), -4)
    assert sig.known is None
    assert sig.summary() == f"SIGILL in {CPU_ATTENTION} (worker)"


@pytest.mark.parametrize(
    "other",
    [
        KnownCrash(issue="x", exception="SIGSEGV", functions=["cpu_attention_with_kv_cache"]),
        KnownCrash(issue="x", exception="SIGILL", functions=["some_other_kernel"]),
    ],
)
def test_a_different_signal_or_function_is_not_the_known_crash(other):
    sig = crash_signature(lines(AMX / "offline-llm-faulthandler-sigill.log"), -4, [other])
    assert sig.exception == "SIGILL" and sig.known is None


# --- recorded: API servers on an AMX host, no fault handler: only the death line ---------


@pytest.mark.parametrize(
    ("log", "code", "how"),
    [
        ("crash-repro-small-chunk-current-connector-on.server.log", "None", ""),
        ("crash-repro-small-chunk-current-connector-off.server.log", "-4", ", killed by SIGILL"),
    ],
)
def test_server_worker_death_without_stack_beats_the_follow_on_tracebacks(log, code, how):
    log_lines = lines(AMX / log)
    # What the old parser took for the root cause: EngineCore's shm_broadcast traceback.
    first = parse_tracebacks(log_lines)[0]
    assert (first.process.split()[0], first.exception, first.message) == (
        "EngineCore",
        "RuntimeError",
        "cancelled",
    )

    sig = crash_signature(log_lines, None, KNOWN)
    assert sig.exception == "worker died"
    assert sig.process == "VllmWorker-0"
    assert sig.frame == "" and sig.paths == () and sig.known is None
    assert sig.message.startswith(f"Worker proc VllmWorker-0 died unexpectedly (exit code: {code})")
    assert sig.summary() == f"VllmWorker-0 died unexpectedly (no stack; exit code: {code}{how})"


def test_worker_deaths_are_parsed_with_who_logged_them():
    (death,) = parse_worker_deaths(
        lines(AMX / "crash-repro-small-chunk-current-connector-on.server.log")
    )
    assert (death.name, death.exit_code) == ("VllmWorker-0", "None")
    assert death.process == "EngineCore pid=8421"


# --- recorded: an API server whose worker was killed by SIGSEGV, fault handler on --------


def test_server_sigsegv_worker_stack_is_the_root_cause():
    log_lines = lines(SIGSEGV_LOG)
    # After the dump: EngineCore's death line, then the survivors' tracebacks.
    assert [t.exception for t in parse_tracebacks(log_lines)] == [
        "RuntimeError",
        "EngineDeadError",
    ]
    sig = crash_signature(log_lines, None, KNOWN)
    assert sig.exception == "SIGSEGV"
    assert sig.frame == OFFLOAD_WORKER
    assert sig.process == "worker"
    assert sig.message == "Fatal Python error: Segmentation fault"
    assert sig.known is None
    assert sig.summary() == f"SIGSEGV in {OFFLOAD_WORKER} (worker)"
    # The harness's own backend, innermost below vLLM, stays among the stack's files.
    assert sig.paths[1] == "<repo>/harness/engine/host_offload.py"


def test_server_sigsegv_stack_is_the_current_thread():
    (dump,) = parse_fatal_signals(lines(SIGSEGV_LOG))
    # vLLM's death_pipe_monitor thread is printed first, with vLLM frames of its own.
    monitor, current = dump.threads
    assert not monitor.current and any(f.func == "death_pipe_monitor" for f in monitor.frames)
    assert dump.stack is current and current.current
    assert current.thread == "0x00007f46c4ec57c0"
    assert [f.func for f in current.frames[:3]] == ["string_at", "get_finished", "get_finished"]
    assert current.frames[-1].func == "<module>"


# --- synthetic: the dump's shapes -----------------------------------------------------------


def dump(what: str, *threads: tuple[str, list[tuple[str, str]]], lead: str = "") -> list[str]:
    """A fault handler dump as Python writes it: innermost frame first, no comma."""
    out = [f"{lead}Fatal Python error: {what}", ""]
    for header, frames in threads:
        out.append(f"{header} (most recent call first):")
        out += [f'  File "/venv/site-packages/{path}", line 7 in {func}' for path, func in frames]
        out.append("")
    return [*out, "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)"]


WORKER = [
    ("torch/_ops.py", "__call__"),
    ("vllm/_custom_ops.py", "kernel"),
    ("vllm/v1/worker/gpu_model_runner.py", "execute_model"),
    ("vllm/v1/executor/multiproc_executor.py", "worker_busy_loop"),
]
ENGINE = [
    ("vllm/v1/core/sched/scheduler.py", "schedule"),
    ("vllm/v1/engine/core.py", "step"),
    ("vllm/v1/engine/core.py", "run_busy_loop"),
]
IDLE = [("threading.py", "wait"), ("tqdm/_monitor.py", "run")]
NOT_A_SIGNAL = "_enter_buffered_busy: could not acquire lock"


@pytest.mark.parametrize(
    ("what", "name"),
    [
        ("Illegal instruction", "SIGILL"),
        ("Segmentation fault", "SIGSEGV"),
        ("Bus error", "SIGBUS"),
        ("Floating-point exception", "SIGFPE"),
        ("Floating point exception", "SIGFPE"),
        ("Aborted", "SIGABRT"),
        (NOT_A_SIGNAL, NOT_A_SIGNAL),  # kept verbatim
    ],
)
def test_each_signal_is_named(what, name):
    sig = crash_signature(dump(what, ("Thread 0x01", WORKER)), None)
    assert sig.exception == name
    assert sig.message == f"Fatal Python error: {what}"
    assert sig.frame == "vllm/_custom_ops.py:kernel"
    assert sig.process == "worker"


def test_the_current_thread_marker_wins_over_the_last_vllm_thread():
    log = dump("Segmentation fault", ("Current thread 0x01", ENGINE), ("Thread 0x02", WORKER))
    sig = crash_signature(log, None)
    assert sig.frame == "vllm/v1/core/sched/scheduler.py:schedule"
    assert sig.paths == tuple(f"/venv/site-packages/{p}" for p, _ in ENGINE)
    # The process holds worker code too, so it is a worker (an in-process executor).
    assert sig.process == "worker"


def test_unmarked_threads_take_the_last_one_with_vllm_frames():
    log = dump("Aborted", ("Thread 0x01", ENGINE), ("Thread 0x02", IDLE))
    sig = crash_signature(log, None)
    assert sig.frame == "vllm/v1/core/sched/scheduler.py:schedule"
    assert sig.process == "EngineCore"


def test_no_vllm_frames_at_all():
    sig = crash_signature(dump("Bus error", ("Thread 0x01", IDLE)), None)
    assert (sig.exception, sig.frame, sig.process) == ("SIGBUS", "", "unknown")
    assert sig.summary() == "SIGBUS (unknown)"


def test_fatal_error_mid_line_after_a_progress_bar():
    bar = "Processed prompts:   0%|          | 0/1 [00:00<?, ?it/s, est. speed input: 0.00 toks/s]"
    sig = crash_signature(dump("Illegal instruction", ("Thread 0x01", WORKER), lead=bar), None)
    assert sig.exception == "SIGILL" and sig.frame == "vllm/_custom_ops.py:kernel"
    # A log split on "\n" only keeps the carriage returns inside the line.
    log = dump("Illegal instruction", ("Thread 0x01", WORKER), lead=f"\r{bar}\r{bar}")
    assert crash_signature(log, None).exception == "SIGILL"


def test_a_process_prefix_names_the_process_and_interleaved_lines_are_skipped():
    log = dump("Segmentation fault", ("Current thread 0x01", IDLE + WORKER))
    log[0] = "(Worker_TP1 pid=77) " + log[0]
    log.insert(3, "(EngineCore pid=12) INFO 11-30 14:13:33 [core.py:1] still stepping")
    sig = crash_signature(log, None)
    assert sig.process == "Worker_TP1 pid=77"
    assert sig.frame == "vllm/_custom_ops.py:kernel"  # the dump went on past that line
    assert sig.summary() == "SIGSEGV in vllm/_custom_ops.py:kernel (Worker_TP1 pid=77)"


FOLLOW_ON = """\
(EngineCore pid=12) ERROR 11-30 14:13:33 [multiproc_executor.py:315] Worker proc \
VllmWorker-0 died unexpectedly (exit code: -11), shutting down executor.
(EngineCore pid=12) ERROR 11-30 14:13:33 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=12) ERROR 11-30 14:13:33 [core.py:1512]   File "/v/vllm/distributed/\
device_communicators/shm_broadcast.py", line 867, in acquire_read
(EngineCore pid=12) ERROR 11-30 14:13:33 [core.py:1512]     raise RuntimeError("cancelled")
(EngineCore pid=12) ERROR 11-30 14:13:33 [core.py:1512] RuntimeError: cancelled
(APIServer pid=11) ERROR 11-30 14:13:33 [async_llm.py:906] Traceback (most recent call last):
(APIServer pid=11) ERROR 11-30 14:13:33 [async_llm.py:906]   File "/v/vllm/v1/engine/\
core_client.py", line 1235, in get_output_async
(APIServer pid=11) ERROR 11-30 14:13:33 [async_llm.py:906]     raise self._format_exception()
(APIServer pid=11) ERROR 11-30 14:13:33 [async_llm.py:906] vllm.v1.engine.exceptions.\
EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
""".splitlines()


def test_signal_stack_beats_the_follow_on_tracebacks():
    log = [
        "(APIServer pid=11) INFO 11-30 14:13:32 [launcher.py:1] ready",
        *dump("Segmentation fault", ("Thread 0x01", IDLE), ("Thread 0x02", WORKER)),
        *FOLLOW_ON,
    ]
    assert [t.exception for t in parse_tracebacks(log)] == ["RuntimeError", "EngineDeadError"]
    sig = crash_signature(log, None)
    assert (sig.exception, sig.frame, sig.process) == (
        "SIGSEGV",
        "vllm/_custom_ops.py:kernel",
        "worker",
    )


def test_a_traceback_printed_first_beats_a_death_or_abort_during_teardown():
    assert_tb = """\
(EngineCore pid=12) Traceback (most recent call last):
(EngineCore pid=12)   File "/v/vllm/v1/core/kv_cache_utils.py", line 3, in plan
(EngineCore pid=12)     assert isinstance(spec, FullAttentionSpec)
(EngineCore pid=12) AssertionError""".splitlines()
    log = [*assert_tb, FOLLOW_ON[0], *dump("Aborted", ("Thread 0x01", WORKER))]
    sig = crash_signature(log, 1)
    assert (sig.exception, sig.frame) == ("AssertionError", "vllm/v1/core/kv_cache_utils.py:plan")


def test_the_51150_crash_is_still_the_assert_despite_its_teardown_death_line():
    log = lines(FIXTURES / "stock-0.27.1-51150-crash.log")
    assert any("died unexpectedly" in ln for ln in log)  # logged after the assert
    sig = crash_signature(log, 1, KNOWN)
    assert sig.exception == "AssertionError" and sig.known == 51150
    assert sig.frame == (
        "vllm/distributed/kv_transfer/kv_connector/v1/offloading/"
        "scheduler.py:get_sliding_window_size_in_chunks"
    )
    assert sig.summary() == f"AssertionError in {sig.frame} (known: #51150)"


# --- known crashes by label -----------------------------------------------------------------


def test_known_label():
    assert known_label(51150) == "#51150"
    assert known_label("51150") == "#51150"  # read back from a CSV
    assert known_label("amx-sigill") == "amx-sigill"
    assert known_label(None) == ""


def test_scenarios_accept_labels_and_numbers():
    assert (
        KnownCrash.model_validate(
            {"issue": "amx-sigill", "exception": "SIGILL", "functions": ["f"]}
        ).issue
        == "amx-sigill"
    )
    assert (
        KnownCrash.model_validate(
            {"issue": 51150, "exception": "AssertionError", "functions": ["f"]}
        ).issue
        == 51150
    )
    assert Expectation(outcome="crashed", known="amx-sigill").known == "amx-sigill"


def test_judge_compares_labels():
    rule = Expectation(outcome="crashed", known="amx-sigill")
    assert judge("crashed", "amx-sigill", None, rule) == (True, "")
    ok, why = judge("crashed", None, None, rule)
    assert not ok and why == "expected the amx-sigill signature, got an unknown signature"
    ok, why = judge("crashed", 51150, None, rule)
    assert not ok and why == "expected the amx-sigill signature, got #51150"
    assert judge("crashed", "51150", None, Expectation(outcome="crashed", known=51150))[0]
