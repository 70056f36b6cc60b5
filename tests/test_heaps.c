/* First-class heaps: destroy frees every block (pages, large and huge
 * blocks) at once; reset keeps the heap usable and reuses its memory;
 * blocks of a heap can be freed by plain free and from other threads; only
 * the owner thread may allocate from a heap (others get a clear error);
 * a heap's blocks outlive its thread. */
#define _GNU_SOURCE
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "stats_json.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
enum { SMALL = 20000 };

/* Fill a heap: small blocks, 5 large (1 MiB) and 2 huge (10 MiB). */
static void fill(coral_heap_t *heap, void **small, void **big) {
    tu_rng rng = {11};
    for (size_t i = 0; i < SMALL; i++) {
        size_t n = rng_range(&rng, 1, 3000);
        small[i] = coral_heap_malloc(heap, n);
        CHECK_NOT_NULL(small[i]);
        CHECK(coral_owns(small[i]));
        fill_pattern(small[i], n, i);
    }
    for (size_t i = 0; i < 7; i++) {
        big[i] = coral_heap_malloc(heap, i < 5 ? MiB : 10 * MiB);
        CHECK_NOT_NULL(big[i]);
        fill_pattern(big[i], 4096, i);
    }
}

static void test_destroy_frees_all(void) {
    static void *small[SMALL], *big[7];
    coral_collect(1);
    long long pages0 = stats_get("page_bytes"), huge0 = stats_get("huge_live");
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    fill(heap, small, big);
    CHECK_GE(stats_get("page_bytes"), pages0 + (long long)(5 * MiB));
    CHECK_EQ(stats_get("huge_live"), huge0 + 2);
    /* some blocks freed one by one first, by both names */
    for (size_t i = 0; i < SMALL; i += 3) coral_heap_free(heap, small[i]);
    for (size_t i = 1; i < SMALL; i += 3) coral_free(small[i]);
    coral_free(big[0]);
    coral_free(big[6]);
    coral_heap_destroy(heap);
    CHECK_EQ(stats_get("huge_live"), huge0);
    CHECK_LE(stats_get("page_bytes"), pages0);
}

static void test_reset_reuses(void) {
    static void *small[SMALL], *big[7];
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    fill(heap, small, big);
    coral_heap_reset(heap);
    long long mapped = stats_get("mapped");
    for (int round = 0; round < 5; round++) {
        fill(heap, small, big);
        for (size_t i = 0; i < SMALL; i++) CHECK_EQ(pattern_mismatch(small[i], 1, i), (size_t)-1);
        coral_heap_reset(heap);
    }
    /* The same memory served every round: nothing new was mapped (but for
     * a huge block the cache could not keep, at most two). */
    CHECK_LE(stats_get("mapped"), mapped + (long long)(24 * MiB));
    coral_heap_destroy(heap);
}

static void test_realloc_calloc(void) {
    coral_heap_t *heap = coral_heap_new();
    char *p = coral_heap_malloc(heap, 10);
    fill_pattern(p, 10, 5);
    for (size_t n = 20; n < 3 * MiB; n *= 3) {
        p = coral_heap_realloc(heap, p, n);
        CHECK_NOT_NULL(p);
        CHECK_EQ(pattern_mismatch(p, 10, 5), (size_t)-1);
    }
    unsigned char *z = coral_heap_calloc(heap, 100, 37);
    for (size_t i = 0; i < 3700; i++) CHECK_EQ(z[i], 0);
    CHECK_NULL(coral_heap_calloc(heap, SIZE_MAX / 2, 3));
    CHECK_NULL(coral_heap_realloc(heap, p, 0));
    coral_heap_destroy(heap);
    /* NULL is the thread's own heap */
    void *q = coral_heap_malloc(NULL, 64);
    CHECK_NOT_NULL(q);
    coral_heap_free(NULL, q);
}

/* Blocks of the owner's heap freed by other threads while the owner keeps
 * allocating from it; then destroyed with blocks still live elsewhere. */
#define HANDED 4000
static void *handed[HANDED];

static void *free_handed(void *arg) {
    size_t from = (size_t)(uintptr_t)arg;
    for (size_t i = from; i < HANDED; i += 2) {
        CHECK_EQ(pattern_mismatch(handed[i], 16, i), (size_t)-1);
        coral_free(handed[i]);
    }
    return NULL;
}

static void test_cross_thread_frees(void) {
    coral_heap_t *heap = coral_heap_new();
    for (size_t i = 0; i < HANDED; i++) {
        handed[i] = coral_heap_malloc(heap, 16 + i % 2000);
        fill_pattern(handed[i], 16, i);
    }
    pthread_t t[2];
    for (uintptr_t k = 0; k < 2; k++)
        CHECK_EQ(pthread_create(&t[k], NULL, free_handed, (void *)k), 0);
    void *more[1000];
    for (size_t i = 0; i < 1000; i++) {
        more[i] = coral_heap_malloc(heap, 16 + i);
        CHECK_NOT_NULL(more[i]);
    }
    for (int k = 0; k < 2; k++) CHECK_EQ(pthread_join(t[k], NULL), 0);
    coral_heap_destroy(heap);
}

/* A heap outlives nothing: its thread exits, its blocks stay valid. */
static void *make_and_exit(void *arg) {
    coral_heap_t *heap = coral_heap_new();
    void **out = arg;
    for (size_t i = 0; i < 100; i++) {
        out[i] = coral_heap_malloc(heap, 100 + i * 100);
        fill_pattern(out[i], 100, i);
    }
    out[100] = coral_heap_malloc(heap, 12 * MiB);
    return NULL;
}

static void test_blocks_outlive_thread(void) {
    void *blocks[101];
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, make_and_exit, blocks), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    for (size_t i = 0; i < 100; i++) {
        CHECK_EQ(pattern_mismatch(blocks[i], 100, i), (size_t)-1);
        coral_free(blocks[i]);
    }
    coral_free(blocks[100]);
}

/* Blocks a thread left when it exited (its segments abandoned) are adopted
 * by the next thread that needs a page: into that thread's own heap, even
 * when the page is wanted by a user heap, whose destroy must not free them. */
enum { LEFT = 3000, LEFT_SIZE = 100 };
static void *left[LEFT];

static void *leave_blocks(void *arg) {
    (void)arg;
    for (size_t i = 0; i < LEFT; i++) {
        CHECK_NOT_NULL(left[i] = coral_malloc(LEFT_SIZE));
        fill_pattern(left[i], LEFT_SIZE, i);
    }
    return NULL;
}

static void check_left_blocks(void) {
    for (size_t i = 0; i < LEFT; i++) {
        CHECK_GE(coral_malloc_usable_size(left[i]), LEFT_SIZE);
        CHECK_EQ(pattern_mismatch(left[i], LEFT_SIZE, i), (size_t)-1);
    }
}

static void *adopt_into_user_heap(void *arg) {
    (void)arg;
    enum { N = 3 * LEFT };
    void **p = malloc(N * sizeof *p);
    CHECK_NOT_NULL(p);
    coral_heap_t *heap = coral_heap_new();
    CHECK_NOT_NULL(heap);
    for (size_t i = 0; i < N; i++) CHECK_NOT_NULL(p[i] = coral_heap_malloc(heap, LEFT_SIZE));
    coral_heap_destroy(heap);
    check_left_blocks();
    /* The thread's own heap takes the pages the destroy freed: none of the
     * blocks left by the other thread is among them. */
    for (size_t i = 0; i < N; i++) {
        CHECK_NOT_NULL(p[i] = coral_malloc(LEFT_SIZE));
        fill_pattern(p[i], LEFT_SIZE, N + i);
    }
    check_left_blocks();
    for (size_t i = 0; i < N; i++) coral_free(p[i]);
    free(p);
    return NULL;
}

static void test_adopted_blocks_outlive_user_heap(void) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, leave_blocks, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_EQ(pthread_create(&t, NULL, adopt_into_user_heap, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    for (size_t i = 0; i < LEFT; i++) coral_free(left[i]);
}

/* Another thread allocating from a heap gets a clear error. */
static coral_heap_t *foreign;
static void *alloc_foreign(void *arg) {
    (void)arg;
    return coral_heap_malloc(foreign, 10);
}

static __attribute__((unused)) void test_foreign_thread_refused(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 2);
        foreign = coral_heap_new();
        pthread_t t;
        pthread_create(&t, NULL, alloc_foreign, NULL);
        pthread_join(t, NULL);
        _exit(0); /* not reached */
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

int main(void) {
    test_destroy_frees_all();
    test_reset_reuses();
    test_realloc_calloc();
    test_cross_thread_frees();
    test_blocks_outlive_thread();
    test_adopted_blocks_outlive_user_heap();
#ifndef CORAL_TEST_TSAN
    test_foreign_thread_refused(); /* fork + thread: not under TSan */
#endif
    printf("heaps: ok\n");
    return 0;
}
