/* large: large and huge blocks.
 *
 * --mode=window: a window of --window blocks of sizes drawn log-uniformly in
 *   [--min, --max] (64 KiB - 32 MiB in the suite); --iters times a random one
 *   is checked, freed and replaced by a new block whose every 4 KiB page is
 *   written. Allocators that send each such block to the kernel and back pay
 *   a page fault per page every time.
 * --mode=realloc: one block grows from --min to --max by --step bytes per
 *   realloc (every new page is written, samples of old pages are checked),
 *   --reps times. realloc that moves pages (mremap) is O(pages moved); one
 *   that copies bytes is O(bytes) per call, quadratic over the growth.
 *
 * Figure: ops_per_sec (window: one block replaced; realloc: one realloc
 * call) and mb_per_sec (MiB of blocks allocated or grown per second).
 */
#include "common.h"
#include <math.h>

#define PAGE 4096

static void write_pages(unsigned char *p, size_t from, size_t to, uint64_t tag) {
    size_t off = from & ~(size_t)(PAGE - 1);
    if (off < from) off += PAGE;
    for (; off + 8 <= to; off += PAGE) {
        uint64_t w = tag ^ off;
        memcpy(p + off, &w, 8);
    }
}

static int page_ok(const unsigned char *p, size_t off, uint64_t tag) {
    uint64_t w;
    memcpy(&w, p + off, 8);
    return w == (tag ^ off);
}

static size_t log_uniform(rng_t *r, size_t lo, size_t hi) {
    double u = (double)(rng_next(r) >> 11) / 9007199254740992.0;
    double v = exp(log((double)lo) + u * (log((double)hi) - log((double)lo)));
    size_t s = (size_t)v;
    return s < lo ? lo : s > hi ? hi : s;
}

static int run_window(long window, long iters, size_t min, size_t max, long seed, double *mib) {
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    unsigned char **p = (unsigned char **)xmalloc(sizeof(void *) * (size_t)window);
    size_t *sizes = (size_t *)xmalloc(sizeof(size_t) * (size_t)window);
    uint64_t *tags = (uint64_t *)xmalloc(sizeof(uint64_t) * (size_t)window);
    memset(p, 0, sizeof(void *) * (size_t)window);
    double bytes = 0;
    for (long it = 0; it < iters + window; it++) {
        long i = it < window ? it : (long)rng_below(&rng, (uint64_t)window);
        if (p[i]) {
            size_t s = sizes[i];
            if (!page_ok(p[i], 0, tags[i]) ||
                !page_ok(p[i], ((s - 8) / 2) & ~(size_t)(PAGE - 1), tags[i]) ||
                p[i][s - 1] != (unsigned char)tags[i])
                check_failed("large: window block %ld (%zu bytes) overwritten", i, s);
            free(p[i]);
        }
        sizes[i] = log_uniform(&rng, min, max);
        tags[i] = tag_make((uint64_t)it, (uint64_t)i);
        p[i] = (unsigned char *)xmalloc(sizes[i]);
        write_pages(p[i], 0, sizes[i], tags[i]);
        p[i][sizes[i] - 1] = (unsigned char)tags[i];
        bytes += (double)sizes[i];
    }
    for (long i = 0; i < window; i++) {
        for (size_t off = 0; off + 8 <= sizes[i]; off += PAGE)
            if (!page_ok(p[i], off, tags[i]))
                check_failed("large: block %ld page %zu overwritten", i, off);
        free(p[i]);
    }
    free(p);
    free(sizes);
    free(tags);
    *mib = bytes / 1048576.0;
    return 0;
}

static long run_realloc(long reps, size_t min, size_t max, size_t step, long seed, double *mib) {
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    long calls = 0;
    double bytes = 0;
    for (long r = 0; r < reps; r++) {
        uint64_t tag = tag_make((uint64_t)r, 77);
        size_t size = min;
        unsigned char *p = (unsigned char *)xmalloc(size);
        write_pages(p, 0, size, tag);
        while (size < max) {
            size_t next = size + step > max ? max : size + step;
            p = (unsigned char *)xrealloc(p, next);
            calls++;
            /* old contents kept: first page, last old page, 8 random old pages */
            size_t last_old = ((size - 8) & ~(size_t)(PAGE - 1));
            if (!page_ok(p, 0, tag) || !page_ok(p, last_old, tag))
                check_failed("large: realloc to %zu lost the old contents", next);
            for (int k = 0; k < 8; k++) {
                size_t off = (size_t)rng_below(&rng, size / PAGE) * PAGE;
                if (!page_ok(p, off, tag))
                    check_failed("large: realloc to %zu lost page %zu", next, off);
            }
            write_pages(p, size, next, tag);
            bytes += (double)(next - size);
            size = next;
        }
        for (size_t off = 0; off + 8 <= size; off += PAGE)
            if (!page_ok(p, off, tag)) check_failed("large: grown block lost page %zu", off);
        free(p);
    }
    *mib = bytes / 1048576.0;
    return calls;
}

int main(int argc, char **argv) {
    long window = 16, iters = 1000, min = 64 << 10, max = 32 << 20, reps = 3, step = 1 << 20,
         seed = 1;
    const char *mode = "window";
    opt_t opts[] = {
        {"mode", "window | realloc", NULL, &mode},
        {"window", "window: blocks kept", &window, NULL},
        {"iters", "window: blocks replaced", &iters, NULL},
        {"min", "smallest size (window) or start size (realloc)", &min, NULL},
        {"max", "largest size (window) or final size (realloc)", &max, NULL},
        {"step", "realloc: growth per call (bytes)", &step, NULL},
        {"reps", "realloc: blocks grown", &reps, NULL},
        {"seed", "random seed", &seed, NULL},
    };
    OPTS_PARSE(argc, argv, "Large blocks: a replaced window, or realloc growth.", opts);
    if (min < 4096 || max < min) usage_error("large: need 4096 <= min <= max");
    double mib = 0, ops;
    double t0 = now_sec();
    if (strcmp(mode, "window") == 0) {
        if (window < 1) usage_error("large: window must be >= 1");
        run_window(window, iters, (size_t)min, (size_t)max, seed, &mib);
        ops = (double)iters + (double)window;
    } else if (strcmp(mode, "realloc") == 0) {
        if (step < 1) usage_error("large: step must be >= 1");
        ops = (double)run_realloc(reps, (size_t)min, (size_t)max, (size_t)step, seed, &mib);
    } else {
        usage_error("large: --mode must be window or realloc, not '%s'", mode);
    }
    double elapsed = now_sec() - t0;
    report_malloc_lib();
    printf("info: mode=%s min=%ld max=%ld mib=%.1f seconds=%.4f\n", mode, min, max, mib, elapsed);
    printf("result: ops_per_sec=%.1f mb_per_sec=%.1f\n", ops / elapsed, mib / elapsed);
    return 0;
}
