/* The bulk cache: making, flushing and giving back a thread's cache, and
 * the purger's look at idle ones. bulk_cache.h has what a cache is and the
 * protocol of who may touch it when. */
#include <sched.h>
#include <string.h>

#include "api/bulk_cache.h"
#include "api/remote_run.h"

__thread coral_bulk_cache_t *coral_bulk_cache_tls __attribute__((tls_model("initial-exec")));

/* Every thread's cache, for the purger (through cache->registry_link). */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_list_t registry;

static uint64_t caches_flush_due(uint64_t now, bool force);
static void cache_thread_exit(void);

/* Held by the purger from the moment it takes caches (their busy flag) until
 * it has flushed them and given them back. A fork takes it first of all
 * (coral_fork_hooks_set: before the lower layers' locks, which a flush
 * takes), so the child never finds a cache taken by a purger it does not
 * have: such a cache's busy flag would stay set, its blocks never flushed,
 * and its thread would wait for it forever at exit. */
static pthread_mutex_t flush_lock = PTHREAD_MUTEX_INITIALIZER;

static void fork_prepare(void) {
    coral_mutex_lock(&flush_lock);
    coral_mutex_lock(&registry_lock);
}

/* The parent and the child both unlock them (the child's thread took
 * them), as the heap layer's locks: to TSan a lock made anew stays held by
 * the thread (window_fork_nested_child_forks under TSan: the child of a
 * nested fork, back in the fork its signal interrupted, found flush_lock
 * "held" at its next flush). */
static void fork_release(void) {
    coral_mutex_unlock(&registry_lock);
    coral_mutex_unlock(&flush_lock);
}

/* Set by the purger when it will look at the caches again (a cache held
 * blocks at its last look); cleared before each look. A bulk call that
 * leaves blocks in its cache while it is clear wakes the purger: without
 * this, a thread that goes idle with a full cache would keep it for good.
 * Dekker-style, with seq_cst stores and loads (one total order, which
 * TSan models; it rejects fences): the purger clears it, then reads each
 * cache's bytes; a bulk call stores its bytes, then reads this, so one of
 * the two sees the other. */
static _Atomic(int) cache_watched;

static uintptr_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (uintptr_t)(x ^ (x >> 31));
}

/* The cached bytes changed by delta: the statistics' gauge, and the purge
 * backlog (cached bytes count as waiting to be purged: enough of them
 * start the purge thread, which flushes the cache of a thread gone idle). */
static void cache_bytes_changed(int64_t delta) {
    if (delta == 0) return;
    coral_count_gauge(&coral_counters.bulk_cached, &coral_counters.bulk_cached_peak, delta);
    coral_purge_backlog_add(delta);
}

/* The purge stage, the thread-exit hook and the fork hooks, once, when the
 * library is loaded: before any thread can make a cache, so that a fork's
 * prepare handler takes the caches' locks whether a cache exists yet or
 * not. Set by the first cache instead, they were missing from a fork whose
 * prepare handler looked before it was made, and the fork could be made
 * while that cache's thread held the registry lock: the child's first bulk
 * call waited for it forever (window_fork_hooks_set); a child forked
 * between the first of the three sets and the last never got the rest.
 * (The first cache sets them if no constructor ran yet.) The profiler's
 * thread-exit hook, set at the first allocation (which may come first: a
 * library loaded before a preloaded coralloc allocates in its own
 * constructor), stays: with profiling on, no cache is made. */
static void cache_hooks_set(void) {
    static _Atomic(bool) set;
    if (atomic_exchange_explicit(&set, true, memory_order_relaxed)) return;
    coral_purge_stage_set(CORAL_PURGE_BLOCK_CACHES, caches_flush_due);
    coral_thread_exit_hook_set_if_none(cache_thread_exit);
    coral_fork_hooks_set(fork_prepare, fork_release, fork_release);
}

__attribute__((constructor)) static void cache_hooks_at_load(void) { cache_hooks_set(); }

/* A thread's cache. */
static coral_bulk_cache_t *cache_create(void) {
    coral_bulk_cache_t *s = coral_os_map(CORAL_BULK_CACHE_MAP_SIZE); /* zeroed: every list empty */
    if (s == NULL) return NULL;
    s->key = mix64((uint64_t)(uintptr_t)s ^ coral_clock_ms() ^ (uint64_t)coral_thread_id()) |
             ((uintptr_t)1 << 63);
    cache_hooks_set();
    if (!coral_mutex_trylock(&registry_lock)) {
        coral_test_point(CORAL_TP_BULK_REGISTRY_WAIT, s);
        coral_mutex_lock(&registry_lock);
    }
    coral_test_point(CORAL_TP_BULK_CACHE_LISTING, s);
    coral_list_push_back(&registry, &s->registry_link);
    coral_mutex_unlock(&registry_lock);
    return s;
}

/* ---- chunks (holder of busy) ------------------------------------------------------ */

/* A new empty top chunk for class cls (the old top is full, or none). */
coral_cache_chunk_t *coral_bulk_cache_chunk_new(coral_bulk_cache_t *s, unsigned cls) {
    coral_cache_chunk_t *c = s->spare;
    if (c != NULL)
        s->spare = c->next;
    else if (s->carved < CORAL_BULK_CACHE_CHUNKS)
        c = &coral_bulk_cache_chunks(s)[s->carved++];
    else
        return NULL;
    c->count = 0;
    c->next = s->top[cls];
    s->top[cls] = c;
    return c;
}

/* Class cls's top chunk is empty: back to the spare list. */
void coral_bulk_cache_chunk_done(coral_bulk_cache_t *s, unsigned cls) {
    coral_cache_chunk_t *c = s->top[cls];
    s->top[cls] = c->next;
    c->next = s->spare;
    s->spare = c;
}

void coral_bulk_cache_bad_block(const void *p, bool at_free) {
    if (at_free)
        coral_fatal("double free detected: coral_free_bulk was given %p, which it had been given "
                    "before (the block is in the thread's bulk cache)",
                    p);
    coral_fatal("double free or write after free detected: block %p in coral_free_bulk's cache "
                "was freed again (free()) or written since",
                p);
}

size_t coral_bulk_cache_take(coral_bulk_cache_t *s, unsigned cls, void **out, size_t want) {
    size_t got = 0;
    coral_cache_chunk_t *c;
    while (got < want && (c = s->top[cls]) != NULL) {
        /* The chunk's last blocks, in the order they went in. */
        size_t count = c->count, from = count > want - got ? count - (want - got) : 0;
        uintptr_t key = s->key; /* (once: the stores below might alias it) */
        for (size_t i = from; i < count; i++) {
            void *p = c->blocks[i];
            coral_bulk_cache_check(key, p);
            *(uintptr_t *)p = 0;
            out[got++] = p;
        }
        c->count = from;
        if (from == 0) coral_bulk_cache_chunk_done(s, cls);
    }
    return got;
}

/* ---- the owner's calls ------------------------------------------------------------------ */

coral_bulk_cache_t *coral_bulk_cache_for_free(int64_t *room) {
    /* A thread not set up has no exit hook to flush a cache: none. */
    if (coral_tls_heap == &coral_heap_empty) return NULL;
    int64_t limit = coral_option(CORAL_OPT_BULK_CACHE_KB) * 1024;
    coral_bulk_cache_t *s = coral_bulk_cache_tls;
    if (limit == 0) {
        /* Switched off at run time: what it holds goes back now. */
        if (s != NULL) coral_bulk_cache_flush_own();
        return NULL;
    }
    if (s == NULL) {
        if ((s = cache_create()) == NULL) return NULL;
        coral_bulk_cache_tls = s;
    }
    if (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) return NULL;
    *room = limit - atomic_load_explicit(&s->bytes, memory_order_relaxed);
    return s;
}

/* The holder of busy changed the cached bytes by delta; returns them. */
static int64_t cache_add_bytes(coral_bulk_cache_t *s, int64_t delta) {
    int64_t bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed) + delta;
    atomic_store_explicit(&s->bytes, bytes, memory_order_seq_cst); /* (cache_watched) */
    cache_bytes_changed(delta);
    return bytes;
}

void coral_bulk_cache_release_overflowed(coral_bulk_cache_t *s, int64_t delta) {
    cache_add_bytes(s, delta);
    coral_bulk_cache_flush(s);
    memset(s->want, 0, sizeof s->want);
    coral_bulk_cache_release(s, 0);
}

void coral_bulk_cache_release(coral_bulk_cache_t *s, int64_t delta) {
    int64_t bytes = cache_add_bytes(s, delta);
    atomic_store_explicit(&s->uses, atomic_load_explicit(&s->uses, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&s->busy, 0, memory_order_release);
    if (bytes == 0) return;
    if (!atomic_load_explicit(&cache_watched, memory_order_seq_cst)) coral_purger_notify();
}

void coral_bulk_cache_flush(coral_bulk_cache_t *s) {
    int64_t bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
    if (bytes == 0) return;
    for (unsigned cls = 1; cls < CORAL_CLASS_COUNT; cls++) {
        coral_cache_chunk_t *c;
        while ((c = s->top[cls]) != NULL) {
            for (size_t i = 0; i < c->count; i++) coral_bulk_cache_check(s->key, c->blocks[i]);
            coral_bulk_free_uncached(c->blocks, c->count);
            c->count = 0;
            coral_bulk_cache_chunk_done(s, cls);
        }
    }
    cache_add_bytes(s, -bytes);
}

void coral_bulk_cache_flush_own(void) {
    coral_bulk_cache_t *s = coral_bulk_cache_tls;
    if (s == NULL || atomic_load_explicit(&s->bytes, memory_order_relaxed) == 0) return;
    if (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0)
        return; /* the purger has it */
    coral_bulk_cache_flush(s);
    atomic_store_explicit(&s->busy, 0, memory_order_release);
}

/* The thread-exit hook (heap layer), before the thread's heaps go. */
static void cache_thread_exit(void) {
    coral_remote_runs_flush();
    coral_bulk_cache_t *s = coral_bulk_cache_tls;
    if (s == NULL) return;
    /* The purger holds it only while it flushes. */
    while (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) sched_yield();
    coral_bulk_cache_flush(s);
    coral_mutex_lock(&registry_lock);
    coral_list_remove(&registry, &s->registry_link);
    coral_mutex_unlock(&registry_lock);
    coral_bulk_cache_tls = NULL;
    coral_os_unmap(s, CORAL_BULK_CACHE_MAP_SIZE);
}

/* ---- the purger ---------------------------------------------------------------------------- */

#define TAKE_MAX 16

typedef struct cache_look_s {
    uint64_t now, delay, next;
    bool force;
    size_t taken;
    coral_bulk_cache_t *take[TAKE_MAX];
} cache_look_t;

static void look_due(cache_look_t *look, uint64_t due) {
    if (look->next == 0 || due < look->next) look->next = due;
}

/* Under the registry lock (the cache is live). */
static void cache_look(coral_bulk_cache_t *s, cache_look_t *look) {
    if (atomic_load_explicit(&s->bytes, memory_order_seq_cst) == 0) return;
    uint64_t uses = atomic_load_explicit(&s->uses, memory_order_relaxed);
    if (uses != s->seen_uses || s->seen_ms == 0) {
        s->seen_uses = uses;
        s->seen_ms = look->now;
    }
    uint64_t due = s->seen_ms + look->delay;
    int free_now = 0;
    if (!look->force && due > look->now)
        look_due(look, due);
    else if (look->taken == TAKE_MAX)
        look_due(look, look->now + 1);
    else if (atomic_compare_exchange_strong_explicit(&s->busy, &free_now, 1, memory_order_acquire,
                                                     memory_order_relaxed))
        look->take[look->taken++] = s;
    else
        look_due(look, look->now + look->delay); /* in use right now */
}

/* The purge stage: flush caches unused for the purge delay (all with
 * force); returns when the next may be due (0: none holds blocks). */
static uint64_t caches_flush_due(uint64_t now, bool force) {
    cache_look_t look = {
        .now = now, .delay = (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS), .force = force};
    /* A flush in progress elsewhere, or in this very thread (a flush frees
     * blocks, which may start the purge thread, whose creation allocates,
     * and that allocation's slow path may run a pass): look again soon. */
    if (!coral_mutex_trylock(&flush_lock)) return now + 1;
    atomic_store_explicit(&cache_watched, 0, memory_order_seq_cst);
    coral_mutex_lock(&registry_lock);
    for (coral_link_t *l = registry.first; l != NULL; l = l->next)
        cache_look(coral_container_of(l, coral_bulk_cache_t, registry_link), &look);
    coral_mutex_unlock(&registry_lock);
    if (look.next != 0) atomic_store_explicit(&cache_watched, 1, memory_order_seq_cst);
    /* Outside the registry lock: flushing frees blocks, which may release
     * pages and segments. */
    if (look.taken != 0) coral_test_point(CORAL_TP_CACHE_FLUSHING, look.take[0]);
    for (size_t i = 0; i < look.taken; i++) {
        coral_bulk_cache_flush(look.take[i]);
        atomic_store_explicit(&look.take[i]->busy, 0, memory_order_release);
    }
    coral_mutex_unlock(&flush_lock);
    return look.next;
}
