#!/usr/bin/env python3
"""Generate text with a trained character GPT (the ONNX of `pcc export`).

    ~/.cache/pcc/zoo-venv/bin/python examples/chargpt/generate.py trained.onnx \\
        [--prompt "This License"] [--chars 200] [--temperature 0.8] [--seed 0]

Runs the model with onnxruntime. Tokens are bytes; each step feeds the last
--window tokens (at most the model's 64 positions; the exported model has
symbolic batch and seq, so any length from 1 to 64 works) and picks the next
byte from the last position's logits: greedily with --temperature 0,
otherwise sampled from softmax(logits / T), optionally among the --top-k most
likely, with a seeded generator.
"""

import argparse
import sys

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="trained.onnx")
    ap.add_argument("--prompt", default="This License")
    ap.add_argument("--chars", type=int, default=200)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(args.model, opts,
                                providers=["CPUExecutionProvider"])
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
    if out.shape[-1] != 256:
        sys.exit("expected a byte vocabulary of 256, the model has %r"
                 % (out.shape[-1],))
    rng = np.random.default_rng(args.seed)

    tokens = list(args.prompt.encode("utf-8"))
    for _ in range(args.chars):
        ids = np.array([tokens[-args.window:]], dtype=np.int64)
        logits = sess.run([out.name], {inp.name: ids})[0][0, -1]
        logits = logits.astype(np.float64)
        if args.temperature <= 0:
            nxt = int(np.argmax(logits))
        else:
            logits = logits / args.temperature
            if args.top_k > 0:
                kth = np.sort(logits)[-args.top_k]
                logits = np.where(logits < kth, -np.inf, logits)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            nxt = int(rng.choice(256, p=p))
        tokens.append(nxt)
    sys.stdout.write(bytes(tokens).decode("utf-8", errors="replace"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
