/* Memory goes back to the OS: after a burst of small, large and huge blocks
 * is freed, resident memory falls back near where it started
 *   - within the purge delay plus a bounded time, with no call from the
 *     program (the background purge thread; CORALLOC_PURGE_DELAY_MS=100);
 *   - at once on coral_collect(1), with the purge thread off.
 * And CORALLOC_HUGE_PAGES=1 leaves a small program's segments alone.
 * Each case runs in a child process with its options in the environment.
 * RSS figures are only meaningful without a sanitizer: release only. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "proc.h"
#include "stats_json.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

enum { SMALL = 1 << 20, LARGE = 96, HUGE = 8 };
static void *small[SMALL], *large[LARGE], *huge[HUGE];

/* About 64 MiB of small blocks, 96 MiB of large and 80 MiB of huge ones. */
static void burst(void) {
    tu_rng rng = {7};
    for (size_t i = 0; i < SMALL; i++) {
        size_t n = rng_range(&rng, 16, 112);
        small[i] = coral_malloc(n);
        CHECK_NOT_NULL(small[i]);
        memset(small[i], 1, n);
    }
    for (size_t i = 0; i < LARGE; i++) {
        large[i] = coral_malloc(MiB);
        CHECK_NOT_NULL(large[i]);
        memset(large[i], 2, MiB);
    }
    for (size_t i = 0; i < HUGE; i++) {
        huge[i] = coral_malloc(10 * MiB);
        CHECK_NOT_NULL(huge[i]);
        memset(huge[i], 3, 10 * MiB);
    }
}

static void release(void) {
    /* Scrambled order, so pages empty at different times. */
    for (size_t i = 0; i < SMALL; i++) coral_free(small[(i * 7919) % SMALL]);
    for (size_t i = 0; i < LARGE; i++) coral_free(large[i]);
    for (size_t i = 0; i < HUGE; i++) coral_free(huge[i]);
}

static int child_background(void) {
    coral_free(coral_malloc(1)); /* set up */
    size_t before = rss_mib();
    burst();
    size_t peak = rss_mib();
    CHECK_GE(peak, before + 200);
    release();
    double t0 = now_seconds();
    size_t after = rss_mib();
    while (after > before + 24 && now_seconds() - t0 < 3.0) {
        usleep(20000);
        after = rss_mib();
    }
    double took = now_seconds() - t0;
    printf("background purge: RSS %zu -> %zu -> %zu MiB in %.2f s (delay 0.10 s)\n", before,
           peak, after, took);
    CHECK_LE(after, before + 24);
    CHECK_LT(took, 1.0); /* the delay plus a bounded time */
    /* Purged memory reads as zero again. */
    char *p = coral_calloc(1, 4 * MiB - 100 * 1024);
    for (size_t i = 0; i < 4 * MiB - 100 * 1024; i += 4096) CHECK_EQ(p[i], 0);
    coral_free(p);
    return 0;
}

static int child_collect(void) {
    coral_free(coral_malloc(1));
    size_t before = rss_mib();
    burst();
    size_t peak = rss_mib();
    release();
    size_t held = rss_mib(); /* the delay is an hour: nothing purged yet */
    coral_collect(1);
    size_t after = rss_mib();
    printf("coral_collect(1): RSS %zu -> %zu -> %zu (held) -> %zu MiB\n", before, peak, held,
           after);
    CHECK_GE(held, before + 100);
    CHECK_LE(after, before + 24);
    return 0;
}

/* CORALLOC_HUGE_PAGES=1: a small program gets no huge page advice; once it
 * holds more than 16 MiB of segments, each new segment does. */
static int child_hugepages(void) {
    void *small[1000];
    for (size_t i = 0; i < 1000; i++) CHECK_NOT_NULL(small[i] = coral_malloc(1000));
    CHECK_EQ(stats_os_calls("hugepage"), 0);
    enum { BIG = 40 }; /* 40 MiB in 1 MiB blocks: 10+ segments */
    void *big[BIG];
    for (size_t i = 0; i < BIG; i++) CHECK_NOT_NULL(big[i] = coral_malloc(MiB));
    long long segments = stats_get("segments"), advised = stats_os_calls("hugepage");
    printf("huge pages: %lld of %lld segments advised\n", advised, segments);
    CHECK_GE(segments, 10);
    CHECK_EQ(advised, segments - 4);
    for (size_t i = 0; i < BIG; i++) coral_free(big[i]);
    for (size_t i = 0; i < 1000; i++) coral_free(small[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "background") == 0) return child_background();
    if (argc == 2 && strcmp(argv[1], "collect") == 0) return child_collect();
    if (argc == 2 && strcmp(argv[1], "hugepages") == 0) return child_hugepages();
    static const char *const bg[] = {"CORALLOC_PURGE_DELAY_MS=100", NULL};
    static const char *const co[] = {"CORALLOC_PURGE_DELAY_MS=3600000",
                                     "CORALLOC_PURGE_THREAD=0", NULL};
    run_child("background", bg);
    run_child("collect", co);
    static const char *const hp[] = {"CORALLOC_HUGE_PAGES=1", NULL};
    run_child("hugepages", hp);
    return 0;
}
