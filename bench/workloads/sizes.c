/* sizes: size mixes and migrations that mimalloc-bench's tests have and our
 * other workloads lack (docs/BENCHMARKS.md, "Our suite and theirs").
 *
 * --mode=random: each of --threads threads keeps --slots blocks whose sizes
 *   are drawn log-uniformly from [--min, --max]; each op frees the block in
 *   a random slot and puts a new one there. One freed block in --cross (0:
 *   none) goes instead to the next thread through a ring and is freed there
 *   (by its owner when the ring is full). The shape of rpmalloc's rptest:
 *   random sizes up to 16 KiB, some frees by another thread.
 * --mode=pareto: as random, with sizes from a Pareto distribution (shape
 *   --alpha / 10, scale --min, redrawn above --max): many small blocks, a
 *   heavy tail of large ones, each thread its own working set. The shape of
 *   alloc-test.
 * --mode=migrate: --rounds phases; each starts --threads threads that share
 *   one table of --slots places and one of --slots / 16 long-lived places.
 *   Each op puts a block of a power-of-two size (16 to --max) into a random
 *   place of the first table (one op in 64: of the long-lived one) and
 *   frees the block it displaces, usually another thread's, often one of a
 *   thread of an earlier phase. Every thread ends with its phase. The
 *   shape of mstress: migration with thread turnover.
 *
 * Every block carries its size in its second word and a tag of its address
 * and size in its first (and, above 16 bytes, in its last byte), checked
 * before its free. Figure:
 * ops_per_sec (blocks allocated per second); info: threads, ops, seconds.
 */
#include "common.h"

#include <math.h>
#include <stdbool.h>

#define RING 256
#define LONG_LIVED_EVERY 64

enum { MODE_RANDOM, MODE_PARETO, MODE_MIGRATE };

typedef struct {
    long mode, threads, rounds, ops, slots, min, max, cross, alpha;
} params_t;

static params_t P;
static double log_min, log_span, pareto_exp;

/* A ring from one thread to the next: the producer writes head and the
 * places before it, the consumer writes tail. */
typedef struct {
    PER_THREAD uint64_t id;
    rng_t rng;
    unsigned char **slots;
    _Alignas(CACHE_LINE) unsigned char *ring[RING];
    _Alignas(CACHE_LINE) _Atomic(uint64_t) head;
    _Alignas(CACHE_LINE) _Atomic(uint64_t) tail;
    uint64_t allocated;
} worker_t;

static worker_t *workers;
static _Atomic(uintptr_t) *table, *long_lived; /* migrate: shared places */
static gate_t g_gate;

static size_t size_random(rng_t *r) {
    double u = (double)(rng_next(r) >> 11) * 0x1p-53;
    return (size_t)exp(log_min + u * log_span);
}

static size_t size_pareto(rng_t *r) {
    for (;;) {
        double u = (double)((rng_next(r) >> 11) + 1) * 0x1p-53; /* (0, 1] */
        double s = (double)P.min * pow(u, pareto_exp);
        if (s <= (double)P.max) return (size_t)s;
    }
}

static size_t size_power_of_two(rng_t *r) {
    unsigned top = 63u - (unsigned)__builtin_clzll((unsigned long long)P.max);
    return (size_t)1 << rng_range(r, 4, top);
}

static unsigned char *block_new(size_t size) {
    unsigned char *p = (unsigned char *)xmalloc(size);
    uint64_t s = size;
    memcpy(p + 8, &s, 8);
    uint64_t tag = tag_make((uint64_t)(uintptr_t)p, size);
    memcpy(p, &tag, 8);
    if (size > 16) p[size - 1] = (unsigned char)(tag >> 8);
    return p;
}

static void block_check_free(unsigned char *p, const char *where) {
    uint64_t size, tag;
    memcpy(&size, p + 8, 8);
    memcpy(&tag, p, 8);
    if (size < 16 || size > (uint64_t)P.max || tag != tag_make((uint64_t)(uintptr_t)p, size) ||
        (size > 16 && p[size - 1] != (unsigned char)(tag >> 8)))
        check_failed("sizes: a block (%s) was overwritten", where);
    free(p);
}

/* random/pareto: free what the previous thread handed over. */
static void ring_drain(worker_t *me) {
    uint64_t t = atomic_load_explicit(&me->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&me->head, memory_order_acquire);
    for (; t != h; t++) block_check_free(me->ring[t % RING], "handed over");
    atomic_store_explicit(&me->tail, t, memory_order_release);
}

/* random/pareto: hand p to the next thread, or free it when its ring is
 * full (no waiting: a thread that has finished drains no more). */
static void hand_over(worker_t *me, unsigned char *p) {
    worker_t *next = &workers[(me->id + 1) % (uint64_t)P.threads];
    uint64_t h = atomic_load_explicit(&next->head, memory_order_relaxed);
    if (h - atomic_load_explicit(&next->tail, memory_order_acquire) >= RING) {
        block_check_free(p, "kept when the ring was full");
        return;
    }
    next->ring[h % RING] = p;
    atomic_store_explicit(&next->head, h + 1, memory_order_release);
}

static void *working_set_main(void *arg) {
    worker_t *me = (worker_t *)arg;
    gate_wait(&g_gate);
    for (long i = 0; i < P.ops; i++) {
        size_t k = (size_t)rng_below(&me->rng, (uint64_t)P.slots);
        unsigned char *old = me->slots[k];
        if (old != NULL) {
            if (P.cross > 0 && P.threads > 1 && rng_below(&me->rng, (uint64_t)P.cross) == 0)
                hand_over(me, old);
            else
                block_check_free(old, "working set");
        }
        size_t size = P.mode == MODE_PARETO ? size_pareto(&me->rng) : size_random(&me->rng);
        me->slots[k] = block_new(size < 16 ? 16 : size);
        if ((i & 63) == 0) ring_drain(me);
    }
    me->allocated = (uint64_t)P.ops;
    return NULL;
}

static void *migrate_main(void *arg) {
    worker_t *me = (worker_t *)arg;
    for (long i = 0; i < P.ops; i++) {
        bool lasting = rng_below(&me->rng, LONG_LIVED_EVERY) == 0;
        _Atomic(uintptr_t) *places = lasting ? long_lived : table;
        long n = lasting ? (P.slots + 15) / 16 : P.slots;
        unsigned char *p = block_new(size_power_of_two(&me->rng));
        size_t k = (size_t)rng_below(&me->rng, (uint64_t)n);
        unsigned char *old = (unsigned char *)atomic_exchange(&places[k], (uintptr_t)p);
        if (old != NULL) block_check_free(old, lasting ? "long-lived" : "migrating");
    }
    me->allocated = (uint64_t)P.ops;
    return NULL;
}

static void start_worker(worker_t *w, uint64_t id, pthread_t *tid, void *(*fn)(void *)) {
    w->id = id;
    rng_seed(&w->rng, id * 7919u + 1);
    xthread_create(tid, fn, w);
}

static uint64_t run_working_sets(pthread_t *tids) {
    g_gate.total = (int)P.threads;
    for (long i = 0; i < P.threads; i++) {
        workers[i].slots = (unsigned char **)calloc((size_t)P.slots, sizeof(unsigned char *));
        if (workers[i].slots == NULL) out_of_memory((size_t)P.slots * sizeof(void *));
        start_worker(&workers[i], (uint64_t)i, &tids[i], working_set_main);
    }
    uint64_t ops = 0;
    for (long i = 0; i < P.threads; i++) xthread_join(tids[i]);
    for (long i = 0; i < P.threads; i++) {
        ring_drain(&workers[i]);
        for (long k = 0; k < P.slots; k++)
            if (workers[i].slots[k]) block_check_free(workers[i].slots[k], "left at the end");
        free(workers[i].slots);
        ops += workers[i].allocated;
    }
    return ops;
}

static void places_drain(_Atomic(uintptr_t) *places, long n) {
    for (long k = 0; k < n; k++) {
        unsigned char *p = (unsigned char *)atomic_load(&places[k]);
        if (p != NULL) block_check_free(p, "left at the end");
    }
}

static uint64_t run_migrations(pthread_t *tids) {
    long lasting = (P.slots + 15) / 16;
    table = (_Atomic(uintptr_t) *)calloc((size_t)P.slots, sizeof *table);
    long_lived = (_Atomic(uintptr_t) *)calloc((size_t)lasting, sizeof *long_lived);
    if (table == NULL || long_lived == NULL) out_of_memory((size_t)P.slots * 8);
    uint64_t ops = 0, id = 0;
    for (long r = 0; r < P.rounds; r++) {
        for (long i = 0; i < P.threads; i++)
            start_worker(&workers[i], id++, &tids[i], migrate_main);
        for (long i = 0; i < P.threads; i++) xthread_join(tids[i]);
        for (long i = 0; i < P.threads; i++) ops += workers[i].allocated;
    }
    places_drain(table, P.slots);
    places_drain(long_lived, lasting);
    free(table);
    free(long_lived);
    return ops;
}

int main(int argc, char **argv) {
    const char *mode = "random";
    long threads = 2, rounds = 10, ops = 1000000, slots = 1000, min = 16, max = 16000, cross = 16,
         alpha = 15;
    opt_t opts[] = {
        {"mode", "random, pareto or migrate", NULL, &mode},
        {"threads", "threads (migrate: per phase)", &threads, NULL},
        {"rounds", "migrate: phases", &rounds, NULL},
        {"ops", "blocks each thread allocates (migrate: per phase)", &ops, NULL},
        {"slots", "blocks each thread keeps (migrate: places of the shared table)", &slots, NULL},
        {"min", "smallest block (bytes, >= 16; pareto: the scale)", &min, NULL},
        {"max", "largest block (bytes)", &max, NULL},
        {"cross", "random: one freed block in N goes to the next thread (0: none)", &cross, NULL},
        {"alpha", "pareto: the shape, in tenths", &alpha, NULL},
    };
    OPTS_PARSE(argc, argv, "Size mixes and migrations of the field's benchmark suite.", opts);
    P = (params_t){-1, threads, rounds, ops, slots, min, max, cross, alpha};
    P.mode = strcmp(mode, "random") == 0    ? MODE_RANDOM
             : strcmp(mode, "pareto") == 0  ? MODE_PARETO
             : strcmp(mode, "migrate") == 0 ? MODE_MIGRATE
                                            : -1;
    if (P.mode < 0) usage_error("sizes: --mode is random, pareto or migrate, not '%s'", mode);
    if (threads < 1 || rounds < 1 || ops < 1 || slots < 1 || min < 16 || max < min || cross < 0 ||
        alpha < 1)
        usage_error("sizes: need threads, rounds, ops, slots, alpha >= 1, 16 <= min <= max, "
                    "cross >= 0");
    log_min = log((double)min);
    log_span = log((double)max + 1) - log_min;
    pareto_exp = -10.0 / (double)alpha;
    workers = (worker_t *)xmalloc_lines(sizeof(worker_t) * (size_t)threads);
    memset(workers, 0, sizeof(worker_t) * (size_t)threads);
    pthread_t *tids = (pthread_t *)xmalloc(sizeof(pthread_t) * (size_t)threads);

    double t0 = now_sec();
    uint64_t done = P.mode == MODE_MIGRATE ? run_migrations(tids) : run_working_sets(tids);
    double elapsed = now_sec() - t0;
    free(tids);
    free(workers);
    report_malloc_lib();
    printf("info: mode=%s threads=%ld ops=%llu sizes=%ld-%ld seconds=%.4f\n", mode, threads,
           (unsigned long long)done, min, max, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)done / (elapsed > 0 ? elapsed : 1e-9));
    return 0;
}
