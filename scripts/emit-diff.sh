#!/usr/bin/env bash
# Whether a change altered what pcc produces: compiles the bundled example
# models under a spread of plans (inference with tp and pp, training with
# tp, sp, dp, ZeRO 1-3, buckets, 3D, every schedule, recomputation, a
# --mem-cap fit, offload on CUDA) with two pcc binaries and compares their
# --emit=mlir and --emit=cpp outputs byte for byte. For refactors that
# promise unchanged IR and libraries (issue 32).
#
#   scripts/emit-diff.sh OLD_PCC [NEW_PCC]     # NEW_PCC: build/bin/pcc
#
# Prints one line per configuration and output, "same" or "DIFFERS" with the
# first differing lines; exits 1 when any differs. The outputs stay in
# $PCC_EMIT_DIFF_WORK (default a temporary directory, printed).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
old="${1:?usage: scripts/emit-diff.sh OLD_PCC [NEW_PCC]}"
new="${2:-$root/build/bin/pcc}"
for tool in "$old" "$new"; do
  [[ -x "$tool" ]] || { echo "emit-diff: no executable pcc at $tool" >&2; exit 2; }
done
work="${PCC_EMIT_DIFF_WORK:-$(mktemp -d)}"
mkdir -p "$work"
ex="$root/examples"
echo "emit-diff: $old against $new, outputs in $work"

# name|model|flags
configs=(
  "mlp-tp2|$ex/mlp.onnx|--batch=8 --tp=2"
  "gpt-tp2|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --tp=2"
  "gpt-pp2-chunks|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --pp=2 --pp-chunks=2 --microbatches=4"
  "resnet-tp2|$ex/resnet18.onnx|--batch=2 --tp=2"
  "mlp-train|$ex/mlp.onnx|--batch=8 --train --loss=mse --optimizer=sgd"
  "gpt-train-tp2-sp|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --tp=2 --sp"
  "gpt-train-dp2-buckets|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --dp=2 --bucket-mb=0.01"
  "gpt-train-dp2-z1|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --dp=2 --zero=1"
  "gpt-train-dp2-z2|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --dp=2 --zero=2"
  "gpt-train-dp2-z3|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --dp=2 --zero=3 --zero-prefetch=1"
  "gpt-train-3d|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --tp=2 --pp=2 --dp=2 --zero=1 --microbatches=2"
  "gpt-train-pp2-gpipe|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --pp=2 --microbatches=4 --schedule=gpipe"
  "gpt-train-pp2-zbh1-z2|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --pp=2 --dp=2 --zero=2 --microbatches=4 --schedule=zb-h1"
  "gpt-train-pp2-interleaved-z3|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --pp=2 --pp-chunks=2 --dp=2 --zero=3 --microbatches=4"
  "gpt-train-recompute|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --pp=2 --microbatches=2 --recompute=full,selective"
  "gpt-train-memcap|$ex/gpt.onnx|--dim=batch=8 --dim=seq=16 --train --loss=cross_entropy --pp=2 --microbatches=4 --mem-cap=2MiB"
  "resnet-train-dp2-z1|$ex/resnet18_train.onnx|--batch=4 --train --loss=cross_entropy --dp=2 --zero=1"
  "mlp-train-offload-cuda|$ex/mlp.onnx|--batch=8 --train --loss=mse --optimizer=adamw --dp=2 --zero=1 --offload=optimizer --target=cuda"
)

status=0
for entry in "${configs[@]}"; do
  IFS='|' read -r name model flags <<<"$entry"
  for emit in mlir cpp; do
    for side in old new; do
      tool="$old"; [[ $side == new ]] && tool="$new"
      # shellcheck disable=SC2086
      # The same output path for both, since messages may name it.
      rm -f "$work/$name.$emit"
      "$tool" "$model" $flags --emit="$emit" -o "$work/$name.$emit" \
        >"$work/$name.$side.$emit.log" 2>&1
      echo "exit $?" >>"$work/$name.$side.$emit.log"
      rm -f "$work/$name.$side.$emit"
      [[ -e "$work/$name.$emit" ]] && mv "$work/$name.$emit" "$work/$name.$side.$emit"
    done
    a="$work/$name.old.$emit" b="$work/$name.new.$emit"
    if cmp -s "$work/$name.old.$emit.log" "$work/$name.new.$emit.log" &&
      { [[ ! -e $a && ! -e $b ]] || cmp -s "$a" "$b"; }; then
      # A refusal on both sides is the same too, but say so.
      refused="$(grep -v '^exit 0$' "$work/$name.new.$emit.log" | grep '^exit' || true)"
      printf '  same     %-30s %-5s %s\n' "$name" "$emit" \
        "${refused:+(both $refused: $(head -c 100 "$work/$name.new.$emit.log"))}"
    else
      printf '  DIFFERS  %-30s %s\n' "$name" "$emit"
      diff "$a" "$b" 2>&1 | head -8 | sed 's/^/           /'
      diff "$work/$name.old.$emit.log" "$work/$name.new.$emit.log" | head -4 |
        sed 's/^/           /'
      status=1
    fi
  done
done
exit $status
