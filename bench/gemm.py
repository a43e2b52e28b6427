"""PyTorch side of bench/gemm.c: torch.matmul / F.linear on the same device, shapes and dtypes
(FP32 accumulation for FP16/BF16; TF32 off for FP32), timed as the C side times mixtape: a run
of `iters` calls, then torch.cuda.synchronize(); the best of `reps` runs. Prints one JSON line
per (case, dtype): {"case", "dtype", "s"} (seconds per call), after {"gpu": name}.

Cases come from the C side as NAME:M:N:K:TA:TB:LINEAR (A stored [K,M] when TA, B stored [N,K]
when TB; LINEAR: F.linear(A, B)), so that both sides run the same list."""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def per_call_s(fn, iters, reps, sync):
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("cases", nargs="+")
    a = p.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("gemm.py: torch has no CUDA device (torch %s)" % torch.__version__)
        sync = torch.cuda.synchronize
        name = torch.cuda.get_device_name(dev)
    else:
        sync = lambda: None  # noqa: E731 (a CPU dry run of this script)
        name = "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    # FP32 accumulation for FP16/BF16, as mixtape's and the cuBLAS reference's
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    try:  # torch >= 2.0 (torch 1.13's __getattr__ raises AssertionError, not AttributeError)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    except (AttributeError, AssertionError):
        pass
    print(json.dumps({"gpu": "%s (torch %s)" % (name, torch.__version__)}), flush=True)
    dtypes = {"FP16": torch.float16, "BF16": torch.bfloat16, "FP32": torch.float32}
    for spec in a.cases:
        cname, m, n, k, ta, tb, linear = spec.rsplit(":", 6)
        m, n, k = int(m), int(n), int(k)
        for label, dt in dtypes.items():
            A = torch.randn((k, m) if ta == "1" else (m, k), device=dev).to(dt)
            B = torch.randn((n, k) if tb == "1" else (k, n), device=dev).to(dt)
            if linear == "1":
                fn = lambda: F.linear(A, B)  # noqa: E731
            else:
                Av = A.t() if ta == "1" else A
                Bv = B.t() if tb == "1" else B
                fn = lambda: torch.matmul(Av, Bv)  # noqa: E731
            try:
                s = per_call_s(fn, a.iters, a.reps, sync)
                print(json.dumps({"case": cname, "dtype": label, "s": s}), flush=True)
            except RuntimeError as e:  # a dtype this torch lacks on this device: not measured
                print(json.dumps({"case": cname, "dtype": label, "s": None,
                                  "error": str(e)[:200]}), flush=True)


if __name__ == "__main__":
    main()
