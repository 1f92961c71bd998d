#!/usr/bin/env bash
# The GPU suite: the numeric suites of the CPU back end, run on the CUDA
# backend. On a machine without an NVIDIA GPU it prints why and exits 0.
#
#   scripts/test-gpu.sh                 # build, then run everything on cuda:0
#   scripts/test-gpu.sh --prepare DIR   # compile only (no GPU needed)
#   scripts/test-gpu.sh --run DIR       # run DIR with pcc-run only (GPU node)
#
# The split serves clusters whose GPU nodes lack the compiler's toolchain:
# prepare on a build node, copy DIR and build/{bin/pcc-run,lib}, run there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"
data=/usr/share/libonnx-testdata/data
mode="${1:-all}"
dir="${2:-$build/gpu-cases}"

prepare() {
  local out="$1"
  rm -rf "$out" && mkdir -p "$out"
  echo "== compiling ONNX node tests and bundled examples for CUDA into $out"
  "$build/bin/pcc-onnx-conformance" --run --device=cuda --export="$out" \
    --summary-only "$data/node" "$data/pytorch-converted" \
    "$data/pytorch-operator" | tail -n 12
  # The bundled examples, as cases of the same form.
  local name args
  while read -r name args; do
    mkdir -p "$out/examples/$name"
    # shellcheck disable=SC2086
    "$build/bin/pcc" "$root/examples/$name.onnx" $args --target=cuda \
      -o "$out/examples/$name/model.so"
    cp "$root/examples/data/$name.input.npy" "$out/examples/$name/set0.input0.npy"
    cp "$root/examples/data/$name.output.npy" "$out/examples/$name/set0.output0.npy"
    echo "examples/$name set0 1 1" >>"$out/cases.txt"
  done <<'LIST'
mlp --batch=2
transformer_postnorm --batch=2
transformer_prenorm --batch=2
gpt --dim=batch=2 --dim=seq=16
resnet18 --batch=2
LIST
}

run_prepared() {
  local out="$1"
  local devices
  devices="$("$build/bin/pcc-run" --list-devices)"
  if ! grep -q '^cuda:0 (' <<<"$devices"; then
    echo "GPU suite skipped: $(grep '^cuda' <<<"$devices" | head -1)"
    return 0
  fi
  echo "== running on $(grep '^cuda:0' <<<"$devices")"
  "$root/scripts/run-exported.sh" "$out" cuda
}

case "$mode" in
  --prepare) "$root/scripts/setup.sh" >/dev/null; prepare "$dir" ;;
  --run) run_prepared "$dir" ;;
  all)
    "$root/scripts/setup.sh" >/dev/null
    devices="$("$build/bin/pcc-run" --list-devices)"
    if ! grep -q '^cuda:0 (' <<<"$devices"; then
      echo "GPU suite skipped: $(grep '^cuda' <<<"$devices" | head -1)"
      exit 0
    fi
    echo "== GPU lit tests"
    /usr/lib/llvm-22/bin/lit -sv "$build/test/E2E" --filter 'cuda'
    prepare "$dir"
    run_prepared "$dir"
    ;;
  *) echo "usage: test-gpu.sh [--prepare DIR | --run DIR]" >&2; exit 2 ;;
esac
