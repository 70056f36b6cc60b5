/* Layer 6, api: the calls programs make.
 *
 * It owns: the malloc family and its coral_ names, first-class heaps'
 * calls (alloc.c: one fast path, one slow path and one realloc for the
 * thread's heap and user heaps alike: a heap is a parameter), the malloc
 * override and glibc's names (override.c), the C++ operators
 * (override_new.cc), bulk allocation and free (bulk.c) with the per-thread
 * bulk cache (bulk_cache.c), and introspection: statistics output and
 * options by name (introspect.c).
 *
 * This header holds the fast paths, inlined into every entry point. malloc:
 * one TLS load, one table load (heap->direct), a pop from the page's free
 * list. free: the segment map says the pointer is ours, the segment and
 * page come from arithmetic, and when the calling thread owns the segment
 * the block is pushed on the page's free list, where the next malloc of
 * the class takes it again. No lock and no atomic read-modify-write on
 * either path. */
#ifndef CORAL_API_H
#define CORAL_API_H

#include <errno.h>
#include <string.h>

#include "heap/heap.h"

/* CORAL_STATS builds: count n frees of class cls on the calling thread. */
CORAL_INLINE void coral_count_frees(unsigned cls, uint64_t n) {
#if CORAL_STATS_ENABLED
    coral_heap_t *heap = coral_tls_heap;
    if (heap != &coral_heap_empty)
        coral_heap_count(heap, frees, cls, n);
    else
        coral_count(&coral_counters.class_frees[cls], (int64_t)n);
#else
    (void)cls;
    (void)n;
#endif
}

/* ---- slow paths (alloc.c) --------------------------------------------------- */

/* The first page of the class of size has no free block, or the thread is
 * not set up yet: periodic work, other threads' frees, the next page. */
void *coral_malloc_refill(size_t size, coral_heap_t *heap, bool zero);
/* A heap the profiler counts (no_direct, api/profile.h): an allocation of
 * it, counted (malloc's: without the test of zero). */
void *coral_alloc_profiled(size_t size, coral_heap_t *heap, bool zero);
void *coral_malloc_profiled(size_t size, coral_heap_t *heap);
/* A heap the profiler does not count: every size above
 * CORAL_DIRECT_MAX_SIZE, large and huge, first calls. */
void *coral_malloc_unprofiled(size_t size, coral_heap_t *heap, bool zero);
/* The sizes the fast path does not serve, any heap: a heap the profiler
 * counts, whose every allocation comes here (direct_end 0), goes to its
 * counted path with two instructions (zero is a constant where the fast
 * path inlines this), one jump taken and no register moved; laid out for
 * it (coral_likely: a tight loop of small mallocs pays each jump taken),
 * since the other sizes' allocations cost far more than a jump. */
CORAL_INLINE void *coral_malloc_slow(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_likely(heap->no_direct))
        return zero ? coral_alloc_profiled(size, heap, true) : coral_malloc_profiled(size, heap);
    return coral_malloc_unprofiled(size, heap, zero);
}
/* The profiling library's malloc (coral_malloc_counted_inline) took heap's
 * countdown below 0, its block still on its page: a counted heap's
 * allocation then is sampled; a heap not counted (profiling off in that
 * library) gets a countdown that never runs out, and its block. */
void *coral_malloc_countdown_out(size_t size, coral_heap_t *heap);
/* coral_malloc_slow out of line (zero not a constant). */
void *coral_malloc_generic(size_t size, coral_heap_t *heap, bool zero);
/* A pointer not in a segment's first chunk: NULL, a huge block's later
 * part, or not ours. */
void coral_free_slow(void *p);
void *coral_malloc_aligned_in(coral_heap_t *heap, size_t size, size_t alignment, bool zero);
/* The calling thread's heap, set up now if it was not; NULL: no memory. */
coral_heap_t *coral_heap_ready(void);

/* coral_heap_visit's walk (heap_visit.c), heap set up or the empty heap:
 * the blocks its pages hold apart from their free lists (the caller gives
 * back the bulk cache's and the profiler's batches first). */
int coral_heap_walk(coral_heap_t *heap, coral_block_visit_fn fn, void *arg);

/* ---- the fast paths ------------------------------------------------------------ */

/* A block of size bytes (at most CORAL_DIRECT_MAX_SIZE) off the free list
 * of heap's direct[] page for it, or NULL when that list is empty (*pagep
 * is the page either way). The pop that malloc and the bulk calls share;
 * the caller clears the block's freed mark (page.h) as it hands it out,
 * after calloc's look at it (coral_block_is_zero). */
/* block, the first of page's free list (page a page of heap), taken off it. */
CORAL_INLINE void coral_take_first(coral_heap_t *heap, coral_page_t *page, coral_block_t *block) {
    page->free = coral_block_next(block);
    page->used++;
    coral_heap_count(heap, allocs, page->class_idx, 1);
}

CORAL_INLINE coral_block_t *coral_pop_direct(coral_heap_t *heap, size_t size,
                                             coral_page_t **pagep) {
    coral_page_t *page = heap->direct[size];
    *pagep = page;
    coral_block_t *block = page->free;
    if (coral_unlikely(block == NULL)) return NULL;
    coral_take_first(heap, page, block);
    return block;
}

/* malloc (zero: calloc) from heap, without the secure build's checks: the
 * fast path for small sizes. */
CORAL_INLINE void *coral_heap_alloc_plain(coral_heap_t *heap, size_t size, bool zero) {
    /* Above CORAL_DIRECT_MAX_SIZE, or the empty heap (direct_end 0). */
    if (coral_unlikely(size >= heap->direct_end)) return coral_malloc_slow(size, heap, zero);
    coral_page_t *page;
    coral_block_t *block = coral_pop_direct(heap, size, &page);
    if (coral_unlikely(block == NULL)) return coral_malloc_refill(size, heap, zero);
    if (zero) {
        if (coral_block_is_zero(page, block))
            block->next = NULL;
        else
            memset(block, 0, size);
    }
    coral_freed_mark_clear(block); /* (the block has 16 bytes, size may be less) */
    CORAL_RETURN_REGISTER(block);  /* the slow paths above stay tail calls */
    return block;
}

/* malloc in the profiling library (libcoralloc-profile.so, built with
 * CORAL_PROFILE_LIB: what `coralloc run --profile` preloads): the default
 * build's pop with the profiler's countdown charged inline, two
 * instructions more than coral_heap_alloc_plain, where a counted heap of
 * the default library sends every allocation through coral_malloc_slow's
 * counted path. Its size bound is a constant, not direct_end (0 in a
 * counted heap, api/profile.h), so it reads direct[] of every heap: the
 * empty heap's names coral_page_empty in this library (heap/thread.c),
 * whose list is always empty, so a thread's first call misses before it
 * writes anything. The countdown is charged only once the block is found,
 * so a miss (coral_malloc_slow, counted there) is charged once. A heap
 * not counted (profiling off) runs its countdown out once, and gets one
 * that never ends (coral_malloc_countdown_out). */
CORAL_INLINE void *coral_malloc_counted_inline(size_t size) {
    coral_heap_t *heap = coral_tls_heap;
    if (coral_unlikely(size >= CORAL_DIRECT_COUNT)) return coral_malloc_slow(size, heap, false);
    coral_page_t *page = heap->direct[size];
    coral_block_t *block = page->free;
    if (coral_unlikely(block == NULL)) return coral_malloc_slow(size, heap, false);
    if (coral_unlikely((heap->profile_left -= (int64_t)size) < 0))
        return coral_malloc_countdown_out(size, heap);
    coral_take_first(heap, page, block);
    coral_freed_mark_clear(block);
    CORAL_RETURN_REGISTER(block); /* (the slow paths above stay tail calls) */
    return block;
}

/* The secure build's malloc(0) (alloc.c): an inaccessible slot. */
void *coral_secure_alloc_zero(coral_heap_t *heap);
/* CORAL_VALGRIND builds' malloc (alloc.c): the block told to memcheck. */
void *coral_valgrind_alloc(coral_heap_t *heap, size_t size, bool zero);

/* malloc (zero: calloc) from heap: what every allocating call goes through.
 * The secure build asks for room for the canary; a block of a size class
 * is checked and gets its canary where it is popped (page.h: here, or in
 * the slow paths' page_pop), a large one in coral_heap_malloc_large. The
 * slow paths clear what zero asks after the check (large and huge blocks:
 * fresh memory stays untouched). */
CORAL_INLINE void *coral_heap_alloc_inline(coral_heap_t *heap, size_t size, bool zero) {
    if (CORAL_VALGRIND) return coral_valgrind_alloc(heap, size, zero);
    if (!CORAL_SECURE) return coral_heap_alloc_plain(heap, size, zero);
    /* 1 .. the largest size whose block a direct[] page holds (0 wraps). */
    if (coral_likely(size - 1 < CORAL_DIRECT_MAX_SIZE - CORAL_CANARY_SIZE)) {
        coral_page_t *page;
        coral_block_t *block = coral_pop_direct(heap, size + CORAL_CANARY_SIZE, &page);
        if (coral_unlikely(block == NULL))
            return coral_malloc_refill(size + CORAL_CANARY_SIZE, heap, zero);
        /* A direct[] page: a class of at most CORAL_DIRECT_MAX_SIZE bytes,
         * whose spacing (page.h) leaves a slack below 64: no mask. */
        return coral_secure_small_out(page, block, size, SIZE_MAX, zero);
    }
    if (coral_unlikely(size == 0)) return coral_secure_alloc_zero(heap);
    return coral_malloc_generic(coral_secure_inner_size(size), heap, zero);
}

CORAL_INLINE void *coral_malloc_inline(size_t size) {
    return coral_heap_alloc_inline(coral_tls_heap, size, false);
}

CORAL_INLINE void *coral_heap_calloc_inline(coral_heap_t *heap, size_t n, size_t size) {
    size_t total;
    if (coral_unlikely(__builtin_mul_overflow(n, size, &total))) {
        errno = ENOMEM;
        return NULL;
    }
    return coral_heap_alloc_inline(heap, total, true);
}

/* A free the fast path leaves: a flagged slice (a full, aligned or
 * interior page, a released span), a block freed twice in a row, another
 * thread's segment, a huge block (alloc.c). */
void coral_free_unusual(coral_segment_t *seg, coral_page_t *slice, void *p);

/* The secure build's free of a block its fast path did not take
 * (alloc.c): the checks that name the misuse, then the free. */
void coral_secure_free_checked(coral_segment_t *seg, coral_page_t *slice, void *p);

/* A free told the block's size (size > 0: free_sized, C++'s sized
 * deletes; `call` names it) that its fast path did not take: the block
 * checked (a size above its usable bytes is a misuse), then freed. */
void coral_free_sized_checked(void *p, size_t size, const char *call);
/* free_aligned_sized as `call` names it (C++'s aligned deletes). */
void coral_free_aligned_sized_as(void *p, size_t alignment, size_t size, const char *call);

/* The owner's free of block, a block of page: pushed on free, so the
 * next malloc of the class reuses it (coral_page_push_free). */
CORAL_INLINE void coral_free_push_local_uncounted(coral_page_t *page, coral_block_t *block) {
    coral_page_push_free(page, block);
    /* The default build's fast path frees no block larger than a slice
     * (page.h, "block starts": X is 0), so none too big to keep. */
    if (coral_unlikely(--page->used == 0) &&
        (CORAL_START_CHECK ? page->link.prev != NULL : coral_heap_retire_when_empty(page)))
        coral_heap_page_retire(page);
}
_Static_assert(CORAL_SLICE_SIZE <= CORAL_KEEP_EMPTY_MAX_BLOCK, "the fast path keeps what it frees");

CORAL_INLINE void coral_free_push_local(coral_page_t *page, coral_block_t *block) {
    coral_count_frees(page->class_idx, 1);
    coral_free_push_local_uncounted(page, block);
}

#if CORAL_SECURE
/* block, of page, takes a slot of the ring r (the calling thread's:
 * coral_ring_tls, r->busy set by coral_heap_ring_enter) drawn at random,
 * and the block that held it is returned, its page in *old_page; r->busy
 * is cleared after the swap, with a signal fence, so that the compiler
 * keeps the ring's stores before it. */
CORAL_INLINE coral_block_t *coral_ring_take(coral_ring_t *r, coral_page_t *page,
                                            coral_block_t *block, coral_page_t **old_page) {
    uint64_t draw = r->draw * CORAL_RING_MUL;
    r->draw = draw;
    size_t i = (size_t)(draw >> (64 - CORAL_RING_SLOT_BITS));
    coral_block_t *old = r->blocks[i];
    *old_page = r->pages[i];
    coral_test_point(CORAL_TP_RING_SWAP, block);
    r->blocks[i] = block;
    r->pages[i] = page;
    coral_heap_ring_exit(r);
    return old;
}
#endif

/* The secure build's fast free of block, of page (checked; counted here,
 * where the program freed it; `usable`: the page's owner_usable_size;
 * `freed`: its freed mark, written here, after the ring's fill, which
 * covers a 16-byte block's mark word): it gets the ring's fill (page.h)
 * and takes a slot, drawn at random, of the thread's ring (heap.h); the
 * block that held the slot goes back to its page, its fill checked, here
 * when its page is still the caller's and unflagged (not full, say:
 * coral_heap_ring_out_slow takes the rest, and an empty slot's
 * coral_ring_idle, whose tid_flags are 0). Each slot is taken before its
 * old block goes back (which may retire a page and so free again on this
 * thread). A block of more than CORAL_RING_MAX_USABLE bytes goes back at
 * once. The draw and the swap are made with the ring busy (heap.h: a free
 * in a signal handler that interrupts them finds it so, and its block
 * goes back at once). No branch depends on the block's size below
 * CORAL_RING_MAX_USABLE (page.h: the fill's offsets come from a table by
 * class). */
CORAL_INLINE void coral_secure_ring_put(coral_page_t *page, coral_block_t *block, size_t usable,
                                        uint64_t freed) {
#if CORAL_SECURE
    coral_ring_t *r = &coral_ring_tls;
    coral_page_t *old_page;
    coral_block_t *old;
    coral_vec2_t fill = coral_ring_fill_vec();
#if defined(__SSE2__)
    /* (Kept in its register for the check: GCC would load it again.) */
    __asm__("" : "+x"(fill));
#endif
    coral_count_frees(page->class_idx, 1);
    if (coral_unlikely(usable > CORAL_RING_MAX_USABLE)) {
        *(uint64_t *)(void *)((uint8_t *)block + usable) = freed;
        coral_heap_ring_bypass(page, block); /* (heap.h: blocks of few-block pages) */
        return;
    }
    coral_secure_ring_fill(page, (uint8_t *)block, usable, freed, fill);
    if (coral_unlikely(coral_heap_ring_enter(r))) {
        coral_heap_ring_bypass(page, block);
        return;
    }
    old = coral_ring_take(r, page, block, &old_page);
    if (coral_likely(coral_slice_tid_flags(old_page) == coral_thread_id()) &&
        coral_likely(coral_secure_ring_intact(old_page, (uint8_t *)old, fill))) {
        coral_free_push_local_uncounted(old_page, old);
        return;
    }
    coral_heap_ring_out_slow(old_page, old);
#else
    (void)usable, (void)freed;
    coral_free_push_local(page, block);
#endif
}

/* free() of p, a pointer into the first chunk of seg (slice: its slice
 * descriptor), by any thread. One compare says the calling thread owns the
 * page and no flag is set (tid_flags, segment.h): then p lies in the
 * page's head slice; a multiply and a compare say it is a block start
 * there (page.h, "block starts"), and one more that the block does not
 * hold the page's freed mark (it may be free: the unusual path checks).
 * A page that becomes empty is retired unless it is the first of its
 * class queue (link.prev == NULL), which the next malloc of the class
 * would take again at once, and its blocks are small enough to keep
 * (coral_heap_retire_when_empty). A sized free (size > 0) takes the fast
 * path when the block holds size bytes too (a block start there: its
 * block_size); free's size is the constant 0, which every block holds. */
CORAL_INLINE void coral_free_in_segment(coral_segment_t *seg, coral_page_t *slice, void *p,
                                        size_t size, const char *call) {
    coral_block_t *block = p;
    if (coral_likely(coral_slice_tid_flags(slice) == coral_thread_id()) &&
        coral_likely(coral_block_start_fast(slice, p)) &&
        coral_likely(CORAL_FREED_MARKS ? !coral_freed_mark_seen(block) : block != slice->free) &&
        coral_likely(size <= slice->block_size)) {
        coral_free_push_local(slice, block);
        return;
    }
    if (size != 0)
        coral_free_sized_checked(p, size, call);
    else
        coral_free_unusual(seg, slice, p);
}

/* The same in the secure build: the owner's free of a block whose checks
 * pass (page.h; a sized free's size > 0: the block's request) is pushed
 * at once; every other free (another thread's, a flagged slice, a misuse)
 * takes the checked path. */
CORAL_INLINE void coral_secure_free_in_segment(coral_segment_t *seg, coral_page_t *slice, void *p,
                                               size_t size, const char *call) {
    if (coral_likely(coral_slice_tid_flags(slice) == coral_thread_id())) {
        /* Read only by the owner (its line of the descriptor, which no other
         * thread touches: a remote free must not pull it in), and once,
         * before the mark's store: the empty asm keeps it in a register, as
         * the store could alias it for all the compiler knows. */
        size_t usable = slice->owner_usable_size;
        __asm__("" : "+r"(usable));
        uint64_t freed;
        if (coral_likely(coral_secure_free_fast(slice, p, size, &freed))) {
            coral_secure_ring_put(slice, p, usable, freed);
            return;
        }
    }
    if (size != 0)
        coral_free_sized_checked(p, size, call);
    else
        coral_secure_free_checked(seg, slice, p);
}

/* free() of p, or, with size > 0, a sized free (`call` names it). */
CORAL_INLINE void coral_free_sized_inline(void *p, size_t size, const char *call) {
    if (CORAL_VALGRIND && p != NULL) CORAL_VG(VALGRIND_FREELIKE_BLOCK(p, 0));
    uintptr_t a = (uintptr_t)p, chunk = coral_opaque(a >> CORAL_SEGMENT_SHIFT);
    /* NULL lands here too: the first 4 MiB of the address space is never a
     * segment. */
    if (coral_unlikely(coral_map_kind_of_chunk(chunk) != CORAL_MAP_SEGMENT)) {
        if (size != 0)
            coral_free_sized_checked(p, size, call);
        else
            coral_free_slow(p);
        return;
    }
    /* The segment from the chunk number the map was indexed with. */
    coral_segment_t *seg = (coral_segment_t *)(chunk << CORAL_SEGMENT_SHIFT);
    /* The slice's own descriptor: the page's head unless its flags say
     * INTERIOR (a later slice of a multi-slice page), which the unusual
     * path resolves. */
    coral_page_t *slice = coral_segment_slice_of(seg, p);
    /* The secure build checks the block (page.h); a misuse reported on
     * the checked path (with CORALLOC_ON_ERROR=warn) leaves it alone. */
    if (CORAL_SECURE)
        coral_secure_free_in_segment(seg, slice, p, size, call);
    else
        coral_free_in_segment(seg, slice, p, size, call);
}

CORAL_INLINE void coral_free_inline(void *p) { coral_free_sized_inline(p, 0, NULL); }

#endif /* CORAL_API_H */
