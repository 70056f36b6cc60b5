/* test_threads: cross-thread frees and thread churn through the coral_ API
 * (every configuration; the main TSan test).
 *
 * Phase 1: W worker threads (more than the cores) allocate random sizes
 * (1 B .. 64 KiB, some 128 KiB .. 4 MiB), fill each block with a pattern
 * derived from its id, keep some, realloc some, and hand others over through
 * shared lock-protected queues; any thread pops blocks, checks the pattern
 * and frees them, so most frees are remote.
 * Phase 2: thread churn: waves of short-lived threads, each allocating,
 * freeing blocks left by dead threads and leaving some of its own for
 * others, while two long-lived workers keep popping and freeing.
 * At the end every block was checked and freed exactly once (counters).
 *
 * Scale: CORAL_TEST_SCALE=<percent> in the environment (default 100; the
 * TSan build divides phase 1 by 4 and the churn by 2, the ASan build
 * divides phase 1 by 2).
 */
#define _GNU_SOURCE
#include "coralloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

/* Work divisors of the sanitizer builds: phase 1, phase 2 (churn). */
#if defined(CORAL_TEST_TSAN)
#define BUILD_DIVISOR 4
#define CHURN_DIVISOR 2
#elif defined(CORAL_TEST_ASAN)
#define BUILD_DIVISOR 2
#define CHURN_DIVISOR 1
#else
#define BUILD_DIVISOR 1
#define CHURN_DIVISOR 1
#endif

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

enum { NQUEUES = 4, QCAP = 2048, NWORKERS = 6, LOCAL = 64 };

typedef struct {
    void *p;
    size_t size; /* requested */
    uint64_t id; /* pattern seed; the top bits name the allocating thread */
} item;

typedef struct {
    pthread_mutex_t lock;
    size_t head, count;
    item slots[QCAP];
} queue;

static queue queues[NQUEUES];
static atomic_ullong n_alloc, n_free, n_remote_free, n_realloc;
static atomic_int stop_consumers;
static atomic_uint next_thread_id;
static long scale_percent = 100;

static long scaled(long n, long divisor) {
    long v = n * scale_percent / 100 / divisor;
    return v < 1 ? 1 : v;
}

static int q_push(queue *q, item it) {
    int ok = 0;
    CHECK_EQ(pthread_mutex_lock(&q->lock), 0);
    if (q->count < QCAP) {
        q->slots[(q->head + q->count) % QCAP] = it;
        q->count++;
        ok = 1;
    }
    CHECK_EQ(pthread_mutex_unlock(&q->lock), 0);
    return ok;
}

static int q_pop(queue *q, item *out) {
    int ok = 0;
    CHECK_EQ(pthread_mutex_lock(&q->lock), 0);
    if (q->count > 0) {
        *out = q->slots[q->head];
        q->head = (q->head + 1) % QCAP;
        q->count--;
        ok = 1;
    }
    CHECK_EQ(pthread_mutex_unlock(&q->lock), 0);
    return ok;
}

typedef struct {
    unsigned tid;
    uint64_t counter;
    tu_rng rng;
} tctx;

static void ctx_init(tctx *c) {
    c->tid = atomic_fetch_add(&next_thread_id, 1) + 1;
    c->counter = 0;
    c->rng.s = 0x1234567ull * c->tid;
}

static unsigned item_owner(const item *it) { return (unsigned)(it->id >> 40); }

static size_t random_size(tu_rng *r) {
    if (rng_range(r, 0, 999) < 2) /* 0.2%: large */
        return rng_range(r, 128 * KiB, 4 * MiB);
    size_t e = rng_range(r, 0, 16); /* log-uniform 1 .. 64 KiB */
    return rng_range(r, 1, (size_t)1 << e);
}

static item new_block(tctx *c) {
    item it;
    it.size = random_size(&c->rng);
    it.id = ((uint64_t)c->tid << 40) | ++c->counter;
    int kind = (int)rng_range(&c->rng, 0, 9);
    if (kind == 0) {
        it.p = coral_calloc(1, it.size);
        CHECK_MSG(it.p != NULL, "calloc(%zu) failed\n", it.size);
        CHECK_BYTES(it.p, it.size, 0);
    } else if (kind == 1) {
        size_t al = (size_t)16 << rng_range(&c->rng, 0, 8);
        it.p = coral_aligned_alloc(al, it.size);
        CHECK_MSG(it.p != NULL, "aligned_alloc(%zu, %zu) failed\n", al, it.size);
        CHECK_ALIGNED(it.p, al);
    } else {
        it.p = coral_malloc(it.size);
        CHECK_MSG(it.p != NULL, "malloc(%zu) failed\n", it.size);
    }
    CHECK_ALIGNED(it.p, 16);
    CHECK_GE(coral_malloc_usable_size(it.p), it.size);
    fill_pattern(it.p, it.size, it.id);
    atomic_fetch_add_explicit(&n_alloc, 1, memory_order_relaxed);
    return it;
}

static void free_block(tctx *c, item *it) {
    CHECK_PATTERN(it->p, it->size, it->id);
    CHECK(coral_owns(it->p));
    if (item_owner(it) != c->tid)
        atomic_fetch_add_explicit(&n_remote_free, 1, memory_order_relaxed);
    if (it->id & 1)
        coral_free_sized(it->p, it->size);
    else
        coral_free(it->p);
    it->p = NULL;
    atomic_fetch_add_explicit(&n_free, 1, memory_order_relaxed);
}

static void realloc_block(tctx *c, item *it) {
    size_t ns = random_size(&c->rng);
    void *q = coral_realloc(it->p, ns);
    CHECK_MSG(q != NULL, "realloc(%zu -> %zu) failed\n", it->size, ns);
    CHECK_ALIGNED(q, 16);
    CHECK_PATTERN(q, it->size < ns ? it->size : ns, it->id);
    it->p = q;
    it->size = ns;
    /* a new id: the block now belongs to this thread's numbering */
    it->id = ((uint64_t)c->tid << 40) | ++c->counter;
    fill_pattern(it->p, it->size, it->id);
    atomic_fetch_add_explicit(&n_realloc, 1, memory_order_relaxed);
}

/* Hand a block to the shared queues; when they are full, free it here. */
static void hand_over(tctx *c, item it) {
    if (!q_push(&queues[rng_range(&c->rng, 0, NQUEUES - 1)], it)) free_block(c, &it);
}

static int take_one(tctx *c) {
    item it;
    unsigned q0 = (unsigned)rng_range(&c->rng, 0, NQUEUES - 1);
    for (unsigned k = 0; k < NQUEUES; k++)
        if (q_pop(&queues[(q0 + k) % NQUEUES], &it)) {
            free_block(c, &it);
            return 1;
        }
    return 0;
}

/* The mixed loop of phase 1 (and of the long-lived threads of phase 2). */
static void work(tctx *c, long iters, int until_stopped) {
    item local[LOCAL];
    int nlocal = 0;
    for (long i = 0; until_stopped ? !atomic_load(&stop_consumers) : i < iters; i++) {
        int r = (int)rng_range(&c->rng, 0, 99);
        if (r < 45) {
            item it = new_block(c);
            if (nlocal < LOCAL && rng_range(&c->rng, 0, 2) == 0)
                local[nlocal++] = it;
            else
                hand_over(c, it);
        } else if (r < 85) {
            take_one(c);
        } else if (nlocal > 0) {
            int j = (int)rng_range(&c->rng, 0, (size_t)nlocal - 1);
            if (r < 92) {
                realloc_block(c, &local[j]);
            } else if (r < 96) {
                hand_over(c, local[j]);
                local[j] = local[--nlocal];
            } else {
                free_block(c, &local[j]);
                local[j] = local[--nlocal];
            }
        }
        if ((i & 8191) == 8191) coral_collect((int)(i >> 13) & 1);
    }
    /* leave half of what is left for others */
    for (int j = 0; j < nlocal; j++) {
        if (j % 2)
            hand_over(c, local[j]);
        else
            free_block(c, &local[j]);
    }
}

static long phase1_iters;

static void *worker_main(void *arg) {
    (void)arg;
    tctx c;
    ctx_init(&c);
    work(&c, phase1_iters, 0);
    return NULL;
}

static void *consumer_main(void *arg) {
    (void)arg;
    tctx c;
    ctx_init(&c);
    work(&c, 0, 1);
    return NULL;
}

/* A short-lived thread: allocates a few hundred blocks, frees some blocks
 * that others (often dead threads) left, leaves some of its own. */
static void *churn_main(void *arg) {
    (void)arg;
    tctx c;
    ctx_init(&c);
    enum { K = 128 };
    item mine[K];
    for (int i = 0; i < K; i++) mine[i] = new_block(&c);
    for (int i = 0; i < K / 2; i++) take_one(&c);
    for (int i = 0; i < K; i++) {
        if (i % 3 == 0)
            free_block(&c, &mine[i]);
        else
            hand_over(&c, mine[i]);
    }
    /* and some left in this thread's heap while it dies */
    for (int i = 0; i < 16; i++) hand_over(&c, new_block(&c));
    return NULL;
}

static void drain(tctx *c) {
    while (take_one(c))
        ;
}

int main(void) {
    const char *env = getenv("CORAL_TEST_SCALE");
    if (env && *env) {
        char *end;
        scale_percent = strtol(env, &end, 10);
        CHECK_MSG(*end == 0 && scale_percent > 0,
                  "CORAL_TEST_SCALE must be a positive percentage, not '%s'\n", env);
    }
    for (int q = 0; q < NQUEUES; q++) CHECK_EQ(pthread_mutex_init(&queues[q].lock, NULL), 0);

    double t0 = now_seconds();
    tctx mainc;
    ctx_init(&mainc);

    /* phase 1 */
    phase1_iters = scaled(100000, BUILD_DIVISOR);
    pthread_t th[NWORKERS];
    for (int i = 0; i < NWORKERS; i++) CHECK_EQ(pthread_create(&th[i], NULL, worker_main, NULL), 0);
    for (int i = 0; i < NWORKERS; i++) CHECK_EQ(pthread_join(th[i], NULL), 0);
    double t1 = now_seconds();
    printf("phase 1: %d threads x %ld iterations: %.2f s\n", NWORKERS, phase1_iters, t1 - t0);
    fflush(stdout);

    /* phase 2 */
    pthread_t cons[2];
    for (int i = 0; i < 2; i++) CHECK_EQ(pthread_create(&cons[i], NULL, consumer_main, NULL), 0);
    long waves = scaled(100, CHURN_DIVISOR);
    int threads_made = 0;
    for (long w = 0; w < waves; w++) {
        pthread_t ch[4];
        for (int i = 0; i < 4; i++) CHECK_EQ(pthread_create(&ch[i], NULL, churn_main, NULL), 0);
        for (int i = 0; i < 4; i++) CHECK_EQ(pthread_join(ch[i], NULL), 0);
        threads_made += 4;
        if (w % 16 == 15) coral_collect(1);
    }
    atomic_store(&stop_consumers, 1);
    for (int i = 0; i < 2; i++) CHECK_EQ(pthread_join(cons[i], NULL), 0);
    double t2 = now_seconds();
    printf("phase 2: %d short-lived threads in %ld waves: %.2f s\n", threads_made, waves, t2 - t1);

    drain(&mainc);
    coral_collect(1);

    unsigned long long a = atomic_load(&n_alloc), f = atomic_load(&n_free),
                       rf = atomic_load(&n_remote_free), rr = atomic_load(&n_realloc);
    printf("blocks: %llu allocated, %llu freed (%llu by another thread), "
           "%llu reallocs\n",
           a, f, rf, rr);
    CHECK_EQ(a, f);
    CHECK_GT(rf, a / 4); /* the test really exercised remote frees */

    /* The allocator still works normally on the main thread. */
    void *p = coral_malloc(1000);
    CHECK_NOT_NULL(p);
    fill_pattern(p, 1000, 1);
    CHECK_PATTERN(p, 1000, 1);
    coral_free(p);
    printf("test_threads: all passed in %.2f s\n", now_seconds() - t0);
    return 0;
}
