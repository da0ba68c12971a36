#!/bin/bash
# Build the parts that carry CUDA vLLM (and what the GPU image lacks) to a lent device
# machine (docs/runners.md, "GPU loan: staging and runs").
#
#   make gpu-payload                                   # = scripts/gpu/build-payload.sh
#   VLLM=0.26.0 scripts/gpu/build-payload.sh           # from anywhere in the checkout
#   scripts/gpu/build-payload.sh --plan BYTES [CHECKOUT_BYTES]
#
# Writes .gpu/p0 .. .gpu/pN-1 in the checkout (git-ignored by .gitignore); the last part
# also holds payload.sha. Every call to the device carries the checkout (tracked and
# untracked-not-ignored files) plus the paths it names, at most 64 MiB in all, so the
# number of parts is computed from the payload's size and the checkout's, measured now,
# leaving MARGIN_MIB (default 4) free in each call. --plan prints that arithmetic for a
# payload of BYTES (and the checkout measured now, or CHECKOUT_BYTES) without downloading.
#
# The image has Python 3.12 and torch 2.11.0+cu130 and reaches no index, so the vLLM wheel
# must pin torch 2.11 (0.26.0 does; 0.27+ pin newer torch). Pruned, because nothing there
# needs them: the FlashAttention-2 kernels (Hopper uses FA3), the Rust front end, the
# sm100 FMHA headers, and deep_gemm's builds for other Pythons.
#
# Knobs: VLLM (0.26.0), WORK (/tmp/gpu-payload-$VLLM: downloads, kept between runs),
# LIMIT_MIB (64), MARGIN_MIB (4), PARTS (force a count; refused if a part would not fit),
# COMPRESS (xz, or gz: how the vLLM tree is packed; device-setup.sh unpacks either).
# Errors are one line on stderr, exit 2.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VLLM=${VLLM:-0.26.0}
WORK=${WORK:-/tmp/gpu-payload-$VLLM}
LIMIT_MIB=${LIMIT_MIB:-64}
MARGIN_MIB=${MARGIN_MIB:-4}
MIB=1048576
# payload.sha (65 B) rides in the last part: room for it and a little more.
EXTRA_BYTES=4096

die() {
    echo "build-payload: $*" >&2
    exit 2
}

need() {
    local t
    for t in "$@"; do
        command -v "$t" > /dev/null 2>&1 || die "missing tool: $t (install it, then run again)"
    done
}

# Bytes of what travels with every call: tracked files and untracked files git does not
# ignore (as `git ls-files -co --exclude-standard`; a deleted tracked file counts nothing,
# a symbolic link its own size).
checkout_bytes() {
    need git stat
    git -C "$ROOT" ls-files -co --exclude-standard -z \
        | (cd "$ROOT" && { xargs -0 -r stat -c %s -- 2> /dev/null || true; }) \
        | awk '{ s += $1 } END { printf "%d\n", s }'
}

# The part arithmetic: sets NPARTS and PART_BYTES for a payload of $1 bytes beside a
# checkout of $2 bytes, every call (one part + the checkout) under LIMIT_MIB less
# MARGIN_MIB. Parts are balanced: PART_BYTES = ceil(payload / parts).
plan() {
    local payload=$1 checkout=$2
    local limit=$((LIMIT_MIB * MIB)) margin=$((MARGIN_MIB * MIB))
    local room=$((limit - margin - checkout - EXTRA_BYTES))
    ((payload > 0)) || die "payload of $payload bytes: nothing to split"
    ((room > 0)) || die "the checkout ($checkout B) leaves no room for a part under $LIMIT_MIB MiB with a $MARGIN_MIB MiB margin"
    local want=${PARTS:-$(((payload + room - 1) / room))}
    [[ $want =~ ^[1-9][0-9]*$ ]] || die "PARTS=$want: not a positive count"
    PART_BYTES=$(((payload + want - 1) / want))
    ((PART_BYTES <= room)) || die "PARTS=$want gives parts of $PART_BYTES B, over the $room B that fit beside the checkout ($checkout B) under $LIMIT_MIB MiB less $MARGIN_MIB MiB"
    NPARTS=$(((payload + PART_BYTES - 1) / PART_BYTES))
    # One call per part, back to back; split names them with one digit.
    ((NPARTS <= 10)) || die "$NPARTS parts of $PART_BYTES B: over 10 (the checkout, $checkout B, leaves too little room under $LIMIT_MIB MiB less $MARGIN_MIB MiB)"
}

print_plan() {
    local payload=$1 checkout=$2 i size
    echo "plan parts=$NPARTS part_bytes=$PART_BYTES payload_bytes=$payload checkout_bytes=$checkout limit_bytes=$((LIMIT_MIB * MIB)) margin_bytes=$((MARGIN_MIB * MIB)) extra_bytes=$EXTRA_BYTES"
    for ((i = 0; i < NPARTS; i++)); do
        size=$PART_BYTES
        ((i < NPARTS - 1)) || size=$((payload - PART_BYTES * (NPARTS - 1)))
        echo "part p$i bytes=$size call_bytes=$((size + checkout))"
    done
}

if [ "${1:-}" = "--plan" ]; then
    [[ ${2:-} =~ ^[0-9]+$ ]] || die "usage: build-payload.sh --plan BYTES [CHECKOUT_BYTES]"
    checkout=${3:-$(checkout_bytes)}
    [[ $checkout =~ ^[0-9]+$ ]] || die "CHECKOUT_BYTES must be a number of bytes, not $checkout"
    plan "$2" "$checkout"
    print_plan "$2" "$checkout"
    exit 0
fi
[ $# -eq 0 ] || die "usage: build-payload.sh [--plan BYTES [CHECKOUT_BYTES]] (got: $*)"

need python3 unzip tar gzip split sha256sum git stat awk du
python3 -m pip --version > /dev/null 2>&1 || die "missing tool: pip for python3 (python3 -m pip)"
DEPS="$HERE/deps-vllm-$VLLM.txt"
[ -f "$DEPS" ] || die "no dependency list for vLLM $VLLM: ${DEPS#"$ROOT"/} (only 0.26.0 pins the image's torch 2.11)"

PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
    --platform manylinux_2_35_x86_64 --platform linux_x86_64 --platform any)
# This machine's pip config may name local indexes that do not exist: one warning each.
quiet() { grep -v '^WARNING: Location' || true; }

mkdir -p "$WORK/wheels" "$WORK/pl/deps"
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$WORK/wheels" "vllm==$VLLM" 2>&1 | quiet \
    || die "download of vllm==$VLLM failed (pip download; its output is above)"
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$WORK/pl/deps" -r "$DEPS" 2>&1 | quiet \
    || die "download of the dependencies in ${DEPS#"$ROOT"/} failed (pip download; its output is above)"
wheels=("$WORK"/wheels/vllm-"$VLLM"-*.whl)
[ -f "${wheels[0]}" ] || die "no vllm-$VLLM wheel in $WORK/wheels after the download"
[ ${#wheels[@]} -eq 1 ] || die "several vllm-$VLLM wheels in $WORK/wheels: ${wheels[*]}"

PRUNE=('vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs'
    'vllm/third_party/fmha_sm100/*' 'vllm/third_party/deep_gemm/_C.cpython-31[0134]*')
# The vLLM tree as xz (the default): 112 MB where gzip gives 149 MB, which takes the
# payload from four parts to three: one device call and one back-to-back gap fewer, for
# about 3 min of compressing here (once: kept in $WORK while the wheel, the pruning and
# the format stay the same) and 2 s more unpacking there. COMPRESS=gz: the gzip tree.
COMPRESS=${COMPRESS:-xz}
case $COMPRESS in
    xz) need xz && tree=vllm.txz ;;
    gz) tree=vllm.tgz ;;
    *) die "COMPRESS=$COMPRESS: xz or gz" ;;
esac
key="$(basename "${wheels[0]}") $(stat -c %s "${wheels[0]}") ${PRUNE[*]}"
if [ -f "$WORK/pl/$tree" ] && [ "$(cat "$WORK/pl/$tree.key" 2> /dev/null)" = "$key" ]; then
    echo "vLLM tree: $WORK/pl/$tree (kept from an earlier build of the same wheel)"
else
    rm -rf "$WORK/site" "$WORK/pl/vllm.tgz" "$WORK/pl/vllm.txz" "$WORK"/pl/*.key
    mkdir -p "$WORK/site"
    unzip -q "${wheels[0]}" -d "$WORK/site" -x "${PRUNE[@]}" || die "unzip of ${wheels[0]} failed"
    echo "vLLM tree: compressing $(du -sm "$WORK/site" | cut -f1) MB with $COMPRESS ..."
    if [ "$COMPRESS" = xz ]; then
        tar -cf - -C "$WORK/site" . | xz -T0 -9 > "$WORK/pl/$tree.partial" \
            || die "xz of the vLLM tree failed"
    else
        tar -czf "$WORK/pl/$tree.partial" -C "$WORK/site" . || die "tar of the vLLM tree failed"
    fi
    mv "$WORK/pl/$tree.partial" "$WORK/pl/$tree"
    echo "$key" > "$WORK/pl/$tree.key"
fi
tar -cf "$WORK/payload.tar" -C "$WORK/pl" "$tree" deps

payload=$(stat -c %s "$WORK/payload.tar")
checkout=$(checkout_bytes)
plan "$payload" "$checkout"

rm -rf "$ROOT/.gpu" && mkdir -p "$ROOT/.gpu"
split -b "$PART_BYTES" -d -a 1 "$WORK/payload.tar" "$ROOT/.gpu/part"
for ((i = 0; i < NPARTS; i++)); do
    mkdir -p "$ROOT/.gpu/p$i" && mv "$ROOT/.gpu/part$i" "$ROOT/.gpu/p$i/"
done
[ ! -e "$ROOT/.gpu/part$NPARTS" ] || die "split made more than $NPARTS parts"
last="$ROOT/.gpu/p$((NPARTS - 1))"
sha256sum "$WORK/payload.tar" | cut -d' ' -f1 > "$last/payload.sha"
git -C "$ROOT" check-ignore -q .gpu/ || die ".gpu/ is not ignored by git: it would travel with every call (add /.gpu/ to .gitignore)"

echo "vLLM $VLLM: payload $payload B in $NPARTS parts; checkout $checkout B travels with every call"
for ((i = 0; i < NPARTS; i++)); do
    size=$(find "$ROOT/.gpu/p$i" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
    printf '  .gpu/p%d  %10d B (%.1f MiB); with the checkout %.1f MiB of %d\n' "$i" "$size" \
        "$(awk "BEGIN { print $size / $MIB }")" "$(awk "BEGIN { print ($size + $checkout) / $MIB }")" \
        "$LIMIT_MIB"
done
cat << EOF

Device calls, in order and back to back (a machine is given back about 30 s after a
call ends, and /tmp with it); the last one also sets up (10-30 s) and runs the seed and
the crash matrix (docs/runners.md, "GPU loan: staging and runs"):
EOF
last_i=$((NPARTS - 1))
for ((i = 0; i < last_i; i++)); do
    echo "  $((i + 1)). command: mkdir -p /tmp/gpu-parts && cp .gpu/p$i/* /tmp/gpu-parts/   carry: [\".gpu/p$i\"]"
done
echo "  $NPARTS. command: mkdir -p /tmp/gpu-parts && cp .gpu/p$last_i/* /tmp/gpu-parts/ && bash scripts/gpu/device-setup.sh && bash scripts/gpu/runs.sh seed crash   carry: [\".gpu/p$last_i\"]   timeout_s: 600"
echo "Then at once, if status leaves 330 s or more: bash scripts/gpu/runs.sh long   timeout_s: 300; else give_back."
echo "A second loan: the same calls, the last ending in runs.sh long, then runs.sh stress."
