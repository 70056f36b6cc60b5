#!/usr/bin/env bash
# test_deps.sh: tests/deps.sh against stand-ins for dpkg-query, apt-get and
# id (first in PATH), which record what they were asked:
#   1. all installed: no apt-get call;
#   2. root, two packages missing: apt-get update, then one install of those
#      two and nothing else;
#   3. not root: no apt-get call, the missing packages named, exit 0;
#   4. root with CORALLOC_NO_INSTALL=1: no apt-get call;
#   5. `skipped TOOL`: exit 77 and the SKIPPED line names TOOL's package;
#      exit 0 when the tool is there.
set -u
here=$(cd "$(dirname "$0")" && pwd)
deps=$here/deps.sh
failures=0
fail() { echo "FAIL: $*" && failures=$((failures + 1)); }
tmp=$(mktemp -d /tmp/coral_test_deps.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT

bin=$tmp/bin
mkdir -p "$bin"
cat >"$bin/dpkg-query" <<'EOF'
#!/usr/bin/env bash
# -W -f=FORMAT PACKAGE...: "ii  NAME" for the packages in $STUB/installed
shift 2
rc=0
for p in "$@"; do
    if grep -qx "$p" "$STUB/installed"; then echo "ii  $p"; else echo "dpkg-query: no packages found matching $p" >&2; rc=1; fi
done
echo "dpkg-query $*" >>"$STUB/calls"
exit $rc
EOF
cat >"$bin/apt-get" <<'EOF'
#!/usr/bin/env bash
echo "apt-get $*" >>"$STUB/calls"
if [ "$1" = install ]; then
    for p in "$@"; do case $p in -* | install) ;; *) echo "$p" >>"$STUB/installed" ;; esac; done
fi
EOF
cat >"$bin/id" <<'EOF'
#!/usr/bin/env bash
echo "$STUB_UID"
EOF
chmod +x "$bin"/*

all=$(awk '!/^#/ && NF {print $1}' "$here/packages.txt")
[ "$(echo "$all" | wc -l)" -ge 15 ] || fail "packages.txt lists $(echo "$all" | wc -l) packages"

run() { # uid [VAR=value...]: runs deps.sh install; its output in $tmp/out
    local uid=$1
    shift
    : >"$STUB/calls"
    env "$@" STUB="$STUB" STUB_UID="$uid" PATH="$bin:$PATH" bash "$deps" install >"$tmp/out" 2>&1
}
export STUB=$tmp/state
mkdir -p "$STUB"

# 1. all installed
echo "$all" >"$STUB/installed"
run 0 || fail "1: exit status $?"
grep -q apt-get "$STUB/calls" && fail "1: apt-get called with everything installed: $(cat "$STUB/calls")"
[ "$(grep -c dpkg-query "$STUB/calls")" -eq 1 ] || fail "1: not one dpkg-query call: $(cat "$STUB/calls")"

# 2. root, strace and valgrind missing
echo "$all" | grep -vx -e strace -e valgrind >"$STUB/installed"
run 0 || fail "2: exit status $?"
grep -q "^apt-get update" "$STUB/calls" || fail "2: no apt-get update: $(cat "$STUB/calls")"
installs=$(grep "^apt-get install" "$STUB/calls")
[ "$(echo "$installs" | wc -l)" -eq 1 ] || fail "2: not one apt-get install: $installs"
got=$(echo "$installs" | tr ' ' '\n' | grep -v -e '^-' -e '^apt-get$' -e '^install$' | sort | tr '\n' ' ')
[ "$got" = "strace valgrind " ] || fail "2: apt-get install of '$got', not 'strace valgrind '"

# 3. not root
echo "$all" | grep -vx redis-server >"$STUB/installed"
run 1000 || fail "3: exit status $?"
grep -q apt-get "$STUB/calls" && fail "3: apt-get called as a user: $(cat "$STUB/calls")"
grep -q "redis-server" "$tmp/out" || fail "3: the missing package is not named: $(cat "$tmp/out")"

# 4. root, CORALLOC_NO_INSTALL=1
run 0 CORALLOC_NO_INSTALL=1 || fail "4: exit status $?"
grep -q apt-get "$STUB/calls" && fail "4: apt-get called with CORALLOC_NO_INSTALL=1"

# 5. skipped, on a list of made-up packages of the same form
cp "$here/packages.txt" "$tmp/list"
echo "coral-fake-a   coral-no-tool-1,coral-no-tool-2   test_deps" >>"$tmp/list"
out=$(CORALLOC_PACKAGES=$tmp/list bash "$deps" skipped bash coral-no-tool-2)
rc=$?
[ $rc -eq 77 ] || fail "5: exit status $rc for a missing tool, not 77"
echo "$out" | grep -q "^SKIPPED: coral-no-tool-2 is not installed (Debian package coral-fake-a" ||
    fail "5: $out"
CORALLOC_PACKAGES=$tmp/list bash "$deps" skipped bash || fail "5: exit status $? for bash"

[ $failures -eq 0 ] || exit 1
echo "deps: installs only what is missing, only as root, and SKIPPED names the package"
