#!/usr/bin/env python3
"""Single-device GPU inference: pcc's CUDA backend against PyTorch, in one run.

For each bundled model and batch size: the pcc library built with
--target=cuda is timed with `pcc-run --device cuda --bench` (inputs resident
on the GPU, each run synchronised; host wall time per run, for PyTorch too),
once launching its kernels directly and
once replaying them as a CUDA graph (`--cuda-graph`). PyTorch runs the same
model (the exporter's own nn.Module with the same seeded weights) on the
same GPU in fp32 (TF32 off), eagerly and as a captured CUDA graph. Outputs
are compared, and the ratios (PyTorch latency / pcc latency: above 1 means
pcc is faster) are printed for eager vs direct and graph vs graph.

    python3 bench/gpu_vs_pytorch.py                  # compile + run (GPU box)
    python3 bench/gpu_vs_pytorch.py --prepare DIR    # compile only (needs pcc)
    python3 bench/gpu_vs_pytorch.py --run DIR        # run only (GPU, pcc-run)
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "examples"))



def prepare(build, out, batches):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, flags, make_input in MODELS:
        model = os.path.join(ROOT, "examples", name + ".onnx")
        for batch in batches:
            tag = f"{name}_{batch}"
            np.save(os.path.join(out, tag + ".input.npy"), make_input(batch, rng))
            subprocess.run([os.path.join(build, "bin", "pcc"), model, *flags(batch), "--target=cuda",
                            "-o", os.path.join(out, tag + ".so")], check=True, capture_output=True)
            print(f"compiled {tag}", flush=True)


def time_pcc(run_binary, out, tag, runs, graph=False):
    output = os.path.join(out, tag + ".pcc.npy")
    run = subprocess.run([run_binary, os.path.join(out, tag + ".so"), "--device", "cuda",
                          "--input", os.path.join(out, tag + ".input.npy"), "--output", output,
                          "--bench", str(runs)] + (["--cuda-graph"] if graph else []),
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip())
    p50 = float(re.search(r"p50 ([0-9.]+)", run.stdout).group(1))
    device = re.search(r"^device (.*)$", run.stdout, re.M).group(1)
    return p50, np.load(output), device


def time_torch(name, x, runs):
    import torch
    import make_examples
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, _, _ = make_examples.build(name)
    model = model.cuda().eval()
    xt = torch.from_numpy(x).cuda()
    # Host wall time of one call plus synchronisation, as pcc-run measures
    # its runs (launch latency and the final wait included on both sides).
    def median(step):
        times = []
        for _ in range(runs):
            begin = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - begin) * 1000)
        times.sort()
        return times[len(times) // 2]

    with torch.inference_mode():
        for _ in range(20):
            y = model(xt)
        torch.cuda.synchronize()
        eager = median(lambda: model(xt))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(xt)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(xt)
        graphed = median(graph.replay)
    return eager, graphed, y.float().cpu().numpy()


def run_all(run_binary, out, batches, runs):
    import torch
    print(f"{runs} timed runs each; PyTorch {torch.__version__} eager, fp32 (TF32 off), "
          f"{torch.cuda.get_device_name()}")
    print("| model | batch | pcc p50 ms | PyTorch eager p50 ms | ratio | pcc graph p50 ms "
          "| PyTorch graph p50 ms | ratio | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, _, _ in MODELS:
        for batch in batches:
            tag = f"{name}_{batch}"
            x = np.load(os.path.join(out, tag + ".input.npy"))
            pcc_ms, pcc_out, _ = time_pcc(run_binary, out, tag, runs)
            try:
                pcc_graph_ms = time_pcc(run_binary, out, tag, runs, graph=True)[0]
            except RuntimeError as e:
                print(f"pcc --cuda-graph failed on {tag}: {e}", file=sys.stderr)
                pcc_graph_ms = float("nan")
            torch_ms, torch_graph_ms, torch_out = time_torch(name, x, runs)
            diff = float(np.max(np.abs(pcc_out - torch_out)))
            print(f"| {name} | {batch} | {pcc_ms:.3f} | {torch_ms:.3f} | {torch_ms / pcc_ms:.2f} "
                  f"| {pcc_graph_ms:.3f} | {torch_graph_ms:.3f} | {torch_graph_ms / pcc_graph_ms:.2f} "
                  f"| {diff:.1e} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--build", default=os.environ.get("PCC_BUILD_DIR", os.path.join(ROOT, "build")))
    parser.add_argument("--pcc-run", default=None, help="pcc-run binary (default: BUILD/bin/pcc-run)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prepare", metavar="DIR")
    mode.add_argument("--run", metavar="DIR")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    run_binary = args.pcc_run or os.path.join(args.build, "bin", "pcc-run")
    if args.prepare:
        prepare(args.build, args.prepare, batches)
    elif args.run:
        run_all(run_binary, args.run, batches, args.runs)
    else:
        with tempfile.TemporaryDirectory() as out:
            prepare(args.build, out, batches)
            run_all(run_binary, out, batches, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
