#!/usr/bin/env bash
# One channels-last ResNet-18 training step on the emulated device, per mode, through the
# coalescing census (MTEMU_COALESCE_CENSUS, test/cuda_emu/mtemu_coalesce.h): every kernel the
# step launches must touch at most 1/0.95 of the ideal 32-byte sectors per warp access. The
# kernels that mixtape runs itself (elementwise, pooling, batch norm, reductions, the
# optimizer) were uncoalesced on channels-last tensors once, which cost ResNet-50 tens of ms
# per step on an H200; this keeps them coalesced without a GPU. (Convolutions and cuDNN's
# batch norm run in the fake cuDNN, on the host: not counted.) One step is the difference
# between a run of 2 steps and one of 1. Exit 77 (skip) in a build without the census.
# Usage: check_coalescing.sh RESNET_AMP
set -uo pipefail
exe=$(realpath "$1") || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
status=0
for mode in fp32 o1-bf16 o2-fp16; do
    for steps in 1 2; do
        MTEMU_COALESCE_CENSUS=$tmp/$mode.$steps "$exe" --device cuda --arch resnet18 --batch 2 \
            --image-size 32 --classes 10 --steps "$steps" --warmup 0 --modes "$mode" --json \
            >"$tmp/out" 2>"$tmp/err" || {
            echo "FAIL: $mode, $steps step(s): $(cat "$tmp/err")"
            exit 1
        }
        if grep -q "needs kernels built with the race checker" "$tmp/err"; then
            echo "SKIP: no kernel instrumentation in this build"
            exit 77
        fi
    done
    python3 - "$mode" "$tmp/$mode.1" "$tmp/$mode.2" <<'PY' || status=1
import sys
mode, one, two = sys.argv[1:]
def read(path):
    rows = {}
    for line in open(path):
        f = line.split(None, 4)
        rows[f[4].strip()] = [int(x) for x in f[:3]]
    return rows
a, b = read(one), read(two)
step = {k: [b[k][i] - a.get(k, [0, 0, 0])[i] for i in range(3)] for k in b}
step = {k: v for k, v in step.items() if v[1] > 0}
sectors = sum(v[1] for v in step.values())
ideal = sum(v[2] for v in step.values())
print(f"{mode}: one step, {len(step)} kernels, {sectors} sectors for {ideal} ideal "
      f"({ideal / sectors:.3f})")
bad = 0
for k, (req, sec, idl) in sorted(step.items(), key=lambda kv: -kv[1][1]):
    ok = idl / sec >= 0.95
    bad += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {idl / sec:6.3f} {sec:10d} sectors {req:9d} requests  {k}")
sys.exit(1 if bad or not step else 0)
PY
done
exit $status
