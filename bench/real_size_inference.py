#!/usr/bin/env python3
"""Inference at real size: a Hugging Face GPT-2 124M and a ~125M Llama
(the random-init models of bench/mixed_precision.py, exported once by the
dynamo exporter into ~/.cache/pcc/bench/<model>/), batch 4 x 128, in pcc
fp32, pcc bf16 and onnxruntime fp32, in one run, alternating rounds, with
the same threads (OPENBLAS_CORETYPE unset for both sides).

Each round runs `pcc-run --bench N` for each pcc library (the median of its
N runs after the first) and N onnxruntime runs (the median after one
warm-up). Prints the medians over rounds and the ratios (onnxruntime time /
pcc time: above 1 means pcc is faster). With --profile, ends with
`pcc-run --profile`'s table by op kind for each pcc library.

    env -u OPENBLAS_CORETYPE ~/.cache/pcc/zoo-venv/bin/python \\
        bench/real_size_inference.py [--models gpt2 llama] [--rounds 3] \\
        [--runs 5] [--threads 2] [--profile]
"""

import argparse
import os
import re
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mixed_precision as mp  # noqa: E402


def pcc_latency(lib, ids, runs, env):
    out = mp.run([os.path.join(mp.ROOT, "build", "bin", "pcc-run"), lib,
                  "--input", ids, "--bench", str(runs)], env)
    m = re.search(r"latency ms p50 ([0-9.]+)", out)
    if not m:
        sys.exit("real_size_inference.py: no latency in:\n" + out[-2000:])
    return float(m.group(1)) / 1e3


def ort_latency(session, ids, runs):
    session.run(None, {"input_ids": ids})
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, {"input_ids": ids})
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(name, args, env):
    import onnxruntime as ort
    path = os.path.join(mp.CACHE, name, "model.onnx")
    if not os.path.exists(path):
        model, _ = mp.build(name)
        mp.export(name, model, path)
    vocab = 50257 if name == "gpt2" else 32000
    work = os.path.join(mp.CACHE, name, "infer")
    os.makedirs(work, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, vocab, (mp.BATCH, mp.SEQ))
    ids = ids.astype(np.int64)
    ids_path = os.path.join(work, "ids.npy")
    np.save(ids_path, ids)
    libs = {}
    for precision in ("fp32", "bf16"):
        lib = os.path.join(work, "infer-%s.so" % precision)
        t = time.time()
        mp.run([os.path.join(mp.ROOT, "build", "bin", "pcc"), path,
                "--precision=" + precision, "-o", lib], env)
        print("%s: compiled pcc %s in %.0f s" % (name, precision,
                                                 time.time() - t), flush=True)
        libs[precision] = lib
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts,
                                   providers=["CPUExecutionProvider"])
    times = {k: [] for k in ("pcc-fp32", "pcc-bf16", "onnxruntime")}
    for r in range(args.rounds):
        for precision in ("fp32", "bf16"):
            times["pcc-" + precision].append(
                pcc_latency(libs[precision], ids_path, args.runs, env))
        times["onnxruntime"].append(ort_latency(session, ids, args.runs))
        print("%s round %d: %s" % (name, r + 1, "  ".join(
            "%s %.3f s" % (k, v[-1]) for k, v in times.items())), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("\n%s inference, batch %d x %d, %d threads, median of %d rounds:"
          % (name, mp.BATCH, mp.SEQ, args.threads, args.rounds))
    for k, v in med.items():
        print("  %-12s %.1f ms" % (k, v * 1e3))
    print("  pcc fp32 vs onnxruntime: %.2fx" % (
        med["onnxruntime"] / med["pcc-fp32"]))
    print("  pcc bf16 vs onnxruntime: %.2fx" % (
        med["onnxruntime"] / med["pcc-bf16"]))
    if args.profile:
        for precision in ("fp32", "bf16"):
            out = mp.run([os.path.join(mp.ROOT, "build", "bin", "pcc-run"),
                          libs[precision], "--input", ids_path, "--bench",
                          str(args.runs), "--profile"], env)
            table = out[out.index("profile:"):out.index("by function:")]
            print("\n%s pcc %s, where the time goes:\n%s" % (
                name, precision, table.rstrip()))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    for name in args.models:
        bench(name, args, env)


if __name__ == "__main__":
    main()
