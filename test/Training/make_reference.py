#!/usr/bin/env python3
"""PyTorch reference runs for pcc's training parity tests.

Run with a Python that has torch, onnx and numpy (see ref/README.md):

    ~/.cache/pcc/zoo-venv/bin/python test/Training/make_reference.py [--export] [model ...]

With no names, every model is done. For each bundled example model
(examples/<model>.onnx) and each zoo model (zoo-gpt2, zoo-llama: the model
zoo's tiny Hugging Face GPT-2 and Llama, scripts/zoo/export.py's configs and
seed, exported for training to test/Training/zoo/<family>/model.onnx when
that file is missing or with --export) this

  1. rebuilds the PyTorch module with examples/make_examples.py's classes
     (or scripts/zoo/export.py's config and seed, dropout probabilities 0),
  2. maps every ONNX initializer to a module parameter or buffer (same name,
     or an exporter-renamed copy equal to a parameter, its transpose or a
     slice of it; BatchNorm the exporter folded into a convolution makes the
     convolution's weight and a new bias the parameters) and loads the
     ONNX's values, so training starts from exactly the ONNX's weights,
  3. trains 20 steps on fixed data with SGD and with AdamW, from the same
     start, and
  4. writes test/Training/ref/<model>/: input.npy, labels.npy, mapping.json,
     config.json, <opt>.losses.csv and <opt>.final.safetensors (the final
     weights under the ONNX initializer names, in the ONNX's layout).

Everything is float32 on the CPU, one thread, deterministic algorithms.
"""

import argparse
import copy
import json
import math
import os
import struct
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "examples")
REF = os.path.join(HERE, "ref")
sys.path.insert(0, EXAMPLES)
import make_examples  # noqa: E402  (the model classes and build())

MODELS = ["mlp", "transformer_postnorm", "transformer_prenorm", "gpt",
          "resnet18", "zoo-gpt2", "zoo-llama", "resnet18_train", "user-gpt"]
STEPS = 20
BATCH = 4
# Models trained with another batch: batch normalisation over 4 images
# leaves 4 values per channel after layer4 (1x1), too few for stable
# statistics (see ref/README.md).
BATCH_OF = {"resnet18_train": 8}


def batch_of(name):
    return BATCH_OF.get(name, BATCH)
ROWS = 16
IGNORE = -100

# The model zoo's tiny Hugging Face models (scripts/zoo/export.py), exported
# for training into test/Training/zoo/<family>/model.onnx.
ZOO = {"zoo-gpt2": "gpt2", "zoo-llama": "llama"}
ZOO_TRAIN_DIR = os.path.join(HERE, "zoo")
ZOO_SEQ = 16
# Graph inputs of the zoo exports, in order, and the reference file of each.
ZOO_INPUTS = [("input_ids", "input.npy"),
              ("attention_mask", "input.attention_mask.npy")]


def is_zoo(name):
    return name in ZOO


# Modules written in plain PyTorch as users write them (user_models.py),
# exported for training into test/Training/user/<name>/model.onnx.
USER = {"user-gpt": "gpt"}
USER_DIR = os.path.join(HERE, "user")


def is_user(name):
    return name in USER


class MappingError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def make_data(name):
    """Fixed inputs and labels for `name` (numpy arrays)."""
    rng = np.random.RandomState(1000 + MODELS.index(name))
    if name == "mlp":
        x = rng.standard_normal((ROWS, 64)).astype(np.float32)
        y = rng.randint(0, 32, size=(ROWS,)).astype(np.int64)
    elif name.startswith("transformer"):
        x = rng.standard_normal((ROWS, 16, 64)).astype(np.float32)
        y = rng.standard_normal((ROWS, 16, 64)).astype(np.float32)
    elif name == "gpt":
        x = rng.randint(0, 512, size=(ROWS, 16)).astype(np.int64)
        y = np.full_like(x, IGNORE)
        y[:, :-1] = x[:, 1:]                       # next token
        drop = rng.random_sample((ROWS, 15)) < 0.1  # ~10% more ignored
        y[:, :-1][drop] = IGNORE
    elif is_user(name):
        import user_models
        cfg = user_models.USER_GPT
        x = rng.randint(0, cfg["vocab"], size=(ROWS, cfg["seq"])).astype(
            np.int64)
        y = np.full_like(x, IGNORE)
        y[:, :-1] = x[:, 1:]                       # next token
        drop = rng.random_sample((ROWS, cfg["seq"] - 1)) < 0.1
        y[:, :-1][drop] = IGNORE
    elif name in ("resnet18", "resnet18_train"):
        x = rng.standard_normal((ROWS, 3, 32, 32)).astype(np.float32)
        y = rng.randint(0, 10, size=(ROWS,)).astype(np.int64)
    elif is_zoo(name):
        # Token ids and an attention mask (one input each, graph order).
        # In every batch, row 4j+1 is right-padded by 1..5 positions (which
        # changes no label's loss: with causal attention no unmasked query
        # sees a padded key) and row 4j+2 has a hole of 1..3 masked
        # positions inside (later queries must not see those keys: this is
        # what tests the mask). Position 0 is never masked, so every query
        # sees a key. A position has a label only if it and the next one
        # are unmasked.
        vocab = zoo_config(name).vocab_size
        ids = rng.randint(0, vocab, size=(ROWS, ZOO_SEQ)).astype(np.int64)
        mask = np.ones_like(ids)
        for r in range(1, ROWS, BATCH):
            mask[r, ZOO_SEQ - rng.randint(1, 6):] = 0
            lo = rng.randint(1, ZOO_SEQ - 4)
            mask[r + 1, lo:lo + rng.randint(1, 4)] = 0
        y = np.full_like(ids, IGNORE)
        keep = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)
        y[:, :-1] = np.where(keep, ids[:, 1:], IGNORE)  # next token
        drop = rng.random_sample((ROWS, ZOO_SEQ - 1)) < 0.1  # ~10% more ignored
        y[:, :-1][drop] = IGNORE
        x = (ids, mask)
    else:
        raise KeyError(name)
    return x, y


def loss_fn(name, out, y):
    if name.startswith("transformer"):
        return F.mse_loss(out, y)
    # Cross-entropy over the last dimension, mean over non-ignored labels.
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1),
                           ignore_index=IGNORE)


def optimizer_config(name, opt):
    # The zoo's language models train as the bundled gpt does.
    gpt_like = name == "gpt" or is_zoo(name) or is_user(name)
    if opt == "sgd":
        # Batch-norm training with SGD is stable to float32 rounding only
        # at a small step (see ref/README.md).
        lr = (3e-4 if name == "resnet18_train" else
              0.02 if gpt_like or name == "resnet18" else 0.05)
        return dict(type="SGD", lr=lr,
                    momentum=0.9, dampening=0.0, weight_decay=1e-4,
                    nesterov=False, clip_grad_norm=None)
    if opt == "adamw":
        return dict(type="AdamW", lr=1e-3, betas=[0.9, 0.999], eps=1e-8,
                    weight_decay=0.01, amsgrad=False,
                    clip_grad_norm=1.0 if gpt_like else None)
    raise KeyError(opt)


def make_optimizer(params, cfg):
    if cfg["type"] == "SGD":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"],
                               dampening=cfg["dampening"],
                               weight_decay=cfg["weight_decay"],
                               nesterov=cfg["nesterov"], foreach=False)
    return torch.optim.AdamW(params, lr=cfg["lr"], betas=tuple(cfg["betas"]),
                             eps=cfg["eps"], weight_decay=cfg["weight_decay"],
                             amsgrad=cfg["amsgrad"], foreach=False)


# --------------------------------------------------------------------------
# BatchNorm folded by the exporter
# --------------------------------------------------------------------------
def fold_batchnorm(model):
    """Replace every Conv2d -> BatchNorm2d pair by one Conv2d with a bias
    holding the eval-mode fold (what torch.onnx does with do_constant_folding
    in eval mode). Returns {conv param name: bn module name}."""
    mods = list(model.named_modules())
    folded = {}
    for (cname, conv), (bname, bn) in zip(mods, mods[1:]):
        if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
            continue
        with torch.no_grad():
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            w = conv.weight * scale.reshape(-1, 1, 1, 1)
            b = conv.bias if conv.bias is not None else torch.zeros_like(bn.bias)
            b = (b - bn.running_mean) * scale + bn.bias
        conv.weight = nn.Parameter(w.clone())
        conv.bias = nn.Parameter(b.clone())
        parent_name, _, child = bname.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, nn.Identity())
        folded[cname + ".weight"] = bname
        folded[cname + ".bias"] = bname
    return folded


# --------------------------------------------------------------------------
# ONNX initializer -> torch parameter mapping
# --------------------------------------------------------------------------
def tensors_of(model):
    """Trainable parameters (deduplicated: a tied weight once) and float
    buffers, name -> (tensor, kind)."""
    out = {}
    for n, p in model.named_parameters():
        out[n] = (p, "parameter")
    for n, b in model.named_buffers():
        if b.is_floating_point():
            out[n] = (b, "buffer")
    return out


def views(t):
    """(array, transposed, slice) views of a torch tensor an initializer may
    equal: itself, its transpose (2-D) and equal slices along dim 0 (a packed
    q/k/v projection split by the exporter), each possibly transposed."""
    a = t.detach().numpy()
    yield a, False, None
    if a.ndim == 2:
        yield a.T, True, None
    for k in (2, 3, 4):
        if a.ndim >= 1 and a.shape[0] % k == 0 and a.shape[0] > k:
            n = a.shape[0] // k
            for i in range(k):
                s = a[i * n:(i + 1) * n]
                sl = {"dim": 0, "start": i * n, "stop": (i + 1) * n}
                yield s, False, sl
                if s.ndim == 2:
                    yield s.T, True, sl


def build_mapping(name, model, onnx_model, folded, constant_buffers=()):
    """constant_buffers: torch buffers the ONNX may hold as Constant nodes
    rather than initializers (they need no initializer)."""
    tensors = tensors_of(model)
    inits = [(i.name, numpy_helper.to_array(i)) for i in
             onnx_model.graph.initializer]
    mapping = {}
    claimed = set()
    # 1. Same name and shape.
    for iname, arr in inits:
        if iname in tensors:
            t, kind = tensors[iname]
            if tuple(t.shape) != arr.shape:
                raise MappingError(
                    "%s: initializer '%s' %s has the name of torch %s '%s' "
                    "but its shape is %s" % (name, iname, arr.shape, kind,
                                             iname, tuple(t.shape)))
            mapping[iname] = dict(param=iname, kind=kind, transposed=False,
                                  slice=None, match="name")
            claimed.add(iname)
    # 2. Renamed: equal (exactly) to a parameter, its transpose or a slice;
    #    for a folded convolution, equal to the fold up to rounding.
    for iname, arr in inits:
        if iname in mapping:
            continue
        cands = []
        for tname, (t, kind) in tensors.items():
            for v, tr, sl in views(t):
                if v.shape != arr.shape or v.dtype != arr.dtype:
                    continue
                if np.array_equal(v, arr):
                    cands.append((tname, kind, tr, sl, "exact", 0.0))
                elif tname in folded and np.allclose(v, arr, rtol=1e-5,
                                                     atol=1e-6):
                    cands.append((tname, kind, tr, sl, "folded-bn",
                                  float(np.abs(v - arr).max())))
        if not cands:
            raise MappingError(
                "%s: initializer '%s' %s %s equals no torch parameter or "
                "buffer (nor a transpose or slice of one)" % (
                    name, iname, arr.dtype, arr.shape))
        exact = [c for c in cands if c[4] == "exact"]
        cands = exact or cands
        if len(cands) > 1:
            unclaimed = [c for c in cands if c[0] not in claimed]
            if len(unclaimed) == 1:
                cands = unclaimed
        if len(cands) > 1:
            raise MappingError(
                "%s: initializer '%s' %s is ambiguous: it equals %s" % (
                    name, iname, arr.shape,
                    ", ".join("%s%s%s" % (c[0], ".T" if c[2] else "",
                                          "[%d:%d]" % (c[3]["start"],
                                                       c[3]["stop"])
                                          if c[3] else "") for c in cands)))
        tname, kind, tr, sl, how, diff = cands[0]
        entry = dict(param=tname, kind=kind, transposed=tr, slice=sl,
                     match=how)
        if how == "folded-bn":
            entry["folded_from"] = folded[tname]
            entry["max_abs_diff_to_torch_fold"] = diff
        mapping[iname] = entry
        claimed.add(tname)
    # 3. Every trainable parameter and float buffer is covered.
    for tname, (t, kind) in tensors.items():
        entries = [m for m in mapping.values() if m["param"] == tname]
        if not entries and kind == "buffer" and tname in constant_buffers:
            continue
        whole = [m for m in entries if m["slice"] is None]
        if whole:
            continue
        covered = np.zeros(t.shape[0] if t.dim() else 1, dtype=bool)
        for m in entries:
            covered[m["slice"]["start"]:m["slice"]["stop"]] = True
        if not entries or not covered.all():
            raise MappingError(
                "%s: torch %s '%s' %s has no ONNX initializer%s" % (
                    name, kind, tname, tuple(t.shape),
                    " covering all of it" if entries else ""))
    return mapping, dict(inits)


def load_from_onnx(model, mapping, arrays):
    """Copy the ONNX's values into the module; every initializer that maps
    to the same torch tensor (a tied weight) must agree."""
    tensors = tensors_of(model)
    written = {}
    with torch.no_grad():
        for iname, m in mapping.items():
            t, _ = tensors[m["param"]]
            a = arrays[iname]
            if m["transposed"]:
                a = a.T
            src = torch.from_numpy(np.array(a, dtype=np.float32))
            dst = t if m["slice"] is None else \
                t[m["slice"]["start"]:m["slice"]["stop"]]
            key = (m["param"], None if m["slice"] is None else
                   (m["slice"]["start"], m["slice"]["stop"]))
            if key in written:
                if not torch.equal(dst, src):
                    raise MappingError(
                        "initializers '%s' and '%s' map to the same torch "
                        "tensor '%s' but hold different values" % (
                            written[key], iname, m["param"]))
                continue
            dst.copy_(src)
            written[key] = iname


def onnx_weights(model, mapping):
    """The module's current values under the ONNX initializer names, in the
    ONNX's layout."""
    tensors = tensors_of(model)
    out = {}
    for iname, m in mapping.items():
        a = tensors[m["param"]][0].detach().numpy()
        if m["slice"] is not None:
            a = a[m["slice"]["start"]:m["slice"]["stop"]]
        if m["transposed"]:
            a = a.T
        out[iname] = np.ascontiguousarray(a, dtype=np.float32)
    return out


# --------------------------------------------------------------------------
# safetensors (written with numpy)
# --------------------------------------------------------------------------
def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    for k, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        b = a.tobytes()
        header[k] = {"dtype": "F32", "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = dict({"format": "pt"}, **(metadata or {}))
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------
def check_no_dropout(model):
    for n, m in model.named_modules():
        if isinstance(m, nn.Dropout) and m.p != 0:
            raise RuntimeError("%s has dropout p=%g" % (n, m.p))
        if isinstance(m, nn.MultiheadAttention) and m.dropout != 0:
            raise RuntimeError("%s has attention dropout %g" % (n, m.dropout))


def zoo_export_module():
    """scripts/zoo/export.py (the zoo's configs, seed and wrappers)."""
    if "pcc_zoo_export" not in sys.modules:
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "pcc_zoo_export", os.path.join(ROOT, "scripts", "zoo", "export.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["pcc_zoo_export"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["pcc_zoo_export"]


# Dropout probabilities of the zoo configs, set to 0 for training parity.
ZOO_DROPOUT_FIELDS = ("embd_pdrop", "resid_pdrop", "attn_pdrop",
                      "attention_dropout", "hidden_dropout",
                      "summary_first_dropout")


def zoo_config(name):
    Z = zoo_export_module()
    cfg_fn, _, _ = Z.FAMILIES[ZOO[name]]
    config = cfg_fn()
    zeroed = []
    for k in ZOO_DROPOUT_FIELDS:
        if getattr(config, k, None) is not None:
            setattr(config, k, 0.0)
            zeroed.append(k)
    config.pcc_zeroed_dropout_fields = zeroed
    return config


def build_zoo(name):
    """The zoo family's module (same config and seed as scripts/zoo/export.py,
    dropout probabilities 0) wrapped as (input_ids, attention_mask) ->
    logits. Its nn.Dropout modules (p=0) are made identities, so that the
    training-mode export writes no Dropout node (pcc's importer refuses
    Dropout in training mode, even with ratio 0); with p=0 that changes no
    value."""
    import transformers
    Z = zoo_export_module()
    _, cls_name, kind = Z.FAMILIES[ZOO[name]]
    assert kind == "text", kind
    torch.manual_seed(0)  # as export.py's build()
    config = zoo_config(name)
    model = getattr(transformers, cls_name)(config)
    for n, m in model.named_modules():
        if isinstance(m, nn.Dropout):
            if m.p != 0:
                raise RuntimeError("%s: %s has dropout p=%g" % (name, n, m.p))
            m.forward = _identity
    return Z.TextLM(model), config


def _identity(x):
    return x


def check_zoo_build(name, wrapper):
    """The rebuilt module is the zoo's: it reproduces the zoo's PyTorch
    output (test/Zoo/models/<family>/dynamo) in eval mode."""
    d = os.path.join(ROOT, "test", "Zoo", "models", ZOO[name], "dynamo")
    feeds = [torch.from_numpy(np.load(os.path.join(d, "input.%s.npy" % n)))
             for n, _ in ZOO_INPUTS]
    ref = np.load(os.path.join(d, "output.logits.npy"))
    wrapper.eval()
    with torch.no_grad():
        out = wrapper(*feeds).numpy()
    err = float(np.abs(out - ref).max() / np.abs(ref).max())
    if err > 1e-6:
        raise RuntimeError("%s: the rebuilt module does not reproduce the "
                           "zoo's %s/output.logits.npy (max diff / max |ref| "
                           "= %g)" % (name, os.path.relpath(d, ROOT), err))
    return err


def export_zoo(name, wrapper, path):
    """Exports the zoo module for training: the TorchScript exporter with
    training=TRAINING and no constant folding, so that no two parameters are
    merged because they are equal at init (in eval mode the exporter
    deduplicates initializers by value: every LayerNorm/RMSNorm weight is
    ones, every bias zero). Dims batch and seq are symbolic. The example
    inputs right-pad two rows (as the zoo's), so the trace keeps the
    attention-mask path."""
    Z = zoo_export_module()
    inputs = Z.make_inputs("text", BATCH, ZOO_SEQ)
    names = [n for n, _ in ZOO_INPUTS]
    assert list(inputs) == names, list(inputs)
    dyn = {n: {0: "batch", 1: "seq"} for n in names + ["logits"]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    wrapper.train()
    import contextlib
    import io
    import warnings
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(inputs[n] for n in names), path,
                          dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=names,
                          output_names=["logits"], dynamic_axes=dyn)
    m = onnx.load(path)
    ops = sorted({n.op_type for n in m.graph.node})
    if "Dropout" in ops:
        raise RuntimeError("%s: the export has Dropout nodes" % path)
    print("  %s: exported %s (%d nodes, %d initializers, %d bytes)" % (
        name, os.path.relpath(path, ROOT), len(m.graph.node),
        len(m.graph.initializer), os.path.getsize(path)))


def check_zoo_onnx(name, wrapper, path, x):
    """The ONNX (onnxruntime) and the module (eval mode) agree on the
    reference's 16 rows."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = {n: a for (n, _), a in zip(ZOO_INPUTS, x)}
    got = sess.run(None, feeds)[0]
    wrapper.eval()
    with torch.no_grad():
        out = wrapper(*[torch.from_numpy(a) for a in x]).numpy()
    err = float(np.abs(out - got).max() / np.abs(out).max())
    if err > 1e-5:
        raise RuntimeError("%s: onnxruntime's output of %s differs from the "
                           "module's (max diff / max |out| = %g)" % (
                               name, os.path.relpath(path, ROOT), err))
    return err


def tied_parameters(model):
    """{parameter: [other names of the same tensor]} (GPT-2's lm_head.weight
    is its wte.weight)."""
    out = {}
    first = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out.setdefault(first[id(p)], []).append(n)
        else:
            first[id(p)] = n
    return out


def map_and_load(name, model, onnx_model):
    """Maps the ONNX's initializers to the module's tensors and loads their
    values. Non-persistent buffers (rotary inverse frequencies, causal
    masks) are Constant nodes in an export, not initializers. Returns the
    mapping and those buffers' names."""
    persistent = set(model.state_dict().keys())
    constant_buffers = {n for n, _ in model.named_buffers()
                        if n not in persistent}
    mapping, arrays = build_mapping(name, model, onnx_model, {},
                                    constant_buffers)
    load_from_onnx(model, mapping, arrays)
    return mapping, constant_buffers


def prepare_zoo(name, export=False):
    wrapper, config = build_zoo(name)
    build_err = check_zoo_build(name, wrapper)
    path = os.path.join(ZOO_TRAIN_DIR, ZOO[name], "model.onnx")
    if export or not os.path.exists(path):
        export_zoo(name, copy.deepcopy(wrapper), path)
    onnx_model = onnx.load(path)
    ops = {n.op_type for n in onnx_model.graph.node}
    if "Dropout" in ops:
        raise RuntimeError("%s has Dropout nodes" % path)
    check_no_dropout(wrapper)
    mapping, constant_buffers = map_and_load(name, wrapper, onnx_model)
    x, _ = make_data(name)
    onnx_err = check_zoo_onnx(name, wrapper, path, x)
    rel = os.path.relpath(path, ROOT)
    notes = dict(onnx=rel,
                 zoo_family=ZOO[name],
                 model_class=type(wrapper.model).__name__,
                 zoo_output_max_rel_diff=build_err,
                 onnxruntime_vs_torch_max_rel_diff=onnx_err,
                 dropout_fields_set_to_0=config.pcc_zeroed_dropout_fields,
                 constant_buffers_not_initializers=sorted(constant_buffers),
                 tied_in_torch=tied_parameters(wrapper),
                 batchnorm_folded_by_exporter=False)
    return wrapper, mapping, notes


def prepare_user(name, export=False):
    """A user_models.py module, exported as its user would: the TorchScript
    exporter, opset 17, a dynamic batch, in training mode without constant
    folding (so that equal initial weights stay distinct initializers)."""
    import user_models
    model = user_models.build_user_gpt()
    path = os.path.join(USER_DIR, USER[name], "model.onnx")
    if export or not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        x0 = torch.zeros((BATCH, user_models.USER_GPT["seq"]),
                         dtype=torch.int64)
        m = copy.deepcopy(model).train()
        import contextlib
        import io
        import warnings
        with warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (x0,), path, dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False,
                              input_names=["idx"], output_names=["logits"],
                              dynamic_axes={"idx": {0: "batch"},
                                            "logits": {0: "batch"}})
        print("  %s: exported %s (%d bytes)" % (
            name, os.path.relpath(path, ROOT), os.path.getsize(path)))
    onnx_model = onnx.load(path)
    check_no_dropout(model)
    mapping, _ = map_and_load(name, model, onnx_model)
    notes = dict(onnx=os.path.relpath(path, ROOT),
                 module="test/Training/user_models.py",
                 batchnorm_folded_by_exporter=False)
    try:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, so,
                                    providers=["CPUExecutionProvider"])
        x, _ = make_data(name)
        got = sess.run(None, {"idx": x})[0]
        model.eval()
        with torch.no_grad():
            out = model(torch.from_numpy(x)).numpy()
        err = float(np.abs(out - got).max() / np.abs(out).max())
        if err > 1e-5:
            raise RuntimeError("%s: onnxruntime's output differs from the "
                               "module's (%g)" % (name, err))
        notes["onnxruntime_vs_torch_max_rel_diff"] = err
    except ImportError:
        pass
    return model, mapping, notes


def prepare(name, export=False):
    """The module with the ONNX's weights, the mapping and the model's
    structure notes."""
    if is_zoo(name):
        return prepare_zoo(name, export)
    if is_user(name):
        return prepare_user(name, export)
    model, _, _ = make_examples.build(name)
    onnx_model = onnx.load(os.path.join(EXAMPLES, name + ".onnx"))
    ops = {n.op_type for n in onnx_model.graph.node}
    folded = {}
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    if has_bn and "BatchNormalization" not in ops:
        folded = fold_batchnorm(model)
    check_no_dropout(model)
    mapping, arrays = build_mapping(name, model, onnx_model, folded)
    load_from_onnx(model, mapping, arrays)
    # The start point reproduces the export's reference output.
    x = np.load(os.path.join(EXAMPLES, "data", name + ".input.npy"))
    ref = np.load(os.path.join(EXAMPLES, "data", name + ".output.npy"))
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x)).numpy()
    err = float(np.abs(out - ref).max() / max(1e-30, np.abs(ref).max()))
    if err > 1e-5:
        raise RuntimeError("%s: the rebuilt module with the ONNX's weights "
                           "does not reproduce examples/data/%s.output.npy "
                           "(max diff / max |ref| = %g)" % (name, name, err))
    notes = dict(onnx="examples/%s.onnx" % name,
                 eval_output_max_rel_diff=err,
                 batchnorm_folded_by_exporter=bool(folded))
    return model, mapping, notes


def global_grad_norm(params):
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)


def train(name, model0, mapping, opt, x, y, float64=False, amp=None,
          init_scale=65536.0, decomposed_gelu=False, frozen=()):
    """Trains a copy of model0; returns the log rows (step, loss, grad
    norm, loss scale), the final weights under the ONNX names, the optimizer
    config and, per torch parameter, the largest |gradient| each element
    saw. With amp (torch.bfloat16 or torch.float16) the forward pass and
    the loss run under torch.autocast("cpu", amp): PyTorch's mixed
    precision, fp32 weights, gradients and optimizer; float16 with
    torch.amp.GradScaler's dynamic loss scaling (its defaults: from 2^16,
    halved at an overflow, whose optimizer step is skipped, doubled after
    2000 steps without one; init_scale sets where it starts). The
    `frozen` torch parameters get requires_grad=False and stay out of the
    optimizer (pcc --frozen). With
    decomposed_gelu, GELU runs as the ONNX exporter writes it: erf's
    formula op by op, each op rounding to the 16-bit type (one torch op,
    F.gelu, rounds once)."""
    model = copy.deepcopy(model0)
    xs = x if isinstance(x, tuple) else (x,)  # one array per model input
    if float64:
        model = model.double()
        xs = tuple(a.astype(np.float64) if a.dtype == np.float32 else a
                   for a in xs)
        y = y.astype(np.float64) if y.dtype == np.float32 else y
    model.train()
    for n, p in model.named_parameters():
        if n in frozen:
            p.requires_grad_(False)
    named = [(n, p) for n, p in model.named_parameters()  # a tied weight once
             if p.requires_grad]
    params = [p for _, p in named]
    cfg = optimizer_config(name, opt)
    optim = make_optimizer(params, cfg)
    max_grad = {n: torch.zeros_like(p) for n, p in named}
    scaler = (torch.amp.GradScaler("cpu", init_scale=init_scale)
              if amp == torch.float16 else None)
    gelu = F.gelu

    def exported_gelu(t, approximate="none"):
        if t.dtype not in (torch.float16, torch.bfloat16):
            return gelu(t, approximate=approximate)
        if approximate == "tanh":
            c = torch.tensor(math.sqrt(2 / math.pi), dtype=t.dtype)
            return t * 0.5 * (torch.tanh(c * (t + 0.044715 * t * t * t)) + 1)
        return (t * (torch.erf(t / torch.tensor(math.sqrt(2.0),
                                                dtype=t.dtype)) + 1)) * 0.5

    if decomposed_gelu:
        F.gelu = exported_gelu
    try:
        rows = train_steps(name, model, xs, y, optim, cfg, params, named,
                           max_grad, scaler, amp)
    finally:
        F.gelu = gelu
    weights = onnx_weights(model, mapping)
    max_grad = {n: g.detach().numpy() for n, g in max_grad.items()}
    return rows, weights, cfg, max_grad


def train_steps(name, model, xs, y, optim, cfg, params, named, max_grad,
                scaler, amp):
    """train()'s STEPS steps; the log rows."""
    rows = []
    for step in range(STEPS):
        batch = batch_of(name)
        lo = (step * batch) % ROWS
        xb = [torch.from_numpy(a[lo:lo + batch]) for a in xs]
        yb = torch.from_numpy(y[lo:lo + batch])
        optim.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=amp or torch.bfloat16,
                            enabled=amp is not None):
            loss = loss_fn(name, model(*xb), yb)
        scale = scaler.get_scale() if scaler else 1.0
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(optim)
        else:
            loss.backward()
        for n, p in named:
            if p.grad is not None:
                torch.maximum(max_grad[n], p.grad.abs(), out=max_grad[n])
        if cfg["clip_grad_norm"] is not None:
            gn = torch.nn.utils.clip_grad_norm_(
                params, cfg["clip_grad_norm"], foreach=False)
        else:
            gn = global_grad_norm(params)
        if scaler:
            scaler.step(optim)
            scaler.update()
        else:
            optim.step()
        rows.append((step + 1, float(loss.item()), float(gn.item()), scale))
    return rows


def noise_gradient_elements(mapping, max_grad32, max_grad64, rel=1e-10):
    """Elements (flat index ranges in the ONNX layout, per initializer) whose
    gradient is zero in exact arithmetic but not in float32: in a float64
    run |g| <= rel * the tensor's largest |g| at every step, while the
    float32 run saw a nonzero gradient. The key bias of attention is such
    (softmax ignores a shift of the scores that is the same for every key):
    its float32 gradient is rounding noise, which Adam normalises into
    full-size, implementation-dependent updates. (Elements whose float32
    gradient is exactly zero too, such as taps that only ever see zero
    padding or a unit behind a dead ReLU, stay compared: any implementation
    computes those zeros exactly.)"""
    out = {}
    for iname, m in mapping.items():
        if m["kind"] != "parameter" or m["param"] not in max_grad64:
            continue  # a buffer, or a frozen parameter
        g64, g32 = max_grad64[m["param"]], max_grad32[m["param"]]
        if m["slice"] is not None:
            g64 = g64[m["slice"]["start"]:m["slice"]["stop"]]
            g32 = g32[m["slice"]["start"]:m["slice"]["stop"]]
        if m["transposed"]:
            g64, g32 = g64.T, g32.T
        g64 = np.ascontiguousarray(g64).reshape(-1)
        g32 = np.ascontiguousarray(g32).reshape(-1)
        top = g64.max() if g64.size else 0.0
        if top <= 0:
            continue
        noise = (g64 <= rel * top) & (g32 > 0)
        edge = np.concatenate([[False], noise, [False]])
        edges = np.flatnonzero(edge[1:] != edge[:-1])
        ranges = [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])]
        if ranges:
            out[iname] = ranges
    return out


def exclude_noise(cfg, metadata, mapping, max_grad32, max_grad64):
    """Records noise_gradient_elements in an AdamW run's config and its
    reference weights' metadata (compare.py leaves them out)."""
    exclude = noise_gradient_elements(mapping, max_grad32, max_grad64)
    if exclude:
        cfg["excluded_from_weight_comparison"] = exclude
        metadata["pcc.exclude"] = json.dumps(exclude, separators=(",", ":"))


def tied_copies(mapping):
    """{copy: {"of": first, "transposed": bool}} for initializers that hold
    the same torch tensor as an earlier one (a tied weight the exporter
    wrote twice). pcc's importer stores such a copy once (as a transpose of
    the first), so its weights file may lack the copy."""
    first, out = {}, {}
    for iname, m in mapping.items():
        if m["slice"] is not None:
            continue
        if m["param"] in first:
            f = first[m["param"]]
            out[iname] = {"of": f, "transposed":
                          mapping[f]["transposed"] != m["transposed"]}
        else:
            first[m["param"]] = iname
    return out


def tied_groups(mapping):
    by = {}
    for iname, m in mapping.items():
        by.setdefault(m["param"], []).append(iname)
    return {p: v for p, v in by.items() if len(v) > 1}


def do_model(name, export=False):
    model, mapping, notes = prepare(name, export)
    out_dir = os.path.join(REF, name)
    os.makedirs(out_dir, exist_ok=True)
    x, y = make_data(name)
    if is_zoo(name):
        inputs = [f for _, f in ZOO_INPUTS]
        for a, f in zip(x, inputs):
            np.save(os.path.join(out_dir, f), a)
    else:
        inputs = ["input.npy"]
        np.save(os.path.join(out_dir, "input.npy"), x)
    np.save(os.path.join(out_dir, "labels.npy"), y)
    notes["tied"] = tied_groups(mapping)
    with open(os.path.join(out_dir, "mapping.json"), "w") as f:
        json.dump(dict(notes, initializers=mapping), f, indent=1)
        f.write("\n")
    config = dict(
        model=name, onnx=notes["onnx"], steps=STEPS, batch=batch_of(name),
        rows=int(y.shape[0]),
        schedule="step k (1-based) uses rows [((k-1)*batch) % rows, +batch)",
        mode="train (%s%s)" % (
            "dropout probabilities set to 0" if is_zoo(name) else
            "no dropout in these models",
            "; BatchNorm folded into the convolutions by the exporter, so "
            "there is no BatchNorm to train" if notes[
                "batchnorm_folded_by_exporter"] else
            "; BatchNorm with batch statistics, running statistics updated "
            "(momentum 0.1, unbiased variance) and compared as weights"
            if name == "resnet18_train" else ""),
        loss=("mse (mean)" if name.startswith("transformer") else
              "cross_entropy over the last dim, mean over labels != %d" %
              IGNORE),
        optimizers={}, torch=torch.__version__)
    if is_zoo(name):
        import transformers
        config["transformers"] = transformers.__version__
        config["inputs"] = inputs  # one file per model input, graph order
    summary = []
    for opt in ("sgd", "adamw"):
        rows, weights, cfg, grad32 = train(name, model, mapping, opt, x, y)
        # The same run in float64: a noise floor for the comparisons, and
        # the elements whose gradient is exactly zero.
        rows64, _, _, grad64 = train(name, model, mapping, opt, x, y,
                                     float64=True)
        cfg = dict(cfg)
        cfg["float64_max_loss_rel_diff"] = max(
            abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(rows, rows64))
        metadata = {}
        copies = tied_copies(mapping)
        if copies:
            metadata["pcc.tied"] = json.dumps(copies, separators=(",", ":"))
        if cfg["type"] == "AdamW":
            exclude_noise(cfg, metadata, mapping, grad32, grad64)
        config["optimizers"][opt] = cfg
        with open(os.path.join(out_dir, opt + ".losses.csv"), "w") as f:
            f.write("step,loss,grad_norm\n")
            for s, l, g, _ in rows:
                f.write("%d,%r,%r\n" % (s, l, g))
        write_safetensors(os.path.join(out_dir, opt + ".final.safetensors"),
                          weights, metadata)
        summary.append("%s/%s: loss %.6g -> %.6g (grad norm %.4g -> %.4g); "
                       "float32 vs float64 loss rel diff <= %.2g%s" % (
                           name, opt, rows[0][1], rows[-1][1], rows[0][2],
                           rows[-1][2], cfg["float64_max_loss_rel_diff"],
                           "; rounding-noise gradient elements excluded: %s" %
                           metadata["pcc.exclude"] if "pcc.exclude" in metadata else ""))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    for s in summary:
        print(s)
    for p, v in notes["tied"].items():
        print("  %s: %s share torch parameter '%s'" % (name, " and ".join(v), p))
    if notes["batchnorm_folded_by_exporter"]:
        print("  %s: BatchNorm was folded into the convolutions by the "
              "exporter; trained as conv+bias" % name)


def do_model_amp(name, precision, init_scale=65536.0, tag=None):
    """The bf16 (fp16) references of `name`: the same runs as do_model's
    under torch.autocast, in ref/<model>/<precision>.<opt>.losses.csv and
    <precision>.<opt>.final.safetensors, with <precision>.json saying how
    far they are from the float32 runs (the yardstick for the parity
    tolerances). fp16's log has the loss scale of each step; its scaler
    starts at init_scale, and the files are named after `tag` (default: the
    precision)."""
    tag = tag or precision
    model, mapping, _ = prepare(name)
    out_dir = os.path.join(REF, name)
    x, y = make_data(name)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    notes = dict(model=name, torch=torch.__version__,
                 autocast='torch.autocast("cpu", dtype=torch.%s) around the '
                 "forward pass and the loss; fp32 weights, gradients and "
                 "optimizer" % ("float16" if precision == "fp16"
                                else "bfloat16") +
                 ('; torch.amp.GradScaler("cpu", init_scale=%r), its other '
                  "settings the defaults" % init_scale
                  if precision == "fp16" else ""), optimizers={})
    for opt in ("sgd", "adamw"):
        rows, weights, cfg, _ = train(name, model, mapping, opt, x, y,
                                      amp=dtype, init_scale=init_scale)
        rows32, weights32, _, _ = train(name, model, mapping, opt, x, y)
        # Steps that overflowed (skipped) are not the noise's measure.
        pairs = [(a, b) for a, b in zip(rows, rows32)
                 if math.isfinite(a[2])]
        rel = [abs(a[1] - b[1]) / abs(b[1]) for a, b in pairs]
        grel = [abs(a[2] - b[2]) / abs(b[2]) for a, b in pairs]
        wdiff = max(float(np.abs(weights[k] - weights32[k]).max())
                    for k in weights)
        key = "fp32_vs_" + precision
        # A run with skipped steps follows another path than the fp32 one:
        # only a run without skips measures the precision's noise (a tagged
        # run's bound is its precision's).
        notes["optimizers"][opt] = {} if tag != precision else {
            key + "_loss_rel_diff_first_step": rel[0],
            key + "_loss_rel_diff_max": max(rel),
            key + "_grad_norm_rel_diff_max": max(grel),
            key + "_weights_max_abs_diff": wdiff}
        if precision == "fp16" and tag == precision:
            # fp16's noise has a second yardstick: the same module run as
            # the ONNX file has it, GELU decomposed op by op (each op
            # rounding to fp16), is as valid an fp16 run of the exported
            # graph; on the MLP, trained to a small loss, a pre-activation
            # within a rounding of zero takes the other sign in step 1 and
            # the two runs drift apart by more than either is from f32.
            rowsb, weightsb, _, _ = train(name, model, mapping, opt, x, y,
                                          amp=dtype, init_scale=init_scale,
                                          decomposed_gelu=True)
            bkey = "fp16_vs_decomposed_gelu"
            notes["optimizers"][opt].update({
                bkey + "_loss_rel_diff_max": max(
                    abs(a[1] - b[1]) / abs(a[1]) for a, b in zip(rows, rowsb)),
                bkey + "_grad_norm_rel_diff_max": max(
                    abs(a[2] - b[2]) / abs(a[2]) for a, b in zip(rows, rowsb)),
                bkey + "_weights_max_abs_diff": max(
                    float(np.abs(weights[k] - weightsb[k]).max())
                    for k in weights)})
        if precision == "fp16":
            notes["optimizers"][opt]["skipped_steps"] = len(rows) - len(pairs)
        metadata = {}
        copies = tied_copies(mapping)
        if copies:
            metadata["pcc.tied"] = json.dumps(copies, separators=(",", ":"))
        with open(os.path.join(out_dir, tag + "." + opt +
                               ".losses.csv"), "w") as f:
            f.write("step,loss,grad_norm%s\n" % (
                ",loss_scale" if precision == "fp16" else ""))
            for st, l, g, sc in rows:
                f.write("%d,%r,%r%s\n" % (
                    st, l, g, ",%r" % sc if precision == "fp16" else ""))
        write_safetensors(
            os.path.join(out_dir, tag + "." + opt +
                         ".final.safetensors"), weights, metadata)
        print("%s/%s %s: loss %.6g -> %.6g; vs fp32: loss rel diff "
              "first %.2g, max %.2g; weights max abs diff %.2g%s" % (
                  name, opt, tag, rows[0][1], rows[-1][1], rel[0],
                  max(rel), wdiff, "; %d steps skipped" % (
                      len(rows) - len(pairs)) if precision == "fp16" else ""))
    with open(os.path.join(out_dir, tag + ".json"), "w") as f:
        json.dump(notes, f, indent=1)
        f.write("\n")


def do_model_frozen(name, frozen, tag):
    """The float32 references of `name` with the torch parameters `frozen`
    held constant (requires_grad=False, not in the optimizer): the runs
    pcc --frozen=<their ONNX names> must match, in
    ref/<model>/<tag>.<opt>.losses.csv and <tag>.<opt>.final.safetensors;
    <tag>.json names the frozen weights in both."""
    model, mapping, _ = prepare(name)
    out_dir = os.path.join(REF, name)
    x, y = make_data(name)
    torch_names = dict(model.named_parameters())
    for n in frozen:
        if n not in torch_names:
            raise MappingError("%s has no parameter '%s'" % (name, n))
    onnx_names = sorted(k for k, v in mapping.items() if v["param"] in frozen)
    notes = dict(model=name, torch=torch.__version__,
                 frozen_torch_parameters=sorted(frozen),
                 frozen_onnx_initializers=onnx_names,
                 pcc_flag="--frozen=" + ",".join(onnx_names), optimizers={})
    for opt in ("sgd", "adamw"):
        rows, weights, cfg, grad32 = train(name, model, mapping, opt, x, y,
                                           frozen=frozen)
        cfg = dict(cfg)
        metadata = {}
        if cfg["type"] == "AdamW":
            # As do_model: elements whose gradient is rounding noise.
            _, _, _, grad64 = train(name, model, mapping, opt, x, y,
                                    float64=True, frozen=frozen)
            exclude_noise(cfg, metadata, mapping, grad32, grad64)
        notes["optimizers"][opt] = cfg
        for n in onnx_names:
            init = torch_names[mapping[n]["param"]].detach().numpy()
            if mapping[n]["transposed"]:
                init = init.T
            assert np.array_equal(weights[n], init), n
        with open(os.path.join(out_dir, tag + "." + opt + ".losses.csv"),
                  "w") as f:
            f.write("step,loss,grad_norm\n")
            for s, l, g, _ in rows:
                f.write("%d,%r,%r\n" % (s, l, g))
        copies = tied_copies(mapping)
        if copies:
            metadata["pcc.tied"] = json.dumps(copies, separators=(",", ":"))
        write_safetensors(os.path.join(out_dir, tag + "." + opt +
                                       ".final.safetensors"), weights,
                          metadata)
        print("%s/%s %s: loss %.6g -> %.6g, %s held constant" % (
            name, opt, tag, rows[0][1], rows[-1][1], ", ".join(onnx_names)))
    with open(os.path.join(out_dir, tag + ".json"), "w") as f:
        json.dump(notes, f, indent=1)
        f.write("\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="any of: " + " ".join(MODELS))
    ap.add_argument("--export", action="store_true",
                    help="re-export the zoo models' training ONNX files "
                    "(test/Training/zoo/<family>/model.onnx) even if present")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                    default="fp32",
                    help="bf16 or fp16: only the torch.autocast references "
                    "(<precision>.<opt>.*), next to the float32 ones")
    ap.add_argument("--init-scale", type=float, default=65536.0,
                    help="fp16: the GradScaler's initial scale (a large one "
                    "makes the first steps overflow)")
    ap.add_argument("--tag", default=None,
                    help="fp16/bf16: name the files <tag>.<opt>.* instead "
                    "of <precision>.<opt>.*")
    ap.add_argument("--frozen", default=None, metavar="PARAM,PARAM",
                    help="float32 runs with these torch parameters held "
                    "constant, in <tag>.<opt>.* (needs --tag)")
    args = ap.parse_args(argv)
    if args.frozen and not args.tag:
        ap.error("--frozen needs --tag")
    for name in args.models:
        if name not in MODELS:
            ap.error("unknown model '%s' (one of: %s)" % (name, " ".join(MODELS)))
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    for name in args.models or MODELS:
        try:
            if args.frozen:
                do_model_frozen(name, args.frozen.split(","), args.tag)
                continue
            if args.precision != "fp32":
                do_model_amp(name, args.precision, args.init_scale,
                             args.tag)
                continue
            do_model(name, args.export)
        except MappingError as e:
            sys.exit("make_reference.py: " + str(e))


if __name__ == "__main__":
    main(sys.argv[1:])
