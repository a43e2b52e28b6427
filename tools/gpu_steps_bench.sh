# shellcheck shell=bash
# shellcheck disable=SC2154 # python, root, built, logs, bdir, sample_args: set by tools/gpu_test.sh
# Sourced by tools/gpu_test.sh: the SimpleNet and kernel benchmarks, with the helpers of
# gpu_lib.sh.
#   sample       samples/simplenet_amp --device cuda (the AMP guide's sizes)
#   bench        bench/simplenet --device cuda: mixtape against PyTorch on this GPU
#   gemm         bench/gemm --device cuda: mixtape's FP16/BF16 GEMMs (4096^3 and SimpleNet's
#                forward and two backward shapes) against cublasGemmEx on the same operands,
#                torch.matmul beside them; goal >= 0.60 of cuBLAS's rate (FP32: information)
#   op-overhead  bench/op_overhead --device cuda: host time per call of tiny ops on the GPU
#                against torch's; goal <= 0.5x torch's
# gemm and op-overhead (issue 6's two remaining GPU goals) take their summary lines from the
# benches' JSON (tools/gpu_bench_summary.py); about 60 s in all; NOT RUN when less is left
# than the later steps keep. Environment: MT_GPU_BENCH_ARGS, MT_GPU_GEMM_ARGS,
# MT_GPU_OVERHEAD_ARGS (extra options, split on spaces; the rehearsal's defaults are tiny).

# Why torch did not run in LOG's bench/simplenet output: the first torch row that failed in
# the table ("torch 1.13 sees no CUDA device"), else the message of a torch child that failed
# before any row ("ModuleNotFoundError: ..."), else nothing.
torch_failure() {
    local why
    why=$(grep -m1 -E '^\| torch \| [^|]* \| failed: ' "$1" | sed 's/^[^|]*|[^|]*|[^|]*| failed: \([^|]*\)|.*/\1/;s/ *$//')
    [[ -z "$why" ]] && why=$(sed -n 's/^simplenet bench: torch .*exit status [0-9]*: //p' "$1" | head -n 1)
    echo "$why"
}

step_bench() {
    note "bench (SimpleNet on the GPU)"
    local log=$logs/bench.log t
    if ! $built; then record "NOT RUN" bench "no build"; return; fi
    local sample=$bdir/samples/simplenet_amp bench=$bdir/bench/simplenet
    t=$(limit 60 200)
    if ((t == 0)); then record "NOT RUN" bench "no time left"; return; fi
    local rc=0
    echo "### samples/simplenet_amp --device cuda (the AMP guide's sizes)" >>"$log"
    run_logged "$log" "$t" "$sample" --device cuda "${sample_args[@]}" || rc=$?
    if ((rc == 0)); then
        # Table rows: label words, then ms/step, loss, speedup, peak MiB, skipped, syncs/step.
        record PASS sample "$(emu_tag)simplenet_amp --device cuda: $(grep -E '^(FP32|AMP-O1 FP16) ' "$log" |
            awk '{l = $1; for (i = 2; i <= NF - 6; i++) l = l " " $i
                  printf "%s %s ms/step, %s MiB peak, %s syncs/step; ", l, $(NF-5), $(NF-2), $NF}')"
    else
        record FAIL sample "simplenet_amp --device cuda: rc $rc$(timed_out "$rc"): $(grep -v '^\$' "$log" | tail -n 1 | head -c 200)"
    fi
    t=$(limit 180 150)
    if ((t == 0)); then record "NOT RUN" bench "no time left"; return; fi
    rc=0
    echo "### bench/simplenet --device cuda" >>"$log"
    # shellcheck disable=SC2086 # extra options split on spaces on purpose
    run_logged "$log" "$t" "$bench" --device cuda --python "$python" ${MT_GPU_BENCH_ARGS:---repeat 1} ||
        rc=$?
    sed -n '/^### bench/,$p' "$log" | grep -v '^round ' | tail -n 40
    local r1 r2 r3 why
    r1=$(grep -m1 'ms/step mixtape / torch, FP32 ' "$log" | awk -F'|' '{print $3}' | tr -d ' ')
    r2=$(grep -m1 'ms/step mixtape / torch, AMP-O1 FP16 ' "$log" | awk -F'|' '{print $3}' | tr -d ' ')
    r3=$(grep -m1 'mixtape AMP-O1 FP16 speedup' "$log" | awk -F'|' '{print $3}' | tr -d ' ')
    local figures="mixtape/torch ms: FP32 ${r1:--}, O1-FP16 ${r2:--}; mixtape O1-FP16 speedup over FP32 ${r3:--}"
    why=$(torch_failure "$log")
    if ((rc == 0)); then
        record PASS bench "$figures"
    elif [[ -n "$why" ]] && ! grep -q -E '^\| mixtape \| [^|]* \| failed' "$log" && [[ "$r3" != - ]]; then
        # bench/simplenet exits 1 when a mode did not run on either side: here only torch's,
        # so there is nothing to compare with, which is not mixtape failing
        record "NOT RUN" bench "torch: $why; $figures"
    else
        record FAIL bench "rc $rc$(timed_out "$rc"); $figures"
    fi
}

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
        record FAIL "$name" "rc $rc$(timed_out "$rc"): $(grep -v '^[{$|]' "$blog" | tail -n 1 | head -c 200)"
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
