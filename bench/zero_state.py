#!/usr/bin/env python3
"""Per-rank model-state memory and bytes communicated per training step
under data parallelism and ZeRO 1-3, against the ZeRO paper's formulas.

For each model, dp and ZeRO stage: compiles with `pcc --train --dp --zero`
(`--explain` gives the predicted model state and communication), trains a
few steps with `pcc-run -n dp` on CPU ranks, and reads what rank 0
measured: its memory high-water mark, its model-state bytes and the bytes
its collectives moved per step. The ZeRO paper's figures (Rajbhandari et
al. 2020, section 5 and 7), in float32 with AdamW (K = 8 bytes of
optimizer state per parameter, plus pcc's 4-byte master piece of each
weight at stages 1 and 2, DeepSpeed's fp32 partition):

  model state per rank   0: 16 Psi  1: 8 Psi + 12 Psi/N  2: 4 Psi + 16 Psi/N
                         3: 16 Psi/N
  bytes moved per step   0, 1, 2: 2 Psi x 4 bytes   3: 3 Psi x 4 bytes

(pieces are padded to a multiple of N elements; ZeRO-3 gathers in the
backward phase only the weights it reads there). With --tp T the model is
split over T tensor-parallel ranks as well (pcc-run -n T*N): Psi is then
the parameters of one tensor-parallel piece, as in the paper's accounting
per model-parallel partition, and the tp traffic (activations and their
gradients) is reported apart.

usage: bench/zero_state.py [--models mlp gpt resnet18_train] [--dp 2 4]
                           [--tp 1 2] [--steps 5]
"""
import argparse
import os
import re
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = os.path.join(ROOT, "test", "Training", "ref")
MODELS = {
    "mlp": (["--batch=8"], "mlp"),
    "gpt": (["--dim=batch=8", "--dim=seq=16"], "gpt"),
    "resnet18_train": (["--batch=8"], "resnet18_train"),
    "transformer_prenorm": (["--batch=8"], "transformer_prenorm"),
}
LOSS = {"transformer_prenorm": "mse"}


def formula_state(stage, psi, n):
    return {0: 16 * psi, 1: 8 * psi + 12 * psi / n, 2: 4 * psi + 16 * psi / n,
            3: 16 * psi / n}[stage]


def formula_moved(stage, psi):
    return (3 if stage == 3 else 2) * psi * 4


def data_flags(model):
    ref = os.path.join(REF, model)
    inputs = ["input.npy"]
    cfg = os.path.join(ref, "config.json")
    if os.path.exists(cfg):
        import json
        inputs = json.load(open(cfg)).get("inputs", inputs)
    flags = []
    for f in inputs:
        flags += ["--input", os.path.join(ref, f)]
    return flags + ["--labels", os.path.join(ref, "labels.npy")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pcc", default=os.path.join(ROOT, "build", "bin", "pcc"))
    ap.add_argument("--pcc-run", default=os.path.join(ROOT, "build", "bin", "pcc-run"))
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt", "resnet18_train"])
    ap.add_argument("--dp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tp", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    print("| model | tp | dp | ZeRO | Psi | model state / rank (measured) | formula "
          "| ratio | high-water predicted / measured MiB | bytes moved over dp / step "
          "(measured) | formula | ratio | tp MiB / step predicted / measured | step ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            flags, ref = MODELS[model]
            loss = ["--loss=" + LOSS.get(model, "cross_entropy")]
            for t, n, stage in [(t, n, z) for t in args.tp for n in args.dp
                                for z in range(4)]:
                lib = os.path.join(tmp, f"{model}.{t}.{n}.{stage}.so")
                onnx = os.path.join(ROOT, "examples", model + ".onnx")
                common = [args.pcc, onnx, "--train", *loss, *flags,
                          f"--tp={t}", f"--dp={n}", f"--zero={stage}"]
                explain = subprocess.run(common + ["--explain"], check=True,
                                         capture_output=True, text=True).stdout
                predicted = float(re.search(r"total\s+([0-9.]+) MiB", explain).group(1))
                subprocess.run(common + ["-o", lib], check=True, capture_output=True)
                out = subprocess.run(
                    [args.pcc_run, "-n", str(n * t), lib, "--steps", str(args.steps),
                     "--log-every", str(args.steps)] + data_flags(ref),
                    check=True, capture_output=True, text=True).stdout
                high = float(re.search(r"memory high-water ([0-9.]+) MiB", out).group(1))
                psi = int(re.search(r"for Psi = (\d+)", explain).group(1))
                state = int(re.search(r"model state [0-9.]+ MiB \((\d+) bytes\)", out).group(1))
                other = re.search(r"\+ (\d+) bytes of other weights", explain)
                state -= int(other.group(1)) if other else 0
                moved = float(re.search(r"communication per step on each rank: [0-9.]+ Psi = "
                                        r"([0-9.]+) MiB", out).group(1)) * 1048576
                tp_pattern = r"tensor-parallel communication per step on each rank: ([0-9.]+) MiB"
                tp_predicted = re.search(tp_pattern, explain)
                tp_measured = re.search(tp_pattern, out)
                tp_text = (f"{tp_predicted.group(1)} / {tp_measured.group(1)}"
                           if tp_predicted and tp_measured else "-")
                ms = float(re.findall(r"([0-9.]+) ms\n", out)[-1])
                fs, fm = formula_state(stage, psi, n), formula_moved(stage, psi)
                print(f"| {model} | {t} | {n} | {stage} | {psi} | {state} | {fs:.0f} | "
                      f"{state / fs:.4f} | {predicted:.3f} / {high:.3f} | {moved:.0f} | "
                      f"{fm:.0f} | {moved / fm:.3f} | {tp_text} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
