"""Writes a batch of `rows` distinct rows shaped like an example input.

    batch_of.py example.npy out.npy rows

Row i is example row i % n, changed by i so no two micro-batches hold the
same data (a pipeline that mixed them up would not go unnoticed): floats
are scaled and shifted, integer ids are rotated within the example's range.
"""
import sys

import numpy as np

example = np.load(sys.argv[1])
rows = int(sys.argv[3])
n = example.shape[0]
out = np.stack([example[i % n] for i in range(rows)])
shift = np.arange(rows).reshape((rows,) + (1,) * (example.ndim - 1))
if np.issubdtype(example.dtype, np.floating):
    out = (out * (1 + 0.05 * shift) + 0.01 * shift).astype(example.dtype)
else:
    out = ((out + 7 * shift) % (int(example.max()) + 1)).astype(example.dtype)
np.save(sys.argv[2], out)
