/* Pages whose blocks were all freed by other threads while their owner is
 * idle are reclaimed (src/reclaim.c):
 *   - idle:   an owner thread allocates about 64 MiB, hands every block to
 *             the main thread, which frees them all, and then waits on a
 *             condition variable (no allocator call). Once the purge delay
 *             (100 ms here) has passed on coralloc's clock, the purge
 *             thread's next pass reclaims its pages: the statistics count
 *             them, and (release build) RSS falls back. The owner then wakes up and allocates again
 * from the reclaimed pages: calloc gives zeros, contents hold.
 *   - return: the same with an hour-long delay: an owner that comes back
 *             takes its blocks itself and nothing is reclaimed (memory
 *             freed and reused soon is never purged); coral_collect(1)
 *             then reclaims at once the pages of an owner that went idle.
 *   - race:   with a zero delay, four threads in a ring pass batches of
 *             blocks to each other, each freeing what it receives, so the
 *             purger claims pages while their owners allocate from them;
 *             every block's contents are checked.
 * Each runs in a child process with its options in the environment. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "stats_json.h"
#include "proc.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RSS_MEANINGFUL 0 /* shadow memory and quarantines */
#else
#define RSS_MEANINGFUL 1
#endif

#define MiB ((size_t)1 << 20)

/* ---- an owner thread that allocates, hands over, and idles --------------------- */

/* 64 B, 1000 B and 200 KiB blocks (pages of one, one and several slices)
 * and 1 MiB large blocks: 16 + 16 + 16 + 16 MiB. */
enum { N64 = 1 << 18, N1000 = 16 * 1024, N200K = 80, NLARGE = 16 };
#define NBLOCKS (N64 + N1000 + N200K + NLARGE)
static void *blocks[NBLOCKS];
static size_t block_size(size_t i) {
    if (i < N64) return 64;
    if (i < N64 + N1000) return 1000;
    if (i < N64 + N1000 + N200K) return 200 * 1024;
    return MiB;
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int step; /* 1: blocks handed over; 2: owner may go on; 3: owner done */
} handoff_t;

static handoff_t handoff = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void step_to(int step) {
    pthread_mutex_lock(&handoff.lock);
    handoff.step = step;
    pthread_cond_broadcast(&handoff.cond);
    pthread_mutex_unlock(&handoff.lock);
}

static void wait_step(int step) {
    pthread_mutex_lock(&handoff.lock);
    while (handoff.step < step) pthread_cond_wait(&handoff.cond, &handoff.lock);
    pthread_mutex_unlock(&handoff.lock);
}

static void allocate_all(void) {
    for (size_t i = 0; i < NBLOCKS; i++) {
        blocks[i] = coral_malloc(block_size(i));
        CHECK_NOT_NULL(blocks[i]);
        memset(blocks[i], 0x5a, block_size(i));
    }
}

/* Allocate all, hand over, idle; then allocate again from the same pages. */
static void *owner_main(void *arg) {
    (void)arg;
    allocate_all();
    step_to(1);
    wait_step(2); /* idle: no allocator call until the main thread says so */
    /* Back from idling: the reclaimed pages are reused, zeroed for calloc. */
    for (size_t i = 0; i < N64; i++) {
        uint64_t *p = coral_calloc(1, 64);
        CHECK_NOT_NULL(p);
        for (size_t w = 0; w < 8; w++) CHECK_EQ(p[w], 0);
        blocks[i] = p;
        fill_pattern(p, 64, i);
    }
    for (size_t i = N64; i < NBLOCKS; i++) {
        blocks[i] = coral_malloc(block_size(i));
        CHECK_NOT_NULL(blocks[i]);
        fill_pattern(blocks[i], block_size(i) < 4096 ? block_size(i) : 4096, i);
    }
    for (size_t i = 0; i < NBLOCKS; i++) {
        size_t n = block_size(i) < 4096 ? block_size(i) : 4096;
        CHECK_EQ(pattern_mismatch(blocks[i], n, i), (size_t)-1);
        coral_free(blocks[i]);
    }
    step_to(3);
    return NULL;
}

static void free_all_remotely(void) {
    for (size_t i = 0; i < NBLOCKS; i++) coral_free(blocks[(i * 7919) % NBLOCKS]);
}

static int child_idle(void) {
    coral_free(coral_malloc(1));
    size_t before = rss_mib();
    pthread_t owner;
    CHECK_EQ(pthread_create(&owner, NULL, owner_main, NULL), 0);
    wait_step(1);
    size_t peak = rss_mib();
    long long reclaimed0 = stats_get("orphan_bytes_reclaimed");
    free_all_remotely();
    /* The owner holds every page; only the purger can give them back. */
    coral_test_advance_clock(100);
    CHECK_EQ(coral_test_purge_pass(), 1);
    long long reclaimed = stats_get("orphan_bytes_reclaimed") - reclaimed0;
    size_t after = rss_mib();
    printf("idle owner: RSS %zu -> %zu -> %zu MiB, %lld MiB reclaimed once the delay passed\n",
           before, peak, after, reclaimed / (long long)MiB);
    CHECK_GE(reclaimed, (long long)(56 * MiB)); /* of 64 MiB: partly used last pages stay */
    if (RSS_MEANINGFUL) {
        CHECK_GE(peak, before + 60);
        CHECK_LE(after, before + 16);
    }
    step_to(2);
    CHECK_EQ(pthread_join(owner, NULL), 0);
    return 0;
}

/* An owner that comes back before the delay: nothing reclaimed. Then it
 * idles again, and coral_collect(1) reclaims its pages at once. */
static void *returning_owner_main(void *arg) {
    (void)arg;
    allocate_all();
    step_to(1);
    wait_step(2);
    allocate_all(); /* takes its remote-freed blocks back */
    step_to(3);
    wait_step(4); /* idle again */
    return NULL;
}

static int child_return(void) {
    coral_free(coral_malloc(1));
    long long reclaimed0 = stats_get("orphan_bytes_reclaimed");
    pthread_t owner;
    CHECK_EQ(pthread_create(&owner, NULL, returning_owner_main, NULL), 0);
    wait_step(1);
    free_all_remotely();
    coral_test_purge_pass(); /* a whole pass: nothing is due for an hour */
    step_to(2);
    wait_step(3);
    CHECK_EQ(stats_get("orphan_bytes_reclaimed"), reclaimed0);
    free_all_remotely();
    size_t held = rss_mib();
    coral_collect(1);
    long long reclaimed = stats_get("orphan_bytes_reclaimed") - reclaimed0;
    size_t after = rss_mib();
    printf("coral_collect(1) with the owner idle: RSS %zu -> %zu MiB, %lld MiB reclaimed\n", held,
           after, reclaimed / (long long)MiB);
    CHECK_GE(reclaimed, (long long)(56 * MiB));
    if (RSS_MEANINGFUL) CHECK_LE(after + 48, held);
    step_to(4);
    CHECK_EQ(pthread_join(owner, NULL), 0);
    return 0;
}

/* ---- a ring of threads racing the purger ------------------------------------------ */

enum { RING = 4, BATCH = 2000, ROUNDS = 60 };

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    void **batch; /* handed over by the previous thread; NULL: empty */
    uint64_t seed;
} mailbox_t;

static mailbox_t boxes[RING];

static void mailbox_put(mailbox_t *box, void **batch, uint64_t seed) {
    pthread_mutex_lock(&box->lock);
    while (box->batch != NULL) pthread_cond_wait(&box->cond, &box->lock);
    box->batch = batch;
    box->seed = seed;
    pthread_cond_broadcast(&box->cond);
    pthread_mutex_unlock(&box->lock);
}

static void **mailbox_take(mailbox_t *box, uint64_t *seed) {
    pthread_mutex_lock(&box->lock);
    while (box->batch == NULL) pthread_cond_wait(&box->cond, &box->lock);
    void **batch = box->batch;
    *seed = box->seed;
    box->batch = NULL;
    pthread_cond_broadcast(&box->cond);
    pthread_mutex_unlock(&box->lock);
    return batch;
}

static size_t ring_size(uint64_t seed, size_t i) {
    tu_rng rng = {seed * 1000003u + i};
    return rng_range(&rng, 16, 3000);
}

/* Each thread's batch arrays, used in turn: the one a thread fills in round
 * r was last handed over in round r - 3, which the next thread finished
 * with before it took round r - 2's, which came before our put of r - 1. */
static void **ring_batches[RING][3];

static void *ring_main(void *arg) {
    size_t me = (size_t)(uintptr_t)arg;
    for (size_t b = 0; b < 3; b++) {
        ring_batches[me][b] = coral_malloc(BATCH * sizeof(void *));
        CHECK_NOT_NULL(ring_batches[me][b]);
    }
    for (size_t round = 0; round < ROUNDS; round++) {
        void **batch = ring_batches[me][round % 3];
        uint64_t seed = me * 100000 + round;
        for (size_t i = 0; i < BATCH; i++) {
            size_t n = ring_size(seed, i);
            batch[i] = coral_malloc(n);
            CHECK_NOT_NULL(batch[i]);
            fill_pattern(batch[i], n < 64 ? n : 64, seed + i);
        }
        mailbox_put(&boxes[(me + 1) % RING], batch, seed);
        uint64_t theirs;
        void **got = mailbox_take(&boxes[me], &theirs);
        for (size_t i = 0; i < BATCH; i++) {
            size_t n = ring_size(theirs, i);
            CHECK_EQ(pattern_mismatch(got[i], n < 64 ? n : 64, theirs + i), (size_t)-1);
            coral_free(got[i]);
        }
        if (round % 8 == me % 8) coral_test_purge_pass(); /* the purger claims meanwhile */
    }
    return NULL;
}

static int child_race(void) {
    for (size_t i = 0; i < RING; i++) {
        pthread_mutex_init(&boxes[i].lock, NULL);
        pthread_cond_init(&boxes[i].cond, NULL);
    }
    long long reclaimed0 = stats_get("orphan_pages_reclaimed");
    pthread_t threads[RING];
    for (size_t i = 0; i < RING; i++)
        CHECK_EQ(pthread_create(&threads[i], NULL, ring_main, (void *)(uintptr_t)i), 0);
    for (size_t i = 0; i < RING; i++) CHECK_EQ(pthread_join(threads[i], NULL), 0);
    for (size_t i = 0; i < RING; i++)
        for (size_t b = 0; b < 3; b++) coral_free(ring_batches[i][b]);
    long long reclaimed = stats_get("orphan_pages_reclaimed") - reclaimed0;
    printf("ring of %d threads, %d rounds of %d blocks: %lld pages reclaimed while in use\n", RING,
           ROUNDS, BATCH, reclaimed);
    CHECK_GT(reclaimed, 0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "idle") == 0) return child_idle();
    if (argc == 2 && strcmp(argv[1], "return") == 0) return child_return();
    if (argc == 2 && strcmp(argv[1], "race") == 0) return child_race();
    static const char *const idle[] = {"CORALLOC_PURGE_DELAY_MS=100", NULL};
    static const char *const ret[] = {"CORALLOC_PURGE_DELAY_MS=3600000", NULL};
    static const char *const race[] = {"CORALLOC_PURGE_DELAY_MS=0", NULL};
    run_child("idle", idle);
    run_child("return", ret);
    run_child("race", race);
    return 0;
}
