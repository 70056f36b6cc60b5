/* The bulk API: coral_malloc_bulk gives valid, distinct, aligned, usable
 * blocks; coral_free_bulk frees arrays of mixed sizes and mixed owners
 * (blocks allocated on several threads, freed in one call elsewhere). */
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
    static const size_t sizes[] = {0, 1, 16, 24, 64, 100, 1024, 1700, 5000, 70000, 600000};
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

int main(void) {
    test_sizes();
    test_mixed_owners();
    printf("bulk: ok\n");
    return 0;
}
