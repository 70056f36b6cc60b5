/* Introspection: the statistics counters (base.h) and the heaps' per class
 * counts gathered into one snapshot, printed as a table or written as JSON;
 * options by name. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <errno.h>

#include "api/api.h"

typedef struct class_stats_s {
    int64_t allocated, freed, live, peak;
} class_stats_t;

/* Everything, read at one moment (each counter is exact; together they are
 * not one atomic picture while other threads run). */
typedef struct stats_s {
    int64_t os_calls[CORAL_OS_CALL_KINDS], os_bytes[CORAL_OS_CALL_KINDS];
    int64_t mapped, mapped_peak, rss, rss_peak, segments, segments_peak;
    int64_t page_bytes, page_bytes_peak, huge_live, huge_bytes, large_allocs, huge_allocs;
    int64_t threads, threads_peak, abandoned, adopted;
    int64_t orphans_reclaimed, orphan_bytes_reclaimed;
    int64_t bulk_cached, bulk_cached_peak;
    bool per_class;
    class_stats_t classes[CORAL_STAT_CLASSES]; /* by class; CORAL_CLASS_LARGE: large and huge */
} stats_t;

static int64_t load(_Atomic(int64_t) *v) {
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* ---- the snapshot ---------------------------------------------------------------- */

static void add_heap_counts(coral_heap_t *heap, void *arg) {
#if CORAL_STATS_ENABLED
    stats_t *s = arg;
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        s->classes[c].allocated +=
            (int64_t)__atomic_load_n(&heap->counts.allocs[c], __ATOMIC_RELAXED);
        s->classes[c].freed += (int64_t)__atomic_load_n(&heap->counts.frees[c], __ATOMIC_RELAXED);
    }
#else
    (void)heap;
    (void)arg;
#endif
}

/* Resident memory now, from /proc/self/statm (read without allocating). */
static int64_t rss_bytes(void) {
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    long long size = 0, resident = 0;
    if (sscanf(buf, "%lld %lld", &size, &resident) != 2) return -1;
    return resident * (int64_t)sysconf(_SC_PAGESIZE);
}

static void stats_snapshot(stats_t *s) {
    memset(s, 0, sizeof *s);
    for (int k = 0; k < CORAL_OS_CALL_KINDS; k++) {
        s->os_calls[k] = load(&coral_counters.os_calls[k]);
        s->os_bytes[k] = load(&coral_counters.os_bytes[k]);
    }
    s->mapped = load(&coral_counters.mapped);
    s->mapped_peak = load(&coral_counters.mapped_peak);
    s->segments = load(&coral_counters.segments);
    s->segments_peak = load(&coral_counters.segments_peak);
    s->page_bytes = load(&coral_counters.page_bytes);
    s->page_bytes_peak = load(&coral_counters.page_bytes_peak);
    s->huge_live = load(&coral_counters.huge_live);
    s->huge_bytes = load(&coral_counters.huge_bytes);
    s->large_allocs = load(&coral_counters.large_allocs);
    s->huge_allocs = load(&coral_counters.huge_allocs);
    s->threads = load(&coral_counters.threads);
    s->threads_peak = load(&coral_counters.threads_peak);
    s->abandoned = load(&coral_counters.segments_abandoned);
    s->adopted = load(&coral_counters.segments_adopted);
    s->orphans_reclaimed = load(&coral_counters.orphans_reclaimed);
    s->orphan_bytes_reclaimed = load(&coral_counters.orphan_bytes_reclaimed);
    s->bulk_cached = load(&coral_counters.bulk_cached);
    s->bulk_cached_peak = load(&coral_counters.bulk_cached_peak);
    s->rss = rss_bytes();
    struct rusage ru;
    s->rss_peak = getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : -1;
    s->per_class = CORAL_STATS_ENABLED;
    if (!CORAL_STATS_ENABLED) return;
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        s->classes[c].allocated = load(&coral_counters.class_allocs[c]);
        s->classes[c].freed = load(&coral_counters.class_frees[c]);
    }
    coral_heaps_visit(add_heap_counts, s);
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        class_stats_t *row = &s->classes[c];
        row->live = row->allocated - row->freed;
        /* The peak is sampled: the highest live count any read has seen. */
        int64_t peak = load(&coral_counters.class_peak[c]);
        while (row->live > peak &&
               !atomic_compare_exchange_weak(&coral_counters.class_peak[c], &peak, row->live)) {
        }
        row->peak = row->live > peak ? row->live : peak;
    }
}

static int64_t class_size(int cls) {
    if (cls >= 1 && cls < CORAL_CLASS_COUNT) return (int64_t)coral_class_size((unsigned)cls);
    return -1; /* large and huge blocks */
}

/* ---- output ------------------------------------------------------------------------- */

typedef struct writer_s {
    char *buf;
    size_t cap, len;
} writer_t;

/* snprintf-like append: counts what would be written even past the end. */
static __attribute__((format(printf, 2, 3))) void put(writer_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *at = w->len < w->cap ? w->buf + w->len : NULL;
    int n = vsnprintf(at, at ? w->cap - w->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) w->len += (size_t)n;
}

static const char *const call_names[CORAL_OS_CALL_KINDS] = {
    "mmap", "munmap", "purge", "mremap", "populate", "hugepage", "mincore"};

size_t coral_stats_json(char *buf, size_t len) {
    stats_t s;
    stats_snapshot(&s);
    writer_t w = {buf, len, 0};
    if (buf != NULL && len > 0) buf[0] = '\0';
    put(&w, "{\"per_class\":%s,\"os\":{", s.per_class ? "true" : "false");
    for (int k = 0; k < CORAL_OS_CALL_KINDS; k++)
        put(&w, "%s\"%s\":{\"calls\":%lld,\"bytes\":%lld}", k ? "," : "", call_names[k],
            (long long)s.os_calls[k], (long long)s.os_bytes[k]);
    put(&w,
        "},\"mapped\":%lld,\"mapped_peak\":%lld,\"rss\":%lld,\"rss_peak\":%lld,"
        "\"segments\":%lld,\"segments_peak\":%lld,\"page_bytes\":%lld,"
        "\"page_bytes_peak\":%lld,\"large_allocs\":%lld,\"huge_allocs\":%lld,"
        "\"huge_live\":%lld,\"huge_bytes\":%lld,\"threads\":%lld,\"threads_peak\":%lld,"
        "\"segments_abandoned\":%lld,\"segments_adopted\":%lld,"
        "\"orphan_pages_reclaimed\":%lld,\"orphan_bytes_reclaimed\":%lld,"
        "\"bulk_cached\":%lld,\"bulk_cached_peak\":%lld,\"classes\":[",
        (long long)s.mapped, (long long)s.mapped_peak, (long long)s.rss, (long long)s.rss_peak,
        (long long)s.segments, (long long)s.segments_peak, (long long)s.page_bytes,
        (long long)s.page_bytes_peak, (long long)s.large_allocs, (long long)s.huge_allocs,
        (long long)s.huge_live, (long long)s.huge_bytes, (long long)s.threads,
        (long long)s.threads_peak, (long long)s.abandoned, (long long)s.adopted,
        (long long)s.orphans_reclaimed, (long long)s.orphan_bytes_reclaimed,
        (long long)s.bulk_cached, (long long)s.bulk_cached_peak);
    bool first = true;
    for (int c = 1; c < CORAL_QUEUE_COUNT && s.per_class; c++) {
        class_stats_t *r = &s.classes[c];
        if (r->allocated == 0 && r->freed == 0) continue;
        put(&w,
            "%s{\"class\":%d,\"size\":%lld,\"allocated\":%lld,\"freed\":%lld,\"live\":%lld,"
            "\"peak\":%lld}",
            first ? "" : ",", c, (long long)class_size(c), (long long)r->allocated,
            (long long)r->freed, (long long)r->live, (long long)r->peak);
        first = false;
    }
    put(&w, "]}");
    return w.len;
}

static void stats_print_to(FILE *out) {
    stats_t s;
    stats_snapshot(&s);
    fprintf(out, "coralloc statistics\n");
    fprintf(out, "  %-12s %14s %18s\n", "os call", "calls", "bytes");
    for (int k = 0; k < CORAL_OS_CALL_KINDS; k++)
        fprintf(out, "  %-12s %14lld %18lld\n", call_names[k], (long long)s.os_calls[k],
                (long long)s.os_bytes[k]);
    fprintf(out, "  %-12s %14s %18s\n", "memory", "now", "peak");
    fprintf(out, "  %-12s %14lld %18lld\n", "mapped", (long long)s.mapped,
            (long long)s.mapped_peak);
    fprintf(out, "  %-12s %14lld %18lld\n", "resident", (long long)s.rss, (long long)s.rss_peak);
    fprintf(out, "  %-12s %14lld %18lld\n", "in pages", (long long)s.page_bytes,
            (long long)s.page_bytes_peak);
    fprintf(out, "  %-12s %14lld %18lld\n", "bulk cache", (long long)s.bulk_cached,
            (long long)s.bulk_cached_peak);
    fprintf(out, "  %-12s %14lld %18lld\n", "segments", (long long)s.segments,
            (long long)s.segments_peak);
    fprintf(out, "  %-12s %14lld %18lld\n", "threads", (long long)s.threads,
            (long long)s.threads_peak);
    fprintf(out, "  huge blocks live %lld (%lld bytes); allocated: large %lld, huge %lld\n",
            (long long)s.huge_live, (long long)s.huge_bytes, (long long)s.large_allocs,
            (long long)s.huge_allocs);
    fprintf(out, "  segments abandoned %lld, adopted %lld\n", (long long)s.abandoned,
            (long long)s.adopted);
    fprintf(out, "  orphan pages reclaimed %lld (%lld bytes)\n", (long long)s.orphans_reclaimed,
            (long long)s.orphan_bytes_reclaimed);
    if (!s.per_class) {
        fprintf(out, "  (per size class counts: build with -DCORAL_STATS=ON)\n");
        return;
    }
    fprintf(out, "  %-10s %14s %14s %12s %12s\n", "class size", "allocated", "freed", "live",
            "peak");
    for (int c = 1; c < CORAL_QUEUE_COUNT; c++) {
        class_stats_t *r = &s.classes[c];
        if (r->allocated == 0 && r->freed == 0) continue;
        char size[24];
        if (c < CORAL_CLASS_COUNT)
            snprintf(size, sizeof size, "%lld", (long long)class_size(c));
        else
            snprintf(size, sizeof size, "large/huge");
        fprintf(out, "  %-10s %14lld %14lld %12lld %12lld\n", size, (long long)r->allocated,
                (long long)r->freed, (long long)r->live, (long long)r->peak);
    }
}

void coral_stats_print(FILE *out) {
    stats_print_to(out ? out : stderr);
}

/* ---- options by name ------------------------------------------------------------------- */

int coral_option_get(const char *name, long long *value) {
    int i = coral_option_index(name);
    if (i < 0 || value == NULL) return EINVAL;
    coral_process_init(); /* the options are read on first use */
    *value = (long long)coral_option((coral_option_t)i);
    return 0;
}

int coral_option_set(const char *name, long long value) {
    int i = coral_option_index(name);
    if (i < 0) return EINVAL;
    int rc = coral_option_check(i, value);
    if (rc != 0) return rc;
    coral_process_init();
    __atomic_store_n(&coral_options[i], (int64_t)value, __ATOMIC_RELAXED);
    return 0;
}
