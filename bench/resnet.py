#!/usr/bin/env python3
"""ResNet-18/50 trained in plain PyTorch on the CPU or CUDA, the same network and loop as
samples/resnet_amp.c: torchvision's architecture written out here (torch 1.13 on Debian has no
torchvision): a 7x7 stride-2 stem conv + BN + ReLU, 3x3 stride-2 max pool, [2, 2, 2, 2] basic
blocks or [3, 4, 6, 3] bottlenecks (stride on the 3x3 conv, expansion 4) with 1x1 conv + BN
projection shortcuts, adaptive average pool, Linear; convolutions without bias; torch.nn's
default initialisation. Model and input are channels_last. One synthetic batch (random
images, random labels), cross entropy, SGD momentum 0.9, weight decay 1e-4; the first
--warmup steps (default 1) untimed. Each step is timed on the wall clock and in process CPU
time (time.process_time: every thread, not the time other processes hold the cores).

Modes: fp32; o1-bf16 = torch.autocast('cpu', dtype=torch.bfloat16) (no GradScaler);
o1-fp16 = torch.autocast('cpu', dtype=torch.float16), which torch 1.13 refuses on the CPU
(reported as {"supported": false, "reason": ...}).

--device cuda: the same on the GPU, cudnn.benchmark on (the warm-up steps hold its algorithm
search), torch.cuda.synchronize() before the clock starts and before it stops (a step returns
before the GPU has run it, so only the mean over the timed steps is reported: the medians are
null, like samples/resnet_amp's on CUDA); --threads does not apply. torch's defaults are kept
(cudnn.allow_tf32 on: its FP32 convolutions run in TF32; the JSON line says so). Modes there: fp32;
o1-fp16 = torch.autocast('cuda', dtype=torch.float16) + torch.cuda.amp.GradScaler (torch's
channels_last AMP, the reference of issue 9's GPU goal); o1-bf16 = autocast BF16, no scaler.
torch has no O2 (FP16 model with FP32 master weights) in core: bench/resnet compares mixtape's
O2 with this o1-fp16 row. Without a CUDA build of torch or a GPU, each mode answers
{"supported": false, "reason": ...}.

Every (mode, threads) pair runs in a fresh child process; one JSON object per pair and line:
  {"impl": "torch", "version": ..., "mode": ..., "threads": ..., "images_per_s": ...,
   "ms_per_step": ..., "ms_median": ..., "cpu_ms_median": ..., "loss_first": ..., "loss": ..., "supported": true}
Run with /usr/bin/python3 (Debian's python3-torch)."""
import argparse
import json
import statistics
import sys
import time

from bench_child import cpu_fp16_refusal, cpu_train_step, run_sweep


def make_resnet(torch, arch, classes):
    nn = torch.nn

    def conv_bn(cin, cout, k, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                             nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, cin, width, stride, bottleneck):
            super().__init__()
            out = width * (4 if bottleneck else 1)
            if bottleneck:
                self.body = nn.Sequential(conv_bn(cin, width, 1, 1), nn.ReLU(inplace=True),
                                          conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                                          conv_bn(width, out, 1, 1))
            else:
                self.body = nn.Sequential(conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True),
                                          conv_bn(width, out, 3, 1))
            self.down = conv_bn(cin, out, 1, stride) if stride != 1 or cin != out else None
            self.out = out

        def forward(self, x):
            shortcut = self.down(x) if self.down is not None else x
            return torch.relu(self.body(x) + shortcut)

    bottleneck = arch == 'resnet50'
    depth = [3, 4, 6, 3] if bottleneck else [2, 2, 2, 2]
    layers = [conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, n in enumerate(depth):
        for i in range(n):
            b = Block(cin, 64 << stage, 2 if stage > 0 and i == 0 else 1, bottleneck)
            layers.append(b)
            cin = b.out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def cuda_unavailable(torch):
    """Why torch cannot train on CUDA here, or None."""
    if not torch.cuda.is_available():
        return 'torch %s: no CUDA (torch.cuda.is_available() is False%s)' % (
            torch.__version__, '' if torch.version.cuda else '; a CPU-only build')
    return None


def cuda_train_step(torch, F, model, x, y, opt, scaler, dtype):
    """One training step on CUDA (autocast to dtype unless None, the scaler's FP16 loss
    scaling); returns the detached loss. tools/gpu_torch_profile.py profiles this step."""
    with torch.autocast('cuda', dtype=dtype or torch.float16, enabled=dtype is not None):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def run_one_cuda(args, torch, F):
    mode = args.one
    why = cuda_unavailable(torch)
    if why:
        return {'mode': mode, 'device': 'cuda', 'supported': False, 'reason': why}
    amp_dtype = {'fp32': None, 'o1-fp16': torch.float16, 'o1-bf16': torch.bfloat16}
    if mode not in amp_dtype:
        return {'mode': mode, 'device': 'cuda', 'supported': False,
                'reason': 'no such mode in torch on CUDA (torch has no O2 in core)'}
    dtype = amp_dtype[mode]
    torch.backends.cudnn.benchmark = True
    dev = torch.device('cuda')
    torch.manual_seed(args.seed)
    b, s = args.batch, args.image_size
    x = torch.randn(b, 3, s, s, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, args.classes, (b,), device=dev)
    torch.manual_seed(args.seed + 1)
    model = make_resnet(torch, args.arch, args.classes).to(dev, memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler(init_scale=1024, enabled=dtype == torch.float16)

    warmup = min(args.warmup, args.steps - 1)
    losses = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(args.steps):
        if step == warmup and step > 0:
            torch.cuda.synchronize()  # the warm-up steps (cuDNN's search) are done
            t0 = time.perf_counter()
        losses.append(cuda_train_step(torch, F, model, x, y, opt, scaler, dtype))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    timed = args.steps - warmup
    return {'impl': 'torch', 'version': torch.__version__, 'mode': mode, 'device': 'cuda',
            'gpu': torch.cuda.get_device_name(), 'arch': args.arch, 'batch': b,
            'image_size': s, 'steps': args.steps, 'warmup': warmup, 'threads': 0,
            'images_per_s': b * timed / (t1 - t0), 'images_per_s_median': None,
            'ms_per_step': 1e3 * (t1 - t0) / timed, 'ms_median': None, 'cpu_ms_median': None,
            'peak_mib': torch.cuda.max_memory_allocated() / 2**20,
            'cudnn_allow_tf32': torch.backends.cudnn.allow_tf32,
            'loss_first': float(losses[0]), 'loss': float(losses[-1]), 'supported': True}


def run_one(args):
    import torch
    import torch.nn.functional as F

    mode = args.one
    if args.device == 'cuda':
        return run_one_cuda(args, torch, F)
    torch.set_num_threads(args.threads)
    why = cpu_fp16_refusal(torch) if mode == 'o1-fp16' else None
    if why:
        return {'mode': mode, 'threads': args.threads, 'supported': False, 'reason': why}
    if mode not in ('fp32', 'o1-bf16', 'o1-fp16'):
        return {'mode': mode, 'supported': False, 'reason': 'no such mode in torch on the CPU'}
    amp_dtype = {'o1-bf16': torch.bfloat16, 'o1-fp16': torch.float16}.get(mode)

    torch.manual_seed(args.seed)
    b, s = args.batch, args.image_size
    x = torch.randn(b, 3, s, s).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, args.classes, (b,))
    torch.manual_seed(args.seed + 1)
    model = make_resnet(torch, args.arch, args.classes).to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    warmup = min(args.warmup, args.steps - 1)
    step_ms, step_cpu_ms, losses = [], [], []
    t0 = time.perf_counter()
    for step in range(args.steps):
        ts, tc = time.perf_counter(), time.process_time()
        if step == warmup:
            t0 = ts
        loss = cpu_train_step(torch, amp_dtype, opt, lambda: F.cross_entropy(model(x), y))
        losses.append(loss.detach())
        step_ms.append(1e3 * (time.perf_counter() - ts))
        step_cpu_ms.append(1e3 * (time.process_time() - tc))
    t1 = time.perf_counter()
    timed = args.steps - warmup
    ms_median = statistics.median(step_ms[warmup:])
    return {'impl': 'torch', 'version': torch.__version__, 'mode': mode, 'device': 'cpu',
            'arch': args.arch, 'batch': b, 'image_size': s, 'steps': args.steps,
            'warmup': warmup, 'threads': args.threads,
            'images_per_s': b * timed / (t1 - t0), 'images_per_s_median': b * 1e3 / ms_median,
            'ms_per_step': 1e3 * (t1 - t0) / timed, 'ms_median': ms_median,
            'cpu_ms_median': statistics.median(step_cpu_ms[warmup:]),
            'loss_first': float(losses[0]), 'loss': float(losses[-1]), 'supported': True}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', default='resnet18', choices=['resnet18', 'resnet50'])
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--image-size', type=int, default=64)
    p.add_argument('--steps', type=int, default=6)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--classes', type=int, default=1000)
    p.add_argument('--lr', type=float, default=0.01)
    p.add_argument('--seed', type=int, default=2023)
    p.add_argument('--threads', default='1,2', help='comma list of thread counts')
    p.add_argument('--modes', default='fp32,o1-bf16,o1-fp16')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--one', help=argparse.SUPPRESS)  # child: run one mode
    args = p.parse_args()
    if min(args.batch, args.steps, args.classes) <= 0 or args.image_size < 32 or args.warmup < 0:
        p.error('sizes must be positive, --image-size at least 32, --warmup not negative')
    if args.one:
        args.threads = int(args.threads)
        print(json.dumps(run_one(args)), flush=True)
        return 0
    # on CUDA the thread count does not apply: one child per mode
    thread_counts = ['0'] if args.device == 'cuda' else args.threads.split(',')
    return run_sweep(__file__, args.modes.split(','), thread_counts,
                     ['--arch', args.arch, '--batch', str(args.batch),
                      '--image-size', str(args.image_size), '--steps', str(args.steps),
                      '--warmup', str(args.warmup), '--classes', str(args.classes),
                      '--lr', str(args.lr), '--seed', str(args.seed), '--device', args.device])


if __name__ == '__main__':
    sys.exit(main())
