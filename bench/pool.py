#!/usr/bin/python3
"""PyTorch side of bench/pool.c: max_pool2d (3x3, stride 2, padding 1) and avg_pool2d (2x2,
stride 2) forward + backward on [16, 64, 32, 32], NCHW and channels_last, best of N steps.
Usage: /usr/bin/python3 bench/pool.py [reps] [threads]"""
import sys
import time

import torch
import torch.nn.functional as F


def run(pool_max, cl, dt, reps):
    fmt = torch.channels_last if cl else torch.contiguous_format
    leaf = torch.randn(16, 64, 32, 32).to(dt)
    cot = torch.ones(16, 64, 16, 16, dtype=dt).to(memory_format=fmt)
    best = 1e30
    for r in range(reps + 1):
        x = leaf.detach().to(memory_format=fmt).requires_grad_()
        t0 = time.perf_counter()
        y = F.max_pool2d(x, 3, 2, 1) if pool_max else F.avg_pool2d(x, 2, 2)
        y.backward(cot)
        t = time.perf_counter() - t0
        if r > 0:
            best = min(best, t)
    print("%-8s %-4s %-4s [16, 64, 32, 32] fwd+bwd best of %d: %8.3f ms" % (
        "max3s2p1" if pool_max else "avg2s2",
        {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dt],
        "nhwc" if cl else "nchw", reps, best * 1e3))


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    if len(sys.argv) > 2:
        torch.set_num_threads(int(sys.argv[2]))
    print("torch %s, %d threads" % (torch.__version__, torch.get_num_threads()))
    for pool_max in (True, False):
        for cl in (False, True):
            for dt in (torch.float32, torch.bfloat16, torch.float16):
                try:
                    run(pool_max, cl, dt, reps)
                except RuntimeError as e:  # a dtype torch's CPU build lacks
                    print("%s %s: %s" % ("max" if pool_max else "avg", dt, str(e)[:80]))


if __name__ == "__main__":
    main()
