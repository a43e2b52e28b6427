#!/usr/bin/env bash
# Builds mixtape four times with warnings as errors and runs `meson test` in each, ending
# with one line: "N passed, N failed, N skipped", summed over the runs:
#   release   the normal build; where nvcc exists it also compiles the CUDA kernels through
#             the compile gate (sm_80/sm_90, spills and local memory as errors); tests on the
#             CPU, and on the GPU too when one is there (MT_TEST_DEVICES=cpu,cuda);
#   asan      AddressSanitizer + UndefinedBehaviorSanitizer, with the CUDA backend on the
#             emulated device (test/cuda_emu): every test program on the CPU and on MT_CUDA(0);
#   emu       the emulated device in a release build: every test program on MT_CUDA(0), with
#             threads in program order and reversed (a missing barrier gives a wrong answer),
#             kernels built with the shared-memory race checker (-Demu_racecheck=auto);
#   tsan      ThreadSanitizer, on the CPU and the emulated device: the test programs' own
#             threads, the fake NCCL's ranks as threads and mt_ddp's communication thread (the
#             'tsan' suite of test/meson.build: minutes, where the whole suite would take hours);
# then the rehearsal of the GPU machine's script on the emu and asan builds (tools/gpu_test.sh
# --rehearse, about 3 minutes; results in BUILD-EMU/gpu-rehearsal/): each summary line counts,
# PASS as passed, FAIL as failed, NOT RUN as skipped; a run that ends early or exits non-zero
# without a FAIL line adds one failure.
#
# Counting: meson 1.0.1 writes one JSON object per test program to meson-logs/testlog.json
# (no separate entries for TAP subtests), but keeps the program's TAP output in "stdout".
# Each TAP test case counts once ("ok" passed, "not ok" failed, "# SKIP" skipped, planned but
# never reported: failed); a program that failed although none of its cases did (a crash at
# exit, a sanitizer or leak report, a timeout) adds one failure; a program without TAP output
# counts once. A build that fails counts as one failure.
#
# Usage: tools/run_tests.sh [extra `meson test` arguments, e.g. a test name]
# Environment: MT_BUILD_DIR (default build), MT_ASAN_BUILD_DIR (default build-asan),
#              MT_EMU_BUILD_DIR (default build-emu), MT_TSAN_BUILD_DIR (default build-tsan),
#              MT_SKIP_ASAN=1 / MT_SKIP_EMU=1 / MT_SKIP_TSAN=1 to leave those builds out (no
#              emu build: no rehearsal either; no tsan run either when meson test arguments
#              are given), MT_SKIP_GPU_REHEARSAL=1 to
#              leave the rehearsal out (also left out when meson test arguments are given),
#              MT_TEST_DEVICES (release build's devices, default auto).
# Named tests that no build ran (a mistyped name: meson test says "No suitable tests defined."
# and passes) count one failure each; so does a run with meson test arguments that ran no test.
# Exit status: 0 when nothing failed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/setup.sh" || exit 1
cd "$root" || exit 1

build=${MT_BUILD_DIR:-build}
asan_build=${MT_ASAN_BUILD_DIR:-build-asan}
emu_build=${MT_EMU_BUILD_DIR:-build-emu}
tsan_build=${MT_TSAN_BUILD_DIR:-build-tsan}
# The emulated device needs the CUDA toolkit's headers (nvcc's tree), not a GPU.
have_cuda_headers=false
command -v nvcc >/dev/null 2>&1 && have_cuda_headers=true

# LeakSanitizer is on by default with ASan on Linux; say so explicitly, and make UBSan
# findings fail the test instead of only printing.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:print_summary=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:print_summary=1}

# Sets up `dir` with the given options, or applies them to an existing build directory.
configure() {
    local dir=$1
    shift
    if [[ -f "$dir/build.ninja" ]]; then
        meson configure "$dir" "$@" || meson setup --wipe "$dir" "$@"
    else
        meson setup "$dir" "$@"
    fi
}

python=$(command -v python3 || echo /usr/bin/python3)

# Prints "passed failed skipped" for one testlog.json.
count_log() {
    "$python" - "$1" <<'EOF'
import json, re, sys

TAP_RESULT = re.compile(r'^(not ok|ok)\b(.*)$')
TAP_PLAN = re.compile(r'^1\.\.(\d+)')
passed = failed = skipped = 0
with open(sys.argv[1], encoding='utf-8', errors='replace') as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        try:
            test = json.loads(line)
        except ValueError:
            continue
        result = test.get('result', 'ERROR')
        program_ok = result in ('OK', 'EXPECTEDFAIL', 'SKIP')
        p = fl = s = 0
        planned = None
        seen = 0
        bailed = False
        for out in (test.get('stdout') or '').splitlines():
            out = out.strip()
            m = TAP_PLAN.match(out)
            if m and planned is None:
                planned = int(m.group(1))
                continue
            if out.startswith('Bail out!'):
                bailed = True
                continue
            m = TAP_RESULT.match(out)
            if not m:
                continue
            seen += 1
            directive = m.group(2).split('#', 1)[1].strip().upper() if '#' in m.group(2) else ''
            if directive.startswith('SKIP'):
                s += 1
            elif directive.startswith('TODO'):
                # expected failure passes; an unexpected pass fails, as meson counts them
                if m.group(1) == 'ok':
                    fl += 1
                else:
                    p += 1
            elif m.group(1) == 'ok':
                p += 1
            else:
                fl += 1
        if seen or planned:
            if planned is not None and planned > seen:
                fl += planned - seen
            if bailed and fl == 0:
                fl += 1
            if not program_ok and fl == 0:
                fl += 1
        elif result == 'SKIP':
            s += 1
        elif program_ok:
            p += 1
        else:
            fl += 1
        passed, failed, skipped = passed + p, failed + fl, skipped + s
print(passed, failed, skipped)
EOF
}

total_passed=0
total_failed=0
total_skipped=0
suites_tested=0 # builds that got as far as meson test
# the names of the tests the builds ran, one a line (from their testlog.json)
ran_names=$(mktemp)
trap 'rm -f "$ran_names"' EXIT

# Appends the test names of one testlog.json to $ran_names. meson names a test "NAME", or
# "PROJECT:SUITE / NAME" when there are several suites.
log_names() {
    "$python" -c '
import json, sys
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    try:
        print(json.loads(line)["name"].rsplit(" / ", 1)[-1])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass' "$1" >>"$ran_names"
}

# run_suite NAME DIR setup-options...
run_suite() {
    local name=$1 dir=$2 log
    shift 2
    local multiplier=1
    [[ "$name" == asan ]] && multiplier=6
    echo "==== $name build ($dir) ===="
    log="$dir/meson-logs/testlog.json"
    rm -f "$log"
    if ! configure "$dir" "$@" || ! ninja -C "$dir"; then
        echo "$name: build failed"
        total_failed=$((total_failed + 1))
        return
    fi
    meson test -C "$dir" --print-errorlogs --timeout-multiplier "$multiplier" \
        "${test_args[@]}"
    suites_tested=$((suites_tested + 1))
    add_counts "$name" "$log"
}

# add_counts NAME LOG: adds one run's testlog.json to the totals.
add_counts() {
    local name=$1 log=$2 counts p f s
    if [[ ! -f "$log" ]]; then
        echo "$name: no test log (no tests defined?)"
        return
    fi
    if ! counts=$(count_log "$log"); then
        echo "$name: could not read $log"
        total_failed=$((total_failed + 1))
        return
    fi
    read -r p f s <<<"$counts"
    log_names "$log"
    echo "$name: $p passed, $f failed, $s skipped"
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    total_skipped=$((total_skipped + s))
}

test_args=("$@")
run_suite release "$build" -Dwerror=true -Db_sanitize=none -Demulate_cuda=false \
    -Dtest_devices="${MT_TEST_DEVICES:-auto}"
emu_args=(-Demulate_cuda=false -Dtest_devices=cpu)
if $have_cuda_headers && [[ "${MT_SKIP_EMU:-0}" != 1 ]]; then
    emu_args=(-Demulate_cuda=true "-Dtest_devices=cpu,cuda")
fi
if [[ "${MT_SKIP_ASAN:-0}" != 1 ]]; then
    run_suite asan "$asan_build" -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false \
        "${emu_args[@]}"
fi
if $have_cuda_headers && [[ "${MT_SKIP_EMU:-0}" != 1 ]]; then
    run_suite emu "$emu_build" -Dwerror=true -Db_sanitize=none -Demulate_cuda=true -Dtest_devices=cuda
elif [[ "${MT_SKIP_EMU:-0}" != 1 ]]; then
    echo "emu: no CUDA toolkit (nvcc) on this machine: the emulated-device build was not run"
fi

# The ThreadSanitizer run: test/meson.build's 'tsan' suite (the cases that start threads of
# their own, test_nccl's rank threads, the plan cache's threads, mt_ddp's communication thread
# in a two-rank job), on the CPU and the emulated device. Only the suite's programs are built.
# -Dnative=true: the portable build's run-time CPU dispatch (ifunc resolvers) runs before
# TSan's runtime is up and crashes it.
run_tsan() {
    local dir=$tsan_build targets
    echo "==== tsan build ($dir) ===="
    rm -f "$dir/meson-logs/testlog.json"
    if ! configure "$dir" -Dwerror=true -Db_sanitize=thread -Db_lundef=false -Dnative=true \
        "${emu_args[@]}" || ! ninja -C "$dir" build.ninja >/dev/null || # regenerated: fresh introspection
        ! targets=$(meson introspect "$dir" --tests | "$python" -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
for t in json.load(sys.stdin):
    if any(s.endswith(":tsan") for s in t["suite"]):
        exe = t["cmd"][-1] if os.path.basename(t["cmd"][0]) == "mpirun" else t["cmd"][0]
        print(os.path.relpath(os.path.realpath(os.path.join(build, exe)), build))' "$dir") ||
        [[ -z "$targets" ]] || ! ninja -C "$dir" $(sort -u <<<"$targets"); then
        echo "tsan: build failed"
        total_failed=$((total_failed + 1))
        return
    fi
    meson test -C "$dir" --no-rebuild --suite tsan --print-errorlogs
    add_counts tsan "$dir/meson-logs/testlog.json"
}
if [[ "${MT_SKIP_TSAN:-0}" == 1 ]]; then
    echo "tsan: left out (MT_SKIP_TSAN=1)"
elif ((${#test_args[@]})); then
    echo "tsan: left out (meson test arguments given: ${test_args[*]})"
else
    run_tsan
fi

# The rehearsal of tools/gpu_test.sh, the script a session lent a GPU runs (see the header).
run_gpu_rehearsal() {
    local res=$emu_build/gpu-rehearsal rc=0 p f s
    echo "==== gpu rehearsal (tools/gpu_test.sh --rehearse on $emu_build and $asan_build) ===="
    rm -rf "$res"
    # OUT: the device tool's folder, when a session runs this there; not this run's. The
    # budget: twice the GPU run's, so that a slow CI machine still reaches every step.
    OUT='' MT_GPU_BUILD_DIR=$emu_build MT_GPU_ASAN_BUILD_DIR=$asan_build \
        MT_GPU_BUDGET_S=${MT_GPU_BUDGET_S:-960} "$root/tools/gpu_test.sh" --rehearse "$res" || rc=$?
    p=$(grep -c '^PASS ' "$res/summary.txt" 2>/dev/null)
    f=$(grep -c '^FAIL ' "$res/summary.txt" 2>/dev/null)
    s=$(grep -c '^NOT RUN ' "$res/summary.txt" 2>/dev/null)
    p=${p:-0} f=${f:-0} s=${s:-0}
    if ! grep -q '^total .* FAILed$' "$res/summary.txt" 2>/dev/null; then
        echo "gpu rehearsal: ended before its summary (exit status $rc)"
        f=$((f + 1))
    elif ((rc != 0 && f == 0)); then
        echo "gpu rehearsal: exit status $rc without a FAIL line"
        f=$((f + 1))
    fi
    echo "gpu rehearsal: $p passed, $f failed, $s skipped (logs: $res/logs)"
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    total_skipped=$((total_skipped + s))
}
if [[ "${MT_SKIP_GPU_REHEARSAL:-0}" == 1 ]]; then
    echo "gpu rehearsal: left out (MT_SKIP_GPU_REHEARSAL=1)"
elif ((${#test_args[@]})); then
    echo "gpu rehearsal: left out (meson test arguments given: ${test_args[*]})"
elif $have_cuda_headers && [[ "${MT_SKIP_EMU:-0}" != 1 ]]; then
    run_gpu_rehearsal
else
    echo "gpu rehearsal: no emulated build (needs nvcc's headers; MT_SKIP_EMU): not run"
fi

# The test names among the meson test arguments: the words that are neither an option nor an
# option's value, without a "subproject:" prefix ("subproject:" alone names no single test).
named_tests() {
    local a prev=
    for a in "${test_args[@]}"; do
        # meson test's options that take a value, as their unambiguous prefixes too (its
        # argparse accepts --num 4 for --num-processes 4)
        case $prev in
        --maxf* | --rep* | --gdb-* | --wr* | -C | --sui* | --no-su* | --logb* | --num* | -t | \
            --ti* | --se* | --te*)
            prev=
            continue
            ;;
        esac
        prev=$a
        [[ $a == *=* ]] && prev= # --option=value carries its own value
        [[ $a == -* || -z ${a#*:} ]] || echo "${a#*:}"
    done
}

# meson test passes when its arguments match no test ("No suitable tests defined."): a typo
# must not read as "0 failed". Not when only listing or asking for help, nor when no build got
# to its tests (that failure is counted already).
check_named_tests() {
    local a name
    for a in "${test_args[@]}"; do
        # --logbase renames the test log, which the counts and names come from
        [[ $a == --list || $a == -h || $a == --help || $a == --logb* ]] && return
    done
    ((suites_tested > 0)) || return
    if [[ ! -s "$ran_names" ]]; then
        echo "no test ran: nothing matched the meson test arguments: ${test_args[*]}"
        total_failed=$((total_failed + 1))
        return
    fi
    while read -r name; do
        if ! grep -qxF -- "$name" "$ran_names"; then
            echo "no test named $name in any build"
            total_failed=$((total_failed + 1))
        fi
    done < <(named_tests)
}
((${#test_args[@]})) && check_named_tests

echo "$total_passed passed, $total_failed failed, $total_skipped skipped"
[[ $total_failed -eq 0 ]]
