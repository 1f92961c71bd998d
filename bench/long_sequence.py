#!/usr/bin/env python3
"""Memory linear in the sequence: GPT-2 124M (random init, dropout 0, its
position table as long as the sequence) trained at long sequences with
pcc's fused attention (pcc.attention) and with the decomposed one
(--fuse-attention=false, the S x S scores saved for the backward pass).

For each --shape BxS: pcc --train --explain's predicted memory for both;
then, for the shapes in --train-shapes, --steps AdamW steps of each on this
CPU (where the prediction fits --mem-limit), with the measured high-water
mark, the step time and the first losses, which must agree with each other
and with PyTorch's first loss on the same weights.

    env -u OPENBLAS_CORETYPE ~/.cache/pcc/zoo-venv/bin/python \\
        bench/long_sequence.py --shapes 1x2048,4x4096,4x8192 --train-shapes 1x2048

Models are exported once into ~/.cache/pcc/bench/gpt2-long-BxS/.
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

from mixed_precision import TextLM, export  # noqa: E402 (bench/)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.expanduser("~/.cache/pcc/bench")
PCC = os.path.join(ROOT, "build", "bin", "pcc")
PCC_RUN = os.path.join(ROOT, "build", "bin", "pcc-run")


def build(seq):
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=seq, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config), config.vocab_size


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env)
    if r.returncode != 0:
        sys.exit("long_sequence.py: %s failed:\n%s" % (" ".join(cmd),
                                                       r.stdout[-3000:]))
    return r.stdout


def mib(text, label):
    m = re.search(label + r"\s+([0-9.]+) MiB", text)
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x2048,4x4096,4x8192")
    ap.add_argument("--train-shapes", default="1x2048")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mem-limit", type=float, default=16.0,
                    help="GiB: train only what pcc predicts under this")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    train_shapes = set(args.train_shapes.split(",")) if args.train_shapes else set()
    rows = []
    for shape in args.shapes.split(","):
        batch, seq = (int(x) for x in shape.split("x"))
        model, vocab = build(seq)
        path = os.path.join(CACHE, "gpt2-long-%s" % shape, "model.onnx")
        if not os.path.exists(path):
            export("gpt2", model, path, batch, seq)
        work = os.path.dirname(path)
        results = {}
        for fused in (True, False):
            tag = "fused" if fused else "unfused"
            flags = [path, "--train", "--loss=cross_entropy",
                     "--optimizer=adamw",
                     "--fuse-attention=" + ("true" if fused else "false")]
            text = run([PCC] + flags + ["--explain"], env)
            r = {"saved": mib(text, "saved activations"),
                 "total": mib(text, "total")}
            if shape in train_shapes and r["total"] < args.mem_limit * 1024:
                lib = os.path.join(work, "train-%s.so" % tag)
                run([PCC] + flags + ["-o", lib], env)
                rng = np.random.default_rng(0)
                ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
                labels = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
                np.save(os.path.join(work, "ids.npy"), ids)
                np.save(os.path.join(work, "labels.npy"), labels)
                log = os.path.join(work, "loss-%s.csv" % tag)
                out = run([PCC_RUN, lib, "--steps", str(args.steps),
                           "--input", os.path.join(work, "ids.npy"),
                           "--labels", os.path.join(work, "labels.npy"),
                           "--lr", "1e-4", "--loss-log", log], env)
                m = re.search(r"memory high-water ([0-9.]+) MiB", out)
                r["measured"] = float(m.group(1)) if m else float("nan")
                import csv
                with open(log) as f:
                    vals = list(csv.DictReader(f))
                r["losses"] = [float(v["loss"]) for v in vals]
                r["step_s"] = float(vals[-1]["step_ms"]) / 1e3
                if fused:
                    with torch.no_grad():
                        logits = TextLM(model)(torch.from_numpy(ids))
                        r["torch_loss"] = float(F.cross_entropy(
                            logits.reshape(-1, vocab),
                            torch.from_numpy(labels).reshape(-1)))
            results[tag] = r
        rows.append((shape, results))
        print(shape, results, flush=True)
    print("\nGPT-2 124M training (AdamW, fp32), pcc --explain's prediction "
          "(MiB):")
    print("| batch x seq | fused: saved activations | fused: total | "
          "decomposed: saved activations | decomposed: total |")
    print("|---|---|---|---|---|")
    for shape, r in rows:
        print("| %s | %.0f | %.0f | %.0f | %.0f |" % (
            shape, r["fused"]["saved"], r["fused"]["total"],
            r["unfused"]["saved"], r["unfused"]["total"]))
    for shape, r in rows:
        for tag in ("fused", "unfused"):
            if "losses" in r[tag]:
                print("%s %s: measured high-water %.0f MiB, last step %.1f s, "
                      "losses %s%s" % (
                    shape, tag, r[tag]["measured"], r[tag]["step_s"],
                    ", ".join("%.6f" % x for x in r[tag]["losses"]),
                    ("; PyTorch's first loss %.6f" % r[tag]["torch_loss"])
                    if "torch_loss" in r[tag] else ""))


if __name__ == "__main__":
    main()
