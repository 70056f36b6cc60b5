/* threads: threads that come and go, leaving blocks that outlive them.
 *
 * --mode=handoff: --rounds rounds; each starts --threads threads and joins
 *   them. A thread allocates --work short-lived blocks of 16..--max bytes
 *   (kept in a window of 32, each freed when its place is reused), then
 *   --keep blocks of --size bytes that outlive it: each one replaces the
 *   block in a random place of a shared table of --slots places, and the
 *   block it replaces (left by an earlier thread, usually one that has
 *   exited) is checked and freed. With --work=0 --keep=1 --size=128 it is
 *   the shape of mimalloc-bench's mleak: peak RSS shows how much memory the
 *   few blocks each exited thread leaves behind pin.
 * --mode=pool: a pool whose size goes 1, 2, .., --threads, .., 2, 1 for
 *   --rounds waves: at each step as many threads start, each allocates and
 *   frees --work blocks of 16..--max bytes through a window of 256, hands
 *   --keep blocks to the shared table as above, and exits.
 * --mode=ring: --threads / 2 producer/consumer pairs, each pair joined by
 *   a ring of 256 places; a producer allocates --work blocks of 16..--max
 *   bytes, a consumer checks and frees them; the pairs exit and are
 *   started again for --rounds rounds.
 *
 * Each block carries a tag checked before its free. Figure: threads_per_sec
 * (thread starts per second); info: rounds, threads, seconds.
 */
#include "common.h"

#define WINDOW 32
#define POOL_WINDOW 256
#define RING 256

typedef struct {
    long mode, threads, rounds, work, keep, size, max, slots;
} params_t;

static params_t P;
static _Atomic(uint64_t) *table;          /* the shared places: block pointers */
static _Atomic(uint64_t) blocks_replaced; /* blocks checked and freed from the table */

typedef struct {
    PER_THREAD uint64_t id;
    rng_t rng;
    unsigned char *ring_blocks[RING];
    _Atomic(uint64_t) head, tail; /* ring: produced and consumed counts */
} worker_t;

static size_t block_size_of(rng_t *r) { return (size_t)rng_range(r, 16, (uint64_t)P.max); }

/* A block of `size` whose tag is the first word: the block's own address
 * and size, so whoever frees it can check it without a side table. */
static unsigned char *block_new(size_t size) {
    unsigned char *p = (unsigned char *)xmalloc(size);
    tag_put(p, size, tag_make((uint64_t)(uintptr_t)p, size));
    return p;
}

static void block_check_free(unsigned char *p, size_t size, const char *where) {
    if (!tag_ok(p, size, tag_make((uint64_t)(uintptr_t)p, size)))
        check_failed("threads: a %zu-byte block (%s) was overwritten", size, where);
    free(p);
}

/* Allocate and free `n` blocks through a window of `w` places. */
static void transient_work(worker_t *me, long n, size_t w) {
    unsigned char *win[POOL_WINDOW] = {0};
    size_t sizes[POOL_WINDOW] = {0};
    for (long i = 0; i < n; i++) {
        size_t k = (size_t)i % w;
        if (win[k]) block_check_free(win[k], sizes[k], "window");
        sizes[k] = block_size_of(&me->rng);
        win[k] = block_new(sizes[k]);
    }
    for (size_t k = 0; k < w; k++)
        if (win[k]) block_check_free(win[k], sizes[k], "window");
}

/* Leave `keep` blocks of P.size in the shared table; free what they replace. */
static void leave_blocks(worker_t *me) {
    for (long i = 0; i < P.keep; i++) {
        unsigned char *p = block_new((size_t)P.size);
        size_t place = (size_t)rng_below(&me->rng, (uint64_t)P.slots);
        unsigned char *old =
            (unsigned char *)(uintptr_t)atomic_exchange(&table[place], (uint64_t)(uintptr_t)p);
        if (old != NULL) {
            block_check_free(old, (size_t)P.size, "left by an exited thread");
            atomic_fetch_add(&blocks_replaced, 1);
        }
    }
}

static void *handoff_main(void *arg) {
    worker_t *me = (worker_t *)arg;
    transient_work(me, P.work, WINDOW);
    leave_blocks(me);
    return NULL;
}

static void *pool_main(void *arg) {
    worker_t *me = (worker_t *)arg;
    transient_work(me, P.work, POOL_WINDOW);
    leave_blocks(me);
    return NULL;
}

static void *producer_main(void *arg) {
    worker_t *me = (worker_t *)arg;
    for (long i = 0; i < P.work; i++) {
        uint64_t h = atomic_load_explicit(&me->head, memory_order_relaxed);
        while (h - atomic_load_explicit(&me->tail, memory_order_acquire) >= RING) sched_yield();
        me->ring_blocks[h % RING] = block_new(block_size_of(&me->rng));
        atomic_store_explicit(&me->head, h + 1, memory_order_release);
    }
    return NULL;
}

/* The consumer knows each block's size from the producer's random stream,
 * which it replays with the same seed. */
static void *consumer_main(void *arg) {
    worker_t *pair = (worker_t *)arg;
    rng_t replay;
    rng_seed(&replay, pair->id);
    for (long i = 0; i < P.work; i++) {
        uint64_t t = atomic_load_explicit(&pair->tail, memory_order_relaxed);
        while (atomic_load_explicit(&pair->head, memory_order_acquire) == t) sched_yield();
        block_check_free(pair->ring_blocks[t % RING], block_size_of(&replay), "ring");
        atomic_store_explicit(&pair->tail, t + 1, memory_order_release);
    }
    return NULL;
}

/* Start n threads of fn over workers[0..n), join them. Returns n. */
static long run_threads(worker_t *workers, pthread_t *tids, long n, void *(*fn)(void *),
                        uint64_t *next_id) {
    for (long i = 0; i < n; i++) {
        workers[i].id = ++*next_id;
        rng_seed(&workers[i].rng, workers[i].id);
        xthread_create(&tids[i], fn, &workers[i]);
    }
    for (long i = 0; i < n; i++) xthread_join(tids[i]);
    return n;
}

static long run_rings(worker_t *pairs, pthread_t *tids, long npairs, uint64_t *next_id) {
    for (long i = 0; i < npairs; i++) {
        pairs[i].id = ++*next_id;
        rng_seed(&pairs[i].rng, pairs[i].id);
        atomic_store(&pairs[i].head, 0);
        atomic_store(&pairs[i].tail, 0);
        xthread_create(&tids[2 * i], producer_main, &pairs[i]);
        xthread_create(&tids[2 * i + 1], consumer_main, &pairs[i]);
    }
    for (long i = 0; i < 2 * npairs; i++) xthread_join(tids[i]);
    return 2 * npairs;
}

int main(int argc, char **argv) {
    const char *mode = "handoff";
    long threads = 10, rounds = 500, work = 0, keep = 1, size = 128, max = 1024, slots = 1000;
    opt_t opts[] = {
        {"mode", "handoff, pool or ring", NULL, &mode},
        {"threads", "threads per round (pool: the largest size; ring: 2 per pair)", &threads, NULL},
        {"rounds", "rounds (pool: waves)", &rounds, NULL},
        {"work", "short-lived blocks per thread (ring: per pair)", &work, NULL},
        {"keep", "blocks each thread leaves in the shared table", &keep, NULL},
        {"size", "size of the blocks left in the table", &size, NULL},
        {"max", "largest short-lived block (bytes, >= 16)", &max, NULL},
        {"slots", "places of the shared table", &slots, NULL},
    };
    OPTS_PARSE(argc, argv, "Threads that come and go, leaving blocks that outlive them.", opts);
    P = (params_t){0, threads, rounds, work, keep, size, max, slots};
    P.mode = strcmp(mode, "handoff") == 0 ? 0
             : strcmp(mode, "pool") == 0  ? 1
             : strcmp(mode, "ring") == 0  ? 2
                                          : -1;
    if (P.mode < 0) usage_error("threads: --mode is handoff, pool or ring, not '%s'", mode);
    if (threads < 1 || slots < 1 || size < 16 || max < 16 || (P.mode == 2 && threads < 2))
        usage_error("threads: need threads >= 1 (ring: 2), slots >= 1, size >= 16, max >= 16");
    table = (_Atomic(uint64_t) *)calloc((size_t)slots, sizeof *table);
    worker_t *workers = (worker_t *)xmalloc_lines(sizeof(worker_t) * (size_t)threads);
    pthread_t *tids = (pthread_t *)xmalloc(sizeof(pthread_t) * (size_t)threads);
    if (table == NULL) out_of_memory((size_t)slots * 8);

    uint64_t next_id = 0;
    long started = 0;
    double t0 = now_sec();
    for (long r = 0; r < rounds; r++) {
        if (P.mode == 0) {
            started += run_threads(workers, tids, threads, handoff_main, &next_id);
        } else if (P.mode == 1) {
            for (long step = 1; step < 2 * threads; step++) {
                long n = step <= threads ? step : 2 * threads - step;
                started += run_threads(workers, tids, n, pool_main, &next_id);
            }
        } else {
            started += run_rings(workers, tids, threads / 2, &next_id);
        }
    }
    double elapsed = now_sec() - t0;
    uint64_t left = 0;
    for (long i = 0; i < slots; i++) {
        unsigned char *p = (unsigned char *)(uintptr_t)atomic_load(&table[i]);
        if (p == NULL) continue;
        block_check_free(p, (size_t)P.size, "left at the end");
        left++;
    }
    uint64_t kept = (uint64_t)(P.mode == 2 ? 0 : started) * (uint64_t)keep;
    if (left + atomic_load(&blocks_replaced) != kept)
        check_failed("threads: %llu blocks left, %llu replaced, %llu kept",
                     (unsigned long long)left, (unsigned long long)atomic_load(&blocks_replaced),
                     (unsigned long long)kept);
    free(table);
    free(workers);
    free(tids);
    report_malloc_lib();
    printf("info: mode=%s threads=%ld rounds=%ld work=%ld keep=%ld started=%ld seconds=%.4f\n",
           mode, threads, rounds, work, keep, started, elapsed);
    printf("result: threads_per_sec=%.1f\n", (double)started / (elapsed > 0 ? elapsed : 1e-9));
    return 0;
}
