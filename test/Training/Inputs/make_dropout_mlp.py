#!/usr/bin/env python3
"""Writes mlp_dropout.onnx (a small MLP with two Dropout layers, exported in
training mode: Dropout nodes with training_mode=True) and its eval-mode
reference, for test/Training/dropout.test. Run with the zoo venv's python:

    ~/.cache/pcc/zoo-venv/bin/python test/Training/Inputs/make_dropout_mlp.py
"""
import os

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.drop1 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(64, 64)
        self.drop2 = nn.Dropout(0.1)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.drop1(torch.relu(self.fc1(x)))
        x = self.drop2(torch.relu(self.fc2(x)))
        return self.fc3(x)


def main():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(16, 32)
    model.train()
    torch.onnx.export(model, (x,), os.path.join(HERE, "mlp_dropout.onnx"),
                      opset_version=17, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"},
                                    "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, dynamo=False)
    model.eval()
    with torch.no_grad():
        y = model(x)
    rng = np.random.RandomState(5)
    np.save(os.path.join(HERE, "mlp_dropout.input.npy"), x.numpy())
    np.save(os.path.join(HERE, "mlp_dropout.eval.npy"), y.numpy())
    np.save(os.path.join(HERE, "mlp_dropout.labels.npy"),
            rng.randint(0, 10, size=(16,)).astype(np.int64))


if __name__ == "__main__":
    main()
