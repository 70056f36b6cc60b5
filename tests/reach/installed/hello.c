/* A C program built against an installed coralloc: malloc is coralloc's
 * (coral_owns, and the statistics count its huge blocks), and the extended
 * API (bulk, heaps) works. */
#include <coralloc.h>
#include <stdlib.h>
#include <string.h>

#include "served.h"

enum { HUGE_BLOCKS = 3, HUGE_SIZE = 64 << 20, BULK = 100 };

int main(void) {
    char *small = malloc(24);
    SERVED_CHECK(small != NULL && coral_owns(small));
    strcpy(small, "coralloc");

    long long huge_before = served_stat("huge_allocs");
    SERVED_CHECK(huge_before >= 0);
    void *huge[HUGE_BLOCKS];
    for (int i = 0; i < HUGE_BLOCKS; i++) {
        huge[i] = malloc(HUGE_SIZE);
        SERVED_CHECK(huge[i] != NULL && coral_owns(huge[i]));
    }
    SERVED_CHECK(served_stat("huge_allocs") - huge_before == HUGE_BLOCKS);
    for (int i = 0; i < HUGE_BLOCKS; i++) free(huge[i]);

    void *blocks[BULK];
    SERVED_CHECK(coral_malloc_bulk(48, BULK, blocks) == BULK);
    coral_free_bulk(blocks, BULK);

    coral_heap_t *heap = coral_heap_new();
    SERVED_CHECK(heap != NULL);
    for (int i = 0; i < BULK; i++) SERVED_CHECK(coral_heap_malloc(heap, 100) != NULL);
    coral_heap_destroy(heap);

    free(small);
    printf("C: %d huge blocks counted by coralloc %s\n", HUGE_BLOCKS, coral_version());
    return 0;
}
