#!/usr/bin/env bash
# setuid_env.sh PROG: a set-user-ID program linked with coralloc ignores
# every CORALLOC_* variable (coral_env, src/base/options.c), as glibc
# ignores MALLOC_* there: run by another user, it prints no option line and
# writes no profile. The same program without the set-user-ID bit, run by
# that user with the same environment, prints the options and writes its
# profile: the variables do reach a program that may read them.
# Needs root (to make a root-owned set-user-ID copy and run it as nobody);
# else SKIPPED.
set -euo pipefail
prog=$1
if [ "$(id -u)" != 0 ]; then
    echo "SKIPPED: needs root, to make a set-user-ID copy of the program and run it as another user"
    exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
mkdir "$dir/out"
chmod 777 "$dir/out"
for copy in plain suid; do
    cp "$prog" "$dir/$copy"
    chown root:root "$dir/$copy"
done
chmod 755 "$dir/plain"
chmod 4755 "$dir/suid"

run() { # as user nobody, with the variables set; stdout to $1.out, stderr to $1.err
    setpriv --reuid=65534 --regid=65534 --clear-groups \
        env CORALLOC_VERBOSE=1 CORALLOC_PROFILE="$dir/out/$1" CORALLOC_PROFILE_RATE=4096 \
        "$dir/$1" >"$dir/$1.out" 2>"$dir/$1.err"
}
fail() { echo "FAIL: $*"; for f in "$dir"/*.out "$dir"/*.err; do echo "--- $f"; cat "$f"; done; exit 1; }

run plain || fail "the plain copy failed"
run suid || fail "the set-user-ID copy failed"
grep -q '^ruid 65534 euid 65534$' "$dir/plain.out" || fail "the plain copy did not run as nobody"
if ! grep -q '^ruid 65534 euid 0$' "$dir/suid.out"; then
    echo "SKIPPED: the set-user-ID bit had no effect here ($(cat "$dir/suid.out"); a nosuid mount?)"
    exit 77
fi

grep -q '^coralloc: option CORALLOC_VERBOSE=1' "$dir/plain.err" ||
    fail "the plain copy did not print its options: CORALLOC_VERBOSE did not reach it"
compgen -G "$dir/out/plain.*" >/dev/null || fail "the plain copy wrote no profile"

if grep -q 'coralloc' "$dir/suid.err"; then fail "the set-user-ID copy read CORALLOC_VERBOSE"; fi
if compgen -G "$dir/out/suid.*" >/dev/null; then
    fail "the set-user-ID copy wrote a profile as root: $(ls -l "$dir"/out/suid.*)"
fi
echo "setuid_env: the set-user-ID copy ignored CORALLOC_VERBOSE and CORALLOC_PROFILE; the plain copy read them"
