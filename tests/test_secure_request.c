/* The secure build's request canary (src/page/page.h, docs/SECURITY.md "A
 * canary at the requested size"): where the checked byte lies, seen
 * through coral_malloc_usable_size, which reports the usable size less the
 * slack the canary word holds:
 *   - every request of 1 to 1016 bytes (malloc's fast path, classes up to
 *     1 KiB) and every calloc up to it: exactly the request;
 *   - requests of a class above 1 KiB: the request + 64 * k, the last
 *     such size within the class's usable size (the slack's low 6 bits
 *     alone: at most 63 bytes before the canary word);
 *   - large blocks: exactly the request;
 *   - realloc within a block: exactly the new request.
 * It fails without the request canary (the class's usable size) and when
 * a field loses a bit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"

int main(void) {
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
    for (size_t n = 1017; n <= 64 * 1024; n += 7) {
        void *p = coral_malloc(n);
        CHECK_NOT_NULL(p);
        size_t usable = coral_malloc_usable_size(p);
        CHECK_MSG(usable >= n && (usable - n) % 64 == 0 && coral_good_size(n) - usable <= 63,
                  "malloc(%zu): usable size %zu", n, usable);
        coral_free(p);
    }
    static const size_t large[] = {300000, 300001, 400007, 1000000};
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
