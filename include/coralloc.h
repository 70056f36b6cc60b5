/* coralloc: a general-purpose memory allocator.
 *
 * Every function here works whether or not coralloc also replaces the
 * process's malloc (LD_PRELOAD or linking libcoralloc). The semantics of the
 * coral_ versions of the standard calls are exactly those of the C/POSIX
 * calls they mirror: results are 16-byte aligned, errno is ENOMEM on failure
 * (EINVAL for a bad alignment where POSIX says so), and size overflow gives
 * NULL, never a short block.
 */
#ifndef CORALLOC_H
#define CORALLOC_H

#include <stddef.h>
#include <stdio.h>

/* The version of this header; coral_version() gives the library's. */
#define CORALLOC_VERSION_MAJOR 0
#define CORALLOC_VERSION_MINOR 1
#define CORALLOC_VERSION_PATCH 0
#define CORALLOC_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CORAL_API __attribute__((visibility("default")))
#define CORAL_MALLOC_ATTR __attribute__((malloc, warn_unused_result))
#else
#define CORAL_API
#define CORAL_MALLOC_ATTR
#endif

/* ---- the standard API, prefixed ---------------------------------------- */
CORAL_API CORAL_MALLOC_ATTR void *coral_malloc(size_t size);
CORAL_API void coral_free(void *p);
CORAL_API CORAL_MALLOC_ATTR void *coral_calloc(size_t n, size_t size);
CORAL_API void *coral_realloc(void *p, size_t size);
CORAL_API void *coral_reallocarray(void *p, size_t n, size_t size);
CORAL_API int coral_posix_memalign(void **out, size_t alignment, size_t size);
CORAL_API CORAL_MALLOC_ATTR void *coral_aligned_alloc(size_t alignment, size_t size);
CORAL_API CORAL_MALLOC_ATTR void *coral_memalign(size_t alignment, size_t size);
/* aligned_alloc of n * size bytes, zeroed as calloc zeroes them: memory
 * fresh from the OS is not written, so it stays out of the resident set
 * until used (the secure build, libcoralloc-secure.so, writes the zeros of
 * every aligned block, after its checks). NULL and EINVAL for an alignment
 * that is not a power of two, NULL and ENOMEM when n * size overflows or
 * memory runs out. */
CORAL_API CORAL_MALLOC_ATTR void *coral_aligned_calloc(size_t alignment, size_t n, size_t size);
CORAL_API CORAL_MALLOC_ATTR void *coral_valloc(size_t size);
CORAL_API CORAL_MALLOC_ATTR void *coral_pvalloc(size_t size);
/* The bytes of the block p the program may use: its usable size (the
 * request rounded up to the block's size). The secure build,
 * libcoralloc-secure.so, says the request instead (malloc's, calloc's
 * product, realloc's, aligned_alloc's size): a canary lies right after it
 * (docs/SECURITY.md). */
CORAL_API size_t coral_malloc_usable_size(const void *p);
/* Free with the size (or alignment) the block was allocated with: the hint
 * is checked against the block, not trusted. The default build accepts
 * any size up to the usable size; the secure build the request
 * (coral_malloc_usable_size's answer), or 0. */
CORAL_API void coral_free_sized(void *p, size_t size);
CORAL_API void coral_free_aligned_sized(void *p, size_t alignment, size_t size);

/* The usable size malloc(size) would give, without allocating (like
 * jemalloc's nallocx). 0 when size is too large to allocate. The secure
 * build's coral_malloc_usable_size says the request instead: this is then
 * the usable bytes of the block malloc(size) gets, before its canary word
 * (a huge block's before its guard region), as coral_heap_visit reports
 * them; the request is at most that. */
CORAL_API size_t coral_good_size(size_t size);

/* ---- bulk ------------------------------------------------------------------
 * coral_malloc_bulk: up to n blocks of `size` bytes into out[0..n-1]: first
 * blocks of its size class the thread's coral_free_bulk kept (the bulk
 * cache, CORALLOC_BULK_CACHE_KB), then a page at a time (its free blocks,
 * then new ones carved by address). Returns how many it gave: n, unless
 * memory ran out (then errno is ENOMEM and the blocks given are valid).
 * coral_free_bulk: frees n blocks of any sizes, from any threads' heaps
 * (NULL entries are skipped), touching each page's list once per group of
 * its blocks; scattered blocks of classes coral_malloc_bulk asked for are
 * kept in the calling thread's bulk cache instead (freed all the same: a
 * block freed twice, in bulk or by free(), is still reported). */
CORAL_API size_t coral_malloc_bulk(size_t size, size_t n, void **out);
CORAL_API void coral_free_bulk(void **ptrs, size_t n);

/* coral_malloc_bulk_sizes: n blocks of sizes[0..n-1] bytes (each size may
 * differ) into out[0..n-1], in order: out[i] has sizes[i] usable bytes, as
 * from malloc(sizes[i]). One call instead of n: sizes up to 1 KiB are popped
 * inline, with no call, TLS access or check per block. Returns how many it
 * gave: n, unless a block could not be had (memory ran out or a size is too
 * large to allocate); then it stops at that block, errno is ENOMEM, and
 * out[0..returned-1] are valid blocks for the caller to use or free. */
CORAL_API size_t coral_malloc_bulk_sizes(const size_t *sizes, size_t n, void **out);

/* ---- heaps -------------------------------------------------------------------
 * A heap belongs to the thread that creates it: only that thread allocates
 * from it, resets or destroys it. Any thread may free its blocks (with
 * coral_heap_free, coral_free or plain free). coral_heap_destroy frees every
 * block of the heap at once, in time proportional to its pages, and the heap;
 * coral_heap_reset frees the blocks and keeps the heap. Blocks of a destroyed
 * or reset heap must not be used again. When the owner thread exits, its
 * heaps go with it: their blocks stay valid (and freeable by any thread), the
 * handles do not. The exiting thread's own pthread key destructors may still
 * destroy its heaps (coralloc's cleanup waits one destructor round for them);
 * a destroy later than that frees the struct but no block. A NULL heap means
 * the calling thread's own heap. */
typedef struct coral_heap_s coral_heap_t;
CORAL_API coral_heap_t *coral_heap_new(void);
CORAL_API void coral_heap_destroy(coral_heap_t *heap);
CORAL_API void coral_heap_reset(coral_heap_t *heap);
CORAL_API CORAL_MALLOC_ATTR void *coral_heap_malloc(coral_heap_t *heap, size_t size);
CORAL_API CORAL_MALLOC_ATTR void *coral_heap_calloc(coral_heap_t *heap, size_t n, size_t size);
CORAL_API void *coral_heap_realloc(coral_heap_t *heap, void *p, size_t size);
CORAL_API void coral_heap_free(coral_heap_t *heap, void *p);

/* coral_heap_visit: fn(block, block_size, usable, arg) for every block in
 * use in heap (NULL: the calling thread's own heap; a user heap must be the
 * calling thread's, as for coral_heap_malloc): block is what malloc
 * returned (an allocation aligned to more than 64 KiB: the start of the
 * span it lies in), block_size the bytes it takes in the heap, usable what
 * malloc_usable_size says of it in the default build; in the secure build,
 * whose malloc_usable_size says the request, the block's bytes before its
 * canary word (a huge block's before its guard region: its usable size),
 * which the request is at most (the walk reads no block's memory: a block
 * may be freed while it runs). The blocks are the ones in use when the
 * call starts, all noted before fn is first called (in memory of coralloc's
 * own, not from malloc), so fn may call anything, coralloc's functions too:
 * allocate (a block fn allocates is not visited), free, realloc or write
 * the blocks. A block freed before its turn (by fn or another thread) is
 * visited all the same: fn must not touch its memory then. fn returns 0 to
 * go on; anything else stops the walk, and coral_heap_visit returns it.
 * Returns 0 once every block was visited, or -1 with errno ENOMEM (no
 * memory for the list; fn not called). Not visited: the secure build's
 * malloc(0) slots (no heap's). Visited though freed: a block that another
 * thread freed into its own bulk cache (coral_free_bulk), until that cache
 * gives it back, and a block that another thread freed and still holds in
 * its run of remote frees (up to 31 blocks of one page a thread, pushed at
 * its next free into another page, its coral_collect or malloc_trim, or
 * its exit; docs/DESIGN.md). */
typedef int (*coral_block_visit_fn)(void *block, size_t block_size, size_t usable, void *arg);
CORAL_API int coral_heap_visit(coral_heap_t *heap, coral_block_visit_fn fn, void *arg);

/* True when p points into memory coralloc manages. */
CORAL_API int coral_owns(const void *p);

/* Return memory the process is not using to the OS: pending purges are done
 * at once. force != 0 also collects this thread's caches and abandoned
 * memory first. Either pushes the calling thread's run of remote frees
 * (coral_heap_visit above); other threads' runs stay where they are. */
CORAL_API void coral_collect(int force);

/* ---- statistics -------------------------------------------------------------
 * coral_stats_print: a readable table (OS calls and bytes, mapped, resident
 * and in-page memory with their peaks, segments, threads, huge blocks, and
 * per size class allocated/freed/live/peak in builds with -DCORAL_STATS=ON).
 * coral_stats_json: the same as one JSON object into buf (at most len bytes,
 * NUL-terminated when len > 0); returns the full length, like snprintf, so
 * a call with len 0 sizes the buffer. CORALLOC_SHOW_STATS=1 prints the table
 * at exit; malloc_stats() and mallinfo2() answer from the same counters. */
CORAL_API void coral_stats_print(FILE *out);
CORAL_API size_t coral_stats_json(char *buf, size_t len);

/* ---- heap profile (docs/PROFILING.md) -----------------------------------------
 * With CORALLOC_PROFILE=FILE (or CORALLOC_PROFILE_LEAKS=1) set when the
 * process starts, coralloc samples one allocation in about every
 * CORALLOC_PROFILE_RATE bytes (512 KiB) with its stack, and writes FILE.PID
 * in the pprof format at exit (and on CORALLOC_PROFILE_SIGNAL).
 * coral_profile_dump writes the profile now to path: 0, or -1 with errno
 * (ENOTSUP: profiling is off; EBUSY: called from a signal handler that
 * interrupted its own thread inside the profiler, whose samples it could
 * not read; or the error of open/write). It allocates
 * nothing through malloc. coral_profile_live: how many sampled blocks are
 * live now, and the bytes they asked for (not scaled: the samples
 * themselves). */
CORAL_API int coral_profile_dump(const char *path);
CORAL_API void coral_profile_live(unsigned long long *blocks, unsigned long long *bytes);

/* ---- options ----------------------------------------------------------------
 * By name, with or without the CORALLOC_ prefix (docs/OPTIONS.md). Return 0,
 * or EINVAL for an unknown name or a value out of range, or EPERM for an
 * option that is read at start-up only. */
CORAL_API int coral_option_get(const char *name, long long *value);
CORAL_API int coral_option_set(const char *name, long long value);

/* The option table, for tools (`coralloc options`): coral_option_info fills
 * *out for option index 0, 1, ... and returns 0, or EINVAL past the last one.
 * `value` is the value in force (the environment is read on first use);
 * `names`, when not NULL, is a NULL-terminated list of the words the option
 * accepts for the values 0, 1, ...; is_bool options accept 1/0, true/false,
 * yes/no, on/off. coral_option_parse checks `text` as the environment
 * variable of option `name` would be checked and stores its value: 0, or
 * EINVAL (unknown name, or a value that does not parse or is out of range). */
typedef struct coral_option_info_s {
    const char *name; /* without the CORALLOC_ prefix */
    const char *help;
    long long default_value, min, max, value;
    int is_bool;
    int runtime; /* coral_option_set may change it */
    const char *const *names;
} coral_option_info_t;
CORAL_API int coral_option_info(size_t index, coral_option_info_t *out);
CORAL_API int coral_option_parse(const char *name, const char *text, long long *value);

/* The library's version, "MAJOR.MINOR.PATCH" (CORALLOC_VERSION when the
 * header and the library match). */
CORAL_API const char *coral_version(void);

/* ---- testing ----------------------------------------------------------------
 * For tests of time-driven behaviour, without sleeping.
 * coral_test_advance_clock: coralloc's clock (purge delays, idle bulk
 * caches) moves forward by ms milliseconds, for the whole process.
 * coral_test_purge_pass: one whole purge pass at the current clock, done by
 * the purge thread (returns 1 once it has finished a pass that started after
 * the call) or, when no purge thread runs, by the caller (returns 0); it
 * waits with every signal blocked (a test's call: not for a program whose
 * threads are stopped by signals while it waits).
 * coral_test_check: walks the calling thread's heaps, pages and segments and
 * checks their invariants (free + local free + in use = carved blocks, no
 * block free twice, every list inside its page, spans and segment map
 * consistent); 0, or -1 after printing the first one broken on stderr.
 * coral_test_huge_page_cost: every 2 MiB page coralloc faults in is taken
 * to have cost ns nanoseconds (negative: measured, the default), and the
 * slow ones seen so far are forgotten; huge pages stop being asked for once
 * two took more than 1 ms each. */
CORAL_API void coral_test_advance_clock(unsigned long long ms);
CORAL_API int coral_test_purge_pass(void);
CORAL_API int coral_test_check(void);
CORAL_API void coral_test_huge_page_cost(long long ns);

#ifdef __cplusplus
}
#endif
#endif /* CORALLOC_H */
