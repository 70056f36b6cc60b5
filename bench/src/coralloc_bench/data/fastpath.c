/*
 * fastpath: a loop of malloc/free calls whose instruction count, taken under
 * `valgrind --tool=callgrind` at two iteration counts and differenced, gives
 * the cost of an allocator's fast path (`coralloc-bench fastpath`, fastpath.py).
 *
 *   fastpath SCENARIO ITERATIONS
 *
 * Scenarios (one iteration each):
 *   pair16, pair64, pair512  malloc + free of one block of that size
 *   batch64                  malloc 1000 blocks of 64 bytes, then free them all
 *                            in allocation order
 *   mixed                    malloc 1000 blocks of sizes 8..1024 from a fixed
 *                            pseudo-random sequence, then free them in a fixed
 *                            scrambled order
 *
 * Build: gcc -O2 -fno-builtin fastpath.c -o fastpath
 * -fno-builtin keeps the compiler from pairing malloc with free and deleting
 * both; each block also gets a one-byte volatile store. There is no NULL
 * check in the loops (it would add two instructions per block): a failed
 * malloc crashes on the store, and the driver fails on the crash.
 *
 * Before the loop it prints, once, to stderr, which shared object the
 * process's malloc and free resolve to (dladdr), so that the driver can check
 * that an LD_PRELOAD is in effect. Everything outside the loop (start-up, the
 * random sequences, this report) is the same at every iteration count and
 * cancels when two counts are differenced.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 1000
#define MIXED_MIN 8
#define MIXED_MAX 1024

static void *blocks[BATCH];
static size_t mixed_size[BATCH];
static unsigned free_order[BATCH];

/* xorshift64*: a fixed, portable pseudo-random sequence. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void make_sequences(void) {
    for (unsigned i = 0; i < BATCH; i++) {
        mixed_size[i] = MIXED_MIN + (size_t)(rng_next() % (MIXED_MAX - MIXED_MIN + 1));
        free_order[i] = i;
    }
    for (unsigned i = BATCH - 1; i > 0; i--) { /* Fisher-Yates */
        unsigned j = (unsigned)(rng_next() % (i + 1));
        unsigned t = free_order[i];
        free_order[i] = free_order[j];
        free_order[j] = t;
    }
}

static const char *provider(void *fn) {
    Dl_info info;
    if (fn == NULL || dladdr(fn, &info) == 0 || info.dli_fname == NULL) return "?";
    return info.dli_fname;
}

static void report_providers(void) {
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    void *f = dlsym(RTLD_DEFAULT, "free");
    fprintf(stderr, "fastpath: malloc from %s\n", provider(m));
    fprintf(stderr, "fastpath: free from %s\n", provider(f));
}

static void die(const char *what) {
    fprintf(stderr, "fastpath: %s\n", what);
    exit(1);
}

/* noinline: each loop is its own function, visible as such in callgrind. */
__attribute__((noinline)) static void run_pair(size_t size, unsigned long n) {
    for (unsigned long i = 0; i < n; i++) {
        char *p = malloc(size);
        *(volatile char *)p = (char)i;
        free(p);
    }
}

__attribute__((noinline)) static void run_batch64(unsigned long n) {
    for (unsigned long it = 0; it < n; it++) {
        for (unsigned i = 0; i < BATCH; i++) {
            char *p = malloc(64);
            *(volatile char *)p = (char)i;
            blocks[i] = p;
        }
        for (unsigned i = 0; i < BATCH; i++) free(blocks[i]);
    }
}

__attribute__((noinline)) static void run_mixed(unsigned long n) {
    for (unsigned long it = 0; it < n; it++) {
        for (unsigned i = 0; i < BATCH; i++) {
            char *p = malloc(mixed_size[i]);
            *(volatile char *)p = (char)i;
            blocks[i] = p;
        }
        for (unsigned i = 0; i < BATCH; i++) free(blocks[free_order[i]]);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s pair16|pair64|pair512|batch64|mixed ITERATIONS\n", argv[0]);
        return 2;
    }
    const char *scenario = argv[1];
    char *end;
    unsigned long n = strtoul(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0') die("ITERATIONS must be a number");

    make_sequences();
    report_providers();

    if (strcmp(scenario, "pair16") == 0)
        run_pair(16, n);
    else if (strcmp(scenario, "pair64") == 0)
        run_pair(64, n);
    else if (strcmp(scenario, "pair512") == 0)
        run_pair(512, n);
    else if (strcmp(scenario, "batch64") == 0)
        run_batch64(n);
    else if (strcmp(scenario, "mixed") == 0)
        run_mixed(n);
    else
        die("unknown scenario");
    return 0;
}
