#!/usr/bin/env python3
"""Measured pipeline bubble of pcc's GPipe and interleaved forward
schedules against the analytic (p - 1) / (v m + p - 1).

Builds a deep MLP whose layers are identical (so every cut gives balanced
stages), compiles it with `pcc --pp=p --microbatches=m --schedule=gpipe`
for p in {2, 4} and m in {4, 8, 16} (each micro-batch the same number of
rows, so a stage step costs the same in every configuration), and with
`--pp-chunks=v --schedule=interleaved` for v = 2 (v model chunks per
rank: p v stages of fewer layers each), runs it with
`pcc-run -n p --bench N --trace`, and reads the measured bubble of the last
(warm) run: per rank, the share of the run's makespan spent not computing,
averaged over ranks. Each configuration runs --trials times; the table
shows the median trial.

CPU ranks share this machine's cores: with more ranks than cores the stages
that should run at once are time-sliced, which the table flags.

With --train the same MLP is compiled for training (`--train --loss=mse`)
under --schedules (gpipe, 1f1b, zb-h1) and trained for a few steps with
`pcc-run --trace`. Per schedule the table gives the busiest rank's bubble
in the last step (the schedule's: the rank computing longest sets the
step), the schedule's own analytic value (its lists replayed with F, B and
W one unit each), the replay with the run's measured F, B and W per stage
(what is left is transfers and the runtime's waits), and the ratio to
(p - 1) / (m + p - 1), the bubble of GPipe and of the textbook 1F1B whose
backward is one piece. ZB-H1's target is half of that or less.

usage: bench/pp_bubble.py [--pcc build/bin/pcc] [--rows 32] [--hidden 512]
                          [--layers 8] [--trials 3] [--chunks 1 2]
       bench/pp_bubble.py --train [--stages 2] [--microbatches 8]
                          [--schedules gpipe 1f1b zb-h1] [--in-features 64]
                          [--out-features 64]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_model(path, layers, hidden, in_features=0, out_features=0,
               activation="gelu"):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(hidden, hidden)

        def forward(self, x):
            h = self.fc(x)
            return x + (torch.relu(h) if activation == "relu"
                        else torch.nn.functional.gelu(h))

    torch.manual_seed(0)
    blocks = [Block() for _ in range(layers)]
    if in_features:
        blocks.insert(0, torch.nn.Linear(in_features, hidden))
    if out_features:
        blocks.append(torch.nn.Linear(hidden, out_features))
    model = torch.nn.Sequential(*blocks).eval()
    x = torch.randn(2, in_features or hidden)
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                      opset_version=17)


def read_timeline(out):
    """What pcc-run --trace prints, as a dict: mean (bubble over ranks),
    analytic ((p-1)/(v m+p-1)), span (makespan ms), per (per-rank bubbles
    "a/b"), and for pipelines of two or more ranks busiest (the busiest
    rank's bubble), imbalance, and the schedule's lists replayed: unit (F, B
    and W one unit each) and replay (the run's own F, B and W per stage,
    free transfers), both the busiest rank's."""
    bubble = re.search(r"mean bubble ([0-9.]+); \(p-1\)/\([v*]*m\+p-1\) = ([0-9.]+)", out)
    span = re.search(r"makespan ([0-9.]+) ms", out)
    ranks = re.findall(r"stage[s]? [0-9, ]+: compute [0-9.]+ ms, bubble ([0-9.]+)", out)
    busiest = re.search(r"busiest rank's bubble ([0-9.]+) \(the schedule's\); compute "
                        r"imbalance ([0-9.]+)", out)
    replay = re.search(r"replayed: with F, B and W one unit each, busiest rank's bubble "
                       r"([0-9.]+) \(mean [0-9.]+\); with this run's F, B and W per stage "
                       r"and free transfers, ([0-9.]+)", out)
    t = {"mean": float(bubble.group(1)), "analytic": float(bubble.group(2)),
         "span": float(span.group(1)), "per": "/".join(ranks)}
    if busiest:
        t["busiest"], t["imbalance"] = float(busiest.group(1)), float(busiest.group(2))
    if replay:
        t["unit"], t["replay"] = float(replay.group(1)), float(replay.group(2))
    return t


def write_input(path, rows, hidden):
    import numpy as np
    np.save(path, np.random.default_rng(0).standard_normal((rows, hidden)).astype(np.float32))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pcc", default=os.path.join(ROOT, "build", "bin", "pcc"))
    ap.add_argument("--pcc-run", default=os.path.join(ROOT, "build", "bin", "pcc-run"))
    ap.add_argument("--rows", type=int, default=32, help="rows per micro-batch")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--in-features", type=int, default=0,
                    help="with --train: an input projection Linear(N, hidden) before "
                         "the blocks, the way a transformer starts with its embedding "
                         "(0: none)")
    ap.add_argument("--activation", choices=["gelu", "relu"], default="gelu",
                    help="the blocks' activation: GELU (an erf, so F is longer "
                         "than B and W) or ReLU (F, B and W about equal)")
    ap.add_argument("--out-features", type=int, default=0,
                    help="with --train: an output projection Linear(hidden, N) after "
                         "the blocks, the way a transformer ends with its LM head, so "
                         "that the last stage's extra work matches the first's (0: none)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 2],
                    help="model chunks per rank (1: gpipe, more: interleaved)")
    ap.add_argument("--train", action="store_true",
                    help="measure training schedules (F, B and W) instead")
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "zb-h1"],
                    help="with --train: the schedules to measure")
    ap.add_argument("--steps", type=int, default=4,
                    help="with --train: steps per run (the last is traced)")
    args = ap.parse_args()
    if args.train:
        return train(args)
    cores = os.cpu_count() or 1
    print(f"deep MLP: {args.layers} x (Linear {args.hidden}x{args.hidden} + GELU, residual), "
          f"{args.rows} rows per micro-batch, fp32, CPU ranks on {cores} cores\n")
    print("| p | v | m | schedule | measured bubble (mean over ranks) "
          "| analytic (p-1)/(v m+p-1) | measured - analytic | makespan ms | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "deep_mlp.onnx")
        make_model(onnx_path, args.layers, args.hidden)
        for p, v, m in [(p, v, m) for v in args.chunks for p in args.stages
                        for m in args.microbatches]:
                if p * v > args.layers or (v > 1 and m % p):
                    continue
                rows = m * args.rows
                policy = "gpipe" if v == 1 else "interleaved"
                lib = os.path.join(tmp, f"mlp.p{p}.v{v}.m{m}.so")
                data = os.path.join(tmp, f"x{rows}.npy")
                write_input(data, rows, args.hidden)
                subprocess.run([args.pcc, onnx_path, f"--batch={rows}", f"--pp={p}",
                                f"--pp-chunks={v}", f"--microbatches={m}",
                                f"--schedule={policy}", "-o", lib],
                               check=True, capture_output=True)
                trials = []
                for _ in range(args.trials):
                    out = subprocess.run(
                        [args.pcc_run, "-n", str(p), lib, "--input", data, "--bench", "3",
                         "--trace", os.path.join(tmp, "t.json")],
                        check=True, capture_output=True, text=True).stdout
                    t = read_timeline(out)
                    trials.append((t["mean"], t["analytic"], t["span"]))
                trials.sort()
                measured, analytic, span = trials[len(trials) // 2]
                note = "" if p <= cores else f"{p} ranks on {cores} cores: time-sliced"
                print(f"| {p} | {v} | {m} | {policy} | {measured:.3f} | {analytic:.3f} | "
                      f"{measured - analytic:+.3f} | {span:.2f} | {note} |")
                sys.stdout.flush()


def train(args):
    cores = os.cpu_count() or 1
    print(f"deep MLP training (mse): {args.layers} x (Linear {args.hidden}x{args.hidden} "
          f"+ GELU, residual), {args.rows} rows per micro-batch, fp32, AdamW, "
          f"CPU ranks on {cores} cores; the bubble of the last of {args.steps} steps\n")
    print("The busiest rank's bubble is the schedule's (the rank computing longest sets "
          "the step; the others also wait out the stages' imbalance). Each is shown "
          "with the schedule's lists replayed (pcc::schedule::simulate) with F, B and "
          "W one unit each (its analytic value) and with the run's own F, B and W per "
          "stage and free transfers; and against (p-1)/(m+p-1), the bubble of GPipe "
          "and of the textbook 1F1B, whose backward is one piece.\n")
    print("| p | m | schedule | busiest rank's bubble | analytic (F = B = W) "
          "| replay, measured F/B/W | / (p-1)/(m+p-1) | mean over ranks | per rank "
          "| imbalance | makespan ms | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "deep_mlp.onnx")
        make_model(onnx_path, args.layers, args.hidden, args.in_features,
                   args.out_features, args.activation)
        for p in args.stages:
            for m in args.microbatches:
                rows = m * args.rows
                x = os.path.join(tmp, f"x{rows}.npy")
                y = os.path.join(tmp, f"y{rows}.npy")
                write_input(x, rows, args.in_features or args.hidden)
                np.save(y, np.random.default_rng(1).standard_normal(
                    (rows, args.out_features or args.hidden)).astype(np.float32))
                libs = {}
                for policy in args.schedules:
                    libs[policy] = os.path.join(tmp, f"t.p{p}.m{m}.{policy}.so")
                    subprocess.run([args.pcc, onnx_path, "--train", "--loss=mse",
                                    f"--batch={rows}", f"--pp={p}",
                                    f"--microbatches={m}", f"--schedule={policy}",
                                    "-o", libs[policy]], check=True, capture_output=True)
                # The schedules take turns trial by trial, so that a slow
                # spell of this shared machine falls on all of them alike.
                trials = {policy: [] for policy in args.schedules}
                for _ in range(args.trials):
                    for policy in args.schedules:
                        out = subprocess.run(
                            [args.pcc_run, "-n", str(p), libs[policy], "--input", x,
                             "--labels", y, "--steps", str(args.steps),
                             "--lr", "1e-4", "--trace", os.path.join(tmp, "t.json")],
                            check=True, capture_output=True, text=True).stdout
                        trials[policy].append(read_timeline(out))
                for policy in args.schedules:
                    # The median trial by the busiest rank's bubble.
                    runs = sorted(trials[policy], key=lambda t: t["busiest"])
                    t = runs[len(runs) // 2]
                    note = "" if p <= cores else f"{p} ranks on {cores} cores: time-sliced"
                    print(f"| {p} | {m} | {policy} | {t['busiest']:.3f} | {t['unit']:.3f} | "
                          f"{t['replay']:.3f} | {t['busiest'] / t['analytic']:.2f} of "
                          f"{t['analytic']:.3f} | {t['mean']:.3f} | {t['per']} | "
                          f"{t['imbalance']:.3f} | {t['span']:.2f} | {note} |")
                sys.stdout.flush()

if __name__ == "__main__":
    main()
