#!/usr/bin/env python3
"""Writes a sequence-first model ([seq, batch, hidden] in and out, a
softmax over the sequence, so only dimension 1 holds independent rows),
its input and the expected output (numpy).

  seq_first.py OUT_DIR   # seq_first.onnxtxt, seq_first.in.npy, seq_first.out.npy
"""
import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
S, B, H = 4, 4, 8
w = [rng.standard_normal((H, H)).astype(np.float32) * 0.5 for _ in range(3)]
x = rng.standard_normal((S, B, H)).astype(np.float32)


def lit(a):
    return "{" + ", ".join(f"{v:.8e}" for v in a.ravel()) + "}"


text = f"""<
  ir_version: 8,
  opset_import: ["" : 17]
>
seqfirst (float[{S},{B},{H}] x) => (float[{S},{B},{H}] y)
<float[{H},{H}] w0 = {lit(w[0])}, float[{H},{H}] w1 = {lit(w[1])}, float[{H},{H}] w2 = {lit(w[2])}>
{{
  h0 = MatMul (x, w0)
  a0 = Softmax <axis = 0> (h0)
  h1 = MatMul (a0, w1)
  a1 = Relu (h1)
  h2 = MatMul (a1, w2)
  y = Tanh (h2)
}}
"""
open(os.path.join(out, "seq_first.onnxtxt"), "w").write(text)
np.save(os.path.join(out, "seq_first.in.npy"), x)
h0 = x @ w[0]
e = np.exp(h0 - h0.max(axis=0, keepdims=True))
a0 = e / e.sum(axis=0, keepdims=True)
y = np.tanh(np.maximum(a0 @ w[1], 0) @ w[2])
np.save(os.path.join(out, "seq_first.out.npy"), y.astype(np.float32))
