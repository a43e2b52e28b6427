#!/usr/bin/env bash
# Installs what mixtape needs to build and test, on Debian 12 (and Debian-like systems).
# Idempotent: when every package is already there it does nothing (no apt, no network).
# Works with no stdin (CI); as non-root it uses sudo when that needs no password (or when
# there is a terminal to ask for one), otherwise it prints the command to run and fails.
set -euo pipefail

# libc6-dev is pulled in by gcc's recommends anyway; naming it keeps --no-install-recommends
# setups working too.
PACKAGES=(meson ninja-build libopenblas-openmp-dev pkg-config libcmocka-dev gcc libc6-dev libcjson-dev
    libopenmpi-dev openmpi-bin libdnnl-dev python3-sklearn)

say() { printf 'setup: %s\n' "$*" >&2; }

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ "$status" == "install ok installed" ]] || missing+=("$p")
    done
else
    # Not a Debian system: check for the tools themselves and let the build find the rest.
    for c in meson ninja pkg-config cc; do
        command -v "$c" >/dev/null 2>&1 || missing+=("$c")
    done
    pkg-config --exists cmocka 2>/dev/null || missing+=("cmocka")
    if ((${#missing[@]})); then
        say "missing: ${missing[*]}"
        say "this is not a Debian system; install the equivalents of: ${PACKAGES[*]}"
        exit 1
    fi
    exit 0
fi

((${#missing[@]})) || exit 0

say "installing missing packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
cmd=(apt-get)
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        cmd=(sudo -n env DEBIAN_FRONTEND=noninteractive apt-get)
    elif command -v sudo >/dev/null 2>&1 && [[ -t 0 ]]; then
        cmd=(sudo env DEBIAN_FRONTEND=noninteractive apt-get)
    else
        say "not root and no usable sudo; run this as root, then run this script again:"
        say "  apt-get update && apt-get install -y ${missing[*]}"
        exit 1
    fi
fi

# The package lists of a fresh container are empty: update once, then install.
"${cmd[@]}" update </dev/null
"${cmd[@]}" install -y "${missing[@]}" </dev/null
say "done"
