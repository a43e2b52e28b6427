# shellcheck shell=bash
# shellcheck disable=SC2154 # python, built, logs, bdir, resnet_* (resnet_sample_limit too), digits_args: set by gpu_test.sh
# Sourced by tools/gpu_test.sh: ResNet training and the digits CNN on the GPU, with the
# helpers of gpu_lib.sh.
#   resnet-amp     samples/resnet_amp --device cuda --json (ResNet-18, every mode): finite
#                  losses, images/s
#   resnet-bench   bench/resnet --device cuda: ResNet-50 mixtape against PyTorch's
#                  channels_last AMP (issue 9's GPU goal: O2 FP16 images/s >= torch's)
#   digits-cnn     samples/digits_cnn --device cuda --amp o1: test accuracy >= 0.97
# MT_GPU_RESNET=0 skips them, leaving their time to the later steps; MT_GPU_RESNET_ARGS
# replaces bench/resnet's options.

# The "images_per_s" of each JSON line of samples/resnet_amp in LOG: "mode N img/s; ...".
resnet_sample_figures() {
    grep '^{' "$1" | sed -n 's/.*"mode": "\([^"]*\)".*"images_per_s": \([0-9.e+-]*\).*/\1 \2/p' |
        awk '{printf "%s%s %.1f img/s", (NR > 1 ? "; " : ""), $1, $2}'
}

# The value column of the bench/resnet ratio row starting with LABEL in LOG, or "-".
resnet_ratio() {
    local v
    v=$(grep -m1 -F "| $2 |" "$1" | awk -F'|' '{print $3}' | tr -d ' ')
    echo "${v:--}"
}

# The images/s of IMPL (mixtape or torch) in mode LABEL of the bench/resnet table in LOG, or "-".
resnet_ips() {
    local v
    v=$(grep -E "^\| $2[ |]" "$1" | grep -m1 -F "| $3 |" | awk -F'|' '{print $5}' | tr -d ' ')
    echo "${v:--}"
}

# ResNet-18, every mode: does it train (finite losses), and how fast.
resnet_sample() {
    local log=$1 t rc=0 figs
    echo "### samples/resnet_amp --device cuda --json (${resnet_sample_label})" >>"$log"
    t=$(limit "$resnet_sample_limit" 200)
    run_logged "$log" "$t" "$bdir/samples/resnet_amp" --device cuda --json "${resnet_sample_args[@]}" ||
        rc=$?
    figs=$(resnet_sample_figures "$log")
    if ((rc == 0)) && [[ $(grep -c '^{' "$log") -ge 4 ]] && ! grep '^{' "$log" | grep -F '"loss": null' >/dev/null; then
        record PASS resnet-amp "$(emu_tag)${resnet_sample_label}: $figs"
    else
        record FAIL resnet-amp "rc $rc$(timed_out "$rc"): ${figs:-$(grep -v '^\$' "$log" | tail -n 1 | head -c 200)}"
    fi
}

# mixtape against torch: issue 9's GPU goal.
resnet_bench() {
    local log=$1 t rc=0 mark figures why
    local blog=$logs/resnet-bench.log
    t=$(limit 200 170)
    if ((t < 60)); then
        # a run cut short by its timeout would only say FAIL: say why instead
        record "NOT RUN" resnet-bench "$t s for it (needs 60; MT_GPU_BUDGET_S raises the budget)"
        return
    fi
    echo "### bench/resnet --device cuda" >>"$log"
    mark=$(wc -l <"$log")
    # shellcheck disable=SC2086 # extra options split on spaces on purpose
    run_logged "$log" "$t" "$bdir/bench/resnet" --device cuda --python "$python" \
        ${MT_GPU_RESNET_ARGS:---arch resnet50 --batch 128 --image-size 224 --steps 20 --warmup 5} ||
        rc=$?
    tail -n +"$((mark + 1))" "$log" >"$blog"
    grep -v '^round ' "$blog" | tail -n 40
    figures="O2 FP16 mixtape/torch-AMP images/s $(resnet_ratio "$blog" 'mixtape AMP-O2 FP16 / torch AMP FP16 (autocast + GradScaler)')"
    figures+=" (mixtape $(resnet_ips "$blog" mixtape 'AMP-O2 FP16 master weights'),"
    figures+=" torch AMP $(resnet_ips "$blog" torch 'AMP-O1 FP16')); "
    figures+="FP32 $(resnet_ratio "$blog" 'mixtape FP32 / torch FP32'), O1 FP16 $(resnet_ratio "$blog" 'mixtape AMP-O1 FP16 / torch AMP FP16'), "
    figures+="O1 BF16 $(resnet_ratio "$blog" 'mixtape AMP-O1 BF16 / torch BF16 autocast'); "
    figures+=$(grep -m1 '^Goal' "$blog" || echo 'no goal line')
    why=$(sed -n 's/^The PyTorch side is unavailable here (\(.*\)): .*/\1/p' "$blog" | head -n 1)
    if ((rc != 0)); then
        record FAIL resnet-bench "rc $rc$(timed_out "$rc"); $figures"
    elif [[ -n "$why" ]] || grep -q '^The PyTorch side is unavailable' "$blog"; then
        # mixtape's rows alone compare nothing: the goal was not measured
        record "NOT RUN" resnet-bench "torch: ${why:-unavailable}; $figures"
    else
        record PASS resnet-bench "$figures"
    fi
}

# A real data set through convolutions, pooling, dropout and FP16 autocast on the GPU.
digits_cnn() {
    local log=$1 t rc=0 acc digits=$bdir/samples/digits_cnn data
    data=$(dirname "$digits")/digits.txt
    if [[ ! -s "$data" ]]; then
        record "NOT RUN" digits-cnn "no $data (written at build time by tools/dump_digits.py: needs python3-sklearn)"
        return
    fi
    t=$(limit 90 130)
    if ((t == 0)); then record "NOT RUN" digits-cnn "no time left"; return; fi
    echo "### samples/digits_cnn --device cuda --amp o1 --json" >>"$log"
    run_logged "$log" "$t" "$digits" --device cuda --amp o1 --json "${digits_args[@]}" || rc=$?
    acc=$(grep '"test_accuracy"' "$log" | tail -n 1 | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
    if ((rc == 0)) && [[ -n "$acc" ]] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.97) }'; then
        record PASS digits-cnn "$(emu_tag)O1 FP16 on cuda: test_accuracy $acc (>= 0.97)"
    else
        record FAIL digits-cnn "O1 FP16 on cuda: rc $rc$(timed_out "$rc"); test_accuracy ${acc:-none} (needs >= 0.97)"
    fi
}

step_resnet() {
    note "resnet (ResNet training and the digits CNN on the GPU)"
    local log=$logs/resnet.log
    if [[ "${MT_GPU_RESNET:-1}" == 0 ]]; then record "NOT RUN" resnet "MT_GPU_RESNET=0"; return; fi
    if ! $built; then record "NOT RUN" resnet "no build"; return; fi
    if (($(limit 60 200) < 20)); then record "NOT RUN" resnet "$(left) s left: too little for ResNet"; return; fi
    resnet_sample "$log"
    resnet_bench "$log"
    digits_cnn "$log"
}
