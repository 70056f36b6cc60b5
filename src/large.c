/* Large blocks (above the largest size class, up to what a segment holds)
 * and huge blocks (bigger: a segment of their own).
 *
 * A large block is a page of one block: a span of 64 KiB slices taken from
 * one of the thread's segments, so freeing it returns the span to the
 * segment, and the next large request of the thread reuses it without a
 * system call. Its page sits in the heap's full queue, so frees from other
 * threads reach the owner through heap->delayed_pages (page.c).
 *
 * A huge block is mapped on its own, 4 MiB-aligned, with a 64 KiB header
 * (the segment header) before the block; realloc moves its pages with
 * mremap instead of copying bytes. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "options.h"
#include "stats.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

void *coral_malloc_large(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    if (size > CORAL_MAX_REQUEST) {
        errno = ENOMEM;
        return NULL;
    }
    /* A span starts on a slice boundary, so only alignments above the slice
     * size need room to move the block up. */
    size_t extra = alignment > CORAL_SLICE_SIZE ? alignment - CORAL_SLICE_SIZE : 0;
    if (size + extra > CORAL_LARGE_MAX_SIZE) return coral_huge_alloc(heap, size, alignment, zero);

    size_t slices = align_up(size + extra, CORAL_SLICE_SIZE) / CORAL_SLICE_SIZE;
    coral_page_t *page = coral_segment_page_alloc(heap, slices);
    if (page == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    coral_page_init(heap, page, CORAL_CLASS_LARGE, slices * CORAL_SLICE_SIZE);
    page->capacity = page->reserved = page->used = 1;
    coral_heap_add_large_page(heap, page);
    coral_stat_count(&coral_gstats.large_allocs, 1);
    coral_stat_inc(heap->stat_allocs[CORAL_CLASS_LARGE]);
    uint8_t *p = page->start;
    if (alignment > CORAL_SLICE_SIZE) {
        p = (uint8_t *)align_up((uintptr_t)p, alignment);
        if (p != page->start)
            __atomic_store_n(&page->flags, page->flags | CORAL_PAGE_HAS_ALIGNED, __ATOMIC_RELAXED);
    }
    if (zero && !page->is_fresh) memset(p, 0, size);
    return p;
}

/* Grow or shrink a large block in place, within its segment (owner only).
 * NULL when the slices after it are taken. */
void *coral_realloc_large_in_place(coral_page_t *page, void *p, size_t size) {
    size_t offset = (size_t)((uint8_t *)p - page->start);
    size_t slices = align_up(offset + size, CORAL_SLICE_SIZE) / CORAL_SLICE_SIZE;
    if (!coral_segment_span_resize(page, slices)) return NULL;
    page->block_size = slices * CORAL_SLICE_SIZE;
    return p;
}

/* ---- huge blocks -------------------------------------------------------------------- */

static size_t huge_offset(size_t alignment) {
    return alignment > CORAL_SLICE_SIZE ? alignment : CORAL_SLICE_SIZE;
}

/* ---- the huge block cache ----------------------------------------------------------
 * Freed huge segments are kept mapped for a while, so a program that keeps
 * allocating and freeing blocks of some MiB does not pay an mmap, a munmap
 * and a page fault per 4 KiB each time. Kept at most CORALLOC_SEGMENT_CACHE x
 * 4 MiB in all; purged (MADV_DONTNEED) after the purge delay, like cached
 * segments. A cached segment has pages[0].used == 0 (a free of it then is a
 * double free); dirty_slices != 0 means its pages may hold old data. */

#define HUGE_CACHE_SLOTS 16

static pthread_mutex_t huge_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_segment_t *huge_cache[HUGE_CACHE_SLOTS];
static size_t huge_cache_bytes;

static size_t huge_cache_limit(void) {
    return (size_t)coral_option(CORAL_OPT_SEGMENT_CACHE) * CORAL_SEGMENT_SIZE;
}

static void huge_unmap(coral_segment_t *seg) {
    coral_segment_map_set(seg, seg->size, false);
    coral_stat_count(&coral_gstats.segments, -1);
    coral_os_unmap(seg, seg->size);
}

static coral_segment_t *huge_resize(coral_segment_t *seg, size_t total);
static void huge_init_header(coral_segment_t *seg, size_t size);
static bool huge_cache_put(coral_segment_t *seg);

/* A cached segment for a block of `total` bytes (header included), or NULL:
 * the smallest one that is big enough (its tail beyond 1.25x unmapped), else
 * the largest one, grown (mremap keeps its pages: only the growth faults).
 * Either way the pages a program already touched are reused. */
static coral_segment_t *huge_cache_take(size_t total) {
    if (__atomic_load_n(&huge_cache_bytes, __ATOMIC_RELAXED) == 0) return NULL;
    pthread_mutex_lock(&huge_cache_lock);
    int fit = -1, largest = -1;
    for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
        coral_segment_t *s = huge_cache[i];
        if (s == NULL) continue;
        if (s->size >= total && (fit < 0 || s->size < huge_cache[fit]->size)) fit = i;
        if (largest < 0 || s->size > huge_cache[largest]->size) largest = i;
    }
    int pick = fit >= 0 ? fit : largest;
    coral_segment_t *seg = NULL;
    if (pick >= 0) {
        seg = huge_cache[pick];
        huge_cache[pick] = NULL;
        __atomic_store_n(&huge_cache_bytes, huge_cache_bytes - seg->size, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&huge_cache_lock);
    if (seg == NULL || (seg->size >= total && seg->size - total <= total / 4)) return seg;
    if (seg->size >= total) {
        /* Much bigger: the part after the first 4 MiB boundary past the
         * block becomes a cached huge segment of its own (its pages stay
         * resident for the next request) when it spans 4 MiB at least. */
        size_t split = align_up(total, CORAL_SEGMENT_SIZE);
        if (seg->size >= split + CORAL_SEGMENT_SIZE) {
            coral_segment_t *tail = (coral_segment_t *)(coral_segment_base(seg) + split);
            huge_init_header(tail, seg->size - split);
            atomic_store_explicit(&tail->dirty_slices, ~(uint64_t)0, memory_order_relaxed);
            tail->pages[0].used = 0;
            seg->size = split;
            coral_segment_map_set(tail, tail->size, true); /* its first chunk: a start */
            if (!huge_cache_put(tail)) huge_unmap(tail);
            return seg;
        }
    }
    coral_segment_t *resized = huge_resize(seg, total);
    if (resized == NULL) huge_unmap(seg); /* could not grow: a fresh mapping then */
    return resized;
}

/* Keep seg for reuse; false when it does not fit (the caller unmaps it). */
static bool huge_cache_put(coral_segment_t *seg) {
    if (seg->size > huge_cache_limit() / 2) return false;
    seg->released_at_ms = coral_clock_ms();
    coral_segment_t *evict[HUGE_CACHE_SLOTS];
    int evicted = 0;
    bool kept = false;
    pthread_mutex_lock(&huge_cache_lock);
    /* Make room: the oldest go first. */
    while (huge_cache_bytes + seg->size > huge_cache_limit()) {
        int oldest = -1;
        for (int i = 0; i < HUGE_CACHE_SLOTS; i++)
            if (huge_cache[i] && (oldest < 0 || huge_cache[i]->released_at_ms <
                                                    huge_cache[oldest]->released_at_ms))
                oldest = i;
        evict[evicted++] = huge_cache[oldest];
        __atomic_store_n(&huge_cache_bytes, huge_cache_bytes - huge_cache[oldest]->size,
                         __ATOMIC_RELAXED);
        huge_cache[oldest] = NULL;
    }
    for (int i = 0; i < HUGE_CACHE_SLOTS && !kept; i++) {
        if (huge_cache[i] == NULL) {
            huge_cache[i] = seg;
            __atomic_store_n(&huge_cache_bytes, huge_cache_bytes + seg->size, __ATOMIC_RELAXED);
            kept = true;
        }
    }
    pthread_mutex_unlock(&huge_cache_lock);
    for (int i = 0; i < evicted; i++) huge_unmap(evict[i]);
    if (kept) coral_purger_notify();
    return kept;
}

/* Purge cached huge segments older than the purge delay (all when force).
 * Returns when the next one is due, or 0 if none waits. */
uint64_t coral_huge_cache_purge(uint64_t now, bool force) {
    if (__atomic_load_n(&huge_cache_bytes, __ATOMIC_RELAXED) == 0) return 0;
    uint64_t delay = (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS), next = 0;
    pthread_mutex_lock(&huge_cache_lock);
    for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
        coral_segment_t *s = huge_cache[i];
        if (s == NULL || atomic_load_explicit(&s->dirty_slices, memory_order_relaxed) == 0)
            continue;
        uint64_t due = s->released_at_ms + delay;
        if (!force && due > now) {
            if (next == 0 || due < next) next = due;
            continue;
        }
        coral_os_purge(coral_segment_base(s) + CORAL_SLICE_SIZE, s->size - CORAL_SLICE_SIZE);
        atomic_store_explicit(&s->dirty_slices, 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&huge_cache_lock);
    return next;
}

void coral_huge_locks_prefork(void) { pthread_mutex_lock(&huge_cache_lock); }
void coral_huge_locks_postfork(void) { pthread_mutex_unlock(&huge_cache_lock); }

/* ---- huge blocks ------------------------------------------------------------------------- */

/* The header of a huge segment of `size` bytes at seg (mapped). */
static void huge_init_header(coral_segment_t *seg, size_t size) {
    seg->kind = CORAL_SEGMENT_HUGE;
    seg->size = size;
    atomic_store_explicit(&seg->dirty_slices, 0, memory_order_relaxed);
    atomic_store_explicit(&seg->thread_id, 0, memory_order_relaxed);
    /* Every slice descriptor of the first 4 MiB leads to pages[0]. */
    for (size_t i = 1; i < CORAL_SLICES_PER_SEGMENT; i++) coral_slice_mark_interior(&seg->pages[i], i);
    __atomic_store_n(&seg->pages[0].flags, 0, __ATOMIC_RELAXED);
    seg->pages[0].slice_offset = 0;
    seg->pages[0].slice_count = 1;
    seg->pages[0].class_idx = CORAL_CLASS_LARGE;
    coral_stat_gauge(&coral_gstats.segments, &coral_gstats.segments_peak, 1);
}

static coral_segment_t *huge_map_new(size_t total, size_t alignment) {
    /* The block starts `offset` (>= the alignment) after the segment: align
     * the segment to the alignment too when that is more than 4 MiB. */
    size_t seg_align = alignment > CORAL_SEGMENT_SIZE ? alignment : CORAL_SEGMENT_SIZE;
    coral_segment_t *seg = coral_os_map_aligned(total, seg_align);
    if (seg == NULL) return NULL;
    huge_init_header(seg, total);
    coral_segment_map_set(seg, total, true);
    if (coral_option(CORAL_OPT_POPULATE) == CORAL_POPULATE_ON)
        coral_os_populate(coral_segment_base(seg) + CORAL_SLICE_SIZE, total - CORAL_SLICE_SIZE);
    return seg;
}

void *coral_huge_alloc(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    size_t offset = huge_offset(alignment);
    if (size > CORAL_MAX_REQUEST - offset) {
        errno = ENOMEM;
        return NULL;
    }
    size_t total = align_up(offset + size, CORAL_OS_PAGE_SIZE);
    coral_segment_t *seg = offset == CORAL_SLICE_SIZE ? huge_cache_take(total) : NULL;
    bool dirty = seg != NULL && atomic_load_explicit(&seg->dirty_slices, memory_order_relaxed) != 0;
    if (seg == NULL) seg = huge_map_new(total, alignment);
    if (seg == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    coral_page_t *page = &seg->pages[0];
    page->start = coral_segment_base(seg) + offset;
    /* A cached segment may be up to 1/4 bigger: the block still ends where
     * coral_good_size says, the rest waits for a realloc. */
    page->block_size = total - offset;
    page->used = page->capacity = page->reserved = 1;
    atomic_store_explicit(&seg->dirty_slices, ~(uint64_t)0, memory_order_relaxed);
    coral_stat_count(&coral_gstats.huge_allocs, 1);
    coral_stat_count(&coral_gstats.huge_live, 1);
    coral_stat_count(&coral_gstats.huge_bytes, (int64_t)page->block_size);
    if (heap != NULL) coral_stat_inc(heap->stat_allocs[CORAL_CLASS_LARGE]);
    if (zero && dirty) memset(page->start, 0, size);
    /* A user heap keeps a list of its huge blocks, for coral_heap_destroy. */
    bool tracked = heap != NULL && !heap->is_default;
    atomic_store_explicit(&page->heap, tracked ? heap : NULL, memory_order_relaxed);
    if (tracked) {
        pthread_mutex_lock(&heap->huge_lock);
        seg->prev = NULL;
        seg->next = heap->huge_blocks;
        if (seg->next) seg->next->prev = seg;
        heap->huge_blocks = seg;
        pthread_mutex_unlock(&heap->huge_lock);
    }
    return page->start;
}

/* The block is gone: the segment goes to the huge cache, or to the OS. */
void coral_huge_release(coral_segment_t *seg) {
    seg->pages[0].used = 0;
    coral_stat_count(&coral_gstats.huge_live, -1);
    coral_stat_count(&coral_gstats.huge_bytes, -(int64_t)seg->pages[0].block_size);
    if (!huge_cache_put(seg)) huge_unmap(seg);
}

void coral_huge_free(coral_segment_t *seg) {
    coral_page_t *page = &seg->pages[0];
    if (page->used != 1)
        coral_fatal("double free detected: huge block %p was already free", (void *)page->start);
    coral_heap_t *heap = atomic_load_explicit(&page->heap, memory_order_relaxed);
    if (heap != NULL) { /* a user heap's: off its list */
        pthread_mutex_lock(&heap->huge_lock);
        if (seg->prev) seg->prev->next = seg->next;
        else heap->huge_blocks = seg->next;
        if (seg->next) seg->next->prev = seg->prev;
        pthread_mutex_unlock(&heap->huge_lock);
    }
    coral_huge_release(seg);
    coral_purger_start_if_wanted(); /* the end of a free: a safe point */
}

size_t coral_huge_usable(coral_segment_t *seg, const void *p) {
    coral_page_t *page = &seg->pages[0];
    return (size_t)(page->start + page->block_size - (const uint8_t *)p);
}

/* Resize a huge block: the pages move (mremap), the bytes are not copied.
 * The caller owns p, so no other thread looks the segment up meanwhile; the
 * map entries are cleared before the old range can be reused by anyone. */
/* Resize a huge segment's mapping to `total` bytes, keeping its pages: a
 * shrink unmaps the tail, a growth extends in place or moves the pages
 * (mremap: no byte is copied). The caller owns the segment, so no other
 * thread looks it up meanwhile; its map entries are cleared before the old
 * range can be anybody else's. NULL (errno ENOMEM): unchanged. */
static coral_segment_t *huge_resize(coral_segment_t *seg, size_t total) {
    size_t old_total = seg->size;
    if (total == old_total) return seg;
    coral_segment_map_set(seg, old_total, false);
    if (total < old_total) {
        coral_os_unmap(coral_segment_base(seg) + total, old_total - total);
    } else {
        coral_segment_t *moved = coral_os_remap_aligned(seg, old_total, total, CORAL_SEGMENT_SIZE);
        if (moved == NULL) {
            coral_segment_map_set(seg, old_total, true);
            errno = ENOMEM;
            return NULL;
        }
        seg = moved;
    }
    seg->size = total;
    coral_segment_map_set(seg, total, true);
    return seg;
}

void *coral_huge_realloc(coral_segment_t *seg, void *p, size_t size) {
    size_t offset = (size_t)((uint8_t *)p - coral_segment_base(seg));
    if (size > CORAL_MAX_REQUEST - offset) {
        errno = ENOMEM;
        return NULL;
    }
    size_t total = align_up(offset + size, CORAL_OS_PAGE_SIZE);
    if (total > seg->size || total + seg->size / 4 < seg->size) {
        /* Outside the mapping, or much smaller: resize it. */
        seg = huge_resize(seg, total);
        if (seg == NULL) return NULL;
    }
    int64_t delta = (int64_t)(total - offset) - (int64_t)seg->pages[0].block_size;
    coral_stat_count(&coral_gstats.huge_bytes, delta);
    seg->pages[0].start = coral_segment_base(seg) + offset;
    seg->pages[0].block_size = total - offset;
    return seg->pages[0].start;
}
