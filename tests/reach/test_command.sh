#!/usr/bin/env bash
# test_command.sh CASE CORALLOC_CMD LIBCORALLOC PRELOAD_PROBE
# One behaviour of the `coralloc` command per CASE. Exit 0: it behaves;
# 77: a tool the case needs is missing (skipped); else failure.
set -u
CASE=${1:?case}
CMD=${2:?coralloc command}
LIB=$(readlink -f "${3:?libcoralloc.so}")
PROBE=${4:?preload_probe}
unset LD_PRELOAD
for v in $(env | sed -n 's/^\(CORALLOC_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

TMP=$(mktemp -d /tmp/coral_cmd.XXXXXX) || exit 1
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL ($CASE): $*" >&2; exit 1; }

# run ARGS...: runs the command, sets $status, $out (stdout), $err (stderr).
run() {
    "$CMD" "$@" >"$TMP/out" 2>"$TMP/err"
    status=$?
    out=$(cat "$TMP/out")
    err=$(cat "$TMP/err")
}
# usage_error PATTERN ARGS...: exit 2, nothing on stdout, exactly one line on
# stderr, matching PATTERN.
usage_error() {
    local pattern=$1
    shift
    run "$@"
    [ "$status" = 2 ] || fail "coralloc $*: exit $status, want 2 (stderr: $err)"
    [ -z "$out" ] || fail "coralloc $*: printed on stdout: $out"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "coralloc $*: want one line on stderr, got: $err"
    grep -q -- "$pattern" "$TMP/err" || fail "coralloc $*: stderr does not say '$pattern': $err"
}
# stats tables in $err
tables() { grep -c '^coralloc statistics$' "$TMP/err"; }

case $CASE in
help)
    run --help
    [ "$status" = 0 ] || fail "exit $status"
    grep -q '^usage: coralloc run \[--secure\] \[--stats\] \[--option KEY=VALUE\]\.\.\. -- COMMAND' \
        "$TMP/out" || fail "no usage line: $out"
    ;;
version)
    run --version
    [ "$status" = 0 ] || fail "exit $status: $err"
    want=$(sed -n 's/^#define CORALLOC_VERSION "\(.*\)"/\1/p' "$(dirname "$0")/../../include/coralloc.h")
    [ "$out" = "coralloc $want (library $LIB: $want)" ] || fail "got '$out', want version $want and $LIB"
    ;;
no_args) usage_error "no command given" ;;
unknown_command) usage_error "unknown command 'frobnicate'" frobnicate ;;
run_no_command) usage_error "no command given" run --stats -- ;;
run_unknown_flag) usage_error "unknown flag '--bogus'" run --bogus -- true ;;
option_bad_form) usage_error "wants KEY=VALUE, not 'PURGE_DELAY_MS'" run --option PURGE_DELAY_MS -- true ;;
option_unknown) usage_error "unknown option 'NO_SUCH'" run --option NO_SUCH=1 -- true ;;
option_bad_value)
    usage_error "bad value for CORALLOC_PURGE_DELAY_MS: 'soon'" \
        run --option purge_delay_ms=soon -- touch "$TMP/ran"
    [ ! -e "$TMP/ran" ] || fail "the command ran despite the bad option"
    ;;
secure_missing)
    # A copy of the command where no library lies beside it.
    cp "$CMD" "$TMP/coralloc"
    CMD="$TMP/coralloc"
    usage_error "secure build (libcoralloc-secure.so) is not installed" run --secure -- touch "$TMP/ran"
    [ ! -e "$TMP/ran" ] || fail "the command ran without the secure build"
    ;;
secure_preloads)
    run run --secure -- "$PROBE"
    [ "$status" = 0 ] || fail "probe under coralloc run --secure: exit $status: $out $err"
    ;;
run_preloads)
    # The probe fails without coralloc, passes with it.
    "$PROBE" >/dev/null 2>&1 && fail "the probe passes without coralloc: it proves nothing"
    run run -- "$PROBE"
    [ "$status" = 0 ] || fail "probe under coralloc run: exit $status: $out $err"
    [ "$(tail -n1 "$TMP/out")" = "coralloc active" ] || fail "probe says: $out"
    ;;
run_passes_option)
    # The library itself reports the values (CORALLOC_VERBOSE prints them).
    run run --option verbose=on --option Purge_Delay_MS=7 --option CORALLOC_POPULATE=off -- "$PROBE"
    [ "$status" = 0 ] || fail "exit $status: $err"
    grep -q '^coralloc: option CORALLOC_PURGE_DELAY_MS=7 ' "$TMP/err" || fail "delay not 7: $err"
    grep -q '^coralloc: option CORALLOC_POPULATE=0 ' "$TMP/err" || fail "populate not off: $err"
    ;;
run_keeps_preload)
    LD_PRELOAD=/nonexistent/other.so run run -- sh -c 'printf %s "$LD_PRELOAD"'
    [ "$out" = "$LIB:/nonexistent/other.so" ] || fail "LD_PRELOAD in the command: '$out'"
    ;;
run_exit_status)
    run run -- sh -c 'exit 3'
    [ "$status" = 3 ] || fail "exit $status, want the command's 3"
    ;;
run_missing_command)
    run run -- /nonexistent/command
    [ "$status" = 127 ] || fail "exit $status, want 127"
    [ "$err" = "coralloc: cannot run /nonexistent/command: No such file or directory" ] ||
        fail "stderr: $err"
    ;;
stats)
    run run --stats -- "$PROBE"
    [ "$status" = 0 ] || fail "exit $status: $err"
    [ "$(tables)" = 1 ] || fail "want one statistics table on stderr: $err"
    run run -- "$PROBE"
    [ "$(tables)" = 0 ] || fail "statistics printed without --stats: $err"
    ;;
stats_every_process)
    # bash and its two children (exit is a builtin: bash does not exec the last).
    command -v bash >/dev/null || { echo "SKIP: no bash"; exit 77; }
    run run --stats -- bash -c "'$PROBE' >/dev/null; '$PROBE' >/dev/null; exit 0"
    [ "$status" = 0 ] || fail "exit $status: $err"
    [ "$(tables)" = 3 ] || fail "want 3 statistics tables (bash + 2 probes), got $(tables): $err"
    ;;
options_list)
    run options
    [ "$status" = 0 ] || fail "exit $status: $err"
    head -n1 "$TMP/out" | grep -q '^option  *default  *accepted  *value  *what$' || fail "header: $out"
    grep -Eq '^CORALLOC_PURGE_DELAY_MS +250 +0-3600000 +250 ' "$TMP/out" || fail "delay row: $out"
    grep -Eq '^CORALLOC_POPULATE +adaptive +off\|on\|adaptive +adaptive ' "$TMP/out" || fail "populate row: $out"
    grep -Eq '^CORALLOC_HUGE_PAGES +1 +boolean +1 .*\[start-up only\]$' "$TMP/out" || fail "huge pages row: $out"
    ;;
options_current)
    CORALLOC_PURGE_DELAY_MS=9 CORALLOC_SEGMENT_CACHE=bad run options --option populate=off
    [ "$status" = 0 ] || fail "exit $status: $err"
    grep -Eq '^CORALLOC_PURGE_DELAY_MS +250 +0-3600000 +9 ' "$TMP/out" || fail "delay row: $out"
    grep -Eq '^CORALLOC_POPULATE +adaptive +off\|on\|adaptive +off ' "$TMP/out" || fail "populate row: $out"
    # A bad value in the environment: the library keeps the default (and says so).
    grep -Eq '^CORALLOC_SEGMENT_CACHE +64 +0-4096 +64 ' "$TMP/out" || fail "segment cache row: $out"
    ;;
*) fail "unknown case" ;;
esac
exit 0
