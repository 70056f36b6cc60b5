/* cache-scratch: passive false sharing.
 *
 * The main thread allocates one small block (--size bytes) per thread, one
 * after the other, so they likely share cache lines, and hands block i to
 * thread i. Each thread frees the block it was given, then --iters times
 * allocates a small block, writes into it --writes times, checks and frees
 * it. An allocator that gives a thread back the block it just freed (a
 * neighbour of the other threads' blocks) makes the writes share cache lines
 * between cores.
 *
 * Figure: ops_per_sec, one op = malloc + writes + free.
 */
#include "common.h"

static long g_iters = 100000, g_writes = 100, g_size = 8;
static gate_t g_gate;

typedef struct {
    PER_THREAD long id;
    unsigned char *given;
    uint64_t sum;
} arg_t;

static void *worker(void *argp) {
    arg_t *a = (arg_t *)argp;
    gate_wait(&g_gate);
    if (a->given[0] != (unsigned char)(0x5a + a->id))
        check_failed("cache-scratch: block given to thread %ld is wrong", a->id);
    free(a->given);
    write_blocks_loop("cache-scratch", a->id, g_iters, g_size, g_writes, &a->sum);
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
    OPTS_PARSE(argc, argv, "Passive false sharing: blocks freed by a thread near others'.", opts);
    if (threads < 1 || g_size < 1) usage_error("cache-scratch: need threads >= 1 and size >= 1");
    pthread_t *th = (pthread_t *)xmalloc(sizeof(pthread_t) * (size_t)threads);
    arg_t *args = (arg_t *)xmalloc_lines(sizeof(arg_t) * (size_t)threads);
    for (long t = 0; t < threads; t++) {
        args[t].id = t;
        args[t].sum = 0;
        args[t].given = (unsigned char *)xmalloc((size_t)g_size);
        args[t].given[0] = (unsigned char)(0x5a + t);
    }
    g_gate.total = (int)threads;
    double t0 = now_sec();
    for (long t = 0; t < threads; t++) xthread_create(&th[t], worker, &args[t]);
    for (long t = 0; t < threads; t++) xthread_join(th[t]);
    double elapsed = now_sec() - t0;
    for (long t = 0; t < threads; t++)
        if (args[t].sum == 0 && g_iters > 0)
            check_failed("cache-scratch: thread %ld did nothing", t);
    free(args);
    free(th);
    report_malloc_lib();
    printf("info: threads=%ld iters=%ld writes=%ld size=%ld seconds=%.4f\n", threads, g_iters,
           g_writes, g_size, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)(threads * g_iters) / elapsed);
    return 0;
}
