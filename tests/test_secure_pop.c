/* The secure build: a free nested in the same thread's pop of a page's
 * free list (src/heap/heap.h, coral_tls_popping), against the secure
 * build with its test points live (coralloc_api_secure_hooks).
 *
 * A signal handler that does malloc then free while its thread's malloc
 * has read the list's head X and not yet stored the next block gets X
 * too. Its free must put X back on the page at once (as the default build
 * does), which leaves the list as the interrupted pop read it; held in the
 * quarantine, X would be handed out twice and, as it leaves the
 * quarantine, reported as written after its free (ctest profile_secure
 * failed so, at random). Here the test point CORAL_TP_SECURE_POP, inside
 * that window, plays the handler, once, at an exact place:
 *   - the nested malloc gets the block the interrupted pop read, and so
 *     does the interrupted malloc when it goes on;
 *   - the next malloc gets another block; the quarantine, emptied while
 *     the program writes the block it got, reports nothing (it does not
 *     hold that block), nor once every block is freed and leaves it.
 * Run for a size the fast path pops (coral_pop_direct, api.h) and one
 * the slow path pops (page_pop, alloc.c). Without the flag the process
 * ends with "write after free detected". */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "../src/base/test_points.h"
#include "check.h"
#include "coralloc.h"

void coral_test_point_set(coral_test_point_fn fn);

static size_t nested_size;
static _Atomic(int) armed;
static const void *pop_read; /* the block the interrupted pop read */
static void *nested;         /* what the nested malloc got */

/* What a signal handler arriving inside the pop would do (once per arming;
 * the nested pop passes the same point disarmed). */
static void nested_malloc_free(int point, const void *object) {
    if (point != CORAL_TP_SECURE_POP || !atomic_exchange(&armed, 0)) return;
    pop_read = object;
    nested = coral_malloc(nested_size);
    CHECK_NOT_NULL(nested);
    coral_free(nested);
}

static void test_nested_in_pop(size_t size) {
    void *first = coral_malloc(size); /* the class's page set up, blocks left on its list */
    CHECK_NOT_NULL(first);
    nested_size = size;
    atomic_store(&armed, 1);
    void *p = coral_malloc(size);
    CHECK(atomic_load(&armed) == 0); /* the point was reached */
    CHECK(nested == pop_read);
    CHECK(p == pop_read);
    void *q = coral_malloc(size);
    CHECK_NOT_NULL(q);
    CHECK(q != p);
    /* p is the program's: written, and no block in the quarantine is p
     * (one that was would be found written as it leaves). */
    memset(p, 0x5a, size);
    coral_collect(1);
    coral_free(first);
    coral_free(p);
    coral_free(q);
    coral_collect(1); /* every block leaves the quarantine, checked */
}

int main(void) {
    coral_test_point_set(nested_malloc_free);
    test_nested_in_pop(100);  /* the fast path's pop */
    test_nested_in_pop(2000); /* above CORAL_DIRECT_MAX_SIZE: page_pop */
    coral_test_point_set(NULL);
    puts("test_secure_pop: ok");
    return 0;
}
