/* The malloc and free fast paths, inlined into every entry point.
 *
 * malloc: one TLS load, one table load (heap->direct), pop from the page's
 * free list. free: the segment map says the pointer is ours, the segment and
 * page come from arithmetic, and when the calling thread owns the segment
 * the block is pushed on the page's local_free. No lock and no atomic
 * read-modify-write on either path. */
#ifndef CORAL_ALLOC_H
#define CORAL_ALLOC_H

#include <errno.h>
#include <string.h>

#include "internal.h"
#include "stats.h"

/* CORAL_STATS builds: count n frees of class cls on the calling thread. */
CORAL_INLINE void coral_count_frees(unsigned cls, uint64_t n) {
#if CORAL_STATS_ENABLED
    coral_heap_t *heap = coral_tls_heap;
    if (heap != &coral_heap_empty)
        __atomic_store_n(&heap->stat_frees[cls],
                         __atomic_load_n(&heap->stat_frees[cls], __ATOMIC_RELAXED) + n,
                         __ATOMIC_RELAXED);
    else atomic_fetch_add_explicit(&coral_gstats.class_frees[cls], (int64_t)n, memory_order_relaxed);
#else
    (void)cls;
    (void)n;
#endif
}

CORAL_INLINE void coral_count_free(unsigned cls) { coral_count_frees(cls, 1); }

/* A block of size bytes (at most CORAL_DIRECT_MAX_SIZE) off the free list
 * of heap's direct[] page for it, or NULL when that list is empty (*pagep
 * is the page either way). The pop that malloc and the bulk calls share. */
CORAL_INLINE coral_block_t *coral_pop_direct(coral_heap_t *heap, size_t size, coral_page_t **pagep) {
    coral_page_t *page = heap->direct[(size + 15) >> 4];
    *pagep = page;
    coral_block_t *block = page->free;
    if (coral_unlikely(block == NULL)) return NULL;
    page->free = block->next;
    page->used++;
    coral_stat_inc(heap->stat_allocs[page->class_idx]);
    return block;
}

CORAL_INLINE void *coral_pop_small(coral_heap_t *heap, size_t size, bool zero) {
    coral_page_t *page;
    coral_block_t *block = coral_pop_direct(heap, size, &page);
    if (coral_unlikely(block == NULL)) return coral_malloc_refill(size, heap, zero);
    if (zero) {
        if (page->free_is_zero) block->next = NULL;
        else memset(block, 0, size);
    }
    return block;
}

CORAL_INLINE void *coral_malloc_inline(size_t size) {
    if (coral_likely(size <= CORAL_DIRECT_MAX_SIZE)) return coral_pop_small(coral_tls_heap, size, false);
    return coral_malloc_generic(size, coral_tls_heap, false);
}

CORAL_INLINE void *coral_calloc_inline(size_t n, size_t size) {
    size_t total;
    if (coral_unlikely(__builtin_mul_overflow(n, size, &total))) {
        errno = ENOMEM;
        return NULL;
    }
    coral_heap_t *heap = coral_tls_heap;
    if (coral_likely(total <= CORAL_DIRECT_MAX_SIZE)) return coral_pop_small(heap, total, true);
    return coral_malloc_generic(total, heap, true);
}

/* free() by the segment's owner thread; slice is p's slice descriptor. */
CORAL_INLINE void coral_free_owned(coral_page_t *slice, void *p) {
    coral_block_t *block = p;
    /* Full, aligned or interior pages and a block freed twice in a row take
     * the generic path. A page that becomes empty is retired unless it is
     * the first of its class queue (prev == NULL), which the next malloc of
     * the class would take again at once. */
    if (coral_likely(slice->flags == 0 && block != slice->local_free)) {
        coral_count_free(slice->class_idx);
        block->next = slice->local_free;
        slice->local_free = block;
        if (coral_unlikely(--slice->used == 0) && slice->prev != NULL) coral_page_retire(slice);
        return;
    }
    coral_page_t *page = coral_slice_head(slice);
    coral_count_free(page->class_idx);
    coral_free_local_generic(page, p);
}

CORAL_INLINE void coral_free_inline(void *p) {
    uintptr_t a = (uintptr_t)p;
    /* NULL lands here too: the first 4 MiB of the address space is never a
     * segment. */
    if (coral_unlikely(coral_map_kind(a) != CORAL_MAP_SEGMENT)) {
        coral_free_slow(p);
        return;
    }
    coral_segment_t *seg = coral_ptr_segment(p);
    /* The slice's own descriptor: the page's head unless its flags say
     * INTERIOR (a later slice of a multi-slice page), which the generic
     * paths resolve. */
    coral_page_t *slice = coral_segment_slice_of(seg, p);
    if (coral_likely(atomic_load_explicit(&seg->thread_id, memory_order_relaxed) ==
                     coral_thread_id())) {
        coral_free_owned(slice, p);
        return;
    }
    coral_page_t *page = coral_slice_head(slice);
    coral_count_free(page->class_idx);
    coral_free_remote(seg, page, p);
}

#endif
