/* Segments: 4 MiB-aligned regions from the segment cache (cache.c), cut
 * into 64 KiB slices.
 *
 * A thread owns the segments it takes spans from (seg->thread_id, its
 * coral_thread_segments_t). A segment whose last span is freed goes back to
 * the segment cache, where it is purged (its pages given back to the OS)
 * after the purge delay unless some segment, normal or huge, reuses it
 * first. A thread that exits abandons its segments that still hold live
 * blocks; a thread that needs a span adopts them (the heap layer gives
 * their pages a heap). The global lists (abandoned, registry) each have a
 * mutex, taken only on these segment-level events, never per block. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "segment/segment.h"

uint8_t coral_segment_map[CORAL_MAP_CHUNKS];

/* Segments of exited threads with blocks still live, oldest last; linked
 * through seg->link, under the lock. */
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_list_t abandoned;
_Atomic(size_t) coral_abandoned_count; /* changed under the lock; read without it as a hint */

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

/* ---- the registry: every mapped normal segment, for the purger ------------------ */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_list_t registry; /* through seg->registry_link, under the lock */

static void registry_add(coral_segment_t *seg) {
    coral_mutex_lock(&registry_lock);
    coral_list_push_front(&registry, &seg->registry_link);
    coral_mutex_unlock(&registry_lock);
}

/* Waits out a purge of seg in progress (the purger holds the lock). */
static void registry_remove(coral_segment_t *seg) {
    coral_mutex_lock(&registry_lock);
    coral_list_remove(&registry, &seg->registry_link);
    coral_mutex_unlock(&registry_lock);
}

/* ---- purging free slices ------------------------------------------------------------ */

/* Bytes of free slices that may hold data, in every segment in use: what
 * the free-slices stage may purge. Changed with relaxed atomic adds at the
 * same events as the purge backlog; read by purge passes. */
static _Atomic(int64_t) free_dirty_bytes;

/* Free slices that may hold data count in the purge backlog (os/purge.c). */
static void backlog_add_slices(uint64_t slices, int sign) {
    int64_t bytes = sign * (int64_t)__builtin_popcountll(slices) * (int64_t)CORAL_SLICE_SIZE;
    atomic_fetch_add_explicit(&free_dirty_bytes, bytes, memory_order_relaxed);
    coral_purge_backlog_add(bytes);
}

int64_t coral_segment_purge_budget(uint64_t now) {
    return atomic_load_explicit(&free_dirty_bytes, memory_order_relaxed) +
           coral_segment_cache_dirty() - (int64_t)coral_purge_keep_bytes(now);
}

/* Slices taken into spans (> 0) or given back (< 0): the program's demand
 * (os/purge.c), next to the statistics' gauge. */
static void demand_add_slices(int64_t slices) {
    int64_t bytes = slices * (int64_t)CORAL_SLICE_SIZE;
    coral_count_gauge(&coral_counters.page_bytes, &coral_counters.page_bytes_peak, bytes);
    coral_purge_demand_add(bytes);
}

static bool span_trylock(coral_segment_t *seg) {
    return atomic_exchange_explicit(&seg->span_lock, 1, memory_order_acquire) == 0;
}

static void span_unlock(coral_segment_t *seg) {
    atomic_store_explicit(&seg->span_lock, 0, memory_order_release);
}

/* Owner: slices were freed (used_slices stored); they may be purged after
 * the purge delay. A store-load pair against the purger's: the owner stores
 * used_slices then loads purge_due_ms, the purger stores purge_due_ms = 0
 * then loads used_slices (segments_purge_due). With a full fence between
 * each side's store and load, at least one of them sees the other's store:
 * either this call sees 0 and schedules the segment again, or the purger's
 * pass sees the freed slices and purges them. Without the fences both
 * could read the old values, leaving free dirty slices with no purge due. */
static void segment_mark_purgeable(coral_segment_t *seg) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&seg->purge_due_ms, memory_order_relaxed) != 0) return;
    uint64_t due = coral_clock_ms() + (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS);
    atomic_store_explicit(&seg->purge_due_ms, due, memory_order_relaxed);
    coral_purger_notify();
}

/* Owner, under span_lock, slices just taken: raise the most in spans
 * since the purger's last look (segment_window_hold). */
static void window_note_used(coral_segment_t *seg, uint64_t used) {
    unsigned n = (unsigned)__builtin_popcountll(used);
    if (n > seg->used_high) seg->used_high = (uint8_t)n;
}

/* The segment's own demand window: of its free dirty slices, as many as
 * the most slices it had in spans over the window exceeds those in spans
 * now stay resident (the lowest, which its owner takes first), whatever
 * the process-wide window says. Each thread takes spans from its own
 * segments only, so the sum of each segment's swings, which its owner
 * takes again, is more than the swing of the process's demand: without
 * it, a thread whose spans come and go in its segments while others'
 * stay would see its free slices purged and faulted in again. A window
 * begins at the first look after the last one expired, from the most
 * seen since the look before (used_high), so what no span needed for a
 * whole window goes back; a forced purge (coral_collect(1), malloc_trim)
 * holds nothing, as it ignores the process's window. An abandoned
 * segment (thread_id 0) holds nothing either: it has no owner to take its
 * slices again, only a thread that adopts it, and the process's window
 * already keeps what a thread that replaces an exited one takes (as it
 * does for the segment cache); held, an exited thread's free slices stayed
 * resident beside the new thread's spans (larson: up to 400 slices in
 * abandoned segments). thread_id is written by the exiting owner and the
 * adopter, not under span_lock: a relaxed read that is one pass late only
 * holds or returns those slices a pass later (a policy, no block depends
 * on it); a segment registered but not yet owned reads 0 and has no
 * window to hold. Under span_lock. Returns the slices held, taken out of
 * *purge. */
static uint64_t segment_window_hold(coral_segment_t *seg, uint64_t *purge, unsigned used_count,
                                    uint64_t now, bool force) {
    uint64_t window_ms =
        (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS) * CORAL_PURGE_WINDOW_DELAYS;
    unsigned high = seg->used_high > used_count ? seg->used_high : used_count;
    seg->used_high = (uint8_t)used_count;
    if (window_ms == 0 || force || atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == 0)
        return 0;
    if (now - seg->window_ms >= window_ms) {
        seg->window_peak = (uint8_t)high;
        seg->window_ms = now;
    } else if (high > seg->window_peak) {
        seg->window_peak = (uint8_t)high;
    }
    uint64_t held = 0;
    for (unsigned keep = seg->window_peak > used_count ? seg->window_peak - used_count : 0;
         keep > 0 && *purge != 0; keep--) {
        uint64_t lowest = *purge & -*purge;
        held |= lowest;
        *purge &= ~lowest;
    }
    return held;
}

/* Give the free, dirty slices of seg back to the OS (madvise, a call per
 * run of adjacent slices), as far as *budget allows: a run bigger than
 * what is left of it stays (the demand window keeps it, os/purge.c). A
 * run held back makes the segment due again when the window has moved
 * on; one the kernel refused, after the delay. */
static void segment_purge_free(coral_segment_t *seg, int64_t *budget, uint64_t now, bool force) {
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    uint64_t purge = dirty & ~used & ~(uint64_t)1;
    uint64_t held =
        segment_window_hold(seg, &purge, (unsigned)__builtin_popcountll(used), now, force);
    uint64_t left = purge, refused = 0;
    while (left) {
        unsigned first = (unsigned)__builtin_ctzll(left);
        uint64_t run = left >> first;
        unsigned n = run == ~(uint64_t)0 ? 64 - first : (unsigned)__builtin_ctzll(~run);
        uint64_t run_bits = n >= 64 ? ~(uint64_t)0 : ((((uint64_t)1 << n) - 1) << first);
        int64_t bytes = (int64_t)n * (int64_t)CORAL_SLICE_SIZE;
        left &= ~run_bits;
        if (bytes > *budget) {
            held |= run_bits;
            continue;
        }
        if (coral_os_purge(coral_segment_base(seg) + (size_t)first * CORAL_SLICE_SIZE,
                           (size_t)bytes))
            *budget -= bytes;
        else
            refused |= run_bits;
    }
    purge &= ~(held | refused);
    atomic_store_explicit(&seg->dirty_slices, dirty & ~purge, memory_order_relaxed);
    backlog_add_slices(purge, -1);
    uint64_t due = 0;
    if (held) due = coral_purge_recheck_ms(now);
    if (refused) due = now + (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS);
    if (due != 0) atomic_store_explicit(&seg->purge_due_ms, due, memory_order_relaxed);
}

/* Purge every registered segment whose purge is due (all that have free
 * dirty slices, when force). Returns the earliest time a purge is still
 * pending, or 0 if none. Any thread may call it. */
static uint64_t segments_purge_due(uint64_t now, bool force) {
    uint64_t next = 0;
    /* What the free slices hold beyond what the demand window keeps. */
    int64_t budget = force ? INT64_MAX : coral_segment_purge_budget(now);
    coral_mutex_lock(&registry_lock);
    for (coral_link_t *l = registry.first; l != NULL; l = l->next) {
        coral_segment_t *seg = coral_container_of(l, coral_segment_t, registry_link);
        uint64_t due = atomic_load_explicit(&seg->purge_due_ms, memory_order_relaxed);
        if (due == 0) continue;
        if ((force || due <= now) && span_trylock(seg)) {
            /* Cleared before reading used_slices: a page freed from here on
             * marks the segment again. */
            atomic_store_explicit(&seg->purge_due_ms, 0, memory_order_relaxed);
            atomic_thread_fence(memory_order_seq_cst); /* segment_mark_purgeable */
            segment_purge_free(seg, &budget, now, force);
            span_unlock(seg);
            due = atomic_load_explicit(&seg->purge_due_ms, memory_order_relaxed);
            if (due != 0 && (next == 0 || due < next)) next = due;
            continue;
        }
        if (due <= now) due = now + 1; /* busy: try again soon */
        if (next == 0 || due < next) next = due;
    }
    coral_mutex_unlock(&registry_lock);
    return next;
}

void coral_segments_init(void) {
    coral_purge_stage_set(CORAL_PURGE_SEGMENT_CACHE, coral_segment_cache_purge);
    coral_purge_stage_set(CORAL_PURGE_FREE_SLICES, segments_purge_due);
}

/* ---- acquiring and releasing segments ------------------------------------- */

static uint64_t slice_mask(size_t first, size_t n);

/* The header fields of a segment taken from the cache, before the caller
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
    seg->used_high = seg->window_peak = 0;
    seg->window_ms = 0;
    seg->owner = NULL;
    seg->link.next = seg->link.prev = NULL;
    seg->registry_link.next = seg->registry_link.prev = NULL;
    seg->huge_dirty = 0;
    seg->room_classes[0] = seg->room_classes[1] = 0;
}

/* The secure build's guard slice made inaccessible (a segment is made) or
 * accessible again (it goes to the cache, whose chunks may become any part
 * of a later segment). */
static void guard_slice_set(coral_segment_t *seg, bool accessible) {
    (void)coral_os_protect(coral_segment_base(seg) + CORAL_GUARD_SLICE * CORAL_SLICE_SIZE,
                           CORAL_SLICE_SIZE, accessible);
}

/* A segment from the cache: its header is set up, its slices known dirty
 * where the cache says they may hold data. */
static coral_segment_t *segment_map_new(bool huge_pages) {
    coral_cache_got_t got;
    coral_segment_t *seg =
        coral_segment_cache_take(CORAL_SEGMENT_SIZE, huge_pages ? CORAL_SEGMENT_SIZE : 0, &got);
    if (seg == NULL) return NULL;
    /* The bytes from the base that fault in as huge pages. The secure
     * build's guard slice splits the mapping inside the second 2 MiB,
     * which therefore never gets a huge page. */
    size_t huge_bytes = !huge_pages ? 0 : CORAL_SECURE ? CORAL_HUGE_PAGE_SIZE : CORAL_SEGMENT_SIZE;
    /* The header is written next: a clean first 2 MiB in huge pages faults
     * in whole then, so it is faulted in here, timed (os.h); found slow,
     * the rest loses the advice before anything there is touched. */
    if (huge_pages && got.dirty == 0 && !coral_huge_pages_fault_in(seg, CORAL_HUGE_PAGE_SIZE)) {
        coral_os_advise_no_huge(coral_segment_base(seg) + CORAL_HUGE_PAGE_SIZE,
                                CORAL_SEGMENT_SIZE - CORAL_HUGE_PAGE_SIZE);
        huge_bytes = CORAL_HUGE_PAGE_SIZE;
    }
    _Static_assert(sizeof(coral_segment_t) <= CORAL_SLICE_SIZE, "segment header fits slice 0");
    /* A fresh one reads as zero; a freed segment's descriptors are all free
     * (pages[0], never a page here, may describe a huge block: cleared). */
    if (got.dirty != 0 && !got.header)
        memset(seg->pages, 0, sizeof seg->pages);
    else if (got.dirty != 0)
        memset(&seg->pages[0], 0, sizeof seg->pages[0]);
    coral_segment_header_reset(seg);
    /* kind and size never change while the segment is mapped: other
     * threads read them without synchronisation. */
    seg->kind = CORAL_SEGMENT_NORMAL;
    seg->size = CORAL_SEGMENT_SIZE;
    /* In huge pages, a touch makes all of its 2 MiB resident: every slice
     * of a huge page counts as dirty, so that the free ones are purged like
     * used ones. The slices past huge_bytes stay clean, and a new page
     * there is populated as in a segment without huge pages (heap.c)
     * instead of faulting in 4 KiB at a time. */
    size_t dirty = (got.dirty + CORAL_SLICE_SIZE - 1) / CORAL_SLICE_SIZE;
    if (dirty < huge_bytes / CORAL_SLICE_SIZE) dirty = huge_bytes / CORAL_SLICE_SIZE;
    atomic_store_explicit(&seg->used_slices, 1 | CORAL_GUARD_SLICE_BITS, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, 1 | slice_mask(0, dirty), /* the header too */
                          memory_order_relaxed);
    backlog_add_slices(slice_mask(0, dirty) & ~(uint64_t)1,
                       +1); /* the cache no longer counts them */
    registry_add(seg);
    coral_segment_map_set(seg, CORAL_SEGMENT_SIZE, true);
    if (got.fresh) coral_os_new_segment(seg, CORAL_SEGMENT_SIZE, CORAL_SLICE_SIZE);
    if (CORAL_SECURE) guard_slice_set(seg, false);
    coral_count_gauge(&coral_counters.segments, &coral_counters.segments_peak, 1);
    return seg;
}

/* An empty segment leaves its owner (and the purger's registry) for the
 * cache, which knows how far its slices may hold data. */
static void segment_to_cache(coral_segment_t *seg) {
    atomic_store_explicit(&seg->thread_id, 0, memory_order_release);
    seg->owner = NULL;
    registry_remove(seg);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    size_t dirty_end = (size_t)(64 - __builtin_clzll(dirty | 1)) * CORAL_SLICE_SIZE;
    backlog_add_slices(dirty & ~(uint64_t)1, -1); /* the cache counts them now */
    coral_count(&coral_counters.segments, -1);
    if (CORAL_SECURE) guard_slice_set(seg, true);
    coral_segment_cache_put(seg, CORAL_SEGMENT_SIZE, dirty_end, true);
}

static void segment_own(coral_segment_t *seg, coral_thread_segments_t *ts) {
    seg->owner = ts;
    atomic_store_explicit(&seg->thread_id, ts->thread_id, memory_order_release);
    coral_list_push_front(&ts->segments, &seg->link);
}

/* The segment has no span in use any more: off to the cache. */
static void segment_release(coral_segment_t *seg) {
    if (seg->owner->small_segment == seg) seg->owner->small_segment = NULL;
    coral_list_remove(&seg->owner->segments, &seg->link);
    segment_to_cache(seg);
}

/* ---- spans of slices --------------------------------------------------------- */

/* Lowest index of n consecutive free slices, or -1, preferring a run whose
 * slices all may hold data (dirty: resident, unless the purger took them
 * since): a span there faults nothing in, and the free slices the program
 * does not take are the ones that stay clean (or get purged). Bits past 63
 * count as used, since the shifts bring in zeros. */
static int find_free_run(uint64_t used, uint64_t dirty, size_t n) {
    uint64_t free = ~used, run = free, warm = free & dirty;
    for (size_t i = 1; i < n && run; i++) {
        run &= free >> i;
        warm &= (free & dirty) >> i;
    }
    warm &= run;
    return warm ? __builtin_ctzll(warm) : run ? __builtin_ctzll(run) : -1;
}

static uint64_t slice_mask(size_t first, size_t n) {
    return (n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << first;
}

/* Slice i (>= 1) of a span: leads back to the head; its INTERIOR flag sends
 * the free fast path (which reads the slice's own descriptor) elsewhere. */
void coral_slice_mark_interior(coral_page_t *slice, size_t i) {
    slice->slice_offset = (uint16_t)(i * sizeof(coral_page_t));
    coral_slice_set(slice, 0, CORAL_PAGE_INTERIOR);
}

/* Take slices [first, first+n) as a span. Caller holds seg's span_lock. */
static coral_page_t *segment_take_span(coral_segment_t *seg, size_t first, size_t n) {
    uint64_t mask = slice_mask(first, n);
    coral_page_t *page = &seg->pages[first];
    for (size_t i = 1; i < n; i++) coral_slice_mark_interior(&seg->pages[first + i], i);
    page->slice_offset = 0;
    page->slice_count = (uint16_t)n;
    page->start = coral_segment_base(seg) + first * CORAL_SLICE_SIZE;
    /* (Blocks freed there before are inaccessible to memcheck: the page
     * layer writes the span afresh.) */
    CORAL_VG(VALGRIND_MAKE_MEM_UNDEFINED(page->start, n * CORAL_SLICE_SIZE));
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    page->is_fresh = (dirty & mask) == 0;
    backlog_add_slices(dirty & mask, -1);
    atomic_store_explicit(&seg->used_slices, used | mask, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, dirty | mask, memory_order_relaxed);
    window_note_used(seg, used | mask);
    seg->used_pages++;
    demand_add_slices((int64_t)n);
    return page;
}

/* A run of n free slices in seg, taken; NULL if none (or the purger is at
 * work on seg right now: then the caller looks elsewhere, never waits). */
static coral_page_t *segment_try_span(coral_segment_t *seg, size_t n) {
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    /* (dirty_slices is the purger's to clear: read as a hint.) */
    int first =
        find_free_run(used, atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed), n);
    if (first <= 0 || !span_trylock(seg)) return NULL;
    coral_page_t *page = segment_take_span(seg, (size_t)first, n);
    span_unlock(seg);
    return page;
}

static coral_page_t *segments_find_span(coral_thread_segments_t *ts, size_t n) {
    for (coral_link_t *l = ts->segments.first; l != NULL; l = l->next) {
        coral_page_t *page = segment_try_span(coral_container_of(l, coral_segment_t, link), n);
        if (page) return page;
    }
    return NULL;
}

/* One-slice spans (blocks up to 8 KiB) go first to the segment of the last
 * one, else to the newest segment with room, like every other span. So
 * small blocks gather in few segments and do not pin one that large blocks
 * use: a small block put in the newest segment can keep it (and its freed,
 * resident slices that no huge block could reuse) from going back to the
 * cache. */
coral_page_t *coral_span_alloc_owned(coral_thread_segments_t *ts, size_t n) {
    coral_page_t *page = NULL;
    if (n == 1 && ts->small_segment != NULL) page = segment_try_span(ts->small_segment, n);
    if (page == NULL) page = segments_find_span(ts, n);
    if (page != NULL && n == 1) ts->small_segment = coral_ptr_segment(page);
    return page;
}

/* Huge pages (CORALLOC_HUGE_PAGES) go to the segments a thread makes from
 * its HUGE_PAGES_FROM_SEGMENT-th on, while the process writes the pages it
 * carves densely: a thread that needs that many segments has filled 16 MiB,
 * so its memory is no small program's, and the 2 MiB pages of the new one
 * will be used. A thread's first segments keep 4 KiB pages: a small program
 * (or a thread that allocates little) pays for no 2 MiB it does not fill
 * (a 2 MiB page half used is 1 MiB of RSS no other allocator would hold;
 * espresso's 8 MiB heap took 6.5 MiB of RSS with huge pages from the second
 * segment, 3.4 MiB without). Adopted
 * segments do not count: a short-lived thread that adopted an exited one's
 * segment, whose pages hold a few live blocks, has filled nothing, and a
 * 2 MiB page under its few blocks would pin 2 MiB for each (mleak's shape:
 * threads that each leave one block behind). */
#define HUGE_PAGES_FROM_SEGMENT 4

/* A segment made for a span of n slices: a span of half a huge page or
 * more (a large block) fills its 2 MiB pages itself, whatever the thread's
 * count of segments. */
static bool span_wants_huge_pages(const coral_thread_segments_t *ts, size_t n) {
    bool big_span = n * CORAL_SLICE_SIZE >= CORAL_HUGE_PAGE_SIZE / 2;
    return (big_span || ts->segments_made + 1 >= HUGE_PAGES_FROM_SEGMENT) &&
           coral_huge_pages_for_segment();
}

coral_page_t *coral_span_alloc_new(coral_thread_segments_t *ts, size_t n) {
    coral_segment_t *seg = segment_map_new(span_wants_huge_pages(ts, n));
    if (seg == NULL) return NULL;
    seg->used_pages = 0; /* used_slices is 1: the header only */
    segment_own(seg, ts);
    ts->segments_made++;
    /* The purger may already see the new segment (it is registered), but
     * finds nothing to purge in it: the lock is free or soon free. */
    while (!span_trylock(seg)) coral_spin_pause();
    coral_page_t *page = segment_take_span(seg, 1, n);
    span_unlock(seg);
    if (n == 1) ts->small_segment = seg;
    return page;
}

/* The secure build: a thread keeps up to SPARE_SEGMENTS empty segments
 * rather than give them to the cache, so a program that empties and
 * refills its segments does not make their guard slices accessible and
 * inaccessible again (two mprotect calls per segment) each time. A spare
 * is an owned segment like any other: the purger purges its free slices,
 * its slices serve new spans, and thread exit gives it to the cache. (A
 * walk of the thread's segments: only when one empties.) */
#define SPARE_SEGMENTS 32

static bool segment_keep_empty(const coral_segment_t *seg) {
    if (!CORAL_SECURE) return false;
    unsigned empty = 0;
    for (const coral_link_t *l = seg->owner->segments.first; l != NULL; l = l->next) {
        const coral_segment_t *other = coral_container_of(l, coral_segment_t, link);
        if (other != seg && other->used_pages == 0 && ++empty == SPARE_SEGMENTS) return false;
    }
    return true;
}

void coral_span_free(coral_page_t *page) {
    coral_segment_t *seg = coral_ptr_segment(page);
    size_t first = (size_t)(page - seg->pages);
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    atomic_store_explicit(&seg->used_slices, used & ~slice_mask(first, page->slice_count),
                          memory_order_relaxed);
    demand_add_slices(-(int64_t)page->slice_count);
    backlog_add_slices(slice_mask(first, page->slice_count), +1);
    page->slice_count = 0;
    page->block_size = 0;
    coral_slice_set(page, 0, CORAL_SLICE_FREED);
    /* Marked before the release: after it the segment may be someone else's. */
    segment_mark_purgeable(seg);
    if (--seg->used_pages == 0 && !segment_keep_empty(seg)) segment_release(seg);
}

/* ---- abandonment and adoption --------------------------------------------------
 * Protocol: the exiting owner has already taken its pages out of its heaps
 * (the heap layer: every page's delay state is NEVER and its owner NULL). It
 * clears seg->thread_id with a release store, then publishes the segment on
 * the abandoned list under its lock. From then on other threads' frees push
 * onto the pages' thread_free lists only. An adopter pops the segment under
 * the same lock (which orders it after the owner's last writes), sets owner
 * and thread_id, and its heap layer takes each page in use, collecting the
 * remote frees and setting the page's tid_flags id. Before its release
 * store the exiting owner clears the id part of its pages' tid_flags, so
 * that no free takes the owner's fast path into an abandoned page, even
 * from a later thread that gets the exiting one's id. */

static void segment_clear_page_tids(coral_segment_t *seg) {
    for (coral_page_t *page = coral_segment_next_span(seg, NULL); page != NULL;
         page = coral_segment_next_span(seg, page))
        coral_slice_set_tid(page, 0);
}

void coral_segments_abandon(coral_thread_segments_t *ts) {
    ts->small_segment = NULL;
    coral_link_t *l = ts->segments.first;
    while (l != NULL) {
        coral_link_t *next = l->next;
        coral_segment_t *seg = coral_container_of(l, coral_segment_t, link);
        coral_list_remove(&ts->segments, l);
        if (seg->used_pages == 0) {
            segment_to_cache(seg);
        } else {
            seg->owner = NULL;
            segment_clear_page_tids(seg);
            atomic_store_explicit(&seg->thread_id, 0, memory_order_release);
            coral_mutex_lock(&abandoned_lock);
            coral_list_push_front(&abandoned, &seg->link);
            atomic_fetch_add_explicit(&coral_abandoned_count, 1, memory_order_relaxed);
            coral_mutex_unlock(&abandoned_lock);
            coral_count(&coral_counters.segments_abandoned, 1);
        }
        l = next;
    }
}

/* Under abandoned_lock: the oldest abandoned segment (cls 0), else the
 * oldest of the ADOPT_SCAN oldest with room for class cls, or NULL. */
#define ADOPT_SCAN 16
static coral_segment_t *abandoned_pick(unsigned cls) {
    coral_segment_t *seg = coral_list_entry(abandoned.last, coral_segment_t, link);
    if (cls == 0) return seg;
    uint64_t bit = (uint64_t)1 << (cls % 64);
    for (unsigned seen = 0; seg != NULL && seen < ADOPT_SCAN; seen++) {
        if (seg->room_classes[(cls / 64) & 1] & bit) return seg;
        seg = coral_list_entry(seg->link.prev, coral_segment_t, link);
    }
    return NULL;
}

coral_segment_t *coral_segment_adopt_next(coral_thread_segments_t *ts, unsigned cls) {
    if (atomic_load_explicit(&coral_abandoned_count, memory_order_relaxed) == 0) return NULL;
    coral_mutex_lock(&abandoned_lock);
    coral_segment_t *seg = abandoned_pick(cls);
    if (seg) {
        seg->room_classes[0] = seg->room_classes[1] = 0;
        coral_list_remove(&abandoned, &seg->link);
        atomic_fetch_sub_explicit(&coral_abandoned_count, 1, memory_order_relaxed);
    }
    coral_mutex_unlock(&abandoned_lock);
    if (seg == NULL) return NULL;
    segment_own(seg, ts);
    coral_count(&coral_counters.segments_adopted, 1);
    return seg;
}

coral_page_t *coral_segment_next_span(coral_segment_t *seg, coral_page_t *page) {
    size_t i = page == NULL ? 1 : (size_t)(page - seg->pages) + page->slice_count;
    for (; i < CORAL_SLICES_PER_SEGMENT; i++)
        if (seg->pages[i].slice_count != 0) return &seg->pages[i];
    return NULL;
}

/* ---- fork ---------------------------------------------------------------------- */

/* Holding the registry lock also means the purger holds no span lock. */
void coral_segment_locks_prefork(void) {
    coral_mutex_lock(&abandoned_lock);
    coral_mutex_lock(&registry_lock);
}

/* In the child, every span lock is free: a thread that held one at the
 * fork (taking slices of its own segment) does not exist there, and the
 * child's purger would find that segment busy forever. (The purger's own
 * span locks are taken under registry_lock, which the fork holds.) */
void coral_segment_locks_postfork(bool child) {
    if (child)
        for (coral_link_t *l = registry.first; l != NULL; l = l->next)
            span_unlock(coral_container_of(l, coral_segment_t, registry_link));
    coral_mutex_unlock(&registry_lock);
    coral_mutex_unlock(&abandoned_lock);
}

/* Grow or shrink a page's span in place to `slices` (owner only). Growing
 * needs the slices right after the span to be free. */
bool coral_span_resize(coral_page_t *page, size_t slices) {
    coral_segment_t *seg = coral_ptr_segment(page);
    size_t first = (size_t)(page - seg->pages), now = page->slice_count;
    if (slices == now) return true;
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    if (slices < now) {
        atomic_store_explicit(&seg->used_slices, used & ~slice_mask(first + slices, now - slices),
                              memory_order_relaxed);
        demand_add_slices(-(int64_t)(now - slices));
        backlog_add_slices(slice_mask(first + slices, now - slices), +1);
        page->slice_count = (uint16_t)slices;
        segment_mark_purgeable(seg);
        return true;
    }
    if (first + slices > CORAL_SLICES_PER_SEGMENT) return false;
    uint64_t grow = slice_mask(first + now, slices - now);
    if ((used & grow) || !span_trylock(seg)) return false;
    for (size_t i = now; i < slices; i++) coral_slice_mark_interior(&seg->pages[first + i], i);
    uint64_t dirty = atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed);
    atomic_store_explicit(&seg->used_slices, used | grow, memory_order_relaxed);
    atomic_store_explicit(&seg->dirty_slices, dirty | grow, memory_order_relaxed);
    window_note_used(seg, used | grow);
    span_unlock(seg);
    backlog_add_slices(dirty & grow, -1);
    demand_add_slices((int64_t)(slices - now));
    page->slice_count = (uint16_t)slices;
    return true;
}
