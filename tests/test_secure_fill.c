/* The secure build's fill check (src/page/page.h, coral_secure_fill_intact
 * and the ring's coral_secure_ring_intact; docs/SECURITY.md "Fill on
 * free"), against the coral_ API of the secure build: a freed block of a
 * size class, one bit of a word of it flipped, is reported when it leaves
 * the thread's ring of freed blocks or when malloc hands it out again
 * (malloc+free pairs of its class: the block comes back once a free takes
 * it out of the ring; the free fast path and the malloc fast path): words
 * 1 to 3 (its first 32 bytes past the link) in blocks of 16 bytes (word 1
 * is the freed mark), 32 (word 3 is the mark), 48, 112 and 2048 bytes (the
 * fill), and word 0 too in the blocks of less than 72 usable bytes (16, 32
 * and 48 bytes: the ring's fill covers their link's word while they wait,
 * a 16-byte block's alone); and a block left alone comes back without a
 * report. The stores and loads of the fill take no branch on the block
 * size, each class's words chosen by arithmetic or by its shape: a word
 * a class's missed would go unreported here. Each case runs in a child:
 * the report aborts it. */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"

/* In a child: free a block of `size` bytes, flip bit 0 of its word `word`
 * (none when negative), and allocate and free blocks of its class until
 * the block comes back. Exit status 0: it came back unreported; 2: it
 * never came back (each free of its size takes it out of the ring with
 * probability 1/4: 10,000 pairs leave it there with probability
 * (3/4)^10000). */
static void child(size_t size, int word) {
    uint64_t *p = coral_malloc(size);
    if (p == NULL) _exit(3);
    coral_free(p);
    if (word >= 0) ((volatile uint64_t *)p)[word] ^= 1;
    for (int i = 0; i < 10000; i++) {
        void *q = coral_malloc(size);
        if (q == (void *)p) _exit(0);
        coral_free(q);
    }
    _exit(2);
}

/* The outcome of child(size, word): true when it aborted (the report). */
static bool reported(size_t size, int word) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* (The report goes to stderr: silenced, the status tells.) */
        if (word >= 0) (void)freopen("/dev/null", "w", stderr);
        child(size, word);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) {
        CHECK_EQ(WTERMSIG(status), SIGABRT);
        return true;
    }
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0); /* the block came back */
    return false;
}

/* The ring of freed blocks is emptied, each block's fill checked, on
 * coral_collect and at thread exit: a byte written into a freed block
 * (byte 65 of 120, past the fill every freed block holds) is reported
 * there, with no malloc after it. */
static volatile uint8_t *ring_written(void) {
    volatile uint8_t *p = coral_malloc(120);
    coral_free((void *)p);
    p[65] = 'a';
    return p;
}

static void *thread_writes_after_free(void *arg) {
    (void)arg;
    ring_written();
    return NULL; /* its exit empties its ring */
}

static bool ring_reported(bool at_exit) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        (void)freopen("/dev/null", "w", stderr);
        if (at_exit) {
            pthread_t t;
            if (pthread_create(&t, NULL, thread_writes_after_free, NULL) != 0) _exit(3);
            pthread_join(t, NULL);
        } else {
            ring_written();
            coral_collect(0);
        }
        _exit(0);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGABRT;
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    return false;
}

int main(void) {
    if (!ring_reported(false)) {
        fprintf(stderr,
                "a write into a freed block in the ring went unreported at coral_collect\n");
        return 1;
    }
    if (!ring_reported(true)) {
        fprintf(stderr, "a write into a freed block in the ring went unreported at thread exit\n");
        return 1;
    }
    /* Requests whose blocks (the canary's 8 bytes added) are 16, 32, 48,
     * 112 and 2048 bytes, and the words that hold the fill or the mark:
     * from word 0 in blocks of less than 72 usable bytes (in the ring),
     * up to word 1 only in a 16-byte block. */
    static const struct {
        size_t size;
        int first, last;
    } cases[] = {{8, 0, 1}, {24, 0, 3}, {40, 0, 3}, {100, 1, 3}, {2040, 1, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK(!reported(cases[c].size, -1));
        for (int w = cases[c].first; w <= cases[c].last; w++) {
            if (!reported(cases[c].size, w)) {
                fprintf(stderr,
                        "a write into word %d of a freed %zu-byte request's block "
                        "went unreported\n",
                        w, cases[c].size);
                return 1;
            }
        }
    }
    printf("secure_fill: every word of the fill and mark checked in 5 classes; the ring emptied "
           "and checked at coral_collect and thread exit\n");
    return 0;
}
