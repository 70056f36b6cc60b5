/* The windows of the secure build's protocols, driven as test_windows.c
 * drives the default build's: a thread held at a test point (the secure
 * hooks library, coralloc_api_secure_hooks) while another does what the
 * window allows. Run as `test_secure_windows NAME`. */
#define _GNU_SOURCE
#include <pthread.h>
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
