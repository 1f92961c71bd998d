#!/usr/bin/python3
"""Write the small binary ONNX fixtures used by the importer tests.

    /usr/bin/python3 test/Import/Inputs/make_fixtures.py

Files are written next to this script. All tensor values are fixed
(and exactly representable in float32), so output is byte-for-byte
reproducible for a given onnx version.

  external_data.onnx (+ .bin)  Y = MatMul(X[2,4], W[4,3]) + B[3]; W and B
                               live in external_data.bin
                               (W: offset 0, length 48; B: offset 64,
                               length 12).
  typed_fields.onnx            Y[2,2] = MatMul(Reshape(X[1,4], S), W[2,2]);
                               W in float_data, S=[2,2] in int64_data.
  raw_data.onnx                same graph and values, initializers in
                               raw_data.
  symbolic_dim.onnx            Y = Relu(X), X/Y: float["N", 8].
  unsupported_op.onnx          Relu feeding a NonMaxSuppression node
                               named "nms_0".
  not_onnx.onnx                plain text, not a protobuf.
  corrupt.onnx                 a valid small model truncated to ~60% of
                               its bytes; onnx.load fails on it.
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17

# Shared values (see the CHECK lines in the importer tests).
EXT_W = (np.arange(12, dtype=np.float32).reshape(4, 3) * 0.5 - 2.0)
EXT_B = np.array([0.25, -0.5, 1.0], dtype=np.float32)
EXT_W_OFFSET = 0
EXT_B_OFFSET = 64          # nonzero, with zero padding before it

TYPED_W = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
TYPED_SHAPE = np.array([2, 2], dtype=np.int64)


def path(name):
    return os.path.join(HERE, name)


def make_model(graph):
    m = helper.make_model(
        graph, producer_name="pcc-fixtures",
        opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m


def write_model(name, model):
    with open(path(name), "wb") as f:
        f.write(model.SerializeToString())
    return [name]


# --------------------------------------------------------------------------
def external_data():
    bin_name = "external_data.bin"
    w_bytes = EXT_W.tobytes()
    b_bytes = EXT_B.tobytes()
    assert EXT_W_OFFSET + len(w_bytes) <= EXT_B_OFFSET
    blob = bytearray(EXT_B_OFFSET + len(b_bytes))
    blob[EXT_W_OFFSET:EXT_W_OFFSET + len(w_bytes)] = w_bytes
    blob[EXT_B_OFFSET:EXT_B_OFFSET + len(b_bytes)] = b_bytes
    with open(path(bin_name), "wb") as f:
        f.write(bytes(blob))

    def ext_tensor(name, arr, offset):
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", bin_name), ("offset", str(offset)),
                     ("length", str(arr.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t

    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"], name="matmul_0"),
         helper.make_node("Add", ["XW", "B"], ["Y"], name="add_0")],
        "external_data",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        initializer=[ext_tensor("W", EXT_W, EXT_W_OFFSET),
                     ext_tensor("B", EXT_B, EXT_B_OFFSET)])
    return write_model("external_data.onnx", make_model(g)) + [bin_name]


# --------------------------------------------------------------------------
def reshape_matmul(name, raw):
    if raw:
        w = helper.make_tensor("W", TensorProto.FLOAT, TYPED_W.shape,
                               TYPED_W.tobytes(), raw=True)
        s = helper.make_tensor("S", TensorProto.INT64, TYPED_SHAPE.shape,
                               TYPED_SHAPE.tobytes(), raw=True)
    else:
        w = helper.make_tensor("W", TensorProto.FLOAT, TYPED_W.shape,
                               TYPED_W.ravel().tolist())
        s = helper.make_tensor("S", TensorProto.INT64, TYPED_SHAPE.shape,
                               TYPED_SHAPE.tolist())
    g = helper.make_graph(
        [helper.make_node("Reshape", ["X", "S"], ["X2"], name="reshape_0"),
         helper.make_node("MatMul", ["X2", "W"], ["Y"], name="matmul_0")],
        name.replace(".onnx", ""),
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])],
        initializer=[w, s])
    m = make_model(g)
    for t in m.graph.initializer:
        assert t.HasField("raw_data") == raw, t.name
        if not raw:
            assert len(t.float_data) + len(t.int64_data) > 0, t.name
    return write_model(name, m)


# --------------------------------------------------------------------------
def symbolic_dim():
    g = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Y"], name="relu_0")],
        "symbolic_dim",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8])])
    return write_model("symbolic_dim.onnx", make_model(g))


# --------------------------------------------------------------------------
def unsupported_op():
    inits = [
        helper.make_tensor("max_out", TensorProto.INT64, [1], [3]),
        helper.make_tensor("iou_thr", TensorProto.FLOAT, [1], [0.5]),
        helper.make_tensor("score_thr", TensorProto.FLOAT, [1], [0.0]),
    ]
    g = helper.make_graph(
        [helper.make_node("Relu", ["scores"], ["scores_relu"], name="relu_0"),
         helper.make_node("NonMaxSuppression",
                          ["boxes", "scores_relu", "max_out", "iou_thr",
                           "score_thr"],
                          ["selected"], name="nms_0",
                          center_point_box=0)],
        "unsupported_op",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 6, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                       [1, 1, 6])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64,
                                       ["num_selected", 3])],
        initializer=inits)
    return write_model("unsupported_op.onnx", make_model(g))


# --------------------------------------------------------------------------
def not_onnx():
    with open(path("not_onnx.onnx"), "w") as f:
        f.write("hello, this is not a protobuf\n")
    return ["not_onnx.onnx"]


def corrupt():
    # A small valid MLP (Gemm-Relu-Gemm) with raw_data weights ...
    rng = np.random.RandomState(0)
    w1 = rng.randn(8, 4).astype(np.float32)
    w2 = rng.randn(2, 8).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W1"], ["H"], name="fc1", transB=1),
         helper.make_node("Relu", ["H"], ["R"], name="relu"),
         helper.make_node("Gemm", ["R", "W2"], ["Y"], name="fc2", transB=1)],
        "corrupt_mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])],
        initializer=[
            helper.make_tensor("W1", TensorProto.FLOAT, w1.shape,
                               w1.tobytes(), raw=True),
            helper.make_tensor("W2", TensorProto.FLOAT, w2.shape,
                               w2.tobytes(), raw=True)])
    m = make_model(g)
    onnx.checker.check_model(m)
    data = m.SerializeToString()
    # ... truncated to ~60%. Walk back until the prefix no longer parses
    # (a cut exactly on a field boundary would still be a valid message).
    n = int(len(data) * 0.6)
    while n > 0:
        try:
            onnx.load_model_from_string(data[:n])
        except Exception:
            break
        n -= 1
    assert n > 0
    with open(path("corrupt.onnx"), "wb") as f:
        f.write(data[:n])
    return ["corrupt.onnx"]


# --------------------------------------------------------------------------
def verify(files):
    valid = ["external_data.onnx", "typed_fields.onnx", "raw_data.onnx",
             "symbolic_dim.onnx", "unsupported_op.onnx"]
    for name in valid:
        # Path form so the checker also resolves external data.
        onnx.checker.check_model(path(name))
        onnx.load(path(name))

    m = onnx.load(path("external_data.onnx"))  # loads external_data.bin
    vals = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    assert np.array_equal(vals["W"], EXT_W) and np.array_equal(vals["B"], EXT_B)
    offs = {t.name: {e.key: e.value for e in t.external_data}
            for t in onnx.load(path("external_data.onnx"),
                               load_external_data=False).graph.initializer}
    assert offs["B"]["offset"] == str(EXT_B_OFFSET), offs

    for name in ("typed_fields.onnx", "raw_data.onnx"):
        m = onnx.load(path(name))
        vals = {t.name: onnx.numpy_helper.to_array(t)
                for t in m.graph.initializer}
        assert np.array_equal(vals["W"], TYPED_W)
        assert np.array_equal(vals["S"], TYPED_SHAPE)

    for name in ("not_onnx.onnx", "corrupt.onnx"):
        try:
            onnx.load(path(name))
        except Exception:
            continue
        raise AssertionError("%s unexpectedly parses" % name)


def main():
    files = []
    files += external_data()
    files += reshape_matmul("typed_fields.onnx", raw=False)
    files += reshape_matmul("raw_data.onnx", raw=True)
    files += symbolic_dim()
    files += unsupported_op()
    files += not_onnx()
    files += corrupt()
    verify(files)
    for f in files:
        print("%-22s %6d bytes" % (f, os.path.getsize(path(f))))
    return 0


if __name__ == "__main__":
    import onnx.numpy_helper  # noqa: F401  (used in verify)
    sys.exit(main())
