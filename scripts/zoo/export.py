#!/usr/bin/env python3
"""Regenerates pcc's model zoo (test/Zoo/models) from tiny random-init models.

Tiny Hugging Face models, exported to ONNX by both of PyTorch's exporters,
with PyTorch's reference outputs.

Run it with the zoo venv's python (see scripts/zoo/setup-venv.sh):

    "${PCC_ZOO_VENV:-$HOME/.cache/pcc/zoo-venv}/bin/python" scripts/zoo/export.py [FAMILY...]

For each family it writes test/Zoo/models/<family>/<exporter>/ with
  model.onnx (+ model.onnx.data for the dynamo exporter: external weights)
  input.<name>.npy   one per graph input
  output.<name>.npy  PyTorch's outputs (float32)
  manifest.json      versions, graph signature, op types, sizes, check result
Nothing is downloaded: every model is built from a config written here and
initialised from torch.manual_seed(0), so a re-run gives the same files.
"""

import argparse
import collections
import contextlib
import io
import json
import os
import shutil
import sys
import warnings

import numpy as np
import onnx
import torch
import transformers

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZOO = os.path.join(ROOT, "test", "Zoo", "models")

BATCH, SEQ = 2, 8
HIDDEN, LAYERS, HEADS, INTER, VOCAB, MAXPOS = 64, 2, 8, 128, 128, 64

# Llama-style configs (Llama, Qwen2, Mistral, Gemma) share these field names.
def llama_like(cls, kv_heads, **extra):
    return cls(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
               num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               num_key_value_heads=kv_heads, max_position_embeddings=MAXPOS,
               use_cache=False, **extra)


def cfg_gpt2():
    return transformers.GPT2Config(vocab_size=VOCAB, n_positions=MAXPOS, n_embd=HIDDEN,
                                   n_layer=LAYERS, n_head=HEADS, n_inner=INTER,
                                   use_cache=False)


def cfg_bert():
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                   num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   intermediate_size=INTER, max_position_embeddings=MAXPOS,
                                   type_vocab_size=2, use_cache=False)


def cfg_vit():
    return transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3,
                                  hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, intermediate_size=INTER,
                                  num_labels=10)


# name -> (config factory, model class name, input kind)
FAMILIES = collections.OrderedDict([
    ("gpt2", (cfg_gpt2, "GPT2LMHeadModel", "text")),
    ("bert", (cfg_bert, "BertForMaskedLM", "text+types")),
    ("llama", (lambda: llama_like(transformers.LlamaConfig, 4), "LlamaForCausalLM", "text")),
    ("qwen2", (lambda: llama_like(transformers.Qwen2Config, 2), "Qwen2ForCausalLM", "text")),
    ("mistral", (lambda: llama_like(transformers.MistralConfig, 2, sliding_window=None),
                 "MistralForCausalLM", "text")),
    ("vit", (cfg_vit, "ViTForImageClassification", "image")),
    ("gemma", (lambda: llama_like(transformers.GemmaConfig, 2, head_dim=HIDDEN // HEADS),
               "GemmaForCausalLM", "text")),
    ("phi", (lambda: transformers.PhiConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        max_position_embeddings=MAXPOS, partial_rotary_factor=0.5, use_cache=False),
        "PhiForCausalLM", "text")),
])


class TextLM(torch.nn.Module):
    """Fixes the graph signature: named tensor inputs in, logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False, return_dict=True).logits


class TextLMWithTypes(TextLM):
    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids, return_dict=True).logits


class IdsLM(TextLM):
    """Token ids alone: the model builds its causal mask from positions (a
    user's pretraining export; no padding mask input)."""

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False,
                          return_dict=True).logits


class Image(TextLM):
    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values, return_dict=True).logits


WRAPPERS = {"text": TextLM, "text+types": TextLMWithTypes, "image": Image,
            "ids": IdsLM}


def make_inputs(kind, batch, seq=SEQ):
    g = torch.Generator().manual_seed(1234)
    if kind == "image":
        return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=g, dtype=torch.float32)}
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g, dtype=torch.int64)
    if kind == "ids":
        return {"input_ids": ids}
    mask = torch.ones(batch, seq, dtype=torch.int64)
    # Right padding in row 1 (and row 3 when there are 4): every query row still
    # sees at least one key, so the reference outputs hold no NaN.
    mask[1, seq - 3:] = 0
    if batch > 3:
        mask[3, 3:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "text+types":
        types = torch.zeros(batch, seq, dtype=torch.int64)
        types[:, seq // 2:] = 1
        inputs["token_type_ids"] = types
    return inputs


def build(family):
    cfg_fn, cls_name, kind = FAMILIES[family]
    torch.manual_seed(0)
    config = cfg_fn()
    cls = getattr(transformers, cls_name)
    model = cls(config).eval()
    return config, model, kind


def head_counts(config):
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head")
    kv = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd")
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    return {"num_attention_heads": heads, "num_key_value_heads": kv,
            "hidden_size": hidden, "num_hidden_layers": layers}


def dim_info(d):
    if d.HasField("dim_param"):
        return d.dim_param
    if d.HasField("dim_value"):
        return d.dim_value
    return None


def onnxscript_version():
    try:
        import onnxscript
        return onnxscript.__version__
    except ImportError:
        return None


def value_info(v):
    t = v.type.tensor_type
    return {"name": v.name,
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
            "shape": [dim_info(d) for d in t.shape.dim]}


def count_ops(graph, counts):
    for n in graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        counts[key] += 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                count_ops(a.g, counts)
            for g in a.graphs:
                count_ops(g, counts)


def max_abs_diff(a, b):
    if a.shape != b.shape:
        return f"shape mismatch {list(a.shape)} vs {list(b.shape)}"
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def check_with_ort(path, feeds, ref, alt=None):
    """Runs the model with onnxruntime on the saved inputs and compares with
    PyTorch; for a dynamic model also at a second shape (alt: (feeds, ref))."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {"onnxruntime": None, "note": "onnxruntime not installed"}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        outs = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - e.g. ORT's RotaryEmbedding at opset 23
        return {"onnxruntime": ort.__version__,
                "failed": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    res = {"onnxruntime": ort.__version__, "max_abs_diff": {}}
    for name, got in zip(names, outs):
        res["max_abs_diff"][name] = max_abs_diff(got, ref[name])
    if alt is not None:
        alt_feeds, alt_ref = alt
        res["alt_shapes"] = {k: list(v.shape) for k, v in alt_feeds.items()}
        try:
            got = sess.run(None, alt_feeds)
            res["alt_max_abs_diff"] = {n: max_abs_diff(g, alt_ref) for n, g in zip(names, got)}
        except Exception as e:  # noqa: BLE001 - a baked-in shape shows up here
            res["alt_max_abs_diff"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return res


def export_torchscript(wrapper, args, names, path, dynamic):
    dyn = None
    if dynamic:
        dyn = {n: ({0: "batch"} if n == "pixel_values" else {0: "batch", 1: "seq"})
               for n in names}
        dyn["logits"] = {0: "batch"} if "pixel_values" in names else {0: "batch", 1: "seq"}
    torch.onnx.export(wrapper, args, path, dynamo=False, opset_version=17,
                      input_names=list(names), output_names=["logits"],
                      dynamic_axes=dyn)
    return {"batch": dynamic, "seq": dynamic and "pixel_values" not in names}


def strip_stack_traces(path):
    """Drops the dynamo exporter's per-node 'pkg.torch.onnx.stack_trace'
    metadata: it holds absolute paths of this machine (so files would differ
    from one machine to the next) and is most of model.onnx's size. The other
    metadata_props (namespace, class_hierarchy, fx_node, name_scopes) stay."""
    m = onnx.load(path, load_external_data=False)

    def strip(graph):
        for n in graph.node:
            keep = [p for p in n.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            del n.metadata_props[:]
            n.metadata_props.extend(keep)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    strip(a.g)
                for g in a.graphs:
                    strip(g)

    strip(m.graph)
    for f in m.functions:
        strip(f)
    onnx.save(m, path)


def export_dynamo(wrapper, args, names, path, opset=None):
    """Default dynamo export (or at `opset`), weights in model.onnx.data;
    dynamic dims if it can."""
    image = "pixel_values" in names
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("seq", min=1, max=MAXPOS)
    shapes = {n: ({0: batch} if image else {0: batch, 1: seq}) for n in names}
    attempts = [("dynamic", shapes), ("fixed", None)]
    errors = []
    for label, ds in attempts:
        try:
            extra = {"opset_version": opset} if opset else {}
            prog = torch.onnx.export(wrapper, args, dynamo=True, dynamic_shapes=ds,
                                     input_names=list(names), output_names=["logits"],
                                     **extra)
            prog.save(path, external_data=True)
            strip_stack_traces(path)
            dyn = ds is not None
            return {"batch": dyn, "seq": dyn and not image}, errors
        except Exception as e:  # noqa: BLE001 - record and fall back
            errors.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    raise RuntimeError("dynamo export failed: " + " | ".join(errors))


def export_one(family, exporter, batch=BATCH, dynamic=True, outdir=None):
    config, model, kind = build(family)
    if exporter.endswith("-ids"):
        kind = "ids"
    inputs = make_inputs(kind, batch)
    names = list(inputs)
    args = tuple(inputs.values())
    wrapper = WRAPPERS[kind](model).eval()
    with torch.no_grad():
        ref = wrapper(*args).float().numpy()

    outdir = outdir or os.path.join(ZOO, family, exporter)
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    path = os.path.join(outdir, "model.onnx")

    log = io.StringIO()
    notes = []
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), torch.no_grad():
        if exporter.startswith("torchscript"):
            dyn = export_torchscript(wrapper, args, names, path, dynamic)
        else:
            # "dynamo-opset23": opset 23, where the exporter writes
            # Attention and RMSNormalization ops.
            opset = int(exporter.split("opset")[1]) if "opset" in exporter else None
            dyn, errors = export_dynamo(wrapper, args, names, path, opset)
            notes += errors

    m = onnx.load(path, load_external_data=False)
    graph_inputs = [value_info(v) for v in m.graph.input]
    graph_outputs = [value_info(v) for v in m.graph.output]
    feeds = {}
    for gi in graph_inputs:
        arr = inputs[gi["name"]].numpy()
        np.save(os.path.join(outdir, f"input.{gi['name']}.npy"), arr)
        feeds[gi["name"]] = arr
    unused = [n for n in names if n not in feeds]
    if unused:
        notes.append(f"inputs dropped by the exporter: {unused}")
    refs = {}
    for go in graph_outputs:
        refs[go["name"]] = ref
        np.save(os.path.join(outdir, f"output.{go['name']}.npy"), ref)

    counts = collections.Counter()
    count_ops(m.graph, counts)
    for f in m.functions:
        count_ops(f, counts)
    alt = None
    if any(dyn.values()):
        alt_inputs = make_inputs(kind, 3, 5 if dyn["seq"] else SEQ)
        with torch.no_grad():
            alt_ref = wrapper(*alt_inputs.values()).float().numpy()
        alt = ({k: alt_inputs[k].numpy() for k in feeds}, alt_ref)
    check = check_with_ort(path, feeds, refs, alt)

    manifest = collections.OrderedDict([
        ("family", family),
        ("exporter", exporter),
        ("model_class", type(model).__name__),
        ("attn_implementation", getattr(config, "_attn_implementation", None)),
        ("versions", {"torch": torch.__version__, "transformers": transformers.__version__,
                      "onnx": onnx.__version__, "onnxscript": onnxscript_version(),
                      "numpy": np.__version__,
                      "python": sys.version.split()[0]}),
        ("ir_version", m.ir_version),
        ("opset_imports", {(o.domain or "ai.onnx"): o.version for o in m.opset_import}),
        ("external_data", os.path.exists(path + ".data")),
        ("dynamic", dyn),
        ("inputs", graph_inputs),
        ("outputs", graph_outputs),
        ("example_shapes", {k: list(v.shape) for k, v in inputs.items()}),
        ("num_nodes", sum(counts.values())),
        ("num_functions", len(m.functions)),
        ("num_initializers", len(m.graph.initializer)),
        ("op_types", dict(sorted(counts.items()))),
        ("model", head_counts(config)),
        ("check", check),
        ("notes", notes),
    ])
    files = {f: os.path.getsize(os.path.join(outdir, f)) for f in sorted(os.listdir(outdir))}
    manifest["files"] = files
    manifest["total_bytes"] = sum(files.values())
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


def fmt_diff(d):
    if d is None:
        return "n/a"
    if isinstance(d, str):
        return d
    vals = list(d.values())
    if any(isinstance(v, str) for v in vals):
        return "; ".join(map(str, vals))
    return f"{max(vals):.2e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", help=f"default: all of {', '.join(FAMILIES)}")
    ap.add_argument("--exporters", nargs="*",
                    help="only these variants (torchscript, dynamo, dynamo-opset23, "
                         "torchscript-fixed, dynamo-ids)")
    ns = ap.parse_args()
    families = ns.families or list(FAMILIES)
    for fam in families:
        if fam not in FAMILIES:
            sys.exit(f"unknown family {fam}; known: {', '.join(FAMILIES)}")
    jobs = []
    for fam in families:
        jobs.append((fam, "torchscript", BATCH, True))
        jobs.append((fam, "dynamo", BATCH, True))
        if fam == "gpt2":
            jobs.append((fam, "torchscript-fixed", 4, False))
        if fam in ("gpt2", "bert", "llama", "qwen2"):
            jobs.append((fam, "dynamo-opset23", BATCH, True))
        if fam == "llama":
            # Token ids alone, 4 rows: micro-batches of the mask the model
            # computes from positions (test/Zoo/llama-dynamo-ids.test).
            jobs.append((fam, "dynamo-ids", 4, True))
    if ns.exporters:
        jobs = [j for j in jobs if j[1] in ns.exporters]
    failed = 0
    for fam, exp, batch, dyn in jobs:
        try:
            m = export_one(fam, exp, batch, dyn)
        except Exception as e:  # noqa: BLE001 - report and go on
            failed += 1
            print(f"{fam:8s} {exp:18s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:400]}",
                  flush=True)
            continue
        diff = fmt_diff(m["check"].get("max_abs_diff"))
        if "alt_max_abs_diff" in m["check"]:
            diff += f" alt({'x'.join(map(str, next(iter(m['check']['alt_shapes'].values()))))})=" \
                    + fmt_diff(m["check"]["alt_max_abs_diff"])
        opsets = ",".join(f"{k}:{v}" for k, v in m["opset_imports"].items())
        d = "+".join(k for k, v in m["dynamic"].items() if v) or "fixed"
        print(f"{fam:8s} {exp:18s} ir{m['ir_version']} {opsets:28s} dyn={d:9s} "
              f"nodes={m['num_nodes']:4d} ops={len(m['op_types']):2d} "
              f"bytes={m['total_bytes']:7d} ort_diff={diff}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
