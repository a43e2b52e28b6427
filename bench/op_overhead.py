"""PyTorch side of bench/op_overhead.c: per-op overhead of tiny eager ops and the bandwidth
of a large F32 add, printed as `key value` lines that the C program reads.

Run by bench/op_overhead (popen) with Debian's python3-torch: /usr/bin/python3.
With `--device cuda[:N] ITERS REPS [BURST]` (bench/op_overhead --device cuda; BURST defaults to
32): the host and wall times per call of tiny ops on that device instead (cuda_main)."""
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


def cuda_main(device, iters, reps, burst=32):
    """Two figures per op, in microseconds per call, with the same ops and measurements as
    bench/op_overhead_cuda.c (see its header), on the monotonic clock time.perf_counter:

    NAME_us (host time, the goal's figure): torch.cuda.synchronize() (untimed), then `burst`
    calls timed with no synchronization inside (the clock stops when the last call returns),
    then torch.cuda.synchronize() (untimed); best of reps * 20 bursts. A burst is short enough
    that the CUDA launch queue (about 1024 entries) never fills, so launches return as soon as
    they are queued and the figure is torch's host cost per op.

    NAME_wall_us: `iters` calls followed by one torch.cuda.synchronize(), wall time over both
    divided by `iters`, best of `reps` runs. Thousands of launches fill the launch queue, after
    which the loop runs at the device's rate for back-to-back tiny kernels: wall well above
    host means the device, not the host, bounded that run."""
    if not torch.cuda.is_available():
        raise SystemExit("op_overhead.py: torch has no CUDA device (torch %s)" % torch.__version__)
    dev = torch.device(device)
    print("gpu", torch.cuda.get_device_name(dev), "(torch %s)" % torch.__version__)
    a = torch.rand(8, device=dev)
    b = torch.rand(8, device=dev)
    m1 = torch.rand(8, 8, device=dev)
    m2 = torch.rand(8, 8, device=dev)
    x = torch.rand(8, 8, device=dev)
    w = torch.rand(8, 8, device=dev, requires_grad=True)
    bias = torch.rand(8, device=dev, requires_grad=True)

    def linear_step():
        torch.nn.functional.linear(x, w, bias).sum().backward()

    def linear_step_amp():
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.linear(x, w, bias).sum()
        loss.backward()

    ops = [("add", lambda: torch.add(a, b)), ("mul", lambda: torch.mul(a, b)),
           ("relu", lambda: torch.relu(a)), ("matmul", lambda: torch.matmul(m1, m2)),
           ("sum", lambda: torch.sum(a)), ("linear_step", linear_step),
           ("linear_step_amp", linear_step_amp)]
    for name, fn in ops:
        grad = name.startswith("linear")
        with torch.set_grad_enabled(grad):
            for _ in range(iters // 10 + 1):
                fn()
            host = float("inf")
            for _ in range(reps * 20):
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                for _ in range(burst):
                    fn()
                s = time.perf_counter() - t0
                torch.cuda.synchronize(dev)
                host = min(host, s / burst * 1e6)
            wall = float("inf")
            for _ in range(reps):
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize(dev)
                wall = min(wall, (time.perf_counter() - t0) / iters * 1e6)
        print("%s_us" % name, host)
        print("%s_wall_us" % name, wall, flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--device":
        cuda_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                  max(int(sys.argv[5]), 1) if len(sys.argv) > 5 else 32)
        return
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
