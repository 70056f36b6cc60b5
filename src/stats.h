/* Statistics.
 *
 * Always on: global atomic counters touched only next to a system call or a
 * segment- or page-level event (OS calls and bytes, mapped memory, segments,
 * bytes in pages in use, large and huge blocks, threads), never on the
 * malloc/free fast paths.
 *
 * Per size class block counts (allocated, freed, live, peak) are compiled in
 * with -DCORAL_STATS=ON: each thread's heap counts its own mallocs and frees
 * with plain (relaxed, not locked) increments, merged on read. They cost a
 * few instructions per call on the fast paths (docs/FASTPATH.md has the
 * measured figure), so they are off by default. */
#ifndef CORAL_STATS_H
#define CORAL_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum coral_os_call_e {
    CORAL_OS_MMAP,
    CORAL_OS_MUNMAP,
    CORAL_OS_PURGE,
    CORAL_OS_REMAP,
    CORAL_OS_POPULATE, /* madvise(MADV_POPULATE_WRITE) */
    CORAL_OS_ADVISE,   /* madvise(MADV_HUGEPAGE) */
    CORAL_OS_MINCORE,  /* mincore: the adaptive populate policy's samples */
    CORAL_OS_CALL_KINDS
} coral_os_call_t;

typedef struct coral_global_stats_s {
    _Atomic(int64_t) os_calls[CORAL_OS_CALL_KINDS];
    _Atomic(int64_t) os_bytes[CORAL_OS_CALL_KINDS];
    _Atomic(int64_t) mapped, mapped_peak;
    _Atomic(int64_t) segments, segments_peak;
    _Atomic(int64_t) huge_allocs, large_allocs;
    _Atomic(int64_t) segments_abandoned, segments_adopted;
    _Atomic(int64_t) orphans_reclaimed, orphan_bytes_reclaimed; /* reclaim.c */
    _Atomic(int64_t) threads, threads_peak;
    _Atomic(int64_t) span_bytes, span_bytes_peak; /* bytes of pages in use */
    _Atomic(int64_t) huge_bytes, huge_live;       /* huge blocks in use */
    _Atomic(int64_t) bulk_cached, bulk_cached_peak; /* bytes in threads' bulk caches (stash.h) */
    /* Per class counts of heaps that are gone, and of frees by threads
     * without a heap (CORAL_STATS builds). */
    _Atomic(int64_t) class_allocs[128], class_frees[128], class_peak[128];
} coral_global_stats_t;

extern coral_global_stats_t coral_gstats;

static inline void coral_stat_os_call(coral_os_call_t kind, size_t bytes) {
    atomic_fetch_add_explicit(&coral_gstats.os_calls[kind], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&coral_gstats.os_bytes[kind], (int64_t)bytes, memory_order_relaxed);
}

/* Add delta to a gauge and raise its peak. */
static inline void coral_stat_gauge(_Atomic(int64_t) *value, _Atomic(int64_t) *peak,
                                    int64_t delta) {
    int64_t now = atomic_fetch_add_explicit(value, delta, memory_order_relaxed) + delta;
    int64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (now > seen &&
           !atomic_compare_exchange_weak_explicit(peak, &seen, now, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

static inline void coral_stat_mapped(int64_t delta) {
    coral_stat_gauge(&coral_gstats.mapped, &coral_gstats.mapped_peak, delta);
}

static inline void coral_stat_count(_Atomic(int64_t) *counter, int64_t delta) {
    atomic_fetch_add_explicit(counter, delta, memory_order_relaxed);
}

/* Per-thread block counters (CORAL_STATS builds): written by the owner
 * thread with relaxed atomic stores, read by anyone. */
#ifdef CORAL_STATS
#define CORAL_STATS_ENABLED 1
#define coral_stat_inc(counter)                                                                    \
    __atomic_store_n(&(counter), __atomic_load_n(&(counter), __ATOMIC_RELAXED) + 1,               \
                     __ATOMIC_RELAXED)
#else
#define CORAL_STATS_ENABLED 0
#define coral_stat_inc(counter) ((void)0)
#endif

typedef struct coral_class_stats_s {
    int64_t allocated, freed, live, peak;
} coral_class_stats_t;

/* Everything, read at one moment (each counter is exact; together they are
 * not one atomic picture while other threads run). */
typedef struct coral_stats_s {
    int64_t os_calls[CORAL_OS_CALL_KINDS], os_bytes[CORAL_OS_CALL_KINDS];
    int64_t mapped, mapped_peak, rss, rss_peak, segments, segments_peak;
    int64_t page_bytes, page_bytes_peak, huge_live, huge_bytes, large_allocs, huge_allocs;
    int64_t threads, threads_peak, abandoned, adopted;
    int64_t orphans_reclaimed, orphan_bytes_reclaimed;
    int64_t bulk_cached, bulk_cached_peak;
    bool per_class;
    coral_class_stats_t classes[128]; /* by class; 105: large and huge */
} coral_stats_t;

void coral_stats_snapshot(coral_stats_t *s);
int64_t coral_stats_class_size(int cls);
void coral_stats_print_to(FILE *out);

#endif
