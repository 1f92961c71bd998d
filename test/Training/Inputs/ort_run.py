"""Runs an ONNX model with onnxruntime on .npy inputs and compares its first
output with a reference .npy: ort_run.py model.onnx ref.npy in.npy..."""
import sys

import numpy as np
import onnxruntime as ort

model, ref, inputs = sys.argv[1], sys.argv[2], sys.argv[3:]
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
feeds = {i.name: np.load(p) for i, p in zip(session.get_inputs(), inputs)}
out = session.run(None, feeds)[0]
want = np.load(ref)
diff = np.abs(out - want).max()
ok = np.allclose(out, want, rtol=1e-4, atol=1e-5)
print("onnxruntime vs pcc: max |diff| %.3g: %s" % (diff, "matches" if ok else "DIFFERS"))
sys.exit(0 if ok else 1)
