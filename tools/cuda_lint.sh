#!/usr/bin/env bash
# Kernel sources must stay inside what the emulated device runs (src/cuda/cuda_compat.h):
# launches only through MT_LAUNCH, shared memory only through MT_SHARED / MT_DYN_SHARED, and
# none of the device features the emulator does not model; and no grid.y / grid.z, whose
# 65,535 limit realistic sizes exceed (the emulator checks the limit only at the sizes tests
# use). nvcc would accept all of these,
# and CI would then test code that no GPU-less machine can run. Exit status 1 on a finding.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
status=0
# pattern|why
rules=(
    '<<<|launch through MT_LAUNCH'
    '__shared__|use MT_SHARED / MT_DYN_SHARED'
    '\basm\b|asm volatile|inline PTX is not emulated'
    '__ldg|__ldg is not emulated'
    'wmma::|\bmma\.|wgmma|tensor-core instructions are not emulated (use cuBLAS)'
    'cp\.async|__pipeline|cuda::memcpy_async|asynchronous copies are not emulated'
    'cooperative_groups|grid-wide sync is not emulated'
    '__expf|__logf|__sinf|__cosf|__powf|__fdividef|rsqrtf|CUDA-only math intrinsics: use src/math'
    '(blockIdx|gridDim)\.[yz]\b|grid.y and grid.z stop at 65535 on a GPU (rows or batches of realistic size pass that): use grid.x and a grid-stride loop'
)
for f in "$root"/src/cuda/*.cu "$root"/src/cuda/*.cuh; do
    [[ -f "$f" ]] || continue
    for rule in "${rules[@]}"; do
        pattern=${rule%|*}
        why=${rule##*|}
        # comments are allowed to name these
        hits=$(grep -nE "$pattern" "$f" | grep -vE '^[0-9]+:\s*(//|/\*|\*)')
        if [[ -n "$hits" ]]; then
            while IFS= read -r h; do echo "${f#"$root"/}:$h: $why"; done <<<"$hits"
            status=1
        fi
    done
done
[[ $status -eq 0 ]] && echo "cuda_lint: src/cuda kernels use only what the emulated device models"
exit $status
