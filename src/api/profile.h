/* The sampling heap profiler (profile.c; its output, the pprof format and
 * the leak report, in profile_out.c; docs/PROFILING.md).
 *
 * Off unless the process starts with CORALLOC_PROFILE=FILE or
 * CORALLOC_PROFILE_LEAKS=1 (read once, on the first thread's set-up). Off,
 * it costs nothing on the fast paths: no heap has no_direct set, no page
 * has CORAL_PAGE_SAMPLED, so the slow paths' tests below are never taken.
 *
 * On, every heap has no_direct and direct_end 0 (heap.h): the malloc fast
 * path's first compare sends each allocation to a slow path of alloc.c,
 * which pops the block the fast path would have popped (so the block freed
 * last is reused first, as with profiling off) and counts its bytes
 * against the heap's countdown (coral_profile_count). When the countdown runs
 * out the allocation is sampled: its stack (a frame-pointer walk bounded by
 * the thread's stack) and size are recorded in a table keyed by its page,
 * and its page gets CORAL_PAGE_SAMPLED, so that a free of any block of the
 * page leaves the fast path for coral_free_unusual (or coral_free_slow),
 * which calls coral_profile_forget. The countdown is drawn from an
 * exponential distribution of mean CORALLOC_PROFILE_RATE bytes, anew after
 * each sample, so a block of s bytes is sampled with probability
 * 1 - exp(-s / rate) whatever the pattern of allocations.
 *
 * The profiler never allocates through malloc (its memory comes from
 * coral_os_map) and holds its locks (spin locks, leaves of the lock order)
 * only with every signal blocked, so a malloc or free in a signal handler,
 * in a thread's exit or in a fork's child never waits for a lock its own
 * thread holds; fork takes them all first (pthread_atfork). */
#ifndef CORAL_PROFILE_H
#define CORAL_PROFILE_H

#include "api/api.h"

/* Set once, before the first heap is ready (never changed after). */
extern bool coral_profile_on;

/* On the first thread's set-up: read the options, and when profiling is
 * asked for, set coral_profile_on and register the exit, fork and signal
 * handlers. */
void coral_profile_init(void);

/* p (NULL: failed) was just handed out by heap (whose no_direct is set) for
 * a request of size bytes: the heap's countdown (heap->profile_left: the
 * allocation that takes it below 0 is sampled, profile.c next_interval) is
 * charged, and the block sampled when it runs out. Returns p. */
void *coral_profile_sample(coral_heap_t *heap, void *p, size_t size);
CORAL_INLINE void *coral_profile_count(coral_heap_t *heap, void *p, size_t size) {
    if (coral_likely((heap->profile_left -= (int64_t)size) >= 0) || p == NULL) return p;
    return coral_profile_sample(heap, p, size);
}

/* A heap is set up (a thread's, a user heap new or reset, or the exit
 * heap at its first allocation): it gets no_direct and direct_end 0, so
 * that each of its allocations takes a slow path of alloc.c, which counts
 * it, and its countdown's first interval. */
void coral_profile_heap_start(coral_heap_t *heap);
/* The owner's refill of a class is about to pop from page, which has
 * CORAL_PAGE_SAMPLED: the flag goes if no sampled block of page is left
 * (other threads freed them; their frees leave it to the owner). */
void coral_profile_page_refilled(coral_page_t *page);

/* The live records' table (profile.c: a record per sampled block not
 * freed yet), bucketed by the block's page descriptor. Each bucket is one
 * cache line (a sample, or the look-up of a free, touches one line and one
 * page of the table): its lock, its chain of records and two counting filters,
 * written only under its lock (plain loads and stores, no locked add) and
 * read without it:
 * - addrs: records per hash of the block's address, among the bucket's.
 *   A free whose count is 0 has no record: the free of a block of a
 *   flagged page reads this count only (coral_profile_may_hold, inline in
 *   alloc.c's free), then pushes the block as the fast path does. A count
 *   that reaches 255 stays there (it may be wrong from then on, high only:
 *   a free then searches the chain, never misses a record).
 * - pages: records per page, by one more bit of the page's hash (exact:
 *   2^16 live records of one bucket's half would wrap it, far more than
 *   any heap holds at any rate). 0: the page has no record, and its owner
 *   clears its flag without searching.
 * A count may be another block's or page's (then the chain is searched,
 * under the lock). A record of p is counted before p is handed out, so a
 * free of p (which the program orders after that) sees its count. */
#define CORAL_PROFILE_LIVE_BITS 11
#define CORAL_PROFILE_LIVE_BUCKETS (1u << CORAL_PROFILE_LIVE_BITS)
#define CORAL_PROFILE_ADDR_SLOTS 48
struct coral_profile_record_s;
typedef struct coral_profile_live_s {
    _Atomic(int) lock;
    _Atomic(uint16_t) pages[2];
    struct coral_profile_record_s *first;
    _Atomic(uint8_t) addrs[CORAL_PROFILE_ADDR_SLOTS];
} __attribute__((aligned(64))) coral_profile_live_t;
extern coral_profile_live_t coral_profile_live_table[CORAL_PROFILE_LIVE_BUCKETS];

CORAL_INLINE uint64_t coral_profile_page_hash(const coral_page_t *page) {
    return (uint64_t)(uintptr_t)page * 0x9E3779B97F4A7C15ull;
}
CORAL_INLINE coral_profile_live_t *coral_profile_live_of(const coral_page_t *page) {
    return &coral_profile_live_table[coral_profile_page_hash(page) >>
                                     (64 - CORAL_PROFILE_LIVE_BITS)];
}
CORAL_INLINE _Atomic(uint8_t) *coral_profile_addr_count(coral_profile_live_t *b, const void *p) {
    uint64_t h = ((uint64_t)(uintptr_t)p * 0xC2B2AE3D27D4EB4Full) >> 32;
    return &b->addrs[(h * CORAL_PROFILE_ADDR_SLOTS) >> 32];
}
/* Whether p, a block of page, may have a record (false: it has none). */
CORAL_INLINE bool coral_profile_may_hold(const coral_page_t *page, const void *p) {
    return atomic_load_explicit(coral_profile_addr_count(coral_profile_live_of(page), p),
                                memory_order_relaxed) != 0;
}

/* p, a block of page (a page with CORAL_PAGE_SAMPLED, or a huge segment's
 * first descriptor), is being freed: its record goes, if it has one. */
void coral_profile_forget(coral_page_t *page, const void *p);
/* heap is destroyed or reset: every record of its blocks goes. */
void coral_profile_forget_heap(const coral_heap_t *heap);

/* ---- what profile_out.c reads ------------------------------------------------- */

#define CORAL_PROFILE_DEPTH 48 /* frames kept per stack */

/* An allocation site: a distinct stack, with its estimated totals (the
 * estimator: docs/PROFILING.md). */
typedef struct coral_profile_site_s {
    struct coral_profile_site_s *next; /* in its bucket */
    uint64_t hash;
    uint32_t depth;
    double alloc_objects, alloc_bytes;  /* every sampled allocation */
    double inuse_objects, inuse_bytes;  /* those not freed yet */
    uintptr_t pcs[CORAL_PROFILE_DEPTH]; /* return addresses, innermost first */
} coral_profile_site_t;

/* The sampling rate in force (bytes). */
int64_t coral_profile_rate(void);
/* How many sites exist now (more may come while a dump runs). */
size_t coral_profile_site_count(void);
/* A copy of each site, one bucket at a time under its lock, given to fn
 * (which must take no profiler lock), after every thread's tally (its
 * totals not yet published, profile.c) is added to the sites' totals. */
typedef void (*coral_profile_site_fn)(const coral_profile_site_t *site, void *arg);
void coral_profile_sites_visit(coral_profile_site_fn fn, void *arg);

/* profile_out.c: the profile in the pprof format to path; 0, or -1 with
 * errno set. Allocates nothing through malloc; may run in a signal
 * handler. at_exit: the process is ending (the exit handler), so the
 * memory and file mappings the write used are left for the exit to take
 * (no unmap). */
int coral_profile_write(const char *path, bool at_exit);
/* profile_out.c: the leak report (sites with sampled blocks still live) to
 * stderr, with the exact totals of the exiting thread's heap when known
 * (exact not NULL: coral_heap_visit's). */
typedef struct coral_profile_exact_s {
    unsigned long long blocks, bytes;
} coral_profile_exact_t;
void coral_profile_report_leaks(const coral_profile_exact_t *exact);

#endif /* CORAL_PROFILE_H */
