#!/usr/bin/env python3
"""Writes small ONNX text models of the ops pcc builds from other ops
(CumSum, Trilu on run-time data, ScatterND with constant indices, Einsum,
RMSNormalization, GatherND and GatherElements with run-time indices), an
input for each and the expected output computed with numpy.

  composite_ops.py OUT_DIR   # writes NAME.onnxtxt, NAME.in*.npy, NAME.out.npy
and prints one line per model: NAME followed by its pcc-run input flags.
"""
import os
import sys

import numpy as np

rng = np.random.default_rng(0)
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)


def write(name, graph, inputs, expected, opset=23):
    text = f"<\n  ir_version: 10,\n  opset_import: [\"\" : {opset}]\n>\n{graph}\n"
    with open(os.path.join(out_dir, name + ".onnxtxt"), "w") as f:
        f.write(text)
    flags = []
    for i, x in enumerate(inputs):
        path = os.path.join(out_dir, f"{name}.in{i}.npy")
        np.save(path, x)
        flags.append(f"--input {path}")
    np.save(os.path.join(out_dir, name + ".out.npy"), expected)
    print(name, " ".join(flags))


x = rng.standard_normal((2, 5, 3)).astype(np.float32)
# CumSum along axis 1, plain, exclusive and reverse.
cs = np.cumsum(x, axis=1)
write("cumsum", """g (float[2,5,3] x) => (float[2,5,3] y) {
  a = Constant <value = int64[1] {1}> ()
  y = CumSum (x, a)
}""", [x], cs)
excl = np.concatenate([np.zeros_like(x[:, :1]), cs[:, :-1]], axis=1)
write("cumsum_exclusive", """g (float[2,5,3] x) => (float[2,5,3] y) {
  a = Constant <value = int64[1] {1}> ()
  y = CumSum <exclusive = 1> (x, a)
}""", [x], excl)
rev = np.flip(np.cumsum(np.flip(x, 1), axis=1), 1).copy()
write("cumsum_reverse", """g (float[2,5,3] x) => (float[2,5,3] y) {
  a = Constant <value = int64[1] {-2}> ()
  y = CumSum <reverse = 1> (x, a)
}""", [x], rev)
# Position ids from an attention mask, as transformers computes them.
mask = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=np.int64)
write("cumsum_positions", """g (int64[2,6] m) => (int64[2,6] p) {
  a = Constant <value = int64[1] {1}> ()
  c = CumSum (m, a)
  one = Constant <value = int64[1] {1}> ()
  p = Sub (c, one)
}""", [mask], np.cumsum(mask, axis=1) - 1)
# Trilu on run-time data.
t = rng.standard_normal((2, 4, 5)).astype(np.float32)
write("triu", """g (float[2,4,5] x) => (float[2,4,5] y) {
  k = Constant <value = int64[1] {1}> ()
  y = Trilu <upper = 1> (x, k)
}""", [t], np.triu(t, 1))
write("tril", """g (float[2,4,5] x) => (float[2,4,5] y) {
  y = Trilu <upper = 0> (x)
}""", [t], np.tril(t))
# ScatterND with constant indices (a KV-cache style row update).
d = rng.standard_normal((4, 3)).astype(np.float32)
u = rng.standard_normal((2, 3)).astype(np.float32)
sc = d.copy()
sc[[3, 1]] = u
write("scatternd", """g (float[4,3] d, float[2,3] u) => (float[4,3] y) {
  i = Constant <value = int64[2,1] {3, 1}> ()
  y = ScatterND (d, i, u)
}""", [d, u], sc)
# Einsum: attention scores, a transposing contraction, a sum.
q = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
k = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
write("einsum_scores", """g (float[2,3,4,8] q, float[2,3,5,8] k) => (float[2,3,4,5] s) {
  s = Einsum <equation = "bhqd,bhkd->bhqk"> (q, k)
}""", [q, k], np.einsum("bhqd,bhkd->bhqk", q, k))
a = rng.standard_normal((3, 4)).astype(np.float32)
b = rng.standard_normal((5, 4)).astype(np.float32)
write("einsum_implicit", """g (float[3,4] a, float[5,4] b) => (float[3,5] c) {
  c = Einsum <equation = "ij,kj"> (a, b)
}""", [a, b], np.einsum("ij,kj", a, b))
write("einsum_ellipsis", """g (float[2,3,4,8] q, float[2,3,5,8] k) => (float[2,3,5,4] s) {
  s = Einsum <equation = "...qd,...kd->...kq"> (q, k)
}""", [q, k], np.einsum("...qd,...kd->...kq", q, k))
# RMSNormalization (opset 23).
r = rng.standard_normal((2, 4, 8)).astype(np.float32)
g = rng.standard_normal((8,)).astype(np.float32)
rms = r / np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + 1e-6) * g
write("rmsnorm", """g (float[2,4,8] x, float[8] s) => (float[2,4,8] y) {
  y = RMSNormalization <axis = -1, epsilon = 0.000001> (x, s)
}""", [r, g], rms.astype(np.float32))
# GatherND and GatherElements with run-time indices.
gd = rng.standard_normal((3, 4, 2)).astype(np.float32)
gi = np.array([[[0, 1], [2, 3]], [[1, -1], [0, 0]]], dtype=np.int64)
gnd = np.stack([[gd[tuple(ix)] for ix in row] for row in gi])
write("gathernd", """g (float[3,4,2] d, int64[2,2,2] i) => (float[2,2,2] y) {
  y = GatherND (d, i)
}""", [gd, gi], gnd)
ge = rng.standard_normal((3, 4)).astype(np.float32)
gei = np.array([[0, 3, -1], [2, 0, 1], [1, 1, 3]], dtype=np.int64)
write("gather_elements", """g (float[3,4] d, int64[3,3] i) => (float[3,3] y) {
  y = GatherElements <axis = 1> (d, i)
}""", [ge, gei], np.take_along_axis(ge, np.where(gei < 0, gei + 4, gei), axis=1))
# Mod (C's fmod for floats, Python's % for integers, 0 for a zero integer
# divisor) and IsInf / IsNaN on run-time data.
mx = (rng.standard_normal((2, 8)) * 5).astype(np.float32)
mx[0, 0], mx[0, 1] = np.inf, -np.inf
my = (rng.standard_normal((2, 8)) * 2).astype(np.float32)
my[1, 1] = np.nan
with np.errstate(all="ignore"):
    write("mod_float", """g (float[2,8] x, float[2,8] y) => (float[2,8] r) {
  r = Mod <fmod = 1> (x, y)
}""", [mx, my], np.fmod(mx, my).astype(np.float32))
ia = rng.integers(-20, 20, (2, 8)).astype(np.int64)
ib = rng.integers(1, 7, (2, 8)).astype(np.int64) * np.where(rng.random((2, 8)) < 0.5, -1, 1)
ib[0, 3] = 0
write("mod_int", """g (int64[2,8] a, int64[2,8] b) => (int64[2,8] r) {
  r = Mod (a, b)
}""", [ia, ib], np.where(ib == 0, 0, np.mod(ia, np.where(ib == 0, 1, ib))).astype(np.int64))
write("isinf_isnan", """g (float[2,8] x, float[2,8] y) => (bool[2,8] pos, bool[2,8] nan) {
  pos = IsInf <detect_negative = 0> (x)
  nan = IsNaN (y)
}""", [mx, my], np.isposinf(mx))
# Implicit output with an ellipsis in both operands: the ellipsis's
# dimensions lead the output (a batched matrix product).
ea = rng.standard_normal((2, 3, 4)).astype(np.float32)
eb = rng.standard_normal((2, 4, 5)).astype(np.float32)
write("einsum_implicit_ellipsis", """g (float[2,3,4] a, float[2,4,5] b) => (float[2,3,5] c) {
  c = Einsum <equation = "...ij,...jk"> (a, b)
}""", [ea, eb], np.einsum("...ij,...jk", ea, eb))
# CumSum of a constant folds while importing (one running sum per line):
# plain along the middle axis, exclusive and reverse along the last.
k = rng.standard_normal((2, 5, 3)).astype(np.float32)
kf = ", ".join(repr(float(v)) for v in k.reshape(-1))
kcs = np.cumsum(k, axis=1)
kex = np.flip(np.cumsum(np.flip(k, 2), axis=2), 2) - k
write("cumsum_folded", """g (float[2,5,3] x) => (float[2,5,3] y) {
  c = Constant <value = float[2,5,3] {%s}> ()
  a = Constant <value = int64[1] {1}> ()
  b = Constant <value = int64[1] {-1}> ()
  s = CumSum (c, a)
  r = CumSum <exclusive = 1, reverse = 1> (c, b)
  t = Add (x, s)
  y = Add (t, r)
}""" % kf, [x], (x + kcs + kex).astype(np.float32))
