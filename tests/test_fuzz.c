/* test_fuzz: a deterministic random-operation fuzzer of the coral_ API,
 * checked against a shadow model (every build configuration).
 *
 * Each of T threads (default 3: more than the cores) runs its own random
 * sequence of operations, drawn from a seeded generator:
 *   coral_malloc, coral_calloc (zero checked), coral_realloc and
 *   coral_reallocarray (grow, shrink, same, to 0; the kept prefix checked),
 *   coral_aligned_alloc / coral_posix_memalign / coral_memalign (16 B ..
 *   1 MiB), coral_free, coral_free_sized / coral_free_aligned_sized,
 *   coral_malloc_usable_size (stable, >= the request, all of it written),
 *   coral_malloc_bulk / coral_malloc_bulk_sizes / coral_free_bulk (batches of
 *   any sizes and owners),
 *   hand-offs of blocks to another thread through a locked queue (the
 *   receiver checks them and frees, reallocs or bulk-frees them: remote
 *   frees of small, large and huge blocks), and now and then coral_collect.
 * Sizes are skewed: mostly 0-256 B, some up to 64 KiB, a few up to 512 KiB,
 * rare 512 KiB - 12 MiB (large and huge blocks); one in 8 is the size of a
 * block freed lately, so freed memory is asked for again (calloc of it too).
 *
 * The shadow model holds every live block: pointer, requested size, usable
 * size, alignment, how it was made, and a pattern seed. Every block carries
 * its pattern (testutil.h) and is checked before it is freed, reallocated
 * or handed over. New blocks are checked for alignment, coral_owns, and
 * usable size (== coral_good_size for malloc and bulk, as coralloc.h says).
 * The thread's live blocks are checked for overlap every 4096 operations;
 * at 3 checkpoints and at the end the threads meet at a barrier and one of
 * them checks the blocks of all threads (and those in flight in the queues)
 * for overlap and pattern. At the end each thread frees half its blocks;
 * the main thread frees the rest after the threads have exited (frees into
 * abandoned heaps).
 *
 * The run alternates grow phases (mostly allocations, up to 3000 blocks or
 * 64 MiB per thread) and shrink phases (mostly frees, down to empty) of
 * 20000 operations (fewer in short runs: at least 8 phases), so
 * pages and segments are retired and reused.
 *
 * Environment:
 *   CORAL_FUZZ_SEED     the seed (decimal or 0x...; default 0xC0FA11C)
 *   CORAL_FUZZ_OPS      operations per thread (default: see DEFAULT_OPS)
 *   CORAL_FUZZ_THREADS  threads, 1..16 (default 3)
 * A failure prints the seed, the thread and the operation index (and the
 * thread's last operations). With CORAL_FUZZ_THREADS=1 a run is exactly
 * reproducible; with several threads each thread's own choices are, but
 * what it receives from the others depends on the timing.
 */
#define _GNU_SOURCE
#include "coralloc.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

#if defined(CORAL_TEST_ASAN) || defined(CORAL_TEST_TSAN)
#if defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/common_interface_defs.h>
#define FUZZ_DEATH_CALLBACK 1
#endif
#endif
#endif

/* Operations per thread, by build (release: about 3-5 s on 2 cores). */
#if defined(CORAL_TEST_TSAN)
#define DEFAULT_OPS 100000
#elif defined(CORAL_TEST_ASAN)
#define DEFAULT_OPS 400000
#else
#define DEFAULT_OPS 1000000
#endif

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
/* Functions, not macros: an argument may draw a random number. */
static inline size_t MIN(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t MAX(size_t a, size_t b) { return a > b ? a : b; }

enum {
    MAX_THREADS = 16,
    MAX_LIVE = 3000,    /* live blocks per thread */
    QCAP = 1024,        /* hand-off queue per thread */
    BULK_MAX = 48,      /* blocks per bulk call */
    HANDOFF_MAX = 8,    /* blocks per hand-off */
    PHASE_OPS = 20000,  /* grow, then shrink phases, this long (at most) */
    LOCAL_CHECK = 4096, /* own blocks checked for overlap this often */
    CHECKPOINTS = 3,    /* global checks during the run (and one at the end) */
    HISTORY = 16,       /* operations remembered for a failure report */
    RECENT = 16,        /* freed sizes remembered, to ask for them again */
};
#define LIVE_BYTES_CAP (64 * MiB) /* per thread */

/* ---- operations ------------------------------------------------------------ */

enum {
    OP_MALLOC,
    OP_CALLOC,
    OP_ALIGNED,
    OP_REALLOC,
    OP_FREE,
    OP_FREE_SIZED,
    OP_USABLE,
    OP_BULK_MALLOC,
    OP_BULK_FREE,
    OP_HANDOFF,
    OP_ADOPT,
    OP_COLLECT,
    OP_CHECK, /* not drawn: the periodic and final checks */
    OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
    "malloc",      "calloc",    "aligned", "realloc", "free",    "free_sized", "usable_size",
    "bulk_malloc", "bulk_free", "handoff", "adopt",   "collect", "check"};

/* Weights of the drawn operations in the grow and shrink phases. */
static const unsigned weights[2][OP_CHECK] = {
    /* malloc calloc aligned realloc free free_sized usable bulk_m bulk_f handoff adopt collect */
    {260, 70, 50, 150, 120, 60, 50, 25, 12, 45, 40, 1},
    {90, 25, 20, 150, 300, 120, 50, 6, 40, 50, 60, 1},
};

/* How a block was made (for the reports). */
enum { K_MALLOC, K_CALLOC, K_ALIGNED, K_REALLOC, K_BULK };
static const char *const kind_names[] = {"malloc", "calloc", "aligned", "realloc", "bulk"};

typedef struct {
    unsigned char *p;
    size_t size;   /* requested */
    size_t usable; /* coral_malloc_usable_size when made */
    size_t filled; /* bytes carrying the pattern: size, or usable */
    size_t align;  /* alignment asked for (16: none) */
    uint64_t seed;
    uint8_t kind;
    uint8_t maker; /* thread that allocated it */
} blk;

typedef struct {
    int op;
    uint64_t index;
    size_t size;
    const void *p;
} hist;

typedef struct {
    int id;
    tu_rng rng;
    blk live[MAX_LIVE];
    size_t nlive;
    size_t live_bytes;
    uint64_t next_seed;
    uint64_t op_index;
    int cur_op;
    uint64_t counts[OP_COUNT];
    uint64_t received, sent, sent_big, huge_allocs, emptied;
    size_t max_live;
    hist history[HISTORY];
    unsigned hist_pos;
    size_t recent[RECENT]; /* sizes of blocks freed lately */
    unsigned nrecent;
} fstate;

typedef struct {
    pthread_mutex_t lock;
    size_t head, count;
    blk items[QCAP];
} fqueue;

static fstate *states[MAX_THREADS];
static fqueue queues[MAX_THREADS];
static pthread_barrier_t barrier;
static int nthreads = 3;
static uint64_t base_seed = 0xC0FA11Cull;
static uint64_t nops = DEFAULT_OPS;
static uint64_t phase_ops = PHASE_OPS; /* shorter for short runs: nops / 8 */

/* What each thread is doing, for the crash reports (any thread reads). */
static _Atomic uint64_t progress_op[MAX_THREADS];
static _Atomic int progress_kind[MAX_THREADS];

/* ---- failure reports ----------------------------------------------------------- */

static void print_progress(int fd) {
    char buf[256];
    int n = snprintf(buf, sizeof buf,
                     "fuzz: replay with CORAL_FUZZ_SEED=0x%llx CORAL_FUZZ_OPS=%llu "
                     "CORAL_FUZZ_THREADS=%d\n",
                     (unsigned long long)base_seed, (unsigned long long)nops, nthreads);
    if (n > 0) (void)!write(fd, buf, (size_t)n);
    for (int t = 0; t < nthreads; t++) {
        uint64_t op = atomic_load_explicit(&progress_op[t], memory_order_relaxed);
        int k = atomic_load_explicit(&progress_kind[t], memory_order_relaxed);
        n = snprintf(buf, sizeof buf, "fuzz:   thread %d was at op %llu (%s)\n", t,
                     (unsigned long long)op, k >= 0 && k < OP_COUNT ? op_names[k] : "?");
        if (n > 0) (void)!write(fd, buf, (size_t)n);
    }
}

static void fuzz_fail(const fstate *st, int line, const char *fmt, ...)
    __attribute__((noreturn, cold, format(printf, 3, 4)));
/* The first thread to fail reports; the others wait for its _exit. */
static atomic_int failing;
static void wait_for_exit(void) {
    for (;;) pause();
}

static void fuzz_fail(const fstate *st, int line, const char *fmt, ...) {
    va_list ap;
    if (atomic_exchange(&failing, 1)) wait_for_exit();
    fflush(stdout);
    fprintf(stderr, "%s:%d: FUZZ FAILURE (seed 0x%llx, ", __FILE__, line,
            (unsigned long long)base_seed);
    if (st != NULL)
        fprintf(stderr, "thread %d, op %llu %s): ", st->id, (unsigned long long)st->op_index,
                op_names[st->cur_op]);
    else
        fprintf(stderr, "main thread, final frees): ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (st != NULL) {
        fprintf(stderr, "fuzz: last operations of thread %d:\n", st->id);
        for (unsigned i = 0; i < HISTORY; i++) {
            const hist *h = &st->history[(st->hist_pos + i) % HISTORY];
            if (h->op < 0 || (h->index == 0 && h->p == NULL && h->size == 0)) continue;
            fprintf(stderr, "fuzz:   op %llu %s size %zu -> %p\n", (unsigned long long)h->index,
                    op_names[h->op], h->size, h->p);
        }
    }
    fflush(stderr);
    print_progress(2);
    _exit(1);
}
#define FAIL(st, ...) fuzz_fail((st), __LINE__, __VA_ARGS__)
#define FCHECK(st, cond, fmt, ...)                                                                 \
    do {                                                                                           \
        if (!(cond)) FAIL(st, "CHECK(%s) failed: " fmt, #cond, ##__VA_ARGS__);                     \
    } while (0)

/* A crash in the allocator (or coral_fatal's abort): say where the fuzzer
 * was, then die of the same signal. */
static __thread int crash_thread = -1;
static void crash_handler(int sig) {
    if (atomic_exchange(&failing, 1)) wait_for_exit();
    char msg[80];
    int n = snprintf(msg, sizeof msg, "fuzz: fatal signal %d in thread %d (-1: main)\n", sig,
                     crash_thread);
    if (n > 0) (void)!write(2, msg, (size_t)n);
    print_progress(2);
    signal(sig, SIG_DFL);
    raise(sig);
}

#if defined(FUZZ_DEATH_CALLBACK)
static void sanitizer_death(void) { print_progress(2); }
#endif
#if defined(CORAL_TEST_ASAN)
/* UBSan's halt does not run the death callback; this hook of its runtime
 * is called before each report is printed. */
void __ubsan_on_report(void);
void __ubsan_on_report(void) { print_progress(2); }
#endif

static void record(fstate *st, size_t size, const void *p) {
    hist *h = &st->history[st->hist_pos++ % HISTORY];
    h->op = st->cur_op;
    h->index = st->op_index;
    h->size = size;
    h->p = p;
}

/* ---- the model ----------------------------------------------------------------- */

/* Sizes: 75% 0-256 B, 24% up to 64 KiB, 0.9% up to 512 KiB, 0.1% up to
 * 12 MiB (log-uniform there, so most of those are 0.5-3 MiB). */
static size_t rand_size(fstate *st) {
    tu_rng *r = &st->rng;
    /* 1 in 8: a size freed lately (reuse of a free list, a large span, a
     * cached huge segment: where calloc must zero what it takes back) */
    if (st->nrecent > 0 && (rng_next(r) & 7) == 0)
        return st->recent[rng_range(r, 0, MIN(st->nrecent, RECENT) - 1)];
    unsigned k = (unsigned)(rng_next(r) % 10000);
    if (k < 7500) return rng_range(r, 0, (size_t)1 << rng_range(r, 3, 8));
    if (k < 9900) return rng_range(r, 257, (size_t)1 << rng_range(r, 9, 16));
    if (k < 9990) return rng_range(r, 64 * KiB + 1, (size_t)1 << rng_range(r, 17, 19));
    size_t top = (size_t)1 << rng_range(r, 20, 23);
    return MIN(rng_range(r, 512 * KiB, top), 12 * MiB);
}

static size_t rand_align(fstate *st) {
    tu_rng *r = &st->rng;
    unsigned k = (unsigned)(rng_next(r) % 100);
    if (k < 5) return 16;
    if (k < 55) return (size_t)1 << rng_range(r, 5, 8);   /* 32 .. 256 */
    if (k < 85) return (size_t)1 << rng_range(r, 9, 12);  /* 512 .. 4 KiB */
    if (k < 96) return (size_t)1 << rng_range(r, 13, 16); /* 8 .. 64 KiB */
    return (size_t)1 << rng_range(r, 17, 20);             /* 128 KiB .. 1 MiB */
}

static void check_pattern(fstate *st, const blk *b, const char *when) {
    size_t off = pattern_mismatch(b->p, b->filled, b->seed);
    if (off != (size_t)-1)
        FAIL(st,
             "%s: block %p (%s by thread %d, size %zu, usable %zu, alignment %zu) "
             "corrupted at offset %zu: byte 0x%02x",
             when, (void *)b->p, kind_names[b->kind], b->maker, b->size, b->usable, b->align, off,
             b->p[off]);
}

/* Checks a new block, fills its pattern and adds it to the model. */
static void add_block(fstate *st, void *p, size_t size, size_t align, int kind, int exact_usable) {
    FCHECK(st, p != NULL, "%s of %zu bytes (alignment %zu) failed: %s", kind_names[kind], size,
           align, strerror(errno));
    FCHECK(st, st->nlive < MAX_LIVE, "model full");
    FCHECK(st, (uintptr_t)p % MAX(align, (size_t)16) == 0, "%p from %s of %zu not aligned to %zu",
           p, kind_names[kind], size, MAX(align, (size_t)16));
    FCHECK(st, coral_owns(p), "coral_owns(%p) false for a %s of %zu", p, kind_names[kind], size);
    size_t us = coral_malloc_usable_size(p);
    FCHECK(st, us >= size, "usable size %zu < %zu requested (%s, alignment %zu)", us, size,
           kind_names[kind], align);
    if (exact_usable) {
        size_t good = coral_good_size(size);
        /* (the secure build reports the request: its canary is there) */
        FCHECK(st, us <= good, "usable size %zu of a %s of %zu, coral_good_size says %zu", us,
               kind_names[kind], size, good);
    }
    blk *b = &st->live[st->nlive++];
    b->p = p;
    b->size = size;
    b->usable = us;
    b->filled = size;
    b->align = align;
    b->seed = st->next_seed++;
    b->kind = (uint8_t)kind;
    b->maker = (uint8_t)st->id;
    fill_pattern(p, size, b->seed);
    st->live_bytes += size;
    if (st->nlive > st->max_live) st->max_live = st->nlive;
    if (size > 512 * KiB) st->huge_allocs++;
    record(st, size, p);
}

/* Takes block i out of the model (the caller frees it). */
static blk take_block(fstate *st, size_t i) {
    blk b = st->live[i];
    st->live[i] = st->live[--st->nlive];
    st->live_bytes -= b.size;
    if (st->nlive == 0) st->emptied++;
    return b;
}

static size_t pick(fstate *st) { return rng_range(&st->rng, 0, st->nlive - 1); }

/* Sometimes the biggest of a few random blocks (hand-offs of large ones). */
static size_t pick_big(fstate *st) {
    size_t best = pick(st);
    for (int i = 0; i < 5; i++) {
        size_t j = pick(st);
        if (st->live[j].size > st->live[best].size) best = j;
    }
    return best;
}

static void note_freed(fstate *st, size_t size) { st->recent[st->nrecent++ % RECENT] = size; }

static void free_one(fstate *st, blk *b, int sized) {
    note_freed(st, b->size);
    record(st, b->size, b->p);
    if (!sized)
        coral_free(b->p);
    else if (b->align > 16)
        coral_free_aligned_sized(b->p, b->align, b->size);
    else
        coral_free_sized(b->p, b->size);
}

/* ---- overlap ------------------------------------------------------------------- */

typedef struct {
    uintptr_t start, end;
    int holder; /* thread whose model (or queue, + MAX_THREADS) holds it */
    uint8_t kind, maker;
    size_t size;
} range;

static int range_cmp(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void add_range(range *r, size_t *n, const blk *b, int holder) {
    r[*n].start = (uintptr_t)b->p;
    r[*n].end = (uintptr_t)b->p + MAX(b->usable, (size_t)1);
    r[*n].holder = holder;
    r[*n].kind = b->kind;
    r[*n].maker = b->maker;
    r[*n].size = b->size;
    (*n)++;
}

static void check_ranges(fstate *st, range *r, size_t n) {
    qsort(r, n, sizeof *r, range_cmp);
    for (size_t i = 1; i < n; i++)
        if (r[i - 1].end > r[i].start)
            FAIL(st,
                 "live blocks overlap: [%#jx, %#jx) (%s of %zu by thread %d, held by %d) and "
                 "[%#jx, %#jx) (%s of %zu by thread %d, held by %d)",
                 (uintmax_t)r[i - 1].start, (uintmax_t)r[i - 1].end, kind_names[r[i - 1].kind],
                 r[i - 1].size, r[i - 1].maker, r[i - 1].holder, (uintmax_t)r[i].start,
                 (uintmax_t)r[i].end, kind_names[r[i].kind], r[i].size, r[i].maker, r[i].holder);
}

static range local_ranges[MAX_THREADS][MAX_LIVE];

static void check_local_overlap(fstate *st) {
    range *r = local_ranges[st->id];
    size_t n = 0;
    for (size_t i = 0; i < st->nlive; i++) add_range(r, &n, &st->live[i], st->id);
    check_ranges(st, r, n);
}

/* With every thread stopped at the barrier: all blocks of all models and
 * queues, for overlap and pattern. */
static void check_global(fstate *st) {
    int saved = st->cur_op;
    st->cur_op = OP_CHECK;
    size_t cap = (size_t)nthreads * (MAX_LIVE + QCAP), n = 0;
    range *r = malloc(cap * sizeof *r);
    CHECK_NOT_NULL(r);
    for (int t = 0; t < nthreads; t++) {
        fstate *o = states[t];
        for (size_t i = 0; i < o->nlive; i++) {
            check_pattern(st, &o->live[i], "global check");
            add_range(r, &n, &o->live[i], t);
        }
        fqueue *q = &queues[t];
        CHECK_EQ(pthread_mutex_lock(&q->lock), 0);
        for (size_t i = 0; i < q->count; i++) {
            const blk *b = &q->items[(q->head + i) % QCAP];
            check_pattern(st, b, "global check (in a queue)");
            add_range(r, &n, b, MAX_THREADS + t);
        }
        CHECK_EQ(pthread_mutex_unlock(&q->lock), 0);
    }
    check_ranges(st, r, n);
    free(r);
    st->cur_op = saved;
}

/* ---- the operations ---------------------------------------------------------------- */

static int can_allocate(const fstate *st, size_t blocks) {
    return st->nlive + blocks <= MAX_LIVE && st->live_bytes < LIVE_BYTES_CAP;
}

static void op_malloc(fstate *st) {
    size_t size = rand_size(st);
    add_block(st, coral_malloc(size), size, 16, K_MALLOC, 1);
}

static void op_calloc(fstate *st) {
    size_t total = rand_size(st), n, elem;
    switch (rng_next(&st->rng) % 3) {
    case 0:
        n = 1, elem = total;
        break;
    case 1:
        n = total, elem = 1;
        break;
    default:
        if (total % 16 == 0)
            n = total / 16, elem = 16;
        else
            n = total, elem = 1;
    }
    unsigned char *p = coral_calloc(n, elem);
    FCHECK(st, p != NULL, "calloc(%zu, %zu) failed: %s", n, elem, strerror(errno));
    size_t off = byte_mismatch(p, total, 0);
    if (off != (size_t)-1)
        FAIL(st, "calloc(%zu, %zu) = %p: byte at offset %zu is 0x%02x, not 0", n, elem, (void *)p,
             off, p[off]);
    add_block(st, p, total, 16, K_CALLOC, 0);
}

static void op_aligned(fstate *st) {
    size_t align = rand_align(st), size = rand_size(st);
    if (align >= 128 * KiB && size > 256 * KiB) size = rng_range(&st->rng, 0, 256 * KiB);
    void *p = NULL;
    switch (rng_next(&st->rng) % 3) {
    case 0:
        p = coral_aligned_alloc(align, size);
        break;
    case 1: {
        int rc = coral_posix_memalign(&p, align, size);
        FCHECK(st, rc == 0, "posix_memalign(%zu, %zu) = %d", align, size, rc);
        break;
    }
    default:
        p = coral_memalign(align, size);
        break;
    }
    add_block(st, p, size, align, K_ALIGNED, 0);
}

static void op_realloc(fstate *st) {
    tu_rng *r = &st->rng;
    size_t i = pick(st);
    blk *b = &st->live[i];
    check_pattern(st, b, "before realloc");
    size_t ns;
    unsigned k = (unsigned)(rng_next(r) % 100);
    if (k < 35) /* near the old size */
        ns = b->size + rng_range(r, 0, 64) - MIN(b->size, (size_t)32);
    else if (k < 65)
        ns = rand_size(st);
    else if (k < 82) /* shrink */
        ns = b->size / rng_range(r, 1, 4);
    else if (k < 98) { /* grow: big blocks less often, less (no runaway) */
        if (b->size < 256 * KiB) {
            size_t factor = rng_range(r, 2, 4);
            ns = b->size * factor + rng_range(r, 1, 256);
        } else if (rng_next(r) % 4 == 0) {
            ns = MIN(b->size + rng_range(r, 1, b->size), 16 * MiB);
        } else {
            ns = b->size / 2;
        }
    } else if (k < 99)
        ns = b->size; /* same */
    else
        ns = 0; /* frees (glibc's behaviour) */
    if (ns > b->size && ns - b->size > LIVE_BYTES_CAP - MIN(st->live_bytes, LIVE_BYTES_CAP))
        ns = b->size;
    void *q;
    if (ns != 0 && ns % 8 == 0 && (rng_next(r) & 3) == 0)
        q = coral_reallocarray(b->p, ns / 8, 8);
    else
        q = coral_realloc(b->p, ns);
    record(st, ns, q);
    if (ns == 0) {
        if (q == NULL) {
            take_block(st, i);
            return;
        }
        /* An implementation may give a block instead: treat it as one. */
    }
    FCHECK(st, q != NULL, "realloc(%p, %zu) from %zu failed: %s", (void *)b->p, ns, b->size,
           strerror(errno));
    FCHECK(st, (uintptr_t)q % 16 == 0, "realloc gave %p", q);
    FCHECK(st, coral_owns(q), "coral_owns(%p) false after realloc", q);
    size_t us = coral_malloc_usable_size(q);
    FCHECK(st, us >= ns, "usable size %zu < %zu after realloc", us, ns);
    size_t keep = MIN(b->size, ns);
    size_t off = pattern_mismatch(q, keep, b->seed);
    if (off != (size_t)-1)
        FAIL(st,
             "realloc(%p, %zu) = %p of a %s of %zu (by thread %d, alignment %zu): kept prefix of "
             "%zu bytes lost at offset %zu: byte 0x%02x",
             (void *)b->p, ns, q, kind_names[b->kind], b->size, b->maker, b->align, keep, off,
             ((unsigned char *)q)[off]);
    st->live_bytes = st->live_bytes - b->size + ns;
    if (q != (void *)b->p) note_freed(st, b->size);
    b->p = q;
    b->size = ns;
    b->usable = us;
    b->filled = ns;
    b->align = 16;
    b->kind = K_REALLOC;
    b->seed = st->next_seed++;
    fill_pattern(q, ns, b->seed);
    if (ns > 512 * KiB) st->huge_allocs++;
}

static void op_free(fstate *st, int sized) {
    blk b = take_block(st, pick(st));
    check_pattern(st, &b, "before free");
    free_one(st, &b, sized);
}

static void op_usable(fstate *st) {
    blk *b = &st->live[pick(st)];
    check_pattern(st, b, "before usable_size");
    size_t us = coral_malloc_usable_size(b->p);
    FCHECK(st, us == b->usable, "usable size of %p (%s of %zu) changed from %zu to %zu",
           (void *)b->p, kind_names[b->kind], b->size, b->usable, us);
    /* All of it is ours: write it all (the same seed keeps the prefix). */
    fill_pattern(b->p, us, b->seed);
    b->filled = us;
    record(st, us, b->p);
}

static void op_bulk_malloc(fstate *st) {
    tu_rng *r = &st->rng;
    size_t n = rng_range(r, 1, BULK_MAX), size;
    unsigned k = (unsigned)(rng_next(r) % 100);
    if (k < 80)
        size = rng_range(r, 0, (size_t)1 << rng_range(r, 3, 8));
    else if (k < 97)
        size = rng_range(r, 257, (size_t)1 << rng_range(r, 9, 16));
    else { /* large: few blocks */
        size = rng_range(r, 64 * KiB, (size_t)1 << rng_range(r, 17, 21));
        n = rng_range(r, 1, 3);
    }
    if (st->nlive + n > MAX_LIVE) n = MAX_LIVE - st->nlive;
    if (n == 0) return;
    void *out[BULK_MAX];
    /* Half the small batches: a size per block (coral_malloc_bulk_sizes). */
    size_t sizes[BULK_MAX];
    int per_block = k < 97 && (rng_next(r) & 1);
    for (size_t j = 0; j < n; j++)
        sizes[j] = per_block ? rng_range(r, 0, (size_t)1 << rng_range(r, 3, 12)) : size;
    size_t got =
        per_block ? coral_malloc_bulk_sizes(sizes, n, out) : coral_malloc_bulk(size, n, out);
    FCHECK(st, got == n, "coral_malloc_bulk%s(%zu, %zu) gave %zu: %s", per_block ? "_sizes" : "",
           size, n, got, strerror(errno));
    range rr[BULK_MAX];
    size_t nr = 0;
    size_t first = st->nlive;
    for (size_t j = 0; j < n; j++) add_block(st, out[j], sizes[j], 16, K_BULK, 1);
    for (size_t j = first; j < st->nlive; j++) add_range(rr, &nr, &st->live[j], st->id);
    check_ranges(st, rr, nr);
    for (size_t j = first; j < st->nlive; j++) check_pattern(st, &st->live[j], "after bulk");
}

static void op_bulk_free(fstate *st) {
    tu_rng *r = &st->rng;
    size_t n = MIN(rng_range(r, 1, BULK_MAX), st->nlive), m = 0;
    void *ptrs[2 * BULK_MAX];
    for (size_t j = 0; j < n; j++) {
        blk b = take_block(st, pick(st));
        check_pattern(st, &b, "before free_bulk");
        if ((rng_next(r) & 15) == 0) ptrs[m++] = NULL; /* skipped */
        ptrs[m++] = b.p;
        note_freed(st, b.size);
    }
    record(st, m, ptrs[0]);
    coral_free_bulk(ptrs, m);
}

static int q_push(fqueue *q, const blk *b) {
    int ok = 0;
    CHECK_EQ(pthread_mutex_lock(&q->lock), 0);
    if (q->count < QCAP) {
        q->items[(q->head + q->count) % QCAP] = *b;
        q->count++;
        ok = 1;
    }
    CHECK_EQ(pthread_mutex_unlock(&q->lock), 0);
    return ok;
}

static size_t q_pop(fqueue *q, blk *out, size_t max) {
    size_t n = 0;
    CHECK_EQ(pthread_mutex_lock(&q->lock), 0);
    while (n < max && q->count > 0) {
        out[n++] = q->items[q->head];
        q->head = (q->head + 1) % QCAP;
        q->count--;
    }
    CHECK_EQ(pthread_mutex_unlock(&q->lock), 0);
    return n;
}

static void op_handoff(fstate *st) {
    tu_rng *r = &st->rng;
    int to = nthreads == 1 ? 0 : (st->id + 1 + (int)rng_range(r, 0, nthreads - 2)) % nthreads;
    size_t n = MIN(rng_range(r, 1, HANDOFF_MAX), st->nlive);
    for (size_t j = 0; j < n; j++) {
        size_t i = (rng_next(r) & 3) == 0 ? pick_big(st) : pick(st);
        check_pattern(st, &st->live[i], "before hand-off");
        if (!q_push(&queues[to], &st->live[i])) break;
        record(st, st->live[i].size, st->live[i].p);
        st->sent_big += st->live[i].size > 512 * KiB;
        take_block(st, i);
        st->sent++;
    }
}

/* Blocks from the others: checked, then freed in one bulk call, or kept. */
static void op_adopt(fstate *st) {
    blk got[64];
    size_t n = q_pop(&queues[st->id], got, 64);
    if (n == 0) return;
    st->received += n;
    for (size_t j = 0; j < n; j++) check_pattern(st, &got[j], "received from another thread");
    if ((rng_next(&st->rng) % 3) == 0) {
        void *ptrs[64];
        for (size_t j = 0; j < n; j++) ptrs[j] = got[j].p;
        record(st, n, ptrs[0]);
        coral_free_bulk(ptrs, n);
        return;
    }
    for (size_t j = 0; j < n; j++) {
        if (st->nlive < MAX_LIVE) {
            st->live[st->nlive++] = got[j];
            st->live_bytes += got[j].size;
            record(st, got[j].size, got[j].p);
        } else {
            free_one(st, &got[j], (int)(rng_next(&st->rng) & 1));
        }
    }
    if (st->nlive > st->max_live) st->max_live = st->nlive;
}

static int draw_op(fstate *st) {
    int shrink = (int)((st->op_index / phase_ops) & 1);
    const unsigned *w = weights[shrink];
    unsigned total = 0;
    for (int k = 0; k < OP_CHECK; k++) total += w[k];
    unsigned x = (unsigned)(rng_next(&st->rng) % total);
    int op = 0;
    while (x >= w[op]) x -= w[op++];
    int allocating = op == OP_MALLOC || op == OP_CALLOC || op == OP_ALIGNED ||
                     op == OP_BULK_MALLOC || op == OP_ADOPT;
    if (allocating && !can_allocate(st, op == OP_BULK_MALLOC ? BULK_MAX : 1))
        op = (rng_next(&st->rng) & 1) ? OP_FREE : OP_BULK_FREE;
    int needs_block = op == OP_REALLOC || op == OP_FREE || op == OP_FREE_SIZED || op == OP_USABLE ||
                      op == OP_BULK_FREE || op == OP_HANDOFF;
    if (needs_block && st->nlive == 0) op = OP_MALLOC;
    return op;
}

static void run_op(fstate *st, int op) {
    st->cur_op = op;
    atomic_store_explicit(&progress_kind[st->id], op, memory_order_relaxed);
    atomic_store_explicit(&progress_op[st->id], st->op_index, memory_order_relaxed);
    st->counts[op]++;
    switch (op) {
    case OP_MALLOC:
        op_malloc(st);
        break;
    case OP_CALLOC:
        op_calloc(st);
        break;
    case OP_ALIGNED:
        op_aligned(st);
        break;
    case OP_REALLOC:
        op_realloc(st);
        break;
    case OP_FREE:
        op_free(st, 0);
        break;
    case OP_FREE_SIZED:
        op_free(st, 1);
        break;
    case OP_USABLE:
        op_usable(st);
        break;
    case OP_BULK_MALLOC:
        op_bulk_malloc(st);
        break;
    case OP_BULK_FREE:
        op_bulk_free(st);
        break;
    case OP_HANDOFF:
        op_handoff(st);
        break;
    case OP_ADOPT:
        op_adopt(st);
        break;
    case OP_COLLECT:
        if ((rng_next(&st->rng) & 63) == 0) { /* about once per 64k ops */
            record(st, 0, NULL);
            coral_collect((int)(rng_next(&st->rng) & 1));
        } else {
            st->counts[op]--; /* counted when done */
        }
        break;
    default:
        FAIL(st, "bad op %d", op);
    }
}

static void meet(void) {
    int rc = pthread_barrier_wait(&barrier);
    CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD);
}

/* Blocks each thread leaves for the main thread to free after it exited. */
static blk *leftovers[MAX_THREADS];
static size_t nleftovers[MAX_THREADS];

static void *worker(void *arg) {
    fstate *st = arg;
    crash_thread = st->id;
    uint64_t checkpoint = nops / (CHECKPOINTS + 1);
    for (st->op_index = 0; st->op_index < nops; st->op_index++) {
        run_op(st, draw_op(st));
        if ((st->op_index + 1) % LOCAL_CHECK == 0) {
            st->cur_op = OP_CHECK;
            check_local_overlap(st);
        }
        if (checkpoint > 0 && (st->op_index + 1) % checkpoint == 0 &&
            (st->op_index + 1) / checkpoint <= CHECKPOINTS) {
            st->cur_op = OP_CHECK;
            meet();
            if (st->id == 0) check_global(st);
            meet();
        }
    }
    st->cur_op = OP_CHECK;
    /* The end: take in what is still queued for us, then one global check. */
    meet();
    blk got[64];
    size_t n;
    while ((n = q_pop(&queues[st->id], got, 64)) > 0)
        for (size_t j = 0; j < n; j++) {
            check_pattern(st, &got[j], "received at the end");
            st->received++;
            if (st->nlive < MAX_LIVE) {
                st->live[st->nlive++] = got[j];
                st->live_bytes += got[j].size;
            } else {
                coral_free(got[j].p);
            }
        }
    meet();
    if (st->id == 0) check_global(st);
    meet();
    /* Free about half of ours (one by one and in bulk); leave the rest. */
    void *ptrs[BULK_MAX];
    size_t m = 0;
    while (st->nlive > 0 && (rng_next(&st->rng) & 1)) {
        blk b = take_block(st, pick(st));
        if (rng_next(&st->rng) & 1) {
            free_one(st, &b, (int)(rng_next(&st->rng) & 1));
        } else {
            ptrs[m++] = b.p;
            if (m == BULK_MAX) coral_free_bulk(ptrs, m), m = 0;
        }
    }
    coral_free_bulk(ptrs, m);
    leftovers[st->id] = st->live;
    nleftovers[st->id] = st->nlive;
    return NULL;
}

/* ---- main ---------------------------------------------------------------------- */

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return dflt;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0') {
        fprintf(stderr, "test_fuzz: bad %s=%s\n", name, s);
        exit(2);
    }
    return v;
}

int main(void) {
    base_seed = env_u64("CORAL_FUZZ_SEED", base_seed);
    nops = env_u64("CORAL_FUZZ_OPS", nops);
    uint64_t nt = env_u64("CORAL_FUZZ_THREADS", (uint64_t)nthreads);
    if (nt < 1 || nt > MAX_THREADS) {
        fprintf(stderr, "test_fuzz: CORAL_FUZZ_THREADS must be 1..%d\n", MAX_THREADS);
        return 2;
    }
    nthreads = (int)nt;
    if (nops / 8 < phase_ops) phase_ops = nops / 8 > 500 ? nops / 8 : 500;
    printf("fuzz: seed 0x%llx, %llu ops x %d threads (replay: CORAL_FUZZ_SEED=0x%llx "
           "CORAL_FUZZ_OPS=%llu CORAL_FUZZ_THREADS=%d)\n",
           (unsigned long long)base_seed, (unsigned long long)nops, nthreads,
           (unsigned long long)base_seed, (unsigned long long)nops, nthreads);
    fflush(stdout);

#if defined(FUZZ_DEATH_CALLBACK)
    __sanitizer_set_death_callback(sanitizer_death);
#else
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], crash_handler);
#endif
    (void)crash_handler;

    double t0 = now_seconds();
    CHECK_EQ(pthread_barrier_init(&barrier, NULL, (unsigned)nthreads), 0);
    pthread_t th[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        CHECK_EQ(pthread_mutex_init(&queues[t].lock, NULL), 0);
        /* The model lives in the system's memory, not coralloc's. */
        states[t] = calloc(1, sizeof(fstate));
        CHECK_NOT_NULL(states[t]);
        states[t]->id = t;
        tu_rng mix = {base_seed ^ (0x5851F42D4C957F2Dull * (uint64_t)(t + 1))};
        states[t]->rng.s = rng_next(&mix);
        states[t]->next_seed = (uint64_t)t << 48;
    }
    for (int t = 0; t < nthreads; t++) CHECK_EQ(pthread_create(&th[t], NULL, worker, states[t]), 0);
    for (int t = 0; t < nthreads; t++) CHECK_EQ(pthread_join(th[t], NULL), 0);

    /* The threads are gone: their blocks are freed from here (heaps
     * abandoned, then adopted by this thread's forced collect). */
    size_t left = 0;
    for (int t = 0; t < nthreads; t++) {
        for (size_t i = 0; i < nleftovers[t]; i++) {
            blk *b = &leftovers[t][i];
            size_t off = pattern_mismatch(b->p, b->filled, b->seed);
            if (off != (size_t)-1)
                FAIL(NULL, "block %p (%s of %zu by thread %d) left by thread %d corrupted at %zu",
                     (void *)b->p, kind_names[b->kind], b->size, b->maker, t, off);
            if (i % 3 == 0 && b->align > 16)
                coral_free_aligned_sized(b->p, b->align, b->size);
            else if (i % 3 == 0)
                coral_free_sized(b->p, b->size);
            else
                coral_free(b->p);
            left++;
            if (i == nleftovers[t] / 2) coral_collect(1);
        }
    }
    coral_collect(1);

    uint64_t counts[OP_COUNT] = {0}, received = 0, sent = 0, sent_big = 0, huge = 0, emptied = 0;
    size_t max_live = 0;
    for (int t = 0; t < nthreads; t++) {
        for (int k = 0; k < OP_COUNT; k++) counts[k] += states[t]->counts[k];
        received += states[t]->received;
        sent += states[t]->sent;
        sent_big += states[t]->sent_big;
        huge += states[t]->huge_allocs;
        emptied += states[t]->emptied;
        max_live = MAX(max_live, states[t]->max_live);
    }
    CHECK_EQ(received, sent);
    printf("fuzz: ok in %.2f s:", now_seconds() - t0);
    for (int k = 0; k < OP_CHECK; k++)
        printf(" %s %llu,", op_names[k], (unsigned long long)counts[k]);
    printf(" blocks handed over %llu (%llu > 512 KiB), blocks > 512 KiB %llu, max live/thread %zu, "
           "models emptied %llu, freed by main %zu\n",
           (unsigned long long)sent, (unsigned long long)sent_big, (unsigned long long)huge,
           max_live, (unsigned long long)emptied, left);
    for (int t = 0; t < nthreads; t++) free(states[t]);
    return 0;
}
