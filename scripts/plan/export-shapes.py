#!/usr/bin/env python3
"""Exports a Hugging Face model of a published shape without its weights.

`pcc plan` reads shapes, never weight bytes. This writes what a user's
export of a large model looks like with its `.onnx.data` left out: the
dynamo exporter's graph (PyTorch's current exporter, optimised as it
optimises it), every weight an initializer stored externally in a file that
is not there. The model is built on PyTorch's meta device, so a 405B-shaped
model takes no memory.

Run it with the zoo venv's python (scripts/zoo/setup-venv.sh):

    ~/.cache/pcc/zoo-venv/bin/python scripts/plan/export-shapes.py llama3-70b -o llama70b.onnx

Shapes: llama3-8b, llama3-70b, llama3-405b (Meta's Llama 3 configurations),
gpt2 (124M; --layers/--hidden/--heads/--vocab reshape it), or
--layers/--hidden/... for any Llama-shaped model.
"""

import argparse
import os
import sys
import time
import warnings

import onnx
import onnx_ir as ir
import onnxscript
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

# (layers, hidden, heads, kv heads, ffn, vocab): Meta's published Llama 3
# configurations; GPT-2 124M is its own family.
SHAPES = {
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": (126, 16384, 128, 8, 53248, 128256),
}


def build(args):
    if args.shape == "gpt2":
        cfg = transformers.GPT2Config(use_cache=False)
        # --layers/--hidden/--heads/--vocab reshape it (its tied table kept).
        for flag, key in (("layers", "n_layer"), ("hidden", "n_embd"),
                          ("heads", "n_head"), ("vocab", "vocab_size")):
            if getattr(args, flag):
                setattr(cfg, key, getattr(args, flag))
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(cfg)
        return model
    layers, hidden, heads, kv, ffn, vocab = SHAPES.get(args.shape, (0,) * 6)
    cfg = transformers.LlamaConfig(
        num_hidden_layers=args.layers or layers, hidden_size=args.hidden or hidden,
        num_attention_heads=args.heads or heads,
        num_key_value_heads=args.kv_heads or kv,
        intermediate_size=args.ffn or ffn, vocab_size=args.vocab or vocab,
        max_position_embeddings=8192, rope_theta=500000.0, use_cache=False,
        tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    # The rotary frequencies are computed at construction: real values.
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    return model


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", help="llama3-8b, llama3-70b, llama3-405b, gpt2 or custom")
    ap.add_argument("-o", "--output", required=True)
    for flag in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab"):
        ap.add_argument("--" + flag, type=int, default=0)
    args = ap.parse_args()
    if args.shape not in SHAPES and args.shape not in ("gpt2", "custom"):
        sys.exit("export-shapes.py: unknown shape '%s'" % args.shape)
    start = time.time()
    model = build(args).eval()
    ids = torch.zeros((2, 16), dtype=torch.int64, device="meta")
    batch = torch.export.Dim("batch", min=1, max=65536)
    seq = torch.export.Dim("seq", min=2, max=8192)
    prog = torch.onnx.export(Logits(model), (ids,), dynamo=True, optimize=False,
                             dynamic_shapes={"input_ids": {0: batch, 1: seq}},
                             input_names=["input_ids"], output_names=["logits"])
    graph = prog.model.graph
    # The weights have no data: graph inputs while the exporter's optimiser
    # folds constants, initializers stored externally afterwards.
    weights = {}
    for name, value in list(graph.initializers.items()):
        weights[name] = (list(value.shape), value.dtype)
        value.const_value = None
        graph.initializers.pop(name)
        graph.inputs.append(value)
    onnxscript.optimizer.optimize(prog.model)
    proto = ir.serde.serialize_model(prog.model)
    data = os.path.basename(args.output) + ".data"
    kept = [i for i in proto.graph.input if i.name not in weights]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    offset = 0
    for name, (shape, dtype) in weights.items():
        t = onnx.TensorProto(name=name, data_type=int(dtype.value),
                             data_location=onnx.TensorProto.EXTERNAL)
        t.dims.extend(int(d) for d in shape)
        count = 1
        for d in shape:
            count *= int(d)
        length = int(count * dtype.itemsize)
        for key, val in (("location", data), ("offset", str(offset)),
                         ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, val
        offset += length
        proto.graph.initializer.append(t)
    # Stack traces name this machine's paths and are most of the bytes.
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props
                if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
    onnx.save(proto, args.output)
    params = sum(1 for _ in weights)
    print("export-shapes.py: wrote %s (%d weights, %.1f GB of them left out "
          "as %s) in %.0f s" % (args.output, params, offset / 1e9, data,
                                time.time() - start))


if __name__ == "__main__":
    main()
