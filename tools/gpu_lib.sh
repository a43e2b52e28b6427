# shellcheck shell=bash
# shellcheck disable=SC2154 # budget, start_s, summary, failures, root, python: set by gpu_test.sh
# Sourced by tools/gpu_test.sh: the helpers every step uses (the step files gpu_steps_*.sh
# call them): log headings, summary lines, the time budget, bounded runs, tool look-ups, and
# the fixture checks of the rehearsal (MT_GPU_REHEARSE=1).

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

# " (timed out)" for the exit status of `timeout`, else nothing.
timed_out() { [[ "$1" == 124 || "$1" == 137 ]] && echo ' (timed out)'; return 0; }

have() { command -v "$1" >/dev/null 2>&1; }

# output_has PATTERN CMD...: whether CMD prints (stdout or stderr) a line matching the extended
# regex PATTERN. Not `CMD | grep -q`: grep -q stops reading at the first match, CMD then dies
# of SIGPIPE (141), and under pipefail the pipeline fails although the line was there (it
# did, about every other time, for cuobjdump -lelf and ldconfig -p).
output_has() {
    local pattern=$1
    shift
    "$@" 2>&1 | grep -E -e "$pattern" >/dev/null
}

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

# The CUDA toolkit's root (the folder above nvcc's bin/), or nothing.
cuda_root() {
    local nv
    nv=$(command -v nvcc || true)
    [[ -n "$nv" ]] && dirname "$(dirname "$(readlink -f "$nv")")"
    return 0
}

# python3's site-packages (where pip's nvidia-* wheels put cuBLAS and cuDNN), or a path that
# does not exist.
site_packages() {
    "$python" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || echo /nonexistent
}

# ---------------------------------------------------------------------------- rehearsal
# MT_GPU_REHEARSE=1 (or --rehearse) runs every step on the emulated device (-Demulate_cuda=true)
# at tiny sizes; what needs a real GPU or an absent tool says NOT RUN. The parsing of the
# GPU tools' output is then checked on captured samples (tools/fixtures/gpu): each verdict
# function must give exactly the line of tools/fixtures/gpu/expected.txt.
rehearsing() { [[ "${MT_GPU_REHEARSE:-0}" == 1 ]]; }

# check_fixtures NAME: runs the verdict of every fixture case named NAME-* in expected.txt
# (columns: case, status, detail; tab-separated) through fixture_verdict_NAME CASE-FOLDER and
# records one line NAME-fixture: PASS when each gives its expected status and detail.
check_fixtures() {
    local name=$1 fdir=$root/tools/fixtures/gpu case want_status want_detail got n=0 bad=() good=()
    local work=$logs/fixtures
    mkdir -p "$work"
    while IFS=$'\t' read -r case want_status want_detail; do
        [[ "$case" == "$name"-* ]] || continue
        n=$((n + 1))
        # a copy: a verdict may clean up its inputs
        rm -rf "${work:?}/$case"
        cp -r "$fdir/$case" "$work/$case"
        got=$("fixture_verdict_$name" "$work/$case" 2>>"$work/$name.log")
        printf '%s: %s\n' "$case" "$got" >>"$work/$name.log"
        if [[ "$got" == "$want_status"$'\t'"$want_detail" ]]; then
            good+=("${case#"$name"-} $want_status")
        else
            bad+=("$case gave '${got//$'\t'/ }'")
        fi
    done <"$fdir/expected.txt"
    if ((n == 0)); then
        record FAIL "$name-fixture" "no fixture case $name-* in tools/fixtures/gpu/expected.txt"
    elif ((${#bad[@]})); then
        record FAIL "$name-fixture" "${#bad[@]}/$n cases wrong: ${bad[*]}"
    else
        local IFS=,
        record PASS "$name-fixture" "$n captured outputs read right: ${good[*]}"
    fi
}

# The prefix of the detail of a line that ran on the emulated device in the rehearsal.
emu_tag() { rehearsing && echo 'rehearsal, emulated device (timings mean nothing): '; return 0; }
