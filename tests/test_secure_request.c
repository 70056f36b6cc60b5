/* The secure build's request canary (src/page/page.h, docs/SECURITY.md "A
 * canary at the requested size"): where the checked byte lies, seen
 * through coral_malloc_usable_size, which reports the usable size less the
 * slack the canary word holds:
 *   - every request of 1 to 1016 bytes (malloc's fast path, classes up to
 *     1 KiB) and every calloc up to it: exactly the request;
 *   - requests of a class above 1 KiB, with slacks up to 32 KiB (malloc's
 *     slow path writes every field of the slack): exactly the request
 *     (fails when it writes the low 6 bits alone: the request + 64 * k);
 *   - large and huge blocks: exactly the request;
 *   - realloc within a block: exactly the new request.
 * It fails without the request canary (the class's usable size) and when
 * a field loses a bit. And sized frees (free_sized, free_aligned_sized,
 * checked against the request: docs/SECURITY.md) pass with the request
 * and with what malloc_usable_size reports, for blocks of every origin;
 * an aligned block of a size class reports its request too (it reported
 * the size rounded up to the alignment). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"

/* Sized frees given the request, or malloc_usable_size's answer (every
 * other call: the same for an exact request), pass (a size the secure
 * build refused would abort). */
static void sized_frees(void) {
    for (size_t n = 1; n <= 70 * 1024; n += n < 2048 ? 1 : 61) {
        void *p = coral_malloc(n), *q = coral_calloc(3, n);
        CHECK_NOT_NULL(p);
        CHECK_NOT_NULL(q);
        coral_free_sized(p, n % 2 ? n : coral_malloc_usable_size(p));
        coral_free_sized(q, 3 * n);
    }
    for (size_t al = 32; al <= 1024 * 1024; al *= 2) {
        for (size_t n = 1; n < 3 * al; n += al / 3 + 7) {
            void *p = coral_aligned_alloc(al, n);
            CHECK_NOT_NULL(p);
            CHECK_MSG(coral_malloc_usable_size(p) == n, "aligned_alloc(%zu, %zu): usable size %zu",
                      al, n, coral_malloc_usable_size(p));
            coral_free_aligned_sized(p, al, n);
        }
    }
    /* realloc in place (shrunk, grown within the block, a large block
     * grown) and moved */
    static const size_t from[] = {3000, 100, 1000, 300000, 50, 5000000, 9000000, 300000};
    static const size_t to[] = {2000, 110, 30000, 400000, 600000, 5000001, 20000000, 7000000};
    for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
        void *p = coral_realloc(coral_malloc(from[i]), to[i]);
        CHECK_NOT_NULL(p);
        coral_free_sized(p, to[i]);
    }
    /* a shrink in place past the word's 4095 bytes of slack */
    void *p = coral_malloc(200 * 1024);
    CHECK_NOT_NULL(p);
    void *q = coral_realloc(p, 110 * 1024);
    CHECK_NOT_NULL(q);
    coral_free_sized(q, 110 * 1024);
}

/* One truth for sizes (coralloc.h): coral_good_size(n) is the usable
 * bytes coral_heap_visit reports of malloc(n)'s block, and at least the
 * request malloc_usable_size reports, in every size range (fails before:
 * a large block's good size was its span's, up to 60 KiB more than its
 * bytes before the guard page that follows its request). */
enum { SIZES = 120 };
static void *blocks[SIZES];
static size_t requests[SIZES];

static int note_usable(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block_size;
    for (int i = 0; i < SIZES; i++) {
        if (blocks[i] != block) continue;
        size_t g = coral_good_size(requests[i]);
        CHECK_MSG(usable == g && coral_malloc_usable_size(block) <= g,
                  "malloc(%zu): visit says usable %zu, good_size %zu, malloc_usable_size %zu",
                  requests[i], usable, g, coral_malloc_usable_size(block));
        ++*(int *)arg;
    }
    return 0;
}

static void good_sizes(void) {
    int n = 0;
    for (size_t size = 1; n < SIZES && size <= 40 * 1024 * 1024; size += size / 5 + 1, n++) {
        requests[n] = size;
        blocks[n] = coral_malloc(size);
        CHECK_NOT_NULL(blocks[n]);
    }
    int seen = 0;
    CHECK_EQ(coral_heap_visit(NULL, note_usable, &seen), 0);
    CHECK_EQ(seen, n);
    for (int i = 0; i < n; i++) coral_free(blocks[i]);
}

int main(void) {
    sized_frees();
    good_sizes();
    for (size_t n = 1; n <= 1016; n++) {
        void *p = coral_malloc(n), *q = coral_calloc(1, n);
        CHECK_NOT_NULL(p);
        CHECK_NOT_NULL(q);
        CHECK_MSG(coral_malloc_usable_size(p) == n, "malloc(%zu): usable size %zu", n,
                  coral_malloc_usable_size(p));
        CHECK_MSG(coral_malloc_usable_size(q) == n, "calloc(1, %zu): usable size %zu", n,
                  coral_malloc_usable_size(q));
        coral_free(p);
        coral_free(q);
    }
    for (size_t n = 1017; n <= 256 * 1024 - 9; n += n < 64 * 1024 ? 7 : 997) {
        void *p = coral_malloc(n);
        CHECK_NOT_NULL(p);
        CHECK_MSG(coral_malloc_usable_size(p) == n, "malloc(%zu): usable size %zu", n,
                  coral_malloc_usable_size(p));
        coral_free(p);
    }
    /* and huge blocks (their segment keeps the request) */
    static const size_t large[] = {300000, 300001, 400007, 1000000, 5000000, 8388608, 9000001};
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) {
        void *p = coral_malloc(large[i]);
        CHECK_NOT_NULL(p);
        CHECK_EQ(coral_malloc_usable_size(p), large[i]);
        coral_free(p);
    }
    /* realloc keeps the block (shrinking by less than half): both fields. */
    char *p = coral_malloc(3000);
    CHECK_NOT_NULL(p);
    char *q = coral_realloc(p, 2000);
    CHECK(q == p);
    CHECK_EQ(coral_malloc_usable_size(q), (size_t)2000);
    coral_free(q);
    return 0;
}
