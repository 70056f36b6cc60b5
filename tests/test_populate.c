/* The adaptive populate policy (CORALLOC_POPULATE=adaptive, populate.c):
 * clean memory is prefaulted only where the program is known to write it.
 *   - small blocks: a class's first page never; a new page once the class
 *     has filled one (carving writes every OS page of it);
 *   - big class blocks: only when the class's full page was written (a
 *     program that touches one page of each 64 KiB block gets no populate,
 *     and its RSS stays that of `off`);
 *   - huge blocks: only after two freed blocks were found written whole;
 *     never after blocks touched on one page;
 *   - realloc: the part a written huge block grows by, and the part of a
 *     moved block the copy writes; contents stay intact.
 *   - `off` makes no populate and no mincore call at all.
 * Each case runs in a child process (the policy's score is process-wide),
 * with huge pages off (CORALLOC_HUGE_PAGES=0).
 * RSS and residency are only meaningful without a sanitizer: release only. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "proc.h"
#include "stats_json.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static long long populates(void) { return stats_os_calls("populate"); }

/* 64-byte blocks: a 64 KiB page holds 1024. Half a page, then 3.5 more
 * pages; returns the populates made during each part. */
enum { SMALL_PER_PAGE = 1024, SMALL_N = 4 * SMALL_PER_PAGE };
static void small_blocks(long long made[2]) {
    static void *blocks[SMALL_N];
    long long before = populates();
    for (size_t i = 0; i < SMALL_N; i++) {
        if (i == SMALL_PER_PAGE / 2) made[0] = populates() - before;
        blocks[i] = coral_malloc(64);
        CHECK_NOT_NULL(blocks[i]);
        memset(blocks[i], 5, 64);
    }
    made[1] = populates() - before - made[0];
    for (size_t i = 0; i < SMALL_N; i++) coral_free(blocks[i]);
}

static int child_small(void) {
    long long made[2];
    small_blocks(made);
    CHECK_EQ(made[0], 0); /* the class's first page: never */
    CHECK_GE(made[1], 2); /* pages 2-4 were made while the class had a full page */
    return 0;
}

/* 64 KiB blocks (8 to a page of 512 KiB), each written on `touched` bytes
 * from its start. Returns the RSS growth in KiB. */
static size_t big_class_blocks(size_t touched) {
    enum { N = 64 };
    static void *blocks[N];
    size_t rss0 = rss_kib();
    for (size_t i = 0; i < N; i++) {
        blocks[i] = coral_malloc(64 * KiB);
        CHECK_NOT_NULL(blocks[i]);
        memset(blocks[i], 7, touched);
    }
    size_t grown = rss_kib() - rss0;
    for (size_t i = 0; i < N; i++) coral_free(blocks[i]);
    return grown;
}

static int child_big_sparse(void) {
    long long before = populates(), looked = stats_os_calls("mincore");
    size_t grown = big_class_blocks(1);
    CHECK_EQ(populates(), before);
    CHECK_GT(stats_os_calls("mincore"), looked); /* it did look, and saw one page in 16 */
    CHECK_LT(grown, 2 * MiB / KiB);              /* 64 pages touched, not 4 MiB */
    return 0;
}

static int child_big_dense(void) {
    long long before = populates();
    size_t grown = big_class_blocks(64 * KiB);
    CHECK_GE(populates(), before + 6); /* pages 2-8 */
    CHECK_LT(grown, 5 * MiB / KiB);    /* 4 MiB written: nothing much more */
    return 0;
}

/* Huge blocks of 8 MiB written on `touched` bytes of each 4 KiB page
 * (0: only the first page), two freed, then four placed at once (two on
 * the pooled ones' pages, two on clean memory). Returns the populates made
 * for the four. */
static long long huge_after(int whole) {
    enum { N = 4 };
    void *b[N];
    for (int i = 0; i < 2; i++) {
        b[i] = coral_malloc(8 * MiB);
        CHECK_NOT_NULL(b[i]);
        memset(b[i], 3, whole ? 8 * MiB : 4 * KiB);
    }
    coral_free(b[0]);
    coral_free(b[1]);
    long long before = populates();
    for (int i = 0; i < N; i++) {
        b[i] = coral_malloc(8 * MiB);
        CHECK_NOT_NULL(b[i]);
        memset(b[i], 4, 8 * MiB);
    }
    long long made = populates() - before;
    for (int i = 0; i < N; i++) coral_free(b[i]);
    return made;
}

static int child_huge_dense(void) {
    CHECK_GE(huge_after(1), 2);
    return 0;
}

static int child_huge_sparse(void) {
    CHECK_EQ(huge_after(0), 0);
    return 0;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 512) p[i] = (unsigned char)(seed + i / 512);
}

static void check_filled(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 512)
        CHECK_MSG(p[i] == (unsigned char)(seed + i / 512), "byte %zu\n", i);
}

/* realloc(p, size), which must make `populated` more populate calls. */
static unsigned char *realloc_populating(unsigned char *p, size_t size, long long populated) {
    long long before = populates();
    p = coral_realloc(p, size);
    CHECK_NOT_NULL(p);
    CHECK_EQ(populates(), before + populated);
    return p;
}

/* A written huge block grows: the new part is populated, the old kept. */
static int child_realloc_grow(void) {
    unsigned char *p = coral_malloc(4 * MiB);
    CHECK_NOT_NULL(p);
    memset(p, 9, 4 * MiB);
    fill(p, 4 * MiB, 1);
    p = realloc_populating(p, 8 * MiB, 1);
    check_filled(p, 4 * MiB, 1);
    memset(p + 4 * MiB, 2, 4 * MiB);
    /* a block touched on its first page only grows without it */
    unsigned char *q = coral_malloc(4 * MiB);
    CHECK_NOT_NULL(q);
    q[0] = 1;
    q = realloc_populating(q, 8 * MiB, 0);
    CHECK_EQ(q[0], 1);
    coral_free(p);
    coral_free(q);
    return 0;
}

/* A big class block moved to a bigger class: the copy's part of the new
 * block (clean memory) is populated first; contents intact. */
static int child_realloc_copy(void) {
    unsigned char *p = coral_malloc(256 * KiB);
    CHECK_NOT_NULL(p);
    fill(p, 256 * KiB, 3);
    p = realloc_populating(p, 320 * KiB, 1);
    check_filled(p, 256 * KiB, 3);
    coral_free(p);
    return 0;
}

/* `off`: the same work makes no populate and no mincore call. */
static int child_off(void) {
    long long made[2];
    small_blocks(made);
    (void)big_class_blocks(64 * KiB);
    (void)huge_after(1);
    CHECK_EQ(populates(), 0);
    CHECK_EQ(stats_os_calls("mincore"), 0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "off") == 0) return child_off();
    static const struct {
        const char *name;
        int (*run)(void);
    } cases[] = {{"small", child_small},
                 {"big-sparse", child_big_sparse},
                 {"big-dense", child_big_dense},
                 {"huge-dense", child_huge_dense},
                 {"huge-sparse", child_huge_sparse},
                 {"realloc-grow", child_realloc_grow},
                 {"realloc-copy", child_realloc_copy}};
    size_t n = sizeof cases / sizeof cases[0];
    if (argc == 2) {
        for (size_t i = 0; i < n; i++)
            if (strcmp(argv[1], cases[i].name) == 0) return cases[i].run();
        return 2;
    }
    /* In 4 KiB pages: the huge-page policy (test_purge) would make the
     * RSS and residency these cases measure whole 2 MiB pages. */
    static const char *const adaptive[] = {"CORALLOC_POPULATE=adaptive",
                                           "CORALLOC_PURGE_DELAY_MS=3600000",
                                           "CORALLOC_HUGE_PAGES=0", NULL};
    static const char *const off[] = {"CORALLOC_POPULATE=off", "CORALLOC_HUGE_PAGES=0", NULL};
    for (size_t i = 0; i < n; i++) run_child(cases[i].name, adaptive);
    run_child("off", off);
    return 0;
}
