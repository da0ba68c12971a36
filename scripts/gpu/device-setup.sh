#!/bin/bash
# On the device machine, from the project's root, after every part was copied to
# /tmp/gpu-parts (one call per part; scripts/gpu/build-payload.sh prints the calls):
# install CUDA vLLM, its missing dependencies and this checkout's harness into the image's
# Python (`python3`, /opt/torch/.venv/bin/python3 there). 10-30 s.
#
#   bash scripts/gpu/device-setup.sh && bash scripts/gpu/runs.sh seed crash
#
# Errors are one line on stderr, exit 2 (what pip said before it, filtered of warnings).
set -euo pipefail
P=${GPU_PARTS:-/tmp/gpu-parts}

die() {
    echo "device-setup: $*" >&2
    exit 2
}

# A pip command, its warnings dropped; a failure prints its last lines and one line more.
pip_quiet() {
    local what=$1 out
    shift
    if ! out=$("$@" 2>&1); then
        printf '%s\n' "$out" | grep -vi warning | tail -n 20 >&2 || true
        die "$what failed"
    fi
    printf '%s\n' "$out" | grep -vi warning || true
}

command -v python3 > /dev/null || die "missing tool: python3"
[ -f "$P/payload.sha" ] || die "no $P/payload.sha: copy the last part to $P first"
parts=("$P"/part*)
[ -f "${parts[0]}" ] || die "no parts in $P: copy every .gpu/pN there first"
cat "${parts[@]}" > /tmp/payload.tar
want=$(cat "$P/payload.sha")
got=$(sha256sum /tmp/payload.tar | cut -d' ' -f1)
[ "$want" = "$got" ] || die "payload sha mismatch with ${#parts[@]} parts: $got, want $want (a part is missing? the machine was given back between calls?)"
mkdir -p /tmp/pl /tmp/site
tar -xf /tmp/payload.tar -C /tmp/pl && rm -f /tmp/payload.tar
# The vLLM tree: xz (build-payload.sh's default) with the image's xz, else Python's lzma;
# or gzip (COMPRESS=gz there).
if [ -f /tmp/pl/vllm.txz ]; then
    if command -v xz > /dev/null; then
        tar -xJf /tmp/pl/vllm.txz -C /tmp/site || die "unpacking vllm.txz failed"
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
            /tmp/pl/vllm.txz /tmp/site || die "unpacking vllm.txz (Python's lzma) failed"
    fi
    rm -f /tmp/pl/vllm.txz
elif [ -f /tmp/pl/vllm.tgz ]; then
    tar -xzf /tmp/pl/vllm.tgz -C /tmp/site || die "unpacking vllm.tgz failed"
    rm -f /tmp/pl/vllm.tgz
else
    die "the payload holds no vLLM tree (vllm.txz or vllm.tgz)"
fi
# Bytecode now, on 16 cores: without it the first launch spends ~20 s compiling vLLM.
(python3 -m compileall -q -j 16 /tmp/site/vllm > /dev/null 2>&1) &
compiling=$!
# typer and click replace the image's own (typer 0.27.2 there is too old); the rest is new.
wheels=()
for w in /tmp/pl/deps/*.whl; do
    case $w in
        */typer-* | */click-*) ;;
        *) wheels+=("$w") ;;
    esac
done
pip_quiet "typer and click over the image's" python3 -m pip install -q --no-index --no-deps \
    --no-compile --upgrade /tmp/pl/deps/typer-*.whl /tmp/pl/deps/click-*.whl
pip_quiet "vLLM's dependencies into /tmp/site" python3 -m pip install -q --no-index --no-deps \
    --no-compile --target /tmp/site "${wheels[@]}"
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
echo /tmp/site > "$site/zz-gpu-payload.pth"
pip_quiet "the harness (pip install .)" python3 -m pip install -q --no-index --no-deps \
    --no-build-isolation .
wait "$compiling" || true
python3 - << 'EOF' || die "the staged vLLM does not import (above)"
import sys, torch, vllm, typer
print(f"python {sys.executable} torch {torch.__version__} vllm {vllm.__version__} "
      f"typer {typer.__version__} gpu {torch.cuda.get_device_name(0)}")
EOF
echo "ready: bash scripts/gpu/runs.sh seed crash (runs.sh sets VLLM_USE_FLASHINFER_SAMPLER=0: flashinfer is not carried)"
