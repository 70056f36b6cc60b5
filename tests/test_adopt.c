/* A thread that exits leaves its pages with live blocks for adoption; a
 * thread that then needs a block of their class fills their free space
 * before it carves a fresh page, the fullest of them first:
 *   - reuse:   an exited thread left one live 128-byte block in a page; the
 *              next thread's first 128-byte block lies in that page (64 KiB
 *              span), not in a fresh one.
 *   - fullest: the exited thread left two pages of the class, one with a
 *              single live block and one nearly full; the next thread's
 *              block goes to the nearly full one.
 * Addresses alone decide: no clock, no sleep. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "coralloc.h"

#define SIZE 128
#define SPAN_SHIFT 16 /* pages of 128-byte blocks are one 64 KiB slice */
#define N 2048        /* blocks of SIZE: several pages */

static void *blocks[N];
static void *kept_single; /* the one live block of the emptier page */
static uintptr_t single_span, full_span;

static uintptr_t span_of(const void *p) { return (uintptr_t)p >> SPAN_SHIFT; }

static size_t count_in_span(uintptr_t span) {
    size_t n = 0;
    for (size_t i = 0; i < N; i++)
        if (blocks[i] != NULL && span_of(blocks[i]) == span) n++;
    return n;
}

/* Leaves one page with one live block, and (fullest) one page with all but
 * 8 of its blocks live; frees every other block. */
static void *leaver_main(void *arg) {
    int fullest = arg != NULL;
    for (size_t i = 0; i < N; i++) {
        blocks[i] = coral_malloc(SIZE);
        CHECK_NOT_NULL(blocks[i]);
    }
    single_span = span_of(blocks[0]);
    full_span = 0;
    for (size_t i = 0; i < N && fullest && full_span == 0; i++)
        if (span_of(blocks[i]) != single_span && count_in_span(span_of(blocks[i])) >= 64)
            full_span = span_of(blocks[i]);
    CHECK(!fullest || full_span != 0);
    kept_single = blocks[0];
    size_t freed_in_full = 0;
    for (size_t i = 1; i < N; i++) {
        uintptr_t s = span_of(blocks[i]);
        if (s == full_span && freed_in_full++ >= 8) continue; /* stays live */
        coral_free(blocks[i]);
        blocks[i] = NULL;
    }
    blocks[0] = NULL;
    return NULL;
}

static void *taker_main(void *arg) {
    void **out = arg;
    *out = coral_malloc(SIZE);
    return NULL;
}

static void *leave_then_take(int fullest) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, leaver_main, fullest ? (void *)1 : NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    void *got = NULL;
    CHECK_EQ(pthread_create(&t, NULL, taker_main, &got), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_NOT_NULL(got);
    return got;
}

static void free_left(void) {
    for (size_t i = 0; i < N; i++) {
        coral_free(blocks[i]);
        blocks[i] = NULL;
    }
    coral_free(kept_single);
}

int main(void) {
    void *got = leave_then_take(0);
    CHECK_MSG(span_of(got) == single_span,
              "the next thread's block %p is not in the exited thread's page at %p", got,
              kept_single);
    coral_free(got);
    free_left();
    printf("reuse: the next thread filled the exited thread's page\n");

    got = leave_then_take(1);
    CHECK_MSG(span_of(got) == full_span,
              "the next thread's block %p is not in the fuller page (span %#lx, emptier %#lx)", got,
              (unsigned long)full_span, (unsigned long)single_span);
    coral_free(got);
    free_left();
    printf("fullest: the next thread took the fuller of the exited thread's pages\n");
    CHECK_EQ(coral_test_check(), 0);
    return 0;
}
