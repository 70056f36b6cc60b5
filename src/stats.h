/* Statistics kept by the slow paths (OS calls, mapped bytes, segments).
 * The counters are global atomics: they are only touched next to a system
 * call or a segment-level event, never on the malloc/free fast paths. */
#ifndef CORAL_STATS_H
#define CORAL_STATS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

typedef enum coral_os_call_e {
    CORAL_OS_MMAP,
    CORAL_OS_MUNMAP,
    CORAL_OS_PURGE,
    CORAL_OS_REMAP,
    CORAL_OS_CALL_KINDS
} coral_os_call_t;

typedef struct coral_global_stats_s {
    _Atomic(int64_t) os_calls[CORAL_OS_CALL_KINDS];
    _Atomic(int64_t) os_bytes[CORAL_OS_CALL_KINDS];
    _Atomic(int64_t) mapped, mapped_peak;
    _Atomic(int64_t) segments, segments_peak;
    _Atomic(int64_t) huge_allocs, large_allocs;
    _Atomic(int64_t) segments_abandoned, segments_adopted;
    _Atomic(int64_t) threads, threads_peak;
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

void coral_stats_print_to(FILE *out);

#endif
