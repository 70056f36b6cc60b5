#!/usr/bin/env bash
# deps.sh: the Debian packages the tests need (tests/packages.txt, the one
# list), for `make test` and .ci/run.
#
#   deps.sh install    installs the missing packages when root (apt-get);
#                      else names them and goes on (their tests will say
#                      SKIPPED). CORALLOC_NO_INSTALL=1: never installs.
#   deps.sh missing    prints the missing packages, one a line.
#   deps.sh skipped TOOL...
#                      for the first TOOL that is not installed, prints the
#                      SKIPPED line naming its package and exits 77 (ctest's
#                      SKIP_RETURN_CODE); exits 0 when all are there.
#
# When everything is installed, `install` costs one dpkg-query call and no
# apt-get. Without dpkg-query (not Debian) it checks nothing and goes on.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list=${CORALLOC_PACKAGES:-$here/packages.txt}
SKIP=77

say() { echo "make test: $*" >&2; }

# The package names of the list, in order.
packages() { awk '!/^#/ && NF {print $1}' "$list"; }

# The package that provides TOOL (a command or a file), or nothing.
package_of() {
    awk -v t="$1" '!/^#/ && NF { n = split($2, p, ","); for (i = 1; i <= n; i++) if (p[i] == t) { print $1; exit } }' "$list"
}

# The packages of the list that dpkg does not have installed, one query.
missing() {
    command -v dpkg-query >/dev/null 2>&1 || return 0
    local all
    mapfile -t all < <(packages)
    dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${all[@]}" 2>/dev/null |
        awk '$1 == "ii" {print $2}' | sort -u >"$tmp/have" || true
    printf '%s\n' "${all[@]}" | sort -u | comm -23 - "$tmp/have"
}

install() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        say "no dpkg-query (not Debian): the packages in tests/packages.txt are not checked"
        return 0
    fi
    local need
    mapfile -t need < <(missing)
    [ "${#need[@]}" -eq 0 ] && return 0
    if [ "${CORALLOC_NO_INSTALL:-}" = 1 ]; then
        say "missing ${need[*]} (CORALLOC_NO_INSTALL=1): their tests will be SKIPPED"
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        say "missing ${need[*]}; not root, so their tests will be SKIPPED"
        say "to run them: sudo apt-get install ${need[*]}"
        return 0
    fi
    say "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } >"$tmp/apt.log" 2>&1; then
        tail -n 20 "$tmp/apt.log" >&2
        say "apt-get could not install ${need[*]}: their tests will be SKIPPED"
        return 0
    fi
    mapfile -t need < <(missing)
    [ "${#need[@]}" -eq 0 ] || say "still missing after apt-get: ${need[*]}"
}

# Beside the Debian packages: Google's pprof (profile_pprof reads the
# profiler's files with it), which Debian 12 does not package as a
# command. Installed with the Go toolchain from the Go module proxy, at
# the version pinned here, into $(go env GOPATH)/bin (where the test
# looks), on the same terms as the packages: when root and installing is
# allowed; without `go`, the test says SKIPPED.
PPROF_MODULE=github.com/google/pprof@v0.0.0-20261105003125-4bf881d7fb0b
install_pprof() {
    command -v pprof >/dev/null 2>&1 && return 0
    command -v go >/dev/null 2>&1 || { say "no go toolchain: profile_pprof will be SKIPPED"; return 0; }
    [ -x "$(go env GOPATH)/bin/pprof" ] && return 0
    [ "${CORALLOC_NO_INSTALL:-}" = 1 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        say "pprof missing; not root, so profile_pprof will be SKIPPED (go install $PPROF_MODULE)"
        return 0
    fi
    say "go install $PPROF_MODULE"
    if ! go install "$PPROF_MODULE" >"$tmp/go.log" 2>&1; then
        tail -n 20 "$tmp/go.log" >&2
        say "go install failed: profile_pprof will be SKIPPED"
    fi
}

skipped() {
    local tool pkg
    for tool in "$@"; do
        if [ "${tool#/}" != "$tool" ]; then [ -e "$tool" ] && continue; else command -v "$tool" >/dev/null 2>&1 && continue; fi
        pkg=$(package_of "$tool")
        if [ -n "$pkg" ]; then
            echo "SKIPPED: $tool is not installed (Debian package $pkg: apt-get install $pkg, or run make test as root)"
        else
            echo "SKIPPED: $tool is not installed"
        fi
        exit $SKIP
    done
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/coral_deps.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
case ${1:-} in
install) install; install_pprof ;;
missing) missing ;;
skipped) shift; skipped "$@" ;;
*)
    echo "usage: deps.sh install | missing | skipped TOOL..." >&2
    exit 2
    ;;
esac
