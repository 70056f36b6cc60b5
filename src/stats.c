/* Statistics: the global counters of stats.h and their report. */
#include <stdio.h>

#include "internal.h"
#include "stats.h"

coral_global_stats_t coral_gstats;

static long long load(_Atomic(int64_t) *v) {
    return (long long)atomic_load_explicit(v, memory_order_relaxed);
}

void coral_stats_print_to(FILE *out) {
    static const char *const call_names[CORAL_OS_CALL_KINDS] = {"mmap", "munmap", "purge",
                                                                "mremap"};
    fprintf(out, "coralloc statistics\n");
    fprintf(out, "  %-10s %12s %16s\n", "os call", "calls", "bytes");
    for (int k = 0; k < CORAL_OS_CALL_KINDS; k++)
        fprintf(out, "  %-10s %12lld %16lld\n", call_names[k], load(&coral_gstats.os_calls[k]),
                load(&coral_gstats.os_bytes[k]));
    fprintf(out, "  mapped now %lld bytes, peak %lld bytes\n", load(&coral_gstats.mapped),
            load(&coral_gstats.mapped_peak));
    fprintf(out, "  segments now %lld, peak %lld; abandoned %lld, adopted %lld\n",
            load(&coral_gstats.segments), load(&coral_gstats.segments_peak),
            load(&coral_gstats.segments_abandoned), load(&coral_gstats.segments_adopted));
    fprintf(out, "  large blocks %lld, huge blocks %lld\n", load(&coral_gstats.large_allocs),
            load(&coral_gstats.huge_allocs));
    fprintf(out, "  threads now %lld, peak %lld\n", load(&coral_gstats.threads),
            load(&coral_gstats.threads_peak));
}

void coral_stats_print(FILE *out) { coral_stats_print_to(out ? out : stderr); }
