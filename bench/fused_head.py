#!/usr/bin/env python3
"""The LM head fused with its cross-entropy (pcc.linear_cross_entropy)
against the logits computed whole (--fuse-cross-entropy=false), at the
sizes people train: GPT-2 124M (vocabulary 50,257, its head tied to the
embedding) and a ~125M Llama (vocabulary 32,000, an untied head), random
init, batch 4 x 128, AdamW in fp32 or (--precision bf16) in bf16 mixed
precision, on this CPU.

For each model: both training libraries, then --rounds alternating rounds
of `pcc-run --steps N` each (the median step after the first), their
first losses (which must agree), pcc --explain's saved activations and
pcc-run's measured high-water mark; the ratio unfused / fused step time.

    env -u OPENBLAS_CORETYPE ~/.cache/pcc/zoo-venv/bin/python \\
        bench/fused_head.py [--models gpt2 llama] [--rounds 3] [--steps 4] \\
        [--precision fp32|bf16]

The models are those of bench/mixed_precision.py, exported once into
~/.cache/pcc/bench/<model>/.
"""
import argparse
import csv
import os
import re
import statistics
import sys
import time

from mixed_precision import (BATCH, CACHE, ROOT, SEQ, build, export, run,
                             write_tokens)  # noqa: E402 (bench/)

PCC = os.path.join(ROOT, "build", "bin", "pcc")
PCC_RUN = os.path.join(ROOT, "build", "bin", "pcc-run")


def step(lib, work, tag, inputs, labels, steps, env):
    """(median seconds per step after the first, first loss, high-water
    MiB) of `steps` AdamW steps."""
    log = os.path.join(work, "loss-head-%s.csv" % tag)
    out = run([PCC_RUN, lib, "--steps", str(steps), "--input", inputs,
               "--labels", labels, "--lr", "1e-4", "--loss-log", log], env)
    with open(log) as f:
        rows = list(csv.DictReader(f))
    water = re.search(r"memory high-water ([0-9.]+) MiB", out)
    return (statistics.median(float(r["step_ms"]) for r in rows[1:]) / 1e3,
            float(rows[0]["loss"]), float(water.group(1)) if water else 0.0)


def bench(name, args, env):
    path = os.path.join(CACHE, name, "model.onnx")
    if not os.path.exists(path):
        model, _ = build(name)
        export(name, model, path)
    import onnx
    vocab = onnx.load(path, load_external_data=False).graph.output[0] \
        .type.tensor_type.shape.dim[-1].dim_value
    work = os.path.join(CACHE, name, "work")
    os.makedirs(work, exist_ok=True)
    _, _, inputs, labels = write_tokens(work, vocab, BATCH, SEQ)
    libs, saved = {}, {}
    for fused in (True, False):
        tag = "fused" if fused else "unfused"
        flags = [path, "--train", "--loss=cross_entropy", "--optimizer=adamw",
                 "--precision=" + args.precision,
                 "--fuse-cross-entropy=" + ("true" if fused else "false")]
        text = run([PCC] + flags + ["--explain"], env)
        saved[tag] = float(re.search(r"saved activations\s+([0-9.]+) MiB",
                                     text).group(1))
        libs[tag] = os.path.join(work, "train-head-%s%s.so" % (
            tag, "" if args.precision == "fp32" else "-" + args.precision))
        t = time.time()
        run([PCC] + flags + ["-o", libs[tag]], env)
        print("%s: compiled %s in %.0f s" % (name, tag, time.time() - t),
              flush=True)
    times = {"fused": [], "unfused": []}
    first, water = {}, {}
    for r in range(args.rounds):
        for tag in ("fused", "unfused"):
            s, loss, mib = step(libs[tag], work, tag, inputs, labels,
                                args.steps + 1, env)
            times[tag].append(s)
            first[tag], water[tag] = loss, mib
        print("%s round %d: fused %.3f s, unfused %.3f s" % (
            name, r + 1, times["fused"][-1], times["unfused"][-1]),
            flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("\n%s, batch %d x %d, %d threads, %s AdamW, median of %d rounds:"
          % (name, BATCH, SEQ, args.threads, args.precision, args.rounds))
    for tag in ("fused", "unfused"):
        print("  %-8s %.3f s/step, first loss %.6f, saved activations "
              "%.1f MiB, high-water %.1f MiB" % (tag, med[tag], first[tag],
                                                 saved[tag], water[tag]))
    print("  unfused / fused step time: %.3fx" % (med["unfused"] / med["fused"]))
    return med, first, saved, water


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env.pop("OPENBLAS_CORETYPE", None)
    results = {m: bench(m, args, env) for m in args.models}
    print("\n| model | fused s/step | unfused s/step | unfused / fused | "
          "saved act. fused / unfused (MiB) | high-water fused / unfused "
          "(MiB) |")
    print("|---|---|---|---|---|---|")
    for m, (med, first, saved, water) in results.items():
        # bf16: the fused head's logits are rounded from f32 sums taken in
        # another order than the unfused product's.
        bound = 1e-4 if args.precision == "fp32" else 1e-3
        if abs(first["fused"] - first["unfused"]) > bound * abs(first["unfused"]):
            sys.exit("fused_head.py: %s's first losses differ: %r" % (m, first))
        print("| %s | %.3f | %.3f | %.3fx | %.0f / %.0f | %.0f / %.0f |" % (
            m, med["fused"], med["unfused"], med["unfused"] / med["fused"],
            saved["fused"], saved["unfused"], water["fused"],
            water["unfused"]))


if __name__ == "__main__":
    main()
