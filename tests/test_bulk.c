/* The bulk API: coral_malloc_bulk (one size) and coral_malloc_bulk_sizes
 * (a size per block) give valid, distinct, aligned, usable blocks, from a
 * page's free list, from the blocks its owner freed (local_free) and by
 * carving new ones by address; coral_free_bulk frees
 * arrays of mixed sizes and mixed owners (blocks allocated on several
 * threads, freed in one call elsewhere), in address order (long stretches
 * of one page) or not, and a page whose every block it frees is reset and
 * carved again. coral_malloc_bulk_sizes stops at a size it cannot give
 * (ENOMEM) and returns how many it gave. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "stats_json.h"
#include "coralloc.h"
#include "testutil.h"

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

static void shuffle(void **p, size_t n, uint64_t seed) {
    tu_rng rng = {seed};
    for (size_t i = n - 1; i > 0 && n > 1; i--) {
        size_t j = rng_range(&rng, 0, i);
        void *t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
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
    for (size_t i = 1; i < n; i++) CHECK_GE((uintptr_t)sorted[i], (uintptr_t)sorted[i - 1] + size);
    free(sorted);
}

typedef struct {
    uintptr_t at;
    size_t size;
} sized_t;

static int cmp_sized(const void *a, const void *b) {
    uintptr_t x = ((const sized_t *)a)->at, y = ((const sized_t *)b)->at;
    return x < y ? -1 : x > y;
}

/* As check_blocks, each block p[i] with its own size sizes[i]. */
static void check_blocks_sized(void **p, const size_t *sizes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        CHECK_NOT_NULL(p[i]);
        CHECK_ALIGNED(p[i], 16);
        CHECK_GE(coral_malloc_usable_size(p[i]), sizes[i]);
        fill_pattern(p[i], sizes[i], i);
    }
    for (size_t i = 0; i < n; i++) CHECK_EQ(pattern_mismatch(p[i], sizes[i], i), (size_t)-1);
    /* Sorted by address, each block ends before the next starts (a block
     * of 0 bytes takes one: distinct pointers). */
    sized_t *order = malloc((n ? n : 1) * sizeof *order);
    CHECK_NOT_NULL(order);
    for (size_t i = 0; i < n; i++) order[i] = (sized_t){(uintptr_t)p[i], sizes[i] ? sizes[i] : 1};
    qsort(order, n, sizeof *order, cmp_sized);
    for (size_t i = 1; i < n; i++) CHECK_GE(order[i].at, order[i - 1].at + order[i - 1].size);
    free(order);
}

/* coral_malloc_bulk_sizes, on a thread of its own (its first call sets the
 * thread up): random small sizes (more blocks of some classes than a page
 * holds, so pages run out mid-call), every size path (0, direct sizes,
 * above 1 KiB, large, huge), n = 0, and sizes it cannot give. */
static void *bulk_sizes(void *arg) {
    (void)arg;
    enum { N = 6000 };
    static size_t sizes[N];
    static void *p[N];
    tu_rng rng = {42};
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < N; i++) sizes[i] = rng_range(&rng, 1, round == 2 ? 64 : 1024);
        CHECK_EQ(coral_malloc_bulk_sizes(sizes, N, p), (size_t)N);
        check_blocks_sized(p, sizes, N);
        if (round == 0) { /* free every other block one by one, the rest in bulk */
            for (size_t i = 0; i < N; i += 2) coral_free(p[i]), p[i] = NULL;
        }
        coral_free_bulk(p, N);
    }
    static const size_t paths[] = {0,     1,      16,     24,       1024, 1025,     1700, 5000,
                                   10000, 100000, 600000, 5u << 20, 48,   16 << 10, 0,    33};
    enum { P = sizeof paths / sizeof *paths };
    void *q[P];
    CHECK_EQ(coral_malloc_bulk_sizes(paths, P, q), (size_t)P);
    check_blocks_sized(q, paths, P);
    coral_free_bulk(q, P);
    /* n = 0: nothing given, nothing written. */
    q[0] = (void *)&rng;
    CHECK_EQ(coral_malloc_bulk_sizes(paths, 0, q), (size_t)0);
    CHECK_EQ((uintptr_t)q[0], (uintptr_t)&rng);
    /* A size too large to allocate (or overflowing) stops the call there:
     * the blocks before it are given and valid, errno says ENOMEM. */
    static const size_t absurd[][4] = {
        {16, 2000, SIZE_MAX, 64},
        {100, 70000, (size_t)PTRDIFF_MAX, 64},
        {SIZE_MAX - 15, 16, 16, 16},
        {1024, 32, (size_t)1 << 62, 8},
    };
    static const size_t given[] = {2, 2, 0, 2};
    for (size_t a = 0; a < sizeof absurd / sizeof *absurd; a++) {
        errno = 0;
        void *r[4] = {NULL, NULL, NULL, NULL};
        size_t got = coral_malloc_bulk_sizes(absurd[a], 4, r);
        CHECK_EQ(got, given[a]);
        CHECK_EQ(errno, ENOMEM);
        check_blocks_sized(r, absurd[a], got);
        for (size_t i = got; i < 4; i++) CHECK_NULL(r[i]);
        coral_free_bulk(r, got);
    }
    return NULL;
}

static void test_sizes(void) {
    static const size_t sizes[] = {0,    1,    16,    24,    64,    100,   1024,
                                   1700, 5000, 10000, 20000, 70000, 600000};
    enum { N = 3000 };
    void **p = malloc(N * sizeof *p);
    CHECK_NOT_NULL(p);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s] >= 70000 ? 40 : N;
        for (int round = 0; round < 3; round++) {
            CHECK_EQ(coral_malloc_bulk(sizes[s], n, p), n);
            check_blocks(p, n, sizes[s]);
            if (round == 1) { /* free a random half by bulk, the rest one by one */
                shuffle(p, n, s + 1);
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
    static size_t sizes[THREADS][PER];
    for (size_t i = 0; i < PER; i++) sizes[t][i] = rng_range(&rng, 1, 2000);
    /* Odd threads take all their blocks in one coral_malloc_bulk_sizes. */
    if (t % 2) CHECK_EQ(coral_malloc_bulk_sizes(sizes[t], PER, blocks[t]), (size_t)PER);
    for (size_t i = 0; i < PER; i++) {
        size_t n = sizes[t][i];
        if (t % 2 == 0) blocks[t][i] = coral_malloc(n);
        CHECK_NOT_NULL(blocks[t][i]);
        CHECK_GE(coral_malloc_usable_size(blocks[t][i]), n);
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
    shuffle(p, N, 7);
    coral_free_bulk(p, N);
    CHECK_EQ(coral_malloc_bulk(FRESH_SIZE, N, q), N);
    check_blocks(q, N, FRESH_SIZE);
    coral_free_bulk(q, N);
    return NULL;
}

/* A random half of a page's blocks, freed by free_bulk in shuffled order
 * (stretches and single blocks alike get chase hints in their word 1, see
 * bulk.c), comes back: malloc_bulk gives distinct blocks, most of them the
 * freed ones, none of them a block kept. Then calloc from those lists gives
 * zeroed memory, hint word included. */
static void *scattered_half(void *arg) {
    (void)arg;
    enum { N = 600, HALF = N / 2 };
    static void *p[N], *again[HALF], *kept[HALF];
    static size_t want[HALF];
    for (size_t size = 16; size <= 1700; size = size * 3 + 16) {
        CHECK_EQ(coral_malloc_bulk(size, N, p), N);
        check_blocks(p, N, size); /* fills block i with pattern i */
        shuffle(p, N, size);
        /* p[0..HALF) go; the rest keep their contents (pattern of their
         * index before the shuffle, checked through a copy of their order) */
        for (size_t i = 0; i < HALF; i++) kept[i] = p[HALF + i];
        for (size_t i = 0; i < HALF; i++) fill_pattern(kept[i], size, 1000 + i);
        coral_free_bulk(p, HALF);
        CHECK_EQ(coral_malloc_bulk(size, HALF, again), HALF);
        check_blocks(again, HALF, size); /* distinct, and filled */
        for (size_t i = 0; i < HALF; i++)
            CHECK_EQ(pattern_mismatch(kept[i], size, 1000 + i), (size_t)-1);
        /* The freed blocks were taken again (a page's freed blocks come
         * before its blocks never handed out, which a page of big blocks
         * may still have: then some of those instead). */
        qsort(again, HALF, sizeof *again, cmp_ptr);
        size_t reused = 0;
        for (size_t i = 0; i < HALF; i++)
            reused += bsearch(&p[i], again, HALF, sizeof *again, cmp_ptr) != NULL;
        CHECK_GE(reused, HALF * 8 / 10);
        coral_free_bulk(again, HALF);
        for (size_t i = 0; i < HALF; i++) {
            unsigned char *z = coral_calloc(1, size);
            CHECK_NOT_NULL(z);
            for (size_t k = 0; k < size; k++) CHECK_EQ(z[k], 0);
            again[i] = z;
            want[i] = size;
        }
        check_blocks_sized(again, want, HALF);
        coral_free_bulk(again, HALF);
        coral_free_bulk(kept, HALF);
    }
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

/* ---- the bulk cache (src/stash.h) ---------------------------------------------- */

#define CACHE_SIZE 1700 /* bytes: 36 blocks a slice, so a shuffled array is scattered */

static long long cached_bytes(void) { return stats_get("bulk_cached"); }

/* Set a run-time option; returns its value before. */
static long long option_swap(const char *name, long long value) {
    long long old;
    CHECK_EQ(coral_option_get(name, &old), 0);
    CHECK_EQ(coral_option_set(name, value), 0);
    return old;
}

static bool same_set(void **a, void **b, size_t n) {
    void **x = malloc(2 * n * sizeof *x);
    CHECK_NOT_NULL(x);
    memcpy(x, a, n * sizeof *x);
    memcpy(x + n, b, n * sizeof *x);
    qsort(x, n, sizeof *x, cmp_ptr);
    qsort(x + n, n, sizeof *x, cmp_ptr);
    bool same = memcmp(x, x + n, n * sizeof *x) == 0;
    free(x);
    return same;
}

/* n blocks of CACHE_SIZE into p, with the cache made and the class asked
 * for: the thread's first coral_free_bulk makes the cache, and a class is
 * cached once coral_malloc_bulk has asked for it. */
static void cache_armed_blocks(void **p, size_t n) {
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, n, p), n);
    coral_free_bulk(p, n);
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, n, p), n);
}

/* A shuffled array freed in bulk is cached (the statistics count its
 * bytes) and the next coral_malloc_bulk of the size gives back exactly
 * those blocks, distinct and usable, the cache empty again. */
static void *cache_reuse(void *arg) {
    (void)arg;
    enum { N = 400 };
    static void *p[N], *q[N];
    cache_armed_blocks(p, N);
    size_t block = coral_malloc_usable_size(p[0]);
    long long before = cached_bytes();
    shuffle(p, N, 3);
    coral_free_bulk(p, N);
    CHECK_EQ(cached_bytes(), before + (long long)(N * block));
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, N, q), N);
    CHECK(same_set(p, q, N));
    CHECK_EQ(cached_bytes(), before);
    check_blocks(q, N, CACHE_SIZE);
    /* Taken in part: the rest stays, and what is left comes out next. */
    shuffle(q, N, 4);
    coral_free_bulk(q, N);
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, N / 4, p), N / 4);
    CHECK_EQ(cached_bytes(), before + (long long)((N - N / 4) * block));
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, N - N / 4, p + N / 4), N - N / 4);
    CHECK(same_set(p, q, N));
    check_blocks(p, N, CACHE_SIZE);
    /* An array in address order goes to the pages (stretches of a slice are
     * linked whole, and a page they empty is reset), not to the cache: all
     * but the groups of 8 entries that straddle two slices. */
    qsort(p, N, sizeof *p, cmp_ptr);
    coral_free_bulk(p, N);
    CHECK_LT(cached_bytes(), before + (long long)(N * block / 4));
    return NULL;
}

/* Two cached classes in one shuffled array (the cache's put cursor moves
 * between them at almost every entry): each size's next coral_malloc_bulk
 * gives back exactly its own blocks. */
static void *cache_two_classes(void *arg) {
    (void)arg;
    enum { N = 300, BIG = 3000 };
    static void *p[2 * N], *a[N], *b[N];
    cache_armed_blocks(p, N);
    CHECK_EQ(coral_malloc_bulk(BIG, N, p + N), N);
    coral_free_bulk(p + N, N); /* (BIG asked for, then cached or not) */
    CHECK_EQ(coral_malloc_bulk(BIG, N, p + N), N);
    memcpy(a, p, sizeof a);
    memcpy(b, p + N, sizeof b);
    long long before = cached_bytes();
    size_t small_block = coral_malloc_usable_size(a[0]), big_block = coral_malloc_usable_size(b[0]);
    shuffle(p, 2 * N, 12);
    coral_free_bulk(p, 2 * N);
    CHECK_EQ(cached_bytes(), before + (long long)(N * (small_block + big_block)));
    static void *q[N];
    CHECK_EQ(coral_malloc_bulk(BIG, N, q), N);
    CHECK(same_set(q, b, N));
    check_blocks(q, N, BIG);
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, N, p), N);
    CHECK(same_set(p, a, N));
    check_blocks(p, N, CACHE_SIZE);
    CHECK_EQ(cached_bytes(), before);
    coral_free_bulk(q, N);
    coral_free_bulk(p, N);
    return NULL;
}

/* Blocks of a user heap never go in the cache (destroy frees their pages
 * whatever the cache holds); with the option at 0 nothing is cached, and
 * setting it to 0 empties a thread's cache at its next coral_free_bulk. */
static void *cache_exclusions(void *arg) {
    (void)arg;
    enum { N = 300 };
    static void *p[N];
    cache_armed_blocks(p, N);
    long long before = cached_bytes();
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    static void *h[N];
    for (size_t i = 0; i < N; i++) CHECK_NOT_NULL(h[i] = coral_heap_malloc(heap, CACHE_SIZE));
    shuffle(h, N, 5);
    coral_free_bulk(h, N);
    CHECK_EQ(cached_bytes(), before);
    coral_heap_destroy(heap);

    shuffle(p, N, 6);
    coral_free_bulk(p, N / 2);
    CHECK_GT(cached_bytes(), before);
    long long old = option_swap("BULK_CACHE_KB", 0);
    coral_free_bulk(p + N / 2, N / 2);
    CHECK_EQ(cached_bytes(), before);
    CHECK_EQ(coral_option_set("BULK_CACHE_KB", old), 0);
    return NULL;
}

/* More than the option allows: the cache is emptied, not left full, and
 * the blocks all come back valid. */
static void *cache_overflow(void *arg) {
    (void)arg;
    enum { N = 200 }; /* 350 KiB */
    static void *p[N];
    long long old = option_swap("BULK_CACHE_KB", 100);
    cache_armed_blocks(p, N);
    long long before = cached_bytes();
    shuffle(p, N, 8);
    coral_free_bulk(p, N);
    CHECK_EQ(cached_bytes(), before);
    CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, N, p), N);
    check_blocks(p, N, CACHE_SIZE);
    coral_free_bulk(p, N);
    CHECK_EQ(coral_option_set("BULK_CACHE_KB", old), 0);
    return NULL;
}

/* A thread that exits with blocks in its cache gives them back. */
static void *cache_then_exit(void *arg) {
    (void)arg;
    enum { N = 300 };
    static void *p[N];
    cache_armed_blocks(p, N);
    long long before = cached_bytes();
    shuffle(p, N, 9);
    coral_free_bulk(p, N);
    CHECK_GT(cached_bytes(), before);
    return NULL;
}

/* A thread that goes idle with a full cache: the purge thread empties it
 * once it has gone unused for the purge delay. The thread waits on the
 * barrier (no allocator call) from its free until the test is done. */
static pthread_barrier_t idle_barrier;

static void *cache_then_idle(void *arg) {
    (void)arg;
    enum { N = 600 }; /* 1 MiB: enough to start the purge thread */
    static void *p[N];
    cache_armed_blocks(p, N);
    shuffle(p, N, 10);
    coral_free_bulk(p, N);
    pthread_barrier_wait(&idle_barrier); /* cached */
    pthread_barrier_wait(&idle_barrier); /* checked: may exit */
    return NULL;
}

static void test_cache_lifetimes(void) {
    long long before = cached_bytes();
    run_in_thread(cache_then_exit);
    CHECK_EQ(cached_bytes(), before);

    /* A delay no run of this test reaches on the real clock, which the
     * purge thread's own passes follow (under valgrind on a loaded machine
     * a delay of a few ms passes between the fill and the first check);
     * the test clock passes it. */
    enum { DELAY_MS = 600000 };
    long long delay = option_swap("PURGE_DELAY_MS", DELAY_MS);
    CHECK_EQ(pthread_barrier_init(&idle_barrier, NULL, 2), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, cache_then_idle, NULL), 0);
    pthread_barrier_wait(&idle_barrier);
    long long peak = cached_bytes();
    CHECK_GT(peak, before);
    /* A pass sees the cache in use since its last look; once it has stayed
     * unused for the delay, the next pass empties it. */
    coral_test_purge_pass();
    CHECK_EQ(cached_bytes(), peak);
    coral_test_advance_clock(DELAY_MS);
    coral_test_purge_pass();
    CHECK_EQ(cached_bytes(), before);
    pthread_barrier_wait(&idle_barrier);
    CHECK_EQ(pthread_join(th, NULL), 0);
    pthread_barrier_destroy(&idle_barrier);
    CHECK_EQ(coral_option_set("PURGE_DELAY_MS", delay), 0);
}

/* The purge thread empties a cache in the pauses of a thread that keeps
 * using it (purge delay 1 ms): every block stays valid and distinct. */
static void *cache_with_purger(void *arg) {
    (void)arg;
    enum { N = 256 };
    void **p = malloc(N * sizeof *p); /* (each thread its own) */
    CHECK_NOT_NULL(p);
    cache_armed_blocks(p, N);
    for (int round = 0; round < 60; round++) {
        check_blocks(p, N, CACHE_SIZE);
        shuffle(p, N, (uint64_t)round);
        coral_free_bulk(p, N / 2);
        if (round % 3 == 0) { /* a pause: the purger may flush the cache now */
            coral_test_advance_clock(1);
            coral_test_purge_pass();
        }
        CHECK_EQ(coral_malloc_bulk(CACHE_SIZE, N / 2, p), N / 2);
    }
    coral_free_bulk(p, N);
    free(p);
    return NULL;
}

static void test_cache_with_purger(void) {
    long long delay = option_swap("PURGE_DELAY_MS", 1);
    pthread_t th[2];
    for (int t = 0; t < 2; t++) CHECK_EQ(pthread_create(&th[t], NULL, cache_with_purger, NULL), 0);
    for (int t = 0; t < 2; t++) CHECK_EQ(pthread_join(th[t], NULL), 0);
    CHECK_EQ(coral_option_set("PURGE_DELAY_MS", delay), 0);
}

int main(void) {
    /* First: the process's first allocation, so its page is in a segment
     * fresh from the OS (zero), which calloc must not trust after a reset. */
    run_in_thread(reset_emptied_page);
    run_in_thread(carve_by_address);
    run_in_thread(take_local_free);
    run_in_thread(mixed_array);
    run_in_thread(scattered_half);
    run_in_thread(bulk_sizes);
    test_sizes();
    test_mixed_owners();
    run_in_thread(cache_reuse);
    run_in_thread(cache_two_classes);
    run_in_thread(cache_exclusions);
    run_in_thread(cache_overflow);
    test_cache_lifetimes();
    test_cache_with_purger();
    printf("bulk: ok\n");
    return 0;
}
