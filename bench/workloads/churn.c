/* churn: many short-lived threads allocating (thread exit, heap adoption).
 *
 * Threads are created in waves of --threads until --total threads have run.
 * Each thread allocates --blocks blocks of random sizes in [--min, --max]:
 * every block is first used and freed locally, or else swapped into a
 * shared pool (an atomic exchange with a random slot): the block it gets
 * back was allocated by an earlier thread, most often one that has exited,
 * and is checked and freed here. The main thread frees what is left at the
 * end.
 *
 * Figure: ops_per_sec, one op = one malloc + one free; also threads_per_sec.
 */
#include "common.h"

typedef struct {
    uint64_t tag;
    uint32_t size;
    uint32_t pad;
} hdr_t;

static long g_blocks = 2000, g_min = 16, g_max = 512, g_pool = 4096, g_seed = 1;
static _Atomic(hdr_t *) *g_slots;
static atomic_ullong g_alloc_sum, g_free_sum, g_ops;

static hdr_t *new_block(rng_t *rng, uint64_t id, uint64_t n) {
    size_t size = (size_t)rng_range(rng, (uint64_t)g_min, (uint64_t)g_max);
    hdr_t *h = (hdr_t *)xmalloc(size);
    h->tag = tag_make(id, n);
    h->size = (uint32_t)size;
    unsigned char *c = (unsigned char *)h;
    c[size - 1] = (unsigned char)h->tag;
    return h;
}

static uint64_t check_and_free(hdr_t *h, const char *what) {
    unsigned char *c = (unsigned char *)h;
    if (h->size < (uint32_t)g_min || h->size > (uint32_t)g_max ||
        c[h->size - 1] != (unsigned char)h->tag)
        check_failed("churn: %s block overwritten", what);
    uint64_t tag = h->tag;
    free(h);
    return tag;
}

static void *worker(void *arg) {
    uint64_t id = (uint64_t)(uintptr_t)arg;
    rng_t rng;
    rng_seed(&rng, (uint64_t)g_seed * 131071u + id);
    uint64_t alloc_sum = 0, free_sum = 0, ops = 0;
    hdr_t *local[16] = {0};
    uint64_t local_tag[16] = {0};
    for (long i = 0; i < g_blocks; i++) {
        hdr_t *h = new_block(&rng, id, (uint64_t)i);
        ops++;
        if (rng_next(&rng) & 1) {
            /* local: keep in a small ring, free the one it replaces */
            unsigned k = (unsigned)(i & 15);
            if (local[k] && check_and_free(local[k], "local") != local_tag[k])
                check_failed("churn: local block overwritten");
            local[k] = h;
            local_tag[k] = h->tag;
        } else {
            alloc_sum += h->tag;
            size_t slot = (size_t)rng_below(&rng, (uint64_t)g_pool);
            hdr_t *old = atomic_exchange(&g_slots[slot], h);
            if (old) free_sum += check_and_free(old, "pooled");
        }
    }
    for (int k = 0; k < 16; k++)
        if (local[k] && check_and_free(local[k], "local") != local_tag[k])
            check_failed("churn: local block overwritten");
    atomic_fetch_add(&g_alloc_sum, alloc_sum);
    atomic_fetch_add(&g_free_sum, free_sum);
    atomic_fetch_add(&g_ops, ops);
    return NULL;
}

int main(int argc, char **argv) {
    long threads = 2, total = 2000;
    opt_t opts[] = {
        {"threads", "threads alive at once (one wave)", &threads, NULL},
        {"total", "threads created in all", &total, NULL},
        {"blocks", "allocations per thread", &g_blocks, NULL},
        {"min", "smallest block size (bytes, >= 16)", &g_min, NULL},
        {"max", "largest block size (bytes)", &g_max, NULL},
        {"pool", "slots of the shared pool", &g_pool, NULL},
        {"seed", "random seed", &g_seed, NULL},
    };
    OPTS_PARSE(argc, argv, "Thread churn: threads come and go while allocating.", opts);
    if (threads < 1 || g_min < 16 || g_max < g_min || g_pool < 1)
        usage_error("churn: need threads >= 1, 16 <= min <= max, pool >= 1");
    g_slots = (_Atomic(hdr_t *) *)xmalloc(sizeof(*g_slots) * (size_t)g_pool);
    for (long i = 0; i < g_pool; i++) atomic_init(&g_slots[i], NULL);
    pthread_t *th = (pthread_t *)xmalloc(sizeof(pthread_t) * (size_t)threads);

    double t0 = now_sec();
    long created = 0;
    while (created < total) {
        long wave = total - created < threads ? total - created : threads;
        for (long t = 0; t < wave; t++)
            xthread_create(&th[t], worker, (void *)(uintptr_t)(created + t + 1));
        for (long t = 0; t < wave; t++) xthread_join(th[t]);
        created += wave;
    }
    double elapsed = now_sec() - t0;

    uint64_t free_sum = atomic_load(&g_free_sum);
    for (long i = 0; i < g_pool; i++) {
        hdr_t *h = atomic_load(&g_slots[i]);
        if (h) free_sum += check_and_free(h, "remaining");
    }
    if (free_sum != atomic_load(&g_alloc_sum)) check_failed("churn: pool checksum mismatch");
    if (atomic_load(&g_ops) != (uint64_t)(total * g_blocks))
        check_failed("churn: %llu allocations, expected %ld",
                     (unsigned long long)atomic_load(&g_ops), total * g_blocks);
    free(th);
    free(g_slots);
    report_malloc_lib();
    printf("info: threads=%ld total=%ld blocks=%ld sizes=%ld-%ld seconds=%.4f\n", threads, total,
           g_blocks, g_min, g_max, elapsed);
    printf("result: ops_per_sec=%.1f threads_per_sec=%.1f\n", (double)atomic_load(&g_ops) / elapsed,
           (double)total / elapsed);
    return 0;
}
