#!/usr/bin/env bash
# samples/digits_cnn trains to >= 97% test accuracy on scikit-learn's digits, as its last
# --json line says. Exit 77 (meson: skipped) when the data file is absent, i.e. python3-sklearn
# was missing at build time. Usage: check_digits_cnn.sh DIGITS_CNN DIGITS_FILE [MORE ARGS].
set -euo pipefail
exe=$1 data=$2
shift 2
if [ ! -r "$data" ]; then
    echo "SKIP: $data not found (tools/dump_digits.py needs Debian's python3-sklearn)"
    exit 77
fi
out=$("$exe" --data "$data" --json "$@")
echo "$out"
last=$(tail -n 1 <<<"$out")
acc=$(sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p' <<<"$last")
if [ -z "$acc" ]; then
    echo "FAIL: the last line holds no test_accuracy"
    exit 1
fi
if awk -v a="$acc" 'BEGIN { exit !(a >= 0.97) }'; then
    echo "PASS: test accuracy $acc >= 0.97"
else
    echo "FAIL: test accuracy $acc < 0.97"
    exit 1
fi
