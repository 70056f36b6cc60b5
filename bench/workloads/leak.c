/* leak: a program that keeps leaking a little.
 *
 * --iters rounds: allocate --batch blocks of random sizes in [--min, --max],
 * fill them, check them, free them, except one in --every that is "leaked":
 * never freed, only linked into a list. The leaked blocks are scattered over
 * the memory the short-lived blocks use, so they pin pages: the peak RSS the
 * runner measures shows how much an allocator's layout makes a small leak
 * cost. The leaked blocks are checked at the end (and not freed).
 *
 * Figure: ops_per_sec (one op = one block allocated), leaked_mib.
 */
#include "common.h"

typedef struct leaked_s {
    struct leaked_s *next;
    uint64_t tag;
    uint32_t size;
} leaked_t;

int main(int argc, char **argv) {
    long iters = 2000, batch = 1000, every = 100, min = 32, max = 4096, seed = 1;
    opt_t opts[] = {
        {"iters", "rounds", &iters, NULL},
        {"batch", "blocks per round", &batch, NULL},
        {"every", "leak one block in this many", &every, NULL},
        {"min", "smallest block size (bytes, >= 32)", &min, NULL},
        {"max", "largest block size (bytes)", &max, NULL},
        {"seed", "random seed", &seed, NULL},
    };
    OPTS_PARSE(argc, argv, "Keeps leaking a little: RSS growth and pinned pages.", opts);
    if (batch < 1 || every < 1 || min < 32 || max < min)
        usage_error("leak: need batch >= 1, every >= 1, 32 <= min <= max");
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    unsigned char **p = (unsigned char **)xmalloc(sizeof(void *) * (size_t)batch);
    size_t *sizes = (size_t *)xmalloc(sizeof(size_t) * (size_t)batch);
    leaked_t *leaked = NULL;
    uint64_t nleaked = 0, leaked_bytes = 0, allocs = 0, counter = 0;

    double t0 = now_sec();
    for (long it = 0; it < iters; it++) {
        for (long i = 0; i < batch; i++) {
            sizes[i] = (size_t)rng_range(&rng, (uint64_t)min, (uint64_t)max);
            p[i] = (unsigned char *)xmalloc(sizes[i]);
            block_fill(p[i], sizes[i], tag_make((uint64_t)it, (uint64_t)i));
        }
        allocs += (uint64_t)batch;
        for (long i = 0; i < batch; i++) {
            uint64_t tag = tag_make((uint64_t)it, (uint64_t)i);
            if (!block_ok(p[i], sizes[i], tag, (i & 31) == 0))
                check_failed("leak: round %ld block %ld overwritten", it, i);
            if (++counter % (uint64_t)every == 0) {
                leaked_t *l = (leaked_t *)p[i];
                l->next = leaked;
                l->tag = tag_make(0x1eac, nleaked);
                l->size = (uint32_t)sizes[i];
                p[i][sizes[i] - 1] = (unsigned char)l->tag;
                leaked = l;
                nleaked++;
                leaked_bytes += sizes[i];
            } else {
                free(p[i]);
            }
        }
    }
    double elapsed = now_sec() - t0;
    uint64_t seen = 0, bytes = 0;
    for (leaked_t *l = leaked; l; l = l->next) {
        if (l->tag != tag_make(0x1eac, nleaked - 1 - seen) ||
            ((unsigned char *)l)[l->size - 1] != (unsigned char)l->tag)
            check_failed("leak: leaked block %llu overwritten", (unsigned long long)seen);
        seen++;
        bytes += l->size;
    }
    if (seen != nleaked || bytes != leaked_bytes) check_failed("leak: leaked list is wrong");
    free(p);
    free(sizes);
    report_malloc_lib();
    printf("info: iters=%ld batch=%ld every=%ld sizes=%ld-%ld leaked_blocks=%llu seconds=%.4f\n",
           iters, batch, every, min, max, (unsigned long long)nleaked, elapsed);
    printf("result: ops_per_sec=%.1f leaked_mib=%.2f\n", (double)allocs / elapsed,
           (double)leaked_bytes / 1048576.0);
    return 0;
}
