# shellcheck shell=bash
# shellcheck disable=SC2154 # python, built, logs, bdir, root: set by tools/gpu_test.sh
# Sourced by tools/gpu_test.sh: where a ResNet-50 training step spends its GPU time, mixtape's
# beside torch's, with the helpers of gpu_lib.sh. Not in the default run (its time goes to the
# checks); MT_GPU_STEPS="deps build profile" runs it.
#   profile   ncu (one metric: each kernel's duration) over samples/resnet_amp --arch resnet50
#             --modes o1-fp16 (then o1-bf16, time allowing), read by `gpu_parse.py breakdown`:
#             ms per step per kind of kernel and the costliest kernels; torch's same step
#             kernel by kernel (tools/gpu_torch_profile.py, CUPTI); and mixtape's images/s with
#             cuDNN's heuristics against its timed search (MT_CUDNN_FIND=1). Lines INFO: figures
#             to steer the work, not checks. MT_GPU_PROFILE_ARGS replaces the sizes (default
#             --arch resnet50 --batch 128 --image-size 224).

# "kind ms; kind ms; ..." from the first six kinds of a breakdown (gpu_parse.py's table).
kinds_line() {
    sed -n '3,8p' "$1" | awk '{l = $1; for (i = 2; i <= NF - 3; i++) l = l " " $i;
        printf "%s%s %s ms", (NR > 1 ? "; " : ""), l, $(NF - 2)}'
}

# One mode of mixtape's ResNet under ncu; the breakdown goes to the log and its first kinds
# to an INFO line.
profile_mixtape() {
    local mode=$1 t=$2 csv=$logs/profile-$1.csv log=$logs/profile.log rc=0
    # shellcheck disable=SC2206 # extra options split on spaces on purpose
    local sizes=(${MT_GPU_PROFILE_ARGS:---arch resnet50 --batch 128 --image-size 224})
    echo "### ncu: resnet_amp ${sizes[*]} --modes $mode --steps 2 --warmup 1" >>"$log"
    timeout -k 10 "$t" ncu --target-processes all --metrics gpu__time_duration.sum --csv \
        --launch-count 6000 "$bdir/samples/resnet_amp" --device cuda "${sizes[@]}" \
        --modes "$mode" --steps 2 --warmup 1 --json >"$csv" 2>>"$log" || rc=$?
    # the two steps, model set-up included: the first step also holds one-time work
    "$python" "$root/tools/gpu_parse.py" breakdown "$csv" 2 >"$logs/profile-$mode.txt" 2>&1
    cat "$logs/profile-$mode.txt" >>"$log"
    head -n 12 "$logs/profile-$mode.txt"
    local kinds
    kinds=$(kinds_line "$logs/profile-$mode.txt")
    record INFO "profile-$mode" "mixtape ResNet-50 $mode under ncu (rc $rc$(timed_out "$rc")): $(head -n 1 "$logs/profile-$mode.txt" | cut -c1-90); $kinds"
}

# images/s of samples/resnet_amp (one mode) with the given environment.
profile_ips() {
    local t=$1 mode=$2 log=$logs/profile.log out
    shift 2
    # shellcheck disable=SC2206 # extra options split on spaces on purpose
    local sizes=(${MT_GPU_PROFILE_ARGS:---arch resnet50 --batch 128 --image-size 224})
    out=$(timeout -k 10 "$t" env "$@" "$bdir/samples/resnet_amp" --device cuda "${sizes[@]}" \
        --modes "$mode" --steps 10 --warmup 3 --json 2>>"$log")
    echo "$* $mode: $out" >>"$log"
    echo "$out" | grep '^{' | sed -n 's/.*"images_per_s": \([0-9.e+-]*\).*/\1/p' | head -n 1
}

step_profile() {
    note "profile (where a ResNet-50 step spends its GPU time)"
    local t
    if ! $built; then record "NOT RUN" profile "no build"; return; fi
    if rehearsing; then record "NOT RUN" profile "rehearsal: needs a GPU, ncu and torch"; return; fi
    if ! have ncu; then record "NOT RUN" profile "no ncu"; return; fi
    t=$(limit 120 30)
    ((t >= 30)) && profile_mixtape o1-fp16 "$t"
    t=$(limit 60 30)
    if ((t >= 20)); then
        echo "### torch" >>"$logs/profile.log"
        if timeout -k 10 "$t" "$python" "$root/tools/gpu_torch_profile.py" --mode o1-fp16 \
            >"$logs/profile-torch.txt" 2>>"$logs/profile.log"; then
            cat "$logs/profile-torch.txt" >>"$logs/profile.log"
            head -n 12 "$logs/profile-torch.txt"
            record INFO profile-torch "$(head -n 1 "$logs/profile-torch.txt" | cut -c1-100); $(kinds_line "$logs/profile-torch.txt")"
        else
            record INFO profile-torch "tools/gpu_torch_profile.py failed: $(tail -n 1 "$logs/profile.log" | head -c 200)"
        fi
    fi
    t=$(limit 40 30)
    if ((t >= 20)); then
        local heur find
        heur=$(profile_ips "$t" o1-fp16 MT_CUDNN_FIND=0)
        t=$(limit 60 20)
        find=$(profile_ips "$t" o1-fp16 MT_CUDNN_FIND=1)
        record INFO profile-cudnn "ResNet-50 o1-fp16 images/s: cuDNN heuristics ${heur:--}, timed search (MT_CUDNN_FIND=1) ${find:--}"
    fi
    t=$(limit 120 20)
    ((t >= 30)) && profile_mixtape o1-bf16 "$t"
    return 0
}
