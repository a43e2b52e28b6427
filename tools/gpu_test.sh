#!/usr/bin/env bash
# Checks mixtape's CUDA backend on a machine with an NVIDIA GPU and nvcc, in one run, and writes
# every log and a summary.txt (one line per check: PASS / FAIL / NOT RUN and its figures) into
# one folder. Each step is bounded with `timeout` and runs whatever an earlier one did; a step
# that needs what failed before it is recorded NOT RUN. The whole run keeps within
# MT_GPU_BUDGET_S seconds (default 480), so it finishes well within 9 minutes.
#
# Steps (each a function in tools/gpu_steps_*.sh; helpers in tools/gpu_lib.sh):
#   probe       tool versions: nvidia-smi, nvcc, compute-sanitizer, ncu, cuobjdump, torch, ...
#   deps        tools/gpu_deps.sh unpack .gpu-deps (when that folder is there) into a prefix
#               under /tmp, and its exports (OpenBLAS, cmocka, pkgconf, meson, ninja)
#   build       meson setup build-gpu -Dcuda=enabled -Dwerror=true -Dtest_devices=cpu,cuda
#               (release), ninja
#   sass        cuobjdump -res-usage and -sass over the kernel objects: local memory (LOCAL,
#               LDL/STL) in mixtape's own kernels
#   tests       meson test (every program on the CPU and with MT_TEST_DEVICE=cuda), counted
#               per device from testlog.json
#   bench       samples/simplenet_amp --device cuda, then bench/simplenet --device cuda
#               (mixtape against PyTorch on this GPU)
#   gpubench    bench/gemm (GEMMs: >= 0.60 of cuBLAS's rate) and bench/op_overhead --device cuda
#               (tiny-op host time: <= 0.5x torch's) on the GPU; tools/gpu_steps_bench.sh
#   resnet      samples/resnet_amp --device cuda --json (ResNet-18, every mode), bench/resnet
#               --device cuda (ResNet-50 mixtape against PyTorch's channels_last AMP: issue 9's
#               GPU goal, O2 FP16 images/s >= torch's), samples/digits_cnn --device cuda --amp o1
#               (test accuracy); MT_GPU_RESNET=0 skips it, leaving its time to the later steps
#   sanitizer   compute-sanitizer memcheck, racecheck, synccheck, initcheck over every test
#               program with MT_TEST_DEVICE=cuda; errors counted from the ERROR SUMMARY lines
#   ncu         the GEMM kernels of an FP16 training run (simplenet_amp o1-fp16) by name:
#               tensor-core kernels (gmma, h16816, xmma, tensorop, nvjet, sm90) or not
#   asan        (when time is left, MT_GPU_ASAN=auto; 1 forces, 0 skips) an ASan+UBSan build
#               on the GPU with ASAN_OPTIONS=protect_shadow_gap=0 and LSan suppressions for
#               the driver and cuBLAS
#   profile     (only when MT_GPU_STEPS names it) where a ResNet-50 step spends its GPU time:
#               mixtape's kernels under ncu beside torch's (CUPTI), per kind of kernel, and
#               cuDNN's heuristics against its timed search; tools/gpu_steps_profile.sh
#
# Usage: tools/gpu_test.sh [--rehearse] [RESULTS_DIR]   (default $OUT when set, else gpu-results/)
# (--rehearse in any place; --help prints the usage; an unknown option is refused, status 2)
# When RESULTS_DIR is $OUT (the device tool brings back at most 8 files) the per-step logs are
# packed into logs.tar.gz; summary.txt, console.log, tests.log, bench.log and resnet-bench.log
# stay beside it.
# Environment: MT_GPU_STEPS (the steps to run, in order; default every step above but
#   profile: a later call on a machine that keeps nothing names deps and build too),
#   MT_GPU_SAN_PROGS / MT_GPU_SAN_TOOLS (the test programs and compute-sanitizer tools of the
#   sanitizer step; default all), MT_GPU_BUDGET_S (480), MT_GPU_BUILD_DIR (build-gpu), MT_GPU_PREFIX
#   (/tmp/mt-gpu-prefix), MT_GPU_JOBS (parallel sanitizer runs, 6), MT_GPU_MESON_ARGS (extra
#   setup options, split on spaces), MT_GPU_BENCH_ARGS (extra bench/simplenet options, default
#   --repeat 1), MT_GPU_GEMM_ARGS, MT_GPU_OVERHEAD_ARGS (extra bench/gemm, bench/op_overhead
#   options), MT_GPU_RESNET_ARGS (bench/resnet options, default a ResNet-50 run sized for this
#   budget), MT_GPU_RESNET (1), MT_GPU_ASAN (auto), MT_GPU_KEEP_LOGS=1 (do not pack).
# Exit status: 0 when the build ran and no check FAILed.
#
# Rehearsal (--rehearse or MT_GPU_REHEARSE=1; no GPU needed, CI runs it from tools/run_tests.sh):
# the same steps on the emulated device (-Demulate_cuda=true), samples and benches at tiny
# sizes, tests and asan on the programs of MT_GPU_REHEARSE_TESTS only. What needs a GPU or an
# absent tool says NOT RUN and why, never PASS; compute-sanitizer is replaced by a stand-in
# that only runs the programs (MT_GPU_REHEARSE_SAN_PROGS; MT_GPU_JOBS default 1, so that its
# queue is exercised), and the sass, sanitizer and ncu parsers read captured outputs
# (tools/fixtures/gpu: lines sass-fixture, sanitizer-fixture, ncu-fixture). MT_GPU_BUILD_DIR
# (default build-gpu-rehearse) and MT_GPU_ASAN_BUILD_DIR (default BUILD_DIR-asan) are reused
# when already built. The deps step runs only with MT_GPU_REHEARSE_DEPS=1 (then also
# tools/gpu_deps.sh fetch, apt and pip downloads, when .gpu-deps/ is missing; use a build
# folder of its own: its meson and ninja are newer).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

usage() {
    echo "usage: tools/gpu_test.sh [--rehearse] [RESULTS_DIR]   (default \$OUT when set, else gpu-results/)"
    echo "  --rehearse  the same steps on the emulated device, no GPU needed (see this script's header)"
}
# --rehearse anywhere, at most one RESULTS_DIR; anything else that starts with a dash is a
# mistyped option, not a folder to write into.
out=
take_results_dir() {
    if [[ -n $out ]]; then
        echo "gpu_test.sh: one RESULTS_DIR at most, got $out and $1" >&2
        usage >&2
        exit 2
    fi
    out=$1
}
while (($#)); do
    case $1 in
    --rehearse) export MT_GPU_REHEARSE=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    --) # what follows is a folder, even when it starts with a dash
        shift
        for a in "$@"; do take_results_dir "$a"; done
        break
        ;;
    -*)
        echo "gpu_test.sh: unknown option $1" >&2
        usage >&2
        exit 2
        ;;
    *) take_results_dir "$1" ;;
    esac
    shift
done
out=${out:-${OUT:-gpu-results}}
mkdir -p -- "$out" || exit 1
out=$(cd -- "$out" && pwd)
logs=$out/logs
mkdir -p "$logs"
summary=$out/summary.txt
: >"$summary"

start_s=$SECONDS
budget=${MT_GPU_BUDGET_S:-480}
prefix=${MT_GPU_PREFIX:-/tmp/mt-gpu-prefix}
jobs_max=${MT_GPU_JOBS:-6}
python=$(command -v python3 || echo python3)
failures=0

# shellcheck source=tools/gpu_lib.sh
source "$root/tools/gpu_lib.sh"
# shellcheck source=tools/gpu_steps_setup.sh
source "$root/tools/gpu_steps_setup.sh"
# shellcheck source=tools/gpu_steps_tests.sh
source "$root/tools/gpu_steps_tests.sh"
# shellcheck source=tools/gpu_steps_tools.sh
source "$root/tools/gpu_steps_tools.sh"
# shellcheck source=tools/gpu_steps_bench.sh
source "$root/tools/gpu_steps_bench.sh"
# shellcheck source=tools/gpu_steps_resnet.sh
source "$root/tools/gpu_steps_resnet.sh"
# shellcheck source=tools/gpu_steps_profile.sh
source "$root/tools/gpu_steps_profile.sh"

# The programs' sizes: the GPU's, or tiny ones that take seconds on the emulated device.
bdir=${MT_GPU_BUILD_DIR:-build-gpu}
sample_args=()
resnet_sample_args=(--arch resnet18 --batch 64 --image-size 224 --steps 12 --warmup 4)
resnet_sample_label="ResNet-18 b64 224px"
resnet_sample_limit=60 # seconds
digits_args=()
if rehearsing; then
    bdir=${MT_GPU_BUILD_DIR:-build-gpu-rehearse}
    # one sanitizer run at a time: the queue of the sanitizer step is rehearsed too
    jobs_max=${MT_GPU_JOBS:-1}
    sample_args=(--hidden 64 --batch 32 --steps 3 --epochs 1)
    : "${MT_GPU_BENCH_ARGS:=--hidden 64 --batch 32 --steps 3 --epochs 1 --warmup 1 --repeat 1}"
    : "${MT_GPU_GEMM_ARGS:=--tiny --iters 2 --reps 1}"
    : "${MT_GPU_OVERHEAD_ARGS:=--iters 10 --reps 1}"
    : "${MT_GPU_RESNET_ARGS:=--arch resnet18 --batch 2 --image-size 32 --steps 2 --warmup 1 --repeat 1}"
    resnet_sample_args=(--arch resnet18 --batch 2 --image-size 32 --steps 2 --warmup 1)
    resnet_sample_label="ResNet-18 b2 32px"
    # every mode on the emulated device takes about 50 s on a quiet 2-core machine
    resnet_sample_limit=180
    # two epochs reach the accuracy of the full run (as meson test's sample_digits_cnn_cuda)
    digits_args=(--epochs 2)
fi

main() {
    echo "mixtape GPU check: results in $out; budget ${budget}s$(rehearsing && echo '; REHEARSAL on the emulated device')"
    local step
    # shellcheck disable=SC2086 # a list of step names, split on spaces on purpose
    for step in ${MT_GPU_STEPS:-probe deps build sass tests bench gpubench resnet sanitizer ncu asan}; do
        # a step file that failed to load would otherwise drop its lines without a trace
        if declare -F "step_$step" >/dev/null; then
            "step_$step"
        else
            record FAIL "$step" "no function step_$step (a tools/gpu_steps_*.sh failed to load?)"
        fi
    done
    note "summary"
    echo "total $((SECONDS - start_s)) s, $failures check(s) FAILed" >>"$summary"
    cat "$summary"
    # The device tool brings back at most 8 files: pack the step logs.
    cp -f "$logs/tests.log" "$out/tests.log" 2>/dev/null
    cp -f "$logs/bench.log" "$out/bench.log" 2>/dev/null
    cp -f "$logs/resnet-bench.log" "$out/resnet-bench.log" 2>/dev/null
    if [[ "${MT_GPU_KEEP_LOGS:-0}" != 1 ]] && [[ -n "${OUT:-}" ]] &&
        [[ "$out" == "$(cd "$OUT" 2>/dev/null && pwd)" ]]; then
        tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
    fi
    # A run that built nothing has checked nothing.
    ((failures == 0)) && $built
}

main 2>&1 | tee "$out/console.log"
exit "${PIPESTATUS[0]}"
