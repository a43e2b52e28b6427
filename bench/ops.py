#!/usr/bin/python3
"""PyTorch side of bench/ops.c: the same ops on a [4096, 1024] tensor, best of N calls.
Usage: /usr/bin/python3 bench/ops.py [reps] [threads]"""
import sys
import time

import torch
import torch.nn.functional as F


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    x = torch.randn(4096, 1024)
    xh, xb = x.half(), x.bfloat16()
    param = torch.randn(4096, 1024, requires_grad=True)
    param.sum().backward()
    adamw = torch.optim.AdamW([param], lr=1e-3)
    ops = [("sum_all", lambda: x.sum()), ("sum dim 1", lambda: x.sum(1)),
           ("sum dim 0", lambda: x.sum(0)), ("max dim 1", lambda: x.amax(1)),
           ("softmax", lambda: torch.softmax(x, -1)),
           ("log_softmax", lambda: torch.log_softmax(x, -1)), ("exp", lambda: x.exp()),
           ("sigmoid", lambda: x.sigmoid()), ("gelu", lambda: F.gelu(x)),
           ("gelu_tanh", lambda: F.gelu(x, approximate="tanh")), ("mul", lambda: x * x),
           ("add f16", lambda: xh + xh), ("add bf16", lambda: xb + xb),
           ("cast to f16", lambda: x.half()),
           ("dropout", lambda: F.dropout(x, 0.1, True)),
           ("dropout bf16", lambda: F.dropout(xb, 0.1, True)),
           ("layer_norm", lambda: F.layer_norm(x, (1024,), eps=1e-5)),
           ("rand", lambda: torch.rand(4096, 1024)), ("randn", lambda: torch.randn(4096, 1024)),
           ("adamw step", adamw.step)]
    print("torch %s ops on [4096, 1024], %d thread(s), best of %d (ms)" % (
        torch.__version__, threads, reps))
    for name, f in ops:
        best = 1e30
        for r in range(reps + 1):
            t0 = time.perf_counter()
            f()
            t = time.perf_counter() - t0
            if r > 0:
                best = min(best, t)
        print("%-12s %8.3f" % (name, best * 1e3))


if __name__ == "__main__":
    main()
