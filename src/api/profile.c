/* The sampling heap profiler: the sampler, the stack walk and the tables
 * (the protocol is at the top of profile.h; the output is profile_out.c).
 *
 * Two tables, each an array of buckets with a spin lock and a chain:
 * - sites, keyed by a hash of the stack: one per distinct stack, never
 *   freed, with the estimated totals of its samples; found without the
 *   lock (only a new site takes it), and added to in batches from each
 *   thread's tally (below), so a sample or a sampled free takes no site
 *   lock;
 * - live records, keyed by the block's page descriptor (the huge segment's
 *   first one for a huge block): one per sampled block not freed yet, so a
 *   free finds its record, and the owner learns whether its page still
 *   holds one, in one bucket; each bucket carries its own counting
 *   filters, written under its lock (no locked add).
 * Per sample and per sampled free: one locked instruction each, the live
 * bucket's lock.
 * A lock is held only inside a thread's critical section (crit_enter), for
 * a few hundred instructions, and never while taking another bucket's
 * lock (except the pool's, the innermost). A signal handler that
 * interrupts its thread's critical section takes no lock: its malloc is
 * not sampled, its free of a sampled block is deferred to the end of the
 * section, and so is a profile dump (no lock is ever waited for by the
 * thread that holds it, without a system call per section). Sites and records come from the pool,
 * chunks mapped with coral_os_map. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/profile.h"
#include "api/profile_draw.h"
#include "api/remote_run.h"

bool coral_profile_on;

static int64_t profile_rate = 524288;
static char profile_path[4096]; /* CORALLOC_PROFILE, or empty */

int64_t coral_profile_rate(void) { return profile_rate; }

/* ---- spin locks, held in the thread's critical section (below) ---------------- */

typedef _Atomic(int) spin_t;

/* The profiler's locks the calling thread holds or is taking: counted
 * before a take and after a release, so a signal handler that reads 0
 * knows that the code it interrupted holds none (a fork's prepare from
 * such a handler takes them all then: fork_prepare). Written by the
 * thread, and by its handlers, which leave it as they found it; signal
 * fences order it against the locks. */
static __thread volatile sig_atomic_t locks_held __attribute__((tls_model("initial-exec")));

static void spin_lock(spin_t *l) {
    locks_held = locks_held + 1;
    atomic_signal_fence(memory_order_seq_cst);
    while (atomic_exchange_explicit(l, 1, memory_order_acquire))
        while (atomic_load_explicit(l, memory_order_relaxed)) __builtin_ia32_pause();
}

static void spin_unlock(spin_t *l) {
    atomic_store_explicit(l, 0, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    locks_held = locks_held - 1;
}

/* The calling thread's critical section: set while it may hold a
 * profiler lock. Written by the thread (and its signal handlers, which
 * leave it as they found it); signal fences order it against the locks. */
static __thread volatile sig_atomic_t in_crit __attribute__((tls_model("initial-exec")));

/* Frees of sampled blocks a handler deferred (a stack of at most
 * PENDING, popped with a compare-and-swap, which a handler cannot split),
 * and a dump it deferred. */
#define PENDING 32
typedef struct pending_s {
    coral_page_t *page;
    const void *p;
} pending_t;
static __thread pending_t pending[PENDING] __attribute__((tls_model("initial-exec")));
static __thread int npending __attribute__((tls_model("initial-exec")));
static __thread volatile sig_atomic_t dump_pending __attribute__((tls_model("initial-exec")));
static _Atomic(uint64_t) frees_lost; /* deferred frees beyond PENDING: records left stale */

/* Enter the section; false: the thread is in it already (a handler
 * interrupted it), and may take no lock. */
static bool crit_enter(void) {
    if (in_crit) return false;
    in_crit = 1;
    atomic_signal_fence(memory_order_seq_cst);
    return true;
}

static CORAL_NOINLINE void run_deferred(void);

static inline void crit_leave(void) {
    atomic_signal_fence(memory_order_seq_cst);
    in_crit = 0;
    atomic_signal_fence(memory_order_seq_cst);
    if (__atomic_load_n(&npending, __ATOMIC_RELAXED) != 0 || dump_pending) run_deferred();
}

static void defer_free(coral_page_t *page, const void *p) {
    int n = __atomic_load_n(&npending, __ATOMIC_RELAXED);
    if (n >= PENDING) {
        atomic_fetch_add_explicit(&frees_lost, 1, memory_order_relaxed);
        return;
    }
    pending[n] = (pending_t){page, p};
    atomic_signal_fence(memory_order_seq_cst);
    __atomic_store_n(&npending, n + 1, __ATOMIC_RELAXED);
}

/* ---- the pool: sites and records, from mapped chunks -------------------------- */

#define POOL_CHUNK ((size_t)256 * 1024)

typedef struct coral_profile_record_s {
    struct coral_profile_record_s *next; /* in its bucket, or in the free list */
    const void *addr;                    /* what malloc returned */
    const coral_page_t *page;
    const coral_heap_t *heap;
    coral_profile_site_t *site;
    double objects, bytes; /* what it stands for (the estimator) */
    size_t size;           /* bytes asked */
} record_t;

/* Under pool_lock: the rest of the newest chunk, and freed records. */
static spin_t pool_lock;
static uint8_t *pool_carve;
static size_t pool_left;
static record_t *records_free;

/* Each piece starts a cache line: a proxies_t holds pages (64-byte
 * aligned), and a thread's tally shares no line with what others write. */
static void *pool_carve_locked(size_t size) {
    size = (size + 63) & ~(size_t)63;
    if (pool_left < size) {
        uint8_t *chunk = coral_os_map(POOL_CHUNK);
        if (chunk == NULL) return NULL;
        pool_carve = chunk;
        pool_left = POOL_CHUNK;
    }
    void *p = pool_carve;
    pool_carve += size;
    pool_left -= size;
    return p;
}

/* (Signals blocked; a site bucket's lock may be held.) */
static void *pool_get(size_t size, bool record) {
    spin_lock(&pool_lock);
    void *p;
    if (record && records_free != NULL) {
        p = records_free;
        records_free = records_free->next;
    } else {
        p = pool_carve_locked(size);
    }
    spin_unlock(&pool_lock);
    return p;
}

/* The calling thread's own heap once profiled: its exit (the heap layer
 * has switched coral_tls_heap to the empty heap by then) finds it here. */
static __thread coral_heap_t *thread_heap __attribute__((tls_model("initial-exec")));

/* Each thread with a profiled heap (thread_heap) keeps up to RECORDS_KEPT
 * freed records (its own list, taken and put only inside its critical
 * section, so no handler sees it half changed): a sample and the free of a
 * sampled block take no pool lock, a lock every thread's samples share,
 * while it has some. Its exit gives them back to the pool
 * (records_kept_return, from the heap layer's exit hook). A thread with no
 * heap (one that only frees) gets no exit hook: its records go straight to
 * the pool, or each such thread would take up to RECORDS_KEPT with it. */
#define RECORDS_KEPT 32
static __thread record_t *records_kept __attribute__((tls_model("initial-exec")));
static __thread uint32_t nrecords_kept __attribute__((tls_model("initial-exec")));

static record_t *record_get(void) {
    record_t *r = records_kept;
    if (r == NULL) return pool_get(sizeof(record_t), true);
    records_kept = r->next;
    nrecords_kept--;
    return r;
}

static void record_put(record_t *r) {
    if (thread_heap != NULL && nrecords_kept < RECORDS_KEPT) {
        r->next = records_kept;
        records_kept = r;
        nrecords_kept++;
        return;
    }
    spin_lock(&pool_lock);
    r->next = records_free;
    records_free = r;
    spin_unlock(&pool_lock);
}

/* ---- the tables --------------------------------------------------------------- */

#define SITE_BUCKETS 4096
#define LIVE_BUCKETS CORAL_PROFILE_LIVE_BUCKETS

/* A site bucket's chain is read without its lock: a site is made and
 * filled in (hash, depth, pcs, next) under the lock and then published by
 * a release store of `first`; a reader's acquire load of `first` sees it
 * whole, and those fields never change after. So a sample finds its site
 * with no locked instruction; only a new site takes the lock. A site's
 * totals are written and read under the lock only (tallies, below, add to
 * them in batches). */
typedef struct site_bucket_s {
    spin_t lock;
    _Atomic(coral_profile_site_t *) first;
} site_bucket_t;

/* A live bucket (profile.h: its layout and counts, which alloc.c's free
 * of a block of a flagged page reads): the records of the pages that hash
 * to it, in its chain (`first`, under its lock). */
typedef coral_profile_live_t live_bucket_t;
_Static_assert(sizeof(live_bucket_t) == 64, "a live bucket is one cache line");

/* In static memory: untouched, so not resident, while profiling is off;
 * on, a sample touches a page of each table. */
static site_bucket_t sites[SITE_BUCKETS];
live_bucket_t coral_profile_live_table[LIVE_BUCKETS];
static _Atomic(size_t) site_count;
/* The site buckets that hold a site (bit set under the bucket's lock when
 * its first site comes, never cleared: sites are never freed), so that a
 * dump reads those only, not every bucket's page. */
static _Atomic(uint64_t) sites_used[SITE_BUCKETS / 64];

static live_bucket_t *live_bucket_of(const coral_page_t *page) {
    return coral_profile_live_of(page);
}

static _Atomic(uint8_t) *addr_count(live_bucket_t *b, const void *p) {
    return coral_profile_addr_count(b, p);
}

static _Atomic(uint16_t) *page_count(live_bucket_t *b, const coral_page_t *page) {
    return &b->pages[(coral_profile_page_hash(page) >> (63 - CORAL_PROFILE_LIVE_BITS)) & 1];
}

/* A record of p on page comes (+1) or goes (-1); b's lock held. */
static void counts_add(live_bucket_t *b, const void *p, const coral_page_t *page, int delta) {
    _Atomic(uint8_t) *a = addr_count(b, p);
    uint8_t n = atomic_load_explicit(a, memory_order_relaxed);
    if (n != UINT8_MAX) atomic_store_explicit(a, (uint8_t)(n + delta), memory_order_relaxed);
    _Atomic(uint16_t) *c = page_count(b, page);
    atomic_store_explicit(c, (uint16_t)(atomic_load_explicit(c, memory_order_relaxed) + delta),
                          memory_order_relaxed);
}

/* A stack's hash (FNV-1a over the return addresses, then the depth),
 * computed by the walk as it goes: STACK_HASH_START, a step per frame,
 * stack_hash_end. */
#define STACK_HASH_START 0xcbf29ce484222325ull

static inline uint64_t stack_hash_step(uint64_t h, uintptr_t pc) {
    return (h ^ pc) * 0x100000001b3ull;
}

static inline uint64_t stack_hash_end(uint64_t h, uint32_t depth) {
    h ^= depth;
    return h ^ (h >> 29);
}

static site_bucket_t *site_bucket_of(const coral_profile_site_t *s) {
    return &sites[s->hash & (SITE_BUCKETS - 1)];
}

/* (A loop, not memcmp: a stack is a few words, and the call to libc's
 * memcmp cost a sample more than the compare.) */
static bool pcs_equal(const uintptr_t *a, const uintptr_t *b, uint32_t depth) {
    for (uint32_t i = 0; i < depth; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static coral_profile_site_t *site_search(coral_profile_site_t *s, const uintptr_t *pcs,
                                         uint32_t depth, uint64_t h) {
    while (s != NULL && (s->hash != h || s->depth != depth || !pcs_equal(s->pcs, pcs, depth)))
        s = s->next;
    return s;
}

/* The site of the stack, made if new (signals blocked). NULL: no memory
 * for a new one. */
static coral_profile_site_t *site_find(const uintptr_t *pcs, uint32_t depth, uint64_t h) {
    site_bucket_t *b = &sites[h & (SITE_BUCKETS - 1)];
    coral_profile_site_t *first = atomic_load_explicit(&b->first, memory_order_acquire);
    coral_profile_site_t *s = site_search(first, pcs, depth, h);
    if (s != NULL) return s;
    spin_lock(&b->lock);
    coral_profile_site_t *now = atomic_load_explicit(&b->first, memory_order_relaxed);
    if (now != first) s = site_search(now, pcs, depth, h); /* (made meanwhile) */
    if (s == NULL && (s = pool_get(sizeof *s, false)) != NULL) {
        memset(s, 0, sizeof *s);
        s->hash = h;
        s->depth = depth;
        memcpy(s->pcs, pcs, depth * sizeof *pcs);
        s->next = now;
        atomic_store_explicit(&b->first, s, memory_order_release);
        size_t i = (size_t)(b - sites);
        atomic_fetch_or_explicit(&sites_used[i / 64], (uint64_t)1 << (i % 64),
                                 memory_order_relaxed);
        atomic_fetch_add_explicit(&site_count, 1, memory_order_relaxed);
    }
    spin_unlock(&b->lock);
    return s;
}

/* The four totals of a site, in profile.h's order. */
enum { T_ALLOC_OBJECTS, T_ALLOC_BYTES, T_INUSE_OBJECTS, T_INUSE_BYTES, T_COUNT };

/* Adds d to s's totals; its bucket's lock held. */
static void site_totals_add_locked(coral_profile_site_t *s, const double d[T_COUNT]) {
    s->alloc_objects += d[T_ALLOC_OBJECTS];
    s->alloc_bytes += d[T_ALLOC_BYTES];
    s->inuse_objects += d[T_INUSE_OBJECTS];
    s->inuse_bytes += d[T_INUSE_BYTES];
}

/* ---- tallies: a thread's site totals, published in batches ---------------------
 * A thread with a profiled heap (thread_heap: its exit hook runs) adds its
 * samples' weights, and its frees' of sampled blocks, to its own tally,
 * with no lock and no locked instruction: an entry per site (direct-mapped
 * by the site's hash; a site that finds its entry taken by another
 * publishes and evicts that one). What an entry holds is published to its
 * site's totals (under the site bucket's lock) when it is evicted, when
 * the thread exits (tally_release, from the exit hook), and by every dump
 * (tallies_publish, before the sites are read), so a dump has every
 * sample and free made before it began, of threads gone or running.
 *
 * An entry's sums are kept twice, so that a reader always has a whole
 * copy: an add writes the four new sums into the copy not in force and
 * then puts that copy in force; `version` counts 2 per add, odd while
 * the add writes (copy in force: (version >> 1) & 1, odd or even).
 *
 * Who writes what, when:
 * - sum[][], version: the owner only, in its critical section (one
 *   writer): version + 1, the copy not in force written, version + 2,
 *   all release stores. A reader (entry_read) loads version, the copy in
 *   force and version again, all acquire loads: a write to that copy
 *   comes after the store of an odd version two above the first, so a
 *   reader that read such a write reads that version or a later one
 *   after it; a second version at most 2 above the first (rounded down
 *   to even) means the copy was read whole, else it reads again (the
 *   owner's add is a few stores: never waited for long, nor by itself).
 *   (Release stores and acquire loads, not fences: TSan models these;
 *   on x86 they are plain moves.)
 * - published[]: how much of the sums is in the site's totals. Written,
 *   with the totals, under the lock of the entry's site's bucket: by the
 *   owner (eviction, exit), by a dump (the publication for the owner) and
 *   by a fork's child (tallies_adopt_locked).
 * - site: NULL, or the site the sums are for. Set from NULL by the owner
 *   (no lock: everything else is 0 then, written before it by a release
 *   store); back to NULL only under the site's bucket lock, after the
 *   publication, with the rest zeroed first. So whoever holds the lock of
 *   site s's bucket and reads site == s reads the sums of s: the owner
 *   cannot evict s meanwhile.
 * So a publication has each sample (and each free) whole or not at all,
 * and a later one has the rest: totals are never counted in part, lost or
 * counted twice. A fork's child too: the fork takes the bucket locks but
 * not the owners' adds, so another thread's add may be under way in the
 * parent when the child's memory is copied, but the copy in force is whole
 * (the add wrote the other) and the child's version never moves. The
 * child publishes those tallies and frees them (their threads are not
 * there): every sample those threads had made is in the child's totals,
 * as the blocks they stand for are in its heap; a sample half made is not
 * (docs/PROFILING.md, "Rules it keeps").
 *
 * Tallies are mapped from the pool, listed (a push-only list: `next` is
 * set before the release store of the head, and never changed) and never
 * unmapped; an exiting thread's, published and emptied, goes to a free
 * list (pool_lock) for the next thread. A thread with no exit hook (no
 * profiled heap: one that only frees, or an exiting thread past its
 * cleanup) adds to the site's totals directly, under the bucket's lock. */
#define TALLY_SLOTS 32

typedef struct tally_entry_s {
    _Atomic(coral_profile_site_t *) site;
    _Atomic(uint64_t) version;
    _Atomic(double) sum[2][T_COUNT];
    _Atomic(double) published[T_COUNT];
} tally_entry_t;

typedef struct tally_s {
    tally_entry_t e[TALLY_SLOTS];
    struct tally_s *next;      /* in tallies_all, immutable once listed */
    struct tally_s *next_free; /* in tallies_free (pool_lock) */
    bool unowned;              /* on tallies_free (pool_lock) */
} tally_t;

static _Atomic(tally_t *) tallies_all;
static tally_t *tallies_free; /* (pool_lock) */
static __thread tally_t *thread_tally __attribute__((tls_model("initial-exec")));

/* The sums of e in force, whole (any thread; the owner's adds may run). */
static void entry_read(tally_entry_t *e, double out[T_COUNT]) {
    for (;;) {
        uint64_t v = atomic_load_explicit(&e->version, memory_order_acquire);
        _Atomic(double) *copy = e->sum[(v >> 1) & 1];
        for (int i = 0; i < T_COUNT; i++)
            out[i] = atomic_load_explicit(&copy[i], memory_order_acquire);
        if (atomic_load_explicit(&e->version, memory_order_acquire) - (v & ~(uint64_t)1) <= 2)
            return;
    }
}

/* The owner's add to e's sums (it is their only writer): alloc_* +=
 * objects, bytes; inuse_* += in_objects, in_bytes. */
static inline void entry_add(tally_entry_t *e, double objects, double bytes, double in_objects,
                             double in_bytes) {
    uint64_t v = atomic_load_explicit(&e->version, memory_order_relaxed);
    _Atomic(double) *from = e->sum[(v >> 1) & 1], *to = e->sum[((v >> 1) & 1) ^ 1];
    atomic_store_explicit(&e->version, v + 1, memory_order_release);
#define ENTRY_SET(i, d)                                                                            \
    atomic_store_explicit(&to[i], atomic_load_explicit(&from[i], memory_order_relaxed) + (d),      \
                          memory_order_release)
    ENTRY_SET(T_ALLOC_OBJECTS, objects);
    coral_test_point(CORAL_TP_PROFILE_TALLY_ADDING, e);
    ENTRY_SET(T_ALLOC_BYTES, bytes);
    ENTRY_SET(T_INUSE_OBJECTS, in_objects);
    ENTRY_SET(T_INUSE_BYTES, in_bytes);
#undef ENTRY_SET
    atomic_store_explicit(&e->version, v + 2, memory_order_release);
}

/* What e holds beyond published[] goes to site s's totals; the lock of
 * s's bucket held, e's site is s. */
static void entry_publish_locked(tally_entry_t *e, coral_profile_site_t *s) {
    double sum[T_COUNT], d[T_COUNT];
    entry_read(e, sum);
    for (int i = 0; i < T_COUNT; i++) {
        d[i] = sum[i] - atomic_load_explicit(&e->published[i], memory_order_relaxed);
        atomic_store_explicit(&e->published[i], sum[i], memory_order_relaxed);
    }
    site_totals_add_locked(s, d);
}

/* e (site s) published, then emptied and freed; the lock of s's bucket
 * held, and e's owner not adding to it (the owner, or a fork's child). */
static void entry_empty_locked(tally_entry_t *e, coral_profile_site_t *s) {
    entry_publish_locked(e, s);
    for (int i = 0; i < T_COUNT; i++) {
        atomic_store_explicit(&e->sum[0][i], 0.0, memory_order_relaxed);
        atomic_store_explicit(&e->sum[1][i], 0.0, memory_order_relaxed);
        atomic_store_explicit(&e->published[i], 0.0, memory_order_relaxed);
    }
    atomic_store_explicit(&e->version, 0, memory_order_relaxed);
    atomic_store_explicit(&e->site, NULL, memory_order_relaxed);
}

/* The owner empties e (site s). */
static void entry_evict(tally_entry_t *e, coral_profile_site_t *s) {
    site_bucket_t *b = site_bucket_of(s);
    spin_lock(&b->lock);
    entry_empty_locked(e, s);
    spin_unlock(&b->lock);
}

/* The calling thread's tally, made at its first use; NULL where it has
 * none (no exit hook will publish it) or no memory. In the section. */
static tally_t *tally_mine(void) {
    if (thread_heap == NULL) return NULL;
    tally_t *t = thread_tally;
    if (t != NULL) return t;
    spin_lock(&pool_lock);
    t = tallies_free;
    if (t != NULL) {
        tallies_free = t->next_free;
        t->unowned = false;
    } else if ((t = pool_carve_locked(sizeof *t)) != NULL) {
        t->next = atomic_load_explicit(&tallies_all, memory_order_relaxed);
        atomic_store_explicit(&tallies_all, t, memory_order_release);
    }
    spin_unlock(&pool_lock);
    thread_tally = t;
    return t;
}

/* t (emptied) on the free list; pool_lock held. */
static void tally_free_locked(tally_t *t) {
    t->unowned = true;
    t->next_free = tallies_free;
    tallies_free = t;
}

/* The calling thread's entry for site s, taken for it (its holder
 * evicted) if another site holds it; NULL where the thread has no tally.
 * In the section. */
static CORAL_NOINLINE tally_entry_t *tally_entry_slow(coral_profile_site_t *s) {
    tally_t *t = tally_mine();
    if (t == NULL) return NULL;
    tally_entry_t *e = &t->e[(s->hash >> 12) & (TALLY_SLOTS - 1)];
    coral_profile_site_t *held = atomic_load_explicit(&e->site, memory_order_relaxed);
    if (held != s) {
        if (held != NULL) entry_evict(e, held);
        atomic_store_explicit(&e->site, s, memory_order_release);
    }
    return e;
}

static inline tally_entry_t *tally_entry(coral_profile_site_t *s) {
    tally_t *t = thread_tally;
    if (coral_likely(t != NULL)) {
        tally_entry_t *e = &t->e[(s->hash >> 12) & (TALLY_SLOTS - 1)];
        if (coral_likely(atomic_load_explicit(&e->site, memory_order_relaxed) == s)) return e;
    }
    return tally_entry_slow(s);
}

/* Totals of site s: alloc_* += objects, bytes, and inuse_* += in_objects,
 * in_bytes; to the thread's tally, or directly, under the bucket's lock.
 * In the section. */
static inline void site_add(coral_profile_site_t *s, double objects, double bytes,
                            double in_objects, double in_bytes) {
    tally_entry_t *e = tally_entry(s);
    if (coral_likely(e != NULL)) {
        entry_add(e, objects, bytes, in_objects, in_bytes);
        return;
    }
    const double d[T_COUNT] = {objects, bytes, in_objects, in_bytes};
    site_bucket_t *b = site_bucket_of(s);
    spin_lock(&b->lock);
    site_totals_add_locked(s, d);
    spin_unlock(&b->lock);
}

static inline void site_count_alloc(coral_profile_site_t *s, double objects, double bytes,
                                    bool in_use) {
    site_add(s, objects, bytes, in_use ? objects : 0.0, in_use ? bytes : 0.0);
}

static inline void site_count_free(coral_profile_site_t *s, double objects, double bytes) {
    site_add(s, 0.0, 0.0, -objects, -bytes);
}

/* Every entry of t published (by a dump, for whichever thread owns t). */
static void tally_publish(tally_t *t) {
    for (size_t i = 0; i < TALLY_SLOTS; i++) {
        tally_entry_t *e = &t->e[i];
        for (;;) {
            coral_profile_site_t *s = atomic_load_explicit(&e->site, memory_order_acquire);
            if (s == NULL) break;
            site_bucket_t *b = site_bucket_of(s);
            spin_lock(&b->lock);
            bool same = atomic_load_explicit(&e->site, memory_order_acquire) == s;
            if (same) entry_publish_locked(e, s);
            spin_unlock(&b->lock);
            if (same) break; /* (else the owner evicted s meanwhile: read again) */
        }
    }
}

static void tallies_publish(void) {
    for (tally_t *t = atomic_load_explicit(&tallies_all, memory_order_acquire); t != NULL;
         t = t->next) {
        if (!crit_enter())
            return; /* (only at an exit() from a handler inside the section; a dump there is
                       refused) */
        tally_publish(t);
        crit_leave();
    }
}

/* The exiting thread's tally: published, emptied, freed for another. */
static void tally_release(void) {
    tally_t *t = thread_tally;
    if (t == NULL || !crit_enter()) return;
    for (size_t i = 0; i < TALLY_SLOTS; i++) {
        coral_profile_site_t *s = atomic_load_explicit(&t->e[i].site, memory_order_relaxed);
        if (s != NULL) entry_evict(&t->e[i], s);
    }
    thread_tally = NULL;
    spin_lock(&pool_lock);
    tally_free_locked(t);
    spin_unlock(&pool_lock);
    crit_leave();
}

/* A record's weights leave its site's in-use totals (signals blocked). */
static void site_release(const record_t *r) { site_count_free(r->site, r->objects, r->bytes); }

size_t coral_profile_site_count(void) {
    return atomic_load_explicit(&site_count, memory_order_relaxed);
}

void coral_profile_sites_visit(coral_profile_site_fn fn, void *arg) {
    tallies_publish(); /* every thread's batch in the sites' totals first */
    coral_profile_site_t copy;
    for (size_t i = 0; i < SITE_BUCKETS; i++) {
        if (i % 64 == 0 && atomic_load_explicit(&sites_used[i / 64], memory_order_relaxed) == 0) {
            i += 63; /* (a site added meanwhile may be missed, as by any dump) */
            continue;
        }
        if (!(atomic_load_explicit(&sites_used[i / 64], memory_order_relaxed) >> (i % 64) & 1))
            continue;
        if (!crit_enter())
            return; /* (only at an exit() from a handler inside the section; a dump there is
                       refused) */
        spin_lock(&sites[i].lock);
        for (coral_profile_site_t *s = atomic_load_explicit(&sites[i].first, memory_order_relaxed);
             s != NULL; s = s->next) {
            copy = *s;
            fn(&copy, arg);
        }
        spin_unlock(&sites[i].lock);
        crit_leave();
    }
}

/* ---- numbers without libm: the random state, the weights (the draw: profile_draw.h) ---- */

/* 1 - e^-x for x >= 0: below 1 the series x - x^2/2! + ... to x^18/18!
 * (no cancellation, error below 1e-16), in Horner form with the
 * reciprocal factorials; above, e^-x = (e^-(x/2^k))^(2^k) with the series
 * for the small power. */
static double one_minus_exp_neg(double x) {
    if (x < 1.0) {
        /* x (1 - x/2 (1 - x/3 (1 - ... (1 - x/19)))) */
        static const double inv[20] = {0,        1.0,      1.0 / 2,  1.0 / 3,  1.0 / 4,
                                       1.0 / 5,  1.0 / 6,  1.0 / 7,  1.0 / 8,  1.0 / 9,
                                       1.0 / 10, 1.0 / 11, 1.0 / 12, 1.0 / 13, 1.0 / 14,
                                       1.0 / 15, 1.0 / 16, 1.0 / 17, 1.0 / 18, 1.0 / 19};
        double g = 1.0;
        for (int k = 18; k >= 1; k--) g = 1.0 - x * g * inv[k + 1];
        return x * g;
    }
    if (x > 700.0) return 1.0;
    int k = 0;
    while (x > 0.5) x *= 0.5, k++;
    double e = 1.0 - one_minus_exp_neg(x);
    while (k-- > 0) e *= e;
    return 1.0 - e;
}

/* ---- per thread: the random draw ---------------------------------------------- */

static __thread uint64_t rng_state __attribute__((tls_model("initial-exec")));

/* The thread's first draw: its state seeded (out of line, so that the
 * draw's caller, once a sample, saves fewer registers for the calls). */
static CORAL_NOINLINE uint64_t rng_seeded(void) {
    uint64_t seed = coral_thread_id() ^ (coral_clock_ms() << 20) ^ (uint64_t)getpid();
    return (seed * 0x9E3779B97F4A7C15ull) | 1;
}

static uint64_t rng_next(void) {
    if (coral_unlikely(rng_state == 0)) rng_state = rng_seeded();
    uint64_t x = rng_state; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Bytes to the next sample, less one: the integer part of an exponential
 * of mean profile_rate (so at least 0). A countdown that goes below 0 has
 * its sample: an allocation of s bytes with d left is sampled when s > d,
 * which is s >= d + 1, as a point at d + 1 asks. (Below 0, not at 0, so
 * that the count's test is the subtraction's sign: alloc.c.) */
static int64_t next_interval(void) {
    double minus_ln_u = coral_profile_minus_ln_uniform((rng_next() >> 11) + 1); /* k in [1, 2^53] */
    double d = minus_ln_u * (double)profile_rate;
    if (d > 9.0e18) d = 9.0e18;
    if (d < 0.0) d = 0.0; /* (u = 1: -ln u is 0, within the series' error) */
    return (int64_t)d;
}

/* ---- the stack walk ------------------------------------------------------------- */

extern void *__libc_stack_end;

/* The top of the stack holding fp: every address from fp up to it is
 * mapped. The main thread's runs up to __libc_stack_end; another thread's
 * (glibc) up to its descriptor, pthread_self(); an alternate signal stack
 * up to its end; anything else: the rest of fp's own page only. */
static uintptr_t stack_top_of(uintptr_t fp) {
    const uintptr_t span = (uintptr_t)1 << 30;
    uintptr_t self = (uintptr_t)pthread_self();
    if (fp < self && self - fp < span) return self;
    uintptr_t main_top = (uintptr_t)__libc_stack_end;
    if (fp < main_top && main_top - fp < span) return main_top;
    stack_t ss;
    if (sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_DISABLE) && fp >= (uintptr_t)ss.ss_sp &&
        fp - (uintptr_t)ss.ss_sp < ss.ss_size)
        return (uintptr_t)ss.ss_sp + ss.ss_size;
    return (fp | (CORAL_OS_PAGE_SIZE - 1)) + 1;
}

/* Return addresses, innermost first, by the frame-pointer chain: each
 * frame's saved frame pointer must lie above the last and below the
 * stack's top, so the walk reads only the thread's stack and ends. Frames
 * compiled without a frame pointer are skipped or end the walk. The
 * stack's hash, made on the way (no second pass), goes to *hash. */
static CORAL_NOINLINE uint32_t stack_walk(uintptr_t *pcs, uint32_t max, uint64_t *hash) {
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
    uintptr_t top = stack_top_of(fp);
    uint32_t n = 0;
    uint64_t h = STACK_HASH_START;
    while (n < max && (fp & 7) == 0 && fp + 2 * sizeof(uintptr_t) <= top) {
        const uintptr_t *frame = (const uintptr_t *)fp;
        uintptr_t next = frame[0], ret = frame[1];
        if (ret < CORAL_OS_PAGE_SIZE) break;
        pcs[n++] = ret;
        h = stack_hash_step(h, ret);
        if (next <= fp) break;
        fp = next;
    }
    *hash = stack_hash_end(h, n);
    return n;
}

/* ---- sampling ----------------------------------------------------------------- */

/* What a sample of a block counted as c bytes stands for (the
 * estimator, docs/PROFILING.md): 1/p objects and c/p bytes, p = 1 -
 * e^(-c/rate) (above 0), the probability that such a block is sampled.
 * The last pair computed is kept per thread, since a thread's samples
 * often repeat a size (a class's block size, a program's buffer): a
 * repeat costs no exponential and no division. Called in the thread's
 * critical section only, so a signal handler never splits the update (a
 * handler inside the section samples nothing). */
typedef struct weights_s {
    size_t counted; /* 0: none kept yet */
    double objects, bytes;
} weights_t;
static __thread weights_t weights_last __attribute__((tls_model("initial-exec")));

static weights_t sample_weights(size_t counted) {
    if (counted == weights_last.counted && counted != 0) return weights_last;
    double prob = one_minus_exp_neg((double)counted / (double)profile_rate);
    if (prob <= 0.0) prob = 1e-300;
    weights_last =
        (weights_t){.counted = counted, .objects = 1.0 / prob, .bytes = (double)counted / prob};
    return weights_last;
}

/* The page descriptor a record of p is keyed by, and flagged. */
static coral_page_t *page_key_of(const void *p) {
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL) return NULL;
    if (seg->kind == CORAL_SEGMENT_HUGE) return &seg->pages[0];
    return coral_slice_head(coral_segment_slice_of(seg, p));
}

/* Record p (size bytes asked, as the countdown counted it): its stack, its
 * site, its page flagged. */
static void sample_record(coral_heap_t *heap, void *p, size_t size) {
    coral_page_t *page = page_key_of(p);
    if (page == NULL) return; /* (a secure build's malloc(0) slot: no bytes) */
    uintptr_t pcs[CORAL_PROFILE_DEPTH];
    uint64_t hash;
    uint32_t depth = stack_walk(pcs, CORAL_PROFILE_DEPTH, &hash);
    if (!crit_enter()) return; /* a handler's malloc inside the section: not sampled */
    /* A block of s bytes is sampled with probability 1 - e^(-s/rate); it
     * stands for 1/that many blocks and s/that bytes (docs/PROFILING.md). */
    weights_t w = sample_weights(size);
    double objects = w.objects, bytes = w.bytes;
    coral_profile_site_t *site = site_find(pcs, depth, hash);
    record_t *r = site != NULL ? record_get() : NULL;
    if (site != NULL) site_count_alloc(site, objects, bytes, r != NULL); /* (in use: recorded) */
    if (r != NULL) {
        live_bucket_t *b = live_bucket_of(page);
        spin_lock(&b->lock);
        *r = (record_t){.next = b->first,
                        .addr = p,
                        .page = page,
                        .heap = heap,
                        .site = site,
                        .objects = objects,
                        .bytes = bytes,
                        .size = size};
        b->first = r;
        counts_add(b, p, page, 1);
        /* The calling thread owns the page (its heap just allocated there);
         * a huge segment's descriptor has no owner, and no one else writes it. */
        coral_slice_set_flags(page, coral_slice_flags(page) | CORAL_PAGE_SAMPLED);
        coral_test_point(CORAL_TP_PROFILE_RECORDING, p);
        spin_unlock(&b->lock);
    }
    crit_leave();
}

void *coral_profile_sample(coral_heap_t *heap, void *p, size_t size) {
    heap->profile_left = next_interval();
    sample_record(heap, p, size);
    return p;
}

/* Whether a record of page other than gone is in b (its lock held). */
static bool page_has_records(const live_bucket_t *b, const coral_page_t *page) {
    for (const record_t *r = b->first; r != NULL; r = r->next)
        if (r->page == page) return true;
    return false;
}

/* The owner's refill takes a flagged page (a free of an unsampled block
 * leaves the flag alone: its look-up reads the address count only): the
 * flag goes when its bucket's page count is 0, which says that the page
 * has no record left. So a page whose sampled blocks other threads freed
 * has its frees back on the fast path from its owner's next refill from
 * it. A count that is not 0 leaves the flag, without a look at the bucket:
 * the page still has a record (then the owner's free of its last sampled
 * block clears the flag, coral_profile_forget), or shares the count with
 * another page's (then its frees keep the look-up of their address count,
 * until a refill finds the count 0). */
static void page_flag_check(coral_page_t *page) {
    if (coral_slice_tid(page) != coral_thread_id()) return;
    _Atomic(uint16_t) *count = page_count(live_bucket_of(page), page);
    if (atomic_load_explicit(count, memory_order_relaxed) != 0) return;
    /* Read again in the section, where no record of the page can come
     * (only this thread makes them, and a handler's malloc in the section
     * is not sampled): one a handler made before it is counted. Other
     * threads' frees only lower the count. */
    if (!crit_enter()) return; /* (the page's next refill clears it) */
    if (atomic_load_explicit(count, memory_order_relaxed) == 0)
        coral_slice_set_flags(page, coral_slice_flags(page) & ~CORAL_PAGE_SAMPLED);
    crit_leave();
}

/* ---- the counted heap: profiling on ------------------------------------------------
 * A profiled heap serves no size through the fast path (direct_end 0), so
 * each of its allocations takes alloc.c's counted path, which pops the
 * block the fast path would have popped (the block freed last first) and
 * counts its bytes against the heap's countdown (coral_profile_count). */

void coral_profile_heap_start(coral_heap_t *heap) {
    heap->no_direct = true;
    heap->direct_end = 0;
    heap->profile_left = next_interval();
    /* (The exit heap is a default heap too, but no thread's own.) */
    if (heap->is_default && heap == coral_tls_heap) thread_heap = heap;
}

void coral_profile_page_refilled(coral_page_t *page) { page_flag_check(page); }

/* The thread's kept records back to the pool, in one list. */
static void records_kept_return(void) {
    if (records_kept == NULL || !crit_enter()) return;
    record_t *last = records_kept;
    while (last->next != NULL) last = last->next;
    spin_lock(&pool_lock);
    last->next = records_free;
    records_free = records_kept;
    spin_unlock(&pool_lock);
    records_kept = NULL;
    nrecords_kept = 0;
    crit_leave();
}

/* The thread exits (before its heaps are abandoned): its kept records
 * back, and its tally published. */
static void profile_thread_exit(void) {
    coral_remote_runs_flush();
    thread_heap = NULL; /* from here on its freed records go to the pool */
    records_kept_return();
    tally_release();
}

void coral_profile_forget(coral_page_t *page, const void *p) {
    /* A record of p is made before p is handed out, so a free of p (which
     * the program orders after that) sees its count. */
    if (!coral_profile_may_hold(page, p)) return;
    live_bucket_t *b = live_bucket_of(page);
    if (!crit_enter()) {
        defer_free(page, p);
        return;
    }
    spin_lock(&b->lock);
    record_t **link = &b->first, *r;
    while ((r = *link) != NULL && r->addr != p) link = &r->next;
    if (r != NULL) {
        *link = r->next;
        counts_add(b, p, page, -1);
    }
    /* The owner clears the flag when no sampled block of the page is left
     * (only it sets it, so none can appear meanwhile); another thread's
     * free leaves it to the owner's next refill from the page. (A page
     * count of 0 says so without the search.) */
    if (coral_slice_tid(page) == coral_thread_id() &&
        (atomic_load_explicit(page_count(b, page), memory_order_relaxed) == 0 ||
         !page_has_records(b, page)))
        coral_slice_set_flags(page, coral_slice_flags(page) & ~CORAL_PAGE_SAMPLED);
    spin_unlock(&b->lock);
    if (r != NULL) {
        site_release(r);
        record_put(r);
    }
    crit_leave();
}

void coral_profile_forget_heap(const coral_heap_t *heap) {
    for (size_t i = 0; i < LIVE_BUCKETS; i++) {
        if (!crit_enter()) return; /* (a handler's destroy: records left stale) */
        spin_lock(&coral_profile_live_table[i].lock);
        record_t **link = &coral_profile_live_table[i].first, *r, *gone = NULL;
        while ((r = *link) != NULL) {
            if (r->heap == heap) {
                *link = r->next;
                counts_add(&coral_profile_live_table[i], r->addr, r->page, -1);
                r->next = gone;
                gone = r;
            } else {
                link = &r->next;
            }
        }
        spin_unlock(&coral_profile_live_table[i].lock);
        while ((r = gone) != NULL) {
            gone = r->next;
            site_release(r);
            record_put(r);
        }
        crit_leave();
    }
}

void coral_profile_live(unsigned long long *blocks, unsigned long long *bytes) {
    unsigned long long n = 0, total = 0;
    for (size_t i = 0; i < LIVE_BUCKETS; i++) {
        if (!crit_enter()) break;
        spin_lock(&coral_profile_live_table[i].lock);
        for (const record_t *r = coral_profile_live_table[i].first; r != NULL; r = r->next) {
            n++;
            total += r->size;
        }
        spin_unlock(&coral_profile_live_table[i].lock);
        crit_leave();
    }
    if (blocks != NULL) *blocks = n;
    if (bytes != NULL) *bytes = total;
}

/* ---- fork: every lock taken before, released after (both sides) ----------------
 * The heap layer's inner hooks: taken after every allocator lock (a sample
 * of an exiting thread's allocation takes these under the exit heap's
 * lock), released before any. A fork from a signal handler that
 * interrupted its thread's section (fork is async-signal-safe) takes them
 * too if that code holds none, nor is taking one (locks_held: in an add
 * to its tally, a stack walk): another thread may hold one, which the
 * child would otherwise inherit held by a thread it does not have (before,
 * such a fork took none: the child's free of that thread's sampled block
 * waited forever, window_fork_in_profile_section); the interrupted code
 * waits for nothing the fork holds. If it holds one, the fork takes none
 * (it would wait for itself), and the child may inherit another thread's
 * held, as a child of glibc's malloc does in such a fork. fork_locked and
 * fork_in_section are written and read under the allocator's locks, one
 * fork at a time. */

static bool fork_locked, fork_in_section;

/* A lock the fork's prepare takes. */
static void fork_spin_lock(spin_t *l) {
    if (atomic_load_explicit(l, memory_order_relaxed))
        coral_test_point(CORAL_TP_PROFILE_FORK_WAIT, l);
    spin_lock(l);
}

static void fork_prepare(void) {
    fork_in_section = !crit_enter(); /* (a handler's fork: the section is the code's) */
    fork_locked = !fork_in_section || locks_held == 0;
    if (!fork_locked) return;
    for (size_t i = 0; i < SITE_BUCKETS; i++) fork_spin_lock(&sites[i].lock);
    for (size_t i = 0; i < LIVE_BUCKETS; i++) fork_spin_lock(&coral_profile_live_table[i].lock);
    fork_spin_lock(&pool_lock);
}

static void fork_release(void) {
    if (!fork_locked) return;
    spin_unlock(&pool_lock);
    for (size_t i = LIVE_BUCKETS; i-- > 0;) spin_unlock(&coral_profile_live_table[i].lock);
    for (size_t i = SITE_BUCKETS; i-- > 0;) spin_unlock(&sites[i].lock);
    if (!fork_in_section) crit_leave();
}

/* In the child, every lock held: the tallies of the parent's other
 * threads (none of them is here to publish its own) go to the sites'
 * totals, each entry's copy in force (whole: tallies, above), and on the
 * free list. */
static void tallies_adopt_locked(void) {
    for (tally_t *t = atomic_load_explicit(&tallies_all, memory_order_acquire); t != NULL;
         t = t->next) {
        if (t == thread_tally || t->unowned) continue;
        for (size_t i = 0; i < TALLY_SLOTS; i++) {
            coral_profile_site_t *s = atomic_load_explicit(&t->e[i].site, memory_order_relaxed);
            if (s != NULL) entry_empty_locked(&t->e[i], s);
        }
        tally_free_locked(t);
    }
}

static void fork_child(void) {
    if (fork_locked) tallies_adopt_locked();
    fork_release();
}

/* ---- the public calls, exit and signal ------------------------------------------ */

/* FILE.PID (a profile per process, however many the command starts). */
static void path_for_process(char *out, size_t cap) {
    char digits[24];
    int n = 0;
    for (long pid = (long)getpid(); pid > 0 && n < 23; pid /= 10)
        digits[n++] = (char)('0' + pid % 10);
    size_t len = strlen(profile_path);
    if (len + 2 + (size_t)n > cap) len = cap - 2 - (size_t)n;
    memcpy(out, profile_path, len);
    out[len++] = '.';
    while (n > 0) out[len++] = digits[--n];
    out[len] = '\0';
}

/* (at_exit: from the exit handler, coral_profile_write's at_exit.) */
static void write_process_profile(bool at_exit) {
    if (profile_path[0] == '\0') return;
    char path[sizeof profile_path + 32];
    path_for_process(path, sizeof path);
    int saved = errno;
    if (coral_profile_write(path, at_exit) != 0)
        coral_message("heap profile: cannot write %s: %s", path, strerror(errno));
    errno = saved;
}

static int exact_add(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block;
    (void)block_size;
    coral_profile_exact_t *t = arg;
    t->blocks++;
    t->bytes += usable;
    return 0;
}

static void profile_at_exit(void) {
    if (coral_option(CORAL_OPT_PROFILE_LEAKS)) {
        /* Beside the estimate, the exact figure of the exiting thread's heap. */
        coral_profile_exact_t exact = {0, 0};
        bool walked = false;
        if (thread_heap != NULL) {                          /* (no bulk cache while profiling) */
            if (CORAL_SECURE) coral_heap_ring_flush(false); /* (freed blocks: not leaks) */
            walked = coral_heap_walk(thread_heap, exact_add, &exact) == 0;
        }
        coral_profile_report_leaks(walked ? &exact : NULL);
    }
    /* A process that took no sample (a shell or a short helper a command
     * starts) leaves no file at exit: a site is made by the first sample. */
    if (coral_profile_site_count() != 0) write_process_profile(true);
}

static void profile_on_signal(int sig) {
    (void)sig;
    if (in_crit)
        dump_pending = 1; /* the interrupted section ends with it */
    else
        write_process_profile(false);
}

/* Deferred frees and dump, at the end of a section (not in it). A free is
 * popped with a compare-and-swap: a handler that pushes another meanwhile
 * makes it fail, and the loop reads again. */
static CORAL_NOINLINE void run_deferred(void) {
    for (;;) {
        int n = __atomic_load_n(&npending, __ATOMIC_RELAXED);
        if (n > 0) {
            pending_t e = pending[n - 1];
            if (__atomic_compare_exchange_n(&npending, &n, n - 1, false, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                coral_profile_forget(e.page, e.p);
            continue;
        }
        if (!dump_pending) return;
        dump_pending = 0;
        write_process_profile(false);
    }
}

int coral_profile_dump(const char *path) {
    if (!coral_profile_on) {
        errno = ENOTSUP;
        return -1;
    }
    if (path == NULL || path[0] == '\0') {
        errno = EINVAL;
        return -1;
    }
    /* From a signal handler that interrupted its own thread inside the
     * profiler's section: the dump could neither take that thread's tally
     * nor wait for it (it would wait for itself), so it would write a
     * profile without that thread's samples. Refused instead. */
    if (in_crit) {
        errno = EBUSY;
        return -1;
    }
    return coral_profile_write(path, false);
}

/* Profiling turned on (coral_profile_init): kept out of line, so that the
 * start-up of a process that does not profile runs only the check below
 * (its code stays in the library's first window, cmake/hot-text.ld). */
static CORAL_NOINLINE void profile_start(const char *path, bool leaks) {
    if (path != NULL) {
        if (strlen(path) >= sizeof profile_path - 32) {
            coral_message("error: CORALLOC_PROFILE is too long (at most %zu bytes): no profile",
                          sizeof profile_path - 32);
            if (!leaks) return;
        } else {
            memcpy(profile_path, path, strlen(path) + 1);
        }
    }
    profile_rate = coral_option(CORAL_OPT_PROFILE_RATE);
    coral_profile_on = true;
    /* (With profiling on the bulk calls go block by block: no bulk cache is
     * made, and the hook is ours alone.) */
    coral_thread_exit_hook_set(profile_thread_exit);
    coral_fork_inner_hooks_set(fork_prepare, fork_release, fork_child);
    atexit(profile_at_exit);
    int sig = (int)coral_option(CORAL_OPT_PROFILE_SIGNAL);
    if (sig != 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = profile_on_signal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(sig, &sa, NULL) != 0)
            coral_message("error: CORALLOC_PROFILE_SIGNAL=%d: not a signal a handler can take",
                          sig);
    }
}

void coral_profile_init(void) {
    const char *path = coral_env("CORALLOC_PROFILE");
    bool leaks = coral_option(CORAL_OPT_PROFILE_LEAKS) != 0;
    if ((path == NULL || path[0] == '\0') && !leaks) return;
    profile_start(path, leaks);
}
