/* Shared helpers of the coralloc benchmark workloads.
 *
 * Every workload is a small program that:
 *   - takes its parameters as --name=value (or --name value) options,
 *   - checks its own results (tags written into blocks, checksums, counts)
 *     and exits with status 3 ("CHECK FAILED: ..." on stderr) when they are
 *     wrong, or 4 when an allocation returned NULL,
 *   - prints "info: key=value" lines and exactly one line
 *     "result: <figure>=<number> [<key>=<number> ...]" whose first figure is
 *     the one the runner reports,
 *   - prints "info: malloc_lib=<path>": the shared object that defines the
 *     malloc this process calls, so the runner can prove which allocator
 *     served the run.
 */
#ifndef CORAL_BENCH_COMMON_H
#define CORAL_BENCH_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define EXIT_CHECK 3
#define EXIT_OOM 4
#define EXIT_USAGE 2

#if defined(__GNUC__)
#define UNUSED __attribute__((unused))
#define NORETURN __attribute__((noreturn))
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define UNUSED
#define NORETURN
#define PRINTF_LIKE(a, b)
#endif

/* ---- failure ------------------------------------------------------------ */

static NORETURN PRINTF_LIKE(1, 2) UNUSED void check_failed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("CHECK FAILED: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stdout);
    _exit(EXIT_CHECK);
}

static NORETURN UNUSED void out_of_memory(size_t size) {
    fprintf(stderr, "OUT OF MEMORY: allocation of %zu bytes returned NULL\n", size);
    fflush(stdout);
    _exit(EXIT_OOM);
}

static inline UNUSED void *xmalloc(size_t size) {
    void *p = malloc(size);
    if (p == NULL) out_of_memory(size);
    return p;
}

/* Per-thread state of a workload: each thread's record starts on its own cache
 * line and fills whole lines, so no two threads write the same line through
 * the harness. (A plain malloc'ed array of small records puts two threads'
 * counters on one line, and whether it does depends on where the allocator
 * under test placed the array: the harness would then measure its own false
 * sharing, differently for each allocator.) */
#define CACHE_LINE 64
#define PER_THREAD _Alignas(CACHE_LINE)

static inline UNUSED void *xmalloc_lines(size_t size) {
    size_t rounded = (size + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
    void *p = aligned_alloc(CACHE_LINE, rounded);
    if (p == NULL) out_of_memory(rounded);
    return p;
}

static inline UNUSED void *xrealloc(void *old, size_t size) {
    void *p = realloc(old, size);
    if (p == NULL) out_of_memory(size);
    return p;
}

/* ---- time and faults ---------------------------------------------------- */

static inline UNUSED double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline UNUSED long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* ---- random numbers (xorshift64*, one state per thread) ----------------- */

typedef struct {
    uint64_t s;
} rng_t;

static inline UNUSED void rng_seed(rng_t *r, uint64_t seed) {
    /* splitmix64 of the seed, never 0 */
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    r->s = z ? z : 0x2545f4914f6cdd1dULL;
}

static inline UNUSED uint64_t rng_next(rng_t *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dULL;
}

/* uniform in [lo, hi] */
/* A number in [0, n), n >= 1, by multiply-high rather than modulo: a 64-bit
 * division costs tens of cycles, which in a loop around one malloc/free pair
 * is harness time of the order of the allocator's own. (The bias, at most
 * n / 2^64, is far below anything measured.) */
static inline UNUSED uint64_t rng_below(rng_t *r, uint64_t n) {
    return (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

static inline UNUSED uint64_t rng_range(rng_t *r, uint64_t lo, uint64_t hi) {
    if (hi <= lo) return lo;
    return lo + rng_below(r, hi - lo + 1);
}

/* ---- block tags ----------------------------------------------------------
 * A block of `size` bytes gets the first min(8, size) bytes of its 64-bit tag
 * at its start and, when longer than 8 bytes, the tag's second byte in its
 * last byte. A block whose tag is not intact when freed was overwritten by
 * someone else: the allocator handed out overlapping memory. */

static inline UNUSED uint64_t tag_make(uint64_t a, uint64_t b) {
    uint64_t t = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL);
    t ^= t >> 29;
    return t | 1; /* never 0: a zeroed block never passes */
}

/* (Blocks of 8 bytes or more, the usual case, copy and compare the tag as
 * one word: no call to memcpy/memcmp, so the workload's own cost per block
 * stays small next to the allocator's.) */
static inline UNUSED void tag_put(void *p, size_t size, uint64_t tag) {
    unsigned char *c = (unsigned char *)p;
    if (size >= 8) {
        memcpy(c, &tag, 8);
        c[size - 1] = size > 8 ? (unsigned char)(tag >> 8) : c[size - 1];
        return;
    }
    memcpy(c, &tag, size);
}

static inline UNUSED int tag_ok(const void *p, size_t size, uint64_t tag) {
    const unsigned char *c = (const unsigned char *)p;
    if (size >= 8) {
        uint64_t word;
        memcpy(&word, c, 8);
        return word == tag && (size == 8 || c[size - 1] == (unsigned char)(tag >> 8));
    }
    return memcmp(c, &tag, size) == 0;
}

/* A block of size bytes (at least 8) touched in every 4 KiB page: the word
 * at each 4 KiB offset gets tag + offset, the last byte the tag's low
 * byte. (zero-fill, head-alias: the pages a big block's user writes.) */
#define TOUCH_STEP 4096
static inline UNUSED void pages_touch(unsigned char *p, size_t size, uint64_t tag) {
    for (size_t off = 0; off + 8 <= size; off += TOUCH_STEP) {
        uint64_t w = tag + off;
        memcpy(p + off, &w, 8);
    }
    p[size - 1] = (unsigned char)tag;
}

/* Where a block pages_touch tagged differs from it: the offset of the
 * first word changed, size - 1 for the last byte, or SIZE_MAX when
 * intact. */
static inline UNUSED size_t pages_touched_differ(const unsigned char *p, size_t size,
                                                 uint64_t tag) {
    for (size_t off = 0; off + 8 <= size; off += TOUCH_STEP) {
        uint64_t w;
        memcpy(&w, p + off, 8);
        if (w != tag + off) return off;
    }
    return p[size - 1] == (unsigned char)tag ? SIZE_MAX : size - 1;
}

/* Fill the whole block with a pattern derived from the tag, then tag it. */
static inline UNUSED void block_fill(void *p, size_t size, uint64_t tag) {
    memset(p, (int)(tag >> 16) & 0xff, size);
    tag_put(p, size, tag);
}

/* Check a block filled by block_fill: everything, or (full == 0) the tag
 * and a byte in the middle. */
static inline UNUSED int block_ok(const void *p, size_t size, uint64_t tag, int full) {
    const unsigned char *c = (const unsigned char *)p;
    unsigned char fillb = (unsigned char)(tag >> 16);
    if (!tag_ok(p, size, tag)) return 0;
    if (size <= 9) return 1;
    if (!full) return c[8 + (size - 9) / 2] == fillb;
    for (size_t i = 8; i < size - 1; i++)
        if (c[i] != fillb) return 0;
    return 1;
}

/* ---- options ------------------------------------------------------------ */

typedef struct {
    const char *name; /* without the leading dashes */
    const char *help;
    long *ival;        /* integer option, or */
    const char **sval; /* string option */
} opt_t;

static UNUSED void opts_usage(const char *prog, const char *what, const opt_t *opts, size_t n,
                              FILE *f) {
    fprintf(f, "usage: %s [--option=value ...]\n%s\noptions:\n", prog, what);
    for (size_t i = 0; i < n; i++) {
        if (opts[i].ival)
            fprintf(f, "  --%-12s %s (default %ld)\n", opts[i].name, opts[i].help, *opts[i].ival);
        else
            fprintf(f, "  --%-12s %s (default %s)\n", opts[i].name, opts[i].help, *opts[i].sval);
    }
}

/* Parse --name=value / --name value. Unknown options and bad numbers are
 * usage errors (exit 2). */
static UNUSED void opts_parse(int argc, char **argv, const char *what, const opt_t *opts,
                              size_t n) {
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            opts_usage(argv[0], what, opts, n, stdout);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "%s: unexpected argument '%s' (try --help)\n", argv[0], arg);
            exit(EXIT_USAGE);
        }
        arg += 2;
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const opt_t *o = NULL;
        for (size_t i = 0; i < n; i++)
            if (strlen(opts[i].name) == len && strncmp(opts[i].name, arg, len) == 0) o = &opts[i];
        if (o == NULL) {
            fprintf(stderr, "%s: unknown option '--%.*s' (try --help)\n", argv[0], (int)len, arg);
            exit(EXIT_USAGE);
        }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (a + 1 < argc) {
            val = argv[++a];
        } else {
            fprintf(stderr, "%s: option '--%s' needs a value\n", argv[0], o->name);
            exit(EXIT_USAGE);
        }
        if (o->ival) {
            char *end;
            errno = 0;
            long v = strtol(val, &end, 0);
            /* k/m/g suffixes: binary multiples */
            if (end != val && (*end == 'k' || *end == 'K'))
                v <<= 10, end++;
            else if (end != val && (*end == 'm' || *end == 'M'))
                v <<= 20, end++;
            else if (end != val && (*end == 'g' || *end == 'G'))
                v <<= 30, end++;
            if (errno != 0 || end == val || *end != '\0' || v < 0) {
                fprintf(stderr, "%s: option '--%s' needs a non-negative integer, not '%s'\n",
                        argv[0], o->name, val);
                exit(EXIT_USAGE);
            }
            *o->ival = v;
        } else {
            *o->sval = val;
        }
    }
}

#define OPTS_PARSE(argc, argv, what, opts)                                                         \
    opts_parse(argc, argv, what, opts, sizeof(opts) / sizeof((opts)[0]))

static UNUSED NORETURN PRINTF_LIKE(1, 2) void usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(EXIT_USAGE);
}

/* ---- threads ------------------------------------------------------------ */

static inline UNUSED void xthread_create(pthread_t *t, void *(*fn)(void *), void *arg) {
    int rc = pthread_create(t, NULL, fn, arg);
    if (rc != 0) {
        fprintf(stderr, "pthread_create failed: %s\n", strerror(rc));
        _exit(EXIT_OOM);
    }
}

static inline UNUSED void xthread_join(pthread_t t) {
    int rc = pthread_join(t, NULL);
    if (rc != 0) {
        fprintf(stderr, "pthread_join failed: %s\n", strerror(rc));
        _exit(EXIT_OOM);
    }
}

/* Spin-then-yield start gate so that all threads start their timed part
 * together (no futex: a wake-up costs more than the work measured). */
typedef struct {
    atomic_int arrived;
    int total;
} gate_t;

static inline UNUSED void gate_wait(gate_t *g) {
    atomic_fetch_add(&g->arrived, 1);
    while (atomic_load(&g->arrived) < g->total) sched_yield();
}

/* ---- reporting ---------------------------------------------------------- */

/* Print which shared object defines the malloc this process calls. */
static UNUSED void report_malloc_lib(void) {
    void *sym = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL)
        printf("info: malloc_lib=%s\n", info.dli_fname);
    else
        printf("info: malloc_lib=unknown\n");
}

/* cache-scratch and cache-thrash: `iters` times, allocate a block of `size`
 * bytes, write every byte, write `writes` more times over it, check every
 * byte and add it to *sum, free it. With blocks of two threads in one cache
 * line, every write bounces the line (false sharing). */
static inline UNUSED void write_blocks_loop(const char *name, long id, long iters, long size,
                                            long writes, uint64_t *sum) {
    uint64_t total = 0; /* local: the caller's *sum may sit near another thread's */
    for (long i = 0; i < iters; i++) {
        volatile unsigned char *p = (volatile unsigned char *)xmalloc((size_t)size);
        for (long s = 0; s < size; s++) p[s] = (unsigned char)(id + s);
        for (long w = 0; w < writes;)
            for (long s = 0; s < size && w < writes; s++, w++) p[s]++;
        /* each byte s was written (writes / size) or one more times */
        for (long s = 0; s < size; s++) {
            long times = writes / size + (s < writes % size ? 1 : 0);
            unsigned char want = (unsigned char)(id + s + times);
            if (p[s] != want) check_failed("%s: thread %ld byte %ld is wrong", name, id, s);
            total += p[s];
        }
        free((void *)p);
    }
    *sum = total;
}

#endif
