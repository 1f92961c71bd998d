#!/usr/bin/env python3
"""How much of the data-parallel gradient traffic the backward pass hides.

For each model, dp and ZeRO stage: compiles the library twice, with
gradient buckets (pcc's default) and with --bucket-mb=0 (every gradient's
collective blocking), trains the same steps with `pcc-run -n dp` on CPU
ranks, and reads what rank 0 printed: the step time and the time it spent
in data-parallel collectives per step. With buckets:
- ZeRO 0: each bucket's all-reduce starts as soon as the last micro-batch's
  backward pass has produced it, and the optimizer waits for them (blocking:
  all-reduced in the optimizer phase);
- ZeRO 1: the same with each bucket's gradients reduce-scattered in place
  (blocking: reduce-scattered in the optimizer phase);
- ZeRO 2 and 3: in every micro-batch, a bucket's reduce-scatters start once
  its last gradient is done and complete where the next bucket starts
  (blocking: each gradient reduce-scattered where it is produced).
The optimizer's all-gathers (ZeRO 1-3) and ZeRO 3's weight gathers stay
blocking in both (--zero-prefetch=0), so they count on both sides. The
hidden share is 1 - (time with buckets) / (time blocking), the part of the
blocking time the backward pass absorbed. Both runs move the same bytes.

With --what prefetch (ZeRO 3): the two libraries differ in ZeRO 3's weight
gathers instead, --zero-prefetch=0 (each gathered where it is read) against
--zero-prefetch=N (started N gathers ahead), both with blocking gradients
(--bucket-mb=0).

With --pp P (ZeRO 0): each data-parallel rank is a pipeline of P ranks
(--microbatches 4, the default schedule), and "buckets" is --bucket-mb=-1:
each gradient's all-reduce starts in the W pass that completes it in the
step's last micro-batch, against the optimizer's all-reduces. pcc-run runs
dp x P ranks.

usage: bench/dp_overlap.py [--models mlp gpt resnet18_train] [--dp 2 4]
                           [--zero 0 1 2 3] [--steps 60] [--repeat 3]
                           [--what buckets|prefetch] [--prefetch N] [--pp P]
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
    ap.add_argument("--zero", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--what", choices=["buckets", "prefetch"],
                    default="buckets")
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    args = ap.parse_args()
    print("| model | dp | ZeRO | buckets | blocking: ms in collectives / step ms "
          "| buckets: ms in collectives / step ms | hidden share |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            onnx = os.path.join(ROOT, "examples", model + ".onnx")
            for n in args.dp:
                for zero in args.zero:
                    measure(args, onnx, model, n, zero, tmp)


def measure(args, onnx, model, n, zero, tmp):
    flags = [f"--dp={n}", f"--zero={zero}"] + MODELS[model]
    if args.pp > 1:
        flags += [f"--pp={args.pp}", "--microbatches=4"]
    libs = {}
    if args.what == "prefetch":
        modes = (("blocking", ["--bucket-mb=0", "--zero-prefetch=0"]),
                 ("buckets", ["--bucket-mb=0",
                              f"--zero-prefetch={args.prefetch}"]))
    else:
        gathers = ["--zero-prefetch=0"] if zero == 3 else []
        # -1: the size pcc chooses from the model, also where its default
        # is no buckets (ZeRO 1-3 on CPU ranks).
        modes = (("blocking", ["--bucket-mb=0"] + gathers),
                 ("buckets", ["--bucket-mb=-1"] + gathers))
    flags_of = dict(modes)
    for mode, extra in modes:
        lib = os.path.join(tmp, f"{model}.{n}.{zero}.{mode}.so")
        subprocess.run([args.pcc, onnx, "--train", "-o", lib] + flags + extra,
                       check=True, capture_output=True)
        libs[mode] = lib
    ir = subprocess.run([args.pcc, onnx, "--train", "--emit=mlir"] + flags
                        + flags_of["buckets"],
                        check=True, capture_output=True, text=True).stdout
    buckets = ir.count("pcc.bucket_start") + ir.count("pcc.wait_collectives")
    # Alternate the two so that load drifts affect both alike; the medians
    # of the repeats.
    results = {"blocking": [], "buckets": []}
    for _ in range(args.repeat):
        for mode in ("blocking", "buckets"):
            results[mode].append(run(args.pcc_run, libs[mode], n * args.pp, model,
                                     args.steps))
    med = {m: (statistics.median(r[0] for r in v),
               statistics.median(r[1] for r in v))
           for m, v in results.items()}
    hidden = 1 - med["buckets"][0] / med["blocking"][0]
    print(f"| {model} | {n} | {zero} | {buckets} | {med['blocking'][0]:.3f} / "
          f"{med['blocking'][1]:.2f} | {med['buckets'][0]:.3f} / "
          f"{med['buckets'][1]:.2f} | {hidden:.2f} |", flush=True)


if __name__ == "__main__":
    main()
