"""One benchmark configuration in its own Python process, for the PyTorch sides of the benches
(bench/simplenet.py, bench/resnet.py): a fresh process per (mode, threads) keeps allocator and
thread-pool state from one configuration out of the next."""
import json
import subprocess


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
