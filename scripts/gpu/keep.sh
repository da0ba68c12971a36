#!/bin/bash
# Keep a GPU loan's records in the repository (docs/runners.md, "GPU loan: staging and
# runs", "Keeping the records"), from any directory:
#
#   bash scripts/gpu/keep.sh [--force] FILES_AT [NAME]
#
# FILES_AT is where the device tool put what scripts/gpu/runs.sh left under $OUT:
# <step>/summary.txt and <step>/runs.tgz per step. Each step's runs.tgz is unpacked into a
# scratch directory and what a reader and `offload-check report` need is copied to
# results/gpu/<NAME>/<step>/:
#
#   summary.txt                 the step's (the one beside runs.tgz, else the archive's)
#   output.txt                  the step's output, its last 400 lines when longer
#   runs/<run-id>/run.json, *.csv, report.md, junit.xml, traceback.txt
#   runs/<run-id>/requests.jsonl               only when under 1 MiB
#   runs/<run-id>/logs/<name>.log.tail         each logs/*.log, its last 300 lines
#
# and nothing else (no metrics/*.prom, no *.png, no disk-tier/, no whole logs): a step
# stays well under 1 MiB. A file that was cut starts with one line saying so:
# "[keep.sh: the last 300 of 1234 lines of logs/server.log]".
#
# NAME (letters, digits, `.`, `_`, `-`) defaults to the first step's UTC date (its
# summary's `date:` line, else today) and its GPU model (the line under nvidia-smi's
# `name, driver_version` header), slugged: 20261207-nvidia-h200. An existing
# results/gpu/<NAME>/<step> is refused (nothing is written) unless --force replaces it.
# Prints each file kept with its bytes, each step's total and the whole.
#
# Environment: KEEP_ROOT  where results/gpu/ is made (default: this checkout's root).
# Errors are one line on stderr, exit 2.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KEEP_ROOT=${KEEP_ROOT:-$ROOT}
OUTPUT_LINES=400
LOG_LINES=300
MIB=1048576

die() {
    echo "keep.sh: $*" >&2
    exit 2
}

for tool in tar gzip tail wc stat awk find; do
    command -v "$tool" > /dev/null 2>&1 || die "missing tool: $tool"
done

force=0
args=()
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -*) die "unknown option $arg (usage: keep.sh [--force] FILES_AT [NAME])" ;;
        *) args+=("$arg") ;;
    esac
done
[ ${#args[@]} -ge 1 ] && [ ${#args[@]} -le 2 ] || die "usage: keep.sh [--force] FILES_AT [NAME]"
FILES_AT=${args[0]}
NAME=${args[1]:-}
[ -d "$FILES_AT" ] || die "$FILES_AT: no such directory (the device tool's files_at)"
[ -d "$KEEP_ROOT" ] || die "KEEP_ROOT $KEEP_ROOT: no such directory"
if [ -n "$NAME" ]; then
    [[ $NAME =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] \
        || die "NAME $NAME: only letters, digits, '.', '_' and '-' (not first '.' or '-')"
fi

shopt -s nullglob
archives=("$FILES_AT"/*/runs.tgz)
shopt -u nullglob
[ ${#archives[@]} -gt 0 ] || die "$FILES_AT holds no <step>/runs.tgz (what runs.sh leaves)"

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/keep-gpu.XXXXXX")
STAGE=""
cleanup() {
    rm -rf "$SCRATCH"
    if [ -n "$STAGE" ]; then rm -rf "$STAGE"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Unpack every step first: a bad archive is refused before anything is written.
steps=()
for tgz in "${archives[@]}"; do
    step=$(basename "$(dirname "$tgz")")
    [[ $step =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] || die "$tgz: step name $step is not a plain name"
    mkdir -p "$SCRATCH/$step"
    tar -xzf "$tgz" -C "$SCRATCH/$step" --no-same-owner 2> /dev/null \
        || die "$tgz: not a readable .tgz"
    steps+=("$step")
done

# The step's summary: the one runs.sh left beside runs.tgz (it may carry a line added
# after the archive was made), else the archive's; empty when neither exists.
summary_of() {
    local step=$1
    if [ -f "$FILES_AT/$step/summary.txt" ]; then
        echo "$FILES_AT/$step/summary.txt"
    elif [ -f "$SCRATCH/$step/summary.txt" ]; then
        echo "$SCRATCH/$step/summary.txt"
    fi
}

# Lower case, every run of other characters one '-', none at either end.
slug() {
    echo "$1" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//'
}

if [ -z "$NAME" ]; then
    summary=$(summary_of "${steps[0]}")
    day="" gpu=""
    if [ -n "$summary" ]; then
        day=$(sed -nE 's/^date: ([0-9]{4})-([0-9]{2})-([0-9]{2})T.*/\1\2\3/p' "$summary" | head -n 1)
        gpu=$(awk 'found { sub(/,.*/, ""); print; exit } /^name, driver_version/ { found = 1 }' "$summary")
        if [ -z "$gpu" ] && grep -q '^nvidia-smi: not found' "$summary"; then gpu="no-gpu"; fi
    fi
    day=${day:-$(date -u +%Y%m%d)}
    gpu=$(slug "${gpu:-unknown-gpu}")
    NAME="$day-${gpu:-unknown-gpu}"
fi
BASE="$KEEP_ROOT/results/gpu/$NAME"
# The marker (harness/names.py RECORDS_MARKER): the CI summary of results/* passes over
# results/gpu/, whose runs are not the job's.
MARKER="$KEEP_ROOT/results/gpu/.offload-check-records"

# Refuse before writing anything.
for step in "${steps[@]}"; do
    if [ -e "$BASE/$step" ] && [ "$force" -eq 0 ]; then
        die "results/gpu/$NAME/$step exists (--force replaces it)"
    fi
done

# A regular file, not a link (the archive came from another machine).
plain() {
    [ -f "$1" ] && [ ! -L "$1" ]
}

# Copy $1 to $2, its last $3 lines when it has more, with a first line saying so.
cut_copy() {
    local src=$1 dst=$2 keep=$3 what=$4 lines
    lines=$(wc -l < "$src")
    if [ "$lines" -gt "$keep" ]; then
        {
            echo "[keep.sh: the last $keep of $lines lines of $what]"
            tail -n "$keep" "$src"
        } > "$dst"
    else
        cp "$src" "$dst"
    fi
}

bytes_under() {
    find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d\n", s }'
}

mkdir -p "$BASE"
total=0
nfiles=0
for step in "${steps[@]}"; do
    src="$SCRATCH/$step"
    STAGE=$(mktemp -d "$BASE/.keep-$step.XXXXXX")
    summary=$(summary_of "$step")
    if [ -n "$summary" ]; then cp "$summary" "$STAGE/summary.txt"; fi
    if plain "$src/output.txt"; then
        cut_copy "$src/output.txt" "$STAGE/output.txt" "$OUTPUT_LINES" output.txt
    fi
    notes=()
    shopt -s nullglob
    runs=("$src"/runs/*/run.json)
    for meta in "${runs[@]}"; do
        run=$(dirname "$meta")
        id=$(basename "$run")
        dst="$STAGE/runs/$id"
        mkdir -p "$dst"
        for f in "$run"/run.json "$run"/*.csv "$run"/report.md "$run"/junit.xml \
            "$run"/traceback.txt; do
            if plain "$f"; then cp "$f" "$dst/"; fi
        done
        if plain "$run/requests.jsonl"; then
            size=$(stat -c %s "$run/requests.jsonl")
            if [ "$size" -lt "$MIB" ]; then
                cp "$run/requests.jsonl" "$dst/"
            else
                notes+=("runs/$id/requests.jsonl left out: $size B, 1 MiB or more")
            fi
        fi
        for log in "$run"/logs/*.log; do
            plain "$log" || continue
            mkdir -p "$dst/logs"
            cut_copy "$log" "$dst/logs/$(basename "$log").tail" "$LOG_LINES" \
                "logs/$(basename "$log")"
        done
    done
    shopt -u nullglob
    [ ${#runs[@]} -gt 0 ] || notes+=("no run directory in runs.tgz (runs/<run-id>/run.json)")

    [ -f "$MARKER" ] || echo "kept records of earlier runs (scripts/gpu/keep.sh)" > "$MARKER"
    rm -rf "${BASE:?}/$step"
    mv "$STAGE" "$BASE/$step"
    STAGE=""
    echo "results/gpu/$NAME/$step:"
    (cd "$BASE/$step" && find . -type f -printf '%P\t%s\n' | sort \
        | awk -F '\t' '{ printf "  %9d B  %s\n", $2, $1 }')
    for note in ${notes[@]+"${notes[@]}"}; do echo "  ($note)"; done
    bytes=$(bytes_under "$BASE/$step")
    count=$(find "$BASE/$step" -type f | wc -l)
    echo "kept $step: $count files, $bytes B"
    if [ "$bytes" -ge "$MIB" ]; then
        echo "keep.sh: warning: results/gpu/$NAME/$step is $bytes B, over 1 MiB" >&2
    fi
    total=$((total + bytes))
    nfiles=$((nfiles + count))
done
echo "kept ${#steps[@]} step(s) in results/gpu/$NAME: $nfiles files, $total B"
