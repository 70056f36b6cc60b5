/* The free path's block-start test (src/page/page.h, "block starts and
 * freed marks"): for every size class, for large blocks, for every span a
 * page of them may have, and for the extreme draws of j, (n * M) mod 2^64
 * is below X = capacity * e exactly when n is the start of one of the
 * first `capacity` blocks. Every offset of the head slice (the one the free
 * fast path tests) is tried, one in 37 beyond it (the bulk free's offsets),
 * and every block start of the span. A pure function of the page layer's
 * header: no allocation. */
#include <stdio.h>
#include <stdlib.h>

#include "page/page.h"

static long configs, failures;

static void check_one(size_t d, uint32_t slices, uint32_t j, uint32_t capacity) {
    size_t span = (size_t)slices * CORAL_SLICE_SIZE;
    uint64_t mul = coral_block_start_mul_of(d, j);
    uint64_t x = (uint64_t)capacity * ((uint64_t)d * mul);
    configs++;
    for (size_t n = 0; n < span; n += n < CORAL_SLICE_SIZE ? 1 : 37) {
        bool want = n % d == 0 && n / d < capacity;
        if (coral_block_start_test(mul, x, n) != want && failures++ < 10)
            fprintf(stderr, "FAIL d=%zu slices=%u j=%u capacity=%u offset=%zu: %s\n", d, slices, j,
                    capacity, n, want ? "a block start refused" : "not a block start taken");
    }
    for (size_t k = 0; k * d < span; k++)
        if (coral_block_start_test(mul, x, k * d) != (k < capacity) && failures++ < 10)
            fprintf(stderr, "FAIL d=%zu slices=%u j=%u capacity=%u block %zu\n", d, slices, j,
                    capacity, k);
}

static void check_size(size_t d) {
    for (uint32_t slices = 1; slices <= CORAL_SLICES_PER_SEGMENT; slices++) {
        size_t span = (size_t)slices * CORAL_SLICE_SIZE;
        if (span < d || span / d > 4096) continue;
        uint32_t reserved = (uint32_t)(span / d);
        uint32_t draws[3] = {1, 1u << 16, 1 + (uint32_t)(rand() & 0xffff)};
        for (int i = 0; i < 3; i++) {
            check_one(d, slices, draws[i], reserved);
            check_one(d, slices, draws[i], reserved / 2);
            check_one(d, slices, draws[i], 1);
        }
        if (slices >= 4) slices += 3; /* (larger spans: a sample) */
    }
}

int main(void) {
    srand(33);
    for (unsigned cls = 1; cls < CORAL_CLASS_LARGE; cls++) check_size(coral_class_size(cls));
    for (size_t d = CORAL_CLASS_MAX_SIZE + 4096; d <= CORAL_LARGE_MAX_SIZE; d += 7 * 4096)
        check_size(d);
    printf("block starts: %ld configurations, %ld failures\n", configs, failures);
    return failures != 0;
}
