#!/usr/bin/python3
"""PyTorch side of bench/linear_act.c: relu(F.linear(x, w, b)) forward (and forward +
backward) for the same shapes and dtypes, best of --reps after one warm-up. One line per
configuration: "torch <rows> <in> <out> <dtype> <fwd_ms> <fwd_bwd_ms>". PyTorch's CPU build
has no fused linear+activation, so this is its unfused pair (what a user writes)."""
import argparse
import time

import torch
import torch.nn.functional as F


def best(fn, reps):
    fn()
    t = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("shapes", nargs="*", default=["512x1024x1024", "4096x256x256", "64x4096x4096"])
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for s in a.shapes:
        rows, fin, fout = (int(v) for v in s.split("x"))
        for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            x = torch.randn(rows, fin, dtype=dt)
            w = torch.randn(fout, fin, dtype=dt, requires_grad=True)
            b = torch.randn(fout, dtype=dt, requires_grad=True)

            def fwd():
                with torch.no_grad():
                    return F.relu(F.linear(x, w, b))

            def fwd_bwd():
                F.relu(F.linear(x, w, b)).sum().backward()

            print("torch %d %d %d %s %.4f %.4f" % (rows, fin, fout, name, best(fwd, a.reps),
                                                    best(fwd_bwd, a.reps)), flush=True)


if __name__ == "__main__":
    main()
