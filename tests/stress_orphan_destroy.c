/* The destroy-versus-purger shape, as a stress test (no test points): a
 * user heap with one page of 64-byte blocks, all freed by another thread
 * (the page is an orphan, due at once with CORALLOC_PURGE_DELAY_MS=0, so
 * the purge thread reclaims it), a short spin, the heap destroyed, a new
 * heap writes 1,024 blocks, checked after a short spin. Before the fix a
 * purge that had unlisted the page could still claim it and zero the new
 * heap's live blocks (2 rounds in 60,000). Rounds: argv[1] (60,000). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "coralloc.h"
#include "testutil.h"

#define BLOCKS 1024

static void *blocks[BLOCKS];
static _Atomic(int) round_go, round_done;

static void *freer(void *arg) {
    long rounds = (long)arg;
    for (long r = 1; r <= rounds; r++) {
        while (atomic_load(&round_go) != r) {
        }
        for (size_t i = 0; i < BLOCKS; i++) coral_free(blocks[i]);
        atomic_store(&round_done, (int)r);
    }
    return NULL;
}

static void spin(unsigned n) {
    for (volatile unsigned i = 0; i < n; i++) {
    }
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 60000;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, freer, (void *)rounds), 0);
    long zeroed = 0;
    static void *live[BLOCKS];
    for (long r = 1; r <= rounds; r++) {
        coral_heap_t *heap = coral_heap_new();
        for (size_t i = 0; i < BLOCKS; i++) blocks[i] = coral_heap_malloc(heap, 64);
        atomic_store(&round_go, (int)r);
        while (atomic_load(&round_done) != r) {
        }
        spin((unsigned)(r % 64) * 50);
        coral_heap_destroy(heap);
        coral_heap_t *next = coral_heap_new();
        for (size_t i = 0; i < BLOCKS; i++) {
            live[i] = coral_heap_malloc(next, 64);
            fill_pattern(live[i], 64, i + (size_t)r);
        }
        spin(20000);
        for (size_t i = 0; i < BLOCKS; i++)
            if (pattern_mismatch(live[i], 64, i + (size_t)r) != (size_t)-1) zeroed++;
        coral_heap_destroy(next);
    }
    CHECK_EQ(pthread_join(t, NULL), 0);
    printf("stress_orphan_destroy: %ld rounds, %ld live blocks changed\n", rounds, zeroed);
    CHECK_EQ(zeroed, 0);
    return 0;
}
