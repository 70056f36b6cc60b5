/* test_api: the contract of the coral_ API (every build configuration).
 *
 * Alignment, usable sizes, calloc zeroing (also of reused and purged
 * memory), overflow and errno, realloc content across every size range,
 * aligned allocation up to 16 MiB alignment and its argument checks,
 * valloc/pvalloc, sized frees, coral_good_size, coral_owns, many live blocks
 * of mixed sizes (no overlap, no corruption), and coral_collect at any time.
 * And two placement promises: blocks of 8 KiB to 64 KiB start in many
 * distinct L1 sets, not a multiple of 4 KiB apart (the skew), and
 * page-aligned ones of those sizes still share pages (the twins).
 */
#define _GNU_SOURCE
#include "coralloc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"
/* single-threaded: TSan need not watch the pattern loops */
#define CORAL_TEST_UNINSTRUMENTED_PATTERNS 1
#include "testutil.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static size_t page;
/* Read through volatile so that no constant size reaches the compiler. */
static volatile size_t v_size_max = SIZE_MAX;

#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- helpers ------------------------------------------------------------ */

typedef struct {
    uintptr_t start, end;
} range;

static int range_cmp(const void *a, const void *b) {
    const range *x = (const range *)a, *y = (const range *)b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* No two of the n blocks [start, end) share a byte. */
static void check_no_overlap(range *r, size_t n) {
    qsort(r, n, sizeof *r, range_cmp);
    for (size_t i = 1; i < n; i++)
        CHECK_MSG(r[i - 1].end <= r[i].start, "blocks [%#jx, %#jx) and [%#jx, %#jx) overlap\n",
                  (uintmax_t)r[i - 1].start, (uintmax_t)r[i - 1].end, (uintmax_t)r[i].start,
                  (uintmax_t)r[i].end);
}

/* Checks a fresh block of at least req bytes: not NULL, aligned, owned,
 * usable size >= req and every usable byte writable and readable back.
 * Leaves the pattern of seed in all usable bytes; returns the usable size. */
static size_t check_fresh(void *p, size_t req, size_t align, uint64_t seed) {
    CHECK_MSG(p != NULL, "allocation of %zu bytes (alignment %zu) failed: %s\n", req, align,
              strerror(errno));
    p = opaque(p);
    CHECK_ALIGNED(p, MAX(align, (size_t)16));
    CHECK_MSG(coral_owns(p), "coral_owns(%p) is false for a block of %zu\n", p, req);
    size_t us = coral_malloc_usable_size(p);
    CHECK_MSG(us >= req, "usable size %zu < requested %zu (alignment %zu)\n", us, req, align);
    fill_pattern(p, us, seed);
    CHECK_PATTERN(p, us, seed);
    return us;
}

#define EXPECT_ENOMEM(expr)                                                                        \
    do {                                                                                           \
        errno = 0;                                                                                 \
        void *r_ = (expr);                                                                         \
        int e_ = errno;                                                                            \
        CHECK_MSG(r_ == NULL, "%s returned %p, not NULL\n", #expr, r_);                            \
        CHECK_MSG(e_ == ENOMEM, "%s: errno is %d (%s), not ENOMEM\n", #expr, e_, strerror(e_));    \
    } while (0)

#define EXPECT_EINVAL(expr)                                                                        \
    do {                                                                                           \
        errno = 0;                                                                                 \
        void *r_ = (expr);                                                                         \
        int e_ = errno;                                                                            \
        CHECK_MSG(r_ == NULL, "%s returned %p, not NULL\n", #expr, r_);                            \
        CHECK_MSG(e_ == EINVAL, "%s: errno is %d (%s), not EINVAL\n", #expr, e_, strerror(e_));    \
    } while (0)

/* ---- malloc ------------------------------------------------------------- */

static void test_malloc_sizes(void) {
    static size_t sizes[4097 + 12 * 8];
    size_t n = 0;
    for (size_t s = 0; s <= 4096; s++) sizes[n++] = s;
    for (int k = 12; k <= 23; k++) { /* 4 KiB .. 8 MiB and around */
        size_t b = (size_t)1 << k;
        size_t around[] = {b - 1,     b,         b + 1,         b + 16,
                           b + b / 4, b + b / 2, b + 3 * b / 4, 2 * b - 16};
        for (size_t j = 0; j < sizeof around / sizeof *around; j++) sizes[n++] = around[j];
    }

    CHECK_EQ(coral_malloc_usable_size(NULL), 0);
    coral_free(NULL);

    for (size_t i = 0; i < n; i++) {
        size_t s = sizes[i];
        void *p[3];
        range r[3];
        for (int j = 0; j < 3; j++) {
            p[j] = coral_malloc(s);
            size_t us = check_fresh(p[j], s, 16, i * 3 + j);
            r[j].start = (uintptr_t)p[j];
            r[j].end = (uintptr_t)p[j] + MAX(us, (size_t)1);
        }
        check_no_overlap(r, 3);
        for (int j = 0; j < 3; j++) CHECK_PATTERN(p[j], coral_malloc_usable_size(p[j]), i * 3 + j);
        coral_free(p[1]);
        coral_free_sized(p[0], s);
        coral_free(p[2]);
    }
}

static void test_malloc_zero(void) {
    enum { N = 1000 };
    static void *p[N];
    static range r[N];
    for (int i = 0; i < N; i++) {
        p[i] = coral_malloc(0);
        CHECK_NOT_NULL(p[i]);
        size_t us = check_fresh(p[i], 0, 16, (uint64_t)i);
        r[i].start = (uintptr_t)p[i];
        r[i].end = (uintptr_t)p[i] + MAX(us, (size_t)1);
    }
    check_no_overlap(r, N); /* also: all distinct */
    for (int i = 0; i < N; i++) {
        CHECK_PATTERN(p[i], coral_malloc_usable_size(p[i]), (uint64_t)i);
        coral_free(p[i]);
    }
}

/* ---- calloc ------------------------------------------------------------- */

/* iters rounds of: batch blocks malloc'ed and dirtied with 0xAA, freed, then
 * batch calloc'ed blocks of the same size checked zero, dirtied, freed. */
static void calloc_round(size_t size, int iters, int batch, int collect) {
    void *b[64];
    CHECK_LE(batch, 64);
    for (int it = 0; it < iters; it++) {
        for (int j = 0; j < batch; j++) {
            b[j] = coral_malloc(size);
            CHECK_NOT_NULL(b[j]);
            fill_bytes(b[j], 0xAA, coral_malloc_usable_size(b[j]));
            b[j] = opaque(b[j]);
        }
        for (int j = 0; j < batch; j++) coral_free(b[j]);
        if (collect) coral_collect(1);
        for (int j = 0; j < batch; j++) {
            int v = (it + j) % 3;
            if (v == 0)
                b[j] = coral_calloc(1, size);
            else if (v == 1 || size % 8 != 0)
                b[j] = coral_calloc(size, 1);
            else
                b[j] = coral_calloc(size / 8, 8);
            CHECK_MSG(b[j] != NULL, "calloc of %zu failed\n", size);
            CHECK_ALIGNED(b[j], 16);
            CHECK_BYTES(b[j], size, 0);
        }
        for (int j = 0; j < batch; j++) {
            fill_bytes(b[j], 0xAA, coral_malloc_usable_size(b[j]));
            coral_free(opaque(b[j]));
        }
    }
}

static void test_calloc(void) {
    static const size_t small[] = {1, 8, 16, 24, 48, 100, 256, 1000, 4000, 16000};
    static const size_t medium[] = {64 * KiB, 100 * KiB, 200 * KiB, 500 * KiB};
    static const size_t large[] = {1 * MiB, 2 * MiB, 3 * MiB};
    static const size_t huge[] = {8 * MiB, 20 * MiB, 64 * MiB};
    for (size_t i = 0; i < sizeof small / sizeof *small; i++) calloc_round(small[i], 200, 64, 0);
    for (size_t i = 0; i < sizeof medium / sizeof *medium; i++) calloc_round(medium[i], 50, 8, 0);
    for (size_t i = 0; i < sizeof large / sizeof *large; i++) calloc_round(large[i], 20, 4, 0);
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++)
        calloc_round(huge[i], 5, huge[i] > 32 * MiB ? 1 : 2, 0);

    /* The same after coral_collect: memory purged (MADV_FREE/DONTNEED) and
     * reused must still be zero for calloc. */
    calloc_round(48, 5, 64, 1);
    calloc_round(100 * KiB, 5, 8, 1);
    calloc_round(2 * MiB, 5, 4, 1);
    calloc_round(20 * MiB, 3, 2, 1);

    /* A huge block dirtied through realloc growth, freed, then calloc'ed. */
    for (int it = 0; it < 4; it++) {
        void *p = coral_malloc(6 * MiB);
        CHECK_NOT_NULL(p);
        fill_bytes(p, 0xAA, 6 * MiB);
        p = coral_realloc(p, 24 * MiB);
        CHECK_NOT_NULL(p);
        fill_bytes(p, 0xAA, 24 * MiB);
        p = coral_realloc(p, 10 * MiB);
        CHECK_NOT_NULL(p);
        coral_free(opaque(p));
        p = coral_calloc(24 * MiB, 1);
        CHECK_NOT_NULL(p);
        CHECK_BYTES(p, 24 * MiB, 0);
        coral_free(p);
    }

    /* Zero-sized calloc: a unique freeable pointer. */
    void *a = coral_calloc(0, 100), *b = coral_calloc(100, 0), *c = coral_calloc(0, 0),
         *d = coral_calloc(0, v_size_max);
    CHECK_NOT_NULL(a);
    CHECK_NOT_NULL(b);
    CHECK_NOT_NULL(c);
    CHECK_NOT_NULL(d);
    CHECK(opaque(a) != opaque(b) && a != c && b != c && d != a && d != b && d != c);
    coral_free(a);
    coral_free(b);
    coral_free(c);
    coral_free(d);
}

/* ---- overflow ----------------------------------------------------------- */

static void test_overflow(void) {
    size_t max = v_size_max;
    size_t half = max / 2 + 1; /* 2^63 */
    size_t big = (size_t)1 << 40;
    size_t pmax = (size_t)PTRDIFF_MAX;

    EXPECT_ENOMEM(coral_calloc(half, 2));
    EXPECT_ENOMEM(coral_calloc(2, half));
    EXPECT_ENOMEM(coral_calloc(big, big));
    EXPECT_ENOMEM(coral_calloc(max, max));
    EXPECT_ENOMEM(coral_calloc(pmax / 8 + 1, 8));
    EXPECT_ENOMEM(coral_malloc(pmax + 1));
    EXPECT_ENOMEM(coral_malloc(pmax));
    EXPECT_ENOMEM(coral_malloc(max));
    EXPECT_ENOMEM(coral_malloc(max - 15)); /* rounding up must not wrap */
    EXPECT_ENOMEM(coral_malloc(max - page));
    EXPECT_ENOMEM(coral_realloc(NULL, max));
    EXPECT_ENOMEM(coral_realloc(NULL, pmax + 1));
    EXPECT_ENOMEM(coral_reallocarray(NULL, half, 2));
    EXPECT_ENOMEM(coral_reallocarray(NULL, big, big));
    EXPECT_ENOMEM(coral_aligned_alloc(16, max));
    EXPECT_ENOMEM(coral_aligned_alloc(4096, max - 4095));
    EXPECT_ENOMEM(coral_aligned_alloc(4 * MiB, max - MiB));
    EXPECT_ENOMEM(coral_aligned_alloc((size_t)1 << 62, 16));
    EXPECT_ENOMEM(coral_memalign(MiB, max - MiB / 2));
    EXPECT_ENOMEM(coral_memalign(64, pmax + 1));
    EXPECT_ENOMEM(coral_valloc(max));
    EXPECT_ENOMEM(coral_valloc(max - page + 2));
    EXPECT_ENOMEM(coral_pvalloc(max)); /* rounding to a page must not wrap */
    EXPECT_ENOMEM(coral_pvalloc(max - page + 2));

    void *sentinel = (void *)&sentinel, *out = sentinel;
    errno = 0;
    CHECK_EQ(coral_posix_memalign(&out, 64, max), ENOMEM);
    CHECK(out == sentinel);
    CHECK_EQ(errno, ENOMEM); /* as glibc's */
    CHECK_EQ(coral_posix_memalign(&out, 4096, max - 100), ENOMEM);
    CHECK(out == sentinel);
    CHECK_EQ(coral_posix_memalign(&out, (size_t)1 << 62, 1), ENOMEM);
    CHECK(out == sentinel);
    CHECK_EQ(coral_posix_memalign(&out, half, 1), ENOMEM);
    CHECK(out == sentinel);

    CHECK_EQ(coral_good_size(max), 0);
    CHECK_EQ(coral_good_size(pmax + 1), 0);

    /* A failed realloc/reallocarray leaves the block as it was, in every
     * size range. */
    static const size_t sizes[] = {0, 100, 5000, 100 * KiB, 2 * MiB, 20 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        void *p = coral_malloc(sizes[i]);
        size_t us = check_fresh(p, sizes[i], 16, 77 + i);
        EXPECT_ENOMEM(coral_realloc(p, max));
        EXPECT_ENOMEM(coral_realloc(p, pmax + 1));
        EXPECT_ENOMEM(coral_realloc(p, max - 15));
        EXPECT_ENOMEM(coral_reallocarray(p, half, 2));
        EXPECT_ENOMEM(coral_reallocarray(p, big, big));
        CHECK(coral_owns(p));
        CHECK_EQ(coral_malloc_usable_size(p), us);
        CHECK_PATTERN(p, us, 77 + i);
        /* and it is still a normal block */
        p = coral_realloc(p, sizes[i] + 1000);
        CHECK_NOT_NULL(p);
        CHECK_PATTERN(p, sizes[i], 77 + i);
        coral_free(p);
    }
}

/* ---- realloc ------------------------------------------------------------ */

/* realloc *p from old to new bytes (both requested sizes), check that the
 * first min(old, new) bytes kept the pattern of seed, refill with seed2. */
static void *realloc_checked(void *p, size_t old, size_t nsize, uint64_t seed, uint64_t seed2) {
    void *q = coral_realloc(p, nsize);
    CHECK_MSG(q != NULL, "realloc %zu -> %zu failed\n", old, nsize);
    CHECK_ALIGNED(q, 16);
    CHECK(coral_owns(q));
    CHECK_GE(coral_malloc_usable_size(q), nsize);
    size_t keep = MIN(old, nsize);
    size_t off = pattern_mismatch(q, keep, seed);
    CHECK_MSG(off == (size_t)-1, "realloc %zu -> %zu lost the content at offset %zu\n", old, nsize,
              off);
    fill_pattern(q, nsize, seed2);
    return q;
}

static void test_realloc(void) {
    /* NULL acts as malloc. */
    void *p = coral_realloc(NULL, 100);
    check_fresh(p, 100, 16, 5);
    coral_free(p);
    p = coral_realloc(NULL, 0);
    CHECK_NOT_NULL(p);
    coral_free(p);

    /* Up and down the size ranges, then the big jumps. */
    static const size_t ladder[] = {1,       8,        24,        100,       1000,
                                    5000,    40000,    100 * KiB, 600 * KiB, 1536 * KiB,
                                    3 * MiB, 12 * MiB, 40 * MiB};
    enum { L = sizeof ladder / sizeof *ladder };
    size_t order[4 * L + 8], n = 0;
    for (int i = 0; i < L; i++) order[n++] = ladder[i];
    for (int i = L - 2; i >= 0; i--) order[n++] = ladder[i];
    order[n++] = 40 * MiB; /* tiny -> huge -> tiny */
    order[n++] = 3;
    order[n++] = 3 * MiB;
    order[n++] = 100 * KiB;
    order[n++] = 12 * MiB;
    order[n++] = 5000;
    order[n++] = 600 * KiB;
    order[n++] = 16;
    for (int i = 0; i < L; i++) /* small steps within a range */
        order[n++] = ladder[i] + ladder[i] / 8 + 1;

    uint64_t seed = 1000;
    size_t cur = order[0];
    p = coral_malloc(cur);
    check_fresh(p, cur, 16, seed);
    for (size_t i = 1; i < n; i++) {
        p = realloc_checked(p, cur, order[i], seed, seed + 1);
        seed++;
        cur = order[i];
        /* same size, one byte less, one byte more */
        p = realloc_checked(p, cur, cur, seed, seed + 1);
        seed++;
        if (cur > 1) {
            p = realloc_checked(p, cur, cur - 1, seed, seed + 1);
            seed++;
            p = realloc_checked(p, cur - 1, cur, seed, seed + 1);
            seed++;
        }
    }
    coral_free(p);

    /* Random realloc sequences on 8 interleaved blocks. */
    tu_rng rng = {42};
    void *blk[8];
    size_t sz[8];
    uint64_t sd[8];
    for (int j = 0; j < 8; j++) {
        sz[j] = rng_range(&rng, 0, 64);
        sd[j] = 5000 + (uint64_t)j;
        blk[j] = coral_malloc(sz[j]);
        check_fresh(blk[j], sz[j], 16, sd[j]);
    }
    for (int step = 0; step < 4000; step++) {
        int j = (int)rng_range(&rng, 0, 7);
        size_t ns;
        int kind = (int)rng_range(&rng, 0, 99);
        if (kind < 60)
            ns = rng_range(&rng, 0, (size_t)1 << rng_range(&rng, 0, 14));
        else if (kind < 90)
            ns = sz[j] + rng_range(&rng, 0, 64) - MIN(sz[j], (size_t)32);
        else if (kind < 98)
            ns = rng_range(&rng, 16 * KiB, 1 * MiB);
        else
            ns = rng_range(&rng, 1 * MiB, 6 * MiB);
        if (ns == 0) /* realloc(p, 0) frees: tested below */
            ns = 1;
        blk[j] = realloc_checked(blk[j], sz[j], ns, sd[j], sd[j] + 100);
        sd[j] += 100;
        sz[j] = ns;
    }
    for (int j = 0; j < 8; j++) {
        CHECK_PATTERN(blk[j], sz[j], sd[j]);
        coral_free(blk[j]);
    }

    /* An aligned block and a malloc(0) block realloc like any other. */
    p = coral_aligned_alloc(4096, 5000);
    check_fresh(p, 5000, 4096, 9);
    p = realloc_checked(p, 5000, 100000, 9, 10);
    p = realloc_checked(p, 100000, 50, 10, 11);
    coral_free(p);
    p = coral_malloc(0);
    CHECK_NOT_NULL(p);
    p = realloc_checked(p, 0, 100, 0, 12);
    coral_free(p);

    /* reallocarray without overflow. */
    p = coral_reallocarray(NULL, 10, 100);
    check_fresh(p, 1000, 16, 13);
    p = coral_reallocarray(p, 1000, 100);
    CHECK_NOT_NULL(p);
    CHECK_GE(coral_malloc_usable_size(p), 100000);
    CHECK_PATTERN(p, 1000, 13);
    coral_free(p);

    /* realloc(p, 0) frees p and returns NULL (the glibc behaviour, which
     * coralloc keeps), in every size range. */
    static const size_t zs[] = {1, 100, 5000, 100 * KiB, 2 * MiB, 20 * MiB};
    for (size_t i = 0; i < sizeof zs / sizeof *zs; i++) {
        p = coral_malloc(zs[i]);
        check_fresh(p, zs[i], 16, i);
        void *q = coral_realloc(p, 0);
        CHECK_MSG(q == NULL, "realloc(%zu-byte block, 0) returned %p, not NULL\n", zs[i], q);
    }
    p = coral_malloc(0);
    CHECK_NOT_NULL(p);
    CHECK_NULL(coral_realloc(p, 0));
}

/* ---- aligned allocation ------------------------------------------------- */

static void *alloc_aligned_by(int how, size_t al, size_t size) {
    void *p = NULL;
    switch (how % 3) {
    case 0: {
        void *sentinel = &p;
        p = sentinel;
        int r = coral_posix_memalign(&p, al, size);
        CHECK_MSG(r == 0, "posix_memalign(%zu, %zu) = %d\n", al, size, r);
        CHECK(p != sentinel);
        break;
    }
    case 1:
        p = coral_aligned_alloc(al, size);
        break;
    default:
        p = coral_memalign(al, size);
        break;
    }
    CHECK_MSG(p != NULL, "aligned allocation (api %d) of %zu at %zu failed\n", how % 3, size, al);
    return p;
}

static void test_aligned(void) {
    uint64_t seed = 1;
    for (size_t al = sizeof(void *); al <= 16 * MiB; al <<= 1) {
        size_t sizes[9], ns = 0;
        sizes[ns++] = 1;
        sizes[ns++] = 10 * KiB; /* a skewed class (8 KiB to 64 KiB) */
        if (al >= MiB) {
            sizes[ns++] = 4096;
            sizes[ns++] = al;
            sizes[ns++] = al + 1;
        } else {
            sizes[ns++] = 24;
            sizes[ns++] = 100;
            sizes[ns++] = al - 1;
            sizes[ns++] = al;
            sizes[ns++] = al + 1;
            sizes[ns++] = 3 * al;
            sizes[ns++] = 3 * al + 5;
        }
        int keep = al >= MiB ? 2 : 4;
        for (size_t i = 0; i < ns; i++) {
            void *p[4];
            range r[4];
            for (int j = 0; j < keep; j++) {
                p[j] = alloc_aligned_by((int)(i + (size_t)j), al, sizes[i]);
                size_t us = check_fresh(p[j], sizes[i], al, seed + (uint64_t)j);
                r[j].start = (uintptr_t)p[j];
                r[j].end = (uintptr_t)p[j] + MAX(us, (size_t)1);
            }
            check_no_overlap(r, (size_t)keep);
            for (int j = 0; j < keep; j++) {
                CHECK_PATTERN(p[j], coral_malloc_usable_size(p[j]), seed + (uint64_t)j);
                if (j % 2)
                    coral_free_aligned_sized(p[j], al, sizes[i]);
                else
                    coral_free(p[j]);
            }
            seed += 4;
        }
    }

    /* Small power-of-two alignments are valid for aligned_alloc/memalign. */
    for (size_t al = 1; al <= 8; al <<= 1) {
        void *a = coral_aligned_alloc(al, 40), *m = coral_memalign(al, 40);
        check_fresh(a, 40, 16, 1);
        check_fresh(m, 40, 16, 2);
        coral_free(a);
        coral_free(m);
    }

    /* Bad alignments: EINVAL, *out untouched. */
    static const size_t bad_pm[] = {
        0, 1, 2, 3, 4, 12, 24, 48, 100, 4095, 4097, 3 * MiB, ((size_t)1 << 63) + 8};
    for (size_t i = 0; i < sizeof bad_pm / sizeof *bad_pm; i++) {
        void *sentinel = (void *)&sentinel, *out = sentinel;
        int r = coral_posix_memalign(&out, bad_pm[i], 64);
        CHECK_MSG(r == EINVAL, "posix_memalign(alignment %zu) = %d, not EINVAL\n", bad_pm[i], r);
        CHECK_MSG(out == sentinel, "posix_memalign(alignment %zu) wrote *out\n", bad_pm[i]);
    }
    static const size_t bad[] = {0, 3, 24, 48, 100, 4097, 3 * MiB};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t al = bad[i];
        EXPECT_EINVAL(coral_aligned_alloc(al, 64));
        EXPECT_EINVAL(coral_memalign(al, 64));
    }

    /* valloc: page aligned. */
    static const size_t vs[] = {1, 100, 4095, 4096, 4097, 100000, 3 * MiB};
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++) {
        void *p = coral_valloc(vs[i]);
        check_fresh(p, vs[i], page, i);
        coral_free(p);
    }
    /* pvalloc: page aligned, usable size rounded up to whole pages. */
    static const size_t ps[] = {0, 1, 4095, 4096, 4097, 10000, 100000, 3 * MiB + 1};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        size_t want = ps[i] ? (ps[i] + page - 1) / page * page : page;
        void *p = coral_pvalloc(ps[i]);
        size_t us = check_fresh(p, want, page, i);
        CHECK_GE(us, want);
        coral_free(p);
    }
}

static void test_huge_aligned(void) {
    struct {
        int how;
        size_t al, size;
    } cases[] = {
        {0, 4 * MiB, 20 * MiB}, {1, 16 * MiB, 40 * MiB}, {2, 8 * MiB, 9 * MiB},
        {0, 2 * MiB, 2 * MiB},  {1, 4 * MiB, 4 * MiB},   {2, 16 * MiB, 1},
        {0, 1 * MiB, 33 * MiB}, {1, 64 * KiB, 12 * MiB},
    };
    enum { N = sizeof cases / sizeof *cases };
    void *p[N];
    range r[N];
    for (int i = 0; i < N; i++) {
        p[i] = alloc_aligned_by(cases[i].how, cases[i].al, cases[i].size);
        size_t us = check_fresh(p[i], cases[i].size, cases[i].al, 300 + i);
        r[i].start = (uintptr_t)p[i];
        r[i].end = (uintptr_t)p[i] + us;
    }
    check_no_overlap(r, N);
    for (int i = 0; i < N; i++) {
        CHECK_PATTERN(p[i], coral_malloc_usable_size(p[i]), 300 + i);
        coral_free(p[i]);
    }
}

/* coral_aligned_calloc: zero at every alignment from 1 to 16 MiB, also on
 * memory a dirtied block of the same request just gave back; the argument
 * checks of aligned_alloc and the overflow check of calloc. */
static void test_aligned_calloc(void) {
    for (size_t al = 1; al <= 16 * MiB; al <<= 1) {
        const size_t sizes[] = {1, al, 3 * al + 5, 100 * KiB};
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            size_t size = sizes[i];
            void *dirty = coral_aligned_alloc(al, size);
            check_fresh(dirty, size, al, 77); /* every usable byte written */
            coral_free(dirty);
            unsigned char *p = coral_aligned_calloc(al, 1, size);
            CHECK_MSG(p != NULL, "aligned_calloc(%zu, 1, %zu) failed\n", al, size);
            CHECK_ALIGNED(p, MAX(al, (size_t)16));
            for (size_t b = 0; b < size; b++)
                CHECK_MSG(p[b] == 0, "aligned_calloc(%zu, 1, %zu): byte %zu is %d\n", al, size, b,
                          p[b]);
            coral_free_aligned_sized(p, al, size);
        }
    }
    void *p = coral_aligned_calloc(64, 0, 0); /* a unique freeable pointer, like calloc's */
    CHECK_NOT_NULL(p);
    coral_free(p);
    size_t half = v_size_max / 2 + 1; /* 2^63 */
    EXPECT_ENOMEM(coral_aligned_calloc(64, half, 2));
    EXPECT_ENOMEM(coral_aligned_calloc(64, v_size_max, v_size_max));
    static const size_t bad[] = {0, 3, 24, 48, 100, 4097, 3 * MiB};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        EXPECT_EINVAL(coral_aligned_calloc(bad[i], 1, 64));
}

#if defined(CORAL_TEST_RELEASE) && !defined(CORAL_TEST_CROSS)
/* A 1 GiB zeroed block aligned to 32 costs what calloc's costs: fresh
 * memory is not written, so the resident set grows by far less than the
 * block (writing it would add 1 GiB). In a child process of its own: after
 * the tests above wrote big blocks, the populate policy (os/populate.c)
 * rightly faults in the next big block at once, for calloc too. (Release
 * build only: the sanitizers' shadow memory would blur the figure; not
 * cross-built: under qemu-user the child, a re-exec of the test, cannot
 * run.) */
static void child_aligned_calloc_rss(void) {
    size_t rss0 = rss_kib();
    unsigned char *p = coral_aligned_calloc(32, 1, 1024 * MiB);
    CHECK_NOT_NULL(p);
    size_t grown_mib = (rss_kib() - MIN(rss0, rss_kib())) / 1024;
    CHECK_MSG(grown_mib < 64, "a 1 GiB aligned_calloc added %zu MiB of RSS\n", grown_mib);
    for (size_t b = 0; b < 1024 * MiB; b += 4 * KiB) CHECK_EQ(p[b], 0);
    coral_free(p);
}

static void test_aligned_calloc_stays_out_of_rss(void) {
    static const char *const no_env[] = {NULL};
    run_child("aligned_calloc_rss", no_env);
}
#endif

/* ---- sized free, good size ---------------------------------------------- */

static void test_sized_and_good_size(void) {
    size_t s = 0;
    tu_rng rng = {7};
    for (int i = 0;; i++) {
        if (s <= 2048)
            s++;
        else
            s = s + s / 8 + rng_range(&rng, 0, 15);
        if (s > 64 * MiB) break;
        size_t g = coral_good_size(s);
        CHECK_GE(g, s);
        void *p = coral_malloc(s);
        CHECK_NOT_NULL(p);
        CHECK_MSG(coral_malloc_usable_size(p) == g,
                  "good_size(%zu) = %zu but malloc(%zu) has usable size %zu\n", s, g, s,
                  coral_malloc_usable_size(p));
        fill_bytes(p, (unsigned char)i, s);
        if (i % 2)
            coral_free_sized(opaque(p), s);
        else
            coral_free(opaque(p));
    }
    size_t g0 = coral_good_size(0);
    void *z = coral_malloc(0);
    CHECK_NOT_NULL(z);
    CHECK_EQ(coral_malloc_usable_size(z), g0);
    coral_free_sized(z, 0);

    /* Sized frees of blocks of every origin. */
    for (int i = 0; i < 2000; i++) {
        size_t n = rng_range(&rng, 0, (size_t)1 << rng_range(&rng, 0, 20));
        void *p;
        switch (i % 4) {
        case 0:
            p = coral_malloc(n);
            break;
        case 1:
            p = coral_calloc(1, n);
            break;
        case 2:
            /* (realloc to 0 would free: asked for 1 byte then) */
            p = coral_realloc(coral_malloc(n / 2 + 1), n ? n : 1);
            break;
        default:
            p = coral_reallocarray(NULL, 1, n);
            break;
        }
        check_fresh(p, n, 16, (uint64_t)i);
        coral_free_sized(p, n);
    }
    for (size_t al = 16; al <= 4 * MiB; al <<= 1) {
        size_t n = rng_range(&rng, 1, 3 * al);
        void *p = coral_aligned_alloc(al, n);
        check_fresh(p, n, al, al);
        coral_free_aligned_sized(p, al, n);
    }
    coral_free_sized(NULL, 0);
    coral_free_aligned_sized(NULL, 64, 0);
}

/* ---- coral_owns --------------------------------------------------------- */

static int static_var;

static void test_owns(void) {
    int local = 1;
    CHECK(!coral_owns(NULL));
    CHECK(!coral_owns(&local));
    CHECK(!coral_owns(&static_var));
    CHECK(!coral_owns("a string literal"));
    CHECK(!coral_owns((const void *)(uintptr_t)&test_owns));

    /* memory of the C library's malloc (glibc, or the sanitizer's) */
    void *g1 = malloc(64), *g2 = malloc(4 * MiB);
    CHECK_NOT_NULL(g1);
    CHECK_NOT_NULL(g2);
    CHECK(!coral_owns(opaque(g1)));
    CHECK(!coral_owns(opaque(g2)));
    CHECK(!coral_owns((char *)g2 + 2 * MiB));
    free(g1);
    free(g2);

    /* a mapping of our own, and the same range once unmapped */
    size_t len = 8 * MiB;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    m[0] = 1;
    CHECK(!coral_owns(m));
    CHECK(!coral_owns(m + 4 * MiB + 123));
    CHECK_EQ(munmap(m, len), 0);
    CHECK(!coral_owns(m + 4 * MiB));

    /* ours, start and interior, in every size range */
    static const size_t sizes[] = {1, 64, 3000, 100 * KiB, 2 * MiB, 30 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        char *p = coral_malloc(sizes[i]);
        size_t us = check_fresh(p, sizes[i], 16, i);
        CHECK_MSG(coral_owns(p + us / 2), "interior pointer of a %zu block\n", sizes[i]);
        CHECK_MSG(coral_owns(p + us - 1), "last byte of a %zu block\n", sizes[i]);
        coral_free(p);
    }
    void *a = coral_aligned_alloc(MiB, 3 * MiB);
    check_fresh(a, 3 * MiB, MiB, 1);
    coral_free(a);
}

/* ---- many live blocks of mixed sizes ------------------------------------ */

typedef struct {
    char *p;
    size_t size, usable;
    uint64_t seed;
} live_block;

static size_t mixed_size(tu_rng *r) {
    int k = (int)rng_range(r, 0, 9999);
    if (k < 7000) return rng_range(r, 0, 256);
    if (k < 9000) return rng_range(r, 257, 8 * KiB);
    if (k < 9975) return rng_range(r, 8 * KiB + 1, 128 * KiB);
    return rng_range(r, 128 * KiB + 1, 4 * MiB);
}

static void mixed_alloc(live_block *b, tu_rng *r, uint64_t seed) {
    size_t n = mixed_size(r);
    char *p;
    switch (rng_range(r, 0, 5)) {
    case 0:
        p = coral_calloc(1, n);
        CHECK_NOT_NULL(p);
        CHECK_BYTES(p, n, 0);
        break;
    case 1:
        p = coral_aligned_alloc((size_t)16 << rng_range(r, 0, 8), n);
        break;
    case 2:
        p = coral_realloc(coral_malloc(n / 3), n ? n : 1);
        break;
    default:
        p = coral_malloc(n);
        break;
    }
    b->p = p;
    b->size = n;
    b->seed = seed;
    b->usable = check_fresh(p, n, 16, seed);
}

static void check_all_live(live_block *b, size_t n) {
    range *r = coral_malloc(n * sizeof *r); /* the allocator under test */
    CHECK_NOT_NULL(r);
    for (size_t i = 0; i < n; i++) {
        CHECK_PATTERN(b[i].p, b[i].usable, b[i].seed);
        CHECK_EQ(coral_malloc_usable_size(b[i].p), b[i].usable);
        r[i].start = (uintptr_t)b[i].p;
        r[i].end = (uintptr_t)b[i].p + MAX(b[i].usable, (size_t)1);
    }
    check_no_overlap(r, n);
    coral_free(r);
}

static void shuffle(live_block *b, size_t n, tu_rng *r) {
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = rng_range(r, 0, i);
        live_block t = b[i];
        b[i] = b[j];
        b[j] = t;
    }
}

static void test_many_mixed(void) {
    enum { N = 20000 };
    tu_rng rng = {2024};
    live_block *b = calloc(N, sizeof *b);
    CHECK_NOT_NULL(b);
    uint64_t seed = 1;
    for (size_t i = 0; i < N; i++) mixed_alloc(&b[i], &rng, seed++);
    check_all_live(b, N);

    for (int round = 0; round < 3; round++) {
        shuffle(b, N, &rng);
        for (size_t i = 0; i < N / 2; i++) {
            CHECK_PATTERN(b[i].p, b[i].usable, b[i].seed);
            if (i % 2)
                coral_free_sized(b[i].p, b[i].size);
            else
                coral_free(b[i].p);
        }
        coral_collect(round == 1);
        check_all_live(b + N / 2, N - N / 2);
        for (size_t i = 0; i < N / 2; i++) mixed_alloc(&b[i], &rng, seed++);
        check_all_live(b, N);
    }
    shuffle(b, N, &rng);
    for (size_t i = 0; i < N; i++) {
        CHECK_PATTERN(b[i].p, b[i].usable, b[i].seed);
        coral_free(b[i].p);
    }
    free(b);
}

/* ---- coral_collect ------------------------------------------------------ */

static void test_collect(void) {
    coral_collect(0);
    coral_collect(1);
    enum { N = 64 };
    void *keep[N];
    size_t ks[N];
    tu_rng rng = {99};
    for (int i = 0; i < N; i++) {
        ks[i] = mixed_size(&rng);
        keep[i] = coral_malloc(ks[i]);
        check_fresh(keep[i], ks[i], 16, (uint64_t)i);
    }
    for (int round = 0; round < 20; round++) {
        /* churn around the kept blocks, then collect */
        void *tmp[256];
        for (int j = 0; j < 256; j++) {
            tmp[j] = coral_malloc(mixed_size(&rng));
            CHECK_NOT_NULL(tmp[j]);
        }
        for (int j = 0; j < 256; j++) coral_free(tmp[j]);
        coral_collect(round % 2);
        for (int i = 0; i < N; i++) {
            CHECK(coral_owns(keep[i]));
            CHECK_PATTERN(keep[i], coral_malloc_usable_size(keep[i]), (uint64_t)i);
        }
    }
    for (int i = 0; i < N; i++) coral_free(keep[i]);
    coral_collect(1);
    /* still usable after a full collect */
    void *p = coral_malloc(100);
    check_fresh(p, 100, 16, 1);
    coral_free(p);
    coral_collect(1);
}

/* ---- main --------------------------------------------------------------- */

#define RUN(test)                                                                                  \
    do {                                                                                           \
        double t0_ = now_seconds();                                                                \
        test();                                                                                    \
        printf("%-28s ok  %.2f s\n", #test, now_seconds() - t0_);                                  \
        fflush(stdout);                                                                            \
    } while (0)

/* Blocks of the skewed classes (page.h): 16 blocks of each start in at
 * least 8 distinct 64-byte lines modulo 4 KiB (the sets of a 32 KiB
 * 8-way L1), where blocks laid a multiple of 1 KiB apart would share 4. */
static void test_skewed_heads(void) {
    static const size_t sizes[] = {8 * KiB, 10 * KiB, 12 * KiB, 16 * KiB, 32 * KiB, 64 * KiB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        void *p[16];
        uint64_t sets = 0;
        for (size_t j = 0; j < 16; j++) {
            CHECK_NOT_NULL(p[j] = coral_malloc(sizes[i]));
            sets |= (uint64_t)1 << (((uintptr_t)p[j] >> 6) & 63);
        }
        CHECK_MSG(__builtin_popcountll(sets) >= 8,
                  "16 blocks of %zu bytes start in only %d L1 sets\n", sizes[i],
                  __builtin_popcountll(sets));
        for (size_t j = 0; j < 16; j++) coral_free(p[j]);
    }
}

/* Requests aligned to more than 128 bytes in the skewed range take the
 * classes' twins: blocks of the nominal size, packed in shared pages (16
 * page-aligned 8 KiB blocks lie in a few 64 KiB slices, not one each). */
static void test_aligned_twins(void) {
    static const size_t sizes[] = {8 * KiB, 16 * KiB, 24 * KiB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        void *p[16];
        uintptr_t slices[16];
        size_t distinct = 0;
        for (size_t j = 0; j < 16; j++) {
            CHECK_EQ(coral_posix_memalign(&p[j], 4096, sizes[i]), 0);
            check_fresh(p[j], sizes[i], 4096, j);
            uintptr_t s = (uintptr_t)p[j] >> 16;
            bool seen = false;
            for (size_t k = 0; k < distinct; k++) seen = seen || slices[k] == s;
            if (!seen) slices[distinct++] = s;
        }
        CHECK_MSG(distinct <= 8, "16 page-aligned blocks of %zu bytes lie in %zu slices\n",
                  sizes[i], distinct);
        for (size_t j = 0; j < 16; j++) coral_free(p[j]);
    }
}

int main(int argc, char **argv) {
#if defined(CORAL_TEST_RELEASE) && !defined(CORAL_TEST_CROSS)
    if (argc == 2 && strcmp(argv[1], "aligned_calloc_rss") == 0) {
        child_aligned_calloc_rss();
        return 0;
    }
#else
    (void)argc;
    (void)argv;
#endif
    long ps = sysconf(_SC_PAGESIZE);
    CHECK_GT(ps, 0);
    page = (size_t)ps;
    double t0 = now_seconds();
    coral_collect(1); /* before any allocation */
    RUN(test_malloc_sizes);
    RUN(test_malloc_zero);
    RUN(test_calloc);
    RUN(test_overflow);
    RUN(test_realloc);
    RUN(test_aligned);
    RUN(test_huge_aligned);
    RUN(test_aligned_calloc);
#if defined(CORAL_TEST_RELEASE) && !defined(CORAL_TEST_CROSS)
    RUN(test_aligned_calloc_stays_out_of_rss);
#endif
    RUN(test_sized_and_good_size);
    RUN(test_owns);
    RUN(test_collect);
    RUN(test_many_mixed);
    RUN(test_skewed_heads);
    RUN(test_aligned_twins);
    printf("test_api: all passed in %.2f s\n", now_seconds() - t0);
    return 0;
}
