/* cache-thrash: active false sharing.
 *
 * --threads threads start together; each repeatedly allocates a small block
 * (--size bytes), writes into it --writes times, checks it and frees it,
 * --iters times. An allocator that hands out neighbouring blocks of one cache
 * line to different threads makes every write a cache-line transfer between
 * cores.
 *
 * Figure: ops_per_sec, one op = malloc + writes + free.
 */
#include "common.h"

static long g_iters = 100000, g_writes = 100, g_size = 8;
static gate_t g_gate;

typedef struct {
    PER_THREAD long id;
    uint64_t sum;
} arg_t;

static void *worker(void *argp) {
    arg_t *a = (arg_t *)argp;
    gate_wait(&g_gate);
    write_blocks_loop("cache-thrash", a->id, g_iters, g_size, g_writes, &a->sum);
    return NULL;
}

int main(int argc, char **argv) {
    long threads = 2;
    opt_t opts[] = {
        {"threads", "threads", &threads, NULL},
        {"iters", "allocations per thread", &g_iters, NULL},
        {"writes", "writes into each block", &g_writes, NULL},
        {"size", "block size (bytes)", &g_size, NULL},
    };
    OPTS_PARSE(argc, argv, "Active false sharing between threads' small blocks.", opts);
    if (threads < 1 || g_size < 1) usage_error("cache-thrash: need threads >= 1 and size >= 1");
    pthread_t *th = (pthread_t *)xmalloc(sizeof(pthread_t) * (size_t)threads);
    arg_t *args = (arg_t *)xmalloc_lines(sizeof(arg_t) * (size_t)threads);
    g_gate.total = (int)threads;
    double t0 = now_sec();
    for (long t = 0; t < threads; t++) {
        args[t].id = t;
        args[t].sum = 0;
        xthread_create(&th[t], worker, &args[t]);
    }
    for (long t = 0; t < threads; t++) xthread_join(th[t]);
    double elapsed = now_sec() - t0;
    for (long t = 0; t < threads; t++)
        if (args[t].sum == 0 && g_iters > 0)
            check_failed("cache-thrash: thread %ld did nothing", t);
    free(args);
    free(th);
    report_malloc_lib();
    printf("info: threads=%ld iters=%ld writes=%ld size=%ld seconds=%.4f\n", threads, g_iters,
           g_writes, g_size, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)(threads * g_iters) / elapsed);
    return 0;
}
