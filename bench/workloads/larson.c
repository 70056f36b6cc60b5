/* larson: the server pattern.
 *
 * Each of --threads windows holds --chunks blocks. A thread working on a
 * window replaces a random block --ops times (check it, free it, allocate a
 * new one of a random size in [--min, --max] and tag it), then hands the
 * window on to a new thread that it creates, and exits. So blocks are
 * allocated by one thread and freed by another, most often one that has
 * already exited (its memory must be adopted or reclaimed). Each window goes
 * through --rounds threads. The initial blocks come from the main thread.
 *
 * Figure: ops_per_sec, one op = one free + one malloc.
 */
#include "common.h"

typedef struct {
    PER_THREAD long id; /* the thread working a window writes its record every op */
    void **blocks;
    uint32_t *sizes;
    uint64_t *tags;
    rng_t rng;
    long gen;
    uint64_t counter;
    uint64_t alloc_sum, free_sum;
    uint64_t ops;
    pthread_t prev;
    int has_prev;
} window_t;

static long g_chunks = 1024, g_rounds = 10, g_ops = 100000, g_min = 8, g_max = 128;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static long g_done;

static void replace(window_t *w, long idx) {
    void *p = w->blocks[idx];
    if (p != NULL) {
        if (!tag_ok(p, w->sizes[idx], w->tags[idx]))
            check_failed("larson: window %ld block %ld (%u bytes) was overwritten", w->id, idx,
                         w->sizes[idx]);
        w->free_sum += w->tags[idx];
        free(p);
    }
    size_t size = (size_t)rng_range(&w->rng, (uint64_t)g_min, (uint64_t)g_max);
    uint64_t tag = tag_make((uint64_t)w->id, ++w->counter);
    p = xmalloc(size);
    tag_put(p, size, tag);
    w->blocks[idx] = p;
    w->sizes[idx] = (uint32_t)size;
    w->tags[idx] = tag;
    w->alloc_sum += tag;
}

static void *chain_thread(void *arg) {
    window_t *w = (window_t *)arg;
    if (w->has_prev) xthread_join(w->prev);
    for (long i = 0; i < g_ops; i++) replace(w, (long)rng_below(&w->rng, (uint64_t)g_chunks));
    w->ops += (uint64_t)g_ops;
    w->gen++;
    w->prev = pthread_self();
    w->has_prev = 1;
    if (w->gen < g_rounds) {
        pthread_t next;
        xthread_create(&next, chain_thread, w);
    } else {
        pthread_mutex_lock(&g_mu);
        g_done++;
        pthread_cond_signal(&g_cv);
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long threads = 2, seed = 1;
    opt_t opts[] = {
        {"threads", "number of windows (threads alive at once)", &threads, NULL},
        {"chunks", "blocks per window", &g_chunks, NULL},
        {"min", "smallest block size (bytes)", &g_min, NULL},
        {"max", "largest block size (bytes)", &g_max, NULL},
        {"rounds", "threads each window goes through", &g_rounds, NULL},
        {"ops", "replacements per thread", &g_ops, NULL},
        {"seed", "random seed", &seed, NULL},
    };
    OPTS_PARSE(argc, argv, "Larson server pattern: blocks migrate between threads.", opts);
    if (threads < 1 || g_chunks < 1 || g_rounds < 1 || g_min < 1 || g_max < g_min)
        usage_error("larson: need threads, chunks, rounds >= 1 and 1 <= min <= max");

    window_t *ws = (window_t *)xmalloc_lines(sizeof(window_t) * (size_t)threads);
    for (long t = 0; t < threads; t++) {
        window_t *w = &ws[t];
        memset(w, 0, sizeof(*w));
        w->id = t;
        rng_seed(&w->rng, (uint64_t)seed * 1000003u + (uint64_t)t);
        w->blocks = (void **)xmalloc(sizeof(void *) * (size_t)g_chunks);
        w->sizes = (uint32_t *)xmalloc(sizeof(uint32_t) * (size_t)g_chunks);
        w->tags = (uint64_t *)xmalloc(sizeof(uint64_t) * (size_t)g_chunks);
        memset(w->blocks, 0, sizeof(void *) * (size_t)g_chunks);
        for (long i = 0; i < g_chunks; i++) replace(w, i);
    }

    double t0 = now_sec();
    for (long t = 0; t < threads; t++) {
        pthread_t th;
        xthread_create(&th, chain_thread, &ws[t]);
    }
    pthread_mutex_lock(&g_mu);
    while (g_done < threads) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    double elapsed = now_sec() - t0;

    uint64_t ops = 0;
    for (long t = 0; t < threads; t++) {
        window_t *w = &ws[t];
        xthread_join(w->prev);
        for (long i = 0; i < g_chunks; i++) {
            if (!tag_ok(w->blocks[i], w->sizes[i], w->tags[i]))
                check_failed("larson: window %ld block %ld overwritten at the end", t, i);
            w->free_sum += w->tags[i];
            free(w->blocks[i]);
        }
        if (w->free_sum != w->alloc_sum) check_failed("larson: window %ld checksum mismatch", t);
        if (w->ops != (uint64_t)(g_rounds * g_ops))
            check_failed("larson: window %ld did %llu ops, not %ld", t, (unsigned long long)w->ops,
                         g_rounds * g_ops);
        ops += w->ops;
        free(w->blocks);
        free(w->sizes);
        free(w->tags);
    }
    free(ws);
    report_malloc_lib();
    printf("info: threads=%ld sizes=%ld-%ld chunks=%ld rounds=%ld ops=%llu seconds=%.4f\n", threads,
           g_min, g_max, g_chunks, g_rounds, (unsigned long long)ops, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)ops / elapsed);
    return 0;
}
