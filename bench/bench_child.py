"""What the PyTorch sides of the benches (bench/simplenet.py, bench/resnet.py) share: one
benchmark configuration in its own Python process (a fresh process per (mode, threads) keeps
allocator and thread-pool state from one configuration out of the next), the sweep over modes
and thread counts, and the CPU training step."""
import json
import subprocess
import sys


def run_child(cmd, mode, threads):
    """Runs cmd, passes its last JSON line on to stdout and returns it as a dict; when the child
    fails, prints an unsupported row naming its last error line instead and returns None."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith('{')]
    if r.returncode != 0 or not lines:
        err = (r.stderr.strip().splitlines() or ['exit status %d' % r.returncode])[-1]
        print(json.dumps({'mode': mode, 'threads': int(threads), 'supported': False,
                          'reason': 'failed: ' + err}), flush=True)
        return None
    print(lines[-1], flush=True)
    return json.loads(lines[-1])


def run_sweep(script, modes, thread_counts, args):
    """Runs `script --one MODE --threads N ARGS` for every mode and thread count (run_child);
    a mode's first unsupported answer ends its thread counts (the same answer for every count).
    Returns the exit status: 1 when a child failed."""
    failed = False
    for mode in modes:
        for threads in thread_counts:
            cmd = [sys.executable, script, '--one', mode, '--threads', threads] + args
            result = run_child(cmd, mode, threads)
            if result is None:
                failed = True
                continue
            if not result.get('supported', True):
                break
    return 1 if failed else 0


def cpu_fp16_refusal(torch):
    """Why this torch cannot autocast to FP16 on the CPU (torch 1.13: "AutocastCPU only support
    Bfloat16"), or None."""
    try:
        with torch.autocast('cpu', dtype=torch.float16):
            pass
    except RuntimeError as e:
        return 'not supported by torch %s: %s' % (torch.__version__, str(e).splitlines()[0])
    return None


def cpu_train_step(torch, amp_dtype, opt, loss_fn):
    """One training step on the CPU: loss_fn() (the forward pass and the loss) under autocast to
    amp_dtype (None: FP32, no autocast), backward, the optimizer's step; returns the loss."""
    with torch.autocast('cpu', dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
        loss = loss_fn()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss
