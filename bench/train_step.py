#!/usr/bin/env python3
"""Training step time: pcc against PyTorch eager, in one run, on the CPU or
on a GPU.

For each bundled model (MLP, post-norm encoder, GPT) at a given batch,
compiles a training step with pcc (`--train`, AdamW), times `pcc-run
--steps` (median step time from its loss log), and times PyTorch's eager
step (zero_grad, forward, loss, backward, AdamW step; foreach=False) of the
same module from the same ONNX weights, with the same number of threads.
Prints both and the ratio (PyTorch time / pcc time: above 1 means pcc is
faster), pcc's model-state, saved-activation and arena bytes, and `pcc
--explain`'s predicted training memory against the high-water mark pcc-run
measures.

    ~/.cache/pcc/zoo-venv/bin/python bench/train_step.py [--threads 2] [--steps 60] [--rounds 5]

On a GPU (`--device cuda`) both sides run on cuda:0 in fp32 (TF32 off) and
each step ends with a synchronisation (pcc-run reads the loss every step,
so PyTorch's step waits for its loss too). Every model runs at its CPU
batch and at 8 times that. GPU nodes often lack pcc's toolchain, so the
libraries can be compiled elsewhere:

    python3 bench/train_step.py --device cuda --prepare DIR   # build node
    python3 bench/train_step.py --device cuda --run DIR       # GPU node
        (DIR/bin/pcc-run and DIR/lib from scripts/test-gpu.sh --prepare)
"""

import argparse
import csv
import json
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


def compile_pcc(name, flags, loss, batch, target, tmp):
    """Compiles the training library into tmp and returns --explain's
    predicted training memory (MiB)."""
    tag = "%s_%d" % (name, batch)
    compile_cmd = [os.path.join(ROOT, "build", "bin", "pcc"),
                   os.path.join(ROOT, "examples", name + ".onnx"), "--train",
                   "--loss=" + loss, "--optimizer=adamw",
                   "--target=" + target] + [f.format(b=batch) for f in flags]
    subprocess.run(compile_cmd + ["-o", os.path.join(tmp, tag + ".so")],
                   check=True, capture_output=True)
    report = subprocess.run(compile_cmd + ["--explain"], check=True,
                            capture_output=True, text=True).stdout
    return float(re.search(r"total\s+([\d.]+) MiB", report).group(1))


def time_pcc(name, batch, x, y, steps, threads, tmp, run_binary, device):
    tag = "%s_%d" % (name, batch)
    lib = os.path.join(tmp, tag + ".so")
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "y.npy"), y)
    log = os.path.join(tmp, tag + ".csv")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([run_binary, lib, "--device", device,
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
    return ms[5:], memory.groups(), measured


class TorchStep:
    """PyTorch's eager training step of the model, timed a round at a
    time (the model and optimizer carry on from round to round)."""

    def __init__(self, name, loss, x, y, threads, device):
        torch.set_num_threads(threads)
        self.model, _, _ = make_reference.prepare(name)
        self.model.train()
        self.model.to(device)
        self.cuda = device.startswith("cuda")
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        # foreach=False on the CPU (one update per tensor, as pcc's CPU
        # loop); PyTorch's default multi-tensor update on the GPU, its fast
        # path there.
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4,
                                     foreach=True if self.cuda else False)
        self.loss = loss
        self.xt = torch.from_numpy(x).to(device)
        self.yt = torch.from_numpy(y).to(device)

    def round(self, steps):
        """Step times in ms, the first 5 (warm-up) left out."""
        times = []
        for _ in range(steps):
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            out = self.model(self.xt)
            if self.loss == "mse":
                l = F.mse_loss(out, self.yt)
            else:
                l = F.cross_entropy(out.reshape(-1, out.shape[-1]),
                                    self.yt.reshape(-1))
            l.backward()
            self.opt.step()
            if self.cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
        return times[5:]


def cases(device):
    """(name, flags, loss, batch): the CPU batches; on a GPU each at 8x too."""
    out = []
    for name, flags, loss, batch in CASES:
        out.append((name, flags, loss, batch))
        if device != "cpu":
            out.append((name, flags, loss, 8 * batch))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60,
                    help="steps per round (the first 5 are not timed)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds per model, pcc and PyTorch taking turns")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--prepare", metavar="DIR",
                    help="compile only, into DIR (no GPU needed)")
    ap.add_argument("--run", metavar="DIR",
                    help="time the libraries compiled into DIR before")
    args = ap.parse_args()
    target = "cpu" if args.device == "cpu" else "cuda"
    if args.prepare:
        os.makedirs(args.prepare, exist_ok=True)
        predicted = {}
        for name, flags, loss, batch in cases(args.device):
            predicted["%s_%d" % (name, batch)] = compile_pcc(
                name, flags, loss, batch, target, args.prepare)
            print("compiled %s at batch %d" % (name, batch), flush=True)
        with open(os.path.join(args.prepare, "predicted.json"), "w") as f:
            json.dump(predicted, f)
        return
    run_binary = os.path.join(ROOT, "build", "bin", "pcc-run")
    if args.run and os.path.exists(os.path.join(args.run, "bin", "pcc-run")):
        run_binary = os.path.join(args.run, "bin", "pcc-run")
    rng = np.random.default_rng(0)
    where = ("%d threads" % args.threads if args.device == "cpu" else
             torch.cuda.get_device_name(0) + ", fp32, TF32 off")
    print("training step, AdamW, %s, median of %d rounds of %d steps, "
          "pcc and PyTorch taking turns" % (where, args.rounds,
                                            args.steps - 5))
    # Each side uses its BLAS's own kernels for this CPU: PyTorch's MKL does
    # not read OPENBLAS_CORETYPE, which would hold pcc to older ones.
    forced = os.environ.pop("OPENBLAS_CORETYPE", None)
    if forced:
        print("(OPENBLAS_CORETYPE=%s in the environment is not passed to "
              "pcc-run: OpenBLAS picks its kernels for this CPU, as PyTorch's "
              "MKL does)" % forced)
    if args.device == "cpu":
        cpu = subprocess.run(
            [run_binary, "--list-devices"], capture_output=True, text=True,
            env=dict(os.environ, OMP_NUM_THREADS=str(args.threads))).stdout
        if cpu:
            print("pcc-run: " + cpu.splitlines()[0])
    print("| model | batch | pcc ms | PyTorch eager ms | PyTorch / pcc | "
          "pcc state / saved activations / arena MiB | predicted (--explain) "
          "/ measured high-water MiB | error |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.run or scratch
        predicted = {}
        if args.run:
            predicted = json.load(open(os.path.join(tmp, "predicted.json")))
        for name, flags, loss, batch in cases(args.device):
            tag = "%s_%d" % (name, batch)
            if not args.run:
                predicted[tag] = compile_pcc(name, flags, loss, batch, target,
                                             tmp)
            x, y = data(name, batch, rng)
            # The two take turns, a round each, so that a slow spell of a
            # shared machine falls on both alike; each side's time is the
            # median over all its rounds' steps.
            torch_step = TorchStep(name, loss, x, y, args.threads,
                                   args.device)
            pcc_times, torch_times = [], []
            for _ in range(args.rounds):
                times, mem, measured = time_pcc(
                    name, batch, x, y, args.steps, args.threads, tmp,
                    run_binary, args.device)
                pcc_times += times
                torch_times += torch_step.round(args.steps)
            pcc_ms = statistics.median(pcc_times)
            torch_ms = statistics.median(torch_times)
            print("| %s | %d | %.2f | %.2f | %.2fx | %s / %s / %s | %.3f / "
                  "%.3f | %.2f%% |"
                  % (name, batch, pcc_ms, torch_ms, torch_ms / pcc_ms, *mem,
                     predicted[tag], measured,
                     100 * abs(predicted[tag] - measured) / measured),
                  flush=True)


if __name__ == "__main__":
    main()
