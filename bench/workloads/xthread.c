/* xthread: producer/consumer, cross-thread frees dominate.
 *
 * --threads are split into pairs (at least one pair). In each pair the
 * producer allocates batches of --batch blocks of random sizes in
 * [--min, --max], fills them, and passes each batch (itself a malloc'ed
 * block) through a bounded lock-free ring to its consumer, which checks and
 * frees every block and the batch. Every block is freed by a thread that did
 * not allocate it. Waiting is spin-then-yield (no futex), so oversubscribed
 * runs make progress.
 *
 * --pin (diagnostic: with more threads than cores the figure depends on
 * where the scheduler puts each thread, and runs fall into a fast and a slow
 * mode): 0 lets the scheduler place threads; 1 puts both threads of pair i
 * on core i mod cores (each pair works within one core); 2 puts producers
 * and consumers on different cores (every handover crosses cores, the
 * producers share cores); 3 splits every pair too, but puts pair i's
 * producer on core i mod cores and its consumer on the next core, so with
 * 2 pairs on 2 cores each core runs one producer and one consumer.
 *
 * Figure: ops_per_sec, one op = one block allocated by one thread and freed
 * by another.
 */
#include "common.h"

#define RING 64

typedef struct {
    uint32_t n;
    uint32_t sizes[];
    /* followed by void *p[n] and uint64_t tags[n], see batch_ptrs() */
} batch_t;

typedef struct {
    _Alignas(64) atomic_ulong head; /* written by the producer */
    _Alignas(64) atomic_ulong tail; /* written by the consumer */
    _Alignas(64) batch_t *slot[RING];
    long id;
    /* written once, when the thread is done (each thread counts in locals:
     * on one line, the producer's and the consumer's counters would be
     * false sharing of the harness's own) */
    uint64_t produced_sum, consumed_sum;
    uint64_t produced, consumed;
} pair_t;

static long g_blocks = 1000000, g_batch = 100, g_min = 16, g_max = 256, g_seed = 1, g_pin = 0;
static gate_t g_gate;

static size_t batch_bytes(long n) {
    return sizeof(batch_t) + sizeof(uint32_t) * (size_t)n + 8 /* align */ +
           (sizeof(void *) + sizeof(uint64_t)) * (size_t)n;
}
static void **batch_ptrs(batch_t *b, long n) {
    uintptr_t a = (uintptr_t)(b->sizes + n);
    a = (a + 7) & ~(uintptr_t)7;
    return (void **)a;
}
static uint64_t *batch_tags(batch_t *b, long n) { return (uint64_t *)(batch_ptrs(b, n) + n); }

/* Pin the calling thread as --pin says (role 0: producer, 1: consumer). */
static void pin_thread(long pair, int role) {
    if (g_pin == 0) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    long core = g_pin == 1   ? pair % cores
                : g_pin == 2 ? (2 * pair + role) % cores
                             : (pair + role) % cores;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)core, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        check_failed("xthread: cannot pin to core %ld", core);
}

static void *producer(void *arg) {
    pair_t *pr = (pair_t *)arg;
    pin_thread(pr->id, 0);
    rng_t rng;
    rng_seed(&rng, (uint64_t)g_seed * 7919u + (uint64_t)pr->id);
    gate_wait(&g_gate);
    uint64_t counter = 0, produced = 0, produced_sum = 0;
    for (long done = 0; done < g_blocks; done += g_batch) {
        long n = g_blocks - done < g_batch ? g_blocks - done : g_batch;
        batch_t *b = (batch_t *)xmalloc(batch_bytes(n));
        b->n = (uint32_t)n;
        void **p = batch_ptrs(b, n);
        uint64_t *tags = batch_tags(b, n);
        for (long i = 0; i < n; i++) {
            size_t size = (size_t)rng_range(&rng, (uint64_t)g_min, (uint64_t)g_max);
            uint64_t tag = tag_make((uint64_t)pr->id, ++counter);
            p[i] = xmalloc(size);
            tag_put(p[i], size, tag);
            b->sizes[i] = (uint32_t)size;
            tags[i] = tag;
            produced_sum += tag;
        }
        produced += (uint64_t)n;
        unsigned long h = atomic_load_explicit(&pr->head, memory_order_relaxed);
        while (h - atomic_load_explicit(&pr->tail, memory_order_acquire) >= RING) sched_yield();
        pr->slot[h % RING] = b;
        atomic_store_explicit(&pr->head, h + 1, memory_order_release);
    }
    pr->produced = produced;
    pr->produced_sum = produced_sum;
    return NULL;
}

static void *consumer(void *arg) {
    pair_t *pr = (pair_t *)arg;
    pin_thread(pr->id, 1);
    gate_wait(&g_gate);
    unsigned long t = 0;
    uint64_t consumed = 0, consumed_sum = 0;
    while (consumed < (uint64_t)g_blocks) {
        while (atomic_load_explicit(&pr->head, memory_order_acquire) == t) sched_yield();
        batch_t *b = pr->slot[t % RING];
        atomic_store_explicit(&pr->tail, ++t, memory_order_release);
        long n = b->n;
        void **p = batch_ptrs(b, n);
        uint64_t *tags = batch_tags(b, n);
        for (long i = 0; i < n; i++) {
            if (!tag_ok(p[i], b->sizes[i], tags[i]))
                check_failed("xthread: pair %ld block of %u bytes overwritten", pr->id,
                             b->sizes[i]);
            consumed_sum += tags[i];
            free(p[i]);
        }
        consumed += (uint64_t)n;
        free(b);
    }
    pr->consumed = consumed;
    pr->consumed_sum = consumed_sum;
    return NULL;
}

int main(int argc, char **argv) {
    long threads = 2;
    opt_t opts[] = {
        {"threads", "threads (split into producer/consumer pairs)", &threads, NULL},
        {"blocks", "blocks each producer allocates", &g_blocks, NULL},
        {"batch", "blocks per batch handed over", &g_batch, NULL},
        {"min", "smallest block size (bytes)", &g_min, NULL},
        {"max", "largest block size (bytes)", &g_max, NULL},
        {"seed", "random seed", &g_seed, NULL},
        {"pin",
         "0: scheduler places threads, 1: pair per core, 2: pairs across cores (producers "
         "together), 3: pairs across cores (a producer and a consumer per core)",
         &g_pin, NULL},
    };
    OPTS_PARSE(argc, argv, "Producer/consumer: blocks are freed by another thread.", opts);
    if (g_batch < 1 || g_min < 1 || g_max < g_min || g_max > 0xffffffffL || g_pin < 0 || g_pin > 3)
        usage_error("xthread: need batch >= 1, 1 <= min <= max < 4 GiB and pin 0 to 3");
    long pairs = threads / 2 < 1 ? 1 : threads / 2;

    pair_t *ps = (pair_t *)aligned_alloc(64, sizeof(pair_t) * (size_t)pairs);
    if (ps == NULL) out_of_memory(sizeof(pair_t) * (size_t)pairs);
    memset(ps, 0, sizeof(pair_t) * (size_t)pairs);
    pthread_t *th = (pthread_t *)xmalloc(sizeof(pthread_t) * 2 * (size_t)pairs);
    g_gate.total = (int)(2 * pairs);
    for (long i = 0; i < pairs; i++) {
        ps[i].id = i;
        atomic_init(&ps[i].head, 0);
        atomic_init(&ps[i].tail, 0);
    }
    double t0 = now_sec();
    for (long i = 0; i < pairs; i++) {
        xthread_create(&th[2 * i], producer, &ps[i]);
        xthread_create(&th[2 * i + 1], consumer, &ps[i]);
    }
    for (long i = 0; i < 2 * pairs; i++) xthread_join(th[i]);
    double elapsed = now_sec() - t0;

    uint64_t total = 0;
    for (long i = 0; i < pairs; i++) {
        if (ps[i].produced != (uint64_t)g_blocks || ps[i].consumed != (uint64_t)g_blocks)
            check_failed("xthread: pair %ld produced %llu consumed %llu, expected %ld", i,
                         (unsigned long long)ps[i].produced, (unsigned long long)ps[i].consumed,
                         g_blocks);
        if (ps[i].produced_sum != ps[i].consumed_sum)
            check_failed("xthread: pair %ld checksum mismatch", i);
        total += ps[i].consumed;
    }
    free(th);
    free(ps);
    report_malloc_lib();
    printf("info: pairs=%ld blocks=%llu sizes=%ld-%ld batch=%ld pin=%ld seconds=%.4f\n", pairs,
           (unsigned long long)total, g_min, g_max, g_batch, g_pin, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)total / elapsed);
    return 0;
}
