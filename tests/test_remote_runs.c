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
 * stay in use for their page. And stale_word (below). The default build only: the secure build
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

/* stale_word: a run opened while its page's remote-free list held two
 * blocks the thread freed (b0, then b1: b1 the list's head); the owner
 * then takes the list and hands both out again, and the thread frees them
 * into its run, b1 last: the run's head is the list's head as the run
 * read the word at its opening. The push must check the word as it is
 * when it pushes: checked against the word read at the opening, it
 * reported "freed again" (a list whose head is the block pushed), a false
 * double free that aborted the program. */
enum { SLICE = 64 * 1024, PAGE_MAX = 1024 };
static void *page_blocks[PAGE_MAX];
static size_t page_count;
static void *handed[2];
static pthread_barrier_t opened, handed_over;

static void *open_then_free_handed(void *arg) {
    (void)arg;
    coral_free(page_blocks[0]);
    coral_free(page_blocks[1]);
    coral_free(page_blocks[2]); /* the third free in a row into the page opens a run */
    pthread_barrier_wait(&opened);
    pthread_barrier_wait(&handed_over);
    coral_free(handed[0] == page_blocks[0] ? handed[0] : handed[1]); /* b0, then b1 */
    coral_free(handed[0] == page_blocks[0] ? handed[1] : handed[0]);
    coral_collect(0); /* pushes the run */
    return NULL;
}

static void stale_word(void) {
    /* Blocks of one page of 64-byte blocks up to its last one, so that its
     * free list is empty and the owner's next malloc of the class takes
     * the page's remote-free list (the page stays the class's first). */
    page_count = 0;
    for (;;) {
        void *p = coral_malloc(64);
        CHECK_NOT_NULL(p);
        CHECK(page_count < PAGE_MAX);
        CHECK(page_count == 0 || (uintptr_t)p / SLICE == (uintptr_t)page_blocks[0] / SLICE);
        page_blocks[page_count++] = p;
        if ((uintptr_t)p % SLICE + 2 * 64 > SLICE) break; /* the slice's last block */
    }
    CHECK(page_count > 3);
    pthread_barrier_init(&opened, NULL, 2);
    pthread_barrier_init(&handed_over, NULL, 2);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, open_then_free_handed, NULL), 0);
    pthread_barrier_wait(&opened);
    handed[0] = coral_malloc(64);
    handed[1] = coral_malloc(64);
    /* The page's list was b1, b0: both come back from it. */
    CHECK((handed[0] == page_blocks[0] && handed[1] == page_blocks[1]) ||
          (handed[0] == page_blocks[1] && handed[1] == page_blocks[0]));
    pthread_barrier_wait(&handed_over);
    CHECK_EQ(pthread_join(t, NULL), 0);
    for (size_t i = 3; i < page_count; i++) coral_free(page_blocks[i]);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only == NULL || strcmp(only, "exit_pushes") == 0) exit_pushes();
    if (only == NULL || strcmp(only, "collect_pushes") == 0) collect_pushes();
    if (only == NULL || strcmp(only, "stale_word") == 0) stale_word();
    printf("remote_runs: ok\n");
    return 0;
}
