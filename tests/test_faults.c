/* test_faults: a failing kernel call at every point of a run.
 *
 * A fixed sequence of public calls (small, many-sized, calloc'd, large,
 * huge and growing and shrinking huge blocks, an alignment above the
 * segment size, a bulk allocation, a user heap, coral_collect) makes T
 * kernel calls (mmap, munmap, madvise, mremap, mincore: every call the OS
 * layer makes, counted by coralloc's statistics). For every N in 1..T a
 * child runs the sequence with CORALLOC_FAIL_OS_AFTER=N: the Nth kernel
 * call fails as if the kernel had no memory. Every public call must then
 * either work or fail cleanly (NULL with errno ENOMEM; a failed realloc
 * leaves the old block as it was; a short bulk allocation sets ENOMEM),
 * every block given keeps its content, and the sequence must then run twice
 * more with no call failing: the allocator is usable after the failure.
 * That the nth call did fail is read from the statistics
 * (os_failures_injected): without it, a broken injection would pass. */
#define _GNU_SOURCE
#include "coralloc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "stats_json.h"

#define MiB ((size_t)1 << 20)

typedef struct run_s {
    int failures; /* public calls that failed (cleanly) */
} run_t;

static unsigned char pattern_of(const void *p) { return (unsigned char)((uintptr_t)p >> 4) | 1; }

static void fill(void *p, size_t n) { memset(p, pattern_of(p), n); }

static void verify(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i += 97) CHECK_EQ(b[i], pattern_of(p));
    CHECK_EQ(b[n - 1], pattern_of(p));
}

/* A block from an allocating call: filled, or NULL that must say ENOMEM. */
static void *took(run_t *run, void *p, size_t n) {
    if (p == NULL) {
        CHECK_EQ(errno, ENOMEM);
        run->failures++;
        return NULL;
    }
    fill(p, n);
    return p;
}

static void drop(void *p, size_t n) {
    if (p == NULL) return;
    verify(p, n);
    coral_free(p);
}

/* realloc of a filled block p of n bytes to m: the new block, filled; on a
 * clean failure the old one, untouched (*size stays n). */
static void *grow(run_t *run, void *p, size_t *size, size_t m) {
    if (p == NULL) return took(run, coral_malloc(m), *size = m);
    errno = 0;
    void *q = coral_realloc(p, m);
    if (q == NULL) {
        CHECK_EQ(errno, ENOMEM);
        run->failures++;
        verify(p, *size);
        return p;
    }
    size_t kept = *size < m ? *size : m;
    const unsigned char *b = q;
    for (size_t i = 0; i < kept; i += 4093) CHECK_EQ(b[i], pattern_of(p));
    *size = m;
    fill(q, m);
    return q;
}

static run_t sequence(void) {
    run_t run = {0};
    enum { SMALL = 3000, SIZES = 64, BULK = 500, LARGE = 6 };
    static void *small[SMALL], *sized[SIZES], *bulk[BULK], *large[LARGE];
    for (int i = 0; i < SMALL; i++) small[i] = took(&run, coral_malloc(48), 48);
    for (int i = 0; i < SIZES; i++)
        sized[i] = took(&run, coral_malloc((size_t)i * 1024 + 1), (size_t)i * 1024 + 1);
    void *zeroed = coral_calloc(1000, 100);
    if (zeroed != NULL)
        for (size_t i = 0; i < 100000; i += 999) CHECK_EQ(((unsigned char *)zeroed)[i], 0);
    zeroed = took(&run, zeroed, 100000);
    for (int i = 0; i < LARGE; i++)
        large[i] = took(&run, coral_malloc(2 * MiB - 128 * 1024), 2 * MiB - 128 * 1024);
    size_t big_size = MiB;
    void *big = grow(&run, NULL, &big_size, MiB);
    big = grow(&run, big, &big_size, (size_t)3 * MiB / 2); /* large, in place */
    size_t huge_size = 0;
    void *huge = grow(&run, NULL, &huge_size, 10 * MiB);
    huge = grow(&run, huge, &huge_size, 30 * MiB); /* grows: extend, move */
    huge = grow(&run, huge, &huge_size, 5 * MiB);  /* shrinks: unmaps */
    errno = 0;
    void *aligned = took(&run, coral_aligned_alloc(8 * MiB, 1000), 1000); /* maps aligned */
    errno = 0;
    size_t got = coral_malloc_bulk(64, BULK, bulk);
    if (got < BULK) {
        CHECK_EQ(errno, ENOMEM);
        run.failures++;
    }
    for (size_t i = 0; i < got; i++) fill(bulk[i], 64);
    errno = 0;
    coral_heap_t *heap = coral_heap_new();
    if (heap == NULL) {
        CHECK_EQ(errno, ENOMEM);
        run.failures++;
    } else {
        for (int i = 0; i < 100; i++) {
            errno = 0;
            took(&run, coral_heap_malloc(heap, 4000), 4000);
        }
        coral_heap_destroy(heap);
    }
    for (size_t i = 0; i < got; i++) verify(bulk[i], 64);
    coral_free_bulk(bulk, got);
    drop(aligned, 1000);
    drop(huge, huge_size);
    drop(big, big_size);
    for (int i = 0; i < LARGE; i++) drop(large[i], 2 * MiB - 128 * 1024);
    drop(zeroed, 100000);
    for (int i = 0; i < SIZES; i++) drop(sized[i], (size_t)i * 1024 + 1);
    for (int i = 0; i < SMALL; i++) drop(small[i], 48);
    coral_collect(1); /* purges: madvise */
    /* What the purges returned must read as zero when it is handed out
     * again as cleared memory. */
    for (size_t size = MiB; size <= 16 * MiB; size *= 4) {
        unsigned char *z = coral_calloc(1, size);
        if (z == NULL) {
            CHECK_EQ(errno, ENOMEM);
            run.failures++;
            continue;
        }
        for (size_t i = 0; i < size; i += 4093) CHECK_EQ(z[i], 0);
        fill(z, size);
        coral_free(z);
    }
    return run;
}

static long long os_calls_made(void) {
    static const char *const kinds[] = {"mmap",     "munmap",  "purge",    "mremap",    "populate",
                                        "hugepage", "mincore", "mprotect", "nohugepage"};
    long long total = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) total += stats_os_calls(kinds[i]);
    return total;
}

/* Whether the nth kernel call of this process failed, as asked: the
 * statistics count the failures injected, and the calls tried (each before
 * it is made, but an mmap only once made: an injected mmap failure is
 * missing from them). So after `tried` counted calls the failure must have
 * come if tried >= n, and cannot have come if tried + 1 < n. Returns
 * whether it came. */
static bool nth_call_failed(long long n) {
    long long tried = os_calls_made(), injected = stats_get("os_failures_injected");
    CHECK_MSG(injected <= 1, "CORALLOC_FAIL_OS_AFTER=%lld: %lld failures injected, not one\n", n,
              injected);
    if (injected == 0)
        CHECK_MSG(tried < n, "CORALLOC_FAIL_OS_AFTER=%lld: %lld kernel calls made, none failed\n",
                  n, tried);
    else
        CHECK_MSG(tried + 1 >= n, "CORALLOC_FAIL_OS_AFTER=%lld: a failure after %lld calls\n", n,
                  tried);
    return injected == 1;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "count") == 0) {
        CHECK_EQ(sequence().failures, 0);
        CHECK_EQ(stats_get("os_failures_injected"), 0);
        printf("%lld\n", os_calls_made());
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "inject") == 0) {
        long long n = 0;
        CHECK_EQ(coral_option_get("FAIL_OS_AFTER", &n), 0);
        CHECK_GT(n, 0);
        (void)sequence(); /* the nth call fails somewhere in here */
        /* Whether it did: a sequence makes a few calls more or fewer from
         * one process to the next (whether the kernel's first address for a
         * segment is aligned), so the last few n may come after it. */
        bool first = nth_call_failed(n);
        CHECK_EQ(sequence().failures, 0);
        CHECK_EQ(sequence().failures, 0);
        bool later = !first && nth_call_failed(n);
        printf("%s\n", first ? "first" : later ? "later" : "none");
        return 0;
    }
    /* T: the kernel calls of one sequence, from a child without failures. */
    char self[4096], command[4200];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK_GT(len, 0);
    self[len] = '\0';
    snprintf(command, sizeof command, "CORALLOC_PURGE_THREAD=0 '%s' count", self);
    FILE *f = popen(command, "r");
    CHECK_NOT_NULL(f);
    long long calls = 0;
    CHECK_EQ(fscanf(f, "%lld", &calls), 1);
    CHECK_EQ(pclose(f), 0);
    CHECK_GT(calls, 10);
    /* Each child says whether its nth call failed in its first sequence,
     * in a later one, or not at all (all three made fewer than n calls);
     * most must fail in the first (a sequence varies by a few calls, not
     * by half). */
    long long first = 0, later = 0;
    for (long long n = 1; n <= calls; n++) {
        snprintf(command, sizeof command,
                 "CORALLOC_PURGE_THREAD=0 CORALLOC_FAIL_OS_AFTER=%lld '%s' inject", n, self);
        f = popen(command, "r");
        CHECK_NOT_NULL(f);
        char said[16] = "";
        int got = fscanf(f, "%15s", said);
        CHECK_MSG(pclose(f) == 0, "CORALLOC_FAIL_OS_AFTER=%lld: the child failed\n", n);
        CHECK_EQ(got, 1);
        first += strcmp(said, "first") == 0;
        later += strcmp(said, "later") == 0;
        CHECK_MSG(strcmp(said, "first") == 0 || strcmp(said, "later") == 0 ||
                      strcmp(said, "none") == 0,
                  "child said %s\n", said);
    }
    CHECK_GT(first, calls / 2);
    printf("faults: for N in 1..%lld the Nth kernel call failed (the statistics counted the "
           "injected failure): in the first sequence for %lld N, in a later one for %lld, none "
           "made for %lld; every public call failed cleanly or worked, and the allocator went "
           "on\n",
           calls, first, later, calls - first - later);
    return 0;
}
