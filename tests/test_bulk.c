/* The bulk API: coral_malloc_bulk gives valid, distinct, aligned, usable
 * blocks, from a page's free list, from the blocks its owner freed
 * (local_free) and by carving new ones by address; coral_free_bulk frees
 * arrays of mixed sizes and mixed owners (blocks allocated on several
 * threads, freed in one call elsewhere), in address order (long stretches
 * of one page) or not, and a page whose every block it frees is reset and
 * carved again. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "check.h"
#include "coralloc.h"
#include "testutil.h"

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

/* Distinct, aligned, each with `size` usable bytes, not overlapping. */
static void check_blocks(void **p, size_t n, size_t size) {
    for (size_t i = 0; i < n; i++) {
        CHECK_NOT_NULL(p[i]);
        CHECK_ALIGNED(p[i], 16);
        CHECK_GE(coral_malloc_usable_size(p[i]), size);
        fill_pattern(p[i], size, i);
    }
    for (size_t i = 0; i < n; i++) CHECK_EQ(pattern_mismatch(p[i], size, i), (size_t)-1);
    void **sorted = malloc(n * sizeof *sorted);
    CHECK_NOT_NULL(sorted);
    for (size_t i = 0; i < n; i++) sorted[i] = p[i];
    qsort(sorted, n, sizeof *sorted, cmp_ptr);
    for (size_t i = 1; i < n; i++)
        CHECK_GE((uintptr_t)sorted[i], (uintptr_t)sorted[i - 1] + size);
    free(sorted);
}

static void test_sizes(void) {
    static const size_t sizes[] = {0,    1,     16,    24,    64,    100,
                                    1024, 1700, 5000, 10000, 20000, 70000, 600000};
    enum { N = 3000 };
    void **p = malloc(N * sizeof *p);
    CHECK_NOT_NULL(p);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s] >= 70000 ? 40 : N;
        for (int round = 0; round < 3; round++) {
            CHECK_EQ(coral_malloc_bulk(sizes[s], n, p), n);
            check_blocks(p, n, sizes[s]);
            if (round == 1) { /* free a random half by bulk, the rest one by one */
                tu_rng rng = {s + 1};
                for (size_t i = n - 1; i > 0; i--) {
                    size_t j = rng_range(&rng, 0, i);
                    void *t = p[i];
                    p[i] = p[j];
                    p[j] = t;
                }
                coral_free_bulk(p, n / 2);
                for (size_t i = n / 2; i < n; i++) coral_free(p[i]);
            } else {
                coral_free_bulk(p, n);
            }
        }
    }
    CHECK_EQ(coral_malloc_bulk(64, 0, p), 0);
    p[0] = NULL;
    coral_free_bulk(p, 1); /* NULL entries are skipped */
    free(p);
}

/* Blocks of several threads' heaps, freed in bulk by other threads. */
#define THREADS 4
#define PER 4000
static void *blocks[THREADS][PER];

static void *allocate(void *arg) {
    uintptr_t t = (uintptr_t)arg;
    tu_rng rng = {t + 100};
    for (size_t i = 0; i < PER; i++) {
        size_t n = rng_range(&rng, 1, 2000);
        blocks[t][i] = coral_malloc(n);
        CHECK_NOT_NULL(blocks[t][i]);
        fill_pattern(blocks[t][i], 8 < n ? 8 : n, t * PER + i);
    }
    return NULL;
}

static void *free_others(void *arg) {
    uintptr_t t = (uintptr_t)arg;
    /* Interleave two other threads' blocks into one array. */
    void **mix = malloc(2 * PER * sizeof *mix);
    CHECK_NOT_NULL(mix);
    uintptr_t a = (t + 1) % THREADS, b = (t + 2) % THREADS;
    for (size_t i = 0; i < PER / 2; i++) {
        mix[2 * i] = blocks[a][i + (t % 2) * (PER / 2)];
        mix[2 * i + 1] = blocks[b][i + (t % 2) * (PER / 2)];
    }
    coral_free_bulk(mix, PER);
    free(mix);
    return NULL;
}

static void test_mixed_owners(void) {
    pthread_t th[THREADS];
    for (int round = 0; round < 5; round++) {
        for (uintptr_t t = 0; t < THREADS; t++)
            CHECK_EQ(pthread_create(&th[t], NULL, allocate, (void *)t), 0);
        for (int t = 0; t < THREADS; t++) CHECK_EQ(pthread_join(th[t], NULL), 0);
        /* Each block is freed exactly once: thread t frees half t%2 of
         * thread t+1's blocks and of thread t+2's; for thread x those are
         * halves (x-1)%2 and x%2: both halves, once each. */
        for (uintptr_t t = 0; t < THREADS; t++)
            CHECK_EQ(pthread_create(&th[t], NULL, free_others, (void *)t), 0);
        for (int t = 0; t < THREADS; t++) CHECK_EQ(pthread_join(th[t], NULL), 0);
    }
    coral_collect(1);
}

/* ---- the paths of one page, each in a thread of its own (a new heap) ---- */

#define FRESH_SIZE 48 /* bytes: a class no test before these uses */

static void *run_in_thread(void *(*fn)(void *)) {
    pthread_t th;
    void *ret;
    CHECK_EQ(pthread_create(&th, NULL, fn, NULL), 0);
    CHECK_EQ(pthread_join(th, &ret), 0);
    return ret;
}

/* A new heap's first page: malloc_bulk takes the blocks the first malloc
 * carved onto the free list, then carves the others straight into the
 * array, by address: one contiguous stretch of the page, in order. */
static void *carve_by_address(void *arg) {
    (void)arg;
    enum { N = 1000 };
    static void *p[N];
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, p), N);
    check_blocks(p, N, FRESH_SIZE);
    CHECK_EQ(coral_malloc_usable_size(p[0]), (size_t)FRESH_SIZE);
    for (size_t i = 1; i < N; i++) CHECK_EQ((uintptr_t)p[i], (uintptr_t)p[i - 1] + FRESH_SIZE);
    coral_free_bulk(p, N);
    return NULL;
}

/* Blocks freed one by one go on the page's local_free; malloc_bulk takes
 * them back before it carves any new block. */
static void *take_local_free(void *arg) {
    (void)arg;
    enum { N = 300, FREED = 40 };
    static void *p[N], *again[FREED];
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, p), N);
    for (size_t i = 100; i < 100 + FREED; i++) coral_free(p[i]);
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, FREED, again), FREED);
    qsort(again, FREED, sizeof *again, cmp_ptr);
    for (size_t i = 0; i < FREED; i++) CHECK_EQ((uintptr_t)again[i], (uintptr_t)p[100 + i]);
    for (size_t i = 0; i < FREED; i++) p[100 + i] = again[i];
    check_blocks(p, N, FRESH_SIZE);
    coral_free_bulk(p, N);
    return NULL;
}

/* free_bulk of every block of the first page of a class, in order: the
 * page is reset, so the next malloc_bulk carves the same blocks again, in
 * the same order; the page's memory is no longer fresh, so calloc clears
 * what it gives. Then the same with the array reversed and shuffled (no
 * long stretch): the page is emptied all the same. */
static void *reset_emptied_page(void *arg) {
    (void)arg;
    enum { N = 500 };
    static void *p[N], *q[N];
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, p), N);
    check_blocks(p, N, FRESH_SIZE); /* fills them: dirty */
    coral_free_bulk(p, N);
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, q), N);
    for (size_t i = 0; i < N; i++) CHECK_EQ((uintptr_t)q[i], (uintptr_t)p[i]);
    check_blocks(q, N, FRESH_SIZE);
    coral_free_bulk(q, N);
    unsigned char *z = coral_calloc(1, FRESH_SIZE);
    CHECK_NOT_NULL(z);
    for (size_t i = 0; i < FRESH_SIZE; i++) CHECK_EQ(z[i], 0);
    coral_free(z);
    /* Not in address order. */
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, p), N);
    tu_rng rng = {7};
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = rng_range(&rng, 0, i);
        void *t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    coral_free_bulk(p, N);
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, q), N);
    check_blocks(q, N, FRESH_SIZE);
    coral_free_bulk(q, N);
    return NULL;
}

/* One array mixing long stretches in address order, blocks of many pages
 * one by one, NULLs, aligned, large and huge blocks; then the heap must
 * still hand out distinct blocks (a list freed wrong would give one block
 * twice). */
static void *mixed_array(void *arg) {
    (void)arg;
    enum { RUN = 200, SMALL = 64, N = 3 * RUN + SMALL + 8 };
    static void *mix[N], *small[SMALL], *check[4 * RUN];
    size_t n = 0;
    CHECK_EQ(coral_malloc_bulk(32, RUN, mix + n), RUN);
    n += RUN;
    for (size_t i = 0; i < SMALL; i++) {
        small[i] = coral_malloc(16 + 16 * (i % 60));
        CHECK_NOT_NULL(small[i]);
        mix[n++] = small[i];
        if (i % 16 == 0) mix[n++] = NULL;
    }
    CHECK_EQ(coral_malloc_bulk(1700, RUN, mix + n), RUN);
    n += RUN;
    mix[n++] = coral_aligned_alloc(256, 256);
    mix[n++] = coral_malloc(100000);
    mix[n++] = coral_malloc(5u << 20);
    CHECK_EQ(coral_malloc_bulk(32, RUN, mix + n), RUN);
    n += RUN;
    CHECK(n <= N);
    coral_free_bulk(mix, n);
    static const size_t again[] = {32, 1700, 16, 496};
    for (size_t s = 0; s < 4; s++) {
        CHECK_EQ(coral_malloc_bulk(again[s], 4 * RUN, check), 4 * RUN);
        check_blocks(check, 4 * RUN, again[s]);
        coral_free_bulk(check, 4 * RUN);
    }
    return NULL;
}

int main(void) {
    /* First: the process's first allocation, so its page is in a segment
     * fresh from the OS (zero), which calloc must not trust after a reset. */
    run_in_thread(reset_emptied_page);
    run_in_thread(carve_by_address);
    run_in_thread(take_local_free);
    run_in_thread(mixed_array);
    test_sizes();
    test_mixed_owners();
    printf("bulk: ok\n");
    return 0;
}
