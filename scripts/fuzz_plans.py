#!/usr/bin/env python3
"""A differential fuzzer of pcc's whole compile pipeline (numpy only).

Generates random, well-typed ONNX models (text format) from the supported
op set: MLPs, transformer stacks (token and position embeddings, fused or
separate q/k/v, heads merged and split by reshapes, causal masks or masks
from an input, tied or untied heads) and convolutional nets, with random
widths, head counts, sequence lengths and odd, tiny and size-1 dimensions;
and random plans (tp, pp with schedules and chunks, dp, ZeRO 0-3, sp,
micro-batches, recompute, buckets, the LM head fused with its loss; a
third of the models in bf16 or fp16). Each (model, plan) pair is compiled
by pcc, run by pcc-run on CPU ranks over MPI, and compared with the same
model's one-device run in the same precision: the outputs for inference;
the per-step losses, gradient norms and final weights for training. A
16-bit model is compared within four times its own rounding noise (its
one-device run against its fp32 run) and at least its format's unit
roundoff, fp32 within float32's bounds.

A finding is: a crash or signal, a compile slower than --compile-timeout
(a planner that loops), a run that hangs, a refusal with no `error:` line,
a failed run, or a mismatch. A refusal with a clear `error:` line is not a
finding; the summary counts each kind of refusal. Each finding is shrunk
(fewer layers, smaller dimensions, a simpler plan, while the same kind of
finding remains) and written as a case directory (model.onnxtxt, the plan,
the command lines, what went wrong) under the work directory.

    fuzz_plans.py --seconds 600 [--seed 1] [--jobs 2] [--work DIR]
    fuzz_plans.py --cases 40 --seed 1          # a fixed run (the test suite)
    fuzz_plans.py --check case.json            # one case again (regressions)

pcc and pcc-run are --pcc and --pcc-run, or those in --bin, or the PATH's.
Regression cases live in test/Fuzz/Inputs/plans/<name>/ (case.json and
model.onnxtxt); test/Fuzz/fuzz-plans.test checks every one.
"""

import argparse
import concurrent.futures
import copy
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "Training"))
from compare import read_safetensors  # noqa: E402

IGNORE = -100
STEPS = 3
# A 16-bit plan against its 16-bit one-device run: within this many times
# the model's own noise against fp32 (noise()).
NOISE_FACTOR = 4


# --------------------------------------------------------------------------
# Models: a spec (a dict of choices) and the ONNX text it generates
# --------------------------------------------------------------------------
class Literal(str):
    """An attribute written as it is (a tensor literal)."""


class Graph:
    """An ONNX graph written in ONNX's text format."""

    def __init__(self, seed):
        self.rng = np.random.RandomState(seed % 2**32)
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.count = 0

    def fresh(self, base):
        self.count += 1
        return "%s%d" % (base, self.count)

    def weight(self, name, shape, scale=None, offset=0.0):
        fan_in = shape[-1] if len(shape) > 1 else max(shape[0], 1)
        scale = scale if scale is not None else 1.0 / math.sqrt(fan_in)
        values = (offset + self.rng.standard_normal(shape) * scale).astype(
            np.float32)
        self.inits.append(("float", list(shape), name, values.reshape(-1)))
        return name

    def constant(self, values, dtype="float", shape=None):
        """A Constant node, as exporters write masks, scales and shapes
        (an initializer would be a weight that training updates)."""
        values = np.asarray(values)
        shape = list(values.shape) if shape is None else shape
        name = self.fresh("c")
        literal = "%s {%s}" % (self._type(dtype, shape), ", ".join(
            ("%.9g" % v if dtype == "float" else str(int(v)))
            for v in values.reshape(-1)))
        self.nodes.append(("Constant", [], {"value": Literal(literal)},
                           [name]))
        return name

    def op(self, op_type, inputs, attrs=None, outputs=1):
        outs = [self.fresh("t") for _ in range(outputs)]
        self.nodes.append((op_type, list(inputs), attrs or {}, outs))
        return outs[0] if outputs == 1 else outs

    @staticmethod
    def _attr(v):
        if isinstance(v, Literal):
            return str(v)
        if isinstance(v, bool):
            return str(int(v))
        if isinstance(v, float):
            s = repr(float(v))
            return s if ("." in s or "e" in s) else s + ".0"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(Graph._attr(x) for x in v) + "]"
        return str(v)

    @staticmethod
    def _type(dtype, shape):
        if not shape:
            return dtype
        return "%s[%s]" % (dtype, ", ".join(str(d) for d in shape))

    def text(self, name="fuzz"):
        def value(dtype, v):
            if dtype == "float":
                return "%.9g" % v
            return str(int(v))
        lines = ["<", "  ir_version: 8,", '  opset_import: ["" : 17]', ">"]
        ins = ", ".join("%s %s" % (self._type(d, s), n)
                        for n, d, s in self.inputs)
        outs = ", ".join("%s %s" % (self._type(d, s), n)
                         for n, d, s in self.outputs)
        lines.append("%s (%s) => (%s)" % (name, ins, outs))
        inits = []
        for dtype, shape, n, vals in self.inits:
            inits.append("%s %s = {%s}" % (
                self._type(dtype, shape), n,
                ", ".join(value(dtype, v) for v in vals)))
        if inits:
            lines.append("<" + ",\n ".join(inits) + ">")
        lines.append("{")
        for op_type, inputs, attrs, outs in self.nodes:
            a = ""
            if attrs:
                a = " <%s>" % ", ".join("%s = %s" % (k, self._attr(v))
                                        for k, v in attrs.items())
            lines.append("  %s = %s%s (%s)" % (", ".join(outs), op_type, a,
                                               ", ".join(inputs)))
        lines.append("}")
        return "\n".join(lines) + "\n"


def activation(g, x, kind):
    if kind == "relu":
        return g.op("Relu", [x])
    if kind == "tanh":
        return g.op("Tanh", [x])
    if kind == "sigmoid":
        return g.op("Sigmoid", [x])
    if kind == "gelu":  # exact GELU as the TorchScript exporter writes it
        e = g.op("Erf", [g.op("Div", [x, g.constant(np.float32(math.sqrt(2)),
                                                    shape=[])])])
        h = g.op("Mul", [x, g.op("Add", [e, g.constant(np.float32(1),
                                                        shape=[])])])
        return g.op("Mul", [h, g.constant(np.float32(0.5), shape=[])])
    return x


def linear(g, x, d_in, d_out, name, spec_bias=True, gemm=False):
    """x [.., d_in] -> [.., d_out]: Gemm with transB (2-D x) or MatMul +
    Add, as exporters write Linear."""
    if gemm:
        w = g.weight(name + "_weight", [d_out, d_in])
        ins = [x, w]
        if spec_bias:
            ins.append(g.weight(name + "_bias", [d_out], 0.1))
        return g.op("Gemm", ins, {"transB": 1})
    w = g.weight(name + "_weight", [d_in, d_out])
    y = g.op("MatMul", [x, w])
    if spec_bias:
        y = g.op("Add", [y, g.weight(name + "_bias", [d_out], 0.1)])
    return y


def rms_norm(g, x, d, name):
    """Llama's RMSNorm as exporters write it: x / sqrt(mean(x^2) + eps) * w."""
    ms = g.op("ReduceMean", [g.op("Mul", [x, x])], {"axes": [-1],
                                                      "keepdims": 1})
    eps = g.constant(np.float32(1e-6), shape=[])
    r = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [ms, eps])])])
    return g.op("Mul", [r, g.weight(name + "_weight", [d], 0.1, offset=1.0)])


def norm(g, x, d, name, kind):
    # A norm over fewer than 4 elements is numerically singular (over 2,
    # a row whose two values nearly agree divides rounding by sqrt(eps)):
    # two correct float32 runs part after a few steps. Tiny widths stay
    # for the planner's sake, without the norm.
    if d < 4:
        return x
    return rms_norm(g, x, d, name) if kind == "rms" else \
        layer_norm(g, x, d, name)


def layer_norm(g, x, d, name):
    return g.op("LayerNormalization",
                [x, g.weight(name + "_scale", [d], 0.1, offset=1.0),
                 g.weight(name + "_bias", [d], 0.1)],
                {"axis": -1, "epsilon": 1e-5})


def build_mlp(g, s):
    B, F = s["batch"], s["features"]
    g.inputs.append(("x", "float", [B, F]))
    x, d = "x", F
    for i, width in enumerate(s["widths"]):
        x = linear(g, x, d, width, "fc%d" % i, s["bias"],
                   gemm=s["gemm"] and i % 2 == 0)
        if s["norm"] and i + 1 < len(s["widths"]) and width >= 4:
            x = layer_norm(g, x, width, "ln%d" % i)
        if i + 1 < len(s["widths"]):
            x = activation(g, x, s["act"])
        d = width
    g.outputs.append((x, "float", [B, d]))
    return [B, d]


def attention(g, x, s, i, mask):
    B, T, D, H = s["batch"], s["seq"], s["dim"], s["heads"]
    dh = D // H
    name = "b%d_" % i
    if s["fused_qkv"]:
        qkv = linear(g, x, D, 3 * D, name + "qkv", s["bias"])
        q, k, v = g.op("Split", [qkv, g.constant(np.array([D, D, D],
                                                          np.int64),
                                                 dtype="int64")],
                       {"axis": 2}, outputs=3)
    else:
        q = linear(g, x, D, D, name + "q", s["bias"])
        k = linear(g, x, D, D, name + "k", s["bias"])
        v = linear(g, x, D, D, name + "v", s["bias"])
    # An exported model with a dynamic batch reshapes with -1 there.
    lead = -1 if s.get("symbolic_batch") else B
    heads = g.constant(np.array([lead, T, H, dh], np.int64), dtype="int64")

    def split_heads(t):
        return g.op("Transpose", [g.op("Reshape", [t, heads])],
                    {"perm": [0, 2, 1, 3]})
    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    kt = g.op("Transpose", [k], {"perm": [0, 1, 3, 2]})
    scores = g.op("MatMul", [q, kt])
    scale = g.constant(np.float32(1 / math.sqrt(dh)), shape=[])
    scores = g.op("Mul", [scores, scale])
    if mask is not None:
        scores = g.op("Add", [scores, mask])
    p = g.op("Softmax", [scores], {"axis": -1})
    y = g.op("MatMul", [p, v])
    y = g.op("Transpose", [y], {"perm": [0, 2, 1, 3]})
    y = g.op("Reshape", [y, g.constant(np.array([lead, T, D], np.int64),
                                       dtype="int64")])
    return linear(g, y, D, D, name + "proj", s["bias"])


def build_transformer(g, s):
    B, T, D, V = s["batch"], s["seq"], s["dim"], s["vocab"]
    if s["tokens"]:
        g.inputs.append(("ids", "int64", [B, T]))
        emb = g.weight("tok_weight", [V, D], 0.5)
        x = g.op("Gather", [emb, "ids"], {"axis": 0})
        if s["pos"] == "table":
            x = g.op("Add", [x, g.weight("pos_weight", [T, D], 0.5)])
        elif s["pos"] == "gather":
            pos = g.weight("pos_weight", [T + 2, D], 0.5)
            idx = g.constant(np.arange(T, dtype=np.int64), dtype="int64")
            x = g.op("Add", [x, g.op("Gather", [pos, idx], {"axis": 0})])
    else:
        g.inputs.append(("x", "float", [B, T, D]))
        x = "x"
    mask = None
    if s["mask"] == "causal":
        m = np.triu(np.full((T, T), -1e4, np.float32), 1)
        mask = g.constant(m)
    elif s["mask"] == "input":
        g.inputs.append(("mask", "float", [B, 1, T, T]))
        mask = "mask"
    for i in range(s["layers"]):
        name = "b%d_" % i
        kind = s.get("norm", "layer")
        h = norm(g, x, D, name + "ln1", kind) if s["prenorm"] else x
        x = g.op("Add", [x, attention(g, h, s, i, mask)])
        if not s["prenorm"]:
            x = norm(g, x, D, name + "ln1", kind)
        h = norm(g, x, D, name + "ln2", kind) if s["prenorm"] else x
        hidden = s["mlp"] * D
        if s.get("swiglu"):
            # Llama's MLP: down(silu(gate(x)) * up(x)).
            gate = linear(g, h, D, hidden, name + "gate", s["bias"])
            silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
            h = g.op("Mul", [silu, linear(g, h, D, hidden, name + "up",
                                          s["bias"])])
        else:
            h = linear(g, h, D, hidden, name + "fc", s["bias"])
            h = activation(g, h, s["act"])
        x = g.op("Add", [x, linear(g, h, hidden, D, name + "out", s["bias"])])
        if not s["prenorm"]:
            x = norm(g, x, D, name + "ln2", kind)
    if s["final_norm"]:
        x = norm(g, x, D, "ln_f", s.get("norm", "layer"))
    if s["tokens"]:
        if s["tied"]:
            x = g.op("MatMul", [x, g.op("Transpose", ["tok_weight"],
                                        {"perm": [1, 0]})])
        else:
            x = linear(g, x, D, V, "head", False)
        g.outputs.append((x, "float", [B, T, V]))
        return [B, T, V]
    g.outputs.append((x, "float", [B, T, D]))
    return [B, T, D]


def build_conv(g, s):
    B, C, H = s["batch"], s["channels"], s["size"]
    g.inputs.append(("x", "float", [B, C, H, H]))
    x, c, h = "x", C, H
    for i, width in enumerate(s["widths"]):
        k = s["kernel"]
        pad = k // 2
        w = g.weight("conv%d_weight" % i, [width, c, k, k],
                     1 / math.sqrt(c * k * k))
        x = g.op("Conv", [x, w, g.weight("conv%d_bias" % i, [width], 0.1)],
                 {"kernel_shape": [k, k], "pads": [pad] * 4,
                  "strides": [1, 1]})
        x = g.op("Relu", [x])
        c = width
        if s["pool"] and h >= 2:
            x = g.op("MaxPool", [x], {"kernel_shape": [2, 2],
                                      "strides": [2, 2]})
            h //= 2
    x = g.op("Flatten", [x], {"axis": 1})
    x = linear(g, x, c * h * h, s["classes"], "fc", True, gemm=True)
    g.outputs.append((x, "float", [B, s["classes"]]))
    return [B, s["classes"]]


BUILDERS = {"mlp": build_mlp, "transformer": build_transformer,
            "conv": build_conv}

ODD = [1, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16]


def random_model(rng, batch):
    spec = random_family(rng, batch)
    spec["symbolic_batch"] = rng.random() < 0.3
    return spec


def random_family(rng, batch):
    family = rng.choice(["mlp", "transformer", "transformer", "conv"])
    act = rng.choice(["relu", "gelu", "tanh", "sigmoid", "none"])
    if family == "mlp":
        return dict(family=family, batch=batch, features=rng.choice(ODD),
                    widths=[rng.choice(ODD + [24, 32])
                            for _ in range(rng.randint(1, 4))],
                    bias=rng.random() < 0.8, gemm=rng.random() < 0.5,
                    norm=rng.random() < 0.3, act=act)
    if family == "transformer":
        heads = rng.choice([1, 1, 2, 3, 4])
        dim = heads * rng.choice([1, 2, 3, 4, 8])
        return dict(family=family, batch=batch, seq=rng.choice(ODD),
                    dim=dim, heads=heads, vocab=rng.randint(2, 40),
                    layers=rng.randint(1, 3), tokens=rng.random() < 0.75,
                    pos=rng.choice(["table", "gather", "none"]),
                    mask=rng.choice(["causal", "input", "none"]),
                    fused_qkv=rng.random() < 0.5, bias=rng.random() < 0.8,
                    prenorm=rng.random() < 0.7, mlp=rng.choice([1, 2, 4]),
                    final_norm=rng.random() < 0.7, tied=rng.random() < 0.4,
                    act=rng.choice(["relu", "gelu", "tanh"]),
                    norm=rng.choice(["layer", "layer", "rms"]),
                    swiglu=rng.random() < 0.3)
    return dict(family=family, batch=batch, channels=rng.choice([1, 2, 3]),
                size=rng.choice([1, 2, 3, 4, 6]),
                widths=[rng.choice([1, 2, 3, 4, 8])
                        for _ in range(rng.randint(1, 2))],
                kernel=rng.choice([1, 3]), pool=rng.random() < 0.5,
                classes=rng.choice(ODD))


def model_text(spec, seed):
    g = Graph(seed)
    out_shape = BUILDERS[spec["family"]](g, spec)
    text = g.text()
    if spec.get("symbolic_batch"):
        # Dimension 0 of every input and output is the symbolic "batch"
        # (pcc --batch binds it), as exporters write a dynamic batch.
        sig = text.index("fuzz (")
        end = text.index("\n", sig)
        line = re.sub(r"\[%d," % spec["batch"], "[batch,", text[sig:end])
        text = text[:sig] + line + text[end:]
    return text, g.inputs, out_shape


def model_flags(case):
    """pcc options the model itself needs (its dynamic batch bound)."""
    if case["spec"].get("symbolic_batch"):
        return ["--batch=%d" % case["spec"]["batch"]]
    return []


# --------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------
def random_plan(rng, train):
    while True:
        tp = rng.choice([1, 1, 2, 2, 3, 4])
        pp = rng.choice([1, 1, 2, 2, 3])
        dp = rng.choice([1, 1, 2, 2, 3, 4]) if train else 1
        if 1 < tp * pp * dp <= 8:
            break
    plan = dict(tp=tp, pp=pp, dp=dp)
    if pp > 1:
        plan["microbatches"] = rng.choice([1, 2, 2, 3, 4])
    elif train and rng.random() < 0.3:
        plan["microbatches"] = rng.choice([2, 3])
    if train:
        if dp > 1:
            plan["zero"] = rng.choice([0, 1, 2, 3])
            if rng.random() < 0.3:
                plan["bucket_mb"] = rng.choice([0, 0.001, 0.01])
        if pp > 1:
            plan["schedule"] = rng.choice(["gpipe", "1f1b", "zb-h1",
                                           "interleaved"])
            if plan["schedule"] == "interleaved":
                plan["pp_chunks"] = 2
                # Micro-batches in groups of pp (else a clear refusal).
                if rng.random() < 0.9:
                    plan["microbatches"] = pp * rng.choice([1, 2])
        if rng.random() < 0.25:
            plan["recompute"] = rng.choice(["selective", "full"])
        if pp == 1 and rng.random() < 0.03:
            # ZeRO-Offload's host optimizer, from a CPU + CUDA library run
            # on CPU ranks (nvcc makes these compiles slow: few of them).
            plan["offload"] = "optimizer"
        plan["optimizer"] = rng.choice(["sgd", "sgd", "adamw"])
    if tp > 1 and rng.random() < (0.3 if train else 0.03):
        plan["sp"] = True
    return plan


def plan_flags(plan, precision=True):
    """The plan's flags; `precision`: with its --precision (which the
    compile takes from train_flags, the reference's too)."""
    flags = ["--tp=%d" % plan["tp"], "--pp=%d" % plan["pp"]]
    if plan.get("dp", 1) > 1:
        flags.append("--dp=%d" % plan["dp"])
    for key, flag in (("microbatches", "--microbatches"), ("zero", "--zero"),
                      ("schedule", "--schedule"), ("pp_chunks", "--pp-chunks"),
                      ("recompute", "--recompute"),
                      ("bucket_mb", "--bucket-mb")):
        if key in plan:
            flags.append("%s=%s" % (flag, plan[key]))
    if plan.get("sp"):
        flags.append("--sp")
    if plan.get("fuse_ce"):
        flags.append("--fuse-cross-entropy")
    if plan.get("offload"):
        flags += ["--offload=" + plan["offload"], "--target=all"]
    if precision and plan.get("precision"):
        flags.append("--precision=" + plan["precision"])
    return flags


def ranks_of(plan):
    return plan["tp"] * plan["pp"] * plan.get("dp", 1)


def describe_plan(plan):
    return " ".join(plan_flags(plan)) + (
        " " + plan["optimizer"] if "optimizer" in plan else "")


# --------------------------------------------------------------------------
# Running one case
# --------------------------------------------------------------------------
class Tools:
    def __init__(self, pcc, pcc_run, compile_timeout, run_timeout):
        self.pcc, self.run = pcc, pcc_run
        # pcc-fd-gradients, beside pcc (the build's bin directory).
        fd = os.path.join(os.path.dirname(pcc), "pcc-fd-gradients")
        self.fd = fd if os.path.dirname(pcc) and os.path.exists(fd) else None
        self.compile_timeout = compile_timeout
        self.run_timeout = run_timeout


def execute(cmd, timeout, cwd):
    """(status, output, seconds); status None on a timeout."""
    start = time.time()
    # Each run's mpirun keeps its session directory under its own working
    # directory: OpenMPI 4 creates /tmp/ompi.<host>.<uid> racily, and two
    # mpiruns starting together can fail in orte_init ("File exists").
    env = dict(os.environ, OMPI_MCA_orte_tmpdir_base=cwd)
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=cwd,
                             start_new_session=True, env=env)
        try:
            out, _ = p.communicate(timeout=timeout)
            return p.returncode, out, time.time() - start
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            return None, out, time.time() - start
    except OSError as e:
        return -1, str(e), time.time() - start


CRASH_MARKERS = ("Stack dump", "Assertion", "AddressSanitizer",
                 "UndefinedBehaviorSanitizer", "runtime error:",
                 "Segmentation fault", "Floating point exception",
                 "terminate called", "Aborted", "LLVM ERROR")


def classify_compile(status, out):
    """None when pcc compiled; ("refusal", message) for a clear error;
    ("finding", kind, detail) otherwise."""
    crash = next((m for m in CRASH_MARKERS if m in out), None)
    if status is None:
        return ("finding", "compile-timeout", out[-2000:])
    if status < 0 or status >= 128 or crash:
        return ("finding", "compile-crash", (crash or "signal %d" % -status)
                + "\n" + out[-3000:])
    if status != 0:
        m = re.search(r"error: (.*)", out)
        if not m:
            return ("finding", "refusal-without-error", out[-2000:])
        return ("refusal", normalize(m.group(1)))
    return None


def normalize(message):
    """A refusal's message with its numbers and names blanked, to count
    kinds of refusals."""
    m = re.sub(r"^\S*model\.onnxtxt: ", "", message)
    m = re.sub(r"'[^']*'", "'_'", m)
    m = re.sub(r"\d+", "N", m)
    return m[:160]


def write_inputs(work, inputs, out_shape, loss, seed, spec):
    rng = np.random.RandomState(seed % 2**32)
    files = []
    for name, dtype, shape in inputs:
        if dtype == "int64":
            a = rng.randint(0, spec["vocab"], size=shape).astype(np.int64)
        elif name == "mask":
            a = np.where(rng.random_sample(shape) < 0.3, -1e4, 0).astype(
                np.float32)
            for t in range(shape[-1]):      # every query sees itself
                a[..., t, t] = 0
        else:
            a = rng.standard_normal(shape).astype(np.float32)
        path = os.path.join(work, "input.%s.npy" % name)
        np.save(path, a)
        files.append(path)
    labels = None
    if loss == "cross_entropy":
        classes = out_shape[-1]
        y = rng.randint(0, classes, size=out_shape[:-1]).astype(np.int64)
        y[rng.random_sample(y.shape) < 0.1] = IGNORE
        y.reshape(-1)[0] = 0   # at least one label counts
        labels = os.path.join(work, "labels.npy")
        np.save(labels, y)
    elif loss == "mse":
        labels = os.path.join(work, "labels.npy")
        np.save(labels, rng.standard_normal(out_shape).astype(np.float32))
    return files, labels


def hyper(optimizer):
    if optimizer == "adamw":
        # eps 1e-3 instead of 1e-8: Adam divides each gradient by its own
        # running size, so a gradient that is zero in exact arithmetic and
        # rounding noise in float32 (attention's key bias) would get
        # full-size updates that differ between any two summation orders.
        # With eps 1e-3 such noise moves nothing while real gradients
        # (1e-3 and up) still drive Adam's normalised steps.
        return ["--lr", "0.001", "--weight-decay", "0.01", "--eps", "0.001"]
    return ["--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0.0001"]


def read_losses(path):
    rows = {}
    with open(path) as f:
        header = f.readline().strip().split(",")
        for line in f:
            v = dict(zip(header, line.strip().split(",")))
            rows[int(v["step"])] = (float(v["loss"]),
                                    float(v.get("grad_norm", "nan")))
    return rows


def diverging(losses):
    """Whether a run's gradient norm grew tenfold in one step, or stopped
    being finite: a trajectory so ill-conditioned that float32 rounding,
    which differs between plans that sum in another order, grows by orders
    of magnitude. Its steps are compared; its final weights are not."""
    norms = [gn for _, (_, gn) in sorted(losses.items())]
    if not all(math.isfinite(v) for row in losses.values() for v in row):
        return True
    return any(b > 10 * a for a, b in zip(norms, norms[1:]) if a > 0)


def compare_training(ref_dir, run_dir, optimizer, noise=None):
    """"" when the run matches the one-device run, else what differs.
    `noise`: a 16-bit model's rounding noise (noise()), which widens the
    bounds to NOISE_FACTOR times it."""
    noise = noise or {}
    # One relative figure for the loss and the gradient norm (one pair of
    # runs samples the noise thinly: a model's bf16 gradient norm once came
    # within 3e-5 of fp32's at a step where its loss differed by 7e-4),
    # and at least the format's unit roundoff.
    rel = max(noise.get("loss", 0), noise.get("grad", 0))
    loss_rtol = max(1e-4, noise.get("unit", 0), NOISE_FACTOR * rel)
    grad_rtol = max(1e-3, noise.get("unit", 0), NOISE_FACTOR * rel)
    ref = read_losses(os.path.join(ref_dir, "loss.csv"))
    got = read_losses(os.path.join(run_dir, "loss.csv"))
    for step, (loss, gn) in sorted(ref.items()):
        if not (math.isfinite(loss) and math.isfinite(gn)):
            # It overflowed on one device: the steps before are compared;
            # weights after an overflow are noise (run_plan counts these).
            return ""
        if step not in got:
            return "step %d missing from the loss log" % step
        l2, g2 = got[step]
        if not (abs(l2 - loss) <= loss_rtol * abs(loss) + 1e-6):
            return "step %d: loss %r, one device %r" % (step, l2, loss)
        if not (abs(g2 - gn) <= grad_rtol * abs(gn) + 1e-6):
            return "step %d: grad norm %r, one device %r" % (step, g2, gn)
    if diverging(ref):
        return ""  # the steps agreed; the weights are noise (run_plan counts)
    step_dir = "step-%08d" % STEPS
    a = read_safetensors(os.path.join(ref_dir, "ckpt", step_dir,
                                      "weights.safetensors"))
    b = read_safetensors(os.path.join(run_dir, "ckpt", step_dir,
                                      "weights.safetensors"))
    rtol, atol = (1e-3, 1e-4) if optimizer == "adamw" else (1e-4, 1e-5)
    atol = max(atol, NOISE_FACTOR * noise.get("weights", 0))
    for name, w in a.items():
        if "@" in name:
            continue
        if name not in b:
            return "weight '%s' missing" % name
        if b[name].shape != w.shape:
            return "weight '%s' has shape %s, one device %s" % (
                name, b[name].shape, w.shape)
        if not np.allclose(b[name], w, rtol=rtol, atol=atol, equal_nan=True):
            d = np.abs(b[name].astype(np.float64) - w).max()
            return "weight '%s' differs by up to %.3g" % (name, d)
    return ""


def reference(tools, case, work):
    """The one-device compile and run of the case's model: None, or a
    (kind, ...) tuple when the model itself fails (then no plan runs)."""
    ref = os.path.join(work, "one")
    os.makedirs(ref, exist_ok=True)
    lib = os.path.join(ref, "m.so")
    flags = train_flags(case)
    check_gradients = (case["train"] and tools.fd and
                       case["plan"].get("optimizer", "sgd") == "sgd" and
                       not case["plan"].get("precision"))
    ir = ["--dump-ir=" + os.path.join(ref, "ir")] if check_gradients else []
    status, out, secs = execute([tools.pcc, case["model"]] + flags + ir +
                                ["-o", lib], tools.compile_timeout, ref)
    c = classify_compile(status, out)
    if c:
        return c + (("one device: " + " ".join(flags)),)
    r = run_lib(tools, case, lib, ref, 1, None)
    if not r and case["plan"].get("precision"):
        r = noise(tools, case, work)
    if r or not check_gradients:
        return r
    return gradients(tools, case, lib, ref)


def noise(tools, case, work):
    """A 16-bit model's own rounding noise: its one-device run against the
    same model's fp32 run. Two 16-bit runs that round at other places (a
    tensor-parallel partial product, a pipeline's stage by stage gradient
    norm) differ by about as much, so a plan is compared with its 16-bit
    reference within NOISE_FACTOR times this (parity.py bounds pcc's bf16
    run by three times PyTorch's autocast noise; here the estimate is one
    pair of tiny runs, and a plan rounds at more places than one device).
    Sets case["noise"]; returns None, or a finding."""
    ref = os.path.join(work, "one-fp32")
    os.makedirs(ref, exist_ok=True)
    lib = os.path.join(ref, "m.so")
    flags = train_flags(case, "fp32")
    status, out, _ = execute([tools.pcc, case["model"]] + flags +
                             ["-o", lib], tools.compile_timeout, ref)
    c = classify_compile(status, out)
    if c:
        # The 16-bit compile worked: fp32 refusing the model is a finding.
        return ("finding", c[1] if c[0] == "finding" else "fp32-refused",
                "one device: " + " ".join(flags) + "\n" +
                (c[2] if c[0] == "finding" else c[1]))
    r = run_lib(tools, case, lib, ref, 1, None)
    if r:
        # fp32 diverging where 16 bits did not: no noise figure to use.
        return r if r[0] == "finding" else ("refusal", r[1])
    one = os.path.join(work, "one")
    if not case["train"]:
        a = np.load(os.path.join(one, "out.npy")).astype(np.float64)
        b = np.load(os.path.join(ref, "out.npy")).astype(np.float64)
        d = np.abs(a - b)
        case["noise"] = dict(out=float(d[np.isfinite(d)].max(initial=0)))
        return None
    lo, hi = (read_losses(os.path.join(d, "loss.csv")) for d in (one, ref))
    # bf16 keeps 8 significant bits, fp16 11: bf16's unit roundoff, and
    # twice fp16's (tensor parallelism rounds each rank's partial product
    # too: an fp16 tp 2 run's third gradient norm 1.2e-3 from fp32's, the
    # one-device fp16 run's 4.9e-4).
    unit = 2.0 ** -8 if case["plan"]["precision"] == "bf16" else 2.0 ** -10
    rel = {"loss": 0.0, "grad": 0.0, "weights": 0.0, "unit": unit}
    for step, (loss, gn) in lo.items():
        if step in hi and all(map(math.isfinite, (loss, gn) + hi[step])):
            rel["loss"] = max(rel["loss"], abs(loss - hi[step][0]) /
                              max(abs(hi[step][0]), 1e-6))
            rel["grad"] = max(rel["grad"], abs(gn - hi[step][1]) /
                              max(abs(hi[step][1]), 1e-6))
    step_dir = "step-%08d" % STEPS
    try:
        a, b = (read_safetensors(os.path.join(d, "ckpt", step_dir,
                                              "weights.safetensors"))
                for d in (one, ref))
    except OSError:
        a, b = {}, {}
    for name, w in a.items():
        if "@" in name or name not in b or b[name].shape != w.shape:
            continue
        d = np.abs(w.astype(np.float64) - b[name])
        if np.isfinite(d).all():
            rel["weights"] = max(rel["weights"], float(d.max(initial=0)))
    case["noise"] = rel
    return None


def gradients(tools, case, lib, ref):
    """One plain SGD step (lr 1) of the one-device library: its loss and
    gradients against float64 central differences of the reference
    interpreter (pcc-fd-gradients) on the IR after pcc-loss."""
    work = os.path.join(ref, "grad")
    os.makedirs(work, exist_ok=True)
    cmd = [tools.run, lib] + sum((["--input", f]
                                  for f in case["input_files"]), []) + [
        "--steps", "1", "--labels", case["labels"], "--lr", "1",
        "--momentum", "0", "--weight-decay", "0",
        "--loss-log", os.path.join(work, "loss.csv"),
        "--save-dir", os.path.join(work, "ckpt")]
    status, out, _ = execute(cmd, tools.run_timeout, work)
    if status != 0:
        return ("finding", "run-failed", " ".join(cmd) + "\n" + out[-3000:])
    irs = sorted(f for f in os.listdir(os.path.join(ref, "ir"))
                 if f.endswith("-pcc-loss.mlir"))
    if not irs:
        return ("finding", "fuzzer-error", "no IR after pcc-loss in " + ref)
    cmd = [tools.fd, os.path.join(ref, "ir", irs[0]),
           "--weights", os.path.join(ref, "m.safetensors"),
           "--stepped", os.path.join(work, "ckpt", "step-00000001",
                                     "weights.safetensors"),
           "--lr", "1", "--labels", case["labels"],
           "--loss-log", os.path.join(work, "loss.csv")] + sum(
               (["--input", f] for f in case["input_files"]), [])
    status, out, _ = execute(cmd, tools.run_timeout, work)
    if status == 1:
        return ("finding", "gradient-mismatch", " ".join(cmd) + "\n" +
                out[-3000:])
    if status != 0:
        return ("finding", "fuzzer-error", " ".join(cmd) + "\n" +
                out[-3000:])
    case["gradients_checked"] = True
    return None


def precision_flags(case, precision=None):
    p = precision or case["plan"].get("precision")
    return ["--precision=" + p] if p else []


def train_flags(case, precision=None):
    """The flags the one-device reference and every plan share: the model's
    own, its loss and optimizer, and its precision (`precision` instead of
    the plan's, for the fp32 run that measures 16-bit noise)."""
    if not case["train"]:
        return model_flags(case) + precision_flags(case, precision)
    return model_flags(case) + ["--train", "--loss=" + case["loss"],
            "--optimizer=" + case["plan"].get("optimizer", "sgd")] + \
        precision_flags(case, precision)


def run_lib(tools, case, lib, work, ranks, expect):
    cmd = [tools.run] + (["-n", str(ranks)] if ranks > 1 else []) + [lib]
    for f in case["input_files"]:
        cmd += ["--input", f]
    if case["train"]:
        cmd += ["--steps", str(STEPS), "--labels", case["labels"],
                "--loss-log", os.path.join(work, "loss.csv"),
                "--save-dir", os.path.join(work, "ckpt"),
                "--log-every", str(STEPS)] + hyper(
                    case["plan"].get("optimizer", "sgd"))
    elif expect:
        atol = max(1e-5, NOISE_FACTOR * case.get("noise", {}).get("out", 0))
        cmd += ["--expect", expect, "--rtol", "1e-4", "--atol", repr(atol)]
    else:
        cmd += ["--output", os.path.join(work, "out.npy")]
    if ranks > 1:
        cmd += ["--collective-timeout", "60"]
    status, out, secs = execute(cmd, tools.run_timeout, work)
    crash = next((m for m in CRASH_MARKERS if m in out), None)
    if status is None:
        return ("finding", "run-hang", " ".join(cmd) + "\n" + out[-3000:])
    if ranks == 1 and status == 1 and not crash and "(diverged;" in out:
        # pcc-run stops a run whose loss is not finite. On one device that
        # is the model's (its plans are not run); on a plan whose model
        # trained on one device it is a mismatch.
        return ("refusal", normalize(re.search(r"error: (.*)", out).group(1)))
    if status != 0 or crash:
        kind = "run-crash" if (crash or status < 0 or status >= 128) else \
            ("mismatch" if expect and "differ" in out else "run-failed")
        return ("finding", kind, " ".join(cmd) + "\n" + out[-3000:])
    return None


def prepare(tools, case, work):
    """Writes the case's model and inputs into `work` and runs its one-device
    reference there. None when that worked, else the result of every pair
    of this model (the model refused, or a finding on one device)."""
    os.makedirs(work, exist_ok=True)
    text, inputs, out_shape = model_text(case["spec"], case["seed"])
    if case.get("model_file"):
        # A committed regression case: its own model file.
        with open(case["model_file"]) as f:
            text = f.read()
    case["model"] = os.path.join(work, "model.onnxtxt")
    with open(case["model"], "w") as f:
        f.write(text)
    case["input_files"], case["labels"] = write_inputs(
        work, inputs, out_shape, case["loss"] if case["train"] else None,
        case["seed"], case["spec"])
    r = reference(tools, case, work)
    if not r:
        return None
    if r[0] == "refusal":
        return dict(outcome="model-refused", message=r[1])
    return dict(outcome="finding", kind=r[1], detail=r[2],
                where="one device")


def run_plan(tools, case, work, name="plan"):
    """Compiles and runs the case's plan in work/<name> and compares it with
    the reference prepare() left in `work`. Returns a result dict."""
    result = dict(case=strip(case))
    plan_dir = os.path.join(work, name)
    os.makedirs(plan_dir, exist_ok=True)
    lib = os.path.join(plan_dir, "m.so")
    flags = train_flags(case) + plan_flags(case["plan"], precision=False)
    cmd = [tools.pcc, case["model"]] + flags + ["-o", lib]
    status, out, secs = execute(cmd, tools.compile_timeout, plan_dir)
    result["compile_seconds"] = round(secs, 2)
    c = classify_compile(status, out)
    if c:
        if c[0] == "refusal":
            result.update(outcome="refused", message=c[1],
                          full_message=re.search(r"error: (.*)", out).group(1))
        else:
            result.update(outcome="finding", kind=c[1],
                          detail=" ".join(cmd) + "\n" + c[2])
        return result
    expect = None if case["train"] else os.path.join(work, "one", "out.npy")
    r = run_lib(tools, case, lib, plan_dir, ranks_of(case["plan"]), expect)
    if r and r[0] == "refusal":
        result.update(outcome="finding", kind="mismatch",
                      detail="the plan diverged, one device did not: " + r[1])
        return result
    if r:
        result.update(outcome="finding", kind=r[1], detail=r[2])
        return result
    if case["train"]:
        ref = read_losses(os.path.join(work, "one", "loss.csv"))
        if diverging(ref):
            # It overflowed or blew up on one device: only the steps compare.
            result["diverged"] = True
        why = compare_training(os.path.join(work, "one"), plan_dir,
                               case["plan"].get("optimizer", "sgd"),
                               case.get("noise"))
        if why:
            result.update(outcome="finding", kind="mismatch", detail=why)
            return result
    result["outcome"] = "match"
    shutil.rmtree(plan_dir, ignore_errors=True)
    return result


def run_case(tools, case, work):
    """Runs one (model, plan) pair. Returns a result dict."""
    r = prepare(tools, case, work)
    if r:
        return dict(r, case=strip(case))
    return run_plan(tools, case, work)


def run_group(tools, cases, work):
    """Runs pairs that share one model (one reference run for all)."""
    r = prepare(tools, cases[0], work)
    results = []
    for i, case in enumerate(cases):
        if r:
            results.append(dict(r, case=strip(case)))
            continue
        for k in ("model", "input_files", "labels", "noise"):
            if k in cases[0]:
                case[k] = cases[0][k]
        results.append(run_plan(tools, case, work, "plan-%d" % i))
    if cases[0].get("gradients_checked"):
        results[0]["gradients_checked"] = True
    return results


def strip(case):
    return {k: case[k] for k in ("seed", "spec", "plan", "train", "loss",
                                 "pair") if k in case}


def make_group(seed, plans):
    """`plans` pairs of one random model: the same model, data and loss, and
    random plans. The batch divides over the first plan's dp x
    micro-batches (most of the time: else pcc must refuse clearly), and
    the other plans are drawn to divide it too, where a few tries find
    one."""
    rng = random.Random(seed)
    train = rng.random() < 0.5
    first = random_plan(rng, train)
    pieces = first.get("dp", 1) * first.get("microbatches", 1)
    batch = pieces * rng.choice([1, 1, 2]) if rng.random() < 0.9 else \
        rng.choice([1, 2, 3, 5])
    spec = random_model(rng, batch)
    loss = None
    if train:
        loss = "mse" if (spec["family"] == "transformer" and
                         not spec["tokens"]) or rng.random() < 0.15 \
            else "cross_entropy"
    chosen = [first]
    while len(chosen) < plans:
        for _ in range(20):
            plan = random_plan(rng, train)
            if batch % (plan.get("dp", 1) * plan.get("microbatches", 1)) == 0:
                break
        chosen.append(plan)
    # One optimizer per model: the one-device run is the reference of all.
    for plan in chosen[1:]:
        if train:
            plan["optimizer"] = first["optimizer"]
    # A third of the cross-entropy plans fuse the LM head with the loss
    # (against the unfused one-device reference), drawn from each pair's
    # own seed so that the other draws stay as they were.
    for i, plan in enumerate(chosen):
        if loss == "cross_entropy" and \
                random.Random(seed * 16 + i).random() < 0.3:
            plan["fuse_ce"] = True
    # A quarter of the models compute in bf16 and some in fp16, every plan
    # of the model and its one-device reference alike (the precision is
    # the model's, like its optimizer), drawn from the group's own stream.
    r = random.Random(seed * 16 + 15).random()
    precision = "bf16" if r < 0.25 else "fp16" if r < 0.35 else None
    if precision:
        for plan in chosen:
            plan["precision"] = precision
    # Every pair has its own seed: the group's seed x 16 + its index.
    return [dict(seed=seed, spec=spec, plan=p, train=train, loss=loss,
                 pair=seed * 16 + i) for i, p in enumerate(chosen)]


# --------------------------------------------------------------------------
# Shrinking
# --------------------------------------------------------------------------
def simpler(case):
    """Candidate cases one step simpler than `case`."""
    out = []
    spec, plan = case["spec"], case["plan"]

    def with_spec(**kw):
        c = copy.deepcopy(case)
        c["spec"].update(kw)
        out.append(c)

    def with_plan(drop=None, **kw):
        c = copy.deepcopy(case)
        if drop:
            c["plan"].pop(drop, None)
        c["plan"].update(kw)
        out.append(c)
    for key in ("layers",):
        if spec.get(key, 1) > 1:
            with_spec(**{key: spec[key] - 1})
    if "widths" in spec and len(spec["widths"]) > 1:
        with_spec(widths=spec["widths"][:-1])
        with_spec(widths=spec["widths"][1:])
    for key in ("mask", "pos"):
        if spec.get(key, "none") != "none":
            with_spec(**{key: "none"})
    if spec.get("norm") == "rms":
        with_spec(norm="layer")
    for key in ("bias", "final_norm", "fused_qkv", "tied", "pool", "gemm",
                "swiglu") + (("norm",) if spec["family"] == "mlp" else ()):
        if spec.get(key):
            with_spec(**{key: False})
    if spec.get("act", "none") != "none" and spec["family"] != "transformer":
        with_spec(act="none")
    if spec.get("mlp", 1) > 1:
        with_spec(mlp=1)
    pieces = plan.get("dp", 1) * plan.get("microbatches", 1)
    if spec["batch"] > pieces and spec["batch"] % pieces == 0:
        with_spec(batch=pieces)
    if spec.get("dim", 0) > spec.get("heads", 1):
        with_spec(dim=spec["heads"] * max(1, spec["dim"] // spec["heads"] // 2))
    if spec.get("heads", 1) > 1:
        with_spec(heads=1)
    for key in ("vocab", "seq", "features", "classes", "size"):
        if spec.get(key, 1) > 2:
            with_spec(**{key: max(2, spec[key] // 2)})
    for key in ("recompute", "bucket_mb", "sp", "pp_chunks", "offload",
                "fuse_ce", "precision"):
        if key in plan:
            with_plan(drop=key, **({"schedule": "1f1b"}
                                   if key == "pp_chunks" else {}))
    if plan.get("zero", 0) > 0:
        with_plan(zero=0)
    if spec.get("symbolic_batch"):
        with_spec(symbolic_batch=False)
    if plan.get("schedule") not in (None, "1f1b"):
        with_plan(schedule="1f1b")
    if plan.get("optimizer") == "adamw":
        with_plan(optimizer="sgd")
    for axis in ("tp", "pp", "dp"):
        if plan.get(axis, 1) > 1:
            c = copy.deepcopy(case)
            c["plan"][axis] = 1
            if ranks_of(c["plan"]) > 1:
                if axis == "pp":
                    for k in ("schedule", "pp_chunks"):
                        c["plan"].pop(k, None)
                if axis == "dp":
                    for k in ("zero", "bucket_mb"):
                        c["plan"].pop(k, None)
                out.append(c)
    return out


def shrink(tools, case, kind, work, budget=300):
    """Greedy: take any simpler case that gives the same kind of finding."""
    best, result = case, None
    deadline = time.time() + budget
    improved = True
    n = 0
    while improved and time.time() < deadline:
        improved = False
        for cand in simpler(best):
            if time.time() > deadline:
                break
            n += 1
            d = os.path.join(work, "shrink-%d" % n)
            r = run_case(tools, copy.deepcopy(cand), d)
            shutil.rmtree(d, ignore_errors=True)
            if r["outcome"] == "finding" and r["kind"] == kind:
                best, result, improved = cand, r, True
                break
    return best, result


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------
def one(args_tuple):
    tools, seed, plans, root, keep = args_tuple
    cases = make_group(seed, plans)
    work = os.path.join(root, "model-%d" % seed)
    try:
        rs = run_group(tools, cases, work)
    except Exception as e:  # the fuzzer's own bug: report, do not hide
        rs = [dict(case=strip(c), outcome="finding", kind="fuzzer-error",
                   detail=repr(e)) for c in cases]
    if all(r["outcome"] != "finding" for r in rs) and not keep:
        shutil.rmtree(work, ignore_errors=True)
    return rs


def save_finding(tools, r, root, do_shrink):
    case = r["case"]
    name = "finding-%s-%d" % (r["kind"], case.get("pair", case["seed"]))
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    shrunk = case
    if do_shrink and r["kind"] != "fuzzer-error":
        s, res = shrink(tools, case, r["kind"], os.path.join(root, "tmp"))
        if res:
            shrunk = s
    final = os.path.join(d, "case")
    shutil.rmtree(final, ignore_errors=True)
    res = run_case(tools, copy.deepcopy(shrunk), final)
    # The case as a regression test: the model, the plan, what happened.
    shutil.copy(os.path.join(final, "model.onnxtxt"),
                os.path.join(d, "model.onnxtxt"))
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(dict(strip(shrunk), kind=r["kind"],
                       flags=train_flags(dict(shrunk, model=None)) +
                       plan_flags(shrunk["plan"], precision=False),
                       found=r, shrunk=res), f, indent=1)
    return d


def summarize(results, seconds, jobs):
    outcomes = {}
    refusals = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        if r["outcome"] in ("refused", "model-refused"):
            refusals[r["message"]] = refusals.get(r["message"], 0) + 1
    train = sum(1 for r in results if r["case"]["train"])
    print("fuzz-plans: %d (model, plan) pairs in %.0f s (%d jobs), %d "
          "training, %d inference" % (len(results), seconds, jobs, train,
                                      len(results) - train))
    for k in ("match", "refused", "model-refused", "finding"):
        print("  %-14s %d" % (k, outcomes.get(k, 0)))
    print("  one step's loss and gradients of %d one-device models checked "
          "against float64 differences" % sum(
              1 for r in results if r.get("gradients_checked")))
    diverged = sum(1 for r in results if r.get("diverged"))
    if diverged:
        print("  of the matches, %d trained a model that diverged on one "
              "device (its gradient norm grew tenfold in a step, or "
              "overflowed): its steps compared, not its weights" % diverged)
    if refusals:
        print("  refusals (clear errors), by kind:")
        for m, n in sorted(refusals.items(), key=lambda x: -x[1]):
            print("    %5d  %s" % (n, m))
    cov = coverage(results)
    print("  coverage: " + ", ".join("%s %d" % kv for kv in sorted(cov.items())))
    findings = [r for r in results if r["outcome"] == "finding"]
    for r in findings:
        print("  FINDING %s (pair %d, %s %s): %s" % (
            r["kind"], r["case"].get("pair", r["case"]["seed"]), r["case"]["spec"]["family"],
            describe_plan(r["case"]["plan"]),
            r["detail"].strip().splitlines()[-1][:300] if r["detail"].strip()
            else ""))
    return findings


def coverage(results):
    """What the pairs exercised: families and plan features, counted."""
    count = {}

    def add(key):
        count[key] = count.get(key, 0) + 1
    for r in results:
        c = r["case"]
        p, spec = c["plan"], c["spec"]
        add("family " + spec["family"])
        add("training" if c["train"] else "inference")
        for axis in ("tp", "pp", "dp"):
            if p.get(axis, 1) > 1:
                add("%s > 1" % axis)
        if p.get("tp", 1) > 1 and p.get("pp", 1) > 1 and p.get("dp", 1) > 1:
            add("tp x pp x dp")
        for key in ("zero", "schedule", "recompute", "precision"):
            if key in p:
                add("%s %s" % (key, p[key]))
        for key in ("sp", "offload", "bucket_mb"):
            if key in p:
                add(key)
        for key in ("tied", "swiglu", "symbolic_batch"):
            if spec.get(key):
                add(key)
        if spec.get("mask") in ("input", "causal"):
            add("mask " + spec["mask"])
        if spec.get("norm") == "rms":
            add("rms norm")
    return count


def check(tools, path, work):
    """Runs one saved case (a regression test): exit 0 when it matches or
    is refused with a clear error."""
    with open(path) as f:
        saved = json.load(f)
    case = {k: saved[k] for k in ("seed", "spec", "plan", "train", "loss")}
    model = os.path.join(os.path.dirname(os.path.abspath(path)),
                         "model.onnxtxt")
    if os.path.exists(model):
        case["model_file"] = model
    r = run_case(tools, case, work)
    print("fuzz-plans: %s: %s %s (%s): %s%s" % (
        os.path.basename(os.path.dirname(os.path.abspath(path))),
        case["spec"]["family"], describe_plan(case["plan"]),
        "training" if case["train"] else "inference", r["outcome"],
        (": " + r.get("message", r.get("detail", "")).strip()[-600:])
        if r["outcome"] != "match" else ""))
    return 0 if r["outcome"] in ("match", "refused") else 1


def take_snapshot(snapshot, bin_dir):
    """Copies what a run tests into `snapshot` and points pcc and the
    libraries it builds there (PCC_RUNTIME_INCLUDE_DIR and _LIBRARY_DIR, and
    the loader's path). Returns the snapshot's bin directory."""
    bin_dir = os.path.abspath(bin_dir or os.path.join(ROOT, "build", "bin"))
    lib_dir = os.path.join(os.path.dirname(bin_dir), "lib")
    out = os.path.abspath(snapshot)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "bin"))
    for name in ("pcc", "pcc-run", "pcc-fd-gradients"):
        if os.path.exists(os.path.join(bin_dir, name)):
            shutil.copy2(os.path.join(bin_dir, name), os.path.join(out, "bin"))
    shutil.copytree(os.path.join(ROOT, "runtime", "include"),
                    os.path.join(out, "include"))
    os.makedirs(os.path.join(out, "lib"))
    for name in os.listdir(lib_dir):
        if ".so" in name:
            shutil.copy2(os.path.join(lib_dir, name), os.path.join(out, "lib"),
                         follow_symlinks=False)
    os.environ["PCC_RUNTIME_INCLUDE_DIR"] = os.path.join(out, "include")
    os.environ["PCC_RUNTIME_LIBRARY_DIR"] = os.path.join(out, "lib")
    os.environ["LD_LIBRARY_PATH"] = os.path.join(out, "lib") + (
        ":" + os.environ["LD_LIBRARY_PATH"]
        if os.environ.get("LD_LIBRARY_PATH") else "")
    return os.path.join(out, "bin")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--cases", type=int, default=0,
                    help="run this many pairs (rounded up to whole models)")
    ap.add_argument("--plans-per-model", type=int, default=4,
                    help="random plans tried on each random model (one "
                    "one-device reference run serves them all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", default=None)
    ap.add_argument("--bin", default="", help="directory of pcc and pcc-run "
                    "(default: the PATH)")
    ap.add_argument("--pcc", default="", help="the pcc to test")
    ap.add_argument("--pcc-run", default="", help="the pcc-run to test")
    ap.add_argument("--snapshot", metavar="DIR",
                    help="copy the tools (from --bin), the runtime's headers "
                    "and its libraries into DIR and test that copy, so that "
                    "rebuilding the tree during a long run changes nothing "
                    "it tests (pcc compiles each model against the runtime "
                    "headers and links the runtime library)")
    ap.add_argument("--compile-timeout", type=float, default=120)
    ap.add_argument("--run-timeout", type=float, default=180)
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--keep", action="store_true",
                    help="keep every case's directory")
    ap.add_argument("--check", help="run one saved case.json")
    ap.add_argument("--shrink", help="shrink one saved case.json (a "
                    "finding) and save the result under --work")
    ap.add_argument("--log", help="append one JSON line per pair")
    ap.add_argument("--stats", nargs="+", metavar="LOG",
                    help="summarize the pairs of --log files and exit")
    args = ap.parse_args()
    if args.snapshot:
        args.bin = take_snapshot(args.snapshot, args.bin)
    def tool(name, given):
        if given:
            return os.path.abspath(given) if os.sep in given else given
        if args.bin:
            return os.path.join(os.path.abspath(args.bin), name)
        return name
    tools = Tools(tool("pcc", args.pcc), tool("pcc-run", args.pcc_run),
                  args.compile_timeout, args.run_timeout)
    if args.stats:
        results = []
        for path in args.stats:
            with open(path) as f:
                results += [json.loads(line) for line in f if line.strip()]
        summarize(results, 0, 0)
        return
    work = args.work or tempfile.mkdtemp(prefix="pcc-fuzz-plans-")
    os.makedirs(work, exist_ok=True)
    if args.check:
        paths = [args.check]
        if os.path.isdir(args.check):
            paths = sorted(os.path.join(d, "case.json")
                           for d, _, files in os.walk(args.check)
                           if "case.json" in files)
        bad = 0
        for i, path in enumerate(paths):
            bad += check(tools, path, os.path.join(work, "check-%d" % i))
        print("fuzz-plans: %d regression case(s), %d failed" % (len(paths),
                                                                bad))
        sys.exit(1 if bad else 0)
    if args.shrink:
        with open(args.shrink) as f:
            saved = json.load(f)
        r = saved["found"]
        print("fuzz-plans: saved %s" % save_finding(tools, r, work, True))
        return
    if not args.seconds and not args.cases:
        args.cases = 40
    start = time.time()
    results = []
    log = open(args.log, "a") if args.log else None
    seed = args.seed * 1000003
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        pending = set()
        submitted = 0

        def more():
            nonlocal submitted
            if args.cases and submitted * args.plans_per_model >= \
                    args.cases:
                return False
            if args.seconds and time.time() - start >= args.seconds:
                return False
            pending.add(pool.submit(one, (tools, seed + submitted,
                                          args.plans_per_model, work,
                                          args.keep)))
            submitted += 1
            return True
        for _ in range(args.jobs):
            more()
        while pending:
            done, _ = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                pending.remove(fut)
                for r in fut.result():
                    results.append(r)
                    if log:
                        log.write(json.dumps(r) + "\n")
                        log.flush()
                    if r["outcome"] == "finding":
                        print("fuzz-plans: finding %s (pair %d): %s" % (
                            r["kind"], r["case"]["pair"],
                            r["detail"].strip()[-400:]), flush=True)
                    if len(results) % 200 == 0:
                        print("fuzz-plans: %d pairs, %.0f s" % (
                            len(results), time.time() - start), flush=True)
                more()
    findings = summarize(results, time.time() - start, args.jobs)
    if findings:
        for r in findings:
            d = save_finding(tools, r, work, not args.no_shrink)
            print("fuzz-plans: saved %s" % d)
        sys.exit(1)


if __name__ == "__main__":
    main()
