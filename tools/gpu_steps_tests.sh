# shellcheck shell=bash
# shellcheck disable=SC2154 # root, logs, bdir, python, built: set by tools/gpu_test.sh
# Sourced by tools/gpu_test.sh: the test suite, with the helpers of gpu_lib.sh.
#   tests   meson test (every program on the CPU and with MT_TEST_DEVICE=cuda), counted per
#           device from testlog.json
#   asan    an ASan+UBSan build on the GPU, its tests counted the same way
# In the rehearsal both run only the programs of MT_GPU_REHEARSE_TESTS (the counting is what
# is rehearsed; tools/run_tests.sh runs the whole suite on the emulated device already).

# The meson test names the rehearsal runs (present in any build with a cuda test device).
rehearse_tests() {
    # shellcheck disable=SC2086 # a list of names, split on spaces on purpose
    printf '%s\n' ${MT_GPU_REHEARSE_TESTS:-test_half_generic_isa test_empty_cuda test_tensor_cuda}
}

# Prints, per device (cpu, cuda, ...), "device programs_ok programs_total cases_passed
# cases_failed cases_skipped" from a meson testlog.json.
count_tests() {
    "$python" - "$1" <<'PY'
import json, re, sys
TAP = re.compile(r'^(not ok|ok)\b(.*)$')
PLAN = re.compile(r'^1\.\.(\d+)')
stats = {}
for line in open(sys.argv[1], encoding='utf-8', errors='replace'):
    try:
        t = json.loads(line)
    except ValueError:
        continue
    name = t.get('name', '')
    m = re.search(r'_(cuda\w*)$', name)
    dev = m.group(1) if m else 'cpu'
    s = stats.setdefault(dev, [0, 0, 0, 0, 0])
    ok = t.get('result') in ('OK', 'EXPECTEDFAIL', 'SKIP')
    s[0] += ok
    s[1] += 1
    planned, seen, p, f, k = None, 0, 0, 0, 0
    for out in (t.get('stdout') or '').splitlines():
        out = out.strip()
        mp = PLAN.match(out)
        if mp and planned is None:
            planned = int(mp.group(1))
            continue
        mt = TAP.match(out)
        if not mt:
            continue
        seen += 1
        directive = mt.group(2).split('#', 1)[1].strip().upper() if '#' in mt.group(2) else ''
        if directive.startswith('SKIP'):
            k += 1
        elif mt.group(1) == 'ok':
            p += 1
        else:
            f += 1
    if planned is not None and planned > seen:
        f += planned - seen
    if not ok and f == 0:
        f += 1
    s[2] += p
    s[3] += f
    s[4] += k
for dev, s in sorted(stats.items()):
    print(dev, *s)
PY
}

step_tests() {
    note "tests (meson test)"
    local log=$logs/tests.log t names=()
    if ! $built; then record "NOT RUN" tests "no build"; return; fi
    t=$(limit 200 150)
    if ((t == 0)); then record "NOT RUN" tests "no time left"; return; fi
    # the rehearsal keeps the log of the build's own full run (tools/run_tests.sh's)
    local base=testlog
    rehearsing && mapfile -t names < <(rehearse_tests) && base=testlog-gpu-rehearsal
    local rc=0 t0=$SECONDS tlog=$bdir/meson-logs/$base.json
    rm -f "$tlog"
    run_logged "$log" "$t" meson test -C "$bdir" --print-errorlogs --timeout-multiplier 0.5 \
        --num-processes "$(nproc)" --logbase "$base" "${names[@]}" || rc=$?
    grep -E '^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):' "$log"
    cp "$bdir/meson-logs/$base.txt" "$logs/testlog.txt" 2>/dev/null
    if [[ ! -s "$tlog" ]]; then
        record FAIL tests "no testlog.json (rc $rc$(timed_out "$rc"))"
        return
    fi
    local dev ok total p f k cuda_seen=false
    while read -r dev ok total p f k; do
        [[ "$dev" == cuda* ]] && cuda_seen=true
        local status=PASS detail
        detail="$ok/$total programs OK; cases: $p passed, $f failed, $k skipped"
        rehearsing && detail+=" (rehearsal: ${#names[@]} programs)"
        ((ok < total || f > 0)) && status=FAIL
        if [[ "$dev" == cuda* ]] && ((p == 0)); then
            status=FAIL
            detail+=" (no CUDA case ran: device not used?)"
        fi
        record "$status" "tests-$dev" "$detail"
    done < <(count_tests "$tlog")
    if ! $cuda_seen; then
        if has_option test_devices; then
            record FAIL tests-cuda "no test ran with MT_TEST_DEVICE=cuda"
        else
            record "NOT RUN" tests-cuda "this tree has no test_devices option"
        fi
    fi
    ((rc == 124)) && record FAIL tests "meson test timed out after $t s"
    echo "tests: $((SECONDS - t0)) s"
}

# asan_setup ADIR: configures and builds the ASan+UBSan build (rehearsal: reuses ADIR when it
# is built, e.g. CI's build-asan). Returns non-zero after recording why it could not.
asan_setup() {
    local adir=$1 log=$logs/asan.log t
    if rehearsing && [[ -f "$adir/build.ninja" ]]; then
        echo "reusing $adir" >>"$log"
    else
        rm -rf "$adir"
        t=$(limit 60 20)
        local args=(-Dbuildtype=release -Dcuda=enabled -Dwerror=true "-Db_sanitize=address,undefined"
            -Db_lundef=false -Dnative=true)
        rehearsing && args=(-Dbuildtype=release -Demulate_cuda=true -Dwerror=true
            "-Db_sanitize=address,undefined" -Db_lundef=false)
        has_option test_devices && args+=(-Dtest_devices=cuda)
        # shellcheck disable=SC2206
        [[ -n "${MT_GPU_MESON_ARGS:-}" ]] && args+=(${MT_GPU_MESON_ARGS})
        if ((t == 0)) || ! run_logged "$log" "$t" meson setup "$adir" "${args[@]}"; then
            record FAIL asan "meson setup failed or no time (see asan.log)"
            return 1
        fi
    fi
    t=$(limit 180 30)
    if ((t == 0)) || ! run_logged "$log" "$t" ninja -C "$adir"; then
        record FAIL asan "ninja failed or timed out (see asan.log)"
        return 1
    fi
}

step_asan() {
    note "asan (ASan + UBSan build on the GPU)"
    local mode=${MT_GPU_ASAN:-auto} log=$logs/asan.log t names=()
    local adir=${MT_GPU_ASAN_BUILD_DIR:-$bdir-asan}
    if [[ "$mode" == 0 ]]; then record "NOT RUN" asan "MT_GPU_ASAN=0"; return; fi
    if ! $built; then record "NOT RUN" asan "no release build"; return; fi
    if [[ "$mode" == auto ]] && (($(left) < 200)); then
        record "NOT RUN" asan "$(left) s left (needs 200; MT_GPU_ASAN=1 forces it)"
        return
    fi
    if rehearsing; then
        if [[ "$mode" == auto && ! -f "$adir/build.ninja" ]]; then
            record "NOT RUN" asan "rehearsal: no ASan build $adir to reuse (MT_GPU_ASAN_BUILD_DIR; MT_GPU_ASAN=1 builds one)"
            return
        fi
        mapfile -t names < <(rehearse_tests)
    fi
    asan_setup "$adir" || return
    # The driver's address-space reservation collides with ASan's shadow gap: every cudaMalloc
    # fails without protect_shadow_gap=0 (google/sanitizers#629). The driver and cuBLAS keep
    # allocations until exit (LSan suppressions).
    local supp=$logs/lsan.supp
    printf 'leak:libcuda\nleak:libcublas\nleak:libcublasLt\nleak:libnvidia\n' >"$supp"
    t=$(limit 180 10)
    local rc=0 base=testlog
    rehearsing && base=testlog-gpu-rehearsal
    rm -f "$adir/meson-logs/$base.json"
    ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:print_summary=1 \
        LSAN_OPTIONS=suppressions=$supp UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        run_logged "$log" "$t" meson test -C "$adir" --print-errorlogs --num-processes "$(nproc)" \
        --logbase "$base" "${names[@]}" || rc=$?
    local line
    line=$(count_tests "$adir/meson-logs/$base.json" 2>/dev/null |
        awk '{printf "%s: %s/%s programs OK, %s passed, %s failed, %s skipped; ", $1, $2, $3, $4, $5, $6}')
    if ((rc == 0)) && [[ -n "$line" ]]; then
        record PASS asan "meson test under ASan+UBSan (protect_shadow_gap=0): $line"
    else
        record FAIL asan "rc $rc$(timed_out "$rc"): ${line:-no testlog.json} (see asan.log)"
    fi
}
