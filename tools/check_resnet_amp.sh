#!/usr/bin/env bash
# samples/resnet_amp smoke test: ResNet-18 at a tiny size (and ResNet-50 in two modes) on the
# CPU, every mode. Each mode must print one well-formed JSON line with images_per_s > 0, a
# finite first and last loss, the last below the first (three steps on the one synthetic
# batch: the network must be learning it), and no step skipped by the GradScaler.
# Usage: check_resnet_amp.sh RESNET_AMP.
set -euo pipefail
exe=$1
fail=0

# value KEY LINE: the number after "KEY": in a flat JSON line (empty when absent)
value() { sed -n "s/.*\"$1\": \([-+0-9.eE]*\|null\)[,}].*/\1/p" <<<"$2"; }

run() { # ARCH MODES [OPTIONS]: runs and checks every line
    local arch=$1 modes=$2
    shift 2
    local out
    out=$("$exe" --json --device cpu --threads 1 --arch "$arch" --modes "$modes" \
        --image-size 32 --batch 4 --classes 10 --steps 3 --warmup 1 "$@")
    echo "$out"
    local n_lines n_modes
    n_lines=$(grep -c . <<<"$out" || true)
    n_modes=$(tr ',' '\n' <<<"$modes" | grep -c .)
    if [ "$n_lines" != "$n_modes" ]; then
        echo "FAIL: $arch: $n_lines output line(s) for $n_modes mode(s)"
        fail=1
    fi
    for m in ${modes//,/ }; do
        local line
        line=$(grep "\"mode\": \"$m\"" <<<"$out" || true)
        if ! [[ "$line" =~ ^\{.*\}$ ]]; then
            echo "FAIL: $arch $m: no JSON line"
            fail=1
            continue
        fi
        local ips first last skipped
        ips=$(value images_per_s "$line")
        first=$(value loss_first "$line")
        last=$(value loss "$line")
        skipped=$(value skipped "$line")
        if awk -v i="$ips" -v f="$first" -v l="$last" -v s="$skipped" 'BEGIN {
                ok = i != "" && i != "null" && i + 0 > 0 && f != "" && f != "null" &&
                     l != "" && l != "null" && l + 0 < f + 0 && s == "0"
                exit !ok }'; then
            echo "ok: $arch $m: $ips images/s, loss $first -> $last"
        else
            echo "FAIL: $arch $m: images_per_s=$ips loss_first=$first loss=$last skipped=$skipped"
            fail=1
        fi
    done
}

run resnet18 fp32,o1-fp16,o2-fp16,o1-bf16
# At this size ResNet-50's first gradients overflow FP16 at scale 1024 (the scaler skips
# steps until it has halved the scale enough) and lr 0.01 overshoots: FP32 and BF16, lr 1e-3.
run resnet50 fp32,o1-bf16 --lr 0.001
exit $fail
