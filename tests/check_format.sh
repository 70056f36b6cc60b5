#!/usr/bin/env bash
# The C and C++ sources match .clang-format (lines of at most 100 columns
# included). Prints the files that differ and exits 1; `make format`
# rewrites them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mapfile -t files < <(find include src tests bench/workloads bench/witness bench/src/coralloc_bench/data \
    -name '*.c' -o -name '*.h' -o -name '*.cc' | sort)
# The walk must have found the sources (else 0 files would "match"). grep
# reads all of its input (no -q): with pipefail, a grep that stopped at the
# first match could end printf with SIGPIPE and fail the pipeline.
printf '%s\n' "${files[@]}" | grep -x include/coralloc.h >/dev/null ||
    { echo "format: include/coralloc.h not among the ${#files[@]} files found: nothing checked"; exit 1; }
bad=()
for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ "${#bad[@]}" -gt 0 ]; then
    printf 'format: differs from .clang-format: %s\n' "${bad[@]}"
    echo "format: run 'make format' to fix"
    exit 1
fi
echo "format: ${#files[@]} files match .clang-format"
