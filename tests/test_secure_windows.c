/* The windows of the secure build's protocols, driven as test_windows.c
 * drives the default build's: a thread held at a test point (the secure
 * hooks library, coralloc_api_secure_hooks) while another does what the
 * window allows. Run as `test_secure_windows NAME`. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "coralloc.h"
#include "hooks.h"

#define HUGE_BLOCK ((size_t)8 << 20)
#define NEIGHBOUR_BYTES ((size_t)64 << 10)

static void *free_block(void *p) {
    coral_free(p);
    return NULL;
}

/* ---- a freed huge block's range and another thread's new mapping -------------------------
 * The secure build moves a freed huge block's pages away, then reserves its
 * address range inaccessible. Between the two the range is unmapped, and
 * another thread's mmap may be placed there. The reservation must leave
 * that mapping alone: with MAP_FIXED it replaced it by an inaccessible
 * one, and the other thread's next access faulted (fuzz_secure's
 * SIGSEGV). The freeing thread is held in the window; this thread maps at
 * the range's base (a hint the kernel honours for a free range), fills
 * the mapping, lets the free finish, and reads its data back. */
static void case_huge_quarantine_neighbour(void) {
    uint8_t *p = coral_malloc(HUGE_BLOCK);
    CHECK(p != NULL);
    gate_arm(CORAL_TP_HUGE_MOVED, -1);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_block, p), 0);
    uint8_t *base = (uint8_t *)gate_wait_held();
    uint8_t *mine =
        mmap(base, NEIGHBOUR_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mine != MAP_FAILED);
    CHECK_MSG(mine == base, "the kernel placed the mapping at %p, not at the free range %p",
              (void *)mine, (void *)base);
    memset(mine, 0x5a, NEIGHBOUR_BYTES);
    gate_open();
    CHECK_EQ(pthread_join(t, NULL), 0);
    for (size_t i = 0; i < NEIGHBOUR_BYTES; i += 4096) CHECK_EQ(mine[i], 0x5a);
    CHECK_EQ(munmap(mine, NEIGHBOUR_BYTES), 0);
}

/* ---- a signal handler's free inside a free's put into the ring -------------------------
 * The secure build's owner frees wait in a ring of slots drawn at random
 * (heap.h); a put reads its slot, then writes it. A free in a signal
 * handler that runs between the two, and draws the same slot, took the
 * same block out (pushed on its page twice: the page's free list loops, a
 * block handed out twice) and had its own block overwritten (never freed).
 * Each free of RING_FREES is interrupted there (CORAL_TP_RING_SWAP raises
 * SIGUSR1 on the thread, whose handler frees another block of the same
 * size): the handler's draw is the next one, the same slot one time in
 * CORAL_RING_SLOTS (4), so without the ring's busy flag every run but about
 * (3/4)^RING_FREES (10^-8) of them hits it. Then every block must be
 * handed out once by the mallocs that follow (a looping list hands one
 * out twice, or the pop's check of the freed mark reports it), and none of
 * the freed ones may be left in use (coral_heap_visit empties the ring
 * first). Three sizes: 16-byte blocks (their ring fill lies in the ring's
 * spare), 32-byte ones (the handler's block goes back at once: the fill
 * of a page's free blocks must keep its mark, the word the fill's third
 * store shares with it) and larger ones. */
#define RING_FREES 64
static void *ring_handler_block;
static int ring_interrupt_armed;

static void ring_handler(int sig) {
    (void)sig;
    void *p = ring_handler_block;
    ring_handler_block = NULL;
    coral_free(p);
}

static void ring_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_RING_SWAP && ring_interrupt_armed) {
        ring_interrupt_armed = 0;
        raise(SIGUSR1);
    }
}

static int ring_count_ours(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block_size, (void)usable;
    void **ours = arg;
    for (size_t i = 0; i < 2 * RING_FREES; i++)
        if (ours[i] == block) return 1;
    return 0;
}

static void ring_put_signal(size_t size) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ring_handler;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    static void *blocks[2 * RING_FREES]; /* each put's, then each handler's */
    for (size_t i = 0; i < 2 * RING_FREES; i++) CHECK((blocks[i] = coral_malloc(size)) != NULL);
    coral_test_point_set(ring_hook);
    for (size_t i = 0; i < RING_FREES; i++) {
        ring_handler_block = blocks[RING_FREES + i];
        ring_interrupt_armed = 1;
        coral_free(blocks[i]);
        CHECK_MSG(ring_handler_block == NULL, "free %zu was not interrupted in its put", i);
    }
    coral_test_point_set(NULL);
    /* None of them left in use. */
    CHECK_EQ(coral_heap_visit(NULL, ring_count_ours, blocks), 0);
    /* Each handed out once. */
    static void *again[2 * RING_FREES + 64];
    size_t n = sizeof again / sizeof again[0];
    for (size_t i = 0; i < n; i++) {
        CHECK((again[i] = coral_malloc(size)) != NULL);
        for (size_t j = 0; j < i; j++)
            CHECK_MSG(again[j] != again[i], "block %p handed out twice", again[i]);
    }
    for (size_t i = 0; i < n; i++) coral_free(again[i]);
}

static void case_ring_put_signal(void) {
    ring_put_signal(8);
    ring_put_signal(24);
    ring_put_signal(128);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_secure_windows CASE\n");
        return 2;
    }
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {
        {"huge_quarantine_neighbour", case_huge_quarantine_neighbour},
        {"ring_put_signal", case_ring_put_signal},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (strcmp(argv[1], cases[i].name) != 0) continue;
        cases[i].run();
        printf("%s: passed\n", argv[1]);
        return 0;
    }
    fprintf(stderr, "test_secure_windows: no case %s\n", argv[1]);
    return 2;
}
