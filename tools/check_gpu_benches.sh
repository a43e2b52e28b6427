#!/usr/bin/env bash
# Smoke test of the CUDA benchmarks (meson test bench_gpu_smoke): bench/gemm and
# bench/op_overhead with --device cuda at tiny sizes, without PyTorch. Each must exit 0 and
# print its JSON lines (every figure of mixtape's side measured, op_overhead's host and wall
# times both; gemm: every case agreeing with cuBLAS) and its table. Without a CUDA device both
# exit 77, and so does this (meson: skipped), after the checks of their command lines.
# On the emulated device the timings are meaningless: this checks that the programs work.
# Usage: check_gpu_benches.sh GEMM OP_OVERHEAD
set -uo pipefail
gemm=$1 overhead=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() {
    echo "FAIL: $*"
    cat "$out"
    exit 1
}

# First the command lines they refuse (no device needed): a number with junk after it or out
# of range, an unknown option, a word that is no .py script; --help on stdout with status 0.
refuse() {
    local rc=0
    "$@" >"$out" 2>&1 || rc=$?
    ((rc == 2)) || fail "$* exited with $rc, expected 2 (a bad command line)"
}
refuse "$gemm" --iters 2x
refuse "$gemm" --reps 0
refuse "$gemm" --bogus
refuse "$overhead" --iters 5abc
refuse "$overhead" --reps 99999999999
refuse "$overhead" --burst 0
refuse "$overhead" --bogus
refuse "$overhead" not-a-script
for prog in "$gemm" "$overhead"; do
    "$prog" --help >"$out" 2>/dev/null || fail "$prog --help exited with $?"
    grep -q '^usage:' "$out" || fail "$prog --help: no usage"
done
echo "gemm, op_overhead: bad command lines refused, --help on stdout"

rc=0
"$gemm" --device cuda --tiny --iters 2 --reps 1 --no-torch >"$out" 2>&1 || rc=$?
if ((rc == 77)); then
    grep -q 'no CUDA device' "$out" || fail "gemm: status 77 without saying 'no CUDA device'"
    cat "$out"
    exit 77
fi
((rc == 0)) || fail "gemm exited with $rc"
n=$(grep -c '^{"bench": "gemm"' "$out")
((n == 12)) || fail "gemm: $n JSON lines, expected 12 (4 shapes x 3 dtypes)"
good=$(grep '^{"bench": "gemm"' "$out" | grep '"mixtape_tflops": [0-9]' |
    grep '"cublas_tflops": [0-9]' | grep -c '"max_rel_diff": [0-9]')
((good == 12)) || fail "gemm: $good of 12 lines with mixtape and cuBLAS rates and their difference"
# (gemm itself fails when mixtape and cuBLAS disagree by more than one output rounding)
grep -q '^| shape (M x N x K) |' "$out" || fail "gemm: no table"
grep -q '"emulated": true' "$out" && { grep -q 'EMULATED' "$out" || fail "gemm: emulated device not labelled"; }
cat "$out"

rc=0
"$overhead" --device cuda --iters 10 --burst 4 --reps 1 --no-torch >"$out" 2>&1 || rc=$?
((rc == 0)) || fail "op_overhead --device cuda exited with $rc"
n=$(grep '^{"bench": "op_overhead"' "$out" | grep -c '"mixtape_us": [0-9]')
((n == 7)) || fail "op_overhead: $n JSON lines with mixtape's time, expected 7"
# the host figure (mixtape_us, a burst of calls) and the wall figure (iters calls + a sync);
# torch's are null here (--no-torch) but their keys must be there
n=$(grep '^{"bench": "op_overhead"' "$out" | grep '"mixtape_wall_us": [0-9]' |
    grep '"torch_us": ' | grep -c '"torch_wall_us": ')
((n == 7)) || fail "op_overhead: $n JSON lines with mixtape's wall time and torch's keys, expected 7"
grep -q '^| op | mixtape us |.*| mixtape wall us (10 calls + sync) |' "$out" ||
    fail "op_overhead: no table with the wall columns"
grep -q '^host: 4 calls' "$out" || fail "op_overhead: --burst 4 not used"
cat "$out"
