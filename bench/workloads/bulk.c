/* bulk: batches of allocations released in full or in part.
 *
 * --outer rounds of --inner blocks (1000 x 1000 by default). Sizes are fixed
 * (--min == --max: 64 or 1700 bytes) or random in [--min, --max]. Each
 * round allocates the empty slots of an --inner array, touches each block
 * (--memset=1: fills all of it, else writes a tag only), then releases all of
 * them in order (--release=all) or a random half of them (--release=subset:
 * the rest stay for the next rounds). The end frees everything.
 *
 * All allocation and release goes through bench_alloc(), bench_alloc_sizes()
 * and bench_free() so that --api=bulk swaps in coralloc's bulk calls
 *     size_t coral_malloc_bulk(size_t size, size_t n, void **out);
 *     size_t coral_malloc_bulk_sizes(const size_t *sizes, size_t n, void **out);
 *     void coral_free_bulk(void **ptrs, size_t n);
 * resolved with dlsym, so the program still runs under any other allocator
 * (it then says api=plain and uses malloc/free). Random sizes are drawn
 * into an array before each round's allocations in both modes, so the two
 * modes do the same harness work: plain mode mallocs over the array, bulk
 * mode passes it to coral_malloc_bulk_sizes (a coralloc without that call
 * mallocs over it, and says sizes_call=0).
 *
 * The harness's choices are branch-free (which slots are empty, which
 * blocks a random half releases): an unpredictable branch per block would
 * cost both modes alike and hide the allocator's share of the time.
 *
 * --api=null takes no allocator at all: blocks come from a stack of free
 * blocks per 16-byte size bin (null_take below), a pop and a push each,
 * about 38 instructions per block in all. Its figure is what an allocator
 * with no bookkeeping at all reaches in these loops: divided by the plain
 * figure, a bound on what a bulk API can gain for random sizes, where
 * every allocator must find each block's bin. (For fixed sizes coralloc's
 * bulk calls, which fill and link whole arrays, cost less than this
 * per-block stack.)
 *
 * Figure: ops_per_sec, one op = one block allocated and freed.
 */
#include "common.h"

typedef size_t (*bulk_alloc_fn)(size_t size, size_t n, void **out);
typedef size_t (*bulk_alloc_sizes_fn)(const size_t *sizes, size_t n, void **out);
typedef void (*bulk_free_fn)(void **ptrs, size_t n);

static bulk_alloc_fn g_bulk_alloc;
static bulk_alloc_sizes_fn g_bulk_alloc_sizes;
static bulk_free_fn g_bulk_free;

/* --api=null: no allocator, only stacks of blocks. Each 16-byte size bin
 * (sizes 16b-15 .. 16b; one bin for fixed sizes) has its own area of
 * --inner blocks, carved in order, and a stack of its freed blocks, taken
 * first: a block costs a pop and a push, with no list to chase and no
 * bookkeeping. With random sizes a block's bin is in the 16 bytes before
 * it (where a real allocator would keep a header). */
typedef struct {
    void **stack; /* freed blocks: stack[0..top) */
    size_t top;
    unsigned char *next; /* the next block never carved */
    size_t stride;       /* bytes per block, header included */
    unsigned char *area; /* room for --inner blocks: a bin never has more
                          * (it carves only when none of its own is free) */
} null_bin_t;

static null_bin_t *g_null_bins; /* NULL: not --api=null */
static size_t g_null_count;
static int g_null_header; /* random sizes: blocks have a bin header */

static void null_make(size_t n, size_t min, size_t max) {
    g_null_header = min != max;
    g_null_count = g_null_header ? (max + 15) / 16 + 1 : 1;
    g_null_bins = (null_bin_t *)xmalloc(sizeof(null_bin_t) * g_null_count);
    for (size_t b = 0; b < g_null_count; b++) {
        size_t bytes = g_null_header ? 16 * b + 16 : (max + 15) & ~(size_t)15;
        null_bin_t *bin = &g_null_bins[b];
        bin->stack = (void **)xmalloc(sizeof(void *) * n);
        bin->top = 0;
        bin->stride = bytes;
        /* (an untouched area costs no memory: only carved blocks do) */
        bin->next = bin->area = (unsigned char *)xmalloc(n * bytes);
    }
}

static void null_unmake(void) {
    for (size_t b = 0; b < g_null_count; b++) {
        free(g_null_bins[b].stack);
        free(g_null_bins[b].area);
    }
    free(g_null_bins);
}

/* A block of `size` bytes: the bin's last freed one, else its next never
 * carved (with its header when sizes vary). */
static void *null_take(size_t size) {
    size_t b = g_null_header ? (size + 15) >> 4 : 0;
    null_bin_t *bin = &g_null_bins[b];
    if (bin->top) return bin->stack[--bin->top];
    unsigned char *p = bin->next;
    bin->next += bin->stride;
    if (!g_null_header) return p;
    *(size_t *)p = b;
    return p + 16;
}

/* p (from null_take) back on its bin's stack. */
static void null_give(void *p) {
    size_t b = g_null_header ? *(size_t *)((unsigned char *)p - 16) : 0;
    null_bin_t *bin = &g_null_bins[b];
    bin->stack[bin->top++] = p;
}

/* n blocks of `size` bytes into out[0..n) */
static void bench_alloc(size_t size, size_t n, void **out) {
    if (g_null_bins) {
        for (size_t i = 0; i < n; i++) out[i] = null_take(size);
        return;
    }
    if (g_bulk_alloc) {
        size_t got = g_bulk_alloc(size, n, out);
        if (got != n) out_of_memory(size);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = malloc(size);
        if (out[i] == NULL) out_of_memory(size);
    }
}

/* n blocks of sizes[0..n) bytes into out[0..n) */
static void bench_alloc_sizes(const size_t *sizes, size_t n, void **out) {
    if (g_null_bins) {
        for (size_t i = 0; i < n; i++) out[i] = null_take(sizes[i]);
        return;
    }
    if (g_bulk_alloc_sizes) {
        size_t got = g_bulk_alloc_sizes(sizes, n, out);
        if (got != n) out_of_memory(sizes[got]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = malloc(sizes[i]);
        if (out[i] == NULL) out_of_memory(sizes[i]);
    }
}

/* free ptrs[0..n) (any sizes) */
static void bench_free(void **ptrs, size_t n) {
    if (g_null_bins) {
        for (size_t i = 0; i < n; i++) null_give(ptrs[i]);
        return;
    }
    if (g_bulk_free) {
        g_bulk_free(ptrs, n);
        return;
    }
    for (size_t i = 0; i < n; i++) free(ptrs[i]);
}

static long g_memset = 1;

static void touch(void *p, size_t size, uint64_t tag) {
    if (g_memset)
        block_fill(p, size, tag);
    else
        tag_put(p, size, tag);
}

static int touched_ok(const void *p, size_t size, uint64_t tag, int full) {
    return g_memset ? block_ok(p, size, tag, full) : tag_ok(p, size, tag);
}

int main(int argc, char **argv) {
    long outer = 1000, inner = 1000, min = 64, max = 64, seed = 1;
    const char *release = "all", *api = "plain";
    opt_t opts[] = {
        {"outer", "rounds", &outer, NULL},
        {"inner", "blocks per round", &inner, NULL},
        {"min", "smallest block size (bytes)", &min, NULL},
        {"max", "largest block size (bytes; = min for fixed sizes)", &max, NULL},
        {"release", "all | subset (a random half each round)", NULL, &release},
        {"memset", "1: fill every block, 0: write a tag only", &g_memset, NULL},
        {"api",
         "plain (malloc/free) | bulk (coral_malloc_bulk/coral_free_bulk) | null (no allocator: "
         "a stack of free blocks per size bin)",
         NULL, &api},
        {"seed", "random seed", &seed, NULL},
    };
    OPTS_PARSE(argc, argv, "Batches of allocations released in full or in part.", opts);
    int subset;
    if (strcmp(release, "all") == 0)
        subset = 0;
    else if (strcmp(release, "subset") == 0)
        subset = 1;
    else
        usage_error("bulk: --release must be all or subset, not '%s'", release);
    if (strcmp(api, "bulk") == 0) {
        g_bulk_alloc = (bulk_alloc_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "coral_malloc_bulk");
        g_bulk_free = (bulk_free_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "coral_free_bulk");
        if (!g_bulk_alloc || !g_bulk_free)
            g_bulk_alloc = NULL, g_bulk_free = NULL;
        else
            g_bulk_alloc_sizes =
                (bulk_alloc_sizes_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "coral_malloc_bulk_sizes");
    } else if (strcmp(api, "plain") != 0 && strcmp(api, "null") != 0) {
        usage_error("bulk: --api must be plain, bulk or null, not '%s'", api);
    }
    if (inner < 1 || min < 1 || max < min) usage_error("bulk: need inner >= 1, 1 <= min <= max");
    if (strcmp(api, "null") == 0) null_make((size_t)inner, (size_t)min, (size_t)max);

    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    size_t n = (size_t)inner;
    void **slot = (void **)xmalloc(sizeof(void *) * n);
    uint32_t *sizes = (uint32_t *)xmalloc(sizeof(uint32_t) * n);
    uint64_t *tags = (uint64_t *)xmalloc(sizeof(uint64_t) * n);
    size_t *empty = (size_t *)xmalloc(sizeof(size_t) * n);
    size_t *pick = (size_t *)xmalloc(sizeof(size_t) * n);
    size_t *want = (size_t *)xmalloc(sizeof(size_t) * n);
    void **tmp = (void **)xmalloc(sizeof(void *) * n);
    memset(slot, 0, sizeof(void *) * n);
    uint64_t counter = 0, allocs = 0, frees = 0, alloc_sum = 0, free_sum = 0;
    int fixed = (min == max);

    double t0 = now_sec();
    for (long r = 0; r < outer; r++) {
        /* allocate every empty slot (listed without a branch per slot:
         * i is written at the end of the list, which grows when it is empty) */
        size_t ne = 0;
        for (size_t i = 0; i < n; i++) {
            empty[ne] = i;
            ne += slot[i] == NULL;
        }
        if (fixed) {
            bench_alloc((size_t)min, ne, tmp);
            for (size_t k = 0; k < ne; k++)
                slot[empty[k]] = tmp[k], sizes[empty[k]] = (uint32_t)min;
        } else {
            for (size_t k = 0; k < ne; k++)
                want[k] = (size_t)rng_range(&rng, (uint64_t)min, (uint64_t)max);
            bench_alloc_sizes(want, ne, tmp);
            for (size_t k = 0; k < ne; k++)
                slot[empty[k]] = tmp[k], sizes[empty[k]] = (uint32_t)want[k];
        }
        for (size_t k = 0; k < ne; k++) {
            size_t i = empty[k];
            tags[i] = tag_make((uint64_t)r, ++counter);
            touch(slot[i], sizes[i], tags[i]);
            alloc_sum += tags[i];
        }
        allocs += ne;
        /* release all, or a random subset (each block kept when its draw's
         * low bit is set; the picks listed without a branch, as above),
         * checking each block */
        size_t np = n;
        if (subset) {
            np = 0;
            for (size_t i = 0; i < n; i++) {
                pick[np] = i;
                np += (size_t)(~rng_next(&rng) & 1);
            }
        }
        size_t nf = 0;
        for (size_t k = 0; k < np; k++) {
            size_t i = subset ? pick[k] : k;
            if (!touched_ok(slot[i], sizes[i], tags[i], (i & 63) == 0))
                check_failed("bulk: round %ld block %zu (%u bytes) was overwritten", r, i,
                             sizes[i]);
            free_sum += tags[i];
            tmp[nf++] = slot[i];
            slot[i] = NULL;
        }
        bench_free(tmp, nf);
        frees += nf;
    }
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        if (slot[i] == NULL) continue;
        if (!touched_ok(slot[i], sizes[i], tags[i], 1))
            check_failed("bulk: block %zu was overwritten at the end", i);
        free_sum += tags[i];
        tmp[nf++] = slot[i];
    }
    bench_free(tmp, nf);
    frees += nf;
    double elapsed = now_sec() - t0;

    if (allocs != frees || alloc_sum != free_sum)
        check_failed("bulk: %llu allocated, %llu freed, checksums %s", (unsigned long long)allocs,
                     (unsigned long long)frees, alloc_sum == free_sum ? "equal" : "differ");
    free(slot);
    free(sizes);
    free(tags);
    free(empty);
    free(pick);
    free(want);
    free(tmp);
    if (g_null_bins) null_unmake();
    report_malloc_lib();
    printf("info: api=%s sizes_call=%d outer=%ld inner=%ld sizes=%ld-%ld release=%s memset=%ld "
           "blocks=%llu "
           "seconds=%.4f\n",
           g_null_bins    ? "null"
           : g_bulk_alloc ? "bulk"
                          : "plain",
           g_bulk_alloc_sizes != NULL, outer, inner, min, max, release, g_memset,
           (unsigned long long)allocs, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)allocs / elapsed);
    return 0;
}
