#!/usr/bin/env bash
# Runs a data-parallel sample (simplenet_amp or resnet_amp --ddp) as 2 MPI ranks at small
# sizes in every mode and checks what the sample promises: one JSON line per rank and mode,
# the same param_checksum on every rank, and the all-reduce calls per step of the bucketing
# asked for: SimpleNet's 6 parameters fit one 25 MiB bucket; ResNet-18's 62 (45 MiB in FP32)
# take 2, and under O2 3 (its FP16 weights, reduced in FP32, in 2 and batch norm's FP32
# parameters in their own: one open bucket per dtype); --per-param takes one per parameter;
# the same with the communication thread (--progress thread); and the per-step trace is
# ordered (bucket 0 starts after backward does and completes after it starts; overlap off:
# nothing completes during backward).
# Usage: ddp_sample_check.sh SAMPLE_EXE
set -euo pipefail
exe=$1
case $(basename "$exe") in
simplenet_amp*) small=(--hidden 64 --batch 16 --steps 3 --epochs 1) n_params=6 bucketed=1 o2=1 ;;
resnet_amp*) small=(--batch 4 --image-size 32 --steps 2 --classes 10) n_params=62 bucketed=2 o2=3 ;;
*) echo "ddp_sample_check.sh: unknown sample $exe" >&2; exit 2 ;;
esac
run() {
    mpirun -np 2 --oversubscribe --allow-run-as-root "$exe" --ddp --device cpu --threads 1 \
        "${small[@]}" --json "$@"
}
check() { # modes the count applies to ("all" or a comma list), expected calls, sample options
    local modes=$1 want=$2
    shift 2
    run "$@" | python3 -c '
import json, sys
modes_checked, want = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
modes = {r["mode"] for r in rows}
assert len(rows) == 2 * len(modes) and len(modes) == 4, rows
for m in modes:
    rs = [r for r in rows if r["mode"] == m]
    assert sorted(r["rank"] for r in rs) == [0, 1] and all(r["world_size"] == 2 for r in rs), rs
    assert rs[0]["param_checksum"] == rs[1]["param_checksum"], ("replicas diverged", m, rs)
    calls = {r["allreduce_calls_per_step"] for r in rs}
    assert len(calls) == 1 and min(calls) >= 1, (m, rs)
    if modes_checked == "all" or m in modes_checked.split(","):
        assert calls == {want}, (m, want, rs)
    assert all(r["loss"] is not None for r in rs), rs
    for r in rs:  # the per-step trace (medians, ms from the start of backward) is ordered
        assert r["backward_ms"] > 0, r
        assert 0 <= r["first_allreduce_start_ms"] <= r["first_allreduce_done_ms"], r
        assert r["first_allreduce_done_ms"] <= r["last_allreduce_done_ms"], r
        assert 0 <= r["allreduce_done_before_backward_end"] <= r["allreduce_calls_per_step"], r
        if "--no-overlap" in sys.argv[3:]:
            assert r["allreduce_done_before_backward_end"] == 0, r
print("ok: %d modes, checksums equal on both ranks, %d all-reduce call(s) per step (%s)"
      % (len(modes), want, modes_checked))
' "$modes" "$want" "$@"
}
command -v mpirun >/dev/null || { echo "mpirun not found: skipped"; exit 77; }
check fp32,o1-fp16,o1-bf16 "$bucketed"
check o2-fp16 "$o2"
check all "$n_params" --per-param
check all "$n_params" --per-param --no-overlap
check fp32,o1-fp16,o1-bf16 "$bucketed" --progress thread
check all "$n_params" --per-param --progress thread
