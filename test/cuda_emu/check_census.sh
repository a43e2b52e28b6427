#!/usr/bin/env bash
# MTEMU_LAUNCH_CENSUS (fake_cudart.cpp): a program run with it writes, at exit, one line per
# kernel, "launches threads name", the most launched first; "-" writes them to stderr.
# Usage: check_census.sh PROGRAM (an emulated-device program that launches kernels)
set -uo pipefail
prog=$(realpath "$1") || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

MTEMU_LAUNCH_CENSUS=$tmp/census.txt "$prog" >"$tmp/out.txt" 2>&1 || fail "$prog failed"
[[ -s $tmp/census.txt ]] || fail "no census written"
bad=$(grep -cvE '^[1-9][0-9]* [1-9][0-9]* [^ ].*$' "$tmp/census.txt")
((bad == 0)) || fail "$bad malformed lines in $(cat "$tmp/census.txt")"
sort -s -k1,1nr "$tmp/census.txt" | cmp -s - "$tmp/census.txt" || fail "not most launched first"
dups=$(cut -d' ' -f3- "$tmp/census.txt" | sort | uniq -d | wc -l)
((dups == 0)) || fail "a kernel listed twice"

MTEMU_LAUNCH_CENSUS=- "$prog" >/dev/null 2>"$tmp/err.txt" || fail "$prog failed (census to stderr)"
missing=$(grep -cvxFf "$tmp/err.txt" "$tmp/census.txt")
((missing == 0)) || fail "$missing census lines not on stderr"

# without the variable: no file, no census lines on stderr
mkdir "$tmp/quiet" || exit 1
(cd "$tmp/quiet" && "$prog" >/dev/null 2>"$tmp/quiet.err") || fail "$prog failed (no census)"
[[ -z $(ls -A "$tmp/quiet") ]] || fail "files written without MTEMU_LAUNCH_CENSUS"
! grep -qxFf "$tmp/census.txt" "$tmp/quiet.err" || fail "a census without MTEMU_LAUNCH_CENSUS"
echo "census: $(wc -l <"$tmp/census.txt") kernels, $(awk '{n += $1} END {print n}' "$tmp/census.txt") launches"
