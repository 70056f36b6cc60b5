/* Huge blocks that realloc moves (mremap) keep their contents, also where
 * mremap behaves as on Linux before 6.17 (CORALLOC_OLD_MREMAP=1: a move
 * whose source spans several mappings unmaps the destination, then fails).
 * coralloc's own huge-page advice splits a huge block's mapping (a 5 MiB
 * block: the first 6 MiB of its 8 MiB advised), so its moves meet that
 * case. Prints the mremap calls made per move attempt; with the old
 * behaviour the fallback must have run (more calls than moves). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

static long long remap_calls(void) {
    static char json[16384];
    CHECK_GT(coral_stats_json(json, sizeof json), 0);
    const char *at = strstr(json, "\"mremap\"");
    CHECK_MSG(at != NULL, "no mremap count in the statistics");
    at = strstr(at, "\"calls\"");
    CHECK(at != NULL);
    return strtoll(at + strlen("\"calls\":"), NULL, 10);
}

int main(void) {
    const char *old = getenv("CORALLOC_OLD_MREMAP");
    int old_kernel = old != NULL && old[0] == '1';
    static const size_t sizes[] = {5 * MiB, 13 * MiB, 29 * MiB, 61 * MiB, 7 * MiB, 125 * MiB};
    long long calls_before = remap_calls();
    unsigned moves = 0;
    for (int round = 0; round < 4; round++) {
        char *p = coral_malloc(sizes[0]);
        CHECK(p != NULL);
        fill_pattern(p, sizes[0], round);
        size_t have = sizes[0];
        /* A block right after it keeps it from growing in place. */
        void *fence = coral_malloc(5 * MiB);
        for (size_t i = 1; i < sizeof sizes / sizeof *sizes; i++) {
            char *q = coral_realloc(p, sizes[i]);
            CHECK(q != NULL);
            if (q != p) moves++;
            size_t keep = have < sizes[i] ? have : sizes[i];
            CHECK_MSG(pattern_mismatch(q, keep, round) == (size_t)-1,
                      "round %d: %zu -> %zu MiB lost its contents", round, have / MiB,
                      sizes[i] / MiB);
            fill_pattern(q, sizes[i], round);
            have = sizes[i];
            p = q;
        }
        coral_free(fence);
        coral_free(p);
    }
    long long calls = remap_calls() - calls_before;
    printf("huge_move%s: %u moves, %lld mremap calls\n", old_kernel ? " (old mremap)" : "", moves,
           calls);
    CHECK_MSG(moves > 0, "no realloc moved a block: the test tests nothing");
    if (old_kernel) CHECK_MSG(calls > moves, "the old-kernel fallback never ran");
    return 0;
}
