#!/usr/bin/env bash
# Fuzzes pcc's front door: the ONNX checker, the importer and the import
# clean-up pipeline, with libFuzzer under ASan + UBSan
# (tools/pcc-fuzz-import). Idempotent: installs clang 22, its sanitizer and
# fuzzer runtimes and its OpenMP (the runtime links it) only if missing
# (scripts/setup.sh), configures a separate build directory once with
# -DPCC_FUZZ=ON, builds only the fuzz target, seeds the corpus from the
# bundled models and the importer's and the zoo's test models, then fuzzes
# for SECONDS (default 600).
#
#   scripts/fuzz.sh [SECONDS]
#
# Prints the executions, executions per second and corpus size, and every
# crash, leak, timeout or out-of-memory input of this run; exits non-zero
# when there is one (or when libFuzzer failed).
#
# Environment:
#   PCC_FUZZ_BUILD_DIR  build directory (default build-fuzz; the corpus and
#                       the findings live in it, under fuzz/)
#   PCC_JOBS            ninja -j for the build (default: ninja's)
#   PCC_FUZZ_ARGS       extra libFuzzer flags, e.g. "-fork=2 -ignore_crashes=1"
#                       to go on after a finding, or "-runs=N"
#
# Reproduce a finding: build-fuzz/bin/pcc-fuzz-import FILE (an input whose
# first byte is '<' or '#' is ONNX text format, anything else binary).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_FUZZ_BUILD_DIR:-$root/build-fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
seconds="${1:-600}"
fuzzer="$build/bin/pcc-fuzz-import"
clang_bin=/usr/lib/llvm-22/bin

# --- setup and build -------------------------------------------------------
# clang 22 matches MLIR/LLVM 22; libFuzzer and the sanitizer runtimes are in
# libclang-rt-22-dev. Only pcc's own code is instrumented (-fsanitize=
# address,undefined,fuzzer-no-link); MLIR, LLVM, ONNX and protobuf are
# prebuilt. pcc keeps -DNDEBUG like them: LLVM's headers change class
# layouts without it (llvm::Statistic, which MLIR's pass statistics derive
# from), and mixing the two corrupts memory.
PCC_BUILD_DIR="$build" \
PCC_EXTRA_PACKAGES="clang-22 libclang-rt-22-dev libomp-22-dev llvm-22" \
PCC_CMAKE_FLAGS="-DCMAKE_C_COMPILER=$clang_bin/clang \
  -DCMAKE_CXX_COMPILER=$clang_bin/clang++ -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS=-gline-tables-only -DPCC_ENABLE_CUDA=OFF -DPCC_FUZZ=ON" \
PCC_NINJA_ARGS="${PCC_JOBS:+-j$PCC_JOBS} pcc-fuzz-import" \
  "$root/scripts/setup.sh" || exit 1
[ -x "$fuzzer" ] || { echo "pcc fuzz: $fuzzer was not built" >&2; exit 1; }

# --- corpus and dictionary -------------------------------------------------
work="$build/fuzz"
corpus="$work/corpus"
mkdir -p "$corpus" "$work/logs"
# Seeds, named by content so that re-seeding adds nothing twice. Binary
# models (the zoo's dynamo exports keep their weights in model.onnx.data: the
# input is the model proto alone, whose external references then name a
# missing file) and the importer's text-format tests.
shopt -s nullglob globstar
seeds=("$root"/examples/*.onnx "$root"/test/Import/**/*.onnx
  "$root"/test/Import/**/*.onnxtxt "$root"/test/Zoo/models/*/*/model.onnx)
shopt -u globstar
for f in "${seeds[@]}"; do
  sum="$(sha1sum "$f" | cut -c1-40)"
  [ -f "$corpus/$sum" ] || cp "$f" "$corpus/$sum"
done
# The dictionary: op types the importer converts, attribute names it reads,
# and ONNX text-format keywords.
dict="$work/onnx.dict"
{
  grep -ohE 't\["[A-Za-z]+"\]' "$root"/lib/Import/*.cpp | grep -oE '"[A-Za-z]+"'
  grep -ohE '(get[A-Za-z]*|[a-z]*Attr[A-Za-z]*|attribute[A-Za-z]*)\("[a-z_A-Z]+"' \
    "$root"/lib/Import/*.cpp | grep -oE '"[^"]+"'
  for w in ir_version opset_import producer_name domain model_version \
    doc_string float double float16 bfloat16 int64 int32 int8 uint8 bool \
    string batch seq '<' '>' '=>' '[' ']' '{' '}' '(' ')' ',' ':' '""' \
    ai.onnx location offset length; do
    printf '"%s"\n' "$w"
  done
} | sort -u >"$dict"

# --- fuzz ------------------------------------------------------------------
stamp="$(date +%Y%m%d-%H%M%S)"
artifacts="$work/artifacts/$stamp"
log="$work/logs/$stamp.log"
mkdir -p "$artifacts"
before=$(find "$corpus" -type f | wc -l)
echo "pcc fuzz: $seconds s on $corpus ($before inputs), findings to $artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_stack_use_after_return=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export ASAN_SYMBOLIZER_PATH="$clang_bin/llvm-symbolizer"
# The largest bundled model is ~700 KB; -max_len covers every seed.
start=$SECONDS
# shellcheck disable=SC2086
"$fuzzer" "$corpus" -dict="$dict" -max_total_time="$seconds" \
  -max_len=1000000 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" ${PCC_FUZZ_ARGS:-} 2>&1 | tee "$log" |
  grep -vE '^#[0-9]+.*(NEW|REDUCE|pulse)|^\s*NEW_FUNC' | tail -n 80
rc=${PIPESTATUS[0]}
elapsed=$((SECONDS - start))

# --- report ----------------------------------------------------------------
after=$(find "$corpus" -type f | wc -l)
fork_line=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)
if [ -n "$fork_line" ]; then # -fork=N: the parent's progress lines
  execs=$(echo "$fork_line" | grep -oE '^#[0-9]+' | tr -d '#')
  rate=$((execs / (elapsed > 0 ? elapsed : 1)))
  echo "pcc fuzz: fork mode, last status: $fork_line"
else
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
fi
findings=("$artifacts"/*)
echo
echo "pcc fuzz: $(basename "$fuzzer") ran ${execs:-?} inputs in $elapsed s" \
  "(${rate:-?} exec/s); corpus $before -> $after inputs; log $log"
if ((${#findings[@]})); then
  echo "pcc fuzz: ${#findings[@]} finding(s):"
  for f in "${findings[@]}"; do echo "  $f ($(wc -c <"$f") bytes)"; done
  echo "pcc fuzz: reproduce with $fuzzer FILE; shrink with $fuzzer -minimize_crash=1 -runs=10000 FILE"
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "pcc fuzz: libFuzzer exited with $rc (see $log)"
  exit "$rc"
fi
echo "pcc fuzz: no findings"
