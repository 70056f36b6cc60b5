#!/usr/bin/env bash
# startup_cost.sh: what preloading libcoralloc.so adds to a process's start
# and exit, asserted without timing (docs/DESIGN.md, "Start-up and exit").
#
# usage: startup_cost.sh LIBCORALLOC_SO STARTUP_ALLOC
#
# 1. /bin/true (which never allocates) under the preload makes no system
#    call beyond loading the library: one open, read, fstat and close, at
#    most 3 mmaps (2 segments and the .bss) and one mprotect (RELRO); no
#    thread, no madvise, no /proc or /sys file, no signal or atfork set-up.
# 2. It resolves none of the library's libc imports (lazy binding): at most
#    5 bindings from the library (data the loader must bind: stderr,
#    __libc_stack_end, __libc_single_threaded, __cxa_finalize; and
#    __register_atfork, which the library's constructor calls to register
#    its fork handlers before the program can register its own).
# 3. A program that allocates a few hundred blocks and exits
#    (tests/preload/startup_alloc.c) adds to that 2 mmaps (the heap pool and
#    one segment; one more mmap and a munmap when the kernel's first address
#    for the segment is not 4 MiB-aligned) and nothing else: no purge
#    thread, no madvise.
# Needs strace (exit 77, SKIPPED, without it).
set -u
LIB=$(readlink -f "${1:?libcoralloc.so path}")
ALLOC=${2:?startup_alloc path}
bash "$(dirname "$0")/deps.sh" skipped strace || exit $?
unset LD_PRELOAD LD_DEBUG LD_BIND_NOW
TMP=$(mktemp -d /tmp/coral_startup.XXXXXX) || exit 1
trap 'rm -rf "$TMP"' EXIT
status=0
fail() {
    echo "FAIL: $*"
    status=1
}

# Per system call name, how many calls: "name count" lines, sorted. The
# trace must have run: strace exits 0 (it exits with the command's status,
# and every command traced here exits 0), and the trace shows the command's
# execve and its exit_group; else the test stops here, since an empty trace
# would read as "no system call added".
calls() { # out-file command...
    local out=$1 rc=0
    shift
    strace -f -qq -o "$out.raw" "$@" >/dev/null 2>"$out.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: strace $* exited with status $rc: $(head -c 500 "$out.err")"
        exit 1
    fi
    sed -n 's/^\([0-9]* *\)\{0,1\}\([a-z_0-9]*\)(.*/\2/p' "$out.raw" | sort | uniq -c |
        awk '{print $2, $1}' >"$out"
    local name
    for name in execve exit_group; do
        if ! grep -q "^$name " "$out"; then
            echo "FAIL: the trace of $* has no $name call ($(wc -l <"$out.raw") lines): strace saw nothing"
            exit 1
        fi
    done
}

# A preloaded run's trace must show the library being opened: else
# LD_PRELOAD did not take and nothing was measured.
check_loaded() { # label preloaded
    grep -q "open.*\"$LIB\"" "$2.raw" || fail "$1: the trace never opens $LIB: not preloaded"
}

# The calls the preloaded run adds (name and how many more), checked
# against the budget in $TMP/budget ("name max" lines).
check_added() { # label plain preloaded
    local label=$1 plain=$2 pre=$3
    check_loaded "$label" "$pre"
    join -a 2 -e 0 -o 0,1.2,2.2 "$plain" "$pre" | awk '$3 > $2 {print $1, $3 - $2}' >"$TMP/added"
    echo "$label: system calls added by the preload: $(tr '\n' ' ' <"$TMP/added")"
    while read -r name n; do
        max=$(awk -v n="$name" '$1 == n {print $2}' "$TMP/budget")
        if [ -z "$max" ]; then
            fail "$label: $n call(s) of $name (none expected)"
        elif [ "$n" -gt "$max" ]; then
            fail "$label: $n more $name calls (at most $max expected)"
        fi
    done <"$TMP/added"
    if grep -E '"/(proc|sys)/' "$pre.raw" >/dev/null; then
        fail "$label: reads /proc or /sys: $(grep -E '"/(proc|sys)/' "$pre.raw" | head -3)"
    fi
}

LOAD_BUDGET="openat 1
read 1
pread64 2
newfstatat 1
fstat 1
close 1
mprotect 1"

# 1. /bin/true
calls "$TMP/true.pre" env LD_PRELOAD="$LIB" /bin/true
calls "$TMP/env.plain" env /bin/true
printf '%s\nmmap 3\n' "$LOAD_BUDGET" >"$TMP/budget"
check_added "/bin/true" "$TMP/env.plain" "$TMP/true.pre"

# 2. lazy binding: the loader binds none of the library's functions. The
# loader's report must list bindings at all (those of /bin/true itself), or
# a count of 0 would prove nothing.
LD_DEBUG=bindings LD_PRELOAD="$LIB" /bin/true >"$TMP/bindings" 2>&1
all=$(grep -c "binding file .* to .*normal symbol" "$TMP/bindings")
[ "$all" -gt 0 ] || fail "/bin/true: LD_DEBUG=bindings reported no binding at all"
bindings=$(grep -c "binding file $LIB \[0\] to .*normal symbol" "$TMP/bindings")
echo "/bin/true: $bindings symbol bindings from the library at start-up (of $all in all)"
[ "$bindings" -le 5 ] || fail "/bin/true: $bindings bindings from the library (at most 5): \
linked with -z now or -fno-plt?"

# 3. a program that allocates
LD_PRELOAD="$LIB" "$ALLOC" || fail "startup_alloc failed under the preload"
calls "$TMP/alloc.plain" env "$ALLOC"
calls "$TMP/alloc.pre" env LD_PRELOAD="$LIB" "$ALLOC"
printf '%s\nmmap 6\nmunmap 1\n' "$LOAD_BUDGET" >"$TMP/budget"
check_added "startup_alloc" "$TMP/alloc.plain" "$TMP/alloc.pre"

[ $status -eq 0 ] && echo "start-up cost as expected"
exit $status
