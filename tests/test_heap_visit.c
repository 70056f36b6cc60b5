/* coral_heap_visit (coralloc.h): the blocks it reports are exactly the
 * blocks in use, for a first-class heap and for a thread's own heap, over
 * every kind of size (small, medium, large, huge), after frees by the
 * owner and by another thread; the rules it documents for fn hold (fn may
 * free and allocate; a nonzero return stops the walk). Run in every
 * configuration, and in the secure build (usable sizes then leave out the
 * canary). Each heap walked is one that only this test allocates from: a
 * new user heap, or the heap of a thread that calls nothing but coral_*. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"
#include "testutil.h"

/* Small (fast-path classes), medium classes, large (a span) and huge (a
 * segment of its own) sizes. */
static const size_t sizes[] = {16,    24,     100,       1000,    1024,    1500,   9000,
                               70000, 300000, 600 << 10, 3 << 19, 5 << 20, 9 << 20};
#define NSIZES (sizeof sizes / sizeof *sizes)
#define PER_SIZE 12
#define NBLOCKS (NSIZES * PER_SIZE)

typedef struct expect_s {
    void *block[NBLOCKS];
    size_t size[NBLOCKS];
    int live[NBLOCKS];
    int seen[NBLOCKS];
    size_t unexpected; /* blocks reported that are not live ones of ours */
} expect_t;

static int find_block(const expect_t *e, const void *p) {
    for (size_t i = 0; i < NBLOCKS; i++)
        if (e->block[i] == p) return (int)i;
    return -1;
}

static int note_block(void *block, size_t block_size, size_t usable, void *arg) {
    expect_t *e = arg;
    int i = find_block(e, block);
    if (i < 0 || !e->live[i]) {
        e->unexpected++;
        return 0;
    }
    e->seen[i]++;
    /* (at least: the secure build's usable size is the request) */
    CHECK_GE(usable, coral_malloc_usable_size(block));
    CHECK_GE(usable, e->size[i]);
    CHECK_GE(block_size, usable);
    return 0;
}

/* Every live block seen once, nothing else. */
static void check_exact(coral_heap_t *heap, expect_t *e) {
    memset(e->seen, 0, sizeof e->seen);
    e->unexpected = 0;
    CHECK_EQ(coral_heap_visit(heap, note_block, e), 0);
    CHECK_EQ(e->unexpected, 0);
    for (size_t i = 0; i < NBLOCKS; i++) CHECK_EQ(e->seen[i], e->live[i]);
}

/* ---- the frees of another thread ---------------------------------------------------- */

typedef struct remote_s {
    expect_t *e;
    size_t every;
} remote_t;

static void *remote_free_worker(void *arg) {
    remote_t *r = arg;
    for (size_t i = 0; i < NBLOCKS; i += r->every)
        if (r->e->live[i]) {
            coral_free(r->e->block[i]);
            r->e->live[i] = 0;
        }
    return NULL;
}

/* Allocate from heap (NULL: the thread's own), free some as the owner and
 * some from another thread, and check the walk after each step. */
static void exercise(coral_heap_t *heap, expect_t *e) {
    memset(e, 0, sizeof *e);
    check_exact(heap, e); /* nothing of ours yet */
    for (size_t k = 0; k < PER_SIZE; k++)
        for (size_t s = 0; s < NSIZES; s++) {
            size_t i = k * NSIZES + s;
            e->size[i] = sizes[s];
            e->block[i] = opaque(heap ? coral_heap_malloc(heap, sizes[s]) : coral_malloc(sizes[s]));
            CHECK_NOT_NULL(e->block[i]);
            e->live[i] = 1;
        }
    check_exact(heap, e);
    for (size_t i = 0; i < NBLOCKS; i += 3) { /* the owner's frees */
        coral_free(e->block[i]);
        e->live[i] = 0;
    }
    check_exact(heap, e);
    remote_t r = {e, 5}; /* another thread's frees (remote pushes, not yet taken) */
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, remote_free_worker, &r), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    check_exact(heap, e);
}

static void free_live(expect_t *e) {
    for (size_t i = 0; i < NBLOCKS; i++)
        if (e->live[i]) {
            coral_free(e->block[i]);
            e->live[i] = 0;
        }
}

static void test_user_heap(void) {
    static expect_t e;
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    void *mine = coral_malloc(100); /* the thread's heap: never the user heap's */
    exercise(heap, &e);
    free_live(&e);
    check_exact(heap, &e);
    coral_free(mine);
    coral_heap_destroy(heap);
}

static void *thread_heap_worker(void *arg) {
    exercise(NULL, arg);
    free_live(arg);
    check_exact(NULL, arg);
    return NULL;
}

/* A thread of its own: its heap holds only what the test allocates. */
static void test_thread_heap(void) {
    static expect_t e;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, thread_heap_worker, &e), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
}

/* ---- what fn may do ------------------------------------------------------------------- */

typedef struct churn_s {
    coral_heap_t *heap;
    size_t visited;
    void *made[64];
    size_t nmade;
} churn_t;

/* Frees each block it is given and allocates one from the same heap. */
static int free_and_allocate(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block_size;
    (void)usable;
    churn_t *c = arg;
    c->visited++;
    coral_free(block);
    CHECK_LT(c->nmade, 64);
    c->made[c->nmade] = coral_heap_malloc(c->heap, 48);
    CHECK_NOT_NULL(c->made[c->nmade]);
    c->nmade++;
    return 0;
}

static int count_block(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block;
    (void)block_size;
    (void)usable;
    ++*(size_t *)arg;
    return 0;
}

static int stop_at_third(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block;
    (void)block_size;
    (void)usable;
    return ++*(size_t *)arg == 3 ? 42 : 0;
}

static void test_fn_rules(void) {
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    for (int i = 0; i < 32; i++) CHECK_NOT_NULL(coral_heap_malloc(heap, 16 + 100 * (size_t)i));
    churn_t c = {.heap = heap};
    CHECK_EQ(coral_heap_visit(heap, free_and_allocate, &c), 0);
    CHECK_EQ(c.visited, 32); /* the blocks fn allocated were not visited */
    size_t n = 0;
    CHECK_EQ(coral_heap_visit(heap, count_block, &n), 0);
    CHECK_EQ(n, 32); /* the 32 fn allocated; the 32 it freed are gone */
    n = 0;
    CHECK_EQ(coral_heap_visit(heap, stop_at_third, &n), 42);
    CHECK_EQ(n, 3);
    coral_heap_destroy(heap);
}

int main(void) {
    test_user_heap();
    test_thread_heap();
    test_fn_rules();
    puts("test_heap_visit: ok");
    return 0;
}
