#!/usr/bin/python3
"""PyTorch side of bench/conv.c: conv2d forward + backward (input, weight and bias gradients; the
cotangent of ones made once, in the output's format)
for the same ResNet-like shapes, F32 and BF16, NCHW and channels_last. One JSON line per
configuration: {"name", "dtype", "format", "ms"} (best of --reps, after one warm-up)."""
import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = [  # name, N, C, H, W, OC, K, stride, padding
    ("stem7x7", 4, 3, 112, 112, 64, 7, 2, 3),
    ("res3x3_64", 4, 64, 56, 56, 64, 3, 1, 1),
    ("res3x3_128", 4, 128, 28, 28, 128, 3, 1, 1),
    ("res3x3_256", 4, 256, 14, 14, 256, 3, 1, 1),
    ("res1x1_256to64", 4, 256, 56, 56, 64, 1, 1, 0),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for name, n, c, h, w, oc, k, s, p in SHAPES:
        for dt, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            for cl in (False, True):
                fmt = torch.channels_last if cl else torch.contiguous_format
                x = torch.randn(n, c, h, w).to(dt).to(memory_format=fmt).requires_grad_()
                wt = (torch.randn(oc, c, k, k) * 0.05).to(dt).to(memory_format=fmt).requires_grad_()
                b = torch.zeros(oc, dtype=dt, requires_grad=True)
                g = torch.ones_like(F.conv2d(x.detach(), wt.detach(), None, s, p))
                best = 1e30
                for r in range(a.reps + 1):
                    t0 = time.perf_counter()
                    y = F.conv2d(x, wt, b, s, p)
                    y.backward(g)
                    t1 = time.perf_counter()
                    x.grad = wt.grad = b.grad = None
                    if r:
                        best = min(best, t1 - t0)
                print(json.dumps({"name": name, "dtype": dname, "format": "nhwc" if cl else "nchw",
                                  "ms": best * 1e3}), flush=True)


if __name__ == "__main__":
    main()
