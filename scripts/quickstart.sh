#!/usr/bin/env bash
# Sets up and builds pcc (scripts/setup.sh), then compiles the bundled
# GPT-style model: imports examples/gpt.onnx with batch 2 and sequence 16,
# runs the pipeline, writes the IR to build/gpt.mlir and prints a summary.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"

model="$root/examples/gpt.onnx"
out="$build/gpt.mlir"
echo
echo "\$ pcc examples/gpt.onnx --dim=batch=2 --dim=seq=16 --emit=mlir -o $out"
"$build/bin/pcc" "$model" --dim=batch=2 --dim=seq=16 --emit=mlir -o "$out"
echo
echo "IR written to $out ($(wc -l < "$out") lines). The entry function:"
grep -m1 "func.func @main" "$out" | sed 's/^ *//' | cut -c1-200
echo
echo "Op histogram:"
grep -oE "= pcc\.[a-z_]+" "$out" | sed 's/= //' | sort | uniq -c | sort -rn
echo
echo "Summary from the pcc-model-stats pass:"
"$build/bin/pcc-opt" "$out" \
  --pass-pipeline='builtin.module(func.func(pcc-model-stats{emit-remark=true}))' \
  -o /dev/null 2>&1 | grep -oE "remark: .*" | head -1
