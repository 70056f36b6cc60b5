#!/usr/bin/env bash
# preload_smoke.sh: real programs from Debian under LD_PRELOAD=libcoralloc.so.
#
# usage: preload_smoke.sh LIBCORALLOC_SO PRELOAD_PROBE WHICH [SMOKE_CXX SRC_DIR]
#   WHICH: python | gcc | git | cxx | all
#
# Each program runs once without and once with the preload; the outputs must
# be identical (a diff is printed otherwise). The preloaded run is proven to
# use coralloc in every process it starts: ld.so's LD_DEBUG=bindings log
# (written to files, one per process, not to the program's output) must show
# each process's malloc/calloc/realloc/free bound to libcoralloc.so and to
# nothing else; the probe (which finds coral_owns with dlsym and checks
# coral_owns(malloc(1))) must pass under the same LD_PRELOAD and fail without
# it. Exit 0: all good; 77: a program is not installed (ctest: skipped);
# anything else: failure.
set -u
LIB=${1:?libcoralloc.so path}
PROBE=${2:?preload_probe path}
WHICH=${3:-all}
SMOKE_CXX=${4:-}
SRC_DIR=${5:-$(dirname "$0")}

fail() { echo "FAIL: $*" >&2; exit 1; }

[ -f "$LIB" ] || fail "no $LIB"
LIB=$(readlink -f "$LIB")
[ -x "$PROBE" ] || fail "no probe $PROBE"
unset LD_PRELOAD LD_DEBUG LD_DEBUG_OUTPUT

TMP=$(mktemp -d /tmp/coral_preload.XXXXXX) || fail "mktemp"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/lddebug"

need() { bash "$SRC_DIR/deps.sh" skipped "$@" || exit $?; }

# The probe: passes with the preload, fails without (so it can fail).
probe() {
    local out
    out=$(LD_PRELOAD="$LIB" "$PROBE" 2>&1) || fail "probe under LD_PRELOAD: $out"
    if "$PROBE" >/dev/null 2>&1; then
        fail "probe passes without LD_PRELOAD: it proves nothing"
    fi
}

# ld_debug_lines FILE: an LD_DEBUG log, one binding per line. The threads
# of a process write to the same log, and ld.so writes a line in pieces,
# so one thread's binding can begin in the middle of another's line
# ("... normal symbol `free'   9858:<tab>binding file ..."): each
# "PID:<tab>binding file" starts a line of its own here.
ld_debug_lines() {
    sed -E 's/([^ ]) +([0-9]+:\tbinding file )/\1\n\2/g' "$1"
}

# check_bindings TAG PROGRAM_REGEX...: every process logged under TAG bound
# its allocation functions to libcoralloc.so only, and processes whose
# executable matches each PROGRAM_REGEX were among them.
check_bindings() {
    local tag=$1
    shift
    local files=("$TMP"/lddebug/"$tag".*)
    [ -e "${files[0]}" ] || fail "$tag: no LD_DEBUG log: did ld.so run?"
    local n=0 f exe bad
    local exes=""
    for f in "${files[@]}"; do
        # lines: "PID: binding file A [0] to B [0]: normal symbol `malloc' ..."
        # A binding to a non-PIE executable is to its canonical PLT entry,
        # which jumps to whatever the executable's own binding is: accepted
        # when that binding of the same symbol is to libcoralloc.so.
        bad=$(awk -v lib="$LIB" '
            match($0, /normal symbol `(malloc|calloc|realloc|free)\x27/) {
                sym = substr($0, RSTART + 15, RLENGTH - 16)
                to = $0; sub(/.* to /, "", to); sub(/ \[[0-9]+\]: normal symbol.*/, "", to)
                if (to == lib) good[sym] = 1
                else { n++; bto[n] = to; bsym[n] = sym; line[n] = $0 }
            }
            END {
                for (i = 1; i <= n; i++)
                    if (bto[i] ~ /\.so(\.[0-9]+)*$/ || !good[bsym[i]]) print line[i]
            }' <(ld_debug_lines "$f") | head -3)
        [ -z "$bad" ] || fail "$tag: allocation symbols bound elsewhere than coralloc in process log $(basename "$f"):
$bad"
        if grep -qE "normal symbol \`malloc'" "$f"; then
            n=$((n + 1))
            exe=$(ld_debug_lines "$f" | grep -E "binding file [^ ]+ \[0\] to " |
                sed -E 's/.*binding file ([^ ]+) \[0\].*/\1/' |
                grep -v -E '\.so(\.[0-9]+)*$' | head -1)
            exes="$exes ${exe:-?}"
        fi
    done
    [ "$n" -gt 0 ] || fail "$tag: no process bound malloc at all"
    local want
    for want in "$@"; do
        echo "$exes" | tr ' ' '\n' | grep -qE "$want" ||
            fail "$tag: no process running $want used coralloc (seen:$exes)"
    done
    echo "$tag: $n processes, all with malloc & co bound to libcoralloc.so:$(echo "$exes" | tr ' ' '\n' | xargs -n1 basename 2>/dev/null | sort -u | tr '\n' ' ')"
}

# compare TAG FILE_PLAIN FILE_PRELOAD
compare() {
    if ! cmp -s "$2" "$3"; then
        echo "FAIL: $1: output differs with LD_PRELOAD=$LIB" >&2
        diff -u "$2" "$3" | head -60 >&2
        exit 1
    fi
    [ -s "$2" ] || fail "$1: empty output"
    echo "$1: same output with and without coralloc ($(wc -c <"$2") bytes)"
}

# preloaded TAG CMD...: runs CMD with coralloc preloaded and bindings logged.
preloaded() {
    local tag=$1
    shift
    LD_PRELOAD="$LIB" LD_DEBUG=bindings LD_DEBUG_OUTPUT="$TMP/lddebug/$tag" "$@"
}

# ---- python ----------------------------------------------------------------
run_python() {
    local PY=/usr/bin/python3
    [ -x "$PY" ] || PY=$(command -v python3 || true)
    [ -n "$PY" ] && [ -x "$PY" ] || need python3
    probe
    cat >"$TMP/alloc.py" <<'EOF'
import gc, hashlib, json
h = hashlib.sha256()
data = {}
for i in range(200000):
    k = "key%d" % (i * 7919 % 100003)
    data.setdefault(k, []).append(str(i) * (i % 7))
rows = sorted((k, len(v), sum(len(s) for s in v)) for k, v in data.items())
for r in rows:
    h.update(repr(r).encode())
blobs = [bytes([i % 256]) * (i % 1000) for i in range(20000)]
h.update(b"".join(blobs))
sub = {k: data[k] for k in list(data)[:5000]}
back = json.loads(json.dumps(sub))
h.update(str(back == sub).encode())
grow = []
for i in range(300000):
    grow.append(i * i)
h.update(str(sum(grow)).encode())
text = ",".join(str(i) for i in range(500000))
h.update(hashlib.sha256(text.encode()).digest())
tree = None
for i in range(100000):
    tree = (i, tree, [i] * (i % 5))
depth = 0
while tree is not None:
    depth += 1
    tree = tree[1]
h.update(str(depth).encode())
del data, rows, blobs, grow, text
gc.collect()
big = bytearray(50 * 1024 * 1024)
big[-1] = 1
h.update(str(sum(big[-10:])).encode())
print(len(sub), depth, h.hexdigest())
EOF
    local mode
    for mode in pymalloc malloc; do
        PYTHONHASHSEED=0 PYTHONMALLOC=$mode "$PY" "$TMP/alloc.py" >"$TMP/py.$mode.plain" ||
            fail "python3 ($mode) failed without preload"
        PYTHONHASHSEED=0 PYTHONMALLOC=$mode preloaded "py-$mode" "$PY" "$TMP/alloc.py" \
            >"$TMP/py.$mode.pre" || fail "python3 ($mode) failed under LD_PRELOAD"
        compare "python3 (PYTHONMALLOC=$mode)" "$TMP/py.$mode.plain" "$TMP/py.$mode.pre"
        check_bindings "py-$mode" 'python3'
    done
    # and from inside: python's own malloc is coralloc's
    LD_PRELOAD="$LIB" "$PY" -c '
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.coral_owns.argtypes = [ctypes.c_void_p]
p = libc.malloc(100)
assert libc.coral_owns(p), "python malloc is not coralloc"
libc.free(p)
' || fail "python3: ctypes check of coral_owns(malloc(100)) failed"
    echo "python3: ctypes sees coral_owns(malloc(100)) true"
}

# ---- gcc / g++ -------------------------------------------------------------
gen_c_source() {
    cat <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b)
{
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return x < y ? -1 : x > y;
}
EOF
    local i
    for i in $(seq 0 149); do
        cat <<EOF
static unsigned f$i(unsigned x)
{
    switch (x % 7) {
    case 0: return x * $((i * 2 + 3)) + $i;
    case 1: return (x >> 3) ^ $((i * 7919 % 65536));
    case 2: { unsigned s = 0; for (unsigned k = 0; k < (x & 15); k++) s += k * $i; return s; }
    case 3: return x + $i > 1000 ? x - $i : x + $((i * 3));
    default: return x * x + $i;
    }
}
EOF
    done
    echo "static unsigned (*fs[])(unsigned) = {"
    for i in $(seq 0 149); do printf 'f%d, ' "$i"; done
    echo "};"
    cat <<'EOF'
int main(void)
{
    enum { N = 100000 };
    unsigned *v = malloc(N * sizeof *v);
    if (!v) return 1;
    unsigned x = 12345;
    for (unsigned i = 0; i < N; i++) {
        x = fs[i % (sizeof fs / sizeof *fs)](x ^ i);
        v[i] = x;
    }
    qsort(v, N, sizeof *v, cmp);
    unsigned long long h = 0;
    for (unsigned i = 0; i < N; i++) h = h * 1000003u + v[i];
    char *s = strdup("compiled under coralloc");
    printf("%s: %llx %u %u\n", s, h, v[0], v[N - 1]);
    free(s);
    free(v);
    return 0;
}
EOF
}

run_gcc() {
    need gcc g++
    probe
    gen_c_source >"$TMP/prog.c"
    # assembly text: deterministic, must be the same byte for byte
    gcc -O2 -frandom-seed=coral -S -o "$TMP/prog.plain.s" "$TMP/prog.c" ||
        fail "gcc -S failed without preload"
    preloaded gcc-S gcc -O2 -frandom-seed=coral -S -o "$TMP/prog.pre.s" "$TMP/prog.c" ||
        fail "gcc -S failed under LD_PRELOAD"
    compare "gcc -O2 -S" "$TMP/prog.plain.s" "$TMP/prog.pre.s"
    check_bindings gcc-S 'gcc' 'cc1$'
    # a whole compile and link; the programs' outputs must be the same
    gcc -O2 -o "$TMP/prog.plain" "$TMP/prog.c" || fail "gcc failed without preload"
    preloaded gcc gcc -O2 -o "$TMP/prog.pre" "$TMP/prog.c" || fail "gcc failed under LD_PRELOAD"
    "$TMP/prog.plain" >"$TMP/prog.plain.out" || fail "program built without preload failed"
    "$TMP/prog.pre" >"$TMP/prog.pre.out" || fail "program built under coralloc failed"
    compare "gcc-built program" "$TMP/prog.plain.out" "$TMP/prog.pre.out"
    check_bindings gcc 'gcc' 'cc1$' '(^|/|-)as$' 'collect2$' '(^|/|-)ld(\.bfd|\.gold)?$'
    # g++ on a C++ source with the standard headers (cc1plus)
    local cxx_src="$SRC_DIR/preload/smoke_cxx.cc"
    [ -f "$cxx_src" ] || fail "no $cxx_src"
    g++ -O1 -pthread -o "$TMP/cxx.plain" "$cxx_src" || fail "g++ failed without preload"
    preloaded gxx g++ -O1 -pthread -o "$TMP/cxx.pre" "$cxx_src" || fail "g++ failed under LD_PRELOAD"
    "$TMP/cxx.plain" >"$TMP/cxx.plain.out" || fail "g++-built program failed"
    "$TMP/cxx.pre" >"$TMP/cxx.pre.out" || fail "program built by g++ under coralloc failed"
    compare "g++-built program" "$TMP/cxx.plain.out" "$TMP/cxx.pre.out"
    check_bindings gxx 'g\+\+' 'cc1plus$'
}

# ---- git -------------------------------------------------------------------
git_session() { # $1: repo dir; prints what must be identical
    local repo=$1
    export HOME="$TMP/home" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
    export GIT_AUTHOR_NAME="Coral Tester" GIT_AUTHOR_EMAIL="tester@example.invalid"
    export GIT_COMMITTER_NAME="Coral Tester" GIT_COMMITTER_EMAIL="tester@example.invalid"
    export TZ=UTC LC_ALL=C
    mkdir -p "$HOME" "$repo" && cd "$repo" || return 1
    git init -q -b main . || return 1
    local c i
    for c in 1 2 3 4 5; do
        export GIT_AUTHOR_DATE="2024-01-0$c 12:00:00 +0000" GIT_COMMITTER_DATE="2024-01-0$c 12:00:00 +0000"
        mkdir -p "dir$c"
        for i in $(seq 1 40); do
            seq $((c * i)) $((c * i + 200 + i)) >"dir$c/file$i.txt"
        done
        seq 1 $((c * 1000)) | sed "s/^/line $c /" >common.txt
        git add -A || return 1
        git commit -q -m "commit $c: $((c * 40)) files" || return 1
    done
    git log --stat --format='%H %an %ad %s' --date=iso || return 1
    git show --format='%H' HEAD~2:common.txt | tail -3 || return 1
    git gc -q || return 1
    git fsck --no-progress 2>&1 || return 1
    git count-objects -v | grep -E '^(count|in-pack|packs):' || return 1
    git diff --stat HEAD~4 HEAD | tail -1 || return 1
}

run_git() {
    need git
    probe
    (git_session "$TMP/repo.plain") >"$TMP/git.plain" 2>&1 || {
        cat "$TMP/git.plain" >&2
        fail "git session failed without preload"
    }
    (
        export LD_PRELOAD="$LIB" LD_DEBUG=bindings LD_DEBUG_OUTPUT="$TMP/lddebug/git"
        git_session "$TMP/repo.pre"
    ) >"$TMP/git.pre" 2>&1 || {
        cat "$TMP/git.pre" >&2
        fail "git session failed under LD_PRELOAD"
    }
    compare "git (init/add/commit/log --stat/gc/fsck)" "$TMP/git.plain" "$TMP/git.pre"
    check_bindings git '(^|/)git$'
}

# ---- the C++ program built by CMake ----------------------------------------
run_cxx() {
    [ -n "$SMOKE_CXX" ] && [ -x "$SMOKE_CXX" ] || fail "no smoke_cxx program given"
    probe
    "$SMOKE_CXX" >"$TMP/smoke.plain" || fail "smoke_cxx failed without preload"
    preloaded smoke "$SMOKE_CXX" >"$TMP/smoke.pre" || fail "smoke_cxx failed under LD_PRELOAD"
    compare "C++ iostreams + std::thread" "$TMP/smoke.plain" "$TMP/smoke.pre"
    check_bindings smoke 'smoke_cxx$'
}

case "$WHICH" in
python) run_python ;;
gcc) run_gcc ;;
git) run_git ;;
cxx) run_cxx ;;
all)
    run_python
    run_gcc
    run_git
    run_cxx
    ;;
*) fail "unknown program set '$WHICH'" ;;
esac
echo "preload_smoke $WHICH: passed"
exit 0
