#!/usr/bin/env python3
"""Reference outputs of bf16 and fp16 inference (test/E2E/bf16-inference.
test, fp16-inference.test).

Run with the zoo venv's Python (torch):

    ~/.cache/pcc/zoo-venv/bin/python test/E2E/Inputs/make_bf16_outputs.py [--precision fp16]

For each bundled model, rebuilds the module with the ONNX's weights
(test/Training/make_reference.py's prepare), runs examples/data/<model>.
input.npy in eval mode under torch.autocast("cpu", torch.bfloat16) and
writes Inputs/bf16/<model>.output.npy (as float32; Inputs/fp16 with
--precision fp16, torch.float16) and, in cases.txt, the
model, the absolute tolerance of the comparison (three times how far
PyTorch's own bf16 output is from its f32 output: bf16's noise, as the
training parity tests bound it) and pcc's shape flags.
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "test", "Training"))
import make_reference  # noqa: E402

MODELS = {
    "mlp": "--batch=2",
    "transformer_postnorm": "--batch=2",
    "transformer_prenorm": "--batch=2",
    "gpt": "--dim=batch=2 --dim=seq=16",
    "resnet18": "--batch=2",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=["bf16", "fp16"], default="bf16")
    args = ap.parse_args()
    dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
    torch.set_num_threads(1)
    out = os.path.join(HERE, args.precision)
    os.makedirs(out, exist_ok=True)
    lines = []
    for name, flags in MODELS.items():
        model, _, _ = make_reference.prepare(name)
        model.eval()
        x = torch.from_numpy(np.load(os.path.join(ROOT, "examples", "data",
                                                  name + ".input.npy")))
        with torch.no_grad():
            f32 = model(x).float().numpy()
            with torch.autocast("cpu", dtype=dtype):
                bf16 = model(x).float().numpy()
        np.save(os.path.join(out, name + ".output.npy"), bf16)
        noise = float(np.abs(bf16 - f32).max())
        lines.append("%s %.3g %s" % (name, 3 * noise, flags))
        print("%s: %s vs f32 max abs diff %.3g (max |f32| %.3g)" % (
            name, args.precision, noise, float(np.abs(f32).max())))
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
