#!/usr/bin/env python3
"""SimpleNet (the PaddlePaddle AMP guide's network) trained in PyTorch on the CPU or a CUDA GPU,
the same loop as samples/simplenet_amp.c: three Linear(hidden, hidden) layers with ReLU after the
first two, MSE loss, SGD lr 1e-4, the first --warmup steps (default 1) excluded from timing
(ms_per_step is the mean over the timed steps, ms_median their median).

--device cpu (the default) is described first, --device cuda[:N] below.

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

--device cuda[:N]: every mode in this one process, one after the other on the same GPU data
(made once with torch.randn on the device), each from the same initial weights, printing
  {"impl": "torch", "mode": ..., "device": "cuda", "gpu": NAME, "ms_per_step": ...,
   "ms_median": null, "loss": ..., "peak_bytes": ..., "data_bytes": ..., "supported": true, ...}
Modes (default all four):
  fp32     plain FP32; TF32 off (torch.set_float32_matmul_precision('highest')), as mixtape's
           F32 GEMMs on CUDA by default
  o1-fp16  torch.autocast('cuda', dtype=torch.float16) + torch.amp.GradScaler('cuda',
           init_scale=1024)
  o2-fp16  model.half() with FP32 master weights, the standard (apex O2) way: the optimizer
           holds FP32 copies of the parameters; each step the FP16 gradients are copied into the
           masters' FP32 .grad, GradScaler unscales them, checks for inf/NaN and steps the
           masters, and the masters are copied back into the FP16 model; input cast to FP16,
           MSE loss in FP32, GradScaler(init_scale=1024)
  o1-bf16  torch.autocast('cuda', dtype=torch.bfloat16), no GradScaler
Timing: torch.cuda.synchronize() after the warm-up steps and after the last step, around the
clock (a whole-run mean: ms_median is null, as mixtape's on a GPU). Memory: peak_bytes is
torch.cuda.max_memory_allocated during the mode (reset_peak_memory_stats first; data set
included), data_bytes torch.cuda.memory_allocated before the model was made (the data set),
reserved_peak_bytes torch.cuda.max_memory_reserved (the caching allocator's pool).
"""
import argparse
import gc
import json
import resource
import statistics
import sys
import time

from bench_child import cpu_fp16_refusal, cpu_train_step, run_sweep


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
        why = cpu_fp16_refusal(torch)
        if why:
            return {'mode': args.one, 'supported': False, 'reason': why}
    elif args.one != 'fp32':
        return {'mode': args.one, 'supported': False, 'reason': 'failed: unknown mode'}

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = torch.nn.Sequential(
        torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    total = args.steps * args.epochs
    warmup = min(args.warmup, total - 1)
    t0 = time.perf_counter()
    loss_value = float('nan')
    step_ms = []
    for s in range(total):
        ts = time.perf_counter()
        if s == warmup:
            t0 = ts  # the first steps warm up
        x, y = xs[s % args.steps], ys[s % args.steps]
        loss = cpu_train_step(torch, amp_dtype, opt, lambda: F.mse_loss(model(x), y))
        if s == total - 1:
            loss_value = loss.item()
        step_ms.append(1e3 * (time.perf_counter() - ts))
    t1 = time.perf_counter()
    timed = total - warmup
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {'impl': 'torch', 'version': torch.__version__, 'mode': args.one, 'device': 'cpu',
            'hidden': h, 'batch': b, 'steps': total, 'warmup': warmup, 'threads': args.threads,
            'ms_per_step': 1e3 * (t1 - t0) / timed,
            'ms_median': statistics.median(step_ms[total - timed:]), 'loss': loss_value,
            'rss_delta_bytes': (rss1 - rss0) * 1024, 'supported': True}


CUDA_MODES = ('fp32', 'o1-fp16', 'o2-fp16', 'o1-bf16')


def make_model(torch, h):
    return torch.nn.Sequential(
        torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, h))


def make_grad_scaler(torch, device_type):
    # torch.amp.GradScaler(device) since torch 2.3; torch.cuda.amp.GradScaler before.
    if hasattr(torch, 'amp') and hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler(device_type, init_scale=1024)
    return torch.cuda.amp.GradScaler(init_scale=1024)


class DeviceClock:
    """Waits for the device and reads its memory counters (CUDA), or does nothing (CPU, where
    only the logic is exercised)."""

    def __init__(self, torch, dev):
        self.torch, self.dev = torch, dev
        self.cuda = dev.type == 'cuda'

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def reset_peak(self):
        if self.cuda:
            gc.collect()
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats(self.dev)

    def allocated(self):
        return self.torch.cuda.memory_allocated(self.dev) if self.cuda else None

    def peak(self):
        return self.torch.cuda.max_memory_allocated(self.dev) if self.cuda else None

    def reserved_peak(self):
        return self.torch.cuda.max_memory_reserved(self.dev) if self.cuda else None


def train_on_device(torch, args, mode, xs, ys, clock):
    """One mode on args.device; returns its JSON record."""
    import torch.nn.functional as F

    dev = clock.dev
    amp_dtype = {'o1-fp16': torch.float16, 'o1-bf16': torch.bfloat16}.get(mode)
    o2 = mode == 'o2-fp16'
    use_scaler = mode in ('o1-fp16', 'o2-fp16')
    if mode not in CUDA_MODES:
        return {'mode': mode, 'supported': False, 'reason': 'failed: unknown mode'}

    clock.sync()
    clock.reset_peak()
    data_bytes = clock.allocated()
    torch.manual_seed(args.seed + 1)  # the same initial weights in every mode
    model = make_model(torch, args.hidden).to(dev)
    params = list(model.parameters())
    if o2:
        # FP32 master weights (the initial FP32 values): the optimizer steps these; the FP16
        # model (model.half() keeps the Parameter objects) is a rounded copy of them.
        masters = [p.detach().clone() for p in params]
        for m in masters:
            m.grad = torch.zeros_like(m)
        model.half()
        opt = torch.optim.SGD(masters, lr=1e-4)
    else:
        opt = torch.optim.SGD(params, lr=1e-4)
    scaler = make_grad_scaler(torch, dev.type) if use_scaler else None

    def step(x, y):
        if o2:
            loss = F.mse_loss(model(x.half()).float(), y)
        else:
            with torch.autocast(dev.type, dtype=amp_dtype or torch.bfloat16,
                                enabled=amp_dtype is not None):
                loss = F.mse_loss(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if o2:
            with torch.no_grad():
                for m, p in zip(masters, params):
                    m.grad.copy_(p.grad)  # FP16 -> FP32 (still scaled)
            scaler.step(opt)  # unscales the FP32 grads, skips the step on inf/NaN
            scaler.update()
            with torch.no_grad():
                for p, m in zip(params, masters):
                    p.copy_(m)  # FP32 masters -> FP16 model
            model.zero_grad(set_to_none=True)
        elif scaler is not None:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    total = args.steps * args.epochs
    warmup = min(args.warmup, total - 1)
    clock.sync()  # the model's initialization is not part of any step
    t0 = time.perf_counter()
    last_loss = None
    for s in range(total):
        if s == warmup and s > 0:
            clock.sync()  # the warm-up steps have finished on the device
            t0 = time.perf_counter()
        loss = step(xs[s % args.steps], ys[s % args.steps])
        if s == total - 1:
            last_loss = loss.detach()
    clock.sync()
    t1 = time.perf_counter()
    timed = total - warmup
    record = {'impl': 'torch', 'version': torch.__version__, 'mode': mode,
              'device': dev.type, 'hidden': args.hidden, 'batch': args.batch, 'steps': total,
              'warmup': warmup, 'timed_steps': timed,
              'ms_per_step': 1e3 * (t1 - t0) / timed, 'ms_median': None,
              'loss': float(last_loss.item()), 'peak_bytes': clock.peak(),
              'data_bytes': data_bytes, 'reserved_peak_bytes': clock.reserved_peak(),
              'supported': True}
    if clock.cuda:
        record['gpu'] = torch.cuda.get_device_name(dev)
        record['matmul_precision'] = torch.get_float32_matmul_precision()
    return record  # the model, optimizer and scaler go with this frame


def run_device(args):
    """--device cuda[:N]: every mode in this process; one JSON line each."""
    import torch

    modes = args.modes.split(',')
    dev = torch.device(args.device)
    if dev.type == 'cuda' and not torch.cuda.is_available():
        for mode in modes:
            print(json.dumps({'mode': mode, 'supported': False,
                              'reason': 'failed: torch %s sees no CUDA device'
                                        % torch.__version__}), flush=True)
        return 1
    if dev.type == 'cuda':
        # mixtape's F32 GEMMs on CUDA do not use TF32 unless asked to; neither does this
        # ('highest': FP32 matmuls in FP32, the stable spelling of allow_tf32 = False).
        torch.set_float32_matmul_precision('highest')
    clock = DeviceClock(torch, dev)
    torch.manual_seed(args.seed)
    h, b = args.hidden, args.batch
    xs = [torch.randn(b, h, device=dev) for _ in range(args.steps)]
    ys = [torch.randn(b, h, device=dev) for _ in range(args.steps)]
    failed = False
    for mode in modes:
        try:
            record = train_on_device(torch, args, mode, xs, ys, clock)
        except Exception as e:  # report the mode and go on with the next
            record = {'mode': mode, 'supported': False,
                      'reason': 'failed: %s: %s' % (type(e).__name__,
                                                    (str(e).splitlines() or [''])[0][:200])}
        if not record.get('supported', True):
            failed = True
        print(json.dumps(record), flush=True)
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--hidden', type=int, default=1024)
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--steps', type=int, default=10, help='batches per epoch')
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--seed', type=int, default=2023)
    p.add_argument('--warmup', type=int, default=1, help='untimed steps at the start')
    p.add_argument('--device', default='cpu', help='cpu (default) or cuda[:N]')
    p.add_argument('--threads', default='1,2', help='comma list of thread counts to try')
    p.add_argument('--modes', default=None,
                   help='default: fp32,o1-bf16,o1-fp16 on the CPU; fp32,o1-fp16,o2-fp16,o1-bf16 '
                        'on CUDA')
    p.add_argument('--one', help=argparse.SUPPRESS)  # child: run one mode
    args = p.parse_args()
    if min(args.hidden, args.batch, args.steps, args.epochs) <= 0 or args.warmup < 0:
        p.error('sizes must be positive and --warmup not negative')

    if args.device != 'cpu':
        if args.modes is None:
            args.modes = ','.join(CUDA_MODES)
        return run_device(args)
    if args.modes is None:
        args.modes = 'fp32,o1-bf16,o1-fp16'

    if args.one:
        args.threads = int(args.threads)
        print(json.dumps(run_one(args)), flush=True)
        return 0

    return run_sweep(__file__, args.modes.split(','), args.threads.split(','),
                     ['--hidden', str(args.hidden), '--batch', str(args.batch),
                      '--steps', str(args.steps), '--epochs', str(args.epochs),
                      '--seed', str(args.seed), '--warmup', str(args.warmup)])


if __name__ == '__main__':
    sys.exit(main())
