/* Large blocks (above the largest size class, up to what a segment holds)
 * and huge blocks (bigger: a segment of their own).
 *
 * A large block is a page of one block: a span of 64 KiB slices taken from
 * one of the thread's segments, so freeing it returns the span to the
 * segment, and the next large request of the thread reuses it without a
 * system call. Its page sits in the heap's full queue, so frees from other
 * threads reach the owner through heap->delayed_free (page.c).
 *
 * A huge block is mapped on its own, 4 MiB-aligned, with a 64 KiB header
 * (the segment header) before the block; realloc moves its pages with
 * mremap instead of copying bytes. */
#include <errno.h>
#include <string.h>

#include "internal.h"
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
    if (size + extra > CORAL_LARGE_MAX_SIZE) return coral_huge_alloc(size, alignment, zero);

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

void *coral_huge_alloc(size_t size, size_t alignment, bool zero) {
    (void)zero; /* fresh mappings read as zero */
    size_t offset = huge_offset(alignment);
    if (size > CORAL_MAX_REQUEST - offset) {
        errno = ENOMEM;
        return NULL;
    }
    size_t total = align_up(offset + size, CORAL_OS_PAGE_SIZE);
    /* The block starts `offset` (>= the alignment) after the segment: align
     * the segment to the alignment too when that is more than 4 MiB. */
    size_t seg_align = alignment > CORAL_SEGMENT_SIZE ? alignment : CORAL_SEGMENT_SIZE;
    coral_segment_t *seg = coral_os_map_aligned(total, seg_align);
    if (seg == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    seg->kind = CORAL_SEGMENT_HUGE;
    seg->size = total;
    atomic_store_explicit(&seg->thread_id, 0, memory_order_relaxed);
    /* Every slice descriptor of the first 4 MiB leads to pages[0]. */
    for (size_t i = 1; i < CORAL_SLICES_PER_SEGMENT; i++) coral_slice_mark_interior(&seg->pages[i], i);
    coral_page_t *page = &seg->pages[0];
    page->slice_count = 1;
    page->class_idx = CORAL_CLASS_LARGE;
    page->start = coral_segment_base(seg) + offset;
    page->block_size = total - offset;
    page->used = page->capacity = page->reserved = 1;
    coral_segment_map_set(seg, total, true);
    coral_stat_count(&coral_gstats.huge_allocs, 1);
    coral_stat_gauge(&coral_gstats.segments, &coral_gstats.segments_peak, 1);
    return page->start;
}

void coral_huge_free(coral_segment_t *seg) {
    coral_segment_map_set(seg, seg->size, false);
    coral_stat_count(&coral_gstats.segments, -1);
    coral_os_unmap(seg, seg->size);
}

size_t coral_huge_usable(coral_segment_t *seg, const void *p) {
    return (size_t)(coral_segment_base(seg) + seg->size - (const uint8_t *)p);
}

/* Resize a huge block: the pages move (mremap), the bytes are not copied.
 * The caller owns p, so no other thread looks the segment up meanwhile; the
 * map entries are cleared before the old range can be reused by anyone. */
void *coral_huge_realloc(coral_segment_t *seg, void *p, size_t size) {
    size_t offset = (size_t)((uint8_t *)p - coral_segment_base(seg));
    if (size > CORAL_MAX_REQUEST - offset) {
        errno = ENOMEM;
        return NULL;
    }
    size_t old_total = seg->size, total = align_up(offset + size, CORAL_OS_PAGE_SIZE);
    if (total == old_total) return p;
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
    seg->pages[0].start = coral_segment_base(seg) + offset;
    seg->pages[0].block_size = total - offset;
    coral_segment_map_set(seg, total, true);
    return seg->pages[0].start;
}
