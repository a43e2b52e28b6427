#!/usr/bin/env python3
"""SimpleNet (the PaddlePaddle AMP guide's network) trained in PyTorch on the CPU, the same loop
as samples/simplenet_amp.c: three Linear(hidden, hidden) layers with ReLU after the first two,
MSE loss, SGD lr 1e-4, the first step excluded from timing (ms_per_step is the mean over the
timed steps, ms_median their median).

Every (mode, threads) configuration runs in a fresh child process so that its peak-memory
figure is its own. Prints one JSON object per configuration and line on stdout:
  {"impl": "torch", "mode": ..., "threads": ..., "ms_per_step": ..., "ms_median": ...,
   "loss": ...,
   "rss_delta_bytes": ..., "supported": true}
or, for a mode this torch cannot run on the CPU, {"mode": ..., "supported": false,
"reason": ...}.

Modes: fp32; o1-bf16 = torch.autocast('cpu', dtype=torch.bfloat16) (no GradScaler: BF16 has
FP32's range); o1-fp16 = torch.autocast('cpu', dtype=torch.float16), which torch 1.13 refuses
("AutocastCPU only support Bfloat16"), and torch 1.13 has no FP16 addmm on the CPU either.

Memory: ru_maxrss of the child after training minus ru_maxrss after the data were made, i.e.
the resident-set growth from the model, gradients, activations and allocator caching (and any
library pages first touched by training). Run with /usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def run_one(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    h, b = args.hidden, args.batch
    xs = [torch.randn(b, h) for _ in range(args.steps)]
    ys = [torch.randn(b, h) for _ in range(args.steps)]

    amp_dtype = None
    if args.one == 'o1-bf16':
        amp_dtype = torch.bfloat16
    elif args.one == 'o1-fp16':
        amp_dtype = torch.float16
        try:
            with torch.autocast('cpu', dtype=torch.float16):
                pass
        except RuntimeError as e:
            return {'mode': args.one, 'supported': False,
                    'reason': 'not supported by torch %s: %s' % (torch.__version__,
                                                                str(e).splitlines()[0])}
    elif args.one != 'fp32':
        return {'mode': args.one, 'supported': False, 'reason': 'failed: unknown mode'}

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = torch.nn.Sequential(
        torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    total = args.steps * args.epochs
    t0 = time.perf_counter()
    loss_value = float('nan')
    step_ms = []
    for s in range(total):
        ts = time.perf_counter()
        if s == 1:
            t0 = ts  # the first step warms up
        x, y = xs[s % args.steps], ys[s % args.steps]
        with torch.autocast('cpu', dtype=amp_dtype or torch.bfloat16,
                            enabled=amp_dtype is not None):
            loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s == total - 1:
            loss_value = loss.item()
        step_ms.append(1e3 * (time.perf_counter() - ts))
    t1 = time.perf_counter()
    timed = total - 1 if total > 1 else 1
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {'impl': 'torch', 'version': torch.__version__, 'mode': args.one, 'device': 'cpu',
            'hidden': h, 'batch': b, 'steps': total, 'threads': args.threads,
            'ms_per_step': 1e3 * (t1 - t0) / timed,
            'ms_median': statistics.median(step_ms[total - timed:]), 'loss': loss_value,
            'rss_delta_bytes': (rss1 - rss0) * 1024, 'supported': True}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--hidden', type=int, default=1024)
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--steps', type=int, default=10, help='batches per epoch')
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--seed', type=int, default=2023)
    p.add_argument('--threads', default='1,2', help='comma list of thread counts to try')
    p.add_argument('--modes', default='fp32,o1-bf16,o1-fp16')
    p.add_argument('--one', help=argparse.SUPPRESS)  # child: run one mode
    args = p.parse_args()

    if args.one:
        args.threads = int(args.threads)
        print(json.dumps(run_one(args)), flush=True)
        return 0

    failed = False
    for mode in args.modes.split(','):
        for threads in args.threads.split(','):
            cmd = [sys.executable, __file__, '--one', mode, '--threads', threads,
                   '--hidden', str(args.hidden), '--batch', str(args.batch),
                   '--steps', str(args.steps), '--epochs', str(args.epochs),
                   '--seed', str(args.seed)]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines = [line for line in r.stdout.splitlines() if line.startswith('{')]
            if r.returncode != 0 or not lines:
                err = (r.stderr.strip().splitlines() or ['exit status %d' % r.returncode])[-1]
                print(json.dumps({'mode': mode, 'threads': int(threads), 'supported': False,
                                  'reason': 'failed: ' + err}), flush=True)
                failed = True
                continue
            result = json.loads(lines[-1])
            print(lines[-1], flush=True)
            if not result.get('supported', True):
                break  # the same answer for every thread count
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
