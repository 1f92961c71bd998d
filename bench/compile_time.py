#!/usr/bin/env python3
"""Compile time against depth and parallel configuration, ratios in one run.

Exports GPT-2 language models of one width (random init, Hugging Face
transformers, the TorchScript exporter) at several depths, then times
`pcc model.onnx <config> -o model.so` (import, planning, partition, pipeline
cut, code generation and the host compiler) for each configuration, the
median of --trials runs. Prints a table with each time's ratio to tp=1 at
the same depth and to the shallowest depth in the same configuration: a
planner linear in depth keeps the depth ratio near the layer ratio, and
the tp ratio flat.

Needs torch and transformers: run it with the zoo's virtual environment
(scripts/zoo/setup-venv.sh):

  ~/.cache/pcc/zoo-venv/bin/python bench/compile_time.py
  ... --layers 24 48 96 --width 128 --configs tp1 tp4 pp4 tp2xpp2

--baseline OTHER_PCC times a second pcc (an older build) in alternating
rounds on the same models and adds its time and the ratio: whether a change
made compiling slower.
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export_gpt(path, layers, width, heads, vocab, seq):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads,
                                     vocab_size=vocab, n_positions=seq,
                                     use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).logits

    ids = torch.zeros(2, seq, dtype=torch.int64)
    mask = torch.ones(2, seq, dtype=torch.int64)
    mask[1, seq // 2:] = 0
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(Logits(model), (ids, mask), path, dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes})


def flags(config):
    out = []
    for part in config.split("x"):
        if part.startswith("tp") and part != "tp1":
            out.append(f"--tp={part[2:]}")
        elif part.startswith("pp"):
            out.append(f"--pp={part[2:]}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pcc", default=os.path.join(ROOT, "build", "bin", "pcc"))
    ap.add_argument("--layers", type=int, nargs="+", default=[24, 48, 96])
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--configs", nargs="+", default=["tp1", "tp4", "pp4", "tp2xpp2"])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--baseline", help="another pcc, timed in alternating rounds")
    ap.add_argument("--emit", default="lib", choices=["lib", "mlir"],
                    help="lib: the whole compile; mlir: stop before code generation")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="pcc-compile-time-")
    times, baseline = {}, {}
    for layers in args.layers:
        model = os.path.join(work, f"gpt{layers}.onnx")
        export_gpt(model, layers, args.width, args.heads, args.vocab, args.seq)
        for config in args.configs:
            out = os.path.join(work, f"gpt{layers}.{config}." + ("so" if args.emit == "lib" else "mlir"))
            cmd = [args.pcc, model, "--dim=batch=8", f"--dim=seq={args.seq}", *flags(config), "-o", out]
            if args.emit == "mlir":
                cmd.append("--emit=mlir")
            runs, base = [], []
            for _ in range(args.trials):
                for binary, into in ((args.pcc, runs), (args.baseline, base)):
                    if not binary:
                        continue
                    start = time.perf_counter()
                    subprocess.run([binary] + cmd[1:], check=True, capture_output=True)
                    into.append(time.perf_counter() - start)
            times[(layers, config)] = statistics.median(runs)
            if base:
                baseline[(layers, config)] = statistics.median(base)
            print(f"  {layers} layers {config}: {times[(layers, config)]:.2f} s"
                  + (f" (baseline {baseline[(layers, config)]:.2f} s)" if base else ""),
                  flush=True)

    base_layers = args.layers[0]
    print(f"\nGPT-2 width {args.width}, {args.heads} heads, vocab {args.vocab}, seq {args.seq}, "
          f"batch 8; pcc -o {'model.so' if args.emit == 'lib' else 'model.mlir'}; "
          f"median of {args.trials}\n")
    extra = " baseline seconds | vs baseline |" if baseline else ""
    print(f"| layers | config | seconds | vs tp1, same depth | vs {base_layers} layers, "
          f"same config (layer ratio) |{extra}")
    print("|---|---|---|---|---|" + ("---|---|" if baseline else ""))
    for layers in args.layers:
        for config in args.configs:
            t = times[(layers, config)]
            row = (f"| {layers} | {config} | {t:.2f} | {t / times[(layers, 'tp1')]:.2f}x "
                   f"| {t / times[(base_layers, config)]:.2f}x (x{layers / base_layers:g}) |")
            if baseline:
                b = baseline[(layers, config)]
                row += f" {b:.2f} | {t / b:.3f}x |"
            print(row)


if __name__ == "__main__":
    main()
