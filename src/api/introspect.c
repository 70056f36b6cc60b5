/* Introspection: the statistics counters (base.h) and the heaps' per class
 * counts, written as JSON or printed as a table from one list of figures;
 * options by name. Each counter is exact; together they are not one atomic
 * picture while other threads run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "api/api.h"

/* ---- the figures ----------------------------------------------------------------- */

/* A figure: its JSON key, its counter (NULL: resident memory, read from
 * the kernel), and its row in the table (NULL: a peak, printed beside the
 * figure before it). */
typedef struct figure_s {
    const char *key;
    _Atomic(int64_t) *counter;
    const char *row;
} figure_t;

#define C(field) (&coral_counters.field)
static const figure_t figures[] = {
    {"mapped", C(mapped), "mapped"},
    {"mapped_peak", C(mapped_peak), NULL},
    {"rss", NULL, "resident"},
    {"rss_peak", NULL, NULL},
    {"segments", C(segments), "segments"},
    {"segments_peak", C(segments_peak), NULL},
    {"page_bytes", C(page_bytes), "in pages"},
    {"page_bytes_peak", C(page_bytes_peak), NULL},
    {"bulk_cached", C(bulk_cached), "bulk cache"},
    {"bulk_cached_peak", C(bulk_cached_peak), NULL},
    {"threads", C(threads), "threads"},
    {"threads_peak", C(threads_peak), NULL},
    {"large_allocs", C(large_allocs), "large allocated"},
    {"huge_allocs", C(huge_allocs), "huge allocated"},
    {"huge_live", C(huge_live), "huge live"},
    {"huge_bytes", C(huge_bytes), "huge bytes"},
    {"huge_pages_slow", C(huge_pages_slow), "slow huge pages"},
    {"segments_abandoned", C(segments_abandoned), "abandoned"},
    {"segments_adopted", C(segments_adopted), "adopted"},
    {"orphan_pages_reclaimed", C(orphans_reclaimed), "orphans reclaimed"},
    {"orphan_bytes_reclaimed", C(orphan_bytes_reclaimed), "orphan bytes"},
    {"parked_pages_reclaimed", C(parked_reclaimed), "kept pages returned"},
    {"parked_bytes_reclaimed", C(parked_bytes_reclaimed), "kept bytes returned"},
    {"aside_pages_reclaimed", C(aside_reclaimed), "aside pages returned"},
    {"aside_bytes_reclaimed", C(aside_bytes_reclaimed), "aside bytes returned"},
    {"os_failures_injected", C(os_failures_injected), "injected failures"},
};
#undef C
#define FIGURES (sizeof figures / sizeof figures[0])

static const char *const call_names[CORAL_OS_CALL_KINDS] = {"mmap",    "munmap",   "purge",
                                                            "mremap",  "populate", "hugepage",
                                                            "mincore", "mprotect", "nohugepage"};

static int64_t load(_Atomic(int64_t) *v) { return atomic_load_explicit(v, memory_order_relaxed); }

/* Resident memory now, from /proc/self/statm (read without allocating). */
static int64_t rss_bytes(void) {
    int state = coral_cancel_off();
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    char buf[128];
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0) close(fd);
    coral_cancel_restore(state);
    if (n <= 0) return -1;
    buf[n] = '\0';
    long long size = 0, resident = 0;
    if (sscanf(buf, "%lld %lld", &size, &resident) != 2) return -1;
    return resident * (int64_t)sysconf(_SC_PAGESIZE);
}

static int64_t rss_peak_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : -1;
}

static void read_figures(int64_t *out) {
    for (size_t i = 0; i < FIGURES; i++) {
        if (figures[i].counter != NULL)
            out[i] = load(figures[i].counter);
        else
            out[i] = strcmp(figures[i].key, "rss") == 0 ? rss_bytes() : rss_peak_bytes();
    }
}

/* ---- per size class counts (CORAL_STATS builds) -------------------------------------- */

typedef struct class_row_s {
    int64_t allocated, freed, live, peak;
} class_row_t;

static void add_heap_counts(coral_heap_t *heap, void *arg) {
#if CORAL_STATS_ENABLED
    class_row_t *rows = arg;
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        rows[c].allocated += (int64_t)__atomic_load_n(&heap->counts.allocs[c], __ATOMIC_RELAXED);
        rows[c].freed += (int64_t)__atomic_load_n(&heap->counts.frees[c], __ATOMIC_RELAXED);
    }
#else
    (void)heap;
    (void)arg;
#endif
}

/* rows[c] for every class c (CORAL_CLASS_LARGE: large and huge blocks):
 * retired heaps' totals plus the live heaps'. The peak is sampled: the
 * highest live count any read has seen. */
static void read_classes(class_row_t *rows) {
    memset(rows, 0, sizeof(class_row_t) * CORAL_QUEUE_COUNT);
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        rows[c].allocated = load(&coral_counters.class_allocs[c]);
        rows[c].freed = load(&coral_counters.class_frees[c]);
    }
    coral_heaps_visit(add_heap_counts, rows);
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        class_row_t *row = &rows[c];
        row->live = row->allocated - row->freed;
        int64_t peak = load(&coral_counters.class_peak[c]);
        while (row->live > peak &&
               !atomic_compare_exchange_weak(&coral_counters.class_peak[c], &peak, row->live)) {
        }
        row->peak = row->live > peak ? row->live : peak;
    }
}

static long long class_size(int cls) {
    if (cls >= 1 && cls < CORAL_CLASS_LARGE) return (long long)coral_class_size((unsigned)cls);
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

size_t coral_stats_json(char *buf, size_t len) {
    int64_t v[FIGURES];
    read_figures(v);
    writer_t w = {buf, len, 0};
    if (buf != NULL && len > 0) buf[0] = '\0';
    put(&w, "{\"per_class\":%s,\"os\":{", CORAL_STATS_ENABLED ? "true" : "false");
    for (int k = 0; k < CORAL_OS_CALL_KINDS; k++)
        put(&w, "%s\"%s\":{\"calls\":%lld,\"bytes\":%lld}", k ? "," : "", call_names[k],
            (long long)load(&coral_counters.os_calls[k]),
            (long long)load(&coral_counters.os_bytes[k]));
    put(&w, "}");
    for (size_t i = 0; i < FIGURES; i++) put(&w, ",\"%s\":%lld", figures[i].key, (long long)v[i]);
    put(&w, ",\"classes\":[");
    class_row_t rows[CORAL_QUEUE_COUNT];
    bool first = true;
    if (CORAL_STATS_ENABLED) read_classes(rows);
    for (int c = 1; c < CORAL_QUEUE_COUNT && CORAL_STATS_ENABLED; c++) {
        class_row_t *r = &rows[c];
        if (r->allocated == 0 && r->freed == 0) continue;
        put(&w,
            "%s{\"class\":%d,\"size\":%lld,\"allocated\":%lld,\"freed\":%lld,\"live\":%lld,"
            "\"peak\":%lld}",
            first ? "" : ",", c, class_size(c), (long long)r->allocated, (long long)r->freed,
            (long long)r->live, (long long)r->peak);
        first = false;
    }
    put(&w, "]}");
    return w.len;
}

static void stats_print(FILE *out);

void coral_stats_print(FILE *out) {
    int state = coral_cancel_off(); /* (fprintf: a cancellation point) */
    stats_print(out == NULL ? stderr : out);
    coral_cancel_restore(state);
}

static void stats_print(FILE *out) {
    int64_t v[FIGURES];
    read_figures(v);
    fprintf(out, "coralloc statistics\n  %-18s %14s %18s\n", "os call", "calls", "bytes");
    for (int k = 0; k < CORAL_OS_CALL_KINDS; k++)
        fprintf(out, "  %-18s %14lld %18lld\n", call_names[k],
                (long long)load(&coral_counters.os_calls[k]),
                (long long)load(&coral_counters.os_bytes[k]));
    fprintf(out, "  %-18s %14s %18s\n", "figure", "now", "peak");
    for (size_t i = 0; i < FIGURES; i++) {
        bool peak = i + 1 < FIGURES && figures[i + 1].row == NULL;
        fprintf(out, "  %-18s %14lld", figures[i].row, (long long)v[i]);
        if (peak) fprintf(out, " %18lld", (long long)v[++i]);
        fputc('\n', out);
    }
    if (!CORAL_STATS_ENABLED) {
        fprintf(out, "  (per size class counts: build with -DCORAL_STATS=ON)\n");
        return;
    }
    class_row_t rows[CORAL_QUEUE_COUNT];
    read_classes(rows);
    fprintf(out, "  %-10s %14s %14s %12s %12s\n", "class size", "allocated", "freed", "live",
            "peak");
    for (int c = 1; c < CORAL_QUEUE_COUNT; c++) {
        class_row_t *r = &rows[c];
        if (r->allocated == 0 && r->freed == 0) continue;
        char size[24];
        if (c < CORAL_CLASS_LARGE)
            snprintf(size, sizeof size, "%lld", class_size(c));
        else
            snprintf(size, sizeof size, "large/huge");
        fprintf(out, "  %-10s %14lld %14lld %12lld %12lld\n", size, (long long)r->allocated,
                (long long)r->freed, (long long)r->live, (long long)r->peak);
    }
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

int coral_option_info(size_t index, coral_option_info_t *out) {
    coral_process_init(); /* the value in force: the environment read */
    return coral_option_describe(index, out);
}
