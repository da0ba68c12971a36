"""Names the harness and the code it loads into vLLM processes must spell alike.

The launcher sets environment variables that ``harness.engine`` reads inside vLLM, the
engine side prints log lines that ``harness.server.engine_log`` and the verdicts grep, and
scenario files name faults and patches that the engine side implements. Each such name
is defined here once. Standard library only: this module is imported inside every vLLM
process (API server, EngineCore, workers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

# --- seeded faults of the host offload backend (harness.engine.host_offload) ----------
Fault = Literal[
    "none",
    "corrupt-load",
    "drop-store",
    "no-load",
    "partial-store",
    "partial-load",
    "overcount-load",
    "load-neighbour",
    "segv-in-worker",
]
FAULTS: tuple[str, ...] = get_args(Fault)
FAULT_NONE, FAULT_CORRUPT_LOAD, FAULT_DROP_STORE, FAULT_NO_LOAD = FAULTS[:4]
FAULT_PARTIAL_STORE, FAULT_PARTIAL_LOAD, FAULT_OVERCOUNT_LOAD = FAULTS[4:7]
# A load that copies the slot after the one it was asked for (the last slot's: the
# first), reporting success and the right byte count: KV reused from another chunk.
FAULT_LOAD_NEIGHBOUR, FAULT_SEGV = FAULTS[7:]

# --- seeded faults of the disk tier ------------------------------------------------------
# The harness damages the chunk files between the filler and the replay (truncate: every
# file cut to half; swap: every file holds another chunk's bytes, as if named by another
# hash; bit-flip: one bit of every file flipped, its size kept), or, inside EngineCore
# (harness.engine.host_tiering), the fs tier's own I/O fails: each file read back is
# deleted between the lookup that found it and its read, every write finds the disk full
# (ENOSPC), or every read fails with EIO after the lookup found the file (the file kept).
# tier-never-loads replaces the fs tier with one loaded through vLLM's own ``module_path``
# hook whose loads never complete (harness.engine.stall_tier).
DiskFault = Literal[
    "none",
    "truncate-chunks",
    "swap-chunks",
    "delete-before-load",
    "disk-full",
    "bit-flip",
    "read-eio",
    "tier-never-loads",
]
DISK_FAULTS: tuple[str, ...] = get_args(DiskFault)
DISK_FAULT_TRUNCATE, DISK_FAULT_SWAP, DISK_FAULT_DELETE, DISK_FAULT_FULL = DISK_FAULTS[1:5]
DISK_FAULT_BITFLIP, DISK_FAULT_EIO, DISK_FAULT_STALL = DISK_FAULTS[5:]
ENGINE_DISK_FAULTS = (DISK_FAULT_DELETE, DISK_FAULT_FULL, DISK_FAULT_EIO)
# The never-loading tier, as vLLM's tier factory finds it: the class by its ``type``.
STALL_TIER_MODULE = "harness.engine.stall_tier"
STALL_TIER_TYPE = "NeverLoadsTier"
EXTRA_DISK_FAULT = "offload_check_disk_fault"  # kv_connector_extra_config key
LOG_DISK_FAULT = "offload-check disk fault:"  # the engine log line naming it

# --- patches applied inside vLLM (harness.engine.patches) ------------------------------
PATCH_FIX = "chunked-local-fix"  # PR #51161's fix, on a stock build
PATCH_FLOOR = "chunked-local-floor"  # a mutant of the fix: the window rounded down
PATCH_HITS_MINUS_CHUNK = "hits-minus-chunk"  # a mutant connector admitting a chunk fewer
PATCH_THRESHOLD_PLUS_ONE = "store-threshold-plus-one"  # a mutant manager asking one offer more
PATCH_ABORTED_STORES_PROMPT = "aborted-stores-prompt"  # PRs #49146, #49285 undone: #49118
PATCHES: tuple[str, ...] = (
    PATCH_FIX,
    PATCH_FLOOR,
    PATCH_HITS_MINUS_CHUNK,
    PATCH_THRESHOLD_PLUS_ONE,
    PATCH_ABORTED_STORES_PROMPT,
)
PATCH_NONE = "none"

# --- kv_connector_extra_config keys the host backend reads ------------------------------
HOST_SPEC_NAME = "HostOffloadingSpec"
HOST_SPEC_MODULE = "harness.engine.host_offload"
# The tiered variant (a disk tier under the CPU tier); vLLM's own name on GPU platforms.
HOST_TIERING_SPEC_NAME = "HostTieringOffloadingSpec"
HOST_TIERING_SPEC_MODULE = "harness.engine.host_tiering"
TIERING_SPEC_NAME = "TieringOffloadingSpec"
# The disk tier's label on vLLM's tiering counters (``tier="<index>:<type>"``): the
# harness configures exactly one secondary tier, the fs tier, after the primary (0).
DISK_TIER_LABEL = "1:fs"
EXTRA_FAULT = "offload_check_fault"  # a fault fixed for the server's life
EXTRA_FAULT_CONTROL = "offload_check_fault_control"  # a file holding the current fault

# --- environment variables ---------------------------------------------------------------
# Set by the launcher, read inside vLLM:
ENV_PATCH = "OFFLOAD_CHECK_PATCH"  # the patch the plugin applies ("none": none)
ENV_AMX = "OFFLOAD_CHECK_AMX"  # "on" / "off": ask Linux for AMX tile permission
ENV_REPORT_SPECS = "OFFLOAD_CHECK_REPORT_SPECS"  # "1": print KV groups and kernels
ENV_TRACE = "OFFLOAD_CHECK_TRACE"  # "1": print every transfer job of the host backend
# The CPU tier's usage gauges (vLLM 0.30+), as its stats and /metrics name them.
GAUGE_CPU_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
GAUGE_CPU_WRITE_USAGE = "vllm:kv_offload_cpu_cache_write_usage_perc"
GAUGE_CPU_READ_USAGE = "vllm:kv_offload_cpu_cache_read_usage_perc"
# A directory: the host backend's content ledger (harness.engine.content_ledger).
ENV_LEDGER = "OFFLOAD_CHECK_LEDGER"
# mutate's coverage of the engine processes (harness.engine.reach): the file to trace, by
# its path under site-packages, and the directory each process writes its lines to
ENV_COVER = "OFFLOAD_CHECK_COVER"
ENV_COVER_OUT = "OFFLOAD_CHECK_COVER_OUT"
# Read by the harness itself:
ENV_LOCK = "OFFLOAD_CHECK_LOCK"  # the machine-wide server lock's path ("none": off)
ENV_LOCK_WAIT = "OFFLOAD_CHECK_LOCK_WAIT"  # "0": a launch fails (exit 3) if the lock is held
ENV_CACHE = "OFFLOAD_CHECK_CACHE"  # models, per-build vLLM caches
ENV_DEVICE = "OFFLOAD_CHECK_DEVICE"  # override the probed device (planning for GPUs)
# "1": the harness's vLLM platform plugin answers the CPU platform (a CUDA wheel on a host
# without the NVIDIA driver, for builds that ignore VLLM_TARGET_DEVICE: harness.engine.cuda_wheel)
ENV_CPU_STAND_IN = "OFFLOAD_CHECK_CPU_STAND_IN"
ENV_CORES = "OFFLOAD_CHECK_CORES"  # the cores this process's servers run on (a --jobs lane)

# --- log line prefixes the engine side prints and the harness reads ------------------------
LOG_AMX = "offload-check amx:"
LOG_PATCH = "offload-check patch:"
LOG_KV_GROUPS = "offload-check kv-groups:"
LOG_KERNEL = "offload-check kernel:"
LOG_HOST_WORKER = "offload-check host offload worker:"
LOG_FAULT_SWITCH = "offload-check host offload: fault is now"
LOG_TRANSFER = "offload-check transfer:"

# The checkout (or the installed tree) the harness runs from: scenarios/, the
# environments' stamps and the Makefile's variables are found from here.
REPO_ROOT = Path(__file__).resolve().parent.parent


# Upstream behaviours the pressure oracle (``harness.commands.pressure.oracle``) can follow
# exactly instead of its own semantics, each named for what it does and held by the
# releases a scenario's rules say (PEP 440), so a
# release with a known bug is still judged request by request: a second fault on top of
# it still shows. Found in each release's own manager and replayed there
# (docs/pressure-design.md §1.6; tests/unit/commands/pressure/test_pressure_replay.py).
DEVIATIONS: dict[str, str] = {
    # 0.31+ (LRU until 0.33, ARC still): a reuse reaches the policy only at finish, so
    # the chunks a request just loaded rank as old while the same request stores its
    # tail, and may be evicted for it (found by this project; no upstream issue).
    "access-at-finish": "a request's reused chunks are ranked only when it finishes",
    # PR #55461 (0.27-0.29): with T2 out of candidates ARC gives up, T1 notwithstanding.
    "arc-no-t1-fallback": "ARC gives up when T2 is empty instead of evicting from T1",
    # #52022 / PR #52227 (0.27-0.28): offers counted in lookup(), which stops at the
    # first miss, so a request counts one chunk, not all it offers.
    "threshold-at-lookup": "the store threshold counts only the first missing chunk",
    # 0.27-0.30: the scheduler touches every chunk of a request at lookup and again after
    # a store (``_touch``, offloading/scheduler.py): a resident chunk past the first miss
    # is used before the store evicts, and a chunk the store just evicted is touched as
    # an ARC ghost hit, moving T1's target (found by this project's ARC sequence, S3).
    "touch-twice": "a request's chunks are touched at lookup and after its store, ghosts too",
}

# Seeded eviction-policy mutants (harness.engine.policies, loaded by vLLM through
# cache_policy_module_path): the CLI's name -> (the class, the policy it mutates).
POLICY_MODULE = "harness.engine.policies"
# One server, several policies in turn (``offload-check pressure --mutant``): vLLM loads
# ``SWITCHABLE_POLICY`` from ``POLICY_MODULE``; it reads the policy to be (``lru``, ``arc``
# or a mutant's class) from the file this variable names whenever the tier is reset.
SWITCHABLE_POLICY = "SwitchablePolicy"
ENV_POLICY_CONTROL = "OFFLOAD_CHECK_POLICY_CONTROL"
POLICY_MUTANTS: dict[str, tuple[str, str]] = {
    "lru-evicts-newest": ("LruEvictsNewest", "lru"),
    "lru-never-refreshes": ("LruNeverRefreshes", "lru"),
    "arc-no-t1-fallback": ("ArcNoT1Fallback", "arc"),
}

# A folder of kept records of earlier runs (results/gpu/, scripts/gpu/keep.sh) holds this
# file: the CI summary of ``results/*`` passes over it, as those runs are not the job's.
RECORDS_MARKER = ".offload-check-records"
