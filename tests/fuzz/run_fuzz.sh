#!/usr/bin/env bash
# Builds and runs coralloc's libFuzzer targets (docs/FUZZING.md).
#
#   run_fuzz.sh build BUILD_DIR
#       configures tests/fuzz with clang in BUILD_DIR and builds both targets.
#   run_fuzz.sh run BUILD_DIR TARGET SECONDS [--fresh]
#       runs BUILD_DIR/TARGET for SECONDS (libFuzzer's -max_total_time) on
#       its working corpus BUILD_DIR/corpus/TARGET (new inputs go there; the
#       committed seeds, tests/fuzz/corpus/TARGET, are read only). --fresh
#       empties the working corpus first and keeps libFuzzer's output in
#       BUILD_DIR/TARGET.log, printing its end (for ctest).
#
# Exit status 77 (ctest: SKIPPED) when clang or its libFuzzer is missing; 1
# when a target fails: its input is saved in BUILD_DIR/artifacts/TARGET/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

skip_if_no_fuzzer() {
    "$here/../deps.sh" skipped clang || exit $?
    if [ -e "$1/no-libfuzzer" ]; then
        echo "SKIPPED: clang cannot link -fsanitize=fuzzer (Debian package libclang-rt-dev:" \
            "apt-get install libclang-rt-dev, or run make test as root)"
        exit 77
    fi
}

cmd=${1:?usage: run_fuzz.sh build BUILD_DIR | run BUILD_DIR TARGET SECONDS [--fresh]}
build=${2:?no build directory}
case $cmd in
build)
    skip_if_no_fuzzer "$build"
    cmake -S "$here" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        >/dev/null
    skip_if_no_fuzzer "$build"
    cmake --build "$build" -j"${JOBS:-$(nproc)}"
    ;;
run)
    target=${3:?no target} seconds=${4:?no duration} fresh=${5:-}
    bin=$build/$target
    if [ ! -x "$bin" ]; then
        skip_if_no_fuzzer "$build"
        echo "$target: not built: run '$0 build $build' first"
        exit 1
    fi
    corpus=$build/corpus/$target
    artifacts=$build/artifacts/$target
    [ "$fresh" = --fresh ] && rm -rf "$corpus"
    mkdir -p "$corpus" "$artifacts"
    # libFuzzer's own failure status is 77 by default: ctest's "skipped".
    args=(-max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -error_exitcode=1
        -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$artifacts/")
    case $target in
    fuzz_model) args+=(-max_len=6144) ;;
    fuzz_options) args+=(-max_len=300 -dict="$here/fuzz_options.dict") ;;
    esac
    echo "$target: ${seconds} s from $here/corpus/$target (working corpus $corpus)"
    rc=0
    if [ "$fresh" = --fresh ]; then
        "$bin" "${args[@]}" "$corpus" "$here/corpus/$target" >"$build/$target.log" 2>&1 || rc=$?
        grep -E '^(#[0-9]+ +(INITED|DONE)|stat::|SUMMARY|==[0-9]+==ERROR|fuzz_)' \
            "$build/$target.log" | tail -n 20 || true
    else
        "$bin" "${args[@]}" "$corpus" "$here/corpus/$target" || rc=$?
    fi
    if [ "$rc" -ne 0 ]; then
        [ "$fresh" = --fresh ] && tail -n 60 "$build/$target.log"
        echo "$target: FAILED (status $rc); the input is in $artifacts/"
        echo "$target: reproduce with: $bin $artifacts/<crash-file>"
        exit 1
    fi
    echo "$target: passed"
    ;;
*)
    echo "run_fuzz.sh: unknown command $cmd"
    exit 2
    ;;
esac
