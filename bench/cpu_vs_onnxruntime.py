#!/usr/bin/env python3
"""Single-device CPU inference: pcc against onnxruntime, in one run.

For each bundled model and batch size, compiles the model with pcc, times
`pcc-run --bench`, times onnxruntime on the same input with the same number of
threads, checks that both compute the same output, and prints the ratio
(onnxruntime latency / pcc latency: above 1 means pcc is faster).

    bash bench/setup.sh                          # onnxruntime in build/bench-venv
    build/bench-venv/bin/python bench/cpu_vs_onnxruntime.py [--runs 200] [--threads N]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS  # noqa: E402



def time_onnxruntime(model, feed, runs, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for _ in range(10):
        out = session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), out[0]


def time_pcc(build, model, flags, input_path, runs, workdir, name):
    library = os.path.join(workdir, name + ".so")
    subprocess.run([os.path.join(build, "bin", "pcc"), model, *flags, "-o", library],
                   check=True, capture_output=True)
    output = os.path.join(workdir, name + ".out.npy")
    run = subprocess.run([os.path.join(build, "bin", "pcc-run"), library, "--input", input_path,
                          "--output", output, "--bench", str(runs)],
                         check=True, capture_output=True, text=True)
    p50 = float(re.search(r"p50 ([0-9.]+)", run.stdout).group(1))
    return p50, np.load(output)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--build", default=os.environ.get("PCC_BUILD_DIR", os.path.join(ROOT, "build")))
    args = parser.parse_args()

    # Both sides get the same threads: OpenMP and OpenBLAS for pcc.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, {args.runs} timed runs each, onnxruntime {ort.__version__}")
    # Each side uses its own kernels for this CPU: onnxruntime's MLAS does
    # not read OPENBLAS_CORETYPE, which would hold pcc to older ones.
    forced = os.environ.pop("OPENBLAS_CORETYPE", None)
    if forced:
        print(f"(OPENBLAS_CORETYPE={forced} in the environment is not passed to "
              "pcc-run: OpenBLAS picks its kernels for this CPU, as "
              "onnxruntime's MLAS does)")
    cpu = subprocess.run([os.path.join(args.build, "bin", "pcc-run"), "--list-devices"],
                         capture_output=True, text=True).stdout
    if cpu:
        print("pcc-run: " + cpu.splitlines()[0])
    print("| model | batch | pcc p50 ms | onnxruntime p50 ms | ratio (ort / pcc) | max abs diff |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for name, flags, make_input in MODELS:
            model = os.path.join(ROOT, "examples", name + ".onnx")
            input_name = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).get_inputs()[0].name
            for batch in (int(b) for b in args.batches.split(",")):
                x = make_input(batch, rng)
                input_path = os.path.join(workdir, f"{name}_{batch}.npy")
                np.save(input_path, x)
                pcc_ms, pcc_out = time_pcc(args.build, model, flags(batch), input_path, args.runs, workdir,
                                           f"{name}_{batch}")
                ort_ms, ort_out = time_onnxruntime(model, {input_name: x}, args.runs, args.threads)
                diff = float(np.max(np.abs(pcc_out - ort_out)))
                print(f"| {name} | {batch} | {pcc_ms:.3f} | {ort_ms:.3f} | {ort_ms / pcc_ms:.2f} | {diff:.1e} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
