"""Checks pcc-run --profile-trace's Chrome trace of the bundled GPT run at
batch 2 x seq 16: one complete event per op in run order, none
overlapping, and the arithmetic the library states for its products."""
import json
import sys

path, ops = sys.argv[1], int(sys.argv[2])
events = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
assert len(events) == ops, f"{len(events)} op events, expected {ops}"
for a, b in zip(events, events[1:]):
    assert a["dur"] >= 0 and a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
products = [e for e in events if e["name"] == "matmul"]
attention = [e for e in events if e["name"] == "attention"]
others = [e for e in events if e["name"] not in ("matmul", "attention")]
assert all("flops" not in e["args"] for e in others)
# The LM head: [32 tokens, 64] x [64, 512 vocabulary], 2 FLOPs per
# multiply-add.
head = [e for e in products if "/lm_head/" in e["args"]["node"]]
assert len(head) == 1 and head[0]["args"]["flops"] == 2 * 32 * 64 * 512, head
# The MLP's first product: [32, 64] x [64, 256].
fc = [e for e in products if "/blocks.0/mlp/fc/MatMul" in e["args"]["node"]]
assert len(fc) == 1 and fc[0]["args"]["flops"] == 2 * 32 * 64 * 256, fc
# Bytes: its operands and result, f32.
assert fc[0]["args"]["bytes"] == 4 * (32 * 64 + 64 * 256 + 32 * 256), fc
# Each block's fused attention: q k^T and p v over [2 x 4 heads x 16
# queries] x 16 keys x 16 wide, the causal mask's skipped half counted.
assert len(attention) == 2 and all(
    e["args"]["flops"] == 2 * 2 * (2 * 4 * 16) * 16 * 16 for e in attention), \
    attention
print(f"profile trace: {len(events)} ops, {len(products)} products, "
      f"{len(attention)} attentions, "
      f"{len({e['cat'] for e in events})} function(s)")
