#!/usr/bin/env python3
"""Bytes communicated per forward pass by pcc's tensor-parallel plans,
against the analytic Megatron-LM figure.

For each bundled transformer (and the MLP) and each tp, compiles with
`pcc --tp=N --explain` and reads the collectives the planner inserted.
Megatron's hand-written layers all-reduce the [batch, seq, hidden]
activations twice per layer in the forward pass, 2 x B x S x H x 4 bytes
per layer in fp32; the table shows pcc's all-reduce bytes inside the layers
against that, plus what the plan moves outside the layers (embedding and
logit gathers). With --run it also times `pcc-run -n N` on CPU ranks.

usage: bench/tp_comm_bytes.py [--pcc build/bin/pcc] [--run] [--batch 2]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name, pcc flags for batch b, layers, seq, hidden (None: not a transformer)
MODELS = [
    ("mlp", lambda b: [f"--batch={b}"], None, None, None),
    ("transformer_postnorm", lambda b: [f"--batch={b}"], 2, 16, 64),
    ("transformer_prenorm", lambda b: [f"--batch={b}"], 2, 16, 64),
    ("gpt", lambda b: [f"--dim=batch={b}", "--dim=seq=16"], 2, 16, 64),
]
COLLECTIVE = re.compile(r"node '([^']*)'.*tp=\d+: (all_reduce|all_gather|reduce_scatter) "
                        r"of '[^']*' \((\d+) bytes\)")


def plan(pcc, model, flags, tp):
    out = subprocess.run([pcc, os.path.join(ROOT, "examples", model + ".onnx"),
                          *flags, f"--tp={tp}", "--explain"],
                         check=True, capture_output=True, text=True).stdout
    return [(node, kind, int(size)) for node, kind, size in COLLECTIVE.findall(out)]


def run_ms(pcc, pcc_run, model, flags, tp, batch, tmp):
    lib = os.path.join(tmp, f"{model}.tp{tp}.so")
    subprocess.run([pcc, os.path.join(ROOT, "examples", model + ".onnx"), *flags,
                    f"--tp={tp}", "-o", lib], check=True, capture_output=True)
    data = os.path.join(ROOT, "examples", "data", model + ".input.npy")
    out = subprocess.run([pcc_run, "-n", str(tp), lib, "--input", data, "--bench", "200"],
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"p50 ([0-9.]+)", out).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pcc", default=os.path.join(ROOT, "build", "bin", "pcc"))
    ap.add_argument("--pcc-run", default=os.path.join(ROOT, "build", "bin", "pcc-run"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--run", action="store_true", help="also time pcc-run -n N on CPU ranks")
    args = ap.parse_args()
    header = ("| model | tp | all-reduces in layers | their bytes | Megatron 2·B·S·H·4·L | ratio "
              "| other collectives (bytes) |" + (" p50 ms (CPU ranks) |" if args.run else ""))
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    with tempfile.TemporaryDirectory() as tmp:
        for model, flags_of, layers, seq, hidden in MODELS:
            flags = flags_of(args.batch)
            for tp in args.tp:
                colls = plan(args.pcc, model, flags, tp)
                in_layers = [c for c in colls if c[1] == "all_reduce"]
                other = [c for c in colls if c[1] != "all_reduce"]
                ar_bytes = sum(c[2] for c in in_layers)
                megatron = 2 * args.batch * seq * hidden * 4 * layers if layers else None
                ratio = f"{ar_bytes / megatron:.2f}" if megatron else "n/a"
                others = ", ".join(f"{k} {b}" for _, k, b in other) or "none"
                row = (f"| {model} | {tp} | {len(in_layers)} | {ar_bytes} | "
                       f"{megatron if megatron else 'n/a'} | {ratio} | {others} |")
                if args.run:
                    row += f" {run_ms(args.pcc, args.pcc_run, model, flags, tp, args.batch, tmp):.3f} |"
                print(row, flush=True)


if __name__ == "__main__":
    sys.exit(main())
