#!/usr/bin/env bash
# Carries mixtape's build dependencies to a machine that cannot install packages (the GPU
# machine: no network, no apt), as Debian 12 packages and Python wheels.
#
#   tools/gpu_deps.sh fetch [DIR]        on a Debian 12 machine with apt and pip: downloads
#                                        into DIR (default .gpu-deps/ in the repository,
#                                        ignored by git; about 14 MiB) the .debs of OpenBLAS
#                                        (OpenMP), libgfortran5, libquadmath0, cmocka, cJSON,
#                                        oneDNN and pkgconf, and the meson and ninja wheels
#                                        (not Open MPI: the GPU build goes without data
#                                        parallelism, -Dmpi=auto finds none there).
#   tools/gpu_deps.sh unpack DIR PREFIX  on the target: unpacks the .debs under PREFIX/root
#                                        (dpkg-deb, else ar + tar, else Python), links what the
#                                        build needs into PREFIX/lib, PREFIX/include and
#                                        PREFIX/bin, writes relocatable openblas.pc and
#                                        cmocka.pc and libcjson.pc into PREFIX/lib/pkgconfig,
#                                        installs the wheels into PREFIX/py (pip --no-index),
#                                        and prints
#                                        the exports on stdout:
#                                          eval "$(tools/gpu_deps.sh unpack .gpu-deps /tmp/p)"
#   tools/gpu_deps.sh exports PREFIX     prints the exports of an unpacked PREFIX again.
#
# Messages go to stderr; only `export` lines go to stdout. Nothing is written outside DIR
# and PREFIX. See the CUDA notes (section 6) for the measured recipe.
#
# Environment (fetch): MT_GPU_PY_VERSION (the target's Python, default 3.12),
#   MT_GPU_MESON (default meson==1.12.1), MT_GPU_NINJA (default ninja==1.13.2).
# Environment (unpack): MT_GPU_FORCE_PKGCONF=1 puts the carried pkgconf on PATH as pkg-config
#   even when the machine has a pkg-config; MT_GPU_DEB_TOOL=dpkg-deb|ar|python picks the .deb
#   reader (default: the first of these that is there); MT_GPU_NO_PIP=1 unzips the wheels
#   instead of using pip (what happens where python3 has no pip).
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

DEBS=(libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0 libcmocka0 libcmocka-dev
      libcjson1 libcjson-dev libdnnl2 libdnnl-dev pkgconf-bin libpkgconf3)
MULTIARCH=x86_64-linux-gnu
prefix= # set by cmd_unpack

say() { printf 'gpu_deps: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 1
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Runs apt-get as root, or through sudo when that needs no password.
apt_as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        apt-get "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n apt-get "$@"
    else
        die "apt-get $*: needs root (or sudo without a password)"
    fi
}

cmd_fetch() {
    local dir=${1:-$root/.gpu-deps}
    command -v apt-get >/dev/null 2>&1 || die "fetch needs apt-get (a Debian 12 machine)"
    local python
    python=$(command -v python3 || true)
    if [[ -z "$python" ]] || ! "$python" -m pip --version >/dev/null 2>&1; then
        die "fetch needs python3 with pip (for the meson and ninja wheels)"
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # One version of each: remove what an earlier fetch left (only our own file kinds).
    rm -f "$dir"/*.deb "$dir"/*.whl "$dir"/SHA256SUMS
    say "downloading ${#DEBS[@]} .debs into $dir"
    if ! (cd "$dir" && apt-get download "${DEBS[@]}" </dev/null); then
        say "apt-get download failed; updating the package lists once and trying again"
        apt_as_root update </dev/null
        (cd "$dir" && apt-get download "${DEBS[@]}" </dev/null)
    fi
    # apt-get download may leave partial files behind on failure; every package must be there.
    local p
    for p in "${DEBS[@]}"; do
        compgen -G "$dir/${p}_*.deb" >/dev/null || die "missing after download: $p"
    done
    say "downloading wheels: ${MT_GPU_MESON:-meson==1.12.1} ${MT_GPU_NINJA:-ninja==1.13.2}"
    # meson is pure Python; ninja's wheel holds an x86-64 binary (manylinux).
    "$python" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
        --python-version "${MT_GPU_PY_VERSION:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
        --platform manylinux2010_x86_64 --platform manylinux1_x86_64 \
        -d "$dir" "${MT_GPU_MESON:-meson==1.12.1}" "${MT_GPU_NINJA:-ninja==1.13.2}"
    (cd "$dir" && sha256sum -- *.deb *.whl >SHA256SUMS)
    local bytes
    bytes=$(du -cb "$dir"/*.deb "$dir"/*.whl | tail -n 1 | cut -f1)
    say "$(find "$dir" -maxdepth 1 \( -name '*.deb' -o -name '*.whl' \) | wc -l) files," \
        "$((bytes / 1024)) KiB in $dir"
    if ((bytes > 40 * 1024 * 1024)); then
        die "$dir holds more than 40 MiB: too much to carry to the GPU machine"
    fi
}

# Extracts one .deb's files (not its static libraries or docs) under dest.
extract_deb() {
    local deb=$1 dest=$2
    local tar_opts=(-C "$dest" --exclude='*.a' --exclude='./usr/share/doc/*' --exclude='./usr/share/lintian/*'
        --no-same-owner)
    local tool=${MT_GPU_DEB_TOOL:-}
    if [[ -z "$tool" ]]; then
        tool=python
        command -v ar >/dev/null 2>&1 && tool="ar"
        command -v dpkg-deb >/dev/null 2>&1 && tool=dpkg-deb
    fi
    if [[ "$tool" == dpkg-deb ]]; then
        dpkg-deb --fsys-tarfile "$deb" | tar -xf - "${tar_opts[@]}"
        return
    fi
    if [[ "$tool" == ar ]]; then
        local member
        member=$(ar t "$deb" | grep '^data\.tar' | head -n 1)
        [[ -n "$member" ]] || die "$deb: no data.tar member"
        case "$member" in
            *.xz) ar p "$deb" "$member" | tar -xJf - "${tar_opts[@]}" ;;
            *.gz) ar p "$deb" "$member" | tar -xzf - "${tar_opts[@]}" ;;
            *.zst) ar p "$deb" "$member" | zstd -dc | tar -xf - "${tar_opts[@]}" ;;
            *) ar p "$deb" "$member" | tar -xf - "${tar_opts[@]}" ;;
        esac
        return
    fi
    # Neither dpkg-deb nor ar: read the ar archive in Python (the header is 60 bytes a member).
    python3 - "$deb" "$dest" <<'EOF'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, 'rb') as f:
    data = f.read()
if data[:8] != b'!<arch>\n':
    sys.exit(deb + ': not an ar archive')
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip('/')
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    pos += 60 + size + (size & 1)
    if name.startswith('data.tar'):
        with tarfile.open(fileobj=io.BytesIO(body), mode='r:*') as t:
            members = [m for m in t.getmembers() if not m.name.endswith('.a')
                       and '/usr/share/doc/' not in m.name
                       and '/usr/share/lintian/' not in m.name]
            t.extractall(dest, members=members)
        sys.exit(0)
sys.exit(deb + ': no data.tar member')
EOF
}

# link TARGET_IN_ROOT LINK: a relative link from PREFIX/<dir>/<name> into PREFIX/root, so that
# the prefix can be moved.
link_into() {
    local target=$1 link=$2
    [[ -e "$prefix/root/$target" ]] || die "unpacked tree lacks $target"
    local up
    up=$(dirname "$link" | sed 's|[^/][^/]*|..|g')
    ln -sfn "$up/root/$target" "$prefix/$link"
}

write_pc() {
    local name=$1 desc=$2 version=$3 lib=$4
    cat >"$prefix/lib/pkgconfig/$name.pc" <<EOF
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: $name
Description: $desc (unpacked by tools/gpu_deps.sh)
Version: $version
Libs: -L\${libdir} -l$lib
Cflags: -I\${includedir}
EOF
}

print_exports() {
    local p=$1
    # Single-quoted values: a prefix path with spaces survives eval.
    printf "export PATH='%s/bin':\"\$PATH\"\n" "$p"
    printf "export PYTHONPATH='%s/py'\"\${PYTHONPATH:+:\$PYTHONPATH}\"\n" "$p"
    printf "export PKG_CONFIG_PATH='%s/lib/pkgconfig'\"\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\"\n" "$p"
    printf "export LD_LIBRARY_PATH='%s/lib'\"\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"\n" "$p"
    printf "export LIBRARY_PATH='%s/lib'\"\${LIBRARY_PATH:+:\$LIBRARY_PATH}\"\n" "$p"
    printf "export CPATH='%s/include'\"\${CPATH:+:\$CPATH}\"\n" "$p"
}

cmd_unpack() {
    [[ $# -eq 2 ]] || die "usage: gpu_deps.sh unpack DIR PREFIX"
    local dir=$1
    [[ -d "$dir" ]] || die "no folder $dir (run \`tools/gpu_deps.sh fetch\` on a machine with apt)"
    mkdir -p "$2"
    prefix=$(cd "$2" && pwd)
    mkdir -p "$prefix/root" "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin" "$prefix/py"
    local n=0 deb
    for deb in "$dir"/*.deb; do
        [[ -e "$deb" ]] || continue
        extract_deb "$deb" "$prefix/root"
        n=$((n + 1))
    done
    ((n > 0)) || die "no .deb files in $dir"
    say "unpacked $n .debs under $prefix/root"

    local la=usr/lib/$MULTIARCH ob=usr/lib/$MULTIARCH/openblas-openmp
    local obinc=usr/include/$MULTIARCH/openblas-openmp real
    # OpenBLAS: the real file is libopenblasp-r<version>.so; its soname is libopenblas.so.0.
    real=$(find "$prefix/root/$ob" -maxdepth 1 -type f -name 'libopenblas*-r*.so' -printf '%f\n' |
        head -n 1)
    [[ -n "$real" ]] || die "no libopenblas*-r*.so under $prefix/root/$ob"
    link_into "$ob/$real" lib/libopenblas.so
    link_into "$ob/$real" lib/libopenblas.so.0
    local ob_version=${real#libopenblas*-r}
    ob_version=${ob_version%.so}
    link_into "$la/libgfortran.so.5" lib/libgfortran.so.5
    link_into "$la/libquadmath.so.0" lib/libquadmath.so.0
    link_into "$la/libcmocka.so.0" lib/libcmocka.so.0
    link_into "$la/libcmocka.so.0" lib/libcmocka.so
    local h
    for h in cblas.h openblas_config.h f77blas.h; do link_into "$obinc/$h" "include/$h"; done
    for h in cmocka.h cmocka_pbc.h; do link_into "usr/include/$h" "include/$h"; done
    # cJSON (checkpoint headers, src/io): included as <cjson/cJSON.h>
    link_into "$la/libcjson.so.1" lib/libcjson.so.1
    link_into "$la/libcjson.so.1" lib/libcjson.so
    mkdir -p "$prefix/include/cjson"
    link_into usr/include/cjson/cJSON.h include/cjson/cJSON.h
    # oneDNN (convolution, pooling and BF16 GEMM on the CPU): found by meson's find_library
    # through LIBRARY_PATH and CPATH (the exports below)
    link_into "$la/libdnnl.so.2" lib/libdnnl.so.2
    link_into "$la/libdnnl.so.2" lib/libdnnl.so
    mkdir -p "$prefix/include/oneapi"
    link_into usr/include/oneapi/dnnl include/oneapi/dnnl
    local cm_version
    cm_version=$(sed -n 's/^Version: *//p' "$prefix/root/$la/pkgconfig/cmocka.pc" 2>/dev/null)
    write_pc openblas "OpenBLAS (OpenMP)" "${ob_version:-0.3.21}" openblas
    write_pc cmocka "Unit testing framework for C" "${cm_version:-1.1.5}" cmocka
    write_pc libcjson "Ultralightweight JSON parser in ANSI C" 1.7.15 cjson

    # pkgconf, for a machine without pkg-config.
    if [[ -e "$prefix/root/usr/bin/pkgconf" ]]; then
        link_into "$la/libpkgconf.so.3" lib/libpkgconf.so.3
        link_into usr/bin/pkgconf bin/pkgconf
        if [[ "${MT_GPU_FORCE_PKGCONF:-0}" == 1 ]] || ! command -v pkg-config >/dev/null 2>&1; then
            ln -sfn pkgconf "$prefix/bin/pkg-config"
            say "$prefix/bin/pkg-config is the carried pkgconf"
        else
            rm -f "$prefix/bin/pkg-config"
        fi
    fi

    # meson and ninja from the wheels. pip writes its own bin/ scripts under py/bin; the
    # wrappers in PREFIX/bin work also when pip could not run (the zip fallback).
    local wheels=("$dir"/*.whl)
    if [[ -e "${wheels[0]}" ]]; then
        if [[ "${MT_GPU_NO_PIP:-0}" != 1 ]] && python3 -m pip --version >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check \
                --upgrade --target "$prefix/py" "${wheels[@]}" >&2
        else
            say "python3 has no pip: unzipping the wheels into $prefix/py"
            python3 - "$prefix/py" "${wheels[@]}" <<'EOF'
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
EOF
        fi
        local ninja_bin
        # The wheel's binary: py/bin/ninja after pip, py/ninja-*.data/scripts/ninja unzipped.
        ninja_bin=$(find "$prefix/py" -maxdepth 3 -type f -name ninja \( -path '*/py/bin/*' -o \
            -path '*.data/scripts/*' \) 2>/dev/null | head -n 1 || true)
        if [[ -n "$ninja_bin" ]]; then
            chmod +x "$ninja_bin"
            ln -sfn "../py/${ninja_bin#"$prefix/py/"}" "$prefix/bin/ninja"
        fi
        if [[ -d "$prefix/py/mesonbuild" ]]; then
            cat >"$prefix/bin/meson" <<'EOF'
#!/bin/sh
# meson from the carried wheel (tools/gpu_deps.sh unpack)
here=$(dirname "$(readlink -f "$0")")
PYTHONPATH="$here/../py${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m mesonbuild.mesonmain "$@"
EOF
            chmod +x "$prefix/bin/meson"
        fi
        say "wheels in $prefix/py:" "$(find "$prefix/py" -maxdepth 1 -name '*.dist-info' -printf '%f ')"
    fi
    say "prefix ready: $prefix (lib: $(find "$prefix/lib" -maxdepth 1 ! -type d -printf '%f '))"
    print_exports "$prefix"
}

case "${1:-}" in
    fetch)
        shift
        cmd_fetch "$@"
        ;;
    unpack)
        shift
        cmd_unpack "$@"
        ;;
    exports)
        [[ $# -eq 2 ]] || die "usage: gpu_deps.sh exports PREFIX"
        [[ -d "$2/lib/pkgconfig" ]] || die "$2 is not an unpacked prefix"
        print_exports "$(cd "$2" && pwd)"
        ;;
    *)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
