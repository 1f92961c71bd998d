#!/usr/bin/python3
"""Export the pcc example models to ONNX (opset 17) with reference data.

Run with Debian's Python (torch 1.13, onnx 1.12, numpy):

    /usr/bin/python3 examples/make_examples.py [name ...]

With no names, all examples are regenerated.

Writes, next to this script:
    <name>.onnx               the exported model (float32 weights)
    data/<name>.input.npy     reference input at batch 2
    data/<name>.output.npy    PyTorch's output for that input (float32)
    data/gpt.batch8.*.npy     gpt at batch 8, for the pipeline example
    resnet18_train.onnx is resnet18 exported in training mode (its
                              BatchNorms kept, with training_mode=1) for
                              pcc --train; it needs torch >= 1.13's
                              TrainingMode.TRAINING
                              (`make_examples.py gpt.batch8` writes only
                              these, without exporting gpt again)

Everything is seeded, so re-running produces the same weights and data
(the .onnx bytes may differ across torch versions).
"""

import collections
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def seed(s):
    torch.manual_seed(s)
    np.random.seed(s)


# --------------------------------------------------------------------------
# 1. MLP
# --------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in=64, hidden=256, d_out=32):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x):
        x = F.gelu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


# --------------------------------------------------------------------------
# 2/3. TransformerEncoder (post-norm / pre-norm)
# --------------------------------------------------------------------------
def make_transformer(norm_first, activation):
    layer = nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=256, dropout=0.0,
        activation=activation, batch_first=True, norm_first=norm_first)
    model = nn.TransformerEncoder(layer, num_layers=2,
                                  enable_nested_tensor=False)
    # nn.TransformerEncoder deep-copies `layer`, so both layers start out
    # with identical weights; the exporter could then dedupe initializers.
    # Give every parameter its own random values.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                # LayerNorm: perturb around (1, 0) so it stays sensible.
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn_like(p))
            elif p.dim() >= 2:
                nn.init.xavier_uniform_(p)
            else:
                p.copy_(0.02 * torch.randn_like(p))
    return model


class TransformerWrapper(nn.Module):
    """Plain forward(src) so the exported graph has a single input."""

    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, x):
        return self.enc(x)


# --------------------------------------------------------------------------
# 4. GPT-style causal LM
# --------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.scale = 1.0 / math.sqrt(d // n_head)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.size()
        hd = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)   # B,H,T,hd
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        # Causal mask built from the runtime sequence length.
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                          # B,H,T,hd
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class GPTMLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = GPTMLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab=512, d=64, n_layer=2, n_head=4, max_seq=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln") or ".ln" in name:
                    base = 1.0 if name.endswith("weight") else 0.0
                    p.copy_(base + 0.1 * torch.randn_like(p))
                elif p.dim() >= 2:
                    # Embeddings large enough that the tied LM head
                    # produces O(1) logits.
                    std = {"wte.weight": 0.25, "wpe.weight": 0.1}.get(
                        name, 1.0 / math.sqrt(p.shape[1]))
                    nn.init.normal_(p, std=std)
                else:
                    p.copy_(0.02 * torch.randn_like(p))

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        x = self.ln_f(x)
        return self.lm_head(x)


# --------------------------------------------------------------------------
# 5. ResNet-18 (narrow)
# --------------------------------------------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False),
                nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + idt)


class ResNet18(nn.Module):
    """torchvision-style ResNet-18 (layers [2,2,2,2]) with base width 8."""

    def __init__(self, width=8, num_classes=10):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        chans = [w, 2 * w, 4 * w, 8 * w]
        layers, cin = [], w
        for i, c in enumerate(chans):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, c, stride),
                                        BasicBlock(c, c, 1)))
            cin = c
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * w, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out",
                                        nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                # Non-trivial inference-mode statistics so BN matters.
                with torch.no_grad():
                    m.weight.copy_(1.0 + 0.1 * torch.randn_like(m.weight))
                    m.bias.copy_(0.1 * torch.randn_like(m.bias))
                    m.running_mean.copy_(0.1 * torch.randn_like(m.running_mean))
                    m.running_var.copy_(1.0 + 0.2 * torch.rand_like(m.running_var))

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# --------------------------------------------------------------------------
# Export driver
# --------------------------------------------------------------------------
def export(name, model, example, input_name, output_name, dyn_in, dyn_out,
           no_grad=True, training=False):
    model.eval()
    path = os.path.join(HERE, name + ".onnx")
    kwargs = dict(
        opset_version=OPSET,
        input_names=[input_name],
        output_names=[output_name],
        dynamic_axes={input_name: dyn_in, output_name: dyn_out},
        do_constant_folding=True,
    )
    if training:
        # The graph of model.train(): BatchNormalization with
        # training_mode=1 (batch statistics; its running statistics are
        # initializers, updated by pcc --train), nothing folded. The
        # reference output is still eval mode's, which is what an
        # inference run of the model computes (pcc export writes it back
        # as an eval-mode graph).
        model.train()
        kwargs.update(training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False)
        if "dynamo" in torch.onnx.export.__code__.co_varnames:
            kwargs["dynamo"] = False
        torch.onnx.export(model, (example,), path, **kwargs)
        model.eval()
        with torch.no_grad():
            ref = model(example)
    elif no_grad:
        with torch.no_grad():
            torch.onnx.export(model, (example,), path, **kwargs)
            ref = model(example)
    else:
        # nn.TransformerEncoder takes the fused fast path
        # (aten::_transformer_encoder_layer_fwd) under no_grad, which the
        # exporter cannot handle; export with grad enabled instead, and
        # compute the reference the same way (the unfused path).
        torch.onnx.export(model, (example,), path, **kwargs)
        ref = model(example)

    np.save(os.path.join(DATA, name + ".input.npy"), example.numpy())
    np.save(os.path.join(DATA, name + ".output.npy"),
            ref.detach().numpy().astype(np.float32))

    m = onnx.load(path)
    onnx.checker.check_model(m)
    hist = collections.Counter(n.op_type for n in m.graph.node)
    size = os.path.getsize(path)
    ops = ", ".join("%s:%d" % kv for kv in sorted(hist.items()))

    def sig(vis):
        out = []
        for vi in vis:
            dims = [d.dim_param if d.HasField("dim_param") else str(d.dim_value)
                    for d in vi.type.tensor_type.shape.dim]
            et = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
            out.append("%s:%s[%s]" % (vi.name, et.lower(), ",".join(dims)))
        return " ".join(out)

    print("%-22s %8d bytes  %d nodes  in %s  out %s" % (
        name + ".onnx", size, len(m.graph.node), sig(m.graph.input),
        sig(m.graph.output)))
    print("    ops: " + ops)
    if size > 2 * 1024 * 1024:
        print("WARNING: %s is larger than 2 MB" % path, file=sys.stderr)


def build(name):
    """Return (model, reference_input, export_kwargs) for example `name`.

    Seeding happens here, so build(name) is reproducible on its own.
    """
    if name == "mlp":
        seed(0)
        model = MLP()
        x = torch.randn(2, 64)
        return model, x, dict(input_name="input", output_name="output",
                              dyn_in={0: "batch"}, dyn_out={0: "batch"})
    if name in ("transformer_postnorm", "transformer_prenorm"):
        pre = name == "transformer_prenorm"
        seed(2 if pre else 1)
        model = TransformerWrapper(make_transformer(
            norm_first=pre, activation="gelu" if pre else "relu"))
        x = torch.randn(2, 16, 64)
        return model, x, dict(input_name="input", output_name="output",
                              dyn_in={0: "batch"}, dyn_out={0: "batch"},
                              no_grad=False)
    if name == "gpt":
        seed(3)
        model = GPT()
        ids = torch.randint(0, 512, (2, 16), dtype=torch.int64)
        return model, ids, dict(input_name="input_ids", output_name="logits",
                                dyn_in={0: "batch", 1: "seq"},
                                dyn_out={0: "batch", 1: "seq"})
    if name in ("resnet18", "resnet18_train"):
        seed(4)
        model = ResNet18()
        x = torch.randn(2, 3, 32, 32)
        return model, x, dict(input_name="input", output_name="output",
                              dyn_in={0: "batch"}, dyn_out={0: "batch"},
                              training=name == "resnet18_train")
    raise KeyError(name)


NAMES = ["mlp", "transformer_postnorm", "transformer_prenorm", "gpt",
         "resnet18", "resnet18_train"]


def gpt_batch8():
    """A batch of 8 token sequences and gpt's logits for them: enough rows
    to split into 4 or 8 pipeline micro-batches."""
    model, _, _ = build("gpt")
    model.eval()
    torch.manual_seed(5)
    ids = torch.randint(0, 512, (8, 16), dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids)
    np.save(os.path.join(DATA, "gpt.batch8.input.npy"), ids.numpy())
    np.save(os.path.join(DATA, "gpt.batch8.output.npy"),
            logits.numpy().astype(np.float32))
    print("gpt.batch8: input 8x16, logits %s" % (tuple(logits.shape),))


def main(argv):
    os.makedirs(DATA, exist_ok=True)
    torch.set_num_threads(1)
    names = argv or NAMES + ["gpt.batch8"]
    for name in names:
        if name == "gpt.batch8":
            gpt_batch8()
            continue
        model, x, kw = build(name)
        export(name, model, x, **kw)


if __name__ == "__main__":
    main(sys.argv[1:])
