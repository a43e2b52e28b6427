#!/usr/bin/env bash
# Builds mixtape (warnings as errors) and runs the SimpleNet AMP sample: FP32, AMP-O1 FP16,
# AMP-O2 FP16 with master weights and AMP-O1 BF16, timed side by side.
# Arguments go to the sample, e.g. --modes fp32,o1-bf16 --hidden 512 --json (see --help).
# Environment: MT_BUILD_DIR (default build).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/setup.sh"
cd "$root"

build=${MT_BUILD_DIR:-build}
if [[ -f "$build/build.ninja" ]]; then
    meson configure "$build" -Dwerror=true >/dev/null || meson setup --wipe "$build" -Dwerror=true
else
    meson setup "$build" -Dwerror=true
fi
# Build quietly; show the log only when it fails.
if ! out=$(ninja -C "$build" samples/simplenet_amp 2>&1); then
    printf '%s\n' "$out" >&2
    exit 1
fi
exec "$build/samples/simplenet_amp" "$@"
