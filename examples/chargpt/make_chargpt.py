#!/usr/bin/env python3
"""Export a small, randomly initialised character-level GPT to ONNX.

Run with the zoo environment's Python (torch 2.x, onnx, onnxruntime):

    ~/.cache/pcc/zoo-venv/bin/python examples/chargpt/make_chargpt.py

Writes examples/chargpt/chargpt.onnx: the GPT class of
examples/make_examples.py (learned positions, pre-LN blocks with fused QKV,
causal mask from the runtime length, tanh-GELU MLP, LM head tied to the
token embedding) with a byte vocabulary of 256, d 128, 4 layers, 4 heads and
at most 64 positions (834,304 parameters), initialised nanoGPT-style
(normal std 0.02, the residual projections scaled by 1/sqrt(2 * layers),
zero biases, LayerNorm 1/0) so the untrained loss is ln(256) = 5.55.

Input `input_ids` int64 [batch, seq] (seq <= 64), output `logits` float32
[batch, seq, 256]; batch and seq are symbolic. Exported with the TorchScript
exporter at opset 17. The script checks the export against PyTorch with
onnxruntime at two different (batch, seq) shapes.
"""

import argparse
import math
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from make_examples import GPT  # noqa: E402  (examples/make_examples.py)

OPSET = 17


def init_weights(model, n_layer):
    """nanoGPT's initialisation (make_examples.GPT's own is tuned for
    O(1) logits of an untrained reference model, not for training)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".weight") and p.dim() >= 2:
                std = 0.02
                if name.endswith("attn.proj.weight") or \
                        name.endswith("mlp.proj.weight"):
                    std = 0.02 / math.sqrt(2 * n_layer)
                nn.init.normal_(p, mean=0.0, std=std)
            elif (name.startswith("ln") or ".ln" in name) and \
                    name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--max-seq", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("-o", "--output", default=os.path.join(HERE, "chargpt.onnx"))
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = GPT(vocab=args.vocab, d=args.d, n_layer=args.layers,
                n_head=args.heads, max_seq=args.max_seq)
    init_weights(model, args.layers)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())  # tied: counted once

    example = torch.randint(0, args.vocab, (2, 16), dtype=torch.int64)
    # The TorchScript exporter is deprecated in torch 2.9+, not gone.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    with torch.no_grad():
        torch.onnx.export(
            model, (example,), args.output, dynamo=False,
            opset_version=OPSET,
            input_names=["input_ids"], output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                          "logits": {0: "batch", 1: "seq"}},
            # In eval mode the exporter merges initializers with equal
            # values (at init every LayerNorm weight is all ones and every
            # bias all zeros), which training would then tie together. In
            # training mode it merges only parameters that are one tensor
            # (the tied LM head). Without constant folding the Linear
            # weights keep their names (blocks.0.attn.qkv.weight, ...)
            # behind a Transpose instead of becoming onnx::MatMul_NNN
            # copies: one initializer per PyTorch parameter. The model has
            # no dropout or batch norm, so training mode computes the same.
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False)

    m = onnx.load(args.output)
    onnx.checker.check_model(m)
    size = os.path.getsize(args.output)
    print("%s: %d parameters (LM head tied) in %d initializers, %d bytes, "
          "%d nodes, opset %d"
          % (os.path.relpath(args.output), n_params, len(m.graph.initializer),
             size, len(m.graph.node), m.opset_import[0].version))

    # The symbolic dims really are symbolic: check two shapes against torch.
    import onnxruntime as ort
    sess = ort.InferenceSession(args.output,
                                providers=["CPUExecutionProvider"])
    for b, t in ((2, 16), (3, args.max_seq), (1, 1)):
        ids = torch.randint(0, args.vocab, (b, t), dtype=torch.int64)
        with torch.no_grad():
            ref = model(ids).numpy()
        got = sess.run(["logits"], {"input_ids": ids.numpy()})[0]
        err = float(np.abs(got - ref).max())
        print("  onnxruntime [%d, %d] -> %s, max |ort - torch| = %.2e"
              % (b, t, list(got.shape), err))
        assert err < 1e-4, err
    # Untrained: the mean cross-entropy is close to ln(vocab).
    ids = torch.randint(0, args.vocab, (4, args.max_seq), dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids)
    ce = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, args.vocab),
                                     ids[:, 1:].reshape(-1)).item()
    print("  untrained loss on random ids %.4f (ln %d = %.4f)"
          % (ce, args.vocab, math.log(args.vocab)))
    if size > 5 * 1024 * 1024:
        print("WARNING: %s is larger than 5 MB" % args.output, file=sys.stderr)


if __name__ == "__main__":
    main()
