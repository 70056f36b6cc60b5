#!/usr/bin/env bash
# bench/many-cores.sh: the thread-heavy measurement for a machine with many
# cores that has no registry access (a lent machine with a time limit).
#
#   bench/many-cores.sh prepare DIR [MIMALLOC_BENCH_CHECKOUT]
#       here, after `make build` and one `make bench` (which fetches the
#       peers): copies into DIR what the run needs (coralloc's two
#       libraries, the workloads, every peer's library, the checkout of
#       mimalloc-bench). DIR stays small (about 5 MiB).
#   bench/many-cores.sh run DIR [SECONDS]
#       there: runs, within SECONDS (default 540) and at as many threads as
#       the machine has cores, (1) the `threads` group and the thread-heavy
#       quick workloads, every allocator, one command per repetition (up to
#       3, merged with `coralloc-bench merge`), then (2) mimalloc-bench's
#       thread tests (mstressN is mimalloc's test-stress) when a C++
#       compiler and cmake are there. Needs python3 with tabulate,
#       matplotlib and tqdm; results under DIR/res.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
die() { echo "many-cores: error: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: bench/many-cores.sh prepare DIR [MIMALLOC_BENCH] | run DIR [SECONDS]"
mode=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

# name -> library, for the peers fetched or installed by `make bench`
peer_libs() {
    local venv_lib
    venv_lib=$(ls "$root"/bench/.venv/lib/python3*/site-packages/cmeel.prefix/lib/libmimalloc.so.3.4 2>/dev/null | head -1)
    echo "mimalloc3=$venv_lib"
    echo "snmalloc=$(ls "$root"/bench/.peers/snmalloc-*/libsnmallocshim.so 2>/dev/null | head -1)"
    echo "rpmalloc=$(ls "$root"/bench/.peers/rpmalloc-*/librpmalloc.so 2>/dev/null | head -1)"
    echo "mimalloc=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
    echo "jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    echo "tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
}

prepare() {
    local mb=${1:-}
    [ -f "$root/build/libcoralloc.so" ] || die "run \`make build\` first"
    mkdir -p "$dir/build/bench" "$dir/peers" "$dir/syslib"
    cp -L "$root/build/libcoralloc.so" "$root/build/libcoralloc-secure.so" "$dir/build/"
    find "$root/build/bench" -maxdepth 1 -type f -perm -u+x -exec cp {} "$dir/build/bench/" \;
    cp "$root/build/bench/libmalloc-witness.so" "$dir/build/bench/"
    local line name lib
    while read -r line; do
        name=${line%%=*} lib=${line#*=}
        [ -f "$lib" ] || die "$name: $lib is missing (run \`make bench\` once first)"
        cp -L "$lib" "$dir/peers/$name.so"
    done < <(peer_libs)
    cp -L /usr/lib/x86_64-linux-gnu/libatomic.so.1 "$dir/syslib/" # mimalloc 3's
    if [ -n "$mb" ]; then
        [ -f "$mb/bench.sh" ] || die "$mb is not a checkout of mimalloc-bench"
        rm -rf "$dir/mimalloc-bench" && mkdir -p "$dir/mimalloc-bench"
        (cd "$mb" && tar cf - --exclude=.git .) | (cd "$dir/mimalloc-bench" && tar xf -)
    fi
    du -sh "$dir"
}

run() {
    local limit=${1:-540} t0 threads last rep s
    t0=$(date +%s)
    left() { echo $((limit - ($(date +%s) - t0))); }
    threads=$(nproc)
    ldconfig -p | grep -q 'libatomic.so.1 ' || export LD_LIBRARY_PATH=$dir/syslib
    local allocs=(--coralloc-lib "$dir/build/libcoralloc.so"
                  --alloc "secure=$dir/build/libcoralloc-secure.so")
    for name in mimalloc3 snmalloc rpmalloc mimalloc jemalloc tcmalloc; do
        allocs+=(--alloc "$name=$dir/peers/$name.so")
    done
    local bench=(env PYTHONPATH="$root/bench/src" python3 -m coralloc_bench run
                 --threads "$threads" --build-dir "$dir/build" --no-install --no-charts --quiet)
    echo "many-cores: $threads cores, $(left) s"
    last=0
    for rep in 1 2 3; do
        [ "$(left)" -ge $((last * 12 / 10 + 10)) ] || { echo "many-cores: repetition $rep skipped"; break; }
        s=$(date +%s)
        timeout -s KILL $(($(left) - 5)) "${bench[@]}" "${allocs[@]}" --reps 1 --seed $((1600 + rep)) \
            --workloads threads,larson-128,larson-1000,xthread,cache-scratch,cache-thrash,churn,sizes \
            --out "$dir/res/ours-r$rep" || echo "many-cores: repetition $rep stopped"
        last=$(($(date +%s) - s))
    done
    env PYTHONPATH="$root/bench/src" python3 -m coralloc_bench merge --no-charts \
        --out "$dir/res/ours" "$dir"/res/ours-r*/results.json >/dev/null || true
    if [ -d "$dir/mimalloc-bench" ] && command -v c++ >/dev/null && [ "$(left)" -gt 100 ]; then
        timeout -s KILL $(($(left) - 5)) "${bench[@]}" "${allocs[@]}" --reps 2 --seed 1620 \
            --suite "mimalloc-bench=$dir/mimalloc-bench" --suite-build "$dir/mbb" \
            --workloads larsonN,mstressN,xmalloc-testN,glibc-thread,larsonN-sized \
            --allocs coralloc,secure,mimalloc3,snmalloc,tcmalloc,rpmalloc \
            --out "$dir/res/mb" || echo "many-cores: mimalloc-bench stopped"
    fi
    echo "many-cores: done, $(left) s left; results in $dir/res"
}

case "$mode" in
    prepare) prepare "${3:-}" ;;
    run) run "${3:-540}" ;;
    *) die "unknown mode '$mode' (prepare or run)" ;;
esac
