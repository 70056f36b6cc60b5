/* Segments: 4 MiB-aligned regions from the OS, cut into 64 KiB slices.
 *
 * A thread owns the segments it allocates pages from (segment->thread_id,
 * tld->segments). Spans of slices become pages; a segment whose last page is
 * freed goes to the global segment cache, where it is purged (its pages given
 * back to the OS) after the purge delay, and unmapped when the cache is full.
 * A thread that exits abandons its segments that still hold live blocks; any
 * thread that needs a page adopts them (their live blocks stay valid, their
 * free ones are reused). The two global lists (cache, abandoned) each have a
 * mutex, taken only on these segment-level events, never per block.
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

static segment_list_t segment_cache = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, 0};
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
    return kind == CORAL_MAP_SEGMENT ? coral_ptr_segment((void *)a) : NULL;
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

/* ---- the segment cache ------------------------------------------------------ */

static void segment_unmap(coral_segment_t *seg) {
    size_t size = seg->size;
    coral_segment_map_set(seg, size, false);
    coral_stat_count(&coral_gstats.segments, -1);
    coral_os_unmap(seg, size);
}

/* Slices 1..63 of a cached segment back to the OS: they read as zero after. */
static void segment_purge(coral_segment_t *seg) {
    if (seg->dirty_slices <= 1) return;
    coral_os_purge(coral_segment_base(seg) + CORAL_SLICE_SIZE,
                   CORAL_SEGMENT_SIZE - CORAL_SLICE_SIZE);
    seg->dirty_slices = 1;
}

/* Purge cached segments released longer than the purge delay ago (all of
 * them when force). Caller holds no lock. */
void coral_segment_cache_purge(bool force) {
    coral_huge_cache_purge(force);
    if (atomic_load_explicit(&segment_cache.count, memory_order_relaxed) == 0)
        return;
    uint64_t now = coral_clock_ms();
    int64_t delay = coral_option(CORAL_OPT_PURGE_DELAY_MS);
    pthread_mutex_lock(&segment_cache.lock);
    /* Oldest at the back. */
    for (coral_segment_t *s = segment_cache.last; s != NULL; s = s->prev) {
        if (!force && (int64_t)(now - s->released_at_ms) < delay) break;
        segment_purge(s);
    }
    pthread_mutex_unlock(&segment_cache.lock);
}

static void segment_cache_put(coral_segment_t *seg) {
    atomic_store_explicit(&seg->thread_id, 0, memory_order_release);
    seg->tld = NULL;
    seg->released_at_ms = coral_clock_ms();
    coral_segment_t *evict = NULL;
    pthread_mutex_lock(&segment_cache.lock);
    list_push_front(&segment_cache.first, &segment_cache.last, seg);
    size_t count = atomic_fetch_add_explicit(&segment_cache.count, 1, memory_order_relaxed) + 1;
    if ((int64_t)count > coral_option(CORAL_OPT_SEGMENT_CACHE)) {
        evict = segment_cache.last;
        list_remove(&segment_cache.first, &segment_cache.last, evict);
        atomic_fetch_sub_explicit(&segment_cache.count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&segment_cache.lock);
    if (evict) segment_unmap(evict);
    coral_segment_cache_purge(false);
}

static coral_segment_t *segment_cache_take(void) {
    if (atomic_load_explicit(&segment_cache.count, memory_order_relaxed) == 0)
        return NULL;
    pthread_mutex_lock(&segment_cache.lock);
    coral_segment_t *seg = segment_cache.first; /* the most recent: least likely purged */
    if (seg) {
        list_remove(&segment_cache.first, &segment_cache.last, seg);
        atomic_fetch_sub_explicit(&segment_cache.count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&segment_cache.lock);
    return seg;
}

/* ---- acquiring and releasing segments ------------------------------------- */

static coral_segment_t *segment_map_new(void) {
    coral_segment_t *seg = coral_os_map_aligned(CORAL_SEGMENT_SIZE, CORAL_SEGMENT_SIZE);
    if (seg == NULL) return NULL;
    _Static_assert(sizeof(coral_segment_t) <= CORAL_SLICE_SIZE, "segment header fits slice 0");
    /* kind and size never change while the segment is mapped: other
     * threads read them without synchronisation. */
    seg->kind = CORAL_SEGMENT_NORMAL;
    seg->size = CORAL_SEGMENT_SIZE;
    seg->dirty_slices = 1; /* only the header slice is touched */
    coral_segment_map_set(seg, CORAL_SEGMENT_SIZE, true);
    coral_stat_gauge(&coral_gstats.segments, &coral_gstats.segments_peak, 1);
    return seg;
}

static void segment_own(coral_segment_t *seg, coral_tld_t *tld) {
    seg->tld = tld;
    atomic_store_explicit(&seg->thread_id, tld->thread_id, memory_order_release);
    list_push_front(&tld->segments, NULL, seg);
}

/* An empty segment for tld: from the cache, else from the OS. */
static coral_segment_t *segment_acquire_empty(coral_tld_t *tld) {
    coral_segment_t *seg = segment_cache_take();
    if (seg == NULL) seg = segment_map_new();
    if (seg == NULL) return NULL;
    seg->used_slices = 1;
    seg->used_pages = 0;
    segment_own(seg, tld);
    return seg;
}

/* The segment has no page in use any more: off to the cache. */
static void segment_release(coral_segment_t *seg) {
    list_remove(&seg->tld->segments, NULL, seg);
    segment_cache_put(seg);
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

static coral_page_t *segment_take_span(coral_segment_t *seg, size_t first, size_t n) {
    uint64_t mask = slice_mask(first, n);
    coral_page_t *page = &seg->pages[first];
    for (size_t i = 1; i < n; i++) coral_slice_mark_interior(&seg->pages[first + i], i);
    page->slice_offset = 0;
    page->slice_count = (uint32_t)n;
    page->is_fresh = (seg->dirty_slices & mask) == 0;
    page->start = coral_segment_base(seg) + first * CORAL_SLICE_SIZE;
    seg->used_slices |= mask;
    seg->dirty_slices |= mask;
    seg->used_pages++;
    return page;
}

static coral_page_t *segments_find_span(coral_tld_t *tld, size_t n) {
    for (coral_segment_t *seg = tld->segments; seg != NULL; seg = seg->next) {
        if (seg->used_slices == ~(uint64_t)0) continue;
        int first = find_free_run(seg->used_slices, n);
        if (first > 0) return segment_take_span(seg, (size_t)first, n);
    }
    return NULL;
}

static bool segment_adopt_one(coral_heap_t *heap);

/* A span of n slices (1..63) for a new page of `heap`. The caller fills in
 * the page. NULL with errno ENOMEM when the OS has no memory. */
coral_page_t *coral_segment_page_alloc(coral_heap_t *heap, size_t n) {
    coral_tld_t *tld = heap->tld;
    coral_page_t *page = segments_find_span(tld, n);
    if (page) return page;
    /* Abandoned segments first: they may hold free space and their live
     * blocks need an owner anyway. A few at most per call. */
    for (int tries = 0; tries < 4 && segment_adopt_one(heap); tries++) {
        page = segments_find_span(tld, n);
        if (page) return page;
    }
    coral_segment_t *seg = segment_acquire_empty(tld);
    if (seg == NULL) return NULL;
    return segment_take_span(seg, 1, n);
}

/* Return a page's slices to its segment (owner thread only). */
void coral_segment_page_free(coral_page_t *page) {
    coral_segment_t *seg = coral_ptr_segment(page);
    size_t first = (size_t)(page - seg->pages);
    seg->used_slices &= ~slice_mask(first, page->slice_count);
    page->slice_count = 0;
    page->block_size = 0;
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
    coral_segment_t *seg = tld->segments;
    while (seg != NULL) {
        coral_segment_t *next = seg->next;
        list_remove(&tld->segments, NULL, seg);
        if (seg->used_pages == 0) {
            segment_cache_put(seg);
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

void coral_segment_locks_prefork(void) {
    pthread_mutex_lock(&segment_abandoned.lock);
    pthread_mutex_lock(&segment_cache.lock);
}

void coral_segment_locks_postfork(void) {
    pthread_mutex_unlock(&segment_cache.lock);
    pthread_mutex_unlock(&segment_abandoned.lock);
}

/* Grow or shrink a page's span in place to `slices` (owner only). Growing
 * needs the slices right after the span to be free. */
bool coral_segment_span_resize(coral_page_t *page, size_t slices) {
    coral_segment_t *seg = coral_ptr_segment(page);
    size_t first = (size_t)(page - seg->pages), now = page->slice_count;
    if (slices == now) return true;
    if (slices < now) {
        seg->used_slices &= ~slice_mask(first + slices, now - slices);
    } else {
        if (first + slices > CORAL_SLICES_PER_SEGMENT) return false;
        uint64_t grow = slice_mask(first + now, slices - now);
        if (seg->used_slices & grow) return false;
        for (size_t i = now; i < slices; i++) coral_slice_mark_interior(&seg->pages[first + i], i);
        seg->used_slices |= grow;
        seg->dirty_slices |= grow;
    }
    page->slice_count = (uint32_t)slices;
    return true;
}
