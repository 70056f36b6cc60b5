#!/usr/bin/env bash
# run.sh LIB WORKDIR: glibc's own malloc tests against coralloc.
#
# The tests (malloc/tst-*.c) and their support library (support/) come from
# the installed glibc's source, Debian's glibc-source package
# (/usr/src/glibc/glibc-VERSION.tar.xz); they are built in WORKDIR against
# the installed glibc (with tests/glibc/prelude.h for the few macros glibc's
# build defines) and each runs under LD_PRELOAD=LIB. The tests that
# interpose their own malloc (tst-interpose-*) are not run; a test that does
# not build here is listed as such. Each test must pass, except those
# tests/glibc/expected.txt lists with the reason; a listed test that passes
# fails the run too, so that the list stays true.
# Exit 0: as expected; 1: not; 77 (SKIPPED): no glibc source for the
# installed glibc.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lib=$(realpath "$1")
work=$2
"$here/../deps.sh" skipped /usr/src/glibc || exit $?
ver=$(ldd --version | awk 'NR == 1 {print $NF}')
tarball=/usr/src/glibc/glibc-$ver.tar.xz
if [ ! -f "$tarball" ]; then
    echo "SKIPPED: no $tarball: glibc-source is not that of the installed glibc $ver"
    exit 77
fi
src=$work/glibc-$ver
flags=(-O1 -w -D_GNU_SOURCE -include "$here/prelude.h" -I"$src" -I"$src/support" -I"$work/inc"
    -DSRCDIR_PATH=\""$src"\" -DOBJDIR_PATH=\""$work"\"
    -DOBJDIR_ELF_LDSO_PATH=\"/lib64/ld-linux-x86-64.so.2\" -DINSTDIR_PATH=\"/usr\"
    -DLIBDIR_PATH=\"/usr/lib\" -DBINDIR_PATH=\"/usr/bin\" -DSBINDIR_PATH=\"/usr/sbin\"
    -DSLIBDIR_PATH=\"/lib\" -DROOTSBINDIR_PATH=\"/sbin\" -DCOMPLOCALEDIR_PATH=\"/usr/lib/locale\")

# ---- build (once per glibc version) ----------------------------------------
if [ ! -f "$work/built-$ver" ]; then
    rm -rf "$work" && mkdir -p "$work/inc" "$work/obj" "$work/bin"
    tar -xf "$tarball" -C "$work" "glibc-$ver/malloc" "glibc-$ver/support" "glibc-$ver/include" \
        "glibc-$ver/test-skeleton.c" || exit 1
    # glibc's internal headers that its support code uses, header-only.
    for h in libc-diag.h array_length.h intprops.h scratch_buffer.h alloc_buffer.h; do
        cp "$src/include/$h" "$work/inc/"
    done
    # The support library: every file that builds outside glibc's tree (a
    # few need its configuration; no malloc test uses them).
    export work
    ls "$src"/support/*.c | grep -Ev '/(tst-|test-driver|.*-container|links-dso-program|test-run-command)' |
        xargs -P 2 -I{} sh -c 'gcc -c "$@" "{}" -o "$work/obj/$(basename "{}" .c).o" 2>/dev/null || true' sh "${flags[@]}"
    ar rcs "$work/libsupport.a" "$work"/obj/*.o || exit 1
    for t in "$src"/malloc/tst-*.c; do
        name=$(basename "$t" .c)
        case $name in tst-interpose-*) continue ;; esac
        grep -q "do_test\|TEST_FUNCTION" "$t" || continue # (a piece other tests include)
        gcc "${flags[@]}" -I"$src/malloc" "$t" "$work/libsupport.a" -lpthread -o "$work/bin/$name" \
            2>"$work/bin/$name.build.log" || echo "$name" >>"$work/not-built"
    done
    touch "$work/built-$ver"
fi

# ---- run ----------------------------------------------------------------------
cd "$work/bin" || exit 1
# coralloc serves the calls: a test's first malloc prints its options.
# (grep reads them all: with -q it ends at the first line, and tst-malloc,
# writing the next, dies of SIGPIPE, which pipefail takes for a failure.)
if ! CORALLOC_VERBOSE=1 LD_PRELOAD=$lib ./tst-malloc 2>&1 | grep '^coralloc: option' >/dev/null; then
    echo "FAIL: LD_PRELOAD=$lib did not serve tst-malloc's calls"
    exit 1
fi
# (a test listed "fail-default" fails under the default build only)
case $(basename "$lib") in *secure*) build=secure ;; *) build=default ;; esac
expected_fail() {
    awk -v n="$1" -v b="$build" '!/^#/ && $1 == n && ($2 == "fail" || $2 == "fail-" b) {found = 1}
        END {exit !found}' "$here/expected.txt"
}
# glibc's test driver scales each test's own timeout by TIMEOUTFACTOR:
# tst-mallocfork2 (7 processes meeting at barriers, 100 s) slows several
# times over on a 2-core machine that make test -j2 loads, under glibc's
# own malloc as under coralloc.
export TIMEOUTFACTOR=${TIMEOUTFACTOR:-3}
passed=0 failed_as_listed=0 bad=0
for t in $(ls | grep -v '\.'); do
    start=$(date +%s)
    LD_PRELOAD=$lib timeout -s KILL 400 "./$t" >"$t.log" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    if [ $rc = 0 ] && ! expected_fail "$t"; then
        passed=$((passed + 1)); echo "PASS $t (${took} s)"
    elif [ $rc != 0 ] && expected_fail "$t"; then
        failed_as_listed=$((failed_as_listed + 1)); echo "fail $t, as listed in expected.txt (exit $rc)"
    elif [ $rc = 0 ]; then
        bad=$((bad + 1)); echo "UNEXPECTED PASS $t: take it out of tests/glibc/expected.txt"
    else
        bad=$((bad + 1)); echo "UNEXPECTED FAIL $t (exit $rc, ${took} s); its output:"; tail -n 20 "$t.log" | sed 's/^/    /'
    fi
done
[ -f "$work/not-built" ] && echo "not built here: $(tr '\n' ' ' <"$work/not-built")"
echo "glibc $ver's malloc tests under $(basename "$lib"): $passed passed, $failed_as_listed failed as listed, $bad unexpected"
[ $bad = 0 ] && [ $passed -gt 0 ]
