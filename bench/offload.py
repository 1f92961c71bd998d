#!/usr/bin/env python3
"""--offload=optimizer on a GPU: device memory and step time against the
same training step with the optimizer on the device.

For each bundled model, compiles an AdamW training step for CUDA twice
(with and without `--offload=optimizer`), trains it with `pcc-run --device
cuda`, and prints the median step time, the device's measured high-water
mark, the model state on the device and the state in host memory. The
ZeRO-Offload accounting in fp32: the device keeps weights and gradients
(8 bytes per parameter), the host holds the optimizer state (8) and copies
of the gradients and weights the update reads and writes (8).

    python3 bench/offload.py --prepare DIR   # where pcc builds (no GPU)
    python3 bench/offload.py --run DIR       # on the GPU node; DIR/bin/pcc-run
                                             # from scripts/test-gpu.sh --prepare
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import CASES, data  # noqa: E402


def tag(name, batch, offload):
    return "%s_%d%s" % (name, batch, "_offload" if offload else "")


def prepare(out):
    os.makedirs(out, exist_ok=True)
    for name, flags, loss, batch in CASES:
        for offload in (False, True):
            cmd = [os.path.join(ROOT, "build", "bin", "pcc"),
                   os.path.join(ROOT, "examples", name + ".onnx"), "--train",
                   "--loss=" + loss, "--optimizer=adamw", "--target=cuda",
                   "-o", os.path.join(out, tag(name, batch, offload) + ".so")]
            cmd += [f.format(b=batch) for f in flags]
            if offload:
                cmd.append("--offload=optimizer")
            subprocess.run(cmd, check=True, capture_output=True)
            print("compiled", tag(name, batch, offload), flush=True)


def run(out, steps):
    binary = os.path.join(out, "bin", "pcc-run")
    rng = np.random.default_rng(0)
    print("| model | batch | step ms (device / offloaded) | device high-water MiB "
          "(device / offloaded) | model state on the device MiB | state in "
          "host memory MiB |")
    print("|---|---|---|---|---|---|")
    for name, _, _, batch in CASES:
        x, y = data(name, batch, rng)
        np.save(os.path.join(out, "x.npy"), x)
        np.save(os.path.join(out, "y.npy"), y)
        row = {}
        for offload in (False, True):
            t = tag(name, batch, offload)
            log = os.path.join(out, t + ".csv")
            r = subprocess.run([binary, os.path.join(out, t + ".so"), "--device",
                                "cuda", "--steps", str(steps), "--input",
                                os.path.join(out, "x.npy"), "--labels",
                                os.path.join(out, "y.npy"), "--lr", "1e-4",
                                "--loss-log", log, "--log-every", str(steps)],
                               check=True, capture_output=True, text=True)
            ms = [float(row_["step_ms"]) for row_ in csv.DictReader(open(log))]
            high = float(re.search(r"memory high-water ([\d.]+) MiB",
                                   r.stdout).group(1))
            state = float(re.search(r"model state ([\d.]+)", r.stdout).group(1))
            hosted = re.search(r"offloaded optimizer: ([\d.]+) MiB", r.stdout)
            row[offload] = (statistics.median(ms[5:]), high, state,
                            float(hosted.group(1)) if hosted else 0.0)
        print("| %s | %d | %.2f / %.2f | %.3f / %.3f | %.3f / %.3f | %.3f |"
              % (name, batch, row[False][0], row[True][0], row[False][1],
                 row[True][1], row[False][2], row[True][2], row[True][3]),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", metavar="DIR")
    ap.add_argument("--run", metavar="DIR")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare)
    elif args.run:
        run(args.run, args.steps)
    else:
        ap.error("--prepare DIR or --run DIR")


if __name__ == "__main__":
    main()
