/* fuzz_model: a libFuzzer target that turns its input into allocation calls
 * on two threads and checks every result against a shadow model.
 *
 * The input is a sequence of 6-byte records (a short last one is padded
 * with zeros; at most MAX_OPS are used): [op][size class][v lo][v hi][a][b].
 * Bit 0 of `op` says which thread runs it (0: the fuzzer's thread, 1: a
 * second thread made for each input), the rest which call:
 *   malloc, calloc (zeros checked), realloc / reallocarray (kept prefix
 *   checked; to 0 frees), aligned alloc (aligned_alloc, posix_memalign,
 *   memalign; 1 B - 4 MiB, and bad alignments: EINVAL), free, free_sized /
 *   free_aligned_sized, usable size (stable, and all of it written),
 *   coral_malloc_bulk / coral_malloc_bulk_sizes / coral_free_bulk,
 *   hand-off of blocks to the other thread through a locked queue (it
 *   checks and keeps or frees them: remote frees), first-class heaps
 *   (coral_heap_new, coral_heap_malloc/calloc/realloc/free, reset, destroy),
 *   the purge (coral_test_advance_clock + coral_test_purge_pass,
 *   coral_collect), coral_test_check, and absurd sizes (SIZE_MAX,
 *   PTRDIFF_MAX, ...: NULL and ENOMEM, a realloc'd block left as it was).
 * Sizes (decode_size): 0 - 1 KiB, up to 64 KiB, up to 512 KiB, 512 KiB -
 * 2 MiB, a few 2 - 8 MiB, class boundaries, absurd ones.
 *
 * The threads meet at a barrier every PHASE_OPS operations of each; a block
 * handed over in one phase is received at the start of the next, so what
 * each thread does depends on the input only (the allocator's own
 * interleaving of the two threads does not). A heap's owner resets or
 * destroys it only two phases after it last handed one of its blocks over
 * (the receiver frees such blocks as it receives them): no block of a heap
 * outlives it.
 *
 * The model holds every live block: pointer, size, usable size, alignment,
 * heap and a pattern seed; every block carries its pattern (up to 256 KiB
 * all of it, above that the first and last 4 KiB and 64 bytes every 16 KiB)
 * and is checked before it is freed, resized or handed over. New blocks are
 * checked for alignment, coral_owns and usable size (>= the request; ==
 * coral_good_size for malloc and bulk). Every CHECK_EVERY operations and at
 * the end each thread runs coral_test_check and checks its blocks for
 * overlap; at the end, with both threads stopped, all blocks are checked,
 * then everything is freed (input length odd: the second thread leaves its
 * blocks and heaps behind when it exits and the fuzzer's thread frees them),
 * so inputs are independent.
 *
 * A failed check prints one line and aborts (libFuzzer saves the input).
 * FUZZ_MODEL_TRACE=1 prints every operation as it runs (for a crash file).
 */
#define _GNU_SOURCE
#include "coralloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pattern loops are most of the work: neither libFuzzer's comparison
 * tracing (the run would be spent there) nor ASan's checks (the blocks are
 * coralloc's memory, which ASan does not track) instrument them. */
#define PATTERN_LOOP __attribute__((no_sanitize("coverage", "address")))
#pragma clang attribute push(PATTERN_LOOP, apply_to = function)
#include "testutil.h"
#pragma clang attribute pop

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define LIVE_BYTES_CAP (48 * MiB) /* per thread */
#define FULL_MAX (256 * KiB)      /* blocks up to this size: patterned all through */
#define STRIPE_STEP (16 * KiB)    /* above it: 64 bytes this often, first and last 4 KiB */

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

enum {
    REC = 6,          /* input bytes per operation */
    MAX_OPS = 1024,   /* operations per input, both threads */
    PHASE_OPS = 16,   /* operations per thread between two meetings */
    MAX_LIVE = 256,   /* blocks per thread */
    HEAPS = 2,        /* heap slots per thread */
    HUGE_MAX = 2,     /* live blocks above 2 MiB per thread */
    BULK_MAX = 32,    /* blocks per bulk call */
    HANDOFF_MAX = 8,  /* blocks per hand-off */
    CHECK_EVERY = 64, /* coral_test_check every this many operations of a thread */
    /* Never full: a phase's hand-offs, and the previous phase's not yet
     * received. */
    QCAP = 2 * PHASE_OPS * HANDOFF_MAX,
};

enum {
    OP_MALLOC,
    OP_CALLOC,
    OP_REALLOC,
    OP_ALIGNED,
    OP_FREE,
    OP_FREE_SIZED,
    OP_USABLE,
    OP_BULK_MALLOC,
    OP_BULK_FREE,
    OP_HANDOFF,
    OP_HEAP_NEW,
    OP_HEAP_ALLOC,
    OP_HEAP_DROP,
    OP_PURGE,
    OP_CHECK,
    OP_ABSURD,
    OP_COUNT,
    OP_END = OP_COUNT /* not drawn: the end of an input */
};
static const char *const op_names[OP_COUNT + 1] = {
    "malloc",    "calloc", "realloc",   "aligned", "free",     "free_sized",
    "usable",    "bulk",   "bulk_free", "handoff", "heap_new", "heap_alloc",
    "heap_drop", "purge",  "check",     "absurd",  "end"};

typedef struct {
    uint8_t code, cls, a, b;
    uint16_t v;
} op_t;

typedef struct {
    unsigned char *p;
    size_t size;   /* requested */
    size_t usable; /* coral_malloc_usable_size when made */
    size_t filled; /* bytes that carry the pattern: size, or usable */
    size_t align;  /* asked of an aligned call, or 0 */
    uint64_t seed;
    coral_heap_t *heap; /* the user heap it is of, or NULL */
    int8_t slot;        /* that heap's slot in its maker's table, or -1 */
    uint8_t maker;
} blk;

typedef struct {
    coral_heap_t *h;
    unsigned last_sent; /* phase of its last block handed over, + 1 (0: none) */
} heap_slot;

typedef struct {
    int id;
    const op_t *ops;
    size_t nops;
    unsigned phase;
    size_t op_index;
    int cur_op;
    blk live[MAX_LIVE];
    size_t nlive, live_bytes;
    unsigned nhuge;
    uint64_t next_seed;
    heap_slot heaps[HEAPS];
} tstate;

typedef struct {
    blk b;
    unsigned phase; /* sent in */
} qitem;

typedef struct {
    pthread_mutex_t lock;
    size_t head, count;
    qitem items[QCAP];
} fqueue;

static op_t streams[2][MAX_OPS];
static tstate states[2];
static fqueue queues[2] = {{.lock = PTHREAD_MUTEX_INITIALIZER},
                           {.lock = PTHREAD_MUTEX_INITIALIZER}};
static pthread_barrier_t barrier;
static unsigned nphases;
static int leave_to_main; /* the second thread leaves its blocks behind */
static blk *left_blocks;  /* what it left: its model, read after the join */
static size_t nleft;
static int trace;

/* ---- failures ---------------------------------------------------------------------- */

static void fz_fail(const tstate *st, const char *fmt, ...)
    __attribute__((noreturn, cold, format(printf, 2, 3)));
static void fz_fail(const tstate *st, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "fuzz_model: thread %d, op %zu (%s): ", st->id, st->op_index,
            op_names[st->cur_op]);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
#define FZ_CHECK(st, cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) fz_fail((st), __VA_ARGS__);                                                   \
    } while (0)

/* ---- patterns ---------------------------------------------------------------------- */

/* The patterned ranges of a block of n bytes: [0, n) up to FULL_MAX; else
 * [0, 4 KiB), 64 bytes at every STRIPE_STEP below the tail, and the tail
 * [t, n) of about 4 KiB. Each range carries the pattern of its own seed
 * (block seed + offset), so a prefix of a block keeps its ranges' patterns
 * whatever the block's size. Returns the number of ranges written to r. */
typedef struct {
    size_t start, end;
} span;

static size_t spans_of(size_t n, span *r, size_t cap) {
    if (n <= FULL_MAX) {
        r[0] = (span){0, n};
        return 1;
    }
    size_t k = 0, tail = (n - 4 * KiB) & ~(size_t)63;
    r[k++] = (span){0, 4 * KiB};
    for (size_t s = STRIPE_STEP; s + 64 <= tail && k + 1 < cap; s += STRIPE_STEP)
        r[k++] = (span){s, s + 64};
    r[k++] = (span){tail, n};
    return k;
}

enum { MAX_SPANS = 1024 }; /* 8 MiB / STRIPE_STEP, and the ends */

static uint64_t span_seed(uint64_t seed, size_t start) {
    return seed + start * 0x9E3779B97F4A7C15ull;
}

PATTERN_LOOP static void fill_block(blk *b) {
    span r[MAX_SPANS];
    size_t n = spans_of(b->filled, r, MAX_SPANS);
    for (size_t i = 0; i < n; i++)
        fill_pattern(b->p + r[i].start, r[i].end - r[i].start, span_seed(b->seed, r[i].start));
}

/* The pattern of b's first `upto` bytes (of those filled) at p; the offset of
 * the first wrong byte, or (size_t)-1. */
PATTERN_LOOP static size_t block_mismatch(const blk *b, const unsigned char *p, size_t upto) {
    span r[MAX_SPANS];
    size_t n = spans_of(b->filled, r, MAX_SPANS);
    for (size_t i = 0; i < n && r[i].start < upto; i++) {
        size_t len = min_size(r[i].end, upto) - r[i].start;
        size_t off = pattern_mismatch(p + r[i].start, len, span_seed(b->seed, r[i].start));
        if (off != (size_t)-1) return r[i].start + off;
    }
    return (size_t)-1;
}

static void check_block(const tstate *st, const blk *b, const char *when) {
    size_t off = block_mismatch(b, b->p, b->filled);
    FZ_CHECK(st, off == (size_t)-1,
             "%s: block %p (size %zu, usable %zu, alignment %zu, by thread %d%s) corrupted at "
             "offset %zu",
             when, (void *)b->p, b->size, b->usable, b->align, b->maker,
             b->heap ? ", of a user heap" : "", off);
}

/* calloc's block: zero where the pattern will go. */
PATTERN_LOOP static void check_zero(const tstate *st, const unsigned char *p, size_t n,
                                    const char *call) {
    span r[MAX_SPANS];
    size_t k = spans_of(n, r, MAX_SPANS);
    for (size_t i = 0; i < k; i++) {
        size_t off = byte_mismatch(p + r[i].start, r[i].end - r[i].start, 0);
        FZ_CHECK(st, off == (size_t)-1, "%s of %zu bytes = %p: byte at offset %zu is not 0", call,
                 n, (const void *)p, r[i].start + off);
    }
}

/* ---- sizes ---------------------------------------------------------------------------- */

static const size_t edge_sizes[] = {0,
                                    1,
                                    15,
                                    16,
                                    17,
                                    1024,
                                    1025,
                                    64 * KiB,
                                    64 * KiB + 1,
                                    512 * KiB,
                                    512 * KiB + 1,
                                    1984 * KiB,
                                    1984 * KiB + 1,
                                    2 * MiB - 1,
                                    2 * MiB,
                                    4 * MiB,
                                    4 * MiB + 1};
/* Too large to allocate: NULL and ENOMEM. */
static const size_t absurd_sizes[] = {SIZE_MAX,
                                      SIZE_MAX - 4095,
                                      SIZE_MAX / 2 + 1,
                                      (size_t)PTRDIFF_MAX,
                                      (size_t)PTRDIFF_MAX - 4095,
                                      (size_t)1 << 62,
                                      (size_t)1 << 48};
#define COUNT(a) (sizeof(a) / sizeof *(a))

static int is_absurd(size_t size) { return size >= (size_t)1 << 48; }

static size_t absurd_size(uint8_t x) { return absurd_sizes[x % COUNT(absurd_sizes)]; }

/* A size from a record's class and value, kept within the thread's caps
 * (live bytes, blocks above 2 MiB). */
static size_t decode_size(const tstate *st, uint8_t cls, uint16_t v) {
    size_t size;
    switch (cls % 32) {
    default: /* 0-15: small */
        size = v % 1025;
        break;
    case 16 ... 21:
        size = 1025 + (v * (63 * KiB)) / 65536;
        break;
    case 22 ... 25:
        size = 64 * KiB + (v * (448 * KiB)) / 65536;
        break;
    case 26 ... 28:
        size = 512 * KiB + (v * (1536 * KiB)) / 65536;
        break;
    case 29: /* 1 in 4: huge */
        size = (v & 3) ? 512 * KiB + v * 16 : 2 * MiB + ((v >> 2) * (6 * MiB)) / 16384;
        break;
    case 30:
        size = edge_sizes[v % COUNT(edge_sizes)];
        break;
    case 31:
        return absurd_size((uint8_t)v);
    }
    if (size > 2 * MiB && st->nhuge >= HUGE_MAX) size %= 2 * MiB;
    if (st->live_bytes + size > LIVE_BYTES_CAP) size %= 64 * KiB;
    return size;
}

/* ---- the model ------------------------------------------------------------------------ */

static void expect_enomem(const tstate *st, const void *p, int err, const char *call, size_t size) {
    FZ_CHECK(st, p == NULL && err == ENOMEM, "%s(%zu) = %p, errno %d: expected NULL and ENOMEM",
             call, size, p, err);
}

static void model_add(tstate *st, const blk *b) {
    FZ_CHECK(st, st->nlive < MAX_LIVE, "model full");
    st->live[st->nlive++] = *b;
    st->live_bytes += b->size;
    st->nhuge += b->size > 2 * MiB;
}

static blk model_take(tstate *st, size_t i) {
    blk b = st->live[i];
    st->live[i] = st->live[--st->nlive];
    st->live_bytes -= b.size;
    st->nhuge -= b.size > 2 * MiB;
    return b;
}

/* Checks a new block, gives it its pattern and adds it to the model. */
static void add_block(tstate *st, void *p, size_t size, size_t align, int exact, int slot,
                      const char *call) {
    FZ_CHECK(st, p != NULL, "%s(%zu) failed: %s", call, size, strerror(errno));
    size_t need = align > 16 ? align : 16; /* every block is 16-byte aligned */
    FZ_CHECK(st, (uintptr_t)p % need == 0, "%s(%zu) = %p: not aligned to %zu", call, size, p, need);
    FZ_CHECK(st, coral_owns(p), "%s(%zu) = %p: coral_owns says no", call, size, p);
    size_t us = coral_malloc_usable_size(p);
    FZ_CHECK(st, us >= size, "%s(%zu) = %p: usable size %zu", call, size, p, us);
    FZ_CHECK(st, !exact || us == coral_good_size(size),
             "%s(%zu) = %p: usable size %zu, coral_good_size %zu", call, size, p, us,
             coral_good_size(size));
    blk b = {.p = p,
             .size = size,
             .usable = us,
             .filled = size,
             .align = align,
             .seed = st->next_seed++,
             .heap = slot >= 0 ? st->heaps[slot].h : NULL,
             .slot = (int8_t)slot,
             .maker = (uint8_t)st->id};
    fill_block(&b);
    model_add(st, &b);
}

static void free_block(tstate *st, blk *b, unsigned how) {
    check_block(st, b, "before free");
    if (how % 3 == 1 && b->heap != NULL)
        coral_heap_free(b->heap, b->p);
    else if (how % 3 == 2 && b->align != 0)
        coral_free_aligned_sized(b->p, b->align, b->size);
    else if (how % 3 == 2)
        coral_free_sized(b->p, b->size);
    else
        coral_free(b->p);
}

static size_t pick(const tstate *st, const op_t *op) { return (op->v + op->a) % st->nlive; }

/* ---- operations ------------------------------------------------------------------------ */

static void op_malloc(tstate *st, const op_t *op) {
    size_t size = decode_size(st, op->cls, op->v);
    void *p = coral_malloc(size);
    int err = errno;
    if (is_absurd(size))
        expect_enomem(st, p, err, "malloc", size);
    else
        add_block(st, p, size, 0, 1, -1, "malloc");
}

/* n * elem == total, three ways; absurd totals: products that overflow. */
static void calloc_args(size_t total, uint8_t how, size_t *n, size_t *elem) {
    if (is_absurd(total)) {
        *n = (how & 1) ? 2 : total;
        *elem = (how & 1) ? total : 3;
    } else if (how % 3 == 0 || total % 16 != 0) {
        *n = (how & 1) ? total : 1;
        *elem = (how & 1) ? 1 : total;
    } else {
        *n = total / 16;
        *elem = 16;
    }
}

static void after_calloc(tstate *st, void *p, int err, size_t total, int slot, const char *call) {
    if (is_absurd(total)) {
        expect_enomem(st, p, err, call, total);
        return;
    }
    FZ_CHECK(st, p != NULL, "%s(%zu) failed: %s", call, total, strerror(err));
    check_zero(st, p, total, call);
    add_block(st, p, total, 0, 0, slot, call);
}

static void op_calloc(tstate *st, const op_t *op) {
    size_t total = decode_size(st, op->cls, op->v), n, elem;
    calloc_args(total, op->a, &n, &elem);
    void *p = coral_calloc(n, elem);
    after_calloc(st, p, errno, total, -1, "calloc");
}

/* The block at i, resized to size by realloc (or coral_heap_realloc into
 * heap slot `slot`): the kept prefix checked, the rest patterned anew. */
static void resize_block(tstate *st, size_t i, size_t size, int slot, int as_array) {
    blk *b = &st->live[i];
    check_block(st, b, "before realloc");
    void *q;
    if (slot >= 0)
        q = coral_heap_realloc(st->heaps[slot].h, b->p, size);
    else if (as_array && size % 8 == 0)
        q = coral_reallocarray(b->p, size / 8, 8);
    else
        q = coral_realloc(b->p, size);
    int err = errno;
    if (is_absurd(size)) {
        expect_enomem(st, q, err, "realloc", size);
        check_block(st, b, "after a failed realloc");
        return;
    }
    if (size == 0) { /* frees, and gives NULL (glibc's behaviour) */
        FZ_CHECK(st, q == NULL, "realloc(%p, 0) = %p, not NULL", (void *)b->p, q);
        model_take(st, i);
        return;
    }
    FZ_CHECK(st, q != NULL, "realloc(%p, %zu) failed: %s", (void *)b->p, size, strerror(err));
    size_t keep = min_size(b->size, size);
    size_t off = block_mismatch(b, q, keep);
    FZ_CHECK(st, off == (size_t)-1, "realloc(%p, %zu) = %p from %zu bytes: kept prefix lost at %zu",
             (void *)b->p, size, q, b->size, off);
    blk old = model_take(st, i);
    /* A heap's block stays its heap's (coral_heap_realloc), or was not one. */
    add_block(st, q, size, 0, 0, slot >= 0 ? slot : old.slot, "realloc");
}

static void op_realloc(tstate *st, const op_t *op) {
    size_t size = decode_size(st, op->cls, op->v);
    if (st->nlive == 0) { /* realloc(NULL, n) is malloc(n) */
        void *p = coral_realloc(NULL, size);
        int err = errno;
        if (is_absurd(size))
            expect_enomem(st, p, err, "realloc(NULL)", size);
        else
            add_block(st, p, size, 0, 0, -1, "realloc(NULL)");
        return;
    }
    size_t i = pick(st, op);
    if (op->b & 1) size = st->live[i].size + (op->v & 127) - min_size(st->live[i].size, 64);
    if (st->live[i].heap != NULL) { /* its heap's owner: coral_heap_realloc */
        resize_block(st, i, size, st->live[i].slot, 0);
        return;
    }
    resize_block(st, i, size, -1, op->b & 2);
}

static void op_aligned(tstate *st, const op_t *op) {
    size_t size = decode_size(st, op->cls, op->v), align;
    unsigned k = op->b % 32;
    if (k < 23)
        align = (size_t)1 << k; /* 1 B .. 4 MiB */
    else if (k == 23)
        align = 0;
    else if (k < 28)
        align = 16 * (k - 20) + (k == 24 ? 8 : 0); /* 56, 80, 96, 112: not powers of two */
    else
        align = (size_t)1 << (k - 22); /* 64 .. 512 */
    int bad = align == 0 || (align & (align - 1)) != 0;
    if (align >= MiB && !is_absurd(size)) size %= 512 * KiB;
    void *p = NULL;
    int err;
    const char *call;
    switch (op->a % 3) {
    case 0:
        call = "aligned_alloc";
        p = coral_aligned_alloc(align, size);
        err = errno;
        break;
    case 1:
        call = "posix_memalign";
        err = coral_posix_memalign(&p, align, size);
        bad |= align < sizeof(void *);
        FZ_CHECK(st, err != 0 || p != NULL, "posix_memalign(%zu, %zu) gave 0 and NULL", align,
                 size);
        break;
    default:
        call = "memalign";
        p = coral_memalign(align, size);
        err = errno;
        break;
    }
    if (bad) {
        FZ_CHECK(st, p == NULL && err == EINVAL,
                 "%s(%zu, %zu) with a bad alignment = %p, error %d: expected EINVAL", call, align,
                 size, p, err);
    } else if (is_absurd(size)) {
        expect_enomem(st, p, err, call, size);
    } else {
        FZ_CHECK(st, p != NULL, "%s(%zu, %zu) failed: %s", call, align, size, strerror(err));
        add_block(st, p, size, align, 0, -1, call);
    }
}

static void op_usable(tstate *st, const op_t *op) {
    blk *b = &st->live[pick(st, op)];
    check_block(st, b, "before usable_size");
    size_t us = coral_malloc_usable_size(b->p);
    FZ_CHECK(st, us == b->usable, "usable size of %p (size %zu) changed from %zu to %zu",
             (void *)b->p, b->size, b->usable, us);
    /* All of it is the program's: pattern it all. */
    b->filled = us;
    fill_block(b);
}

static void op_bulk_malloc(tstate *st, const op_t *op) {
    size_t n = 1 + op->a % BULK_MAX, size = decode_size(st, op->cls, op->v);
    if (!is_absurd(size) && size > 64 * KiB) n = 1 + n % 2;
    n = min_size(n, MAX_LIVE - st->nlive);
    if (n == 0) return;
    void *out[BULK_MAX];
    size_t sizes[BULK_MAX], got, bad_at = n;
    int per_block = op->b & 1;
    if (per_block) { /* mixed small sizes; one absurd when the class says so */
        for (size_t j = 0; j < n; j++) sizes[j] = (op->v * (j + 1) * 2654435761u >> 7) % 4097;
        if (is_absurd(size)) sizes[bad_at = op->b % n] = size;
        got = coral_malloc_bulk_sizes(sizes, n, out);
    } else {
        for (size_t j = 0; j < n; j++) sizes[j] = size;
        if (is_absurd(size)) bad_at = 0;
        got = coral_malloc_bulk(size, n, out);
    }
    int err = errno;
    FZ_CHECK(st, got == bad_at, "coral_malloc_bulk%s(%zu blocks of %zu) gave %zu, expected %zu",
             per_block ? "_sizes" : "", n, size, got, bad_at);
    FZ_CHECK(st, bad_at == n || err == ENOMEM, "coral_malloc_bulk stopped with errno %d", err);
    for (size_t j = 0; j < got; j++) add_block(st, out[j], sizes[j], 0, 1, -1, "malloc_bulk");
}

static void op_bulk_free(tstate *st, const op_t *op) {
    void *ptrs[2 * BULK_MAX];
    size_t n = min_size(1 + op->a % BULK_MAX, st->nlive), m = 0;
    for (size_t j = 0; j < n; j++) {
        blk b = model_take(st, (op->v + j * op->b) % st->nlive);
        check_block(st, &b, "before free_bulk");
        if ((op->b >> (j % 8)) & (j & 1)) ptrs[m++] = NULL; /* skipped */
        ptrs[m++] = b.p;
    }
    coral_free_bulk(ptrs, m);
}

static void op_handoff(tstate *st, const op_t *op) {
    fqueue *q = &queues[1 - st->id];
    size_t n = min_size(1 + op->a % HANDOFF_MAX, st->nlive);
    for (size_t j = 0; j < n; j++) {
        blk b = model_take(st, (op->v + j * 7) % st->nlive);
        check_block(st, &b, "before hand-off");
        if (b.heap != NULL) st->heaps[b.slot].last_sent = st->phase + 1;
        pthread_mutex_lock(&q->lock);
        FZ_CHECK(st, q->count < QCAP, "hand-off queue full");
        q->items[(q->head + q->count++) % QCAP] = (qitem){b, st->phase};
        pthread_mutex_unlock(&q->lock);
    }
}

/* The start of a phase: blocks handed over in the phases before. A user
 * heap's block is freed at once (its owner may destroy the heap two phases
 * after it sent it); others are kept, room permitting. */
static void receive(tstate *st) {
    fqueue *q = &queues[st->id];
    qitem got[QCAP];
    size_t n = 0;
    pthread_mutex_lock(&q->lock);
    while (q->count > 0 && q->items[q->head].phase < st->phase) {
        got[n++] = q->items[q->head];
        q->head = (q->head + 1) % QCAP;
        q->count--;
    }
    pthread_mutex_unlock(&q->lock);
    for (size_t j = 0; j < n; j++) {
        blk *b = &got[j].b;
        check_block(st, b, "received from the other thread");
        if (b->heap != NULL || st->nlive == MAX_LIVE) {
            free_block(st, b, (unsigned)b->seed);
        } else {
            model_add(st, b);
        }
    }
}

static int ensure_heap(tstate *st, unsigned slot) {
    if (st->heaps[slot].h == NULL) {
        st->heaps[slot].h = coral_heap_new();
        FZ_CHECK(st, st->heaps[slot].h != NULL, "coral_heap_new failed: %s", strerror(errno));
        st->heaps[slot].last_sent = 0;
    }
    return (int)slot;
}

static void op_heap_alloc(tstate *st, const op_t *op) {
    int slot = ensure_heap(st, op->a % HEAPS);
    coral_heap_t *h = st->heaps[slot].h;
    size_t size = decode_size(st, op->cls, op->v);
    switch (op->b % 4) {
    case 0:
    case 1: {
        void *p = coral_heap_malloc(h, size);
        int err = errno;
        if (is_absurd(size))
            expect_enomem(st, p, err, "coral_heap_malloc", size);
        else
            add_block(st, p, size, 0, 0, slot, "coral_heap_malloc");
        break;
    }
    case 2: {
        size_t n, elem;
        calloc_args(size, op->b >> 2, &n, &elem);
        void *p = coral_heap_calloc(h, n, elem);
        after_calloc(st, p, errno, size, slot, "coral_heap_calloc");
        break;
    }
    default: /* any of ours moves into the heap (or stays, if it is the heap's) */
        if (st->nlive == 0) return;
        resize_block(st, pick(st, op), size, slot, 0);
        break;
    }
}

/* Reset or destroy a heap: every block of it goes. */
static void drop_heap(tstate *st, unsigned slot, int reset) {
    coral_heap_t *h = st->heaps[slot].h;
    for (size_t i = st->nlive; i-- > 0;) {
        if (st->live[i].heap != h) continue;
        check_block(st, &st->live[i], "before heap reset/destroy");
        model_take(st, i);
    }
    if (reset) {
        coral_heap_reset(h);
    } else {
        coral_heap_destroy(h);
        st->heaps[slot].h = NULL;
    }
}

static void op_heap_drop(tstate *st, const op_t *op) {
    unsigned slot = op->a % HEAPS;
    heap_slot *hs = &st->heaps[slot];
    /* Not while the other thread may still hold one of its blocks. */
    if (hs->h == NULL || (hs->last_sent != 0 && st->phase + 1 < hs->last_sent + 2)) return;
    drop_heap(st, slot, op->b & 1);
}

static void check_overlap(const tstate *st, const blk *const *all, size_t n);

static void check_own(tstate *st) {
    const blk *all[MAX_LIVE];
    FZ_CHECK(st, coral_test_check() == 0, "coral_test_check found a broken invariant");
    for (size_t i = 0; i < st->nlive; i++) {
        check_block(st, &st->live[i], "periodic check");
        all[i] = &st->live[i];
    }
    check_overlap(st, all, st->nlive);
}

static void op_purge(tstate *st, const op_t *op) {
    switch (op->a % 4) {
    case 0:
        coral_test_advance_clock(1 + op->v % 1000);
        coral_test_purge_pass();
        break;
    case 1:
        coral_collect(0);
        break;
    case 2:
        coral_collect(1);
        break;
    default:
        coral_test_advance_clock(op->v);
        break;
    }
    (void)st;
}

/* Each call with an absurd size (or a product that overflows). */
static void op_absurd(tstate *st, const op_t *op) {
    size_t size = absurd_size(op->b);
    void *p = NULL, *out[4];
    /* Beyond PTRDIFF_MAX no size is allocatable (1 << 48 and 1 << 62 are
     * only refused by the kernel). */
    FZ_CHECK(st, size <= (size_t)PTRDIFF_MAX - 4096 || coral_good_size(size) == 0,
             "coral_good_size(%zu) = %zu, not 0", size, coral_good_size(size));
    switch (op->a % 7) {
    case 0:
        p = coral_malloc(size);
        expect_enomem(st, p, errno, "malloc", size);
        break;
    case 1:
        p = coral_calloc(op->v | 2, size);
        expect_enomem(st, p, errno, "calloc", size);
        break;
    case 2:
        p = coral_reallocarray(NULL, size, op->v | 2);
        expect_enomem(st, p, errno, "reallocarray", size);
        break;
    case 3: {
        int rc = coral_posix_memalign(&p, 64, size);
        FZ_CHECK(st, rc == ENOMEM && p == NULL, "posix_memalign(64, %zu) = %d, %p", size, rc, p);
        break;
    }
    case 4:
        p = coral_aligned_alloc(4096, size);
        expect_enomem(st, p, errno, "aligned_alloc", size);
        break;
    case 5: {
        size_t got = coral_malloc_bulk(size, 4, out);
        int err = errno;
        FZ_CHECK(st, got == 0 && err == ENOMEM, "coral_malloc_bulk(%zu) gave %zu, errno %d", size,
                 got, err);
        break;
    }
    default:
        if (st->nlive > 0) { /* realloc fails and leaves the block */
            resize_block(st, pick(st, op), size, -1, op->v & 1);
        } else {
            p = coral_heap_malloc(st->heaps[ensure_heap(st, 0)].h, size);
            expect_enomem(st, p, errno, "coral_heap_malloc", size);
        }
        break;
    }
}

static void op_free(tstate *st, const op_t *op) {
    blk b = model_take(st, pick(st, op));
    free_block(st, &b, op->b % 2);
}

static void op_free_sized(tstate *st, const op_t *op) {
    blk b = model_take(st, pick(st, op));
    free_block(st, &b, 2);
}

static void op_heap_new(tstate *st, const op_t *op) { ensure_heap(st, op->a % HEAPS); }

static void op_check(tstate *st, const op_t *op) {
    (void)op;
    check_own(st);
}

typedef void (*op_fn)(tstate *st, const op_t *op);
static const op_fn op_fns[OP_COUNT] = {
    [OP_MALLOC] = op_malloc,       [OP_CALLOC] = op_calloc,
    [OP_REALLOC] = op_realloc,     [OP_ALIGNED] = op_aligned,
    [OP_FREE] = op_free,           [OP_FREE_SIZED] = op_free_sized,
    [OP_USABLE] = op_usable,       [OP_BULK_MALLOC] = op_bulk_malloc,
    [OP_BULK_FREE] = op_bulk_free, [OP_HANDOFF] = op_handoff,
    [OP_HEAP_NEW] = op_heap_new,   [OP_HEAP_ALLOC] = op_heap_alloc,
    [OP_HEAP_DROP] = op_heap_drop, [OP_PURGE] = op_purge,
    [OP_CHECK] = op_check,         [OP_ABSURD] = op_absurd,
};

static int needs_block(int code) {
    return code == OP_FREE || code == OP_FREE_SIZED || code == OP_USABLE || code == OP_BULK_FREE ||
           code == OP_HANDOFF;
}

static int allocates(int code) {
    return code == OP_MALLOC || code == OP_CALLOC || code == OP_ALIGNED || code == OP_BULK_MALLOC ||
           code == OP_HEAP_ALLOC || code == OP_REALLOC;
}

static void run_op(tstate *st, const op_t *op) {
    int code = op->code;
    if (needs_block(code) && st->nlive == 0) code = OP_MALLOC;
    if (allocates(code) && st->nlive == MAX_LIVE) code = OP_FREE;
    st->cur_op = code;
    if (trace)
        fprintf(stderr, "fuzz_model: thread %d op %zu %s cls %u v %u a %u b %u\n", st->id,
                st->op_index, op_names[code], op->cls, op->v, op->a, op->b);
    op_fns[code](st, op);
}

/* ---- overlap ---------------------------------------------------------------------------- */

static int blk_cmp(const void *x, const void *y) {
    const blk *a = *(const blk *const *)x, *b = *(const blk *const *)y;
    return a->p < b->p ? -1 : a->p > b->p;
}

static void check_overlap(const tstate *st, const blk *const *all, size_t n) {
    const blk **sorted = malloc((n + 1) * sizeof *sorted);
    FZ_CHECK(st, sorted != NULL, "out of memory (the model's)");
    memcpy(sorted, all, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, blk_cmp);
    for (size_t i = 1; i < n; i++) {
        const blk *a = sorted[i - 1], *b = sorted[i];
        FZ_CHECK(st, a->p + (a->usable ? a->usable : 1) <= b->p,
                 "blocks overlap: %p (usable %zu, by thread %d) and %p (by thread %d)",
                 (void *)a->p, a->usable, a->maker, (void *)b->p, b->maker);
    }
    free(sorted);
}

/* Both threads stopped, nothing in flight: every block of both models. */
static void check_global(tstate *st) {
    const blk *all[2 * MAX_LIVE];
    size_t n = 0;
    for (int t = 0; t < 2; t++) {
        FZ_CHECK(st, queues[t].count == 0, "blocks left in a hand-off queue");
        for (size_t i = 0; i < states[t].nlive; i++) {
            check_block(st, &states[t].live[i], "global check");
            all[n++] = &states[t].live[i];
        }
    }
    check_overlap(st, all, n);
}

/* ---- the two threads ------------------------------------------------------------------- */

static void meet(void) {
    int rc = pthread_barrier_wait(&barrier);
    if (rc != 0 && rc != PTHREAD_BARRIER_SERIAL_THREAD) abort();
}

/* Everything freed (heaps destroyed), the invariants checked; or, for the
 * second thread leaving, everything left for the fuzzer's thread. */
static void finish(tstate *st) {
    st->cur_op = OP_END;
    if (st->id == 1 && leave_to_main) {
        left_blocks = st->live;
        nleft = st->nlive;
        FZ_CHECK(st, coral_test_check() == 0, "coral_test_check found a broken invariant at exit");
        return;
    }
    /* Odd: the heaps' blocks go with their heaps; even: one by one, first. */
    if (st->nlive % 2)
        for (unsigned s = 0; s < HEAPS; s++)
            if (st->heaps[s].h != NULL) drop_heap(st, s, 0);
    void *ptrs[BULK_MAX];
    size_t m = 0;
    while (st->nlive > 0) {
        blk b = model_take(st, st->nlive - 1);
        if (b.seed % 4 != 0) {
            free_block(st, &b, (unsigned)(b.seed / 4));
            continue;
        }
        check_block(st, &b, "before the final free_bulk");
        ptrs[m++] = b.p;
        if (m == BULK_MAX) coral_free_bulk(ptrs, m), m = 0;
    }
    coral_free_bulk(ptrs, m);
    for (unsigned s = 0; s < HEAPS; s++)
        if (st->heaps[s].h != NULL) drop_heap(st, s, 0);
    FZ_CHECK(st, coral_test_check() == 0, "coral_test_check found a broken invariant at the end");
}

static void *run_stream(void *arg) {
    tstate *st = arg;
    size_t next = 0;
    for (unsigned ph = 0; ph < nphases; ph++) {
        st->phase = ph;
        receive(st);
        for (size_t k = 0; k < PHASE_OPS && next < st->nops; k++, next++) {
            st->op_index = next;
            run_op(st, &st->ops[next]);
            if ((next + 1) % CHECK_EVERY == 0) check_own(st);
        }
        meet();
    }
    st->phase = nphases; /* all that was sent */
    receive(st);
    meet();
    if (st->id == 0) check_global(st);
    meet();
    finish(st);
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *t = getenv("FUZZ_MODEL_TRACE");
    trace = t != NULL && *t == '1';
    if (pthread_barrier_init(&barrier, NULL, 2) != 0) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t nrec = min_size((size + REC - 1) / REC, MAX_OPS), counts[2] = {0, 0};
    for (size_t i = 0; i < nrec; i++) {
        uint8_t r[REC] = {0};
        memcpy(r, data + i * REC, min_size(REC, size - i * REC));
        int t = r[0] & 1;
        streams[t][counts[t]++] = (op_t){.code = (uint8_t)((r[0] >> 1) % OP_COUNT),
                                         .cls = r[1],
                                         .v = (uint16_t)(r[2] | r[3] << 8),
                                         .a = r[4],
                                         .b = r[5]};
    }
    size_t longest = counts[0] > counts[1] ? counts[0] : counts[1];
    nphases = (unsigned)((longest + PHASE_OPS - 1) / PHASE_OPS);
    leave_to_main = size % 2;
    nleft = 0;
    for (int t = 0; t < 2; t++) {
        memset(&states[t], 0, sizeof states[t]);
        states[t].id = t;
        states[t].ops = streams[t];
        states[t].nops = counts[t];
        states[t].next_seed = (uint64_t)t << 48;
    }
    pthread_t second;
    if (pthread_create(&second, NULL, run_stream, &states[1]) != 0) abort();
    run_stream(&states[0]);
    if (pthread_join(second, NULL) != 0) abort();
    /* What the second thread left: freed here, its heaps gone with it. */
    tstate *st = &states[0];
    for (size_t i = 0; i < nleft; i++) free_block(st, &left_blocks[i], i % 2 ? 0 : 2);
    FZ_CHECK(st, coral_test_check() == 0, "coral_test_check found a broken invariant at the end");
    return 0;
}
