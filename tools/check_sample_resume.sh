#!/usr/bin/env bash
# The samples' --save/--resume: a run of N steps and a run of N/2 steps saved and resumed for
# N/2 more write byte-identical checkpoints (same parameters, optimizer and scaler state, bit
# for bit). Then what they must refuse, each with a message and without training: bad numbers
# on the command line, an empty --modes, a --save path that cannot be written, a --resume
# file that cannot be read, a checkpoint whose step count is negative, not a number or too
# large; and --help on stdout, exit 0.
# Usage: check_sample_resume.sh TRAIN_MLP SIMPLENET_AMP (run by meson test).
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

# expect STATUS PATTERN CMD...: CMD exits with STATUS and its stderr matches PATTERN (grep -E);
# stdout has no training output (train_mlp's step and result lines, simplenet_amp's table rows).
expect() {
    local want=$1 pattern=$2 rc=0
    shift 2
    "$@" >"$dir/out" 2>"$dir/err" || rc=$?
    if ((rc != want)) || ! grep -Eq -- "$pattern" "$dir/err" || grep -Eq '^step |: loss |^(FP32|AMP-)' "$dir/out"; then
        echo "FAIL: $* exited $rc (expected $want, stderr matching '$pattern', no training):"
        cat "$dir/out" "$dir/err"
        exit 1
    fi
    echo "refused as expected: $* -> $rc: $(head -n 1 "$dir/err")"
}

# with_meta IN KEY VALUE OUT: the safetensors file IN with the metadata KEY set to VALUE (the
# header rewritten and padded to 8 bytes; the tensors' offsets count from its end).
with_meta() {
    local len header n
    len=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    header=$(head -c $((8 + len)) "$1" | tail -c "$len")
    header=$(sed -E "s/\"$2\":\"[^\"]*\"/\"$2\":\"$3\"/" <<<"$header" | sed -E 's/ +$//')
    while (((8 + ${#header}) % 8)); do header+=' '; done
    n=${#header}
    printf '%b' "$(printf '\\0%03o' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) 0 0 0 0 0)" >"$4"
    printf '%s' "$header" >>"$4"
    tail -c +$((9 + len)) "$1" >>"$4"
}

# --help: the usage on stdout, exit 0
for prog in "$mlp" "$simplenet"; do
    "$prog" --help >"$dir/out"
    grep -q '^usage:' "$dir/out"
done
echo "--help prints the usage on stdout and exits 0"

# train_mlp: strict numbers; a run whose loss did not fall says so
expect 2 'expected an integer' "$mlp" --steps 5abc
expect 2 'expected an integer' "$mlp" --steps ' 5'
expect 2 'expected an integer' "$mlp" --steps +5
expect 2 'expected an integer' "$mlp" --steps 99999999999
expect 2 'expected an integer' "$mlp" --steps 0
expect 2 'unknown' "$mlp" --stpes 5
"$mlp" --steps 1 >/dev/null 2>"$dir/err" && { echo "FAIL: train_mlp --steps 1 exited 0"; exit 1; }
grep -q 'did not fall' "$dir/err" || { echo "FAIL: train_mlp --steps 1: no reason"; cat "$dir/err"; exit 1; }
echo "train_mlp --steps 1 -> 1: $(cat "$dir/err")"
expect 2 'cannot write in directory' "$mlp" --save "$dir/missing/x"
expect 2 'is a directory' "$mlp" --save "$dir"
mkfifo "$dir/fifo" # refused up front: neither replaced by the save nor waited on by the load
expect 2 'not a regular file' "$mlp" --save "$dir/fifo"
expect 2 'not a regular file' "$mlp" --resume "$dir/fifo"
[[ -p $dir/fifo ]] || { echo "FAIL: --save replaced a FIFO"; exit 1; }
"$mlp" --steps 2 --save "$dir/mlp" >/dev/null
for bad in -100 abc 2147483647 99999999999999999999999; do
    with_meta "$dir/mlp" step "$bad" "$dir/bad"
    expect 1 'not a step count' "$mlp" --steps 2 --resume "$dir/bad"
done
with_meta "$dir/mlp" step 2 "$dir/good" # the rewriting itself keeps a loadable file
"$mlp" --steps 2 --resume "$dir/good" >/dev/null

# simplenet_amp: an empty mode list, too many steps, a bad --save or --resume path, bad
# steps_done
a=(--device cpu --hidden 8 --batch 2 --steps 2 --epochs 1)
expect 2 'at least one' "$simplenet" "${a[@]}" --modes ''
expect 2 'at least one' "$simplenet" "${a[@]}" --modes ,
expect 2 'steps; at most' "$simplenet" --device cpu --steps 65536 --epochs 65536
expect 2 'cannot write in directory' "$simplenet" "${a[@]}" --modes fp32 --save "$dir/missing/x"
# a --resume file that cannot be read: refused before the table's header
expect 2 'No such file' "$simplenet" "${a[@]}" --modes fp32 --resume "$dir/missing.st"
[[ ! -s $dir/out ]] || { echo "FAIL: simplenet_amp printed before refusing --resume:"; cat "$dir/out"; exit 1; }
expect 2 'is a directory' "$simplenet" "${a[@]}" --modes fp32 --resume "$dir"
"$simplenet" "${a[@]}" --modes fp32 --save "$dir/net" >/dev/null
for bad in -7 zz 99999999999999999999999; do
    with_meta "$dir/net" steps_done "$bad" "$dir/bad"
    expect 1 'not a step count' "$simplenet" "${a[@]}" --modes fp32 --resume "$dir/bad"
done
with_meta "$dir/net" steps_done 2 "$dir/good"
"$simplenet" "${a[@]}" --modes fp32 --resume "$dir/good" >/dev/null
