#!/usr/bin/env python3
"""Trains a bundled model (or a zoo model: zoo-gpt2, zoo-llama, exported
for training in test/Training/zoo/<family>/model.onnx) with pcc for the
steps of a PyTorch reference run (test/Training/ref/<model>) and compares
the per-step losses and the final weights with PyTorch's (compare.py).

  parity.py --model gpt --optimizer adamw --pcc build/bin/pcc \
      --pcc-run build/bin/pcc-run --work /tmp/gpt-adamw [--microbatches 2] \
      [--dp 2] [--tp 2]

With --dp N the library is compiled for N data-parallel ranks (pcc --dp)
and trained with pcc-run -n N: the same references, since data parallelism
must train what one device trains. --tp M splits the model over M
tensor-parallel ranks as well (pcc-run -n N*M).

Exit status 0 when every loss and weight matches within the tolerances of
the issue (losses relative 1e-5; weights rtol 1e-4, AdamW 1e-3 / 1e-5: see
ref/README.md for why)."""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# How each model is compiled for its reference's batch (config.json).
MODELS = {
    "mlp": (["--batch=4"], "cross_entropy"),
    "transformer_postnorm": (["--batch=4"], "mse"),
    "transformer_prenorm": (["--batch=4"], "mse"),
    "gpt": (["--dim=batch=4", "--dim=seq=16"], "cross_entropy"),
    "resnet18": (["--batch=4"], "cross_entropy"),
    "resnet18_train": (["--batch=8"], "cross_entropy"),
    # The zoo's tiny Hugging Face models; inputs input_ids and attention_mask.
    "zoo-gpt2": (["--dim=batch=4", "--dim=seq=16"], "cross_entropy"),
    "zoo-llama": (["--dim=batch=4", "--dim=seq=16"], "cross_entropy"),
    # A GPT written in plain PyTorch (user_models.py), dynamic batch.
    "user-gpt": (["--batch=4"], "cross_entropy"),
}


# bf16 against torch.autocast. Both round each product's operands and
# result to bf16, but not at exactly the same places (autocast also rounds
# the elementwise ops that follow a product; pcc computes them in f32), and
# their products accumulate in another order; one flipped rounding early in
# a step moves everything after it by about a bf16 unit. So the runs differ
# by bf16's own noise, whose size PyTorch's autocast run against its f32 run
# measures (ref/<model>/bf16.json, with SGD and with AdamW). The bound:
# pcc's bf16 run is within three times that of PyTorch's bf16 run, and
# losses within at least 1e-3 (docs/guide/mixed-precision.md). fp16 (with
# GradScaler's loss scaling on both sides) is bounded the same way by its
# own noise (fp16.json), measured twice: against the f32 run, and against
# the same fp16 run with GELU decomposed op by op as the ONNX exporter
# writes it (PyTorch's F.gelu rounds once; the exported graph, which pcc
# runs, rounds after each op), an equally valid fp16 run of the exported
# graph. The larger of the two counts.
def bf16_tolerances(ref, optimizer, precision="bf16"):
    with open(os.path.join(ref, precision + ".json")) as f:
        runs = json.load(f)["optimizers"]
    if precision == "fp16":
        for r in runs.values():
            for what in ("loss_rel_diff_max", "grad_norm_rel_diff_max",
                         "weights_max_abs_diff"):
                key = "fp32_vs_fp16_" + what
                r[key] = max(r[key], r.get("fp16_vs_decomposed_gelu_" + what, 0))
    # bf16's noise is the model's: one pair of runs estimates it roughly,
    # so losses and gradient norms take the larger of the two optimizers'
    # estimates; the final weights, which each optimizer moves its own way,
    # take their optimizer's.
    key = "fp32_vs_" + precision
    loss = max(r[key + "_loss_rel_diff_max"] for r in runs.values())
    grad = max(r[key + "_grad_norm_rel_diff_max"] for r in runs.values())
    weights = runs[optimizer][key + "_weights_max_abs_diff"]
    return ["--rtol", repr(max(1e-3, 3 * loss)),
            "--grad-norm-rtol", repr(max(1e-2, 3 * grad)),
            "--wrtol", "0", "--watol", repr(3 * weights)]


def onnx_path(model):
    if model.startswith("zoo-"):
        return os.path.join(HERE, "zoo", model[len("zoo-"):], "model.onnx")
    if model.startswith("user-"):
        return os.path.join(HERE, "user", model[len("user-"):], "model.onnx")
    return os.path.join(ROOT, "examples", model + ".onnx")


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.exit("parity.py: command failed with status %d" % r.returncode)
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--optimizer", required=True, choices=["sgd", "adamw"])
    ap.add_argument("--pcc", required=True)
    ap.add_argument("--pcc-run", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1,
                    help="pipeline ranks (pcc --pp; the schedule with "
                    "--pcc-args=--schedule=...)")
    ap.add_argument("--auto", type=int, default=0, metavar="N",
                    help="let pcc choose the plan for N ranks (pcc --auto "
                    "--devices=N; --pcc-args gives --device-memory)")
    ap.add_argument("--sp", action="store_true",
                    help="sequence parallelism over the tp ranks (pcc --sp)")
    ap.add_argument("--pcc-args", default="",
                    help="extra pcc options, one string")
    ap.add_argument("--run-args", default="",
                    help="extra pcc-run options, one string (e.g. "
                    "--gpu-collectives=staged)")
    ap.add_argument("--compare-args", default="",
                    help="extra compare.py options (tolerances), one string")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                    default="fp32",
                    help="bf16 or fp16: pcc --precision=bf16 (fp16) against "
                    "PyTorch's torch.autocast run (ref/<model>/<precision>."
                    "<opt>.*; fp16 with GradScaler), within "
                    "bf16_tolerances()")
    ap.add_argument("--ref-tag", default=None,
                    help="the references ref/<model>/<tag>.<opt>.* instead "
                    "of <precision>.<opt>.* (make_reference.py --tag), with "
                    "the precision's tolerances")
    ap.add_argument("--against", default=None, metavar="WORK",
                    help="compare with another parity.py run (its --work "
                    "directory: loss.csv and the last checkpoint) instead "
                    "of PyTorch's: a layout against the one-device run of "
                    "the same precision")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--stage", choices=["all", "compile", "run", "train"],
                    default="all",
                    help="compile only (on a build node), run only (a "
                    "library compiled into --work before, e.g. on a GPU "
                    "node without the compiler), or both; train: both "
                    "without the comparison (a run that others compare "
                    "with --against)")
    args = ap.parse_args()

    ref = os.path.join(HERE, "ref", args.model)
    config = json.load(open(os.path.join(ref, "config.json")))
    opt = config["optimizers"][args.optimizer]
    flags, loss = MODELS[args.model]
    os.makedirs(args.work, exist_ok=True)
    lib = os.path.join(args.work, "train.so")
    if args.stage == "run" and not os.path.exists(lib):
        sys.exit("parity.py: no %s: compile it first (--stage compile)" % lib)
    if args.stage != "run":
        plan = (["--auto", "--devices=%d" % args.auto] if args.auto else
                ["--microbatches=%d" % args.microbatches, "--dp=%d" % args.dp,
                 "--tp=%d" % args.tp, "--pp=%d" % args.pp,
                 "--zero=%d" % args.zero])
        run([args.pcc, onnx_path(args.model),
             "--train", "--loss=" + loss, "--optimizer=" + args.optimizer,
             "--target=" + args.target, "--precision=" + args.precision,
             "-o", lib] + plan +
            (["--sp"] if args.sp else []) + args.pcc_args.split() + flags)
    if args.stage == "compile":
        return

    hyper = ["--lr", repr(opt["lr"]), "--weight-decay",
             repr(opt["weight_decay"])]
    if args.optimizer == "sgd":
        hyper += ["--momentum", repr(opt["momentum"]), "--dampening",
                  repr(opt["dampening"])]
        if opt["nesterov"]:
            hyper.append("--nesterov")
    else:
        hyper += ["--betas", "%r,%r" % tuple(opt["betas"]), "--eps",
                  repr(opt["eps"])]
    if opt.get("clip_grad_norm"):
        hyper += ["--clip-grad-norm", repr(opt["clip_grad_norm"])]
    log = os.path.join(args.work, "loss.csv")
    ckpt = os.path.join(args.work, "ckpt")
    # One --input per model input, in the model's order (config "inputs").
    inputs = []
    for f in config.get("inputs", ["input.npy"]):
        inputs += ["--input", os.path.join(ref, f)]
    n = args.auto or args.dp * args.tp * args.pp
    ranks = ["-n", str(n)] if n > 1 else []
    run([args.pcc_run] + ranks + [lib, "--steps", str(config["steps"]),
         "--device", args.device] + inputs + [
         "--labels", os.path.join(ref, "labels.npy"),
         "--loss-log", log, "--save-dir", ckpt, "--log-every", "5"] + hyper +
        args.run_args.split())

    sys.stdout.flush()
    if args.stage == "train":
        return
    tolerances = (["--wrtol", "1e-3", "--watol", "1e-5"]
                  if args.optimizer == "adamw" else [])
    prefix = args.ref_tag + "." if args.ref_tag else ""
    if args.precision != "fp32":
        prefix = (args.ref_tag or args.precision) + "."
        tolerances = bf16_tolerances(ref, args.optimizer, args.precision)
    ref_losses = os.path.join(ref, prefix + args.optimizer + ".losses.csv")
    ref_weights = os.path.join(ref, prefix + args.optimizer +
                               ".final.safetensors")
    exclude = []
    if args.against:
        # The reference's noise elements (attention's key bias) stay
        # excluded when two pcc runs are compared.
        if os.path.exists(ref_weights):
            exclude = ["--exclude-from", ref_weights]
        ref_losses = os.path.join(args.against, "loss.csv")
        ref_weights = os.path.join(args.against, "ckpt",
                                   "step-%08d" % config["steps"],
                                   "weights.safetensors")
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "compare.py"),
         "--ref-losses", ref_losses,
         "--losses", log,
         "--ref-weights", ref_weights,
         "--weights", os.path.join(ckpt, "step-%08d" % config["steps"],
                                   "weights.safetensors")] + tolerances +
        exclude + args.compare_args.split())
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
