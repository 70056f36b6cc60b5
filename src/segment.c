/* Segments: 4 MiB-aligned regions from the chunk pool (pool.c), cut into
 * 64 KiB slices.
 *
 * A thread owns the segments it allocates pages from (segment->thread_id,
 * tld->segments). Spans of slices become pages; a segment whose last page is
 * freed goes back to the pool, where it is purged (its pages given back to
 * the OS) after the purge delay unless some segment, normal or huge, reuses
 * it first. A thread that exits abandons its segments that still hold live
 * blocks; any thread that needs a page adopts them (their live blocks stay
 * valid, their free ones are reused). The global lists (abandoned, registry)
 * each have a mutex, taken only on these segment-level events, never per
 * block.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "options.h"
#include "stats.h"

uint8_t coral_segment_map[CORAL_MAP_CHUNKS];

typedef struct segment_list_s {
    pthread_mutex_t lock;
    coral_segment_t *first, *last;
    _Atomic(size_t) count; /* changed under lock; read without it as a hint */
} segment_list_t;

static segment_list_t segment_abandoned = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, 0};

/* ---- the segment map ------------------------------------------------------ */

void coral_segment_map_set(void *start, size_t size, bool present) {
    size_t first = (uintptr_t)start >> CORAL_SEGMENT_SHIFT;
    size_t chunks = (size + CORAL_SEGMENT_SIZE - 1) >> CORAL_SEGMENT_SHIFT;
    for (size_t i = 0; i < chunks && first + i < CORAL_MAP_CHUNKS; i++) {
        uint8_t kind = !present ? CORAL_MAP_NONE : i == 0 ? CORAL_MAP_SEGMENT : CORAL_MAP_HUGE_TAIL;
        __atomic_store_n(&coral_segment_map[first + i], kind, __ATOMIC_RELEASE);
    }
}

/* The segment holding p, also for pointers deep inside a huge block; NULL
 * when coralloc does not manage p. */
coral_segment_t *coral_segment_of_any(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint8_t kind = coral_map_kind(a);
    while (kind == CORAL_MAP_HUGE_TAIL) {
        a -= CORAL_SEGMENT_SIZE;
        kind = coral_map_kind(a);
    }
    if (kind != CORAL_MAP_SEGMENT) return NULL;
    /* A huge segment's last chunk may be only partly its own: the rest of
     * that 4 MiB can be anybody's mapping. */
    coral_segment_t *seg = coral_ptr_segment((void *)a);
    return (uintptr_t)p - (uintptr_t)seg < seg->size ? seg : NULL;
}

/* ---- intrusive segment lists ---------------------------------------------- */

static void list_push_front(coral_segment_t **first, coral_segment_t **last, coral_segment_t *s) {
    s->prev = NULL;
    s->next = *first;
    if (*first) (*first)->prev = s;
    else if (last) *last = s;
    *first = s;
}

static void list_remove(coral_segment_t **first, coral_segment_t **last, coral_segment_t *s) {
    if (s->prev) s->prev->next = s->next;
    else *first = s->next;
    if (s->next) s->next->prev = s->prev;
    else if (last) *last = s->prev;
    s->next = s->prev = NULL;
}

/* ---- the registry: every mapped normal segment, for the purger ------------------ */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_segment_t *registry;

void coral_segment_registry_add(coral_segment_t *seg) {
    pthread_mutex_lock(&registry_lock);
    seg->all_prev = NULL;
    seg->all_next = registry;
    if (registry) registry->all_prev = seg;
    registry = seg;
    pthread_mutex_unlock(&registry_lock);
}

void coral_segment_registry_remove(coral_segment_t *seg) {
    pthread_mutex_lock(&registry_lock);
    if (seg->all_prev) seg->all_prev->all_next = seg->all_next;
    else registry = seg->all_next;
    if (seg->all_next) seg->all_next->all_prev = seg->all_prev;
    pthread_mutex_unlock(&registry_lock);
}

/* ---- purging free slices ------------------------------------------------------------ */

/* Free slices that may hold data count in the purge backlog (purge.c). */
static void backlog_add_slices(uint64_t slices, int sign) {
    coral_purge_backlog_add(sign * (int64_t)__builtin_popcountll(slices) * (int64_t)CORAL_SLICE_SIZE);
}

static bool span_trylock(coral_segment_t *seg) {
    return atomic_exchange_explicit(&seg->span_lock, 1, memory_order_acquire) == 0;
}

static void span_unlock(coral_segment_t *seg) {
    atomic_store_explicit(&seg->span_lock, 0, memory_order_release);
}

/* Owner: slices were freed; they may be purged after the purge delay. */
void coral_segment_mark_purgeable(coral_segment_t *seg) {
    if (atomic_load_explicit(&seg->purge_due_ms, memory_order_relaxed) != 0) return;
    uint64_t due = coral_clock_ms() + (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS);
    atomic_store_explicit(&seg->purge_due_ms, due, memory_order_relaxed);
    coral_purger_notify();
}

/* Give the free, dirty slices of seg back to the OS (madvise, in runs). */
static void segment_purge_free(coral_segment_t *seg) {
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    uint64_t purge = dirty & ~used & ~(uint64_t)1;
    uint64_t left = purge;
    while (left) {
        unsigned first = (unsigned)__builtin_ctzll(left);
        uint64_t run = left >> first;
        unsigned n = run == ~(uint64_t)0 ? 64 - first : (unsigned)__builtin_ctzll(~run);
        coral_os_purge(coral_segment_base(seg) + (size_t)first * CORAL_SLICE_SIZE,
                       (size_t)n * CORAL_SLICE_SIZE);
        left &= ~(n >= 64 ? ~(uint64_t)0 : ((((uint64_t)1 << n) - 1) << first));
    }
    atomic_store_explicit(&seg->dirty_slices, dirty & ~purge, memory_order_relaxed);
    backlog_add_slices(purge, -1);
}

/* Purge every registered segment whose purge is due (all that have free
 * dirty slices, when force). Returns the earliest time a purge is still
 * pending, or 0 if none. Any thread may call it. */
uint64_t coral_segments_purge_due(uint64_t now, bool force) {
    uint64_t next = 0;
    pthread_mutex_lock(&registry_lock);
    for (coral_segment_t *seg = registry; seg != NULL; seg = seg->all_next) {
        uint64_t due = atomic_load_explicit(&seg->purge_due_ms, memory_order_relaxed);
        if (due == 0) continue;
        if ((force || due <= now) && span_trylock(seg)) {
            /* Cleared before reading used_slices: a page freed from here on
             * marks the segment again. */
            atomic_store_explicit(&seg->purge_due_ms, 0, memory_order_relaxed);
            segment_purge_free(seg);
            span_unlock(seg);
            continue;
        }
        if (due <= now) due = now + 1; /* busy: try again soon */
        if (next == 0 || due < next) next = due;
    }
    pthread_mutex_unlock(&registry_lock);
    return next;
}

/* ---- acquiring and releasing segments ------------------------------------- */

static uint64_t slice_mask(size_t first, size_t n);

/* The header fields of a segment taken from the pool, before the caller
 * sets its kind and size (the descriptors are the caller's business). */
void coral_segment_header_reset(coral_segment_t *seg) {
    atomic_store_explicit(&seg->thread_id, 0, memory_order_relaxed);
    seg->kind = 0;
    seg->used_pages = 0;
    seg->size = 0;
    atomic_store_explicit(&seg->used_slices, 0, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, 0, memory_order_relaxed);
    atomic_store_explicit(&seg->span_lock, 0, memory_order_relaxed);
    atomic_store_explicit(&seg->purge_due_ms, 0, memory_order_relaxed);
    seg->tld = NULL;
    seg->next = seg->prev = NULL;
    seg->all_next = seg->all_prev = NULL;
    seg->huge_dirty = 0;
}

/* CORALLOC_HUGE_PAGES advises huge pages from the segment that makes the
 * process hold more than 16 MiB of segments (see segment_map_new). */
#define HUGE_PAGES_FROM_SEGMENTS 4

/* A segment from the pool: its header is set up, its slices known dirty
 * where the pool says they may hold data. */
static coral_segment_t *segment_map_new(void) {
    coral_pool_got_t got;
    coral_segment_t *seg = coral_pool_take(CORAL_SEGMENT_SIZE, &got);
    if (seg == NULL) return NULL;
    _Static_assert(sizeof(coral_segment_t) <= CORAL_SLICE_SIZE, "segment header fits slice 0");
    /* A fresh one reads as zero; a freed segment's descriptors are all free
     * (pages[0], never a page here, may describe a huge block: cleared). */
    if (got.dirty != 0 && !got.header) memset(seg->pages, 0, sizeof seg->pages);
    else if (got.dirty != 0) memset(&seg->pages[0], 0, sizeof seg->pages[0]);
    coral_segment_header_reset(seg);
    /* kind and size never change while the segment is mapped: other
     * threads read them without synchronisation. */
    seg->kind = CORAL_SEGMENT_NORMAL;
    seg->size = CORAL_SEGMENT_SIZE;
    size_t dirty = (got.dirty + CORAL_SLICE_SIZE - 1) / CORAL_SLICE_SIZE;
    atomic_store_explicit(&seg->used_slices, 1, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, 1 | slice_mask(0, dirty), /* the header too */
                          memory_order_relaxed);
    backlog_add_slices(slice_mask(0, dirty) & ~(uint64_t)1, +1); /* the pool no longer counts them */
    coral_segment_registry_add(seg);
    coral_segment_map_set(seg, CORAL_SEGMENT_SIZE, true);
    if (got.fresh) {
        /* Huge pages first: a populate afterwards then faults in 2 MiB pages.
         * Only once the process has this many segments: a small program
         * keeps its 4 KiB pages, whose RSS a 2 MiB page would multiply. */
        if (coral_option(CORAL_OPT_HUGE_PAGES) &&
            atomic_load_explicit(&coral_gstats.segments, memory_order_relaxed) >=
                HUGE_PAGES_FROM_SEGMENTS)
            coral_os_advise_hugepage(seg, CORAL_SEGMENT_SIZE);
        if (coral_option(CORAL_OPT_POPULATE) == CORAL_POPULATE_ON)
            coral_os_populate(coral_segment_base(seg) + CORAL_SLICE_SIZE,
                              CORAL_SEGMENT_SIZE - CORAL_SLICE_SIZE);
    }
    coral_stat_gauge(&coral_gstats.segments, &coral_gstats.segments_peak, 1);
    return seg;
}

/* An empty segment leaves its owner (and the purger's registry) for the
 * pool, which knows how far its slices may hold data. */
static void segment_to_pool(coral_segment_t *seg) {
    atomic_store_explicit(&seg->thread_id, 0, memory_order_release);
    seg->tld = NULL;
    coral_segment_registry_remove(seg); /* waits out a purge of it in progress */
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    size_t dirty_end = (size_t)(64 - __builtin_clzll(dirty | 1)) * CORAL_SLICE_SIZE;
    backlog_add_slices(dirty & ~(uint64_t)1, -1); /* the pool counts them now */
    coral_stat_count(&coral_gstats.segments, -1);
    coral_pool_put(seg, CORAL_SEGMENT_SIZE, dirty_end, true);
}

static void segment_own(coral_segment_t *seg, coral_tld_t *tld) {
    seg->tld = tld;
    atomic_store_explicit(&seg->thread_id, tld->thread_id, memory_order_release);
    list_push_front(&tld->segments, NULL, seg);
}

/* An empty segment for tld. */
static coral_segment_t *segment_acquire_empty(coral_tld_t *tld) {
    coral_segment_t *seg = segment_map_new();
    if (seg == NULL) return NULL;
    seg->used_pages = 0; /* used_slices is 1: the header only */
    segment_own(seg, tld);
    return seg;
}

/* The segment has no page in use any more: off to the pool. */
static void segment_release(coral_segment_t *seg) {
    if (seg->tld->small_segment == seg) seg->tld->small_segment = NULL;
    list_remove(&seg->tld->segments, NULL, seg);
    segment_to_pool(seg);
}

/* ---- spans of slices --------------------------------------------------------- */

/* Lowest index of n consecutive free slices, or -1. Bits past 63 count as
 * used, since the shifts bring in zeros. */
static int find_free_run(uint64_t used, size_t n) {
    uint64_t free = ~used, run = free;
    for (size_t i = 1; i < n && run; i++) run &= free >> i;
    return run ? __builtin_ctzll(run) : -1;
}

static uint64_t slice_mask(size_t first, size_t n) {
    return (n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << first;
}

/* Slice i (>= 1) of a span: leads back to the head; its INTERIOR flag sends
 * the free fast path (which reads the slice's own descriptor) elsewhere. */
void coral_slice_mark_interior(coral_page_t *slice, size_t i) {
    slice->slice_offset = (uint32_t)(i * sizeof(coral_page_t));
    __atomic_store_n(&slice->flags, CORAL_PAGE_INTERIOR, __ATOMIC_RELAXED);
}

/* Take slices [first, first+n) as a span. Caller holds seg's span_lock. */
static coral_page_t *segment_take_span(coral_segment_t *seg, size_t first, size_t n) {
    uint64_t mask = slice_mask(first, n);
    coral_page_t *page = &seg->pages[first];
    for (size_t i = 1; i < n; i++) coral_slice_mark_interior(&seg->pages[first + i], i);
    page->slice_offset = 0;
    page->slice_count = (uint32_t)n;
    page->start = coral_segment_base(seg) + first * CORAL_SLICE_SIZE;
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    page->is_fresh = (dirty & mask) == 0;
    backlog_add_slices(dirty & mask, -1);
    atomic_store_explicit(&seg->used_slices, used | mask, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, dirty | mask, memory_order_relaxed);
    seg->used_pages++;
    coral_stat_gauge(&coral_gstats.span_bytes, &coral_gstats.span_bytes_peak,
                     (int64_t)(n * CORAL_SLICE_SIZE));
    return page;
}

/* A run of n free slices in seg, taken; NULL if none (or the purger is at
 * work on seg right now: then the caller looks elsewhere, never waits). */
static coral_page_t *segment_try_span(coral_segment_t *seg, size_t n) {
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    int first = find_free_run(used, n);
    if (first <= 0 || !span_trylock(seg)) return NULL;
    coral_page_t *page = segment_take_span(seg, (size_t)first, n);
    span_unlock(seg);
    return page;
}

static coral_page_t *segments_find_span(coral_tld_t *tld, size_t n) {
    for (coral_segment_t *seg = tld->segments; seg != NULL; seg = seg->next) {
        coral_page_t *page = segment_try_span(seg, n);
        if (page) return page;
    }
    return NULL;
}

static bool segment_adopt_one(coral_heap_t *heap);
static coral_page_t *segment_page_alloc_any(coral_heap_t *heap, size_t n);

/* A span of n slices (1..63) for a new page of `heap`. The caller fills in
 * the page. NULL with errno ENOMEM when the OS has no memory.
 *
 * One-slice pages (blocks up to 8 KiB) go first to the segment of the last
 * one, else to the newest segment with room, like every other span. So
 * small blocks gather in few segments and do not pin one that large blocks
 * use: a 288-byte block glibc allocates for a new thread, put in the
 * newest segment, kept it (and 3.8 MiB of freed, resident slices that no
 * huge block could reuse) from going back to the pool (large-window: about
 * 950 more faults in a run of 51,000). */
coral_page_t *coral_segment_page_alloc(coral_heap_t *heap, size_t n) {
    coral_tld_t *tld = heap->tld;
    coral_page_t *page = NULL;
    if (n == 1 && tld->small_segment != NULL) page = segment_try_span(tld->small_segment, n);
    if (page == NULL) page = segment_page_alloc_any(heap, n);
    if (page != NULL && n == 1) tld->small_segment = coral_ptr_segment(page);
    return page;
}

/* A span of n slices in any segment of the thread, else in an adopted or
 * a new one. */
static coral_page_t *segment_page_alloc_any(coral_heap_t *heap, size_t n) {
    coral_tld_t *tld = heap->tld;
    coral_page_t *page = segments_find_span(tld, n);
    if (page) return page;
    /* Abandoned segments first: they may hold free space and their live
     * blocks need an owner anyway. A few at most per call. Their pages join
     * the thread's own heap, never a user heap: coral_heap_destroy frees a
     * user heap's pages, and the adopted blocks are someone else's. */
    for (int tries = 0; tries < 4 && segment_adopt_one(tld->heap_default); tries++) {
        page = segments_find_span(tld, n);
        if (page) return page;
    }
    coral_segment_t *seg = segment_acquire_empty(tld);
    if (seg == NULL) return NULL;
    /* The purger may already see the new segment (it is registered), but
     * finds nothing to purge in it: the lock is free or soon free. */
    while (!span_trylock(seg)) __builtin_ia32_pause();
    page = segment_take_span(seg, 1, n);
    span_unlock(seg);
    return page;
}

/* Return a page's slices to its segment (owner thread only). */
void coral_segment_page_free(coral_page_t *page) {
    /* A page freed with blocks on its thread_free (coral_heap_destroy) may be
     * an orphan, or being purged by the purger: neither may outlive it. */
    coral_orphan_forget(page);
    coral_page_wait_not_busy(page);
    /* A large block placed on clean memory: how much of it the program
     * wrote tells the adaptive populate policy about big blocks. */
    if (page->class_idx == CORAL_CLASS_LARGE && page->is_fresh && coral_populate_adaptive())
        coral_populate_note_big_block(page->start, page->block_size);
    coral_segment_t *seg = coral_ptr_segment(page);
    size_t first = (size_t)(page - seg->pages);
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    atomic_store_explicit(&seg->used_slices, used & ~slice_mask(first, page->slice_count),
                          memory_order_relaxed);
    coral_stat_count(&coral_gstats.span_bytes, -(int64_t)(page->slice_count * CORAL_SLICE_SIZE));
    backlog_add_slices(slice_mask(first, page->slice_count), +1);
    page->slice_count = 0;
    page->block_size = 0;
    /* Marked before the release: after it the segment may be someone else's. */
    coral_segment_mark_purgeable(seg);
    if (--seg->used_pages == 0) segment_release(seg);
}

/* ---- abandonment and adoption --------------------------------------------------
 * Protocol: the exiting owner has already taken its pages out of its heaps
 * (every page's delay state is NEVER and page->heap is NULL, see heap.c). It
 * clears segment->thread_id with a release store, then publishes the segment
 * on the abandoned list under its lock. From then on other threads' frees
 * push onto the pages' thread_free lists only. An adopter pops the segment
 * under the same lock (which orders it after the owner's last writes), sets
 * tld and thread_id, and hands each live page to its heap, which collects the
 * remote frees. */

void coral_segments_abandon(coral_tld_t *tld) {
    tld->small_segment = NULL;
    coral_segment_t *seg = tld->segments;
    while (seg != NULL) {
        coral_segment_t *next = seg->next;
        list_remove(&tld->segments, NULL, seg);
        if (seg->used_pages == 0) {
            segment_to_pool(seg);
        } else {
            seg->tld = NULL;
            atomic_store_explicit(&seg->thread_id, 0, memory_order_release);
            pthread_mutex_lock(&segment_abandoned.lock);
            list_push_front(&segment_abandoned.first, &segment_abandoned.last, seg);
            atomic_fetch_add_explicit(&segment_abandoned.count, 1, memory_order_relaxed);
            pthread_mutex_unlock(&segment_abandoned.lock);
            coral_stat_count(&coral_gstats.segments_abandoned, 1);
        }
        seg = next;
    }
}

static void segment_adopt(coral_heap_t *heap, coral_segment_t *seg) {
    segment_own(seg, heap->tld);
    coral_stat_count(&coral_gstats.segments_adopted, 1);
    for (size_t i = 1; i < CORAL_SLICES_PER_SEGMENT;) {
        coral_page_t *page = &seg->pages[i];
        size_t n = page->slice_count;
        if (n == 0) {
            i++;
            continue;
        }
        bool last_page = seg->used_pages == 1;
        /* Freeing the last page releases the segment to the cache, where
         * another thread may take it at once: touch nothing of it then. */
        if (coral_heap_adopt_page(heap, page) && last_page) return;
        i += n;
    }
}

/* Adopt the oldest abandoned segment into heap's thread. */
static bool segment_adopt_one(coral_heap_t *heap) {
    if (atomic_load_explicit(&segment_abandoned.count, memory_order_relaxed) == 0) return false;
    pthread_mutex_lock(&segment_abandoned.lock);
    coral_segment_t *seg = segment_abandoned.last;
    if (seg) {
        list_remove(&segment_abandoned.first, &segment_abandoned.last, seg);
        atomic_fetch_sub_explicit(&segment_abandoned.count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&segment_abandoned.lock);
    if (seg == NULL) return false;
    segment_adopt(heap, seg);
    return true;
}

/* Adopt every abandoned segment (coral_collect(force)). */
void coral_segments_adopt_all(coral_heap_t *heap) {
    while (segment_adopt_one(heap)) {
    }
}

/* ---- fork ---------------------------------------------------------------------- */

/* Holding the registry lock also means the purger holds no span lock. */
void coral_segment_locks_prefork(void) {
    pthread_mutex_lock(&segment_abandoned.lock);
    pthread_mutex_lock(&registry_lock);
}

void coral_segment_locks_postfork(void) {
    pthread_mutex_unlock(&registry_lock);
    pthread_mutex_unlock(&segment_abandoned.lock);
}

/* Grow or shrink a page's span in place to `slices` (owner only). Growing
 * needs the slices right after the span to be free. */
bool coral_segment_span_resize(coral_page_t *page, size_t slices) {
    coral_segment_t *seg = coral_ptr_segment(page);
    size_t first = (size_t)(page - seg->pages), now = page->slice_count;
    if (slices == now) return true;
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    if (slices < now) {
        atomic_store_explicit(&seg->used_slices, used & ~slice_mask(first + slices, now - slices),
                              memory_order_relaxed);
        coral_stat_count(&coral_gstats.span_bytes, -(int64_t)((now - slices) * CORAL_SLICE_SIZE));
        backlog_add_slices(slice_mask(first + slices, now - slices), +1);
        page->slice_count = (uint32_t)slices;
        coral_segment_mark_purgeable(seg);
        return true;
    }
    if (first + slices > CORAL_SLICES_PER_SEGMENT) return false;
    uint64_t grow = slice_mask(first + now, slices - now);
    if ((used & grow) || !span_trylock(seg)) return false;
    for (size_t i = now; i < slices; i++) coral_slice_mark_interior(&seg->pages[first + i], i);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    atomic_store_explicit(&seg->used_slices, used | grow, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, dirty | grow, memory_order_relaxed);
    span_unlock(seg);
    backlog_add_slices(dirty & grow, -1);
    coral_stat_gauge(&coral_gstats.span_bytes, &coral_gstats.span_bytes_peak,
                     (int64_t)((slices - now) * CORAL_SLICE_SIZE));
    page->slice_count = (uint32_t)slices;
    return true;
}
