#!/usr/bin/env bash
# The samples' --save/--resume: a run of N steps and a run of N/2 steps saved and resumed for
# N/2 more write byte-identical checkpoints (same parameters, optimizer and scaler state, bit
# for bit). Usage: check_sample_resume.sh TRAIN_MLP SIMPLENET_AMP (run by meson test).
set -euo pipefail
mlp=$1 simplenet=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for p in fp16 bf16 fp32; do
    "$mlp" "$p" --steps 40 --save "$dir/whole" >/dev/null
    "$mlp" "$p" --steps 20 --save "$dir/half" >/dev/null
    "$mlp" "$p" --steps 20 --resume "$dir/half" --save "$dir/resumed" >/dev/null
    cmp "$dir/whole" "$dir/resumed"
    echo "train_mlp $p: resumed checkpoint identical to the uninterrupted one"
done
for m in fp32 o1-fp16 o2-fp16 o1-bf16; do
    a=(--device cpu --hidden 32 --batch 8 --steps 3 --modes "$m")
    "$simplenet" "${a[@]}" --epochs 2 --save "$dir/whole" >/dev/null
    "$simplenet" "${a[@]}" --epochs 1 --save "$dir/half" >/dev/null
    "$simplenet" "${a[@]}" --epochs 1 --resume "$dir/half" --save "$dir/resumed" >/dev/null
    cmp "$dir/whole" "$dir/resumed"
    echo "simplenet_amp $m: resumed checkpoint identical to the uninterrupted one"
done
