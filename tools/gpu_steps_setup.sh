# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034 # root, logs, bdir, prefix, python: set by gpu_test.sh; built: read later
# Sourced by tools/gpu_test.sh: the steps before any check, with the helpers of gpu_lib.sh.
#   probe   tool versions (nvidia-smi, nvcc, compute-sanitizer, ncu, cuobjdump, torch, ...)
#   deps    tools/gpu_deps.sh unpack .gpu-deps into a prefix, its exports checked
#   build   meson setup + ninja (rehearsal: the emulated device, an existing build reused)

step_probe() {
    note "probe"
    local log=$logs/probe.log d t
    # Tools that are installed but not on PATH in some images.
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
        local croot
        croot=$(cuda_root)
        if [[ -n "$croot" ]]; then
            echo "cuda root (from nvcc): $croot"
            find "$croot/lib64/" -maxdepth 1 \( -name 'libcublas.so*' -o -name 'libcudart_static.a' \
                -o -name 'libcudnn.so*' \) 2>&1 | head -n 8
        fi
    } >"$log" 2>&1
    cat "$log"
    local gpu nvcc_v tools=""
    gpu=$(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
        head -n 1)
    nvcc_v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
    for t in compute-sanitizer ncu cuobjdump; do have "$t" && tools+="$t " || tools+="no-$t "; done
    if rehearsing; then
        # the emulated device needs no GPU: its absence is expected, not a failure
        record "NOT RUN" probe "rehearsal on the emulated device: GPU: ${gpu:-none (nvidia-smi)}; nvcc ${nvcc_v:-missing}; $tools"
    elif [[ -n "$gpu" && -n "$nvcc_v" ]]; then
        record PASS probe "GPU: $gpu; nvcc $nvcc_v; $tools"
    else
        record FAIL probe "GPU: ${gpu:-none found (nvidia-smi)}; nvcc: ${nvcc_v:-missing}; $tools"
    fi
}

# deps_check: whether the exports of an unpacked prefix work: pkg-config finds openblas and
# cmocka in the prefix, and meson and ninja run. Prints what failed.
deps_check() {
    local bad=() pc v
    for pc in openblas cmocka libcjson; do
        v=$(pkg-config --variable=pcfiledir "$pc" 2>/dev/null)
        [[ "$v" == "$prefix"/* ]] || bad+=("pkg-config $pc: ${v:-not found}")
    done
    meson --version >/dev/null 2>&1 || bad+=("meson does not run ($(command -v meson || echo missing))")
    ninja --version >/dev/null 2>&1 || bad+=("ninja does not run ($(command -v ninja || echo missing))")
    echo "${bad[*]}"
}

step_deps() {
    note "deps"
    local log=$logs/deps.log dir=$root/.gpu-deps
    if rehearsing && [[ "${MT_GPU_REHEARSE_DEPS:-0}" != 1 ]]; then
        # its meson and ninja on PATH would rebuild a reused build folder from scratch (ninja
        # 1.13's log is not 1.11's), and CI has no .gpu-deps
        record "NOT RUN" deps "rehearsal: MT_GPU_REHEARSE_DEPS=1 rehearses it (fetch when .gpu-deps/ is missing, unpack, exports)"
        return
    fi
    if rehearsing && [[ ! -d "$dir" ]]; then
        # what a session does on a machine with apt before it carries .gpu-deps over
        if ! timeout 300 "$root/tools/gpu_deps.sh" fetch "$dir" >>"$log" 2>&1; then
            record FAIL deps "tools/gpu_deps.sh fetch failed (see deps.log)"
            return
        fi
    fi
    if [[ ! -d "$dir" ]]; then
        record "NOT RUN" deps "no .gpu-deps/ (tools/gpu_deps.sh fetch, then carry it): system packages only"
    else
        local exports bad
        if exports=$(timeout 120 "$root/tools/gpu_deps.sh" unpack "$dir" "$prefix" 2>>"$log"); then
            echo "$exports" >>"$log"
            eval "$exports"
            bad=$(deps_check)
            if [[ -n "$bad" ]]; then
                record FAIL deps "unpacked into $prefix, but: $bad"
            else
                record PASS deps "unpacked into $prefix: pkg-config finds openblas, cmocka, libcjson there; meson $(meson --version), ninja $(ninja --version)"
            fi
        else
            record FAIL deps "tools/gpu_deps.sh unpack failed (see deps.log)"
        fi
    fi
    deps_cuda_libraries >>"$log"
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

# The CUDA libraries where the toolkit lacks them: cuBLAS from pip wheels has only
# libcublas.so.N (the linker needs a libcublas.so); cuDNN is dlopen'ed (libcudnn.so.9) at the
# first convolution and must be on the loader's path. Says what it did on stdout.
deps_cuda_libraries() {
    local croot cand dnn
    croot=$(cuda_root)
    [[ -n "$croot" ]] || return 0
    if [[ ! -e "$croot/lib64/libcublas.so" ]]; then
        cand=$(find "$croot" /usr/local/cuda* "$(site_packages)/nvidia" -name 'libcublas.so*' \
            2>/dev/null | head -n 1 || true)
        if [[ -n "$cand" ]]; then
            mkdir -p "$prefix/lib"
            ln -sfn "$cand" "$prefix/lib/libcublas.so"
            export LIBRARY_PATH=$prefix/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
            LD_LIBRARY_PATH=$prefix/lib:${cand%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            export LD_LIBRARY_PATH
            echo "libcublas.so -> $cand"
        fi
    fi
    if ! output_has 'libcudnn\.so\.9' ldconfig -p && [[ ! -e "$croot/lib64/libcudnn.so.9" ]]; then
        dnn=$(find /usr/local/cuda* /usr/lib/x86_64-linux-gnu "$(site_packages)/nvidia" \
            -name 'libcudnn.so.9' 2>/dev/null | head -n 1 || true)
        if [[ -n "$dnn" ]]; then
            LD_LIBRARY_PATH=${dnn%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            export LD_LIBRARY_PATH
            echo "libcudnn.so.9 in ${dnn%/*}"
        else
            echo "libcudnn.so.9 not found: convolutions on cuda:0 will answer MT_ERR_UNSUPPORTED"
        fi
    fi
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
    # native: the CPU side fuses a * b + c in src/math like the GPU, so CPU/GPU parity is exact
    local args=(-Dbuildtype=release -Dcuda=enabled -Dwerror=true -Dnative=true)
    rehearsing && args=(-Dbuildtype=release -Demulate_cuda=true -Dwerror=true)
    has_option test_devices && args+=("-Dtest_devices=cpu,cuda")
    # shellcheck disable=SC2206 # extra options split on spaces on purpose
    [[ -n "${MT_GPU_MESON_ARGS:-}" ]] && args+=(${MT_GPU_MESON_ARGS})
    local t0=$SECONDS
    if rehearsing && [[ -f "$bdir/build.ninja" ]]; then
        # an emulated build already made (CI's build-emu): brought up to date, not rebuilt
        args=("(reused $bdir)")
        echo "reusing $bdir" >>"$log"
    else
        rm -rf "$bdir"
        if ! run_logged "$log" "$t" meson setup "$bdir" "${args[@]}"; then
            tail -n 25 "$log"
            record FAIL build "meson setup failed: $(grep -v '^\$ ' "$log" | grep -m1 -E 'ERROR|error' | head -c 200)"
            return
        fi
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
        record FAIL build "ninja failed (rc $rc)$(timed_out "$rc"): $first"
    fi
}
