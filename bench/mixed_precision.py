#!/usr/bin/env python3
"""Mixed precision at real size: a training step of a Hugging Face GPT-2
124M (and a ~125M Llama) in pcc bf16, pcc fp32, PyTorch eager fp32 and
PyTorch eager under torch.autocast(bf16), in one run, alternating rounds.

The models are random-init configs (GPT2Config() defaults: 12 layers, width
768, vocabulary 50,257; a Llama of width 768, 12 layers, 12/4 heads, MLP
2048, vocabulary 32,000), dropout 0, exported once by the dynamo exporter
into ~/.cache/pcc/bench/<model>/ (about 500 MB each; not committed). Each
round compiles nothing: pcc's two libraries are compiled first; a round
runs `pcc-run --steps N` for each precision (the median step time of its
loss log, after the first step) and N PyTorch steps of each kind (zero_grad,
forward, cross-entropy, backward, AdamW with foreach=False), with the same
threads (OPENBLAS_CORETYPE unset for both sides). Prints the medians over
rounds, the ratios, and pcc's saved-activation bytes in each precision.

    env -u OPENBLAS_CORETYPE ~/.cache/pcc/zoo-venv/bin/python \\
        bench/mixed_precision.py [--models gpt2 llama] [--rounds 3] [--steps 4] \\
        [--profile]

On a GPU node, which has PyTorch and transformers but not pcc's toolchain,
in two halves (the weights, 500 MB, are not copied: the GPU node builds the
same random-init model and writes them from its state dict):

    bench/mixed_precision.py --prepare DIR [--batch 4 --seq 1024]  # here
    bench/mixed_precision.py --run DIR --pcc-run BIN               # GPU node

--run times pcc bf16, pcc fp32 (TF32 off), PyTorch eager fp32 (TF32 off),
PyTorch eager under torch.autocast("cuda", bf16) and the same compiled with
torch.compile, alternating rounds, each step ending in a synchronisation
(pcc-run reads every step's loss), and prints each one's model FLOP
utilisation against the GPU's dense bf16 peak (attention's FLOPs counted:
pcc computes the full S x S scores, so they are counted whole).
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pcc", "bench")
BATCH, SEQ = 4, 128
# Dense bf16 tensor-core peaks (NVIDIA's data sheets, without sparsity).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def build(name):
    import transformers
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
            max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(config)
    return model, config.vocab_size


class TextLM(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False,
                          return_dict=True).logits


def export(name, model, path, batch=BATCH, seq=SEQ):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ids = torch.zeros((batch, seq), dtype=torch.int64)
    wrapper = TextLM(model).eval()
    import contextlib
    import io
    import warnings
    t = time.time()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (ids,), path, dynamo=True,
                          input_names=["input_ids"], output_names=["logits"],
                          external_data=True)
    print("exported %s (%.0f s)" % (path, time.time() - t), flush=True)


def write_tokens(directory, vocab, batch, seq):
    """Seeded random token ids and labels, saved as ids.npy and labels.npy
    in `directory`: (ids, labels, ids path, labels path)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    labels = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    paths = (os.path.join(directory, "ids.npy"),
             os.path.join(directory, "labels.npy"))
    np.save(paths[0], ids)
    np.save(paths[1], labels)
    return ids, labels, paths[0], paths[1]


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env)
    if r.returncode != 0:
        sys.exit("mixed_precision.py: %s failed:\n%s" % (" ".join(cmd),
                                                         r.stdout[-4000:]))
    return r.stdout


def pcc_step(lib, work, inputs, labels, steps, env):
    log = os.path.join(work, "loss.csv")
    out = run([os.path.join(ROOT, "build", "bin", "pcc-run"), lib, "--steps",
               str(steps), "--input", inputs, "--labels", labels,
               "--lr", "1e-4", "--loss-log", log], env)
    with open(log) as f:
        ms = [float(r["step_ms"]) for r in csv.DictReader(f)]
    saved = re.search(r"saved activations ([0-9.]+) MiB", out)
    return statistics.median(ms[1:]) / 1e3, float(saved.group(1))


def torch_step(model, ids, labels, steps, bf16):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   labels.reshape(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def bench(name, args, env):
    model, vocab = build(name)
    model.train()
    path = os.path.join(CACHE, name, "model.onnx")
    if not os.path.exists(path):
        export(name, model, path)
    work = os.path.join(CACHE, name, "work")
    os.makedirs(work, exist_ok=True)
    ids, labels, inputs, label_file = write_tokens(work, vocab, BATCH, SEQ)
    libs = {}
    for precision in ("fp32", "bf16"):
        lib = os.path.join(work, "train-%s.so" % precision)
        t = time.time()
        run([os.path.join(ROOT, "build", "bin", "pcc"), path, "--train",
             "--loss=cross_entropy", "--optimizer=adamw",
             "--precision=" + precision, "-o", lib], env)
        print("%s: compiled pcc %s in %.0f s" % (name, precision,
                                                 time.time() - t), flush=True)
        libs[precision] = lib
    tids, tlabels = torch.from_numpy(ids), torch.from_numpy(labels)
    times = {k: [] for k in ("pcc-bf16", "pcc-fp32", "torch-fp32",
                             "torch-bf16")}
    saved = {}
    for r in range(args.rounds):
        for precision in ("bf16", "fp32"):
            s, mib = pcc_step(libs[precision], work, inputs, label_file,
                              args.steps + 1, env)
            times["pcc-" + precision].append(s)
            saved[precision] = mib
        for bf16 in (False, True):
            times["torch-bf16" if bf16 else "torch-fp32"].append(
                torch_step(model, tids, tlabels, args.steps, bf16))
        print("%s round %d: %s" % (name, r + 1, "  ".join(
            "%s %.3f s" % (k, v[-1]) for k, v in times.items())), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("\n%s, batch %d x %d, %d threads, median of %d rounds:" % (
        name, BATCH, SEQ, args.threads, args.rounds))
    for k, v in med.items():
        print("  %-10s %.3f s/step" % (k, v))
    print("  pcc bf16 vs PyTorch bf16 autocast: %.2fx" % (
        med["torch-bf16"] / med["pcc-bf16"]))
    print("  pcc bf16 vs pcc fp32:              %.2fx" % (
        med["pcc-fp32"] / med["pcc-bf16"]))
    print("  pcc fp32 vs PyTorch fp32:          %.2fx" % (
        med["torch-fp32"] / med["pcc-fp32"]))
    print("  PyTorch bf16 vs PyTorch fp32:      %.2fx" % (
        med["torch-fp32"] / med["torch-bf16"]))
    print("  saved activations: bf16 %.1f MiB, fp32 %.1f MiB (%.2fx)" % (
        saved["bf16"], saved["fp32"], saved["bf16"] / saved["fp32"]))
    if args.profile:
        for precision in ("bf16", "fp32"):
            out = run([os.path.join(ROOT, "build", "bin", "pcc-run"),
                       libs[precision], "--steps", str(args.steps + 1),
                       "--input", inputs, "--labels", label_file, "--lr",
                       "1e-4", "--profile"], env)
            table = out[out.index("profile:"):out.index("the 20 costliest")]
            print("\n%s pcc %s, where the step's time goes:\n%s" % (
                name, precision, table.rstrip()))


# ---------------------------------------------------------------- GPU node


def safetensors_header(path):
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: v["shape"] for k, v in header.items()}


def prepare_gpu(args):
    """Exports each model at --batch x --seq and compiles its fp32 and bf16
    training steps for CUDA into DIR/<model>/; keeps the weights' names and
    shapes, not the weights."""
    import json
    for name in args.models:
        model, vocab = build(name)
        tag = "%s-b%ds%d" % (name, args.batch, args.seq)
        path = os.path.join(CACHE, tag, "model.onnx")
        if not os.path.exists(path):
            export(name, model, path, args.batch, args.seq)
        out = os.path.join(args.prepare, name)
        os.makedirs(out, exist_ok=True)
        for precision in ("fp32", "bf16"):
            lib = os.path.join(out, "train-%s.so" % precision)
            t = time.time()
            run([os.path.join(ROOT, "build", "bin", "pcc"), path, "--train",
                 "--loss=cross_entropy", "--optimizer=adamw", "--target=cuda",
                 "--precision=" + precision, "-o", lib])
            weights = lib[:-3] + ".safetensors"
            shapes = safetensors_header(weights)
            os.remove(weights)
            print("%s: compiled pcc %s for CUDA in %.0f s" % (
                tag, precision, time.time() - t), flush=True)
        with open(os.path.join(out, "case.json"), "w") as f:
            json.dump({"model": name, "batch": args.batch, "seq": args.seq,
                       "vocab": vocab, "weights": shapes}, f)


def write_weights(model, shapes, path):
    """The library's weights file from the model's state dict: the ONNX
    initializers are the state dict's names under the export wrapper's
    'model.' prefix."""
    from safetensors.torch import save_file
    state = model.state_dict()
    tensors = {}
    for onnx_name, shape in shapes.items():
        key = onnx_name[len("model."):] if onnx_name.startswith(
            "model.") else onnx_name
        if key not in state:
            sys.exit("mixed_precision.py: initializer %s is not in the "
                     "model's state dict" % onnx_name)
        t = state[key].detach().float().contiguous().cpu()
        if list(t.shape) != list(shape):
            sys.exit("mixed_precision.py: %s has shape %s, the library "
                     "expects %s" % (onnx_name, list(t.shape), shape))
        tensors[onnx_name] = t.clone()
    save_file(tensors, path, metadata={"pcc.format": "1"})


def torch_cuda_step(model, ids, labels, steps, bf16, compiled=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = compiled if compiled is not None else model
    times = []
    for _ in range(steps + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = fwd(ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   labels.reshape(-1))
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def run_gpu(args):
    import json
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in device), None)
    print("device: %s, PyTorch %s" % (device, torch.__version__), flush=True)
    for name in args.models:
        case_dir = os.path.join(args.run, name)
        if not os.path.exists(os.path.join(case_dir, "case.json")):
            continue
        with open(os.path.join(case_dir, "case.json")) as f:
            case = json.load(f)
        batch, seq = case["batch"], case["seq"]
        model, vocab = build(name)
        model.train()
        weights = os.path.join(case_dir, "weights.safetensors")
        write_weights(model, case["weights"], weights)
        for precision in ("fp32", "bf16"):
            beside = os.path.join(case_dir, "train-%s.safetensors" % precision)
            if os.path.lexists(beside):
                os.remove(beside)
            os.symlink("weights.safetensors", beside)
        nparams = sum(p.numel() for p in model.parameters())
        cfg = model.config
        # 6 FLOPs per parameter per token for the products (the embedding
        # lookups are no products: wte counts once, as the tied LM head),
        # and the attention products QK^T and PV, 2 * 2 * S^2 * d per
        # sequence and layer forward, three times that with backward.
        embed = sum(p.numel() for n, p in model.named_parameters()
                    if "wpe" in n or "embed_tokens" in n)
        flops = 6 * (nparams - embed) * batch * seq + \
            12 * batch * seq * seq * cfg.hidden_size * cfg.num_hidden_layers
        ids, labels, inputs, label_file = write_tokens(case_dir, vocab, batch,
                                                       seq)
        wrapper = TextLM(model).cuda()
        tids = torch.from_numpy(ids).cuda()
        tlabels = torch.from_numpy(labels).cuda()
        compiled = None
        if args.torch_compile:
            t = time.time()
            compiled = torch.compile(wrapper)
            torch_cuda_step(wrapper, tids, tlabels, 1, True, compiled)
            print("%s: torch.compile warm-up %.0f s" % (name, time.time() - t),
                  flush=True)
        kinds = ["pcc-bf16", "pcc-fp32", "torch-fp32", "torch-bf16"] + (
            ["torch.compile-bf16"] if compiled is not None else [])
        times = {k: [] for k in kinds}
        for r in range(args.rounds):
            for precision in ("bf16", "fp32"):
                log = os.path.join(case_dir, "loss-%s.csv" % precision)
                run([args.pcc_run, os.path.join(case_dir,
                                                "train-%s.so" % precision),
                     "--device", "cuda", "--weights", weights,
                     "--steps", str(args.steps + 1), "--input", inputs,
                     "--labels", label_file, "--lr", "1e-4",
                     "--loss-log", log])
                with open(log) as f:
                    ms = [float(x["step_ms"]) for x in csv.DictReader(f)]
                times["pcc-" + precision].append(statistics.median(ms[1:]) / 1e3)
            times["torch-fp32"].append(
                torch_cuda_step(wrapper, tids, tlabels, args.steps, False))
            times["torch-bf16"].append(
                torch_cuda_step(wrapper, tids, tlabels, args.steps, True))
            if compiled is not None:
                times["torch.compile-bf16"].append(torch_cuda_step(
                    wrapper, tids, tlabels, args.steps, True, compiled))
            print("%s round %d: %s" % (name, r + 1, "  ".join(
                "%s %.1f ms" % (k, v[-1] * 1e3) for k, v in times.items())),
                flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print("\n%s, batch %d x %d, AdamW, %.1f TFLOP per step, median of "
              "%d rounds:" % (name, batch, seq, flops / 1e12, args.rounds))
        for k, v in med.items():
            mfu = "  MFU %.1f%%" % (100 * flops / v / peak) if peak else ""
            print("  %-20s %8.2f ms/step%s" % (k, v * 1e3, mfu))
        print("  pcc bf16 vs PyTorch bf16 autocast: %.2fx" % (
            med["torch-bf16"] / med["pcc-bf16"]))
        if compiled is not None:
            print("  pcc bf16 vs torch.compile bf16:    %.2fx" % (
                med["torch.compile-bf16"] / med["pcc-bf16"]))
        print("  pcc bf16 vs pcc fp32:              %.2fx" % (
            med["pcc-fp32"] / med["pcc-bf16"]))
        print("  pcc fp32 vs PyTorch fp32:          %.2fx" % (
            med["torch-fp32"] / med["pcc-fp32"]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"],
                    choices=["gpt2", "llama"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true",
                    help="end with pcc-run --profile's tables of a step")
    ap.add_argument("--prepare", metavar="DIR",
                    help="export and compile CUDA training steps into DIR")
    ap.add_argument("--run", metavar="DIR",
                    help="on a GPU node: time DIR's libraries against PyTorch")
    ap.add_argument("--pcc-run", default=os.path.join(ROOT, "build", "bin",
                                                      "pcc-run"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024,
                    help="the GPU run's sequence length (default 1024)")
    ap.add_argument("--no-torch-compile", dest="torch_compile",
                    action="store_false")
    args = ap.parse_args()
    if args.prepare:
        return prepare_gpu(args)
    if args.run:
        return run_gpu(args)
    torch.set_num_threads(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env.pop("OPENBLAS_CORETYPE", None)
    for name in args.models:
        bench(name, args, env)


if __name__ == "__main__":
    main()
