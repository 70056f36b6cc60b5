/* White-box: the invariants of pages and segments (coral_test_check) hold
 * after each kind of operation, and the check finds a broken one.
 *   - mixed sizes allocated and freed in a scrambled order;
 *   - blocks freed by another thread, then collected;
 *   - such blocks handed out again unwritten and freed remotely again;
 *   - bulk calls, a user heap, large and huge blocks;
 *   - pages of an exited thread adopted, then freed into by the adopter
 *     (each page names its new owner: the free fast path's one test);
 *   - a free list led outside its page is reported (then repaired). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"

enum { N = 4000 };
static void *blocks[N];

static size_t size_of(size_t i) { return 1 + (i * 7919) % 3000; }

static void test_mixed_sizes(void) {
    for (size_t i = 0; i < N; i++) CHECK_NOT_NULL(blocks[i] = coral_malloc(size_of(i)));
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 0; i < N; i += 2) coral_free(blocks[(i * 31) % N]);
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 0; i < N; i += 2) blocks[(i * 31) % N] = coral_malloc(size_of(i) / 2 + 1);
    CHECK_EQ(coral_test_check(), 0);
}

static void *free_half(void *arg) {
    (void)arg;
    for (size_t i = 1; i < N; i += 2) coral_free(blocks[i]);
    return NULL;
}

static void test_remote_frees(void) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_half, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(coral_test_check(), 0); /* remote frees still on thread_free */
    coral_collect(0);
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 0; i < N; i += 2) coral_free(blocks[i]);
    CHECK_EQ(coral_test_check(), 0);
}

/* Blocks taken back from other threads' frees keep the remote mark in
 * their second word (page/page.c, "Remote marks"); handed out again
 * unwritten and freed by another thread once more, round after round, they
 * are first pushes of a new generation: no report, the lists intact. */
enum { REUSED = 1000, ROUNDS = 40 };
static void *reused[REUSED];

static void *free_reused(void *arg) {
    (void)arg;
    for (size_t i = 0; i < REUSED; i++) coral_free(reused[i]);
    return NULL;
}

static void test_remote_frees_reused_unwritten(void) {
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t i = 0; i < REUSED; i++) CHECK_NOT_NULL(reused[i] = coral_malloc(64));
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, free_reused, NULL), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        coral_collect(0);
        CHECK_EQ(coral_test_check(), 0);
    }
}

static void test_bulk_heaps_big(void) {
    CHECK_EQ(coral_malloc_bulk(64, N, blocks), N);
    CHECK_EQ(coral_test_check(), 0);
    coral_free_bulk(blocks, N);
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    for (size_t i = 0; i < 500; i++) CHECK_NOT_NULL(coral_heap_malloc(heap, size_of(i)));
    void *large = coral_malloc(1 << 20), *huge = coral_malloc(9 << 20);
    CHECK_EQ(coral_test_check(), 0);
    coral_heap_destroy(heap);
    coral_free(large);
    coral_free(huge);
    CHECK_EQ(coral_test_check(), 0);
}

static void *allocate_and_exit(void *arg) {
    (void)arg;
    for (size_t i = 0; i < N; i++) CHECK_NOT_NULL(blocks[i] = coral_malloc(size_of(i) % 700 + 1));
    return NULL;
}

static void test_adopted_pages(void) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, allocate_and_exit, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0); /* its segments are abandoned */
    coral_collect(1);                   /* and adopted by this thread */
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 0; i < N; i += 2) coral_free(blocks[i]);
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 1; i < N; i += 2) coral_free(blocks[i]);
    CHECK_EQ(coral_test_check(), 0);
}

static void test_broken_list_found(void) {
    void *a = coral_malloc(48), *b = coral_malloc(48);
    coral_free(a); /* a is on its page's local free list, first */
    void *saved = *(void **)a;
    *(void **)a = (char *)b + 8; /* a write after free: the link leads into a block */
    CHECK_EQ(coral_test_check(), -1);
    *(void **)a = saved;
    CHECK_EQ(coral_test_check(), 0);
    coral_free(b);
}

int main(void) {
    test_mixed_sizes();
    test_remote_frees();
    test_remote_frees_reused_unwritten();
    test_bulk_heaps_big();
    test_adopted_pages();
    test_broken_list_found();
    printf("invariants: ok\n");
    return 0;
}
