/* The bulk cache: making, flushing and giving back a thread's stash, and
 * the purger's look at idle ones. stash.h has what a stash is and the
 * protocol of who may touch it when. */
#include <sched.h>
#include <string.h>

#include "internal.h"
#include "options.h"
#include "stash.h"
#include "stats.h"

/* Set by the purger when it will look at the stashes again (a stash held
 * blocks at its last look); cleared before each look. A bulk call that
 * leaves blocks in its stash while it is clear wakes the purger: without
 * this, a thread that goes idle with a full stash would keep it for good.
 * Dekker-style, with seq_cst stores and loads (one total order, which
 * TSan models; it rejects fences): the purger clears it, then reads each
 * stash's bytes; a bulk call stores its bytes, then reads this, so one of
 * the two sees the other. */
static _Atomic(int) stash_watched;

static uintptr_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (uintptr_t)(x ^ (x >> 31));
}

/* The stashed bytes changed by delta: the statistics' gauge, and the purge
 * backlog (stashed bytes count as waiting to be purged: enough of them
 * start the purge thread, which flushes the cache of a thread gone idle). */
static void stash_bytes_changed(int64_t delta) {
    if (delta == 0) return;
    coral_stat_gauge(&coral_gstats.bulk_cached, &coral_gstats.bulk_cached_peak, delta);
    coral_purge_backlog_add(delta);
}

static coral_stash_t *stash_create(void) {
    coral_stash_t *s = coral_os_map(CORAL_STASH_MAP_SIZE); /* zeroed: every list empty */
    if (s == NULL) return NULL;
    s->key = mix64((uint64_t)(uintptr_t)s ^ __builtin_ia32_rdtsc()) | ((uintptr_t)1 << 63);
    return s;
}

/* ---- chunks (holder of busy) ------------------------------------------------------ */

/* A new empty top chunk for class cls (the old top is full, or none). */
coral_stash_chunk_t *coral_stash_chunk_new(coral_stash_t *s, unsigned cls) {
    coral_stash_chunk_t *c = s->spare;
    if (c != NULL) s->spare = c->next;
    else if (s->carved < CORAL_STASH_CHUNKS) c = &coral_stash_chunks(s)[s->carved++];
    else return NULL;
    c->count = 0;
    c->next = s->top[cls];
    s->top[cls] = c;
    return c;
}

/* Class cls's top chunk is empty: back to the spare list. */
void coral_stash_chunk_done(coral_stash_t *s, unsigned cls) {
    coral_stash_chunk_t *c = s->top[cls];
    s->top[cls] = c->next;
    c->next = s->spare;
    s->spare = c;
}

void coral_stash_bad_block(const void *p, bool at_free) {
    if (at_free)
        coral_fatal("double free detected: coral_free_bulk was given %p, which it had been given "
                    "before (the block is in the thread's bulk cache)", p);
    coral_fatal("double free or write after free detected: block %p in coral_free_bulk's cache "
                "was freed again (free()) or written since", p);
}

size_t coral_stash_take(coral_stash_t *s, unsigned cls, void **out, size_t want) {
    size_t got = 0;
    coral_stash_chunk_t *c;
    while (got < want && (c = s->top[cls]) != NULL) {
        /* The chunk's last blocks, in the order they went in. */
        size_t count = c->count, from = count > want - got ? count - (want - got) : 0;
        uintptr_t key = s->key; /* (once: the stores below might alias it) */
        for (size_t i = from; i < count; i++) {
            void *p = c->blocks[i];
            coral_stash_check(key, p);
            *(uintptr_t *)p = 0;
            out[got++] = p;
        }
        c->count = from;
        if (from == 0) coral_stash_chunk_done(s, cls);
    }
    return got;
}

/* ---- the owner's calls ------------------------------------------------------------------ */

coral_stash_t *coral_stash_for_free(coral_heap_t *heap, int64_t *room) {
    if (!heap->is_default) return NULL; /* the thread is not set up (the empty heap) */
    int64_t limit = coral_option(CORAL_OPT_BULK_CACHE_KB) * 1024;
    coral_stash_t *s = atomic_load_explicit(&heap->stash, memory_order_relaxed);
    if (limit == 0) {
        /* Switched off at run time: what it holds goes back now. */
        if (s != NULL) coral_stash_flush_own(heap);
        return NULL;
    }
    if (s == NULL) {
        if ((s = stash_create()) == NULL) return NULL;
        atomic_store_explicit(&heap->stash, s, memory_order_release);
    }
    if (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) return NULL;
    *room = limit - atomic_load_explicit(&s->bytes, memory_order_relaxed);
    return s;
}

/* The holder of busy changed the stashed bytes by delta; returns them. */
static int64_t stash_add_bytes(coral_stash_t *s, int64_t delta) {
    int64_t bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed) + delta;
    atomic_store_explicit(&s->bytes, bytes, memory_order_seq_cst); /* (stash_watched) */
    stash_bytes_changed(delta);
    return bytes;
}

void coral_stash_release_overflowed(coral_stash_t *s, int64_t delta) {
    stash_add_bytes(s, delta);
    coral_stash_flush(s);
    memset(s->want, 0, sizeof s->want);
    coral_stash_release(s, 0);
}

void coral_stash_release(coral_stash_t *s, int64_t delta) {
    int64_t bytes = stash_add_bytes(s, delta);
    atomic_store_explicit(&s->uses, atomic_load_explicit(&s->uses, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&s->busy, 0, memory_order_release);
    if (bytes == 0) return;
    if (!atomic_load_explicit(&stash_watched, memory_order_seq_cst)) coral_purger_notify();
}

void coral_stash_flush(coral_stash_t *s) {
    int64_t bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
    if (bytes == 0) return;
    for (unsigned cls = 1; cls < CORAL_CLASS_COUNT; cls++) {
        coral_stash_chunk_t *c;
        while ((c = s->top[cls]) != NULL) {
            for (size_t i = 0; i < c->count; i++) coral_stash_check(s->key, c->blocks[i]);
            coral_bulk_free_unstashed(c->blocks, c->count);
            c->count = 0;
            coral_stash_chunk_done(s, cls);
        }
    }
    stash_add_bytes(s, -bytes);
}

void coral_stash_flush_own(coral_heap_t *heap) {
    coral_stash_t *s = atomic_load_explicit(&heap->stash, memory_order_relaxed);
    if (s == NULL || atomic_load_explicit(&s->bytes, memory_order_relaxed) == 0) return;
    if (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) return; /* the purger has it */
    coral_stash_flush(s);
    atomic_store_explicit(&s->busy, 0, memory_order_release);
}

coral_stash_t *coral_stash_thread_exit(coral_heap_t *heap) {
    coral_stash_t *s = atomic_load_explicit(&heap->stash, memory_order_relaxed);
    if (s == NULL) return NULL;
    /* The purger holds it only while it flushes. */
    while (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) sched_yield();
    coral_stash_flush(s);
    return s;
}

void coral_stash_unmap(coral_stash_t *s) {
    if (s != NULL) coral_os_unmap(s, CORAL_STASH_MAP_SIZE);
}

/* ---- the purger ---------------------------------------------------------------------------- */

#define TAKE_MAX 16

typedef struct stash_look_s {
    uint64_t now, delay, next;
    bool force;
    size_t taken;
    coral_stash_t *take[TAKE_MAX];
} stash_look_t;

static void look_due(stash_look_t *look, uint64_t due) {
    if (look->next == 0 || due < look->next) look->next = due;
}

/* Under the heap registry lock (the heap is live, and so is its stash). */
static void stash_look(coral_heap_t *heap, void *arg) {
    stash_look_t *look = arg;
    coral_stash_t *s = atomic_load_explicit(&heap->stash, memory_order_acquire);
    if (s == NULL || atomic_load_explicit(&s->bytes, memory_order_seq_cst) == 0) return;
    uint64_t uses = atomic_load_explicit(&s->uses, memory_order_relaxed);
    if (uses != s->seen_uses || s->seen_ms == 0) {
        s->seen_uses = uses;
        s->seen_ms = look->now;
    }
    uint64_t due = s->seen_ms + look->delay;
    int free_now = 0;
    if (!look->force && due > look->now) look_due(look, due);
    else if (look->taken == TAKE_MAX) look_due(look, look->now + 1);
    else if (atomic_compare_exchange_strong_explicit(&s->busy, &free_now, 1, memory_order_acquire,
                                                     memory_order_relaxed))
        look->take[look->taken++] = s;
    else look_due(look, look->now + look->delay); /* in use right now */
}

uint64_t coral_stashes_flush_due(uint64_t now, bool force) {
    stash_look_t look = {.now = now,
                         .delay = (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS),
                         .force = force};
    atomic_store_explicit(&stash_watched, 0, memory_order_seq_cst);
    coral_heaps_visit(stash_look, &look);
    if (look.next != 0) atomic_store_explicit(&stash_watched, 1, memory_order_seq_cst);
    /* Outside the registry lock: flushing frees blocks, which may release
     * pages and segments. */
    for (size_t i = 0; i < look.taken; i++) {
        coral_stash_flush(look.take[i]);
        atomic_store_explicit(&look.take[i]->busy, 0, memory_order_release);
    }
    return look.next;
}
