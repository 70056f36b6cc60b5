/* glibc-simple: the glibc malloc benchtest pattern.
 *
 * For each count N in --counts (25,100,400,1600 by default): allocate N
 * blocks of --size bytes, then free them all, repeated so that about --ops
 * blocks are allocated per count. Each block gets a tag that is checked
 * before it is freed. With --thread=1 the loop runs in a second thread
 * (not the main one: glibc then uses a non-main arena).
 *
 * Figure: ops_per_sec over all counts (one op = malloc + free); the
 * per-count times are info lines (ns_per_op_N).
 */
#include "common.h"

static long g_size = 16, g_ops = 20000000;
static const char *g_counts = "25,100,400,1600";

#define MAX_COUNTS 16
typedef struct {
    long counts[MAX_COUNTS];
    int ncounts;
    double secs[MAX_COUNTS];
    uint64_t ops[MAX_COUNTS];
} run_t;

static void *run(void *arg) {
    run_t *r = (run_t *)arg;
    for (int c = 0; c < r->ncounts; c++) {
        long n = r->counts[c];
        long iters = g_ops / n < 1 ? 1 : g_ops / n;
        void **p = (void **)xmalloc(sizeof(void *) * (size_t)n);
        double t0 = now_sec();
        for (long it = 0; it < iters; it++) {
            for (long i = 0; i < n; i++) {
                p[i] = xmalloc((size_t)g_size);
                tag_put(p[i], (size_t)g_size, tag_make((uint64_t)it, (uint64_t)i));
            }
            for (long i = 0; i < n; i++) {
                if (!tag_ok(p[i], (size_t)g_size, tag_make((uint64_t)it, (uint64_t)i)))
                    check_failed("glibc-simple: block %ld of %ld overwritten", i, n);
                free(p[i]);
            }
        }
        r->secs[c] = now_sec() - t0;
        r->ops[c] = (uint64_t)(iters * n);
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long thread = 0;
    opt_t opts[] = {
        {"size", "block size (bytes)", &g_size, NULL},
        {"counts", "blocks allocated before freeing, comma-separated", NULL, &g_counts},
        {"ops", "blocks allocated per count", &g_ops, NULL},
        {"thread", "1: run in a second thread, 0: in the main thread", &thread, NULL},
    };
    OPTS_PARSE(argc, argv, "glibc benchtest: N blocks of one size allocated, then freed.", opts);
    if (g_size < 1) usage_error("glibc-simple: size must be >= 1");
    run_t r;
    memset(&r, 0, sizeof(r));
    const char *s = g_counts;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || r.ncounts == MAX_COUNTS || (*end != ',' && *end != '\0'))
            usage_error("glibc-simple: --counts needs up to %d positive numbers, like 25,100",
                        MAX_COUNTS);
        r.counts[r.ncounts++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    if (r.ncounts == 0) usage_error("glibc-simple: --counts is empty");

    if (thread) {
        pthread_t t;
        xthread_create(&t, run, &r);
        xthread_join(t);
    } else {
        run(&r);
    }
    double secs = 0;
    uint64_t ops = 0;
    report_malloc_lib();
    printf("info: size=%ld thread=%ld", g_size, thread);
    for (int c = 0; c < r.ncounts; c++) {
        secs += r.secs[c];
        ops += r.ops[c];
        printf(" ns_per_op_%ld=%.2f", r.counts[c], r.secs[c] * 1e9 / (double)r.ops[c]);
    }
    printf("\nresult: ops_per_sec=%.1f ns_per_op=%.2f\n", (double)ops / secs,
           secs * 1e9 / (double)ops);
    return 0;
}
