#!/usr/bin/env python3
"""Training step time on the CPU: pcc against PyTorch eager, in one run.

For each bundled model (MLP, post-norm encoder, GPT) at a given batch,
compiles a training step with pcc (`--train`, AdamW), times `pcc-run
--steps` (median step time from its loss log), and times PyTorch's eager
step (zero_grad, forward, loss, backward, AdamW step; foreach=False) of the
same module from the same ONNX weights, with the same number of threads.
Prints both and the ratio (PyTorch time / pcc time: above 1 means pcc is
faster), pcc's model-state, saved-activation and arena bytes, and `pcc
--explain`'s predicted training memory against the high-water mark pcc-run
measures.

    ~/.cache/pcc/zoo-venv/bin/python bench/train_step.py [--threads 2] [--steps 60]
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "Training"))
import make_reference  # noqa: E402  (rebuilds the modules from the ONNX)

CASES = [
    # name, pcc flags, loss, batch, input maker
    ("mlp", ["--batch={b}"], "cross_entropy", 64),
    ("transformer_postnorm", ["--batch={b}"], "mse", 16),
    ("gpt", ["--dim=batch={b}", "--dim=seq=64"], "cross_entropy", 16),
    ("resnet18_train", ["--batch={b}"], "cross_entropy", 16),
]


def data(name, batch, rng):
    if name == "mlp":
        return (rng.standard_normal((batch, 64)).astype(np.float32),
                rng.integers(0, 32, batch).astype(np.int64))
    if name.startswith("transformer"):
        return (rng.standard_normal((batch, 16, 64)).astype(np.float32),
                rng.standard_normal((batch, 16, 64)).astype(np.float32))
    if name.startswith("resnet18"):
        return (rng.standard_normal((batch, 3, 32, 32)).astype(np.float32),
                rng.integers(0, 10, batch).astype(np.int64))
    ids = rng.integers(0, 512, (batch, 64)).astype(np.int64)
    return ids, np.roll(ids, -1, axis=1)


def time_pcc(name, flags, loss, batch, x, y, steps, threads, tmp):
    lib = os.path.join(tmp, name + ".so")
    compile_cmd = [os.path.join(ROOT, "build", "bin", "pcc"),
                   os.path.join(ROOT, "examples", name + ".onnx"), "--train",
                   "--loss=" + loss, "--optimizer=adamw"] + \
        [f.format(b=batch) for f in flags]
    subprocess.run(compile_cmd + ["-o", lib], check=True, capture_output=True)
    report = subprocess.run(compile_cmd + ["--explain"], check=True,
                            capture_output=True, text=True).stdout
    predicted = float(re.search(r"total\s+([\d.]+) MiB", report).group(1))
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "y.npy"), y)
    log = os.path.join(tmp, name + ".csv")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([os.path.join(ROOT, "build", "bin", "pcc-run"), lib,
                          "--steps", str(steps), "--input",
                          os.path.join(tmp, "x.npy"), "--labels",
                          os.path.join(tmp, "y.npy"), "--lr", "1e-4",
                          "--loss-log", log, "--log-every", str(steps)],
                         check=True, capture_output=True, text=True, env=env)
    ms = [float(r["step_ms"]) for r in csv.DictReader(open(log))]
    memory = re.search(r"model state ([\d.]+) MiB \(\d+ bytes\), saved "
                       r"activations ([\d.]+) MiB, arena ([\d.]+) MiB",
                       out.stdout)
    measured = float(re.search(r"memory high-water ([\d.]+) MiB",
                               out.stdout).group(1))
    return statistics.median(ms[5:]), memory.groups(), predicted, measured


def time_torch(name, loss, x, y, steps, threads):
    torch.set_num_threads(threads)
    model, _, _ = make_reference.prepare(name)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(xt)
        if loss == "mse":
            l = F.mse_loss(out, yt)
        else:
            l = F.cross_entropy(out.reshape(-1, out.shape[-1]), yt.reshape(-1))
        l.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[5:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print("training step, AdamW, %d threads, median of %d steps"
          % (args.threads, args.steps - 5))
    print("| model | batch | pcc ms | PyTorch eager ms | PyTorch / pcc | "
          "pcc state / saved activations / arena MiB | predicted (--explain) "
          "/ measured high-water MiB | error |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags, loss, batch in CASES:
            x, y = data(name, batch, rng)
            pcc_ms, mem, predicted, measured = time_pcc(
                name, flags, loss, batch, x, y, args.steps, args.threads, tmp)
            torch_ms = time_torch(name, loss, x, y, args.steps, args.threads)
            print("| %s | %d | %.2f | %.2f | %.2fx | %s / %s / %s | %.3f / "
                  "%.3f | %.2f%% |"
                  % (name, batch, pcc_ms, torch_ms, torch_ms / pcc_ms, *mem,
                     predicted, measured,
                     100 * abs(predicted - measured) / measured),
                  flush=True)


if __name__ == "__main__":
    main()
