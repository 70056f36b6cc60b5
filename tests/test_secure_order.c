/* The secure build's order of fresh blocks (src/page/secure.c,
 * docs/SECURITY.md "Randomized fresh blocks"), against the coral_ API of
 * the secure build:
 *   - window:  the t-th block a fresh heap hands out (no frees between) is
 *              among the WINDOW lowest blocks of its page not handed out
 *              yet: its address rank is at most t + WINDOW - 1;
 *   - random:  the order is not the address order, each of the window's
 *              WINDOW places is drawn often, and two fresh heaps hand their
 *              blocks out in two different orders.
 * The random checks fail when the randomization is removed (blocks in
 * address order); the window check fails when it spreads wider.
 *   - page keys: the canaries (the word after a block's usable bytes) of
 *              blocks of distinct pages, the address folded out, differ in
 *              both halves: a page's key spans all 64 bits (issue 33: it
 *              was 32 bits, and the high halves were all equal). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"

#define WINDOW 4   /* CORAL_CARVE_WINDOW (src/page/page.h) */
#define BLOCKS 256 /* at most this many blocks of a page, fewer than it holds */

/* The n blocks of `size` bytes a fresh heap hands out first, in order:
 * their address ranks into rank[] (0 the lowest). */
static void fresh_ranks(size_t size, unsigned n, unsigned rank[BLOCKS]) {
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    uintptr_t addr[BLOCKS];
    for (unsigned t = 0; t < n; t++) {
        void *p = coral_heap_malloc(heap, size);
        CHECK_NOT_NULL(p);
        addr[t] = (uintptr_t)p;
    }
    for (unsigned t = 0; t < n; t++) {
        unsigned below = 0;
        for (unsigned u = 0; u < n; u++) below += addr[u] < addr[t];
        rank[t] = below;
    }
    /* One page, blocks packed: the highest is n - 1 strides above the
     * lowest, or up to WINDOW - 1 more (blocks left in the window). */
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (unsigned t = 0; t < n; t++) {
        if (addr[t] < lo) lo = addr[t];
        if (addr[t] > hi) hi = addr[t];
    }
    /* (usable size: the request; its class's usable bytes, + the canary) */
    size_t stride = coral_good_size(coral_malloc_usable_size((void *)addr[0])) + 8;
    CHECK_GE((size_t)(hi - lo), (size_t)(n - 1) * stride);
    CHECK_LE((size_t)(hi - lo), (size_t)(n - 1 + WINDOW - 1) * stride);
    CHECK_EQ((size_t)(hi - lo) % stride, (size_t)0);
    coral_heap_destroy(heap);
}

/* Where in the window each block was drawn from: its rank among the
 * blocks not handed out before it (0 the lowest of them). */
static void window_places(unsigned n, const unsigned rank[BLOCKS], unsigned place[BLOCKS]) {
    for (unsigned t = 0; t < n; t++) {
        unsigned lower_left = 0;
        for (unsigned u = t + 1; u < n; u++) lower_left += rank[u] < rank[t];
        place[t] = lower_left;
    }
}

/* How often each window place was drawn, over every size: checked once,
 * pooled (main), where a quarter of the expected count is far out in the
 * tail; for one size of few blocks (48 of 1000 bytes, carved in short
 * steps whose last draws have smaller windows) it is not. */
static unsigned seen[WINDOW], draws;

/* n blocks of size bytes. */
static void test_order(size_t size, unsigned n) {
    unsigned rank[BLOCKS] = {0}, place[BLOCKS];
    fresh_ranks(size, n, rank);
    window_places(n, rank, place);
    unsigned descents = 0;
    for (unsigned t = 0; t < n; t++) {
        CHECK_MSG(place[t] < WINDOW, "size %zu: block %u drawn from place %u of the window", size,
                  t, place[t]);
        CHECK_LE(rank[t], t + WINDOW - 1);
        seen[place[t]]++;
        if (t > 0 && rank[t] < rank[t - 1]) descents++;
    }
    draws += n;
    CHECK_MSG(descents > 0, "size %zu: blocks handed out in address order", size);
    unsigned again[BLOCKS] = {0};
    fresh_ranks(size, n, again);
    CHECK_MSG(memcmp(rank, again, sizeof rank) != 0, "size %zu: two heaps, the same order", size);
}

/* Bits 1-6 of each byte: what the page and the address change in a canary
 * (CORAL_CANARY_VARY, src/page/page.h). */
#define CANARY_VARY 0x7e7e7e7e7e7e7e7eull
#define PAGES 6

static void test_page_keys(void) {
    static const size_t sizes[PAGES] = {8, 40, 100, 300, 700, 2000}; /* six classes */
    uint64_t key[PAGES];
    for (int i = 0; i < PAGES; i++) {
        uint8_t *p = coral_malloc(sizes[i]);
        CHECK_NOT_NULL(p);
        uint64_t canary;
        /* The canary word, at the class's usable size (malloc_usable_size
         * says the request); its byte 0's bits 1-6 hold the slack: left out. */
        memcpy(&canary, p + coral_good_size(sizes[i]), sizeof canary);
        key[i] = (canary ^ ((uintptr_t)p & CANARY_VARY)) & ~(uint64_t)0x7e;
    }
    for (int i = 0; i < PAGES; i++)
        for (int k = 0; k < i; k++) {
            CHECK_MSG((uint32_t)(key[i] >> 32) != (uint32_t)(key[k] >> 32),
                      "pages %d and %d: the canaries' high halves share their key", k, i);
            CHECK_MSG((uint32_t)key[i] != (uint32_t)key[k],
                      "pages %d and %d: the canaries' low halves share their key", k, i);
        }
}

int main(void) {
    test_page_keys();
    /* Blocks of 16 to 208 bytes: a page (a 64 KiB slice) holds more than
     * BLOCKS; of 1 KiB, 64. */
    static const size_t sizes[] = {8, 24, 56, 120, 200};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) test_order(sizes[i], BLOCKS);
    test_order(1000, 48);
    /* About draws / WINDOW of each are expected (the last draws of a
     * carve step have a smaller window). */
    for (unsigned k = 0; k < WINDOW; k++)
        CHECK_MSG(seen[k] >= draws / WINDOW / 4, "window place %u drawn %u times in %u", k, seen[k],
                  draws);
    return 0;
}
