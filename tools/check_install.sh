#!/usr/bin/env bash
# Installs the build into a scratch DESTDIR and builds and runs a program the way a user of
# the installed library would: pkg-config for the flags, the versioned soname at run time.
# Usage: tools/check_install.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null
pc=$(find "$tmp/root" -name mixtape.pc | head -1)
[[ -n "$pc" ]] || { echo "error: no mixtape.pc installed" >&2; exit 1; }
# the .pc file's paths are relative to its prefix: point that into the scratch root
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
prefix=$(pkg-config --variable=prefix mixtape)
pc_args=(--define-variable=prefix="$tmp/root$prefix")
flags=$(pkg-config "${pc_args[@]}" --cflags --libs mixtape)
echo "pkg-config: $flags"
cat >"$tmp/use.c" <<'C'
#include <mixtape.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    if (strcmp(mt_version(), MT_VERSION_STRING) != 0) return 2;
    mt_tensor *x = mt_ones(MT_SHAPE(2, 3), MT_F32, MT_CPU);
    mt_tensor *s = mt_sum_all(x);
    double v = mt_item(s);
    mt_release(s);
    mt_release(x);
    printf("mixtape %s: sum = %g\n", mt_version(), v);
    return v == 6.0 ? 0 : 1;
}
C
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror "$tmp/use.c" $flags -o "$tmp/use"
libdir=$(pkg-config "${pc_args[@]}" --variable=libdir mixtape)
soname=$(readelf -d "$tmp/use" | sed -n 's/.*(NEEDED).*\[\(libmixtape[^]]*\)\]/\1/p')
echo "the program needs $soname"
[[ "$soname" =~ ^libmixtape\.so\.[0-9]+$ ]] || { echo "error: unversioned soname '$soname'" >&2; exit 1; }
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/use"
