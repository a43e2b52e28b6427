#!/usr/bin/env bash
# MTEMU_COALESCE_CENSUS (mtemu_coalesce.h): a program run with it writes, at exit, one line
# per kernel, "requests sectors ideal_sectors ideal/sectors name", the most sectors first.
# test_mtemu's probes: copy_coalesced, 32 warps of one 4-sector load and one 4-sector store;
# copy_strided, whose loads take 32 sectors for the same 128 bytes. Skipped (77) in a build
# without the race checker's instrumentation, which the census needs.
# Usage: check_coalesce.sh TEST_MTEMU
set -uo pipefail
prog=$(realpath "$1") || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

MTEMU_COALESCE_CENSUS=$tmp/census.txt "$prog" >"$tmp/out.txt" 2>"$tmp/err.txt" ||
    fail "$prog failed: $(cat "$tmp/err.txt")"
if grep -q "needs kernels built with the race checker" "$tmp/err.txt"; then
    echo "SKIP: no kernel instrumentation in this build"
    exit 77
fi
[[ -s $tmp/census.txt ]] || fail "no census written"
bad=$(grep -cvE '^[0-9]+ [0-9]+ [0-9]+ [0-9]+\.[0-9]{3} [^ ].*$' "$tmp/census.txt")
((bad == 0)) || fail "$bad malformed lines in $(cat "$tmp/census.txt")"
sort -s -k2,2nr "$tmp/census.txt" | cmp -s - "$tmp/census.txt" || fail "not most sectors first"
grep -qx '64 256 256 1.000 copy_coalesced' "$tmp/census.txt" ||
    fail "copy_coalesced: $(grep copy_coalesced "$tmp/census.txt")"
grep -qx '64 1152 256 0.222 copy_strided' "$tmp/census.txt" ||
    fail "copy_strided: $(grep copy_strided "$tmp/census.txt")"

# without the variable: no census
mkdir "$tmp/quiet" || exit 1
(cd "$tmp/quiet" && "$prog" >/dev/null 2>"$tmp/quiet.err") || fail "$prog failed (no census)"
[[ -z $(ls -A "$tmp/quiet") ]] || fail "files written without MTEMU_COALESCE_CENSUS"
echo "coalescing census: $(wc -l <"$tmp/census.txt") kernels; the probes as expected"
