#!/usr/bin/env bash
# Runs test cases that `pcc-onnx-conformance --run --export=DIR` compiled,
# with pcc-run only (no compiler needed): the way to check the CUDA backend
# on a GPU node that lacks the compiler's toolchain.
#
#   scripts/run-exported.sh DIR [DEVICE] [RTOL] [ATOL]
#     DEVICE  cpu or cuda[:N] (default cuda)
#     env PCC_RUN   the pcc-run binary (default: build/bin/pcc-run)
#     env JOBS      cases run in parallel (default: number of cores)
#
# Prints one line per failing case, a table per suite and the totals; the
# exit status is 1 when any case failed.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:?usage: run-exported.sh DIR [DEVICE] [RTOL] [ATOL]}"
device="${2:-cuda}"
rtol="${3:-1e-4}"
atol="${4:-1e-5}"
run="${PCC_RUN:-$root/build/bin/pcc-run}"
jobs="${JOBS:-$(nproc)}"
[ -f "$dir/cases.txt" ] || { echo "run-exported: error: no $dir/cases.txt" >&2; exit 1; }
[ -x "$run" ] || { echo "run-exported: error: pcc-run not found at $run (set PCC_RUN)" >&2; exit 1; }

run_case() {
  local test="$1" set="$2" nin="$3" nout="$4"
  local args=() i
  for ((i = 0; i < nin; i++)); do args+=(--input "$dir/$test/$set.input$i.npy"); done
  for ((i = 0; i < nout; i++)); do args+=(--expect "$dir/$test/$set.output$i.npy"); done
  local out
  if out=$("$run" "$dir/$test/model.so" --device "$device" --rtol "$rtol" \
             --atol "$atol" "${args[@]}" 2>&1); then
    echo "PASS $test $set"
  else
    echo "FAIL $test $set: $(echo "$out" | grep -E 'error|MISMATCH|outside' | head -2 | tr '\n' ' ')"
  fi
}
export -f run_case
export dir device rtol atol run

start=$(date +%s)
results="$(xargs -P "$jobs" -L 1 bash -c 'run_case "$@"' _ <"$dir/cases.txt")"
elapsed=$(( $(date +%s) - start ))
echo "$results" | grep '^FAIL' | sort || true
echo
echo "| suite | data sets passed | failed |"
echo "|---|---|---|"
echo "$results" | awk '{split($2, p, "/"); s[p[1]]; if ($1 == "PASS") ok[p[1]]++; else bad[p[1]]++}
  END {for (k in s) printf "| %s | %d | %d |\n", k, ok[k], bad[k]}' | sort
passed=$(echo "$results" | grep -c '^PASS' || true)
failed=$(echo "$results" | grep -c '^FAIL' || true)
echo
echo "run-exported: $passed passed, $failed failed on $device (rtol $rtol, atol $atol) in ${elapsed}s"
[ "$failed" -eq 0 ]
