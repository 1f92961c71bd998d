#!/usr/bin/env bash
# Installs the Debian packages pcc needs (only those missing), configures the
# build directory once and builds everything with ninja. Idempotent: a second
# run with nothing to do takes a few seconds.
#
#   scripts/setup.sh            # install + build into ./build
#   PCC_BUILD_DIR=out scripts/setup.sh
#
# Other builds (sanitizers, fuzzing) pass extra Debian packages, configure
# flags and ninja arguments (targets, -j) through the environment:
#   PCC_EXTRA_PACKAGES="clang-22" PCC_CMAKE_FLAGS="-DPCC_SANITIZE=ON" \
#   PCC_NINJA_ARGS="-j1 pcc" PCC_BUILD_DIR=build-asan scripts/setup.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"

packages=(
  cmake ninja-build g++ lld git
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  libonnx-testdata libprotobuf-dev protobuf-compiler
  libgtest-dev nlohmann-json3-dev
  libopenblas-dev libopenblas0-openmp libdnnl-dev openmpi-bin libopenmpi-dev
  python3 python3-numpy
)
read -r -a extra_packages <<<"${PCC_EXTRA_PACKAGES:-}"
packages+=("${extra_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "pcc setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ONNX's C++ library, current enough for today's exporters (IR 10+, opset
# 18+), built once from its PyPI source release into ~/.cache/pcc.
onnx_prefix="$("$root/scripts/build-onnx.sh")"

# Configure once; again when the build directory predates the ONNX prefix.
if [ ! -f "$build/build.ninja" ] ||
   ! grep -q "^PCC_ONNX_PREFIX:PATH=$onnx_prefix\$" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "pcc setup: configuring $build"
  # shellcheck disable=SC2086
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
    -DPCC_ONNX_PREFIX="$onnx_prefix" ${PCC_CMAKE_FLAGS:-} >"$build.cmake.log" 2>&1 || {
      cat "$build.cmake.log"; echo "pcc setup: cmake failed" >&2; exit 1; }
fi

echo "pcc setup: building (ninja -C $build; a first build takes a few minutes)"
# Two cores and ~0.5-1 GB per translation unit: ninja's default -j is fine.
ninja -C "$build" ${PCC_NINJA_ARGS:-}
echo "pcc setup: done; tools in $build/bin"
