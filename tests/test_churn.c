/* Thread churn: 10,000 threads (fewer under the sanitizers), four alive at a
 * time, each allocating blocks, handing some to a shared pool whose previous
 * blocks it frees (blocks of threads long gone), and exiting with blocks
 * still live in its pages. At the end every block is checked and freed, and
 * after coral_collect(1) the resident memory must be back near the start:
 * abandoned heaps were adopted and nothing leaked. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "proc.h"
#include "testutil.h"

#if defined(CORAL_TEST_TSAN) || defined(CORAL_TEST_ASAN)
#define THREADS 1000
#else
#define THREADS 10000
#endif
#define ALIVE 4
#define POOL 256
#define PER_THREAD 48

typedef struct {
    void *p;
    size_t n;
    uint64_t seed;
} slot_t;

static slot_t pool[POOL];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static void check_slot(const slot_t *s) {
    CHECK_EQ(pattern_mismatch(s->p, s->n, s->seed), (size_t)-1);
}

static void *churner(void *arg) {
    uint64_t id = (uint64_t)(uintptr_t)arg;
    tu_rng rng = {id * 7919 + 1};
    slot_t mine[PER_THREAD];
    for (int i = 0; i < PER_THREAD; i++) {
        size_t n = rng_range(&rng, 1, i % 8 == 0 ? 20000 : 512);
        mine[i] = (slot_t){coral_malloc(n), n, id * PER_THREAD + (uint64_t)i};
        CHECK_NOT_NULL(mine[i].p);
        fill_pattern(mine[i].p, n, mine[i].seed);
    }
    /* Hand a few over (they outlive this thread), free the rest. */
    for (int i = 0; i < PER_THREAD; i++) {
        if (i % 6 == 0) {
            size_t k = rng_range(&rng, 0, POOL - 1);
            pthread_mutex_lock(&pool_lock);
            slot_t old = pool[k];
            pool[k] = mine[i];
            pthread_mutex_unlock(&pool_lock);
            if (old.p) {
                check_slot(&old);
                coral_free(old.p);
            }
        } else {
            check_slot(&mine[i]);
            coral_free(mine[i].p);
        }
    }
    return NULL;
}

int main(void) {
    coral_collect(1);
    size_t rss_start = rss_kib();
    pthread_t alive[ALIVE];
    for (int t = 0; t < THREADS; t += ALIVE) {
        for (int i = 0; i < ALIVE; i++)
            CHECK_EQ(pthread_create(&alive[i], NULL, churner, (void *)(uintptr_t)(t + i)), 0);
        for (int i = 0; i < ALIVE; i++) CHECK_EQ(pthread_join(alive[i], NULL), 0);
    }
    size_t rss_busy = rss_kib();
    for (int k = 0; k < POOL; k++) {
        if (pool[k].p == NULL) continue;
        check_slot(&pool[k]);
        coral_free(pool[k].p);
    }
    coral_collect(1);
    size_t rss_end = rss_kib();
    printf("churn: %d threads; RSS start %zu KiB, busy %zu KiB, after collect %zu KiB\n", THREADS,
           rss_start, rss_busy, rss_end);
#ifdef CORAL_TEST_RELEASE
    /* Back near the start: at most 4 MiB more (the thread stacks' cache and
     * one segment header). */
    CHECK_LE(rss_end, rss_start + 4096);
#endif
    return 0;
}
