#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite: the lit suite
# (dialect, importer, driver, examples, ONNX conformance) and the GoogleTest
# unit tests. Ends with one line "pcc: N passed, M failed".
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"
# PCC_SANITIZE=1: the same suite on pcc built with ASan + UBSan.
# shellcheck source=scripts/sanitize-env.sh
. "$root/scripts/sanitize-env.sh"
"$root/scripts/setup.sh" || exit 1
export PATH="/usr/lib/llvm-22/bin:$PATH"

passed=0
failed=0

echo "== lit suite"
lit_out="$(mktemp)"
/usr/lib/llvm-22/bin/lit -sv --show-unsupported "$build/test" | tee "$lit_out"
lit_rc=${PIPESTATUS[0]}
p=$(grep -oE "Passed *: *[0-9]+" "$lit_out" | grep -oE "[0-9]+$" || echo 0)
f=$(grep -oE "Failed *: *[0-9]+" "$lit_out" | grep -oE "[0-9]+$" || echo 0)
u=$(grep -oE "Unsupported *: *[0-9]+" "$lit_out" | grep -oE "[0-9]+$" || echo 0)
if [ "${u:-0}" != 0 ]; then
  # The GPU tests need an NVIDIA GPU: say what this machine lacks.
  gpu="$("$build/bin/pcc-run" --list-devices 2>&1 | grep '^cuda' | head -1)"
  echo "lit: $u test(s) unsupported here, listed above; GPU: ${gpu:-unknown}"
  echo "lit: on a machine with an NVIDIA GPU, scripts/test-gpu.sh runs the GPU suite"
  # The onnxruntime checks need the zoo's virtual environment (test/lit.cfg.py).
  if ! "$HOME/.cache/pcc/zoo-venv/bin/python" -c "import onnxruntime" >/dev/null 2>&1; then
    echo "lit: onnxruntime: not in ~/.cache/pcc/zoo-venv (bash scripts/zoo/setup-venv.sh installs it; tests marked REQUIRES: onnxruntime are unsupported without it)"
  fi
fi
passed=$((passed + ${p:-0}))
failed=$((failed + ${f:-0}))
if [ "$lit_rc" -ne 0 ] && [ "${f:-0}" = 0 ]; then failed=$((failed + 1)); fi
rm -f "$lit_out"

echo "== unit tests"
if [ -x "$build/unittests/pcc-unittests" ]; then
  ut_out="$(mktemp)"
  "$build/unittests/pcc-unittests" --gtest_brief=1 | tee "$ut_out"
  ut_rc=${PIPESTATUS[0]}
  total=$(grep -oE "^\[==========\] [0-9]+ tests" "$ut_out" | grep -oE "[0-9]+" | head -1)
  bad=$(grep -cE "^\[  FAILED  \] [A-Za-z]" "$ut_out" || true)
  passed=$((passed + ${total:-0} - ${bad:-0}))
  failed=$((failed + ${bad:-0}))
  if [ "$ut_rc" -ne 0 ] && [ "${bad:-0}" = 0 ]; then failed=$((failed + 1)); fi
  rm -f "$ut_out"
else
  echo "unit tests not built (GoogleTest missing)"; failed=$((failed + 1))
fi

echo
echo "pcc: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
