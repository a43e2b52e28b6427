#!/usr/bin/env bash
# Checks mixtape's CUDA backend on a machine with an NVIDIA GPU and nvcc, in one run, and writes
# every log and a summary.txt (one line per check: PASS / FAIL / NOT RUN and its figures) into
# one folder. Each step is bounded with `timeout` and runs whatever an earlier one did; a step
# that needs what failed before it is recorded NOT RUN. The whole run keeps within
# MT_GPU_BUDGET_S seconds (default 480), so it finishes well within 9 minutes.
#
# Steps:
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
#
# Usage: tools/gpu_test.sh [RESULTS_DIR]   (default $OUT when set, else gpu-results/)
# When RESULTS_DIR is $OUT (the device tool brings back at most 8 files) the per-step logs are
# packed into logs.tar.gz; summary.txt, console.log, tests.log, bench.log and resnet-bench.log
# stay beside it.
# Environment: MT_GPU_BUDGET_S (480), MT_GPU_BUILD_DIR (build-gpu), MT_GPU_PREFIX
#   (/tmp/mt-gpu-prefix), MT_GPU_JOBS (parallel sanitizer runs, 6), MT_GPU_MESON_ARGS (extra
#   setup options, split on spaces), MT_GPU_BENCH_ARGS (extra bench/simplenet options, default
#   --repeat 1), MT_GPU_GEMM_ARGS, MT_GPU_OVERHEAD_ARGS (extra bench/gemm, bench/op_overhead
#   options), MT_GPU_RESNET_ARGS (bench/resnet options, default a ResNet-50 run sized for this
#   budget), MT_GPU_RESNET (1), MT_GPU_ASAN (auto), MT_GPU_KEEP_LOGS=1 (do not pack).
# Exit status: 0 when the build ran and no check FAILed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

out=${1:-${OUT:-gpu-results}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
logs=$out/logs
mkdir -p "$logs"
summary=$out/summary.txt
: >"$summary"

start_s=$SECONDS
budget=${MT_GPU_BUDGET_S:-480}
bdir=${MT_GPU_BUILD_DIR:-build-gpu}
prefix=${MT_GPU_PREFIX:-/tmp/mt-gpu-prefix}
jobs_max=${MT_GPU_JOBS:-6}
python=$(command -v python3 || echo python3)
failures=0

# ---------------------------------------------------------------------------- helpers
note() { printf '\n==== %s [%ds]\n' "$*" "$((SECONDS - start_s))"; }

# record STATUS NAME DETAIL: one summary line, written at once (a killed run keeps its lines).
record() {
    local status=$1 name=$2
    shift 2
    printf '%-8s %-12s %s\n' "$status" "$name" "$*" | tee -a "$summary"
    [[ "$status" == FAIL ]] && failures=$((failures + 1))
    return 0
}

left() { echo $((budget - (SECONDS - start_s))); }

# limit MAX [RESERVE]: seconds a step may take: MAX, or what is left of the budget less
# RESERVE (kept for the later steps); 0 when too little is left.
limit() {
    local max=$1 reserve=${2:-0} l
    l=$(($(left) - reserve))
    ((l > max)) && l=$max
    ((l < 10)) && l=0
    echo "$l"
}

# run_logged LOG SECONDS CMD...: runs CMD under timeout, output to LOG; returns its status
# (124: timed out).
run_logged() {
    local log=$1 secs=$2
    shift 2
    printf '$ %s\n' "$*" >>"$log"
    timeout -k 10 "$secs" "$@" >>"$log" 2>&1
}

have() { command -v "$1" >/dev/null 2>&1; }

# Whether the project declares a build option (so that a tree without it still configures).
has_option() { grep -q "option('$1'" "$root/meson_options.txt" "$root/meson.options" 2>/dev/null; }

# The last line (TAIL lines) of a command's output, or "missing".
version_of() {
    local line
    line=$(timeout 30 "$@" 2>&1 | grep -v '^\s*$' | tail -n "${TAIL:-1}" | tr '\n' ' ') || true
    echo "${line:-missing}"
}

# Adds the first existing folder holding PROGRAM to PATH.
find_tool() {
    local prog=$1 d
    shift
    have "$prog" && return 0
    for d in "$@"; do
        if [[ -x "$d/$prog" ]]; then
            PATH=$d:$PATH
            return 0
        fi
    done
    return 1
}

# ---------------------------------------------------------------------------- steps
# shellcheck source=tools/gpu_steps_bench.sh # step_gpubench (issue 6's GEMM, tiny-op goals)
source "$root/tools/gpu_steps_bench.sh"

step_probe() {
    note "probe"
    local log=$logs/probe.log
    # Tools that are installed but not on PATH in some images.
    local d
    for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /opt/nvidia/nsight-compute/*/; do
        [[ -d "$d" ]] || continue
        case ":$PATH:" in *":${d%/}:"*) ;; *) PATH=$PATH:${d%/} ;; esac
    done
    find_tool compute-sanitizer /usr/local/cuda/compute-sanitizer || true
    export PATH
    {
        echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host: $(uname -n); kernel: $(uname -r)"
        echo "cores: $(nproc); memory: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
        echo "repo: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'no git')"
        echo "glibc: $(ldd --version 2>&1 | head -n 1)"
        for t in nvidia-smi nvcc compute-sanitizer ncu cuobjdump nvdisasm cu++filt gcc g++ \
            meson ninja pkg-config cmake dpkg-deb ar python3 shellcheck; do
            printf '%-18s %s\n' "$t" "$(command -v "$t" || echo missing)"
        done
        echo "--- nvidia-smi"
        timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm \
            --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
        timeout 30 nvidia-smi 2>&1 | head -n 20
        echo "--- nvcc: $(TAIL=2 version_of nvcc --version)"
        echo "--- compute-sanitizer: $(version_of compute-sanitizer --version)"
        echo "--- ncu: $(version_of ncu --version)"
        echo "--- cuobjdump: $(version_of cuobjdump --version)"
        echo "--- gcc: $(gcc --version 2>&1 | head -n 1)"
        echo "--- meson: $(version_of meson --version); ninja: $(version_of ninja --version)"
        echo "--- torch:"
        timeout 120 "$python" -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 | tail -n 3
        echo "--- cuBLAS, cudart_static:"
        local nv
        nv=$(command -v nvcc || true)
        if [[ -n "$nv" ]]; then
            local croot
            croot=$(dirname "$(dirname "$(readlink -f "$nv")")")
            echo "cuda root (from nvcc): $croot"
            find "$croot/lib64/" -maxdepth 1 \( -name 'libcublas.so*' -o -name 'libcudart_static.a' \
                -o -name 'libcudnn.so*' \) 2>&1 | head -n 8
        fi
    } >"$log" 2>&1
    cat "$log"
    local gpu nvcc_v
    gpu=$(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
        head -n 1)
    nvcc_v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
    local tools=""
    for t in compute-sanitizer ncu cuobjdump; do have "$t" && tools+="$t " || tools+="no-$t "; done
    if [[ -n "$gpu" && -n "$nvcc_v" ]]; then
        record PASS probe "GPU: $gpu; nvcc $nvcc_v; $tools"
    else
        record FAIL probe "GPU: ${gpu:-none found (nvidia-smi)}; nvcc: ${nvcc_v:-missing}; $tools"
    fi
}

step_deps() {
    note "deps"
    local log=$logs/deps.log
    if [[ ! -d "$root/.gpu-deps" ]]; then
        record "NOT RUN" deps "no .gpu-deps/ (tools/gpu_deps.sh fetch, then carry it): system packages only"
    else
        local exports
        if exports=$(timeout 120 "$root/tools/gpu_deps.sh" unpack "$root/.gpu-deps" "$prefix" 2>>"$log"); then
            echo "$exports" >>"$log"
            eval "$exports"
            record PASS deps "unpacked into $prefix"
        else
            record FAIL deps "tools/gpu_deps.sh unpack failed (see deps.log)"
        fi
    fi
    # cuBLAS from pip wheels has only libcublas.so.N: give the linker a libcublas.so.
    local nv croot
    nv=$(command -v nvcc || true)
    if [[ -n "$nv" ]]; then
        croot=$(dirname "$(dirname "$(readlink -f "$nv")")")
        if [[ ! -e "$croot/lib64/libcublas.so" ]]; then
            local cand
            cand=$(find "$croot" /usr/local/cuda* "$("$python" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || echo /nonexistent)/nvidia" \
                -name 'libcublas.so*' 2>/dev/null | head -n 1 || true)
            if [[ -n "$cand" ]]; then
                mkdir -p "$prefix/lib"
                ln -sfn "$cand" "$prefix/lib/libcublas.so"
                export LIBRARY_PATH=$prefix/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
                LD_LIBRARY_PATH=$prefix/lib:${cand%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
                export LD_LIBRARY_PATH
                echo "libcublas.so -> $cand" >>"$log"
            fi
        fi
    fi
    # cuDNN is dlopen'ed (libcudnn.so.9) at the first convolution: where it is not on the
    # loader's path (a pip wheel's nvidia/cudnn/lib), put its folder there.
    if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9' && [[ -n "$nv" ]] &&
        [[ ! -e "$croot/lib64/libcudnn.so.9" ]]; then
        local dnn
        dnn=$(find /usr/local/cuda* /usr/lib/x86_64-linux-gnu "$("$python" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || echo /nonexistent)/nvidia" \
            -name 'libcudnn.so.9' 2>/dev/null | head -n 1 || true)
        if [[ -n "$dnn" ]]; then
            LD_LIBRARY_PATH=${dnn%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            export LD_LIBRARY_PATH
            echo "libcudnn.so.9 in ${dnn%/*}" >>"$log"
        else
            echo "libcudnn.so.9 not found: convolutions on cuda:0 will answer MT_ERR_UNSUPPORTED" >>"$log"
        fi
    fi
    {
        echo "PATH=$PATH"
        echo "pkg-config: $(command -v pkg-config || echo missing)"
        echo "openblas: $(pkg-config --modversion openblas 2>&1)"
        echo "cmocka: $(pkg-config --modversion cmocka 2>&1)"
        echo "meson: $(command -v meson) $(meson --version 2>&1)"
        echo "ninja: $(command -v ninja) $(ninja --version 2>&1)"
    } >>"$log" 2>&1
    tail -n 6 "$log"
}

built=false
step_build() {
    note "build"
    local log=$logs/build.log t
    if ! have meson || ! have ninja; then
        record FAIL build "meson or ninja missing"
        return
    fi
    t=$(limit 90)
    if ((t == 0)); then record "NOT RUN" build "no time left"; return; fi
    rm -rf "$bdir"
    # native: the CPU side fuses a * b + c in src/math like the GPU, so CPU/GPU parity is exact
    local args=(-Dbuildtype=release -Dcuda=enabled -Dwerror=true -Dnative=true)
    has_option test_devices && args+=("-Dtest_devices=cpu,cuda")
    # shellcheck disable=SC2206 # extra options split on spaces on purpose
    [[ -n "${MT_GPU_MESON_ARGS:-}" ]] && args+=(${MT_GPU_MESON_ARGS})
    local t0=$SECONDS
    if ! run_logged "$log" "$t" meson setup "$bdir" "${args[@]}"; then
        tail -n 25 "$log"
        record FAIL build "meson setup failed: $(grep -v '^\$ ' "$log" | grep -m1 -E 'ERROR|error' | head -c 200)"
        return
    fi
    t=$(limit 300 120)
    if ((t == 0)); then record "NOT RUN" build "no time left for ninja"; return; fi
    local rc=0
    run_logged "$log" "$t" ninja -C "$bdir" || rc=$?
    if ((rc == 0)); then
        built=true
        record PASS build "meson $(meson --version 2>/dev/null) setup + ninja in $((SECONDS - t0)) s: ${args[*]}"
        return
    fi
    grep -E -m 20 'error:|FAILED:' "$log"
    local first
    first=$(grep -E -m1 'error:|FAILED:' "$log" | head -c 200)
    # Without -Werror on the C side the GPU tests may still run: try once, if time allows.
    t=$(limit 240 150)
    if ((t > 0)) && run_logged "$log" 30 meson configure "$bdir" -Dwerror=false &&
        run_logged "$log" "$t" ninja -C "$bdir" -k 0; then
        built=true
        record FAIL build "ninja failed (rc $rc): $first; rebuilt with -Dwerror=false for the later steps"
    else
        record FAIL build "ninja failed (rc $rc): $first"
    fi
}

step_sass() {
    note "sass (local memory in the kernels)"
    local log=$logs/sass.log
    if ! $built; then record "NOT RUN" sass "no build"; return; fi
    if ! have cuobjdump; then record "NOT RUN" sass "no cuobjdump"; return; fi
    local objs=() o
    while IFS= read -r o; do
        # Only objects with device code (the kernels built by nvcc).
        if timeout 20 cuobjdump -lelf "$o" 2>/dev/null | grep -q 'ELF file'; then objs+=("$o"); fi
    done < <(find "$bdir" -name '*.o' 2>/dev/null | sort)
    if ((${#objs[@]} == 0)); then
        record "NOT RUN" sass "no object with device code under $bdir"
        return
    fi
    local res=$logs/sass-res-usage.txt sass=$logs/sass-dump.txt
    : >"$res"
    : >"$sass"
    for o in "${objs[@]}"; do
        { echo "### $o"; timeout 60 cuobjdump -res-usage "$o" 2>&1; } >>"$res"
        { echo "### $o"; timeout 60 cuobjdump -sass "$o" 2>&1; } >>"$sass"
    done
    # Per function: registers, stack, local bytes (res-usage) and LDL/STL count (SASS).
    "$python" - "$res" "$sass" >"$log" 2>&1 <<'EOF'
import re, subprocess, sys
res, sass = sys.argv[1], sys.argv[2]
funcs = {}
cur = None
for line in open(res, errors='replace'):
    m = re.search(r'Function ([^\s:]+):', line)
    if m:
        cur = m.group(1)
        funcs.setdefault(cur, {'regs': 0, 'stack': 0, 'local': 0, 'ldst': 0, 'archs': set()})
        continue
    m = re.search(r'REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)', line)
    if m and cur:
        f = funcs[cur]
        f['regs'] = max(f['regs'], int(m.group(1)))
        f['stack'] = max(f['stack'], int(m.group(2)))
        f['local'] = max(f['local'], int(m.group(4)))
arch = '?'
cur = None
for line in open(sass, errors='replace'):
    m = re.search(r'arch = (sm_\d+\w*)', line)
    if m:
        arch = m.group(1)
    m = re.search(r'Function : (\S+)', line)
    if m:
        cur = m.group(1)
        funcs.setdefault(cur, {'regs': 0, 'stack': 0, 'local': 0, 'ldst': 0, 'archs': set()})
        funcs[cur]['archs'].add(arch)
        continue
    if cur and re.search(r'\b(LDL|STL)(\.\w+)*\b', line):
        funcs[cur]['ldst'] += 1
names = list(funcs)
try:
    dem = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True,
                         timeout=20).stdout.splitlines()
except Exception:
    dem = names
bad = 0
print('%-6s %-6s %-6s %-6s %-12s %s' % ('regs', 'stack', 'local', 'LDL/STL', 'archs', 'kernel'))
for n, d in sorted(zip(names, dem + names[len(dem):]), key=lambda x: x[1]):
    f = funcs[n]
    flag = f['local'] or f['stack'] or f['ldst']
    bad += bool(flag)
    print('%-6d %-6d %-6d %-7d %-12s %s%s' % (f['regs'], f['stack'], f['local'], f['ldst'],
          ','.join(sorted(f['archs'])) or '-', d[:150], '   <-- local memory' if flag else ''))
print('SUMMARY functions=%d with_local_memory=%d max_regs=%d ldst_total=%d' % (
    len(funcs), bad, max([f['regs'] for f in funcs.values()] or [0]),
    sum(f['ldst'] for f in funcs.values())))
EOF
    cat "$log"
    local s
    s=$(grep '^SUMMARY' "$log" | tail -n 1)
    if [[ -z "$s" ]]; then
        record FAIL sass "could not read cuobjdump output (see sass.log)"
    elif [[ "$s" == *"with_local_memory=0 "* ]]; then
        record PASS sass "${#objs[@]} objects; ${s#SUMMARY }"
    else
        record FAIL sass "${#objs[@]} objects; ${s#SUMMARY } (see sass.log)"
    fi
}

# Prints, per device (cpu, cuda, ...), "device programs_ok programs_total cases_passed
# cases_failed cases_skipped" from a meson testlog.json.
count_tests() {
    "$python" - "$1" <<'EOF'
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
EOF
}

step_tests() {
    note "tests (meson test)"
    local log=$logs/tests.log t
    if ! $built; then record "NOT RUN" tests "no build"; return; fi
    t=$(limit 200 150)
    if ((t == 0)); then record "NOT RUN" tests "no time left"; return; fi
    local rc=0 t0=$SECONDS
    rm -f "$bdir/meson-logs/testlog.json"
    run_logged "$log" "$t" meson test -C "$bdir" --print-errorlogs --timeout-multiplier 0.5 \
        --num-processes "$(nproc)" || rc=$?
    grep -E '^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):' "$log"
    cp "$bdir/meson-logs/testlog.txt" "$logs/testlog.txt" 2>/dev/null
    if [[ ! -s "$bdir/meson-logs/testlog.json" ]]; then
        record FAIL tests "no testlog.json (rc $rc$( ((rc == 124)) && echo ', timed out'))"
        return
    fi
    local dev ok total p f k cuda_seen=false
    while read -r dev ok total p f k; do
        [[ "$dev" == cuda* ]] && cuda_seen=true
        local status=PASS detail
        detail="$ok/$total programs OK; cases: $p passed, $f failed, $k skipped"
        ((ok < total || f > 0)) && status=FAIL
        if [[ "$dev" == cuda* ]] && ((p == 0)); then
            status=FAIL
            detail+=" (no CUDA case ran: device not used?)"
        fi
        record "$status" "tests-$dev" "$detail"
    done < <(count_tests "$bdir/meson-logs/testlog.json")
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

step_bench() {
    note "bench (SimpleNet on the GPU)"
    local log=$logs/bench.log t
    if ! $built; then record "NOT RUN" bench "no build"; return; fi
    local sample=$bdir/samples/simplenet_amp bench=$bdir/bench/simplenet
    t=$(limit 60 200)
    if ((t == 0)); then record "NOT RUN" bench "no time left"; return; fi
    local rc=0
    echo "### samples/simplenet_amp --device cuda (the AMP guide's sizes)" >>"$log"
    run_logged "$log" "$t" "$sample" --device cuda || rc=$?
    if ((rc == 0)); then
        # Table rows: label words, then ms/step, loss, speedup, peak MiB, skipped, syncs/step.
        record PASS sample "simplenet_amp --device cuda: $(grep -E '^(FP32|AMP-O1 FP16) ' "$log" |
            awk '{l = $1; for (i = 2; i <= NF - 6; i++) l = l " " $i
                  printf "%s %s ms/step, %s MiB peak, %s syncs/step; ", l, $(NF-5), $(NF-2), $NF}')"
    else
        record FAIL sample "simplenet_amp --device cuda: rc $rc: $(grep -v '^\$' "$log" | tail -n 1 | head -c 200)"
    fi
    t=$(limit 180 150)
    if ((t == 0)); then record "NOT RUN" bench "no time left"; return; fi
    rc=0
    echo "### bench/simplenet --device cuda" >>"$log"
    # shellcheck disable=SC2086 # extra options split on spaces on purpose
    run_logged "$log" "$t" "$bench" --device cuda --python "$python" ${MT_GPU_BENCH_ARGS:---repeat 1} ||
        rc=$?
    sed -n '/^### bench/,$p' "$log" | grep -v '^round ' | tail -n 40
    local r1 r2 r3
    r1=$(grep -m1 'ms/step mixtape / torch, FP32 ' "$log" | awk -F'|' '{print $3}' | tr -d ' ')
    r2=$(grep -m1 'ms/step mixtape / torch, AMP-O1 FP16 ' "$log" | awk -F'|' '{print $3}' | tr -d ' ')
    r3=$(grep -m1 'mixtape AMP-O1 FP16 speedup' "$log" | awk -F'|' '{print $3}' | tr -d ' ')
    local figures="mixtape/torch ms: FP32 ${r1:--}, O1-FP16 ${r2:--}; mixtape O1-FP16 speedup over FP32 ${r3:--}"
    if ((rc == 0)); then
        record PASS bench "$figures"
    else
        record FAIL bench "rc $rc$( ((rc == 124)) && echo ' (timed out)'); $figures"
    fi
}

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

step_resnet() {
    note "resnet (ResNet training and the digits CNN on the GPU)"
    local log=$logs/resnet.log t rc
    if [[ "${MT_GPU_RESNET:-1}" == 0 ]]; then record "NOT RUN" resnet "MT_GPU_RESNET=0"; return; fi
    if ! $built; then record "NOT RUN" resnet "no build"; return; fi
    local sample=$bdir/samples/resnet_amp bench=$bdir/bench/resnet digits=$bdir/samples/digits_cnn
    # ResNet-18 at ImageNet size, every mode: does it train (finite losses), and how fast.
    t=$(limit 60 200)
    if ((t < 20)); then record "NOT RUN" resnet "$(left) s left: too little for ResNet"; return; fi
    rc=0
    echo "### samples/resnet_amp --device cuda --json (ResNet-18, batch 64, 224x224, 12 steps)" >>"$log"
    run_logged "$log" "$t" "$sample" --device cuda --json --arch resnet18 --batch 64 \
        --image-size 224 --steps 12 --warmup 4 || rc=$?
    local figs
    figs=$(resnet_sample_figures "$log")
    if ((rc == 0)) && [[ $(grep -c '^{' "$log") -ge 4 ]] && ! grep '^{' "$log" | grep -q '"loss": null'; then
        record PASS resnet-amp "ResNet-18 b64 224px: $figs"
    else
        record FAIL resnet-amp "rc $rc$( ((rc == 124)) && echo ' (timed out)'): ${figs:-$(grep -v '^\$' "$log" | tail -n 1 | head -c 200)}"
    fi
    # mixtape against torch: issue 9's GPU goal.
    t=$(limit 200 170)
    if ((t < 60)); then
        # a run cut short by its timeout would only say FAIL: say why instead
        record "NOT RUN" resnet-bench "$t s for it (needs 60; MT_GPU_BUDGET_S raises the budget)"
    else
        rc=0
        echo "### bench/resnet --device cuda" >>"$log"
        local mark
        mark=$(wc -l <"$log")
        # shellcheck disable=SC2086 # extra options split on spaces on purpose
        run_logged "$log" "$t" "$bench" --device cuda --python "$python" \
            ${MT_GPU_RESNET_ARGS:---arch resnet50 --batch 128 --image-size 224 --steps 20 --warmup 5} ||
            rc=$?
        local blog=$logs/resnet-bench.log
        tail -n +"$((mark + 1))" "$log" >"$blog"
        grep -v '^round ' "$blog" | tail -n 40
        local figures
        figures="O2 FP16 mixtape/torch-AMP images/s $(resnet_ratio "$blog" 'mixtape AMP-O2 FP16 / torch AMP FP16 (autocast + GradScaler)')"
        figures+=" (mixtape $(resnet_ips "$blog" mixtape 'AMP-O2 FP16 master weights'),"
        figures+=" torch AMP $(resnet_ips "$blog" torch 'AMP-O1 FP16')); "
        figures+="FP32 $(resnet_ratio "$blog" 'mixtape FP32 / torch FP32'), O1 FP16 $(resnet_ratio "$blog" 'mixtape AMP-O1 FP16 / torch AMP FP16'), "
        figures+="O1 BF16 $(resnet_ratio "$blog" 'mixtape AMP-O1 BF16 / torch BF16 autocast'); "
        figures+=$(grep -m1 '^Goal' "$blog" || echo 'no goal line')
        grep -q '^The PyTorch side is unavailable' "$blog" && figures+=" (torch: unavailable)"
        if ((rc == 0)); then
            record PASS resnet-bench "$figures"
        else
            record FAIL resnet-bench "rc $rc$( ((rc == 124)) && echo ' (timed out)'); $figures"
        fi
    fi
    # A real data set through convolutions, pooling, dropout and FP16 autocast on the GPU.
    local data
    data=$(dirname "$digits")/digits.txt
    if [[ ! -s "$data" ]]; then
        record "NOT RUN" digits-cnn "no $data (written at build time by tools/dump_digits.py: needs python3-sklearn)"
        return
    fi
    t=$(limit 90 130)
    if ((t == 0)); then record "NOT RUN" digits-cnn "no time left"; return; fi
    rc=0
    echo "### samples/digits_cnn --device cuda --amp o1 --json" >>"$log"
    run_logged "$log" "$t" "$digits" --device cuda --amp o1 --json || rc=$?
    local acc
    acc=$(grep '"test_accuracy"' "$log" | tail -n 1 | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
    if ((rc == 0)) && [[ -n "$acc" ]] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.97) }'; then
        record PASS digits-cnn "O1 FP16 on cuda: test_accuracy $acc (>= 0.97)"
    else
        record FAIL digits-cnn "O1 FP16 on cuda: rc $rc$( ((rc == 124)) && echo ' (timed out)'); test_accuracy ${acc:-none} (needs >= 0.97)"
    fi
}

step_sanitizer() {
    note "compute-sanitizer"
    if ! $built; then record "NOT RUN" sanitizer "no build"; return; fi
    if ! have compute-sanitizer; then record "NOT RUN" sanitizer "no compute-sanitizer"; return; fi
    local progs=() p
    while IFS= read -r p; do progs+=("$p"); done < <(find "$bdir/test" -maxdepth 1 -type f \
        -name 'test_*' -executable 2>/dev/null | sort)
    if ((${#progs[@]} == 0)); then record "NOT RUN" sanitizer "no test programs"; return; fi
    local extra=()
    compute-sanitizer --help 2>/dev/null | grep -q -- '--require-cuda-init' &&
        extra+=(--require-cuda-init no)
    local tools=(memcheck racecheck synccheck initcheck) tool i
    for i in "${!tools[@]}"; do
        tool=${tools[$i]}
        # Each tool gets an equal share of what is left, keeping 80 s for ncu and the end.
        local share=$((($(left) - 80) / (${#tools[@]} - i)))
        ((share > 150)) && share=150
        if ((share < 15)); then
            record "NOT RUN" "san-$tool" "no time left"
            continue
        fi
        local deadline=$((SECONDS + share)) running=() launched=0 skipped=0
        for p in "${progs[@]}"; do
            while ((${#running[@]} >= jobs_max)); do
                local still=() q
                for q in "${running[@]}"; do
                    if kill -0 "$q" 2>/dev/null; then still+=("$q"); else wait "$q" 2>/dev/null; fi
                done
                running=("${still[@]}")
                ((${#running[@]} >= jobs_max)) && sleep 0.2
            done
            local t=$((deadline - SECONDS))
            if ((t < 5)); then
                skipped=$((skipped + 1))
                continue
            fi
            local name
            name=$(basename "$p")
            local log=$logs/san-$tool-$name.log
            (
                rc=0
                MT_TEST_DEVICE=cuda OMP_NUM_THREADS=2 timeout -k 5 "$t" compute-sanitizer \
                    --tool "$tool" --print-limit 30 "${extra[@]}" "$p" >"$log" 2>&1 || rc=$?
                echo "$rc" >"$log.rc"
            ) &
            running+=("$!")
            launched=$((launched + 1))
        done
        local q
        for q in "${running[@]}"; do wait "$q" 2>/dev/null; done
        # Count: errors from "ERROR SUMMARY: N error(s)"; a program without that line did not
        # finish under the tool (timeout, crash).
        local errors=0 with_errors=() failed=() timedout=() nosummary=()
        for p in "${progs[@]}"; do
            local name log rc n
            name=$(basename "$p")
            log=$logs/san-$tool-$name.log
            [[ -f "$log" ]] || continue
            rc=$(cat "$log.rc" 2>/dev/null || echo '?')
            n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
            if [[ -z "$n" ]]; then
                nosummary+=("$name")
            elif ((n > 0)); then
                errors=$((errors + n))
                with_errors+=("$name:$n")
            fi
            [[ "$rc" == 124 || "$rc" == 137 ]] && timedout+=("$name")
            [[ "$rc" != 0 && "$rc" != 124 && "$rc" != 137 ]] && failed+=("$name(rc $rc)")
            rm -f "$log.rc"
        done
        local detail="$errors errors in $launched/${#progs[@]} programs"
        ((${#with_errors[@]})) && detail+="; errors: ${with_errors[*]}"
        ((${#failed[@]})) && detail+="; exit status != 0: ${failed[*]}"
        ((${#timedout[@]})) && detail+="; timed out: ${timedout[*]}"
        ((${#nosummary[@]})) && detail+="; no summary: ${nosummary[*]}"
        ((skipped)) && detail+="; $skipped not run (time)"
        if ((errors > 0 || ${#failed[@]} > 0)); then
            record FAIL "san-$tool" "$detail"
        elif ((launched == 0)); then
            record "NOT RUN" "san-$tool" "$detail"
        else
            record PASS "san-$tool" "$detail"
        fi
    done
}

step_ncu() {
    note "ncu (GEMM kernel names of an FP16 run)"
    local log=$logs/ncu.log csv=$logs/ncu.csv t
    if ! $built; then record "NOT RUN" ncu "no build"; return; fi
    if ! have ncu; then record "NOT RUN" ncu "no ncu"; return; fi
    t=$(limit 90 20)
    if ((t == 0)); then record "NOT RUN" ncu "no time left"; return; fi
    local rc=0
    # Two small steps of O1 FP16 at the guide's sizes; one metric (the duration) per kernel.
    printf '$ ncu ... simplenet_amp --device cuda --modes o1-fp16\n' >"$log"
    timeout -k 10 "$t" ncu --target-processes all --metrics gpu__time_duration.sum --csv \
        --launch-count 400 "$bdir/samples/simplenet_amp" --device cuda --modes o1-fp16 \
        --steps 2 --epochs 1 --json >"$csv" 2>>"$log" || rc=$?
    "$python" - "$csv" >>"$log" 2>&1 <<'EOF'
import csv, re, sys
rows = [l for l in open(sys.argv[1], errors='replace') if l.startswith('"')]
kernels = {}
header = None
for rec in csv.reader(rows):
    if header is None:
        header = rec
        continue
    d = dict(zip(header, rec))
    name = d.get('Kernel Name', '?')
    try:
        v = float(d.get('Metric Value', '0').replace(',', ''))
    except ValueError:
        v = 0.0
    # ncu picks a unit per value: bring every duration to nanoseconds.
    v *= {'second': 1e9, 'msecond': 1e6, 'usecond': 1e3}.get(d.get('Metric Unit', ''), 1.0)
    k = kernels.setdefault(name, [0, 0.0, 'ns'])
    k[0] += 1
    k[1] += v
TC = re.compile(r'gmma|hmma|h16816|h1688|s16816|xmma|tensorop|nvjet|sm90_|sm80_|cutlass', re.I)
GEMM = re.compile(r'gemm|nvjet|xmma|cutlass|gmma|matmul', re.I)
total = sum(k[1] for k in kernels.values()) or 1.0
gemm = tc = 0
print('%6s %8s  %s' % ('calls', 'time %', 'kernel'))
for name, (n, v, unit) in sorted(kernels.items(), key=lambda x: -x[1][1]):
    g, t = bool(GEMM.search(name)), bool(TC.search(name))
    gemm += g
    tc += g and t
    print('%6d %7.1f%%  %s%s' % (n, 100 * v / total, name[:160],
                                 '   [GEMM, tensor cores]' if g and t else '   [GEMM]' if g else ''))
print('SUMMARY kernels=%d gemm_kernels=%d tensor_core_gemm_kernels=%d' % (len(kernels), gemm, tc))
EOF
    grep -v '^\$' "$log" | head -n 30
    local s
    s=$(grep '^SUMMARY' "$log" | tail -n 1)
    s=${s#SUMMARY }
    if [[ -z "$s" || "$s" == "kernels=0 "* ]]; then
        record FAIL ncu "no kernels profiled (rc $rc; see ncu.log)"
    elif [[ "$s" == *"tensor_core_gemm_kernels=0" ]]; then
        record FAIL ncu "$s: no tensor-core GEMM kernel in an FP16 run"
    else
        record PASS ncu "$s"
    fi
}

step_asan() {
    note "asan (ASan + UBSan build on the GPU)"
    local mode=${MT_GPU_ASAN:-auto} log=$logs/asan.log t
    if [[ "$mode" == 0 ]]; then record "NOT RUN" asan "MT_GPU_ASAN=0"; return; fi
    if ! $built; then record "NOT RUN" asan "no release build"; return; fi
    if [[ "$mode" == auto ]] && (($(left) < 200)); then
        record "NOT RUN" asan "$(left) s left (needs 200; MT_GPU_ASAN=1 forces it)"
        return
    fi
    local adir=$bdir-asan
    rm -rf "$adir"
    t=$(limit 60 20)
    local args=(-Dbuildtype=release -Dcuda=enabled -Dwerror=true "-Db_sanitize=address,undefined"
        -Db_lundef=false -Dnative=true)
    has_option test_devices && args+=(-Dtest_devices=cuda)
    # shellcheck disable=SC2206
    [[ -n "${MT_GPU_MESON_ARGS:-}" ]] && args+=(${MT_GPU_MESON_ARGS})
    if ((t == 0)) || ! run_logged "$log" "$t" meson setup "$adir" "${args[@]}"; then
        record FAIL asan "meson setup failed or no time (see asan.log)"
        return
    fi
    t=$(limit 180 30)
    if ((t == 0)) || ! run_logged "$log" "$t" ninja -C "$adir"; then
        record FAIL asan "ninja failed or timed out (see asan.log)"
        return
    fi
    # The driver's address-space reservation collides with ASan's shadow gap: every cudaMalloc
    # fails without protect_shadow_gap=0 (google/sanitizers#629). The driver and cuBLAS keep
    # allocations until exit (LSan suppressions).
    local supp=$logs/lsan.supp
    printf 'leak:libcuda\nleak:libcublas\nleak:libcublasLt\nleak:libnvidia\n' >"$supp"
    t=$(limit 180 10)
    local rc=0
    ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:print_summary=1 \
        LSAN_OPTIONS=suppressions=$supp UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        run_logged "$log" "$t" meson test -C "$adir" --print-errorlogs --num-processes "$(nproc)" ||
        rc=$?
    local line
    line=$(count_tests "$adir/meson-logs/testlog.json" 2>/dev/null |
        awk '{printf "%s: %s/%s programs OK, %s passed, %s failed, %s skipped; ", $1, $2, $3, $4, $5, $6}')
    if ((rc == 0)); then
        record PASS asan "meson test under ASan+UBSan (protect_shadow_gap=0): $line"
    else
        record FAIL asan "rc $rc: $line (see asan.log)"
    fi
}

# ---------------------------------------------------------------------------- main
main() {
    echo "mixtape GPU check: results in $out; budget ${budget}s"
    step_probe
    step_deps
    step_build
    step_sass
    step_tests
    step_bench
    step_gpubench
    step_resnet
    step_sanitizer
    step_ncu
    step_asan
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
