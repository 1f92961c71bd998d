#!/usr/bin/env bash
# Creates (once) the Python virtual environment used to regenerate the model
# zoo in test/Zoo/models with scripts/zoo/export.py. It lives OUTSIDE the repo:
#
#   ${PCC_ZOO_VENV:-$HOME/.cache/pcc/zoo-venv}
#
# and holds torch, transformers, onnx, onnxscript (from PyPI; ~6 GB) and, when
# installable, onnxruntime (used only to cross-check the exported models).
# Idempotent: when everything is already there it returns in about a second.
# pcc's own build and test suite never need this environment.
#
#   scripts/zoo/setup-venv.sh
#   "${PCC_ZOO_VENV:-$HOME/.cache/pcc/zoo-venv}/bin/python" scripts/zoo/export.py
set -euo pipefail

venv="${PCC_ZOO_VENV:-$HOME/.cache/pcc/zoo-venv}"
py="${PYTHON:-python3}"
required=(torch transformers onnx onnxscript)
optional=(onnxruntime)

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

# 1. The venv itself. Debian's python3 needs python3-venv (ensurepip) for
#    that: install it when the first try fails, then try again.
if [ ! -x "$venv/bin/python" ] || [ ! -x "$venv/bin/pip" ]; then
  echo "zoo venv: creating $venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$py" -m venv --clear "$venv" >/dev/null 2>&1; then
    echo "zoo venv: installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    "$py" -m venv --clear "$venv"
  fi
fi
vpy="$venv/bin/python"

# 2. Packages: install only those not there yet (find_spec: no slow imports).
absent() {
  "$vpy" -c 'import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@"
}
read -r -a missing <<<"$(absent "${required[@]}")"
if ((${#missing[@]})); then
  echo "zoo venv: pip install ${missing[*]}"
  "$vpy" -m pip install -q --upgrade pip
  "$vpy" -m pip install -q "${missing[@]}"
fi
for m in $(absent "${optional[@]}"); do
  echo "zoo venv: pip install $m (optional)"
  "$vpy" -m pip install -q "$m" || echo "zoo venv: $m not installable; models will not be cross-checked"
done

"$vpy" - <<'EOF'
from importlib import metadata
out = []
for m in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "numpy"):
    try:
        out.append(f"{m} {metadata.version(m)}")
    except metadata.PackageNotFoundError:
        out.append(f"{m} (missing)")
print("zoo venv: " + ", ".join(out))
EOF
