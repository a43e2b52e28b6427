"""PyTorch side of bench/op_overhead.c: per-op overhead of tiny eager ops and the bandwidth
of a large F32 add, printed as `key value` lines that the C program reads.

Run by bench/op_overhead (popen) with Debian's python3-torch: /usr/bin/python3."""
import sys
import time

import torch


def per_call_us(fn, iters, reps):
    """Best of `reps` runs of the mean thread CPU time per call, in microseconds (the same
    clock as the C side: robust to other processes sharing the core)."""
    fn(iters // 10 + 1)  # warm up
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        fn(iters)
        best = min(best, (time.thread_time() - t0) / iters * 1e6)
    return best


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    torch.set_num_threads(1)  # irrelevant for 8 elements; keeps the comparison single-core

    a = torch.rand(8)
    b = torch.rand(8)

    def add_nograd(n):
        with torch.no_grad():
            for _ in range(n):
                c = torch.add(a, b)
                del c

    ag = torch.rand(8, requires_grad=True)
    bg = torch.rand(8, requires_grad=True)

    def add_grad(n):
        for _ in range(n):
            c = torch.add(ag, bg)
            del c

    def step(n):
        for _ in range(n):
            loss = torch.mul(ag, bg).sum()
            loss.backward()

    print("torch_version", torch.__version__)
    print("add_nograd_us", per_call_us(add_nograd, iters, reps))
    print("add_grad_us", per_call_us(add_grad, iters, reps))
    print("mul_sum_backward_us", per_call_us(step, max(iters // 4, 1), reps))

    # large contiguous add: bytes moved (2 reads + 1 write) per second
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads())
    n = 16 << 20
    x = torch.rand(n)
    y = torch.rand(n)
    out = torch.empty(n)
    torch.add(x, y, out=out)
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        torch.add(x, y, out=out)
        best = min(best, time.perf_counter() - t0)
    print("large_add_out_gbs", 3 * 4 * n / best / 1e9)
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        z = torch.add(x, y)
        best = min(best, time.perf_counter() - t0)
        del z
    print("large_add_gbs", 3 * 4 * n / best / 1e9)


if __name__ == "__main__":
    main()
