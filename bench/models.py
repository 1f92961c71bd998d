"""The bundled models the benchmarks run: name, pcc dimension flags for a
batch size, and a maker of a random input of that batch size."""

import numpy as np

MODELS = [
    ("mlp", lambda b: [f"--batch={b}"], lambda b, rng: rng.standard_normal((b, 64), dtype=np.float32)),
    ("transformer_postnorm", lambda b: [f"--batch={b}"],
     lambda b, rng: rng.standard_normal((b, 16, 64), dtype=np.float32)),
    ("transformer_prenorm", lambda b: [f"--batch={b}"],
     lambda b, rng: rng.standard_normal((b, 16, 64), dtype=np.float32)),
    ("gpt", lambda b: [f"--dim=batch={b}", "--dim=seq=16"],
     lambda b, rng: rng.integers(0, 512, (b, 16), dtype=np.int64)),
    ("resnet18", lambda b: [f"--batch={b}"],
     lambda b, rng: rng.standard_normal((b, 3, 32, 32), dtype=np.float32)),
]
