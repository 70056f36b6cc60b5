/* The heap profiler's bookkeeping (src/api/profile.h), through the coral_
 * API, in every configuration and in the secure build.
 *
 * Run with CORALLOC_PROFILE=FILE and CORALLOC_PROFILE_RATE=1 (ctest sets
 * them): every allocation is then sampled (a block of s >= 1 bytes is
 * sampled with probability 1 - e^-s, above 0.63; the tests ask for 16
 * bytes or more, so 1 - e^-16), so coral_profile_live must follow every
 * allocation and free exactly. Each test returns to the live count it started from: the free of a
 * sampled block (any thread's, bulk, realloc's, a heap's destroy) forgot it. The signal and
 * thread-exit tests end only if no sampled allocation deadlocks there.
 *
 * With the argument "off" (no CORALLOC_PROFILE): profiling is off, and
 * coral_profile_dump says so (ENOTSUP). With "default_rate" (at the default
 * rate, where most allocations are counted, not sampled): the pages of
 * threads that exit go once their blocks are freed, coral_heap_visit
 * reports the blocks held and no other, and a malloc gets the block freed
 * last back. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "testutil.h"

static unsigned long long live_blocks(void) {
    unsigned long long n;
    coral_profile_live(&n, NULL);
    return n;
}

static unsigned long long live_bytes(void) {
    unsigned long long b;
    coral_profile_live(NULL, &b);
    return b;
}

/* Sizes of every kind: small (direct[] classes), medium, large, huge; at
 * least 16 bytes, so that each is sampled (1 - e^-16) in the secure build
 * too, which counts by size. */
static const size_t sizes[] = {17, 16, 100, 1000, 1024, 1500, 9000, 70000, 300000, 5 << 20};
#define NSIZES (sizeof sizes / sizeof *sizes)

static void test_every_size(void) {
    unsigned long long n0 = live_blocks(), b0 = live_bytes();
    void *p[NSIZES];
    size_t total = 0;
    for (size_t i = 0; i < NSIZES; i++) {
        p[i] = opaque(coral_malloc(sizes[i]));
        CHECK(p[i] != NULL);
        total += sizes[i];
    }
    CHECK(live_blocks() == n0 + NSIZES);
    CHECK(live_bytes() == b0 + total);
    for (size_t i = 0; i < NSIZES; i++) coral_free(p[i]);
    CHECK(live_blocks() == n0);
    CHECK(live_bytes() == b0);
}

static void test_calloc_realloc(void) {
    unsigned long long n0 = live_blocks(), b0 = live_bytes();
    char *p = opaque(coral_calloc(10, 10));
    CHECK(p != NULL && p[99] == 0);
    CHECK(live_bytes() == b0 + 100);
    /* realloc that moves: the old block forgotten, the new one sampled. */
    char *q = opaque(coral_realloc(p, 50000));
    CHECK(q != NULL && q != p);
    CHECK(live_blocks() == n0 + 1 && live_bytes() == b0 + 50000);
    q = opaque(coral_realloc(q, 200)); /* shrinks by more than half: moves */
    CHECK(live_blocks() == n0 + 1 && live_bytes() == b0 + 200);
    coral_free(q);
    CHECK(live_blocks() == n0 && live_bytes() == b0);
}

/* A huge block resized by realloc (grown where it lies, or moved with its
 * pages): its record follows it, and its free forgets it. */
static void test_huge_realloc(void) {
    unsigned long long n0 = live_blocks(), b0 = live_bytes();
    char *p = opaque(coral_malloc(5 << 20));
    CHECK(p != NULL);
    CHECK(live_blocks() == n0 + 1 && live_bytes() == b0 + (5 << 20));
    char *q = opaque(coral_realloc(p, 40 << 20));
    CHECK(q != NULL);
    CHECK_MSG(live_blocks() == n0 + 1 && live_bytes() == b0 + (40 << 20),
              "after the realloc: %llu sampled blocks of %llu bytes live, expected 1 of 40 MiB",
              live_blocks() - n0, live_bytes() - b0);
    q = opaque(coral_realloc(q, 6 << 20));
    CHECK(q != NULL && live_bytes() == b0 + (6 << 20));
    coral_free(q);
    CHECK_MSG(live_blocks() == n0 && live_bytes() == b0, "%llu sampled blocks left after the free",
              live_blocks() - n0);
}

static void test_aligned(void) {
    unsigned long long n0 = live_blocks(), b0 = live_bytes();
    void *a = opaque(coral_aligned_alloc(64, 100));
    void *b = NULL;
    CHECK(a != NULL && ((uintptr_t)a & 63) == 0);
    CHECK(coral_posix_memalign(&b, 4096, 10000) == 0 && ((uintptr_t)b & 4095) == 0);
    void *c = opaque(coral_aligned_alloc(1 << 20, 3 << 20)); /* huge, aligned */
    CHECK(c != NULL);
    CHECK(live_blocks() == n0 + 3 && live_bytes() == b0 + 100 + 10000 + (3 << 20));
    coral_free(a);
    coral_free(b);
    coral_free(c);
    CHECK(live_blocks() == n0 && live_bytes() == b0);
}

static void test_bulk(void) {
    unsigned long long n0 = live_blocks();
    void *p[200];
    size_t s[200];
    CHECK(coral_malloc_bulk(48, 200, p) == 200);
    CHECK(live_blocks() == n0 + 200);
    coral_free_bulk(p, 200);
    CHECK(live_blocks() == n0);
    for (size_t i = 0; i < 200; i++) s[i] = 16 + i * 37;
    CHECK(coral_malloc_bulk_sizes(s, 200, p) == 200);
    CHECK(live_blocks() == n0 + 200);
    coral_free_bulk(p, 200);
    CHECK(live_blocks() == n0);
}

static void test_heaps(void) {
    unsigned long long n0 = live_blocks();
    coral_heap_t *h = coral_heap_new();
    CHECK(h != NULL);
    for (size_t i = 0; i < 300; i++) CHECK(coral_heap_malloc(h, sizes[i % NSIZES]) != NULL);
    CHECK(live_blocks() == n0 + 300);
    coral_heap_reset(h); /* its blocks go at once: their records too */
    CHECK(live_blocks() == n0);
    void *p = coral_heap_malloc(h, 40);
    CHECK(p != NULL && live_blocks() == n0 + 1);
    coral_heap_free(h, p);
    CHECK(live_blocks() == n0);
    for (size_t i = 0; i < 100; i++) CHECK(coral_heap_calloc(h, 1, 24) != NULL);
    coral_heap_destroy(h);
    CHECK(live_blocks() == n0);
}

/* ---- threads: blocks freed by other threads ----------------------------------- */

#define XT_THREADS 4
#define XT_BLOCKS 5000

static void *xt_blocks[XT_THREADS][XT_BLOCKS];
static pthread_barrier_t xt_barrier;

static void *xt_worker(void *arg) {
    size_t me = (size_t)arg;
    for (size_t i = 0; i < XT_BLOCKS; i++) {
        xt_blocks[me][i] = coral_malloc(sizes[i % 6]);
        CHECK(xt_blocks[me][i] != NULL);
    }
    pthread_barrier_wait(&xt_barrier);
    size_t other = (me + 1) % XT_THREADS; /* frees its neighbour's blocks */
    for (size_t i = 0; i < XT_BLOCKS; i++) coral_free(xt_blocks[other][i]);
    return NULL;
}

static void test_cross_thread_frees(void) {
    unsigned long long n0 = live_blocks();
    pthread_t t[XT_THREADS];
    pthread_barrier_init(&xt_barrier, NULL, XT_THREADS);
    for (size_t i = 0; i < XT_THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, xt_worker, (void *)i) == 0);
    for (size_t i = 0; i < XT_THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&xt_barrier);
    CHECK(live_blocks() == n0);
}

/* ---- a thread's exit: sampled allocations in a key destructor ------------------ */

static pthread_key_t exit_key;
static _Atomic(int) exit_destructors;

static void exit_destructor(void *value) {
    coral_free(value);
    void *p = coral_malloc(200); /* sampled, after the thread's heap may be gone */
    CHECK(p != NULL);
    coral_free(p);
    atomic_fetch_add(&exit_destructors, 1);
}

static void *exit_worker(void *arg) {
    (void)arg;
    void *kept = coral_malloc(64);
    CHECK(kept != NULL);
    pthread_setspecific(exit_key, kept);
    for (int i = 0; i < 1000; i++) coral_free(coral_malloc(16 + i % 900));
    return NULL; /* the key's destructor frees kept */
}

static void test_thread_exit(void) {
    unsigned long long n0 = live_blocks();
    CHECK(pthread_key_create(&exit_key, exit_destructor) == 0);
    for (int round = 0; round < 20; round++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, exit_worker, NULL) == 0);
        pthread_join(t, NULL);
    }
    CHECK(atomic_load(&exit_destructors) == 20);
    CHECK(live_blocks() == n0);
}

/* ---- the exit heap: allocations after the thread's cleanup ------------------------ */

/* A key made after coralloc's (the process was set up first): glibc runs
 * its destructor after coralloc's in the same round, once the thread's
 * heaps are abandoned, so its allocations come from the exit heap
 * (src/heap/thread.c). Each is sampled and its free forgets it, by the
 * exiting thread itself or by another after the join. */
static pthread_key_t late_key;
static void *late_blocks[NSIZES + 2];
static unsigned long long late_live_before, late_live_after;

static void late_destructor(void *value) {
    (void)value;
    late_live_before = live_blocks();
    for (size_t i = 0; i < NSIZES; i++) {
        late_blocks[i] = opaque(coral_malloc(sizes[i]));
        CHECK(late_blocks[i] != NULL);
    }
    late_blocks[NSIZES] = coral_aligned_alloc(4096, 5000);
    late_blocks[NSIZES + 1] = opaque(coral_calloc(10, 30));
    CHECK(late_blocks[NSIZES] != NULL && late_blocks[NSIZES + 1] != NULL);
    late_live_after = live_blocks();
    for (size_t i = 0; i < NSIZES + 2; i += 2) { /* half freed here, by the exiting thread */
        coral_free(late_blocks[i]);
        late_blocks[i] = NULL;
    }
}

static void *late_worker(void *arg) {
    (void)arg;
    coral_free(coral_malloc(100)); /* the thread's own heap set up */
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

static void test_exit_heap(void) {
    unsigned long long n0 = live_blocks();
    CHECK(pthread_key_create(&late_key, late_destructor) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, late_worker, NULL) == 0);
    pthread_join(t, NULL);
    CHECK(late_live_after == late_live_before + NSIZES + 2);
    CHECK(live_blocks() == n0 + (NSIZES + 2) / 2);
    for (size_t i = 1; i < NSIZES + 2; i += 2) coral_free(late_blocks[i]); /* the rest, here */
    CHECK(live_blocks() == n0);
    pthread_key_delete(late_key);
}

/* ---- a profiled thread's exit leaves no page in use ---------------------------- */

/* A number of coral_stats_json's, by its key (with its quotes and colon). */
static unsigned long long stats_field(const char *key) {
    char json[8192];
    coral_stats_json(json, sizeof json);
    const char *at = strstr(json, key);
    CHECK(at != NULL);
    return strtoull(at + strlen(key), NULL, 10);
}

/* Bytes in pages in use. */
static unsigned long long page_bytes(void) { return stats_field("\"page_bytes\":"); }

static void *class_pages_worker(void *arg) {
    (void)arg;
    void *p[64];
    for (size_t size = 16; size <= 1024; size += 16) {
        for (int i = 0; i < 64; i++) CHECK((p[i] = opaque(coral_malloc(size))) != NULL);
        for (int i = 0; i < 64; i++) coral_free(p[i]);
    }
    return NULL;
}

/* Each thread allocates from every small class and frees all it
 * allocates: every page it took goes at its exit, none stays in use. */
static void test_thread_exit_pages(void) {
    unsigned long long before = page_bytes();
    for (int round = 0; round < 32; round++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, class_pages_worker, NULL) == 0);
        pthread_join(t, NULL);
    }
    coral_collect(1);
    unsigned long long after = page_bytes();
    CHECK_LE(after, before + (64ull << 10)); /* less than one page */
}

/* ---- threads that only free give their records back ------------------------------ */

/* Bytes the allocator has mapped. */
static unsigned long long mapped_bytes(void) { return stats_field("\"mapped\":"); }

#define FREE_ONLY_BLOCKS 32
static void *free_only_worker(void *arg) {
    void **p = arg;
    for (int i = 0; i < FREE_ONLY_BLOCKS; i++) coral_free(p[i]);
    return NULL;
}

/* At rate 1 every block is sampled; a thread that frees them and never
 * allocates has no heap, so no exit hook: the records of its frees must go
 * back to the profiler's pool at once. Kept by such threads, the 400
 * rounds below would strand 800 KiB of records and map 3 more pool chunks
 * of 256 KiB. */
static void test_free_only_threads(void) {
    void *p[FREE_ONLY_BLOCKS];
    unsigned long long before = 0;
    for (int round = 0; round < 400; round++) {
        if (round == 8) before = mapped_bytes();
        for (int i = 0; i < FREE_ONLY_BLOCKS; i++) CHECK((p[i] = opaque(coral_malloc(64))) != NULL);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, free_only_worker, p) == 0);
        pthread_join(t, NULL);
    }
    CHECK_LE(mapped_bytes(), before + (256ull << 10));
}

/* ---- coral_heap_visit of a profiled heap: the blocks held, no other --------------- */

static void *held[64];

static int visit_held(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block_size;
    (void)usable;
    int *seen = arg;
    for (int i = 0; i < 64; i++)
        if (held[i] == block) {
            seen[i]++;
            return 0;
        }
    seen[64]++; /* a block not held */
    return 0;
}

static void *visit_worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 64; i++) CHECK((held[i] = opaque(coral_malloc(48))) != NULL);
    for (int i = 0; i < 64; i += 2) {
        coral_free(held[i]);
        held[i] = NULL;
    }
    int seen[65] = {0};
    CHECK(coral_heap_visit(NULL, visit_held, seen) == 0);
    for (int i = 0; i < 64; i++) CHECK(seen[i] == (held[i] != NULL));
    CHECK(seen[64] == 0);
    for (int i = 1; i < 64; i += 2) coral_free(held[i]);
    return NULL;
}

/* A profiled thread's heap with half its blocks of a class freed: the walk
 * reports the blocks held, no more. */
static void test_visit_held(void) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, visit_worker, NULL) == 0);
    pthread_join(t, NULL);
}

/* ---- a profiled heap reuses the block freed last ----------------------------------- */

/* As with profiling off, a malloc after a free of its size class gets the
 * block just freed back: the profiler counts it without changing which
 * block is handed out (a sample too is the block the heap would hand
 * out). */
static void test_reuse_freed_last(void) {
    for (size_t size = 16; size <= 1024; size += 16) {
        void *keep = opaque(coral_malloc(size)); /* (the page stays in use) */
        void *p = opaque(coral_malloc(size));
        CHECK(keep != NULL && p != NULL);
        for (int i = 0; i < 8; i++) {
            coral_free(p);
            void *q = opaque(coral_malloc(size));
            CHECK_MSG(q == p, "size %zu: the block freed last was not handed out again", size);
            p = q;
        }
        coral_free(p);
        coral_free(keep);
    }
}

/* ---- signals: a handler's malloc on a thread that allocates -------------------- */

#define SIGNALS_WANTED 2000

static _Atomic(int) handled, stop_allocating;

static void on_signal(int sig) {
    (void)sig;
    int saved = errno;
    void *p = coral_malloc(100); /* sampled: the profiler's locks must be free here */
    if (p != NULL) coral_free(p);
    atomic_fetch_add(&handled, 1);
    errno = saved;
}

static void *signal_target(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_allocating)) {
        void *p = coral_malloc(24);
        void *q = coral_malloc(2000);
        coral_free(p);
        coral_free(q);
    }
    return NULL;
}

static void test_signal_handler(void) {
    unsigned long long n0 = live_blocks();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, signal_target, NULL) == 0);
    /* Each signal interrupts the allocating thread wherever it is; the
     * loop ends once SIGNALS_WANTED handlers have run. */
    while (atomic_load(&handled) < SIGNALS_WANTED) {
        pthread_kill(t, SIGUSR1);
        sched_yield();
    }
    atomic_store(&stop_allocating, 1);
    pthread_join(t, NULL);
    CHECK(live_blocks() == n0);
}

/* ---- fork: the child's profile follows its own frees --------------------------- */

static void test_fork(void) {
    void *kept = coral_malloc(777);
    CHECK(kept != NULL);
    unsigned long long n0 = live_blocks();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* The child inherits the records; its frees and allocations work. */
        int ok = live_blocks() == n0;
        coral_free(kept);
        ok &= live_blocks() == n0 - 1;
        void *p = coral_malloc(5000);
        ok &= p != NULL && live_blocks() == n0;
        coral_free(p);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    coral_free(kept);
    CHECK(live_blocks() == n0 - 1);
}

/* ---- dumps while threads sample and free ------------------------------------------ */

/* Each dump publishes the running threads' tallies while they add to them
 * and evict entries (many sites: sizes x call sites); under TSan this is
 * the tally protocol's race check (src/api/profile.c, "tallies"). */
#define DW_THREADS 3
static _Atomic(int) dw_running;

static __attribute__((noinline)) void *dw_alloc_a(size_t n) { return coral_malloc(n); }
static __attribute__((noinline)) void *dw_alloc_b(size_t n) { return coral_malloc(n); }

static void *dw_worker(void *arg) {
    (void)arg;
    void *kept[64] = {0};
    for (int i = 0; i < 4000; i++) {
        size_t k = (size_t)i % 64;
        coral_free(kept[k]);
        kept[k] = (i & 1) ? dw_alloc_a(sizes[i % 6]) : dw_alloc_b(sizes[i % 6]);
        CHECK(kept[k] != NULL);
    }
    for (size_t k = 0; k < 64; k++) coral_free(kept[k]);
    atomic_fetch_sub(&dw_running, 1);
    return NULL;
}

static void test_dump_while_sampling(const char *path) {
    unsigned long long n0 = live_blocks();
    pthread_t t[DW_THREADS];
    atomic_store(&dw_running, DW_THREADS);
    for (size_t i = 0; i < DW_THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, dw_worker, NULL) == 0);
    int dumps = 0;
    while ((atomic_load(&dw_running) > 0 && dumps < 8) || dumps < 2) {
        CHECK(coral_profile_dump(path) == 0);
        dumps++;
    }
    for (size_t i = 0; i < DW_THREADS; i++) pthread_join(t[i], NULL);
    remove(path);
    CHECK(live_blocks() == n0);
}

static void test_dump(const char *path) {
    CHECK(coral_profile_dump(path) == 0);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    unsigned char head[2] = {0, 0};
    CHECK(fread(head, 1, 2, f) == 2);
    fclose(f);
    /* Field 1 (sample_type), length-delimited: the Profile message. */
    CHECK(head[0] == 0x0a);
    remove(path);
    CHECK(coral_profile_dump("") == -1 && errno == EINVAL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "off") == 0) {
        CHECK(getenv("CORALLOC_PROFILE") == NULL);
        void *p = coral_malloc(100);
        CHECK(coral_profile_dump("/nonexistent/never") == -1 && errno == ENOTSUP);
        CHECK(live_blocks() == 0);
        coral_free(p);
        puts("test_profile off: ok");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "free_only") == 0) {
        /* (Alone in its process: no earlier test's freed records in the pool.) */
        CHECK(getenv("CORALLOC_PROFILE") != NULL);
        test_free_only_threads();
        puts("test_profile free_only: ok");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "default_rate") == 0) {
        /* (At the default rate: most allocations counted, few sampled.) */
        CHECK(getenv("CORALLOC_PROFILE") != NULL && getenv("CORALLOC_PROFILE_RATE") == NULL);
        test_thread_exit_pages();
        test_visit_held();
        test_reuse_freed_last();
        puts("test_profile default_rate: ok");
        return 0;
    }
    const char *base = getenv("CORALLOC_PROFILE");
    CHECK(base != NULL);
    coral_free(coral_malloc(1)); /* the process set up: profiling on */
    unsigned long long n0 = live_blocks();
    test_every_size();
    test_calloc_realloc();
    test_huge_realloc();
    test_aligned();
    test_bulk();
    test_heaps();
    test_cross_thread_frees();
    test_thread_exit();
    test_exit_heap();
    test_signal_handler();
    test_fork();
    char path[4096];
    snprintf(path, sizeof path, "%s.dump", base);
    test_dump_while_sampling(path);
    test_dump(path);
    CHECK(live_blocks() == n0);
    puts("test_profile: ok");
    return 0;
}
