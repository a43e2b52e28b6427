# shellcheck shell=bash
# shellcheck disable=SC2154 # python, root, built, logs, bdir: set by tools/gpu_test.sh
# Sourced by tools/gpu_test.sh: the step that measures issue 6's two remaining GPU goals, with
# that script's helpers (note, record, limit, left, run_logged) and variables (bdir, logs,
# python, built).
#   gemm         bench/gemm --device cuda: mixtape's FP16/BF16 GEMMs (4096^3 and SimpleNet's
#                forward and two backward shapes) against cublasGemmEx on the same operands,
#                torch.matmul beside them; goal >= 0.60 of cuBLAS's rate (FP32: information)
#   op-overhead  bench/op_overhead --device cuda: host time per call of tiny ops on the GPU
#                against torch's; goal <= 0.5x torch's
# Summary lines come from the benches' JSON (tools/gpu_bench_summary.py). About 60 s in all;
# NOT RUN when less is left than the later steps keep. Environment: MT_GPU_GEMM_ARGS,
# MT_GPU_OVERHEAD_ARGS (extra options, split on spaces; --tiny --iters 2 --reps 1 and
# --iters 10 --reps 1 make a dry run on the emulated device).

# gpu_bench_run NAME LOG SECONDS CMD...: runs a bench under the time limit, then records the
# summary lines its JSON gives, and a FAIL when it exited non-zero.
gpu_bench_run() {
    local name=$1 blog=$2 secs=$3 rc=0 status check detail
    shift 3
    run_logged "$blog" "$secs" "$@" || rc=$?
    grep -v '^{' "$blog" | tail -n 24
    while IFS=$'\t' read -r status check detail; do
        record "$status" "$check" "$detail"
    done < <("$python" "$root/tools/gpu_bench_summary.py" "$name" "$blog" 2>&1)
    if ((rc != 0)); then
        record FAIL "$name" "rc $rc$( ((rc == 124)) && echo ' (timed out)'): $(grep -v '^[{$|]' "$blog" | tail -n 1 | head -c 200)"
    fi
}

step_gpubench() {
    note "gpubench (GEMMs against cuBLAS, tiny-op host time against torch)"
    local t
    if ! $built; then
        record "NOT RUN" gemm "no build"
        record "NOT RUN" op-overhead "no build"
        return
    fi
    # keeps what the bench step keeps for the later steps (150 s): these goals come before
    # ResNet's (issue 9), which says NOT RUN itself when too little is left
    t=$(limit 35 150)
    if ((t < 20)); then
        record "NOT RUN" gemm "$(left) s left: too little (needs 20 s beyond the later steps' share)"
    else
        # shellcheck disable=SC2086 # extra options split on spaces on purpose
        gpu_bench_run gemm "$logs/gemm.log" "$t" "$bdir/bench/gemm" --device cuda \
            --python "$python" ${MT_GPU_GEMM_ARGS:-}
    fi
    t=$(limit 25 140)
    if ((t < 15)); then
        record "NOT RUN" op-overhead "$(left) s left: too little (needs 15 s beyond the later steps' share)"
    else
        # shellcheck disable=SC2086 # extra options split on spaces on purpose
        gpu_bench_run op-overhead "$logs/op-overhead.log" "$t" "$bdir/bench/op_overhead" \
            --device cuda --python "$python" ${MT_GPU_OVERHEAD_ARGS:---iters 2000 --reps 5}
    fi
}
