#!/usr/bin/env bash
# Sets up and builds pcc (scripts/setup.sh), then compiles the bundled
# GPT-style model to a model library and runs it with pcc-run on the
# reference input, printing its agreement with PyTorch's output.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"

out="$build/quickstart"
mkdir -p "$out"
cd "$root"
run() { echo "\$ $*"; "$@"; echo; }
echo
run "$build/bin/pcc" examples/gpt.onnx --dim=batch=2 --dim=seq=16 -o "$out/gpt.so"
run "$build/bin/pcc-run" "$out/gpt.so" --info
run "$build/bin/pcc-run" "$out/gpt.so" --input examples/data/gpt.input.npy \
  --output "$out/logits.npy" --expect examples/data/gpt.output.npy --bench 20
echo "The IR after each pass: pcc examples/gpt.onnx --dim=batch=2 --dim=seq=16 --emit=mlir --mlir-print-ir-after-all"
