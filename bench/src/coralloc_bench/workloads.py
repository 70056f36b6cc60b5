"""The workloads: which program runs with which arguments in each profile.

Sizes are set so that one run takes at least 0.3 s (about 0.3-0.6 s) under
the baseline, mimalloc 3.4.3, in the quick profile on a 2-core machine, with
the iterations inside the process (slower allocators are the finding), and
twice that in the full profile (FULL: the factor). `coralloc-bench calibrate`
measures it; data/calibration-quick.json records the last calibration and
the runner's tests check the quick profile against it. `threads` is the base thread count (the
machine's cores unless --threads says otherwise); `-x2` workloads run twice
as many threads (oversubscribed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Tuple

from coralloc_bench.util import BenchError

ArgsFn = Callable[[int], List[str]]

PROFILES = ("quick", "full")
FULL = 2  # the full profile's work per run, relative to the quick one's


@dataclass(frozen=True)
class Workload:
    name: str
    group: str
    description: str
    # C workloads: the program's name in the build's bench/ directory.
    # Real programs: "real:python", "real:sqlite", "real:redis".
    program: str
    args: Dict[str, ArgsFn]
    profiles: Sequence[str] = PROFILES
    # 0: single-threaded, 1: `threads` threads, 2: oversubscribed (2x)
    thread_factor: int = 0
    timeout: Dict[str, float] = field(default_factory=lambda: {"quick": 60.0, "full": 300.0})

    @property
    def is_real(self) -> bool:
        return self.program.startswith("real:")

    def argv_tail(self, profile: str, threads: int) -> List[str]:
        return list(self.args[profile](threads))

    def threads_used(self, threads: int) -> int:
        return max(1, threads * self.thread_factor) if self.thread_factor else 1


def _a(quick: ArgsFn, full: ArgsFn) -> Dict[str, ArgsFn]:
    return {"quick": quick, "full": full}


def _s(*args: object) -> List[str]:
    return [str(a) for a in args]


def _larson(maxsize: int, factor: int, quick_ops: int) -> Dict[str, ArgsFn]:
    # total work independent of the thread count: ops per thread scaled down
    def make(ops: int, rounds: int) -> ArgsFn:
        return lambda t: _s("--threads", t * factor, "--min", 8, "--max", maxsize,
                            "--chunks", 1024, "--rounds", rounds,
                            "--ops", max(1000, ops * 2 // max(1, t * factor)))
    return _a(make(quick_ops, 10), make(quick_ops * FULL, 10))


def _xthread(factor: int, quick_total: int, pin: int = 0) -> Dict[str, ArgsFn]:
    def make(total: int) -> ArgsFn:
        def f(t: int) -> List[str]:
            n = t * factor
            pairs = max(1, n // 2)
            return _s("--threads", n, "--blocks", total // pairs, "--batch", 100,
                      "--min", 16, "--max", 256, "--pin", pin)
        return f
    return _a(make(quick_total), make(quick_total * FULL))


def _cache(factor: int, quick_total: int) -> Dict[str, ArgsFn]:
    def make(total: int) -> ArgsFn:
        return lambda t: _s("--threads", t * factor, "--iters", total // max(1, t * factor),
                            "--writes", 100, "--size", 8)
    return _a(make(quick_total), make(quick_total * FULL))


def _bulk(size: str, release: str, memset: int, api: str, quick_outer: int) -> Dict[str, ArgsFn]:
    lo, hi = size.split("-") if "-" in size else (size, size)

    def make(outer: int) -> ArgsFn:
        return lambda t: _s("--outer", outer, "--inner", 1000, "--min", lo, "--max", hi,
                            "--release", release, "--memset", memset, "--api", api)
    return _a(make(quick_outer), make(quick_outer * FULL))


def _glibc(size: int, thread: int, quick_ops: int) -> Dict[str, ArgsFn]:
    def make(ops: int) -> ArgsFn:
        return lambda t: _s("--size", size, "--counts", "25,100,400,1600", "--ops", ops,
                            "--thread", thread)
    return _a(make(quick_ops), make(quick_ops * FULL))


def _zero(size: str, count: int, quick_rounds: int, calloc: int = 0,
          full: int = FULL) -> Dict[str, ArgsFn]:
    def make(rounds: int) -> ArgsFn:
        return lambda t: _s("--size", size, "--count", count, "--rounds", rounds,
                            "--calloc", calloc)
    return _a(make(quick_rounds), make(quick_rounds * full))


def _threads(mode: str, factor: int, quick_starts: int, extra: Sequence[object]) -> Dict[str, ArgsFn]:
    # threads.c: the same number of thread starts (pool: of waves' starts;
    # ring: of messages, 50,000 per pair per round) whatever the thread count.
    def make(starts: int) -> ArgsFn:
        def f(t: int) -> List[str]:
            n = max(2, t * factor)
            per_round = n * n if mode == "pool" else (n // 2) * 50_000 if mode == "ring" else n
            return _s("--mode", mode, "--threads", n, "--rounds", max(1, starts // per_round),
                      *extra)
        return f
    return _a(make(quick_starts), make(quick_starts * FULL))


def _sizes(mode: str, quick_total: int, extra: Sequence[object],
           rounds: int = 1) -> Dict[str, ArgsFn]:
    # sizes.c: the same number of blocks allocated whatever the thread count.
    def make(total: int) -> ArgsFn:
        def f(t: int) -> List[str]:
            return _s("--mode", mode, "--threads", t, "--rounds", rounds,
                      "--ops", max(1000, total // (t * rounds)), *extra)
        return f
    return _a(make(quick_total), make(quick_total * FULL))


def _fixed(quick: Sequence[object], full: Sequence[object]) -> Dict[str, ArgsFn]:
    return _a(lambda t: _s(*quick), lambda t: _s(*full))


def _threaded(quick: Sequence[object], full: Sequence[object], factor: int = 1) -> Dict[str, ArgsFn]:
    return _a(lambda t: _s("--threads", t * factor, *quick),
              lambda t: _s("--threads", t * factor, *full))


FULL_ONLY = ("full",)
PYTHON_TEST_MODULES = ["test_json", "test_set"]


# Block sizes of the bulk workloads: name part, --min-max, description, and
# quick-profile rounds for (release all, release subset) x (memset, touch).
_BULK_SIZES: Sequence[Tuple[str, str, str, Dict[Tuple[str, int], int]]] = (
    ("64", "64", "64 B", {("all", 1): 27_000, ("subset", 1): 30_000,
                          ("all", 0): 25_000, ("subset", 0): 40_000}),
    ("rand", "1-1024", "1-1024 B", {("all", 1): 9_700, ("subset", 1): 18_000,
                                    ("all", 0): 12_000, ("subset", 0): 24_000}),
    ("1700", "1700", "1700 B", {("all", 1): 5_000, ("subset", 1): 6_000,
                                ("all", 0): 8_000, ("subset", 0): 16_000}),
)

# The four workloads of the list, in the quick profile; every other
# combination is in the full profile only.
_BULK_QUICK = ("bulk-64", "bulk-rand", "bulk-1700", "bulk-rand-subset")



def _bulk_name(short: str, release: str, memset: int, api: str) -> str:
    parts = ["bulk", short]
    if release == "subset":
        parts.append("subset")
    if not memset:
        parts.append("touch")
    if api in ("bulk", "null"):
        parts.append("api" if api == "bulk" else "null")
    return "-".join(parts)


def _bulk_description(label: str, release: str, memset: int, api: str) -> str:
    fill = "memset" if memset else "tag only (no memset)"
    order = "released in order" if release == "all" else "a random half released per round"
    call = "coral_malloc_bulk_sizes" if label.startswith("1-") else "coral_malloc_bulk"
    via = (f" ({call}/coral_free_bulk; plain malloc/free under other allocators)"
           if api == "bulk" else "")
    if api == "null":
        via = "; no allocator: a stack of free blocks per 16-byte bin (no bookkeeping)"
    return f"1000-block batches of {label}, {fill}, {order}{via}"


def _bulk_matrix() -> List[Workload]:
    """bulk-SIZE[-subset][-touch][-api]: every block size, released in full
    or a random half per round, filled (memset) or only tagged (-touch),
    through malloc/free or coralloc's bulk calls (-api), so that each -api
    workload has its plain twin in the same run."""
    out: List[Workload] = []
    for api in ("plain", "bulk"):
        for memset in (1, 0):
            for release in ("all", "subset"):
                for short, sizes, label, rounds in _BULK_SIZES:
                    name = _bulk_name(short, release, memset, api)
                    args = _bulk(sizes, release, memset, api, rounds[(release, memset)])
                    profiles = PROFILES if name in _BULK_QUICK else FULL_ONLY
                    what = _bulk_description(label, release, memset, api)
                    out.append(Workload(name, "bulk", what, "bulk", args, profiles=profiles))
    return out


def _bulk_ceilings() -> List[Workload]:
    """bulk-SIZE[-subset][-touch]-null: the loops of the bulk matrix with
    no allocator (`--api null`: a stack of free blocks per 16-byte size bin,
    no bookkeeping), so that null / plain bounds what a bulk API can gain
    over malloc/free in these loops for random sizes. In no profile: run
    by name, next to their twins (e.g. `--workloads
    bulk-rand-touch,bulk-rand-touch-api,bulk-rand-touch-null`)."""
    out: List[Workload] = []
    for memset in (1, 0):
        for release in ("all", "subset"):
            for short, sizes, label, rounds in _BULK_SIZES:
                name = _bulk_name(short, release, memset, "null")
                args = _bulk(sizes, release, memset, "null", rounds[(release, memset)])
                what = _bulk_description(label, release, memset, "null")
                out.append(Workload(name, "bulk-null", what, "bulk", args, profiles=()))
    return out


WORKLOADS: List[Workload] = [
    # 1. Larson server pattern
    Workload("larson-128", "larson", "Larson, 8-128 B (tiny contention), 1024 chunks/thread",
             "larson", _larson(128, 1, 1_700_000), thread_factor=1),
    Workload("larson-1000", "larson", "Larson, 8-1000 B, 1024 chunks/thread",
             "larson", _larson(1000, 1, 1_500_000), thread_factor=1),
    Workload("larson-128-x2", "larson", "Larson 8-128 B, 2x oversubscribed",
             "larson", _larson(128, 2, 1_800_000), thread_factor=2),
    Workload("larson-1000-x2", "larson", "Larson 8-1000 B, 2x oversubscribed",
             "larson", _larson(1000, 2, 900_000), thread_factor=2, profiles=FULL_ONLY),
    # 2. producer/consumer
    Workload("xthread", "xthread", "producer/consumer pairs, every block freed remotely",
             "xthread", _xthread(1, 13_000_000), thread_factor=1),
    Workload("xthread-x2", "xthread", "producer/consumer, 2x oversubscribed",
             "xthread", _xthread(2, 6_000_000), thread_factor=2, profiles=FULL_ONLY),
    # the same with threads pinned, so the figure does not depend on where the
    # scheduler puts them (unpinned runs with more threads than cores fall
    # into a fast or a slow mode)
    Workload("xthread-pair-core", "xthread", "producer/consumer, each pair pinned to one core",
             "xthread", _xthread(1, 12_000_000, 1), thread_factor=1, profiles=FULL_ONLY),
    Workload("xthread-cross-core", "xthread", "producer/consumer, pairs pinned across cores",
             "xthread", _xthread(1, 4_000_000, 2), thread_factor=1,
             profiles=FULL_ONLY),
    Workload("xthread-cross-mixed", "xthread",
             "producer/consumer, pairs pinned across cores, a producer and a consumer per core",
             "xthread", _xthread(1, 4_000_000, 3), thread_factor=1, profiles=FULL_ONLY),
    # 3. false sharing
    Workload("cache-scratch", "cache", "passive false sharing (blocks freed near others')",
             "cache-scratch", _cache(1, 6_500_000), thread_factor=1),
    Workload("cache-thrash", "cache", "active false sharing (neighbouring small blocks)",
             "cache-thrash", _cache(1, 8_200_000), thread_factor=1),
    Workload("cache-scratch-x2", "cache", "passive false sharing, 2x oversubscribed",
             "cache-scratch", _cache(2, 3_400_000), thread_factor=2, profiles=FULL_ONLY),
    Workload("cache-thrash-x2", "cache", "active false sharing, 2x oversubscribed",
             "cache-thrash", _cache(2, 3_000_000), thread_factor=2, profiles=FULL_ONLY),
    # 4. thread churn
    Workload("churn", "churn", "threads created and destroyed while allocating",
             "churn", _threaded(["--total", 3200, "--blocks", 2000],
                                ["--total", 3200 * FULL, "--blocks", 2000]), thread_factor=1),
    Workload("churn-x2", "churn", "thread churn, 2x oversubscribed",
             "churn", _threaded(["--total", 3200, "--blocks", 2000],
                                ["--total", 3200 * FULL, "--blocks", 2000], 2),
             thread_factor=2, profiles=FULL_ONLY),
    # 5. bulk-test patterns (1000 x 1000 loops, repeated): see _bulk_matrix
    *_bulk_matrix(),
    *_bulk_ceilings(),
    # 6. glibc benchtest
    Workload("glibc-simple-16", "glibc-simple", "N=25..1600 blocks of 16 B, main thread",
             "glibc-simple", _glibc(16, 0, 12_000_000)),
    Workload("glibc-simple-16-thread", "glibc-simple", "N=25..1600 blocks of 16 B, second thread",
             "glibc-simple", _glibc(16, 1, 6_000_000), profiles=FULL_ONLY),
    Workload("glibc-simple-64k", "glibc-simple", "N=25..1600 blocks of 65535 B, main thread",
             "glibc-simple", _glibc(65535, 0, 70_000), profiles=FULL_ONLY),
    Workload("glibc-simple-64k-thread", "glibc-simple",
             "N=25..1600 blocks of 65535 B, second thread",
             "glibc-simple", _glibc(65535, 1, 460_000)),
    # 7. zero-fill / page faults
    Workload("zero-fill-4k", "zero-fill", "64 blocks of 1 page, every page touched, freed",
             "zero-fill", _zero("4096", 64, 115_000)),
    Workload("zero-fill-8k", "zero-fill", "64 blocks of 2 pages, touched, freed",
             "zero-fill", _zero("8192", 64, 38_000), profiles=FULL_ONLY),
    Workload("zero-fill-64k", "zero-fill", "16 blocks of 64 KiB, touched, freed",
             "zero-fill", _zero("65536", 16, 65_000), profiles=FULL_ONLY),
    # glibc maps and unmaps every 2 MiB block: 100x mimalloc 3's time and more
    # (over 60 s per run at 6500 rounds), so the full profile only, at the
    # quick count
    Workload("zero-fill-2m", "zero-fill", "8 blocks of 2 MiB, touched, freed",
             "zero-fill", _zero("2m", 8, 6_500, full=1), profiles=FULL_ONLY),
    Workload("zero-fill-2m-calloc", "zero-fill", "8 blocks of 2 MiB from calloc, checked zero",
             "zero-fill", _zero("2m", 8, 500, calloc=1), profiles=FULL_ONLY),
    Workload("zero-fill-64k-calloc", "zero-fill", "16 blocks of 64 KiB from calloc, checked zero",
             "zero-fill", _zero("65536", 16, 20_000, calloc=1), profiles=FULL_ONLY),
    # 8. large blocks
    Workload("large-window", "large", "window of 16 blocks of 64 KiB-32 MiB replaced",
             "large", _fixed(["--mode", "window", "--window", 16, "--iters", 70],
                             ["--mode", "window", "--window", 32, "--iters", 240])),
    Workload("large-realloc", "large", "one block grown 1 MiB -> 64 MiB by 1 MiB reallocs, 5 times",
             "large", _fixed(["--mode", "realloc", "--min", "1m", "--max", "64m",
                              "--step", "1m", "--reps", 5],
                             ["--mode", "realloc", "--min", "1m", "--max", "128m",
                              "--step", "1m", "--reps", 2])),
    # 9. long-lived tree and leak
    Workload("tree", "tree", "AVL tree of 50k nodes of mixed sizes, delete+insert",
             "tree", _fixed(["--threads", 1, "--nodes", 50_000, "--ops", 320_000],
                            ["--threads", 1, "--nodes", 80_000, "--ops", 300_000])),
    Workload("tree-mt", "tree", "one AVL tree per thread",
             "tree", _threaded(["--nodes", 50_000, "--ops", 200_000],
                               ["--nodes", 100_000, "--ops", 400_000]),
             thread_factor=1, profiles=FULL_ONLY),
    Workload("leak", "leak", "keeps leaking 1 block in 100 of 32-4096 B",
             "leak", _fixed(["--iters", 1900, "--batch", 1000, "--every", 100],
                            ["--iters", 1900 * FULL, "--batch", 1000, "--every", 100])),
    # threads that come and go (threads.c), at the core count and 4x it
    *(w for mult, sfx in ((1, ""), (4, "-x4")) for w in (
        Workload(f"threads-handoff{sfx}", "threads", "rounds of threads that each leave one "
                 "128 B block for later threads and exit (mimalloc-bench mleak's shape)",
                 "threads", _threads("handoff", mult, 10_000, ["--work", 0, "--keep", 1]),
                 thread_factor=mult, profiles=FULL_ONLY),
        Workload(f"threads-stress{sfx}", "threads", "rounds of threads that allocate 2000 blocks "
                 "of 16-4096 B and leave 8 for later threads (test-stress's shape)", "threads",
                 _threads("handoff", mult, 3_000, ["--work", 2000, "--keep", 8, "--max", 4096]),
                 thread_factor=mult, profiles=FULL_ONLY),
        Workload(f"threads-pool{sfx}", "threads", "a pool growing 1..T threads and shrinking "
                 "back, each thread 4000 blocks of 16-1024 B, 4 left behind", "threads",
                 _threads("pool", mult, 2_400, ["--work", 4000, "--keep", 4]),
                 thread_factor=mult, profiles=FULL_ONLY),
        Workload(f"threads-ring{sfx}", "threads", "producer/consumer pairs over rings, "
                 "restarted every 50,000 blocks of 16-1024 B", "threads",
                 _threads("ring", mult, 5_000_000, ["--work", 50_000]),
                 thread_factor=mult, profiles=FULL_ONLY))),
    # size mixes and migrations of the field's suite (sizes.c)
    Workload("sizes-random", "sizes", "random sizes of 16-16000 B, log-uniform, 1000 blocks per "
             "thread, 1 freed block in 16 handed to another thread (rptest's shape)",
             "sizes", _sizes("random", 6_400_000, ["--slots", 1000, "--min", 16, "--max", 16000,
                                                   "--cross", 16]), thread_factor=1),
    Workload("sizes-pareto", "sizes", "Pareto-distributed sizes of 16 B-64 KiB, 1000 blocks per "
             "thread, each thread its own (alloc-test's shape)",
             "sizes", _sizes("pareto", 12_000_000, ["--slots", 1000, "--min", 16, "--max", 65536,
                                                   "--cross", 0]), thread_factor=1),
    Workload("sizes-migrate", "sizes", "power-of-two sizes of 16 B-64 KiB migrating between "
             "threads through a shared table, threads restarted every phase (mstress's shape)",
             "sizes", _sizes("migrate", 2_000_000, ["--slots", 4000, "--max", 65536], rounds=10),
             thread_factor=1),
    # 10. strings / json
    Workload("json", "json", "JSON build, print, parse, flatten, compare (small strings)",
             "json", _fixed(["--docs", 240, "--nodes", 2000], ["--docs", 480, "--nodes", 2000])),
    # 11. process start-up and exit
    Workload("startup", "startup", "short processes: each starts, allocates a little "
             "(a few hundred blocks), exits; ms per process",
             "startup", _fixed(["--procs", 240], ["--procs", 240 * FULL])),
    # real programs from Debian (see realprogs.py)
    Workload("python", "real", "python3 (PYTHONMALLOC=malloc) running an allocation-heavy script",
             "real:python", _fixed(["26000"], ["52000"])),
    Workload("python-gc", "real", "python3 (PYTHONMALLOC=malloc): full garbage collections "
             "over 100k records' objects", "real:python-gc",
             _fixed(["100000", "10"], ["100000", "30"]), profiles=FULL_ONLY),
    Workload("sqlite", "real", "sqlite3 CLI: 140k rows inserted, indexed, queried, updated",
             "real:sqlite", _fixed(["140000"], ["280000"])),
    Workload("redis", "real", "redis-server under the allocator, redis-benchmark on 127.0.0.1",
             "real:redis", _fixed(["14000"], ["28000"]),
             timeout={"quick": 90.0, "full": 400.0}),
    Workload("python-tests", "real", "python3's own test modules (json, set; "
             "PYTHONMALLOC=malloc)", "real:python-tests",
             _fixed(PYTHON_TEST_MODULES, PYTHON_TEST_MODULES), profiles=FULL_ONLY),
    Workload("git", "real", "git: a generated repository committed round by round, then "
             "log -p, diff, blame, repack, fsck", "real:git", _fixed(["8"], ["8"]),
             profiles=FULL_ONLY),
    Workload("gcc", "real", "gcc -O2 on a generated C file (functions with loops over "
             "switches), linked and run", "real:gcc", _fixed(["100"], ["100"]),
             profiles=FULL_ONLY),
    Workload("lua", "real", "lua5.4: tables, strings, sort, maps built and dropped",
             "real:lua", _fixed(["60000"], ["60000"]), profiles=FULL_ONLY),
    Workload("ruby", "real", "ruby: a thread per core building and dropping hashes of "
             "strings; the GC frees other threads' blocks", "real:ruby",
             _fixed(["30000"], ["30000"]), profiles=FULL_ONLY),
]

BY_NAME: Dict[str, Workload] = {w.name: w for w in WORKLOADS}
GROUPS: Dict[str, List[Workload]] = {}
for _w in WORKLOADS:
    GROUPS.setdefault(_w.group, []).append(_w)


def in_profile(profile: str) -> List[Workload]:
    return [w for w in WORKLOADS if profile in w.profiles]


def select(spec: str | None, profile: str, registry: Sequence[Workload] = WORKLOADS) -> List[Workload]:
    """--workloads A,B: names, or group names (all of that group's workloads
    in the profile, e.g. `larson`, `bulk`, `real`). None: the profile's list."""
    if profile not in PROFILES:
        raise BenchError(f"unknown profile '{profile}' (known: {', '.join(PROFILES)})")
    if not spec:
        return [w for w in registry if profile in w.profiles]
    by_name = {w.name: w for w in registry}
    groups: Dict[str, List[Workload]] = {}
    for w in registry:
        groups.setdefault(w.group, []).append(w)
    chosen: List[Workload] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item in by_name:
            found = [by_name[item]]
        elif item in groups:
            found = [w for w in groups[item] if profile in w.profiles] or groups[item]
        else:
            raise BenchError(f"unknown workload '{item}' (see `coralloc-bench list`)")
        for w in found:
            if w not in chosen:
                chosen.append(w)
    if not chosen:
        raise BenchError("--workloads names no workload")
    return chosen
