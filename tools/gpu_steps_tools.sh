# shellcheck shell=bash
# shellcheck disable=SC2154 # root, logs, bdir, python, built, jobs_max: set by tools/gpu_test.sh
# Sourced by tools/gpu_test.sh: the steps that run NVIDIA's tools, with the helpers of
# gpu_lib.sh. Each reads its tool's output in one verdict function (prints "STATUS<tab>DETAIL")
# that the rehearsal also feeds captured outputs (tools/fixtures/gpu, check_fixtures).
#   sass        cuobjdump -res-usage and -sass over the kernel objects: local memory
#   sanitizer   compute-sanitizer memcheck, racecheck, synccheck, initcheck over the test
#               programs with MT_TEST_DEVICE=cuda (rehearsal: a stand-in that only runs them)
#   ncu         the GEMM kernels of an FP16 training run by name: tensor cores or not

# sass_verdict RES SASS LOG: the verdict on cuobjdump's output (RES: -res-usage, SASS: -sass,
# one "### object" line before each object's); the parser's table goes to LOG.
sass_verdict() {
    local res=$1 sass=$2 log=$3 s nobj why
    "$python" "$root/tools/gpu_parse.py" sass "$res" "$sass" >"$log" 2>&1
    nobj=$(grep -c '^### ' "$res")
    s=$(grep '^SUMMARY' "$log" | tail -n 1)
    # cuobjdump -sass needs nvdisasm: without it every object says "fatal" and no LDL/STL is
    # ever counted, which must not pass for a clean kernel
    why=$(grep -m1 'cuobjdump fatal' "$sass" | sed 's/  *: */: /' | head -c 160)
    if [[ -z "$s" ]]; then
        printf 'FAIL\tcould not read cuobjdump output (see sass.log)\n'
    elif ! grep -q 'Function : ' "$sass"; then
        printf 'FAIL\t%s objects; %s; SASS not read (%s): LDL/STL not counted\n' "$nobj" \
            "${s#SUMMARY }" "${why:-no Function in cuobjdump -sass}"
    elif [[ "$s" == *"with_local_memory=0 "* ]]; then
        printf 'PASS\t%s objects; %s\n' "$nobj" "${s#SUMMARY }"
    else
        printf 'FAIL\t%s objects; %s (see sass.log)\n' "$nobj" "${s#SUMMARY }"
    fi
}
fixture_verdict_sass() { sass_verdict "$1/res-usage.txt" "$1/sass.txt" "$1/sass.log"; }

step_sass() {
    note "sass (local memory in the kernels)"
    local log=$logs/sass.log
    rehearsing && check_fixtures sass
    if ! $built; then record "NOT RUN" sass "no build"; return; fi
    if ! have cuobjdump; then record "NOT RUN" sass "no cuobjdump"; return; fi
    local objs=() o
    while IFS= read -r o; do
        # Only objects with device code (the kernels built by nvcc).
        if output_has 'ELF file' timeout 20 cuobjdump -lelf "$o"; then objs+=("$o"); fi
    done < <(find "$bdir" -name '*.o' 2>/dev/null | sort)
    if ((${#objs[@]} == 0)); then
        record "NOT RUN" sass "no object with device code under $bdir"
        return
    fi
    local res=$logs/sass-res-usage.txt sass=$logs/sass-dump.txt status detail
    : >"$res"
    : >"$sass"
    for o in "${objs[@]}"; do
        { echo "### $o"; timeout 60 cuobjdump -res-usage "$o" 2>&1; } >>"$res"
        { echo "### $o"; timeout 60 cuobjdump -sass "$o" 2>&1; } >>"$sass"
    done
    IFS=$'\t' read -r status detail < <(sass_verdict "$res" "$sass" "$log")
    # The whole SASS (150 MB, 11 MB packed, for these kernels) would crowd out of what the
    # device tool brings back (16 MiB a file) every other log: keep the lines the verdict read.
    grep -E '^### |arch = |Function : |fatal|\b(LDL|STL)' "$sass" >"$logs/sass-ldst.txt"
    rm -f "$sass"
    cat "$log"
    record "$status" sass "$detail"
}

# san_verdict TOOL DIR LAUNCHED SKIPPED PROGRAM...: the verdict on one compute-sanitizer tool
# over the programs, from DIR/san-TOOL-PROGRAM.log and its .rc (exit status; removed). Errors
# come from "ERROR SUMMARY: N error(s)"; a program without that line did not finish under the
# tool (timeout, crash).
san_verdict() {
    local tool=$1 dir=$2 launched=$3 skipped=$4
    shift 4
    local errors=0 with_errors=() failed=() timedout=() nosummary=() name log rc n
    local refused=0 why=''
    for name in "$@"; do
        log=$dir/san-$tool-$name.log
        [[ -f "$log" ]] || continue
        rc=$(cat "$log.rc" 2>/dev/null || echo '?')
        # The tool itself refusing the GPU (gVisor machines: "Device not supported") says
        # nothing about mixtape: NOT RUN when it refused every program.
        if grep -q -E '^=+ .*(Device not supported|not supported on this platform)' "$log"; then
            refused=$((refused + 1))
            [[ -n "$why" ]] || why=$(grep -m1 -E '^=+ .*(Device not supported|not supported on this platform)' "$log" |
                sed 's/^=* *//' | head -c 160)
        fi
        n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
        if [[ -z "$n" ]]; then
            nosummary+=("$name")
        elif ((n > 0)); then
            errors=$((errors + n))
            with_errors+=("$name:$n")
        fi
        [[ "$rc" == 124 || "$rc" == 137 ]] && timedout+=("$name")
        [[ "$rc" != 0 && "$rc" != 124 && "$rc" != 137 ]] && failed+=("$name(rc $rc)")
        rm -f "$log.rc"
    done
    local detail="$errors errors in $launched/$# programs"
    ((${#with_errors[@]})) && detail+="; errors: ${with_errors[*]}"
    ((${#failed[@]})) && detail+="; exit status != 0: ${failed[*]}"
    ((${#timedout[@]})) && detail+="; timed out: ${timedout[*]}"
    ((${#nosummary[@]})) && detail+="; no summary: ${nosummary[*]}"
    ((skipped)) && detail+="; $skipped not run (time)"
    if ((launched > 0 && refused == launched)); then
        printf 'NOT RUN\tcompute-sanitizer refused the device (%s) in %s/%s programs\n' "$why" "$refused" "$#"
    elif ((errors > 0 || ${#failed[@]} > 0)); then
        printf 'FAIL\t%s\n' "$detail"
    elif ((launched == 0)); then
        printf 'NOT RUN\t%s\n' "$detail"
    else
        printf 'PASS\t%s\n' "$detail"
    fi
}
# A fixture case: the memcheck logs (and .rc files) of its programs, all launched.
fixture_verdict_sanitizer() {
    local names=() f
    for f in "$1"/san-memcheck-*.log; do
        f=${f##*/san-memcheck-}
        names+=("${f%.log}")
    done
    san_verdict memcheck "$1" "${#names[@]}" 0 "${names[@]}"
}

# san_run TOOL SECONDS PROGRAM...: each program under the tool, at most jobs_max at a time,
# each stopped at the deadline; prints "launched skipped".
san_run() {
    local tool=$1 share=$2 p q name t
    shift 2
    local deadline=$((SECONDS + share)) running=() launched=0 skipped=0 extra=()
    output_has '--require-cuda-init' "$san_cmd" --help &&
        extra+=(--require-cuda-init no)
    # Not the failed CUDA calls: mixtape checks every status itself (its tests cover the
    # errors), and those seen on the H200 were the tests' out-of-memory cases on purpose and
    # NCCL's own probes (cudaFuncGetAttributes inside ncclCommInitRank).
    output_has '--report-api-errors' "$san_cmd" --help &&
        extra+=(--report-api-errors no)
    for p in "$@"; do
        while ((${#running[@]} >= jobs_max)); do
            local still=()
            for q in "${running[@]}"; do
                if kill -0 "$q" 2>/dev/null; then still+=("$q"); else wait "$q" 2>/dev/null; fi
            done
            running=("${still[@]}")
            ((${#running[@]} >= jobs_max)) && sleep 0.2
        done
        t=$((deadline - SECONDS))
        if ((t < 5)); then
            skipped=$((skipped + 1))
            continue
        fi
        name=$(basename "$p")
        local log=$logs/san-$tool-$name.log
        (
            rc=0
            MT_TEST_DEVICE=cuda OMP_NUM_THREADS=2 timeout -k 5 "$t" "$san_cmd" \
                --tool "$tool" --print-limit 30 "${extra[@]}" "$p" >"$log" 2>&1 || rc=$?
            echo "$rc" >"$log.rc"
        ) &
        running+=("$!")
        launched=$((launched + 1))
    done
    for q in "${running[@]}"; do wait "$q" 2>/dev/null; done
    echo "$launched $skipped"
}

step_sanitizer() {
    note "compute-sanitizer"
    rehearsing && check_fixtures sanitizer
    if ! $built; then record "NOT RUN" sanitizer "no build"; return; fi
    san_cmd=compute-sanitizer
    local standin=false
    if ! have compute-sanitizer; then
        if ! rehearsing; then record "NOT RUN" sanitizer "no compute-sanitizer"; return; fi
        # runs each program and prints a clean ERROR SUMMARY: rehearses the scheduling and
        # the counting, checks nothing (so it never says PASS)
        san_cmd=$root/tools/fixtures/gpu/compute-sanitizer-standin
        standin=true
    fi
    local progs=() p only=${MT_GPU_SAN_PROGS:-}
    rehearsing && only=${MT_GPU_SAN_PROGS:-${MT_GPU_REHEARSE_SAN_PROGS:-test_empty test_tensor}}
    while IFS= read -r p; do
        [[ -z "$only" || " $only " == *" ${p##*/} "* ]] || continue
        progs+=("$p")
    done < <(find "$bdir/test" -maxdepth 1 -type f -name 'test_*' -executable 2>/dev/null | sort)
    if ((${#progs[@]} == 0)); then record "NOT RUN" sanitizer "no test programs"; return; fi
    # shellcheck disable=SC2206 # a list of names, split on spaces on purpose
    local tools=(${MT_GPU_SAN_TOOLS:-memcheck racecheck synccheck initcheck}) tool i names=() status detail
    for p in "${progs[@]}"; do names+=("$(basename "$p")"); done
    for i in "${!tools[@]}"; do
        tool=${tools[$i]}
        # Each tool gets an equal share of what is left, keeping 80 s for ncu and the end.
        local share=$((($(left) - 80) / (${#tools[@]} - i)))
        ((share > 150)) && share=150
        if ((share < 15)); then
            record "NOT RUN" "san-$tool" "no time left"
            continue
        fi
        local launched skipped
        read -r launched skipped < <(san_run "$tool" "$share" "${progs[@]}")
        IFS=$'\t' read -r status detail < <(san_verdict "$tool" "$logs" "$launched" "$skipped" "${names[@]}")
        if $standin && [[ "$status" == PASS ]]; then
            status="NOT RUN"
            detail="rehearsal: no compute-sanitizer; a stand-in ran the programs: $detail"
        fi
        if [[ "$tool" == initcheck && "$status" == FAIL ]] && ! $standin; then
            initcheck_control_verdict
            if [[ -n "$control_blind" ]]; then
                status=INFO
                detail="not attributable: $control_blind; mixtape's programs: $detail"
            fi
        fi
        record "$status" "san-$tool" "$detail"
    done
}

# initcheck_control_verdict: builds and runs tools/initcheck_control.cu (cuBLAS only, no
# mixtape) under initcheck; sets control_blind to why initcheck cannot judge reads of memory
# that cuBLAS wrote on this GPU, or empty when it can (or the control could not run).
control_blind=''
initcheck_control_verdict() {
    local log=$logs/san-initcheck-control.log exe=$logs/initcheck_control n
    control_blind=''
    if ! run_logged "$log" 120 nvcc -O2 -arch=native "$root/tools/initcheck_control.cu" -lcublas \
        -o "$exe"; then
        echo "initcheck control: could not build it (see $log)"
        return
    fi
    run_logged "$log" 120 "$san_cmd" --tool initcheck --print-limit 5 "$exe"
    n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
    grep -E 'GEMM|FAIL|ERROR SUMMARY' "$log"
    if [[ -n "$n" ]] && ((n > 0)) && grep -q 'agree' "$log"; then
        control_blind="initcheck reports $n uninitialized reads in tools/initcheck_control.cu, where cuBLAS wrote every byte read (it does not see cuBLAS's stores here)"
    fi
}

# ncu_verdict CSV LOG RC: the verdict on ncu's CSV (RC: ncu's exit status); the parser's
# table goes to the end of LOG.
ncu_verdict() {
    local csv=$1 log=$2 rc=$3 s why
    "$python" "$root/tools/gpu_parse.py" ncu "$csv" >>"$log" 2>&1
    s=$(grep '^SUMMARY' "$log" | tail -n 1)
    s=${s#SUMMARY }
    # ncu not allowed to read the counters (ERR_NVGPUCTRPERM) or not loading (gVisor machines:
    # "Failed to initialize the profiler"): the machine's limit, not mixtape's
    why=$(grep -h -m1 -E '^==ERROR== .*(ERR_NVGPUCTRPERM|Failed to initialize the profiler|LibraryNotLoaded)' \
        "$csv" "$log" 2>/dev/null | head -n 1 | head -c 160)
    if [[ -z "$s" || "$s" == "kernels=0 "* ]] && [[ -n "$why" ]]; then
        printf 'NOT RUN\tncu could not profile here: %s\n' "$why"
    elif [[ -z "$s" || "$s" == "kernels=0 "* ]]; then
        printf 'FAIL\tno kernels profiled (rc %s; see ncu.log)\n' "$rc"
    elif [[ "$s" == *"tensor_core_gemm_kernels=0" ]]; then
        printf 'FAIL\t%s: no tensor-core GEMM kernel in an FP16 run\n' "$s"
    else
        printf 'PASS\t%s\n' "$s"
    fi
}
fixture_verdict_ncu() { ncu_verdict "$1/ncu.csv" "$1/ncu.log" "$(cat "$1/rc")"; }

step_ncu() {
    note "ncu (GEMM kernel names of an FP16 run)"
    local log=$logs/ncu.log csv=$logs/ncu.csv t status detail
    rehearsing && check_fixtures ncu
    if ! $built; then record "NOT RUN" ncu "no build"; return; fi
    if ! have ncu; then record "NOT RUN" ncu "no ncu"; return; fi
    t=$(limit 90 20)
    if ((t == 0)); then record "NOT RUN" ncu "no time left"; return; fi
    local rc=0
    # Two small steps of O1 FP16 at the guide's sizes; one metric (the duration) per kernel.
    printf '$ ncu ... simplenet_amp --device cuda --modes o1-fp16\n' >"$log"
    timeout -k 10 "$t" ncu --target-processes all --metrics gpu__time_duration.sum --csv \
        --launch-count 400 "$bdir/samples/simplenet_amp" --device cuda --modes o1-fp16 \
        --steps 2 --epochs 1 --json >"$csv" 2>>"$log" || rc=$?
    IFS=$'\t' read -r status detail < <(ncu_verdict "$csv" "$log" "$rc")
    grep -v '^\$' "$log" | head -n 30
    record "$status" ncu "$detail"
}
