#!/usr/bin/env python3
"""Writes the safetensors files under test/data that test/test_checkpoint.c loads: files made
by Python's safetensors package and by PyTorch, so that mixtape is checked against the
reference writer, not only against itself.

  dtypes.safetensors  every dtype mixtape has (F32 F16 BF16 F64 I64 I32 BOOL), a 0-d and an
                      empty tensor, and metadata; values by formulas the C test repeats
  mlp.safetensors     the state dict of a PyTorch MLP with samples/train_mlp.c's layers
                      (fc1 = Linear(32, 64), ReLU, fc2 = Linear(64, 8)), seed 0
  mlp_io.safetensors  an input x [4, 32] and that MLP's output y = fc2(relu(fc1(x)))

Needs Debian's torch (/usr/bin/python3 has torch 1.13) and the safetensors package:
  /usr/bin/python3 -m venv --system-site-packages /tmp/stvenv
  /tmp/stvenv/bin/pip install safetensors
  /tmp/stvenv/bin/python tools/gen_state_data.py            # writes test/data/
"""
import os
import sys

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "data")


def dtypes():
    # exactly representable values: the C test makes the same tensors with mt_arange / mt_cast
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3) * 0.5 - 1.0  # -1 .. 1.5
    t = {
        "f32": base.to(torch.float32),
        "f16": base.to(torch.float16).reshape(3, 2),
        "bf16": base.to(torch.bfloat16).reshape(6),
        "f64": torch.arange(4, dtype=torch.float64) / 3.0,
        "i64": torch.tensor([-(2**40), 0, 2**40 + 1], dtype=torch.int64),
        "i32": torch.tensor([[-7, 0], [2**31 - 1, -(2**31)]], dtype=torch.int32),
        "bool": torch.tensor([True, False, True, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }
    save_file(t, os.path.join(OUT, "dtypes.safetensors"),
              metadata={"format": "pt", "writer": "tools/gen_state_data.py"})


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def mlp():
    torch.manual_seed(0)
    m = MLP()
    save_file(m.state_dict(), os.path.join(OUT, "mlp.safetensors"))
    x = torch.randn(4, 32)
    with torch.no_grad():
        y = m(x)
    save_file({"x": x, "y": y}, os.path.join(OUT, "mlp_io.safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    dtypes()
    mlp()
    print("wrote", ", ".join(sorted(os.listdir(OUT))), file=sys.stderr)


if __name__ == "__main__":
    main()
