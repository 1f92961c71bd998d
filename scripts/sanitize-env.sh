# Sourced by scripts/test.sh and scripts/fuzz-plans.sh (with `root` and
# `build` set). PCC_SANITIZE=1: pcc built with ASan + UBSan by clang 22, in
# its own build directory (the model libraries pcc builds stay
# uninstrumented; the instrumented pcc-run loads them); sets `build` and
# exports what scripts/setup.sh and the sanitizers read.
# shellcheck shell=bash
if [ "${PCC_SANITIZE:-0}" = 1 ]; then
  build="${PCC_BUILD_DIR:-$root/build-asan}"
  export PCC_BUILD_DIR="$build"
  export PCC_EXTRA_PACKAGES="${PCC_EXTRA_PACKAGES:-} clang-22 libclang-rt-22-dev libomp-22-dev llvm-22"
  export PCC_CMAKE_FLAGS="${PCC_CMAKE_FLAGS:-} -DPCC_SANITIZE=ON \
    -DCMAKE_C_COMPILER=/usr/lib/llvm-22/bin/clang \
    -DCMAKE_CXX_COMPILER=/usr/lib/llvm-22/bin/clang++ \
    -DCMAKE_CXX_FLAGS=-gline-tables-only"
  # No leak checks by default: OpenMPI's components, unloaded by
  # MPI_Finalize, leave ~120 KB per rank that LSan reports with no usable
  # stack (so no suppression can name it). The tests without MPI also pass
  # with ASAN_OPTIONS=detect_leaks=1.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-22/bin/llvm-symbolizer
fi
