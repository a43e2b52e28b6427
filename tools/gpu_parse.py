#!/usr/bin/env python3
"""Reads the output of NVIDIA's GPU tools for tools/gpu_test.sh (steps sass and ncu), and
prints a table and one last line "SUMMARY key=value ...", which the step turns into its
summary line. tools/fixtures/gpu holds captured outputs that the rehearsal feeds it.

  gpu_parse.py sass RES_USAGE SASS   cuobjdump -res-usage and -sass of the kernel objects:
                                     per function registers, stack, local bytes, LDL/STL count
  gpu_parse.py ncu CSV               ncu --csv --metrics gpu__time_duration.sum: time per
                                     kernel name, GEMM kernels on tensor cores or not
  gpu_parse.py breakdown CSV STEPS   the same CSV as milliseconds per step (the run's total
                                     over STEPS): per kind of kernel (category()), then the
                                     30 costliest kernels; tools/gpu_torch_profile.py prints
                                     torch's step in the same form
"""
import csv
import re
import subprocess
import sys


def new_func():
    return {'regs': 0, 'stack': 0, 'local': 0, 'ldst': 0, 'archs': set()}


def demangle(names):
    try:
        dem = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True,
                             timeout=20).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        dem = []
    return dem + names[len(dem):]


def sass(res, dump):
    funcs = {}
    cur = None
    for line in open(res, errors='replace'):
        m = re.search(r'Function ([^\s:]+):', line)
        if m:
            cur = funcs.setdefault(m.group(1), new_func())
            continue
        m = re.search(r'REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)', line)
        if m and cur is not None:
            cur['regs'] = max(cur['regs'], int(m.group(1)))
            cur['stack'] = max(cur['stack'], int(m.group(2)))
            cur['local'] = max(cur['local'], int(m.group(4)))
    arch = '?'
    cur = None
    for line in open(dump, errors='replace'):
        m = re.search(r'arch = (sm_\d+\w*)', line)
        if m:
            arch = m.group(1)
        m = re.search(r'Function : (\S+)', line)
        if m:
            cur = funcs.setdefault(m.group(1), new_func())
            cur['archs'].add(arch)
            continue
        if cur is not None and re.search(r'\b(LDL|STL)(\.\w+)*\b', line):
            cur['ldst'] += 1
    names = list(funcs)
    bad = 0
    print('%-6s %-6s %-6s %-7s %-12s %s' % ('regs', 'stack', 'local', 'LDL/STL', 'archs', 'kernel'))
    for n, d in sorted(zip(names, demangle(names)), key=lambda x: x[1]):
        f = funcs[n]
        flag = f['local'] or f['stack'] or f['ldst']
        bad += bool(flag)
        print('%-6d %-6d %-6d %-7d %-12s %s%s' % (f['regs'], f['stack'], f['local'], f['ldst'],
              ','.join(sorted(f['archs'])) or '-', d[:150], '   <-- local memory' if flag else ''))
    print('SUMMARY functions=%d with_local_memory=%d max_regs=%d ldst_total=%d' % (
        len(funcs), bad, max([f['regs'] for f in funcs.values()] or [0]),
        sum(f['ldst'] for f in funcs.values())))


# ncu picks a unit per value: every duration to nanoseconds.
UNITS = {'second': 1e9, 'msecond': 1e6, 'usecond': 1e3, 'nsecond': 1.0,
         's': 1e9, 'ms': 1e6, 'us': 1e3, 'ns': 1.0}
TC = re.compile(r'gmma|hmma|h16816|h1688|s16816|xmma|tensorop|nvjet|sm90_|sm80_|cutlass', re.I)
GEMM = re.compile(r'gemm|nvjet|xmma|cutlass|gmma|matmul', re.I)


# The kind of a kernel, by name, for the per-step breakdowns (mixtape's and cuDNN's/cuBLAS's
# names and torch's): the first pattern that matches.
CATEGORIES = [
    ('optimizer/scaler', re.compile(r'mta_|multi_tensor|amp_|unscale|_foreach|scale_update|sgd|adam',
                                    re.I)),
    ('cast/copy/fill', re.compile(r'convert|ew_conv_|copy|fill|cast|memset|transpose|nchwto|nhwcto',
                                  re.I)),
    ('batch norm', re.compile(r'bn_|batch_?norm|batchnorm|bn_fw|bn_bw|welford|norm_stat', re.I)),
    ('convolution', re.compile(r'conv(?!ert)|fprop|dgrad|wgrad|implicit|xmma|cudnn|winograd|fft', re.I)),
    ('GEMM', re.compile(r'gemm|nvjet|gmma|cutlass|matmul', re.I)),
    ('pooling', re.compile(r'pool', re.I)),
    ('softmax/loss', re.compile(r'softmax|cross_entropy|nll|log_sm', re.I)),
    ('reduction', re.compile(r'reduce', re.I)),
    ('elementwise', re.compile(r'elementwise|ew_|vectorized|unrolled|relu|add|mul', re.I)),
]


def category(name):
    for label, pat in CATEGORIES:
        if pat.search(name):
            return label
    return 'other'


def print_breakdown(kernels, steps, title):
    """kernels: name -> [calls, nanoseconds] over `steps` steps."""
    total = sum(k[1] for k in kernels.values()) or 1.0
    cats = {}
    for name, (n, v) in kernels.items():
        c = cats.setdefault(category(name), [0, 0.0])
        c[0] += n
        c[1] += v
    print('%s: %.2f ms of kernels per step, %d launches per step' % (
        title, total / 1e6 / steps, sum(k[0] for k in kernels.values()) // max(steps, 1)))
    print('%-18s %9s %7s %8s' % ('kind', 'ms/step', 'share', 'calls'))
    for label, (n, v) in sorted(cats.items(), key=lambda x: -x[1][1]):
        print('%-18s %9.3f %6.1f%% %8d' % (label, v / 1e6 / steps, 100 * v / total, n // max(steps, 1)))
    print('%9s %7s %6s  %s' % ('ms/step', 'share', 'calls', 'kernel (30 costliest)'))
    for name, (n, v) in sorted(kernels.items(), key=lambda x: -x[1][1])[:30]:
        print('%9.3f %6.1f%% %6d  %s' % (v / 1e6 / steps, 100 * v / total, n // max(steps, 1),
                                        name[:140]))


def ncu_kernels(path):
    """name -> [calls, nanoseconds] from ncu's CSV (one metric: gpu__time_duration.sum)."""
    rows = [line for line in open(path, errors='replace') if line.startswith('"')]
    kernels = {}
    header = None
    for rec in csv.reader(rows):
        if header is None:
            header = rec
            continue
        d = dict(zip(header, rec))
        try:
            v = float(d.get('Metric Value', '0').replace(',', ''))
        except ValueError:
            v = 0.0
        v *= UNITS.get(d.get('Metric Unit', ''), 1.0)
        k = kernels.setdefault(d.get('Kernel Name', '?'), [0, 0.0])
        k[0] += 1
        k[1] += v
    return kernels


def ncu(path):
    kernels = ncu_kernels(path)
    total = sum(k[1] for k in kernels.values()) or 1.0
    gemm = tc = 0
    print('%6s %8s  %s' % ('calls', 'time %', 'kernel'))
    for name, (n, v) in sorted(kernels.items(), key=lambda x: -x[1][1]):
        g, t = bool(GEMM.search(name)), bool(TC.search(name))
        gemm += g
        tc += g and t
        print('%6d %7.1f%%  %s%s' % (n, 100 * v / total, name[:160],
                                     '   [GEMM, tensor cores]' if g and t else '   [GEMM]' if g else ''))
    print('SUMMARY kernels=%d gemm_kernels=%d tensor_core_gemm_kernels=%d' % (len(kernels), gemm, tc))


if __name__ == '__main__':
    if len(sys.argv) == 4 and sys.argv[1] == 'sass':
        sass(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == 'ncu':
        ncu(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == 'breakdown':
        print_breakdown(ncu_kernels(sys.argv[2]), int(sys.argv[3]), 'mixtape (ncu)')
    else:
        sys.exit(__doc__)
