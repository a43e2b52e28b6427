#!/usr/bin/python3
"""PyTorch side of bench/norm.c: batch_norm (training) and layer_norm forward + backward on the
same shapes and dtypes, best of N steps. Usage: /usr/bin/python3 bench/norm.py [reps] [threads]"""
import sys
import time

import torch
import torch.nn.functional as F


def run(bn, dt, reps, cl=False):
    shape = (16, 64, 32, 32) if bn else (4096, 1024)
    c = shape[1]
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = torch.randn(shape).to(dt).to(memory_format=fmt).requires_grad_()
    cot = torch.ones(shape, dtype=dt).to(memory_format=fmt)
    w = torch.ones(c, requires_grad=True)
    b = torch.zeros(c, requires_grad=True)
    rm, rv = torch.zeros(c), torch.ones(c)
    best = 1e30
    for r in range(reps + 1):
        t0 = time.perf_counter()
        if bn:
            y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        else:
            y = F.layer_norm(x, (c,), w, b, 1e-5)
        y.backward(cot)
        t = time.perf_counter() - t0
        x.grad = w.grad = b.grad = None
        if r > 0:
            best = min(best, t)
    print("%-10s %-4s %s %-9s fwd+bwd best of %d: %8.3f ms" % (
        "batch_norm" if bn else "layer_norm", "f32" if dt == torch.float32 else "bf16",
        "[16, 64, 32, 32]" if bn else "[4096, 1024]    ",
        ("nhwc" if cl else "nchw") if bn else "", reps, best * 1e3))


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    if len(sys.argv) > 2:
        torch.set_num_threads(int(sys.argv[2]))
    print("torch %s, %d threads" % (torch.__version__, torch.get_num_threads()))
    for bn, cl in ((True, False), (True, True), (False, False)):
        for dt in (torch.float32, torch.bfloat16):
            try:
                run(bn, dt, reps, cl)
            except RuntimeError as e:  # a dtype torch's CPU build lacks
                print("%s %s: %s" % ("batch_norm" if bn else "layer_norm", dt, e))


if __name__ == "__main__":
    main()
