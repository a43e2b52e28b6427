#!/usr/bin/env python3
"""Data-parallel SimpleNet on the CPU: mixtape (samples/simplenet_amp --ddp, launched by
mpirun) side by side with PyTorch DistributedDataParallel on the gloo backend, on the same
machine in the same run. Each configuration trains 3 x Linear(H, H) + ReLU + MSE with SGD,
FP32, B rows per rank, one thread per rank; the figures are the median step time over the
timed steps (the first step excluded), the slowest rank's, the best of --rounds rounds, and mixtape's all-reduce calls
per step (torch's bucket count from its DDP logging data).

  /usr/bin/python3 bench/ddp.py --sample build/samples/simplenet_amp [--hidden 512] [--batch 64]

Configurations: 1 rank; 2 ranks bucketed (25 MiB, overlap on); 2 ranks bucketed with overlap
off (all-reduces started after backward); 2 ranks one all-reduce per parameter; and, to
tell CPU contention from communication on a small machine, 2 independent mixtape processes
without DDP (the same compute, no all-reduce). Prints a
table, and with --json one JSON object per configuration and line."""
import argparse, json, os, subprocess, sys, time


def mixtape(args, ranks, extra):
    ddp = '--no-ddp' not in extra
    extra = [e for e in extra if e != '--no-ddp']
    cmd = ['mpirun', '-np', str(ranks), '--oversubscribe', '--allow-run-as-root', '--bind-to',
           'none', args.sample] + (['--ddp'] if ddp else []) + ['--device', 'cpu', '--modes', 'fp32', '--threads', '1',
           '--hidden', str(args.hidden), '--batch', str(args.batch), '--steps', str(args.steps),
           '--epochs', '1', '--json'] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith('{')]
    assert len(rows) == ranks, out
    if ddp:
        assert len({r['param_checksum'] for r in rows}) == 1, 'replicas diverged: %s' % rows
    return {'ms_median': max(r['ms_median'] for r in rows),
            'allreduce_calls_per_step': rows[0]['allreduce_calls_per_step'],
            'loss': rows[0]['loss'], 'param_checksum': rows[0]['param_checksum']}


def torch_worker(rank, world, args, bucket_mb, port, q):
    import torch, torch.distributed as dist, torch.nn as nn
    torch.set_num_threads(1)
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = str(port)
    dist.init_process_group('gloo', rank=rank, world_size=world)
    torch.manual_seed(1)
    h = args.hidden
    model = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(2023 + rank)
    xs = [torch.randn(args.batch, h, generator=g) for _ in range(args.steps)]
    ys = [torch.randn(args.batch, h, generator=g) for _ in range(args.steps)]
    times = []
    for s in range(args.steps):
        t = time.perf_counter()
        loss = nn.functional.mse_loss(ddp(xs[s]), ys[s])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(1e3 * (time.perf_counter() - t))
    timed = sorted(times[1:])
    n = len(timed)
    med = timed[n // 2] if n % 2 else 0.5 * (timed[n // 2 - 1] + timed[n // 2])
    buckets = None
    try:
        sizes = ddp._get_ddp_logging_data().get('bucket_sizes')
        buckets = len(str(sizes).split(', ')) if sizes else None
    except Exception:
        pass
    q.put((rank, med, buckets, float(loss)))
    dist.destroy_process_group()


def torch_run(args, ranks, bucket_mb, port):
    import torch.multiprocessing as mp
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    procs = [ctx.Process(target=torch_worker, args=(r, ranks, args, bucket_mb, port, q))
             for r in range(ranks)]
    for p in procs:
        p.start()
    res = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return {'ms_median': max(r[1] for r in res), 'buckets': res[0][2], 'loss': res[0][3]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--sample', required=True)
    ap.add_argument('--hidden', type=int, default=512)
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--json', action='store_true')
    args = ap.parse_args()
    configs = [
        ('1 rank', 1, [], 25),
        ('2 independent processes, no DDP', 2, ['--no-ddp'], None),
        ('2 ranks, buckets 25 MiB, overlap', 2, [], 25),
        ('2 ranks, buckets 25 MiB, no overlap', 2, ['--no-overlap'], None),
        ('2 ranks, one all-reduce per parameter', 2, ['--per-param'], 0.0001),
    ]
    # The machine is shared: the configurations are interleaved over --rounds rounds and each
    # keeps its best round.
    best = {}
    for rnd in range(args.rounds):
        for i, (name, ranks, extra, torch_mb) in enumerate(configs):
            m = mixtape(args, ranks, extra)
            t = torch_run(args, ranks, torch_mb, 29500 + 10 * rnd + i) if torch_mb is not None else None
            b = best.setdefault(name, {'config': name, 'ranks': ranks, 'mixtape_ms': float('inf'),
                                       'torch_ms': None, 'torch_buckets': None})
            b['mixtape_ms'] = min(b['mixtape_ms'], m['ms_median'])
            b['mixtape_allreduce_calls_per_step'] = m['allreduce_calls_per_step']
            if t:
                b['torch_ms'] = t['ms_median'] if b['torch_ms'] is None else min(b['torch_ms'], t['ms_median'])
                b['torch_buckets'] = t['buckets']
    rows = [best[c[0]] for c in configs]
    if args.json:
        for row in rows:
            print(json.dumps(row), flush=True)
    if not args.json:
        print('SimpleNet 3 x Linear(%d, %d), FP32, SGD, batch %d per rank, 1 thread per rank; '
              'median ms/step of the slowest rank' % (args.hidden, args.hidden, args.batch))
        print('%-40s %12s %16s %12s %14s' % ('configuration', 'mixtape ms', 'all-reduces/step',
                                             'torch ms', 'torch buckets'))
        for r in rows:
            tm = '%.2f' % r['torch_ms'] if r['torch_ms'] is not None else '-'
            tb = str(r['torch_buckets']) if r['torch_buckets'] is not None else '-'
            print('%-40s %12.2f %16d %12s %14s' % (r['config'], r['mixtape_ms'],
                                                   r['mixtape_allreduce_calls_per_step'], tm, tb))


if __name__ == '__main__':
    main()
