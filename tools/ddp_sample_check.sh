#!/usr/bin/env bash
# Runs samples/simplenet_amp --ddp as 2 MPI ranks (small sizes, every mode) and checks what
# the sample promises: one JSON line per rank and mode, the same param_checksum on every rank,
# and the all-reduce calls per step of the bucketing asked for (1 bucket of 25 MiB for the
# whole net; 6 with --per-param). Usage: ddp_sample_check.sh SIMPLENET_AMP
set -euo pipefail
exe=$1
run() {
    mpirun -np 2 --oversubscribe --allow-run-as-root "$exe" --ddp --device cpu --threads 1 \
        --hidden 64 --batch 16 --steps 3 --epochs 1 --json "$@"
}
check() { # expected calls per step, then sample options
    local want=$1
    shift
    run "$@" | python3 -c '
import json, sys
want = int(sys.argv[1])
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
modes = {r["mode"] for r in rows}
assert len(rows) == 2 * len(modes) and len(modes) == 4, rows
for m in modes:
    rs = [r for r in rows if r["mode"] == m]
    assert sorted(r["rank"] for r in rs) == [0, 1] and all(r["world_size"] == 2 for r in rs), rs
    assert rs[0]["param_checksum"] == rs[1]["param_checksum"], ("replicas diverged", m, rs)
    assert all(r["allreduce_calls_per_step"] == want for r in rs), (m, want, rs)
    assert all(r["loss"] is not None for r in rs), rs
print("ok: %d modes, checksums equal on both ranks, %d all-reduce call(s) per step" % (len(modes), want))
' "$want"
}
command -v mpirun >/dev/null || { echo "mpirun not found: skipped"; exit 77; }
check 1
check 6 --per-param
check 6 --per-param --no-overlap
