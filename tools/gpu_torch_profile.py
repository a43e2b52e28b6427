#!/usr/bin/env python3
"""torch's ResNet training step on CUDA, kernel by kernel: the network and loop of bench/resnet.py
(channels_last, cudnn.benchmark on, autocast + GradScaler for FP16), --warmup steps untimed
(they hold cuDNN's algorithm search), then --steps steps under torch.profiler (CUPTI: device
time per kernel, no replay). Prints the per-step breakdown of tools/gpu_parse.py (per kind of
kernel, then the costliest kernels), the same form as `gpu_parse.py breakdown` of an ncu run of
mixtape, so that the two steps can be compared kind by kind (tools/gpu_steps_profile.sh).

Usage: gpu_torch_profile.py [--arch resnet50] [--batch 128] [--image-size 224]
                            [--mode o1-fp16|o1-bf16|fp32] [--warmup 3] [--steps 2]
"""
import argparse
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, '..', 'bench'))

from gpu_parse import print_breakdown  # noqa: E402
from resnet import cuda_train_step, make_resnet  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', default='resnet50', choices=['resnet18', 'resnet50'])
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--image-size', type=int, default=224)
    p.add_argument('--mode', default='o1-fp16', choices=['fp32', 'o1-fp16', 'o1-bf16'])
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--steps', type=int, default=2)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        sys.exit('torch %s sees no CUDA device' % torch.__version__)
    dtype = {'fp32': None, 'o1-fp16': torch.float16, 'o1-bf16': torch.bfloat16}[args.mode]
    torch.backends.cudnn.benchmark = True
    dev = torch.device('cuda')
    torch.manual_seed(1)
    b, s = args.batch, args.image_size
    x = torch.randn(b, 3, s, s, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (b,), device=dev)
    model = make_resnet(torch, args.arch, 1000).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler('cuda', init_scale=1024, enabled=dtype == torch.float16)

    def step():
        cuda_train_step(torch, F, model, x, y, opt, scaler, dtype)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for a in prof.key_averages():
        if str(getattr(a, 'device_type', '')).split('.')[-1] != 'CUDA':
            continue
        us = getattr(a, 'self_device_time_total', None)
        if us is None:
            us = getattr(a, 'self_cuda_time_total', 0.0)
        k = kernels.setdefault(a.key, [0, 0.0])
        k[0] += a.count
        k[1] += us * 1e3
    print_breakdown(kernels, args.steps, 'torch %s %s %s b%d (CUPTI)' % (
        torch.__version__, args.arch, args.mode, b))


if __name__ == '__main__':
    main()
