/* Runs of remote frees (src/api/remote_run.h): a thread holds its frees of
 * another thread's blocks in runs, and pushes them onto their pages when a
 * run fills, when it exits, and when it collects. Each case frees from a
 * thread that calls nothing else (so it has no heap until its first such
 * free) a number of the main thread's blocks that is no multiple of a
 * run's length, then checks with coral_heap_visit on the main thread's
 * heap that exactly the blocks left are in use:
 *   exit_pushes: after the freeing thread has exited (joined);
 *   collect_pushes: after it called coral_collect(0), while it still lives
 *     (it waits on a barrier until the check is done).
 * Without the push at exit (or at collect) the blocks of the last run
 * stay in use for their page. The default build only: the secure build
 * pushes every remote free at once. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"
#include "testutil.h"

enum { NBLOCKS = 200, NFREED = 150 }; /* 150 = 4 runs of 32 and 22 */

static void *blocks[NBLOCKS];
static pthread_barrier_t collected, checked;

static int count_block(void *block, size_t size, size_t usable, void *arg) {
    (void)size;
    (void)usable;
    for (size_t i = 0; i < NBLOCKS; i++)
        if (blocks[i] == block) ++*(size_t *)arg;
    return 0;
}

/* The main thread's blocks of ours still in use. */
static size_t blocks_in_use(void) {
    size_t n = 0;
    CHECK_EQ(coral_heap_visit(NULL, count_block, &n), 0);
    return n;
}

static void *free_some(void *collect) {
    for (size_t i = 0; i < NFREED; i++) coral_free(blocks[i]);
    if (collect != NULL) {
        coral_collect(0);
        pthread_barrier_wait(&collected);
        pthread_barrier_wait(&checked);
    }
    return NULL;
}

static void allocate_all(void) {
    for (size_t i = 0; i < NBLOCKS; i++) CHECK_NOT_NULL(blocks[i] = coral_malloc(64));
    CHECK_EQ(blocks_in_use(), (size_t)NBLOCKS);
}

static void free_rest(void) {
    for (size_t i = NFREED; i < NBLOCKS; i++) coral_free(blocks[i]);
}

static void exit_pushes(void) {
    allocate_all();
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_some, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(blocks_in_use(), (size_t)(NBLOCKS - NFREED));
    free_rest();
}

static void collect_pushes(void) {
    allocate_all();
    pthread_barrier_init(&collected, NULL, 2);
    pthread_barrier_init(&checked, NULL, 2);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_some, (void *)1), 0);
    pthread_barrier_wait(&collected);
    size_t in_use = blocks_in_use();
    pthread_barrier_wait(&checked);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(in_use, (size_t)(NBLOCKS - NFREED));
    free_rest();
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only == NULL || strcmp(only, "exit_pushes") == 0) exit_pushes();
    if (only == NULL || strcmp(only, "collect_pushes") == 0) collect_pushes();
    printf("remote_runs: ok\n");
    return 0;
}
