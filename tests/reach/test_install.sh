#!/usr/bin/env bash
# test_install.sh WAY BUILD_DIR SOURCE_DIR CMAKE
#   WAY pkgconfig: install to a temporary prefix; build tests/reach/installed's
#       C and C++ programs with pkg-config (coralloc, coralloc-static) and run
#       them; check the soname, the installed command and man pages.
#   WAY cmake: the same programs through find_package(coralloc) with
#       coralloc::coralloc and coralloc::coralloc-static.
#   WAY deb: cpack's Debian package: its metadata and files, and the programs
#       built with pkg-config against its files unpacked to a temporary folder.
# The programs fail unless coralloc serves their malloc/new (served.h).
# Exit 0: passed; 77: a tool is missing (skipped); else failure.
set -u
WAY=${1:?way}
BUILD=$(readlink -f "${2:?build dir}")
SRC=$(readlink -f "${3:?source dir}")
CMAKE=${4:-cmake}
PROGS=$SRC/tests/reach/installed
SKIP=77
unset LD_PRELOAD
for v in $(env | sed -n 's/^\(CORALLOC_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

TMP=$(mktemp -d /tmp/coral_install.XXXXXX) || exit 1
# A test's install must not replace the user's record of `make install`.
MANIFEST=$BUILD/install_manifest.txt
[ -e "$MANIFEST" ] && cp "$MANIFEST" "$TMP/manifest.saved"
cleanup() {
    if [ -e "$TMP/manifest.saved" ]; then cp "$TMP/manifest.saved" "$MANIFEST"; else rm -f "$MANIFEST"; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL ($WAY): $*" >&2; exit 1; }
need() { bash "$SRC/tests/deps.sh" skipped "$@" || exit $?; }
CC=${CC:-cc}
CXX=${CXX:-c++}
FLAGS="-O2 -Wall -Wextra -Werror -fno-builtin"

# build_pkgconfig PKG_CONFIG_DIR: the four programs, with pkg-config.
build_pkgconfig() {
    export PKG_CONFIG_PATH=$1
    local cflags libs slibs libdir
    cflags=$(pkg-config --cflags coralloc) || fail "pkg-config --cflags coralloc"
    libs=$(pkg-config --libs coralloc) || fail "pkg-config --libs coralloc"
    slibs=$(pkg-config --libs coralloc-static) || fail "pkg-config --libs coralloc-static"
    libdir=$(pkg-config --variable=libdir coralloc)
    mkdir -p "$TMP/bin"
    # shellcheck disable=SC2086
    {
        $CC $FLAGS $cflags "$PROGS/hello.c" $libs -Wl,-rpath,"$libdir" -o "$TMP/bin/hello_c" &&
            $CC $FLAGS $cflags "$PROGS/hello.c" $slibs -o "$TMP/bin/hello_c_static" &&
            $CXX $FLAGS $cflags "$PROGS/hello.cc" $libs -Wl,-rpath,"$libdir" -o "$TMP/bin/hello_cxx" &&
            $CXX $FLAGS $cflags "$PROGS/hello.cc" $slibs -o "$TMP/bin/hello_cxx_static"
    } || fail "building with pkg-config (cflags '$cflags', libs '$libs', static '$slibs')"
}

# run_programs DIR: each of the four runs and says coralloc served it.
run_programs() {
    for p in hello_c hello_c_static hello_cxx hello_cxx_static; do
        out=$("$1/$p" 2>&1) || fail "$p: $out"
        echo "$p: $out"
    done
    # The shared ones load the installed library, not the build tree's.
    local loaded
    loaded=$(ldd "$1/hello_c" | sed -n 's/.*libcoralloc.so[.0-9]* => \(.*\) (0x.*/\1/p')
    [ "$(dirname "$(readlink -f "$loaded")")" = "$(readlink -f "$2")" ] ||
        fail "hello_c does not load the library in $2: $(ldd "$1/hello_c")"
}

install_prefix() {
    "$CMAKE" --install "$BUILD" --prefix "$TMP/p" >"$TMP/install.log" 2>&1 ||
        fail "cmake --install: $(cat "$TMP/install.log")"
}

case $WAY in
pkgconfig)
    need pkg-config "$CC" "$CXX"
    install_prefix
    P=$TMP/p
    libdir=$(dirname "$(find "$P" -name coralloc.pc)")/..
    libdir=$(readlink -f "$libdir")
    for f in include/coralloc.h bin/coralloc share/man/man1/coralloc.1 share/man/man3/coralloc.3; do
        [ -f "$P/$f" ] || fail "not installed: $f"
    done
    for f in libcoralloc.a libcoralloc.so libcoralloc-profile.so pkgconfig/coralloc-static.pc \
        cmake/coralloc/corallocConfig.cmake; do
        [ -e "$libdir/$f" ] || fail "not installed: $libdir/$f"
    done
    soname=$(readelf -d "$libdir/libcoralloc.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ "$soname" = libcoralloc.so.0 ] || fail "soname '$soname', want libcoralloc.so.0"
    [ -f "$libdir/libcoralloc.so.0" ] || fail "no libcoralloc.so.0"
    build_pkgconfig "$libdir/pkgconfig"
    run_programs "$TMP/bin" "$libdir"
    # The installed command finds the installed library.
    ver=$("$P/bin/coralloc" --version) || fail "installed coralloc --version"
    case $ver in *"library $libdir/libcoralloc.so"*) ;; *) fail "installed command uses: $ver" ;; esac
    "$P/bin/coralloc" run -- "$TMP/bin/hello_c" >/dev/null || fail "installed coralloc run"
    "$P/bin/coralloc" run --leaks -- "$TMP/bin/hello_c" >/dev/null ||
        fail "installed coralloc run --leaks (the profiling library)"
    # Everything installed is listed in the manifest (what uninstall removes).
    xargs rm -f <"$MANIFEST" || fail "removing the manifest's files"
    left=$(find "$P" -type f -o -type l)
    [ -z "$left" ] || fail "files the manifest does not list: $left"
    ;;
cmake)
    need "$CC" "$CXX"
    install_prefix
    "$CMAKE" -S "$PROGS" -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$TMP/p" \
        -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" >"$TMP/cmake.log" 2>&1 ||
        fail "configuring the consumer project: $(cat "$TMP/cmake.log")"
    "$CMAKE" --build "$TMP/consumer" >"$TMP/build.log" 2>&1 ||
        fail "building the consumer project: $(cat "$TMP/build.log")"
    libdir=$(readlink -f "$(dirname "$(find "$TMP/p" -name libcoralloc.a)")")
    run_programs "$TMP/consumer" "$libdir"
    ;;
deb)
    need dpkg-deb pkg-config "$CC" "$CXX"
    command -v cpack >/dev/null || [ -x "$(dirname "$CMAKE")/cpack" ] || { bash "$SRC/tests/deps.sh" skipped cpack; exit $SKIP; }
    CPACK=$(dirname "$CMAKE")/cpack
    [ -x "$CPACK" ] || CPACK=cpack
    (cd "$BUILD" && "$CPACK" -G DEB -B "$TMP/pkg" >"$TMP/cpack.log" 2>&1) ||
        fail "cpack: $(cat "$TMP/cpack.log")"
    deb=$(ls "$TMP"/pkg/coralloc_*.deb 2>/dev/null | head -n1)
    [ -n "$deb" ] || fail "no coralloc_*.deb in $(ls "$TMP/pkg")"
    [ "$(dpkg-deb -f "$deb" Package)" = coralloc ] || fail "package name"
    [ "$(dpkg-deb -f "$deb" Architecture)" = "$(dpkg --print-architecture)" ] || fail "architecture"
    dpkg-deb -c "$deb" >"$TMP/contents"
    for f in ./usr/include/coralloc.h ./usr/bin/coralloc ./usr/share/man/man1/coralloc.1 \
        ./usr/share/man/man3/coralloc.3; do
        grep -q " $f\$" "$TMP/contents" || fail "$f not in the package: $(cat "$TMP/contents")"
    done
    for f in libcoralloc.so.0 libcoralloc-profile.so libcoralloc.a pkgconfig/coralloc.pc \
        cmake/coralloc/corallocConfig.cmake; do
        grep -Eq " \./usr/lib/([a-z0-9_-]+/)?$f( ->.*)?\$" "$TMP/contents" || fail "$f not in the package"
    done
    dpkg-deb -x "$deb" "$TMP/root"
    pcdir=$(dirname "$(find "$TMP/root" -name coralloc.pc)")
    build_pkgconfig "$pcdir"
    run_programs "$TMP/bin" "$(readlink -f "$pcdir/..")"
    ;;
*) fail "unknown way" ;;
esac
echo "PASS ($WAY)"
