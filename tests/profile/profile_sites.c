/* The profile accuracy test's program (tests/profile/check_profile.py runs
 * it with libcoralloc.so preloaded and CORALLOC_PROFILE set): three
 * functions allocate 60, 30 and 10 % of the bytes, each with a mix of
 * sizes from 16 B to 96 KiB; three quarters of the blocks are freed at
 * once, the rest stay live until exit, when the profile is written. It
 * prints the truth, bytes allocated and bytes live per function, as
 * "name alloc_bytes inuse_bytes" lines. Built with frame pointers and no
 * inlining, so each function is a frame of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEEP_MAX 400000

static void *kept[KEEP_MAX];
static size_t nkept;

typedef struct truth_s {
    const char *name;
    unsigned long long alloc, inuse;
} truth_t;

/* A small deterministic generator: the same run every time. */
static unsigned long long rng = 88172645463325252ull;
static unsigned long long next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A size of the mix: mostly small, some medium, a few large; with
 * `small`, the first 8 only (at most 1000 B: malloc's fast path). */
static size_t mixed_size(int small) {
    static const size_t sizes[] = {16, 24, 48, 64, 100, 256, 500, 1000, 3000, 8000, 20000, 98304};
    static const unsigned weights[] = {20, 20, 15, 10, 10, 8, 6, 5, 3, 1, 1, 1};
    size_t n = small ? 8 : sizeof weights / sizeof *weights;
    unsigned total = 0, pick;
    for (size_t i = 0; i < n; i++) total += weights[i];
    pick = (unsigned)(next_random() % total);
    for (size_t i = 0; i < n; i++) {
        if (pick < weights[i]) return sizes[i];
        pick -= weights[i];
    }
    return 16;
}

/* One block from the site, counted in t; one in four kept live. */
static void keep_or_free(void *p, size_t size, truth_t *t) {
    if (p == NULL) {
        fprintf(stderr, "profile_sites: out of memory\n");
        exit(1);
    }
    memset(p, 1, size < 64 ? size : 64);
    t->alloc += size;
    if (next_random() % 4 == 0 && nkept < KEEP_MAX) {
        kept[nkept++] = p;
        t->inuse += size;
    } else {
        free(p);
    }
}

__attribute__((noinline)) void site_sixty(truth_t *t, size_t size) {
    keep_or_free(malloc(size), size, t);
}

__attribute__((noinline)) void site_thirty(truth_t *t, size_t size) {
    keep_or_free(malloc(size), size, t);
}

__attribute__((noinline)) void site_ten(truth_t *t, size_t size) {
    keep_or_free(malloc(size), size, t);
}

int main(int argc, char **argv) {
    unsigned long long total = argc > 1 ? strtoull(argv[1], NULL, 10) : 64ull << 20;
    int small = argc > 2 && strcmp(argv[2], "small") == 0;
    truth_t t[3] = {{"site_sixty", 0, 0}, {"site_thirty", 0, 0}, {"site_ten", 0, 0}};
    unsigned long long done = 0;
    while (done < total) {
        size_t size = mixed_size(small);
        /* Each byte goes to a site with the target odds. */
        unsigned r = (unsigned)(next_random() % 10);
        if (r < 6)
            site_sixty(&t[0], size);
        else if (r < 9)
            site_thirty(&t[1], size);
        else
            site_ten(&t[2], size);
        done += size;
    }
    for (int i = 0; i < 3; i++) printf("%s %llu %llu\n", t[i].name, t[i].alloc, t[i].inuse);
    return 0;
}
