#!/usr/bin/env bash
# Prepares the peer for the CPU benchmark: a virtual environment in
# build/bench-venv that sees Debian's numpy and onnx and has onnxruntime from
# PyPI. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PCC_BUILD_DIR:-$root/build}/bench-venv"
need=()
for p in python3-venv python3-numpy python3-onnx; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if ! "$venv/bin/python" -c "import onnxruntime" 2>/dev/null; then
  "$venv/bin/pip" install -q onnxruntime
fi
"$venv/bin/python" -c "import onnxruntime, numpy; print('onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"
