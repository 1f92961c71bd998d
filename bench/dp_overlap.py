#!/usr/bin/env python3
"""How much of the data-parallel gradient traffic the backward pass hides.

For each model at each dp: compiles the library twice, with gradient
buckets (pcc's default: each bucket's all-reduce starts as soon as the last
micro-batch's backward pass has produced it, and the optimizer waits for
them) and with --bucket-mb=0 (every gradient all-reduced, blocking, in the
optimizer phase), trains the same steps with `pcc-run -n dp` on CPU ranks,
and reads what rank 0 printed: the step time and the time it spent in
data-parallel collectives per step. The hidden share is
1 - (time waited with buckets) / (time in the blocking all-reduces), the
part of the blocking time the backward pass absorbed. Both runs move the
same bytes (2 Psi per step).

usage: bench/dp_overlap.py [--models mlp gpt resnet18_train] [--dp 2 4]
                           [--steps 60] [--repeat 3]
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = os.path.join(ROOT, "test", "Training", "ref")
MODELS = {
    "mlp": ["--batch=8"],
    "gpt": ["--dim=batch=8", "--dim=seq=16"],
    "resnet18_train": ["--batch=8"],
    "transformer_prenorm": ["--batch=8", "--loss=mse"],
}


def run(pcc_run, lib, n, model, steps):
    ref = os.path.join(REF, model)
    out = subprocess.run(
        [pcc_run, "-n", str(n), lib, "--steps", str(steps), "--log-every",
         str(steps), "--input", os.path.join(ref, "input.npy"), "--labels",
         os.path.join(ref, "labels.npy")],
        check=True, capture_output=True, text=True).stdout
    waited = float(re.search(r"time in data-parallel collectives per step on "
                             r"each rank: ([0-9.]+) ms", out).group(1))
    trained = re.search(r"trained steps \d+ to \d+ in ([0-9.]+) s", out)
    step_ms = float(trained.group(1)) * 1e3 / steps
    return waited, step_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pcc", default=os.path.join(ROOT, "build", "bin", "pcc"))
    ap.add_argument("--pcc-run", default=os.path.join(ROOT, "build", "bin", "pcc-run"))
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt", "resnet18_train"])
    ap.add_argument("--dp", type=int, nargs="+", default=[2])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| model | dp | buckets | blocking: ms in collectives / step ms "
          "| buckets: ms waited / step ms | hidden share |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            onnx = os.path.join(ROOT, "examples", model + ".onnx")
            for n in args.dp:
                libs = {}
                for mode, flags in (("blocking", ["--bucket-mb=0"]), ("buckets", [])):
                    lib = os.path.join(tmp, f"{model}.{n}.{mode}.so")
                    subprocess.run([args.pcc, onnx, "--train", f"--dp={n}", "-o", lib]
                                   + MODELS[model] + flags, check=True,
                                   capture_output=True)
                    libs[mode] = lib
                explain = subprocess.run(
                    [args.pcc, onnx, "--train", f"--dp={n}", "--emit=mlir"] + MODELS[model],
                    check=True, capture_output=True, text=True).stdout
                buckets = explain.count("pcc.bucket_start")
                # Alternate the two so that load drifts affect both alike;
                # the medians of the repeats.
                results = {"blocking": [], "buckets": []}
                for _ in range(args.repeat):
                    for mode in ("blocking", "buckets"):
                        results[mode].append(run(args.pcc_run, libs[mode], n, model,
                                                 args.steps))
                med = {m: (statistics.median(r[0] for r in v),
                           statistics.median(r[1] for r in v))
                       for m, v in results.items()}
                hidden = 1 - med["buckets"][0] / med["blocking"][0]
                print(f"| {model} | {n} | {buckets} | {med['blocking'][0]:.3f} / "
                      f"{med['blocking'][1]:.2f} | {med['buckets'][0]:.3f} / "
                      f"{med['buckets'][1]:.2f} | {hidden:.2f} |", flush=True)


if __name__ == "__main__":
    main()
