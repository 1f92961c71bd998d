#!/usr/bin/env bash
# Builds ONNX's C++ library (protobuf classes, checker, text parser, operator
# schemas, shape inference) from ONNX's source distribution on PyPI, against
# Debian's own protobuf (libprotobuf-dev + protobuf-compiler), and installs it
# into a cache directory. Debian 12's libonnx-dev is ONNX 1.12 (IR <= 8,
# opset <= 17); current exporters write IR 10 and opsets 18 and later.
#
#   scripts/build-onnx.sh                      # build once, print the prefix
#   prefix="$(scripts/build-onnx.sh)"          # only the prefix is on stdout
#   cmake -DCMAKE_PREFIX_PATH="$prefix" ...    # find_package(ONNX CONFIG)
#
# Environment:
#   PCC_CACHE          cache root (default ~/.cache/pcc); everything lives in
#                      $PCC_CACHE/onnx-<version>/{dl,src,build,install}
#   PCC_ONNX_VERSION   ONNX release (default 1.19.1, the newest whose CMake
#                      accepts Debian 12's cmake 3.25: 1.20 and later need 3.26)
#   PCC_ONNX_JOBS      parallel compile jobs (default: nproc)
#
# Idempotent: once built, a stamp file makes a second run return at once.
# The libraries are static (position independent), so the pcc tools do not
# depend on the cache directory at run time and cannot pick up Debian's
# /usr/lib/x86_64-linux-gnu/libonnx*.so by mistake.
set -euo pipefail

# Progress goes to stderr; stdout carries only the install prefix.
exec 3>&1 1>&2

version="${PCC_ONNX_VERSION:-1.19.1}"
cache="${PCC_CACHE:-$HOME/.cache/pcc}"
root="$cache/onnx-$version"
prefix="$root/install"
stamp="$root/.pcc-built"
jobs="${PCC_ONNX_JOBS:-$(nproc)}"

# sha256 of the sdists this script has been tried with; others are unchecked.
declare -A known_sha256=(
  [1.19.1]=737524d6eb3907d3499ea459c6f01c5a96278bb3a0f2ff8ae04786fb5d7f1ed5
)

die() {
  echo "build-onnx: error: $*"
  exit 1
}

cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DBUILD_SHARED_LIBS=OFF
  -DONNX_BUILD_PYTHON=OFF
  -DONNX_BUILD_TESTS=OFF
  -DONNX_ML=ON
  -DONNX_NAMESPACE=onnx
  -DONNX_USE_PROTOBUF_SHARED_LIBS=ON
  -DONNX_USE_LITE_PROTO=OFF
  -DONNX_BUILD_CUSTOM_PROTOBUF=OFF
  -DONNX_WERROR=OFF
  # Debian's protoc, whose version matches libprotobuf-dev's headers; another
  # protoc earlier on PATH would make ONNX use that one's prefix instead.
  -DProtobuf_PROTOC_EXECUTABLE=/usr/bin/protoc
  # Never download anything (ONNX falls back to fetching protobuf).
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON
  -DCMAKE_INSTALL_LIBDIR=lib
)

# What the stamp records: a change in any of these rebuilds.
stamp_key() {
  printf '%s\n' "onnx $version" "${cmake_flags[*]}" \
    "$(/usr/bin/protoc --version 2>/dev/null || echo no-protoc)" \
    "$(c++ -dumpfullversion 2>/dev/null || echo no-c++)"
}

if [ -f "$stamp" ] && [ -f "$prefix/lib/cmake/ONNX/ONNXConfig.cmake" ] &&
  [ "$(cat "$stamp")" = "$(stamp_key)" ]; then
  echo "$prefix" >&3
  exit 0
fi

# --- Debian packages, only those missing ------------------------------------
missing=()
for p in cmake ninja-build protobuf-compiler libprotobuf-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ! python3 -m pip --version >/dev/null 2>&1; then
  missing+=(python3-pip)
fi
if ((${#missing[@]})); then
  echo "build-onnx: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "not root and no sudo: install ${missing[*]}"
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi
command -v cmake >/dev/null || die "cmake not found"
[ -x /usr/bin/protoc ] || die "/usr/bin/protoc not found (protobuf-compiler)"

mkdir -p "$root"
# One build at a time per version (a second caller waits, then finds the stamp).
exec 9>"$root/.lock"
if command -v flock >/dev/null; then
  flock 9
  if [ -f "$stamp" ] && [ -f "$prefix/lib/cmake/ONNX/ONNXConfig.cmake" ] &&
    [ "$(cat "$stamp")" = "$(stamp_key)" ]; then
    echo "$prefix" >&3
    exit 0
  fi
fi
rm -f "$stamp"

# --- Download the sdist with pip ----------------------------------------------
sdist="$root/dl/onnx-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  echo "build-onnx: downloading onnx==$version (sdist) from PyPI"
  rm -rf "$root/dl"
  mkdir -p "$root/dl"
  log="$root/pip-download.log"
  # --no-binary onnx (not :all:) keeps the sdist for onnx while pip's
  # isolated metadata step may still use wheels of setuptools and protobuf.
  # Without network access for those, retry without build isolation.
  if ! python3 -m pip download --no-deps --no-binary onnx "onnx==$version" \
    -d "$root/dl" >"$log" 2>&1 &&
    ! python3 -m pip download --no-deps --no-binary onnx --no-build-isolation \
      "onnx==$version" -d "$root/dl" >>"$log" 2>&1; then
    tail -n 20 "$log"
    die "could not download the onnx==$version source distribution from PyPI" \
      "with pip (full log: $log)"
  fi
  [ -f "$sdist" ] || die "pip did not produce $sdist (log: $log)"
fi
if [ -n "${known_sha256[$version]:-}" ]; then
  sum="$(sha256sum "$sdist" | cut -d' ' -f1)"
  if [ "$sum" != "${known_sha256[$version]}" ]; then
    rm -f "$sdist"
    die "sha256 of onnx-$version.tar.gz is $sum, expected ${known_sha256[$version]}"
  fi
fi

# --- Extract, configure, build, install -------------------------------------
echo "build-onnx: extracting into $root/src"
rm -rf "$root/src" "$root/src.tmp"
mkdir -p "$root/src.tmp"
tar -xzf "$sdist" -C "$root/src.tmp"
mv "$root/src.tmp/onnx-$version" "$root/src"
rm -rf "$root/src.tmp"

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

echo "build-onnx: configuring (ONNX $version, $jobs jobs)"
rm -rf "$root/build" "$prefix"
cmake "${generator[@]}" -S "$root/src" -B "$root/build" \
  -DCMAKE_INSTALL_PREFIX="$prefix" "${cmake_flags[@]}" >"$root/configure.log" 2>&1 || {
  tail -n 30 "$root/configure.log"
  die "cmake configure failed (log: $root/configure.log)"
}
echo "build-onnx: building (log: $root/build.log)"
start=$SECONDS
cmake --build "$root/build" -j "$jobs" >"$root/build.log" 2>&1 || {
  tail -n 30 "$root/build.log"
  die "build failed (log: $root/build.log)"
}
cmake --install "$root/build" >"$root/install.log" 2>&1 || {
  tail -n 30 "$root/install.log"
  die "install failed (log: $root/install.log)"
}
echo "build-onnx: built and installed in $((SECONDS - start)) s"

stamp_key >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
echo "$prefix" >&3
