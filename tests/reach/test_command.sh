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
    grep -q '^usage: coralloc run \[--secure\] \[--stats\] \[--option KEY=VALUE | --option=KEY=VALUE\]\.\.\. \[--\] COMMAND' \
        "$TMP/out" || fail "no usage line: $out"
    ;;
help_forms)
    # -h and help say what --help says; none of them takes an argument.
    run --help
    want=$out
    for form in -h help; do
        run "$form"
        [ "$status" = 0 ] && [ "$out" = "$want" ] || fail "coralloc $form: exit $status, out: $out"
    done
    usage_error "unexpected argument 'run'" --help run
    usage_error "unexpected argument 'x'" --version x
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
option_no_value)
    usage_error "^coralloc: --option wants KEY=VALUE" options --option
    usage_error "^coralloc: --option wants KEY=VALUE" run --option
    ;;
option_bad_form) usage_error "wants KEY=VALUE, not 'PURGE_DELAY_MS'" run --option PURGE_DELAY_MS -- true ;;
option_unknown) usage_error "unknown option 'NO_SUCH'" run --option NO_SUCH=1 -- true ;;
option_bad_value)
    usage_error "bad value for CORALLOC_PURGE_DELAY_MS: 'soon'" \
        run --option purge_delay_ms=soon -- touch "$TMP/ran"
    [ ! -e "$TMP/ran" ] || fail "the command ran despite the bad option"
    ;;
secure_missing)
    # A copy of the command where no library lies beside it: both folders
    # it looked in are named.
    cp "$CMD" "$TMP/coralloc"
    CMD="$TMP/coralloc"
    usage_error "secure build (libcoralloc-secure.so) is not installed: not in $TMP nor in $TMP/" \
        run --secure -- touch "$TMP/ran"
    [ ! -e "$TMP/ran" ] || fail "the command ran without the secure build"
    ;;
secure_preloads)
    run run --secure -- "$PROBE"
    [ "$status" = 0 ] || fail "probe under coralloc run --secure: exit $status: $out $err"
    ;;
profile_missing)
    # Only the default library beside a copy of the command: --profile and
    # --leaks want the profiling library, and say so.
    cp "$CMD" "$TMP/coralloc"
    cp "$LIB" "$TMP/libcoralloc.so"
    CMD="$TMP/coralloc"
    usage_error "profiling library (libcoralloc-profile.so) is not installed: not in $TMP nor in $TMP/" \
        run --profile "$TMP/p" -- touch "$TMP/ran"
    usage_error "profiling library (libcoralloc-profile.so) is not installed" \
        run --leaks -- touch "$TMP/ran"
    [ ! -e "$TMP/ran" ] || fail "the command ran without the profiling library"
    ;;
profile_preloads_profiling_library)
    # --profile and --leaks preload libcoralloc-profile.so (beside the
    # default library), --secure --profile the secure build; the probe runs.
    want="$(dirname "$LIB")/libcoralloc-profile.so"
    for flags in "--profile $TMP/p" "--leaks" "--profile=$TMP/p --profile-rate 4096"; do
        # shellcheck disable=SC2086 # (flags split on purpose)
        run run $flags -- sh -c 'echo "$LD_PRELOAD"'
        [ "$status" = 0 ] || fail "run $flags: exit $status: $err"
        [ "$out" = "$want" ] || fail "run $flags preloads '$out', not $want"
        run run $flags -- "$PROBE"
        [ "$status" = 0 ] || fail "probe under coralloc run $flags: exit $status: $out $err"
    done
    run run --secure --profile "$TMP/p" -- sh -c 'echo "$LD_PRELOAD"'
    [ "$out" = "$(dirname "$LIB")/libcoralloc-secure.so" ] ||
        fail "run --secure --profile preloads '$out', not the secure build"
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
run_long_preload)
    # A user's LD_PRELOAD of 12,000 characters arrives whole, after the
    # library (an 8 KiB buffer once cut it mid-path). The library again,
    # then empty entries (ld.so skips them): ld.so has nothing to complain of.
    long="$LIB$(printf ':%.0s' $(seq $((12000 - ${#LIB}))))"
    LD_PRELOAD=$long run run -- sh -c 'printf %s "$LD_PRELOAD"'
    [ "$status" = 0 ] || fail "exit $status: $err"
    [ "$out" = "$LIB:$long" ] || fail "LD_PRELOAD in the command: ${#out} characters, want $((${#LIB} + 1 + ${#long}))"
    [ -z "$err" ] || fail "stderr: $err"
    ;;
run_preload_too_long)
    # One that fits the kernel's limit on one environment string (128 KiB,
    # "LD_PRELOAD=" and its NUL included) alone, but not with the library
    # added: one line, status 126.
    long="$LIB$(printf ':%.0s' $(seq $((131050 - ${#LIB}))))"
    LD_PRELOAD=$long run run -- sh -c 'exit 0'
    [ "$status" = 126 ] || fail "exit $status, want 126: $err"
    [ "$err" = "coralloc: cannot run sh: Argument list too long" ] || fail "stderr: $err"
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
run_missing_command_closed_stderr)
    # The message cannot be written; the status still says "not found".
    "$CMD" run -- /nonexistent/command 2>&-
    status=$?
    [ "$status" = 127 ] || fail "exit $status, want 127"
    ;;
run_without_dashes)
    # "--" is optional; --option=KEY=VALUE is --option KEY=VALUE.
    run run --option=verbose=on "$PROBE"
    [ "$status" = 0 ] || fail "exit $status: $out $err"
    [ "$(tail -n1 "$TMP/out")" = "coralloc active" ] || fail "probe says: $out"
    grep -q '^coralloc: option CORALLOC_VERBOSE=1 ' "$TMP/err" || fail "verbose not on: $err"
    ;;
run_setuid_warns)
    # A setuid program of another user: ld.so drops the preload (the probe
    # finds no coralloc), and coralloc run says so first, in one line.
    # Root makes one (the probe, owned by nobody); others look for one.
    if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
        cp "$PROBE" "$TMP/probe" && chown nobody "$TMP/probe" && chmod 4755 "$TMP/probe" || exit 1
        target=$TMP/probe
    else
        target=$(find /usr/bin /bin -maxdepth 1 \( -name mount -o -name su \) -perm -4000 \
            ! -uid "$(id -u)" -print -quit 2>/dev/null)
        [ -n "$target" ] || { echo "SKIP: no setuid program of another user to run"; exit 77; }
    fi
    if command -v findmnt >/dev/null && findmnt -no OPTIONS -T "$target" | grep -qw nosuid; then
        echo "SKIP: $target lies on a nosuid file system"
        exit 77
    fi
    if [ "$target" = "$TMP/probe" ]; then
        run run -- "$target"
        [ "$status" != 0 ] || fail "the setuid probe found coralloc: the preload was not dropped"
    else
        run run -- "$target" --version
    fi
    [ "$(head -n1 "$TMP/err")" = "coralloc: warning: $target is setuid: ld.so ignores LD_PRELOAD for it, so neither it nor the processes it starts use coralloc" ] ||
        fail "stderr: $err"
    ;;
run_setuid_own_quiet)
    # Setuid to the user who runs it: no change of user, the preload holds,
    # and nothing is said.
    cp "$PROBE" "$TMP/probe" && chmod 4755 "$TMP/probe" || exit 1
    run run -- "$TMP/probe"
    [ "$status" = 0 ] || fail "exit $status: $err"
    [ "$(tail -n1 "$TMP/out")" = "coralloc active" ] || fail "probe says: $out"
    ! grep -q warning "$TMP/err" || fail "stderr: $err"
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
write_error)
    # Output that cannot be written: one line, status 1, for each command
    # that writes to stdout.
    [ -w /dev/full ] || { echo "SKIP: no /dev/full"; exit 77; }
    for args in --version --help options; do
        "$CMD" $args >/dev/full 2>"$TMP/err"
        status=$?
        [ "$status" = 1 ] || fail "coralloc $args >/dev/full: exit $status, want 1"
        [ "$(cat "$TMP/err")" = "coralloc: cannot write to standard output: No space left on device" ] ||
            fail "coralloc $args >/dev/full: stderr: $(cat "$TMP/err")"
    done
    ;;
*) fail "unknown case" ;;
esac
exit 0
