/* The allocation API (coral_ names) and the slow paths behind alloc.h. */
#include <errno.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"
#include "stash.h"
#include "stats.h"

/* The calling thread's heap, set up on first use. NULL only when the OS
 * has no memory for it. */
static coral_heap_t *heap_ready(void) {
    coral_heap_t *heap = coral_tls_heap;
    if (coral_unlikely(heap == &coral_heap_empty)) heap = coral_thread_init();
    return heap;
}

static void *enomem(void) {
    errno = ENOMEM;
    return NULL;
}

/* Work done now and then on the slow paths: start the purge thread when
 * it is wanted, and purge from this thread every 256th time. */
void coral_periodic_work(coral_heap_t *heap) {
    coral_purger_start_if_wanted();
    if ((++heap->heartbeat & 255) == 0) coral_purge_tick();
}

/* A block off page's free list (it has one), for a request of size bytes
 * of class cls; zero: cleared. */
CORAL_INLINE void *page_pop(coral_heap_t *heap, coral_page_t *page, unsigned cls, size_t size,
                            bool zero) {
    coral_block_t *block = page->free;
    page->free = block->next;
    page->used++;
    (void)heap; /* both read by the statistics only, when compiled in */
    (void)cls;
    coral_stat_inc(heap->stat_allocs[cls]);
    if (zero) {
        if (!page->free_is_zero) return memset(block, 0, size);
        block->next = NULL;
    }
    return block;
}

/* A thread's first allocation: set it up. */
static CORAL_NOINLINE void *malloc_first(size_t size, bool zero) {
    coral_heap_t *heap = coral_thread_init();
    if (heap == NULL) return enomem();
    return coral_malloc_generic(size, heap, zero);
}

/* The first page of the class of size (at most CORAL_CLASS_MAX_SIZE) has no
 * free block, or the thread is not set up yet: the slow path's periodic
 * work and other threads' frees, then the next page with a free block. */
void *coral_malloc_refill(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_unlikely(heap == &coral_heap_empty)) return malloc_first(size, zero);
    unsigned cls = coral_size_class(size);
    coral_periodic_work(heap);
    coral_page_t *page = coral_heap_find_page(heap, cls); /* takes other threads' frees first */
    if (page == NULL) return enomem();
    return page_pop(heap, page, cls, size, zero);
}

/* The other sizes: above CORAL_DIRECT_MAX_SIZE (no direct[] entry: their
 * pop is here, from the first page of their class, as direct[] pages are;
 * it saves no register), large and huge sizes, a thread's first call. */
void *coral_malloc_generic(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_unlikely(heap == &coral_heap_empty)) return malloc_first(size, zero);
    if (size > CORAL_CLASS_MAX_SIZE) return coral_malloc_large(heap, size, 0, zero);
    unsigned cls = coral_size_class(size);
    coral_page_t *page = heap->queues[cls].first;
    if (coral_unlikely(page == NULL || page->free == NULL))
        return coral_malloc_refill(size, heap, zero);
    return page_pop(heap, page, cls, size, zero);
}

/* ---- free -------------------------------------------------------------------------- */

/* Not a pointer into the start chunk of a segment: NULL, a huge block's
 * later part (an aligned huge block), or not ours. */
void coral_free_slow(void *p) {
    if (p == NULL) return;
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL)
        coral_fatal("free(): invalid pointer %p (not allocated by coralloc)", p);
    coral_count_free(CORAL_CLASS_LARGE);
    coral_free_remote(seg, &seg->pages[0], p); /* huge segments only get here */
}

/* ---- usable size ---------------------------------------------------------------------- */

static size_t usable_size_of(coral_segment_t *seg, const void *p) {
    if (seg->kind == CORAL_SEGMENT_HUGE) return coral_huge_usable(seg, p);
    coral_page_t *page = coral_segment_page_of(seg, p);
    if (page->slice_count == 0) return 0;
    uint8_t *block = (uint8_t *)p;
    if (page->shared_flags & CORAL_PAGE_HAS_ALIGNED)
        block = coral_page_block_start(page, p);
    return (size_t)(block + page->block_size - (const uint8_t *)p);
}

size_t coral_malloc_usable_size(const void *p) {
    if (p == NULL) return 0;
    coral_segment_t *seg = coral_segment_of_any(p);
    return seg ? usable_size_of(seg, p) : 0;
}

int coral_owns(const void *p) { return p != NULL && coral_segment_of_any(p) != NULL; }

size_t coral_good_size(size_t size) {
    if (size <= CORAL_CLASS_MAX_SIZE) return coral_class_size(coral_size_class(size));
    if (size > CORAL_MAX_REQUEST) return 0;
    if (size <= CORAL_LARGE_MAX_SIZE)
        return (size + CORAL_SLICE_SIZE - 1) & ~(CORAL_SLICE_SIZE - 1);
    /* huge: the block starts after the 64 KiB header, ends at an OS page */
    return ((CORAL_SLICE_SIZE + size + CORAL_OS_PAGE_SIZE - 1) & ~(CORAL_OS_PAGE_SIZE - 1)) -
           CORAL_SLICE_SIZE;
}

/* ---- the standard calls ---------------------------------------------------------------- */

void *coral_malloc(size_t size) { return coral_malloc_inline(size); }
void coral_free(void *p) { coral_free_inline(p); }
void *coral_calloc(size_t n, size_t size) { return coral_calloc_inline(n, size); }

static void check_sized_free(void *p, size_t size) {
    size_t usable = coral_malloc_usable_size(p);
    if (coral_unlikely(p != NULL && size > usable))
        coral_fatal("free_sized(%p, %zu): the block has only %zu bytes", p, size, usable);
}

void coral_free_sized(void *p, size_t size) {
    check_sized_free(p, size);
    coral_free_inline(p);
}

void coral_free_aligned_sized(void *p, size_t alignment, size_t size) {
    if (coral_unlikely(((uintptr_t)p & (alignment - 1)) != 0))
        coral_fatal("free_aligned_sized(%p): not aligned to %zu", p, alignment);
    coral_free_sized(p, size);
}

/* Aligned allocation; alignment is a power of two. */
void *coral_malloc_aligned_in(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    if (alignment <= CORAL_ALIGNMENT)
        return zero ? coral_calloc_inline(1, size) : coral_malloc_inline(size);
    if (size > CORAL_MAX_REQUEST || alignment > CORAL_MAX_REQUEST) return enomem();
    if (size == 0) size = 1; /* rounds up to one alignment unit below */
    if (heap == &coral_heap_empty && (heap = heap_ready()) == NULL) return enomem();
    if (alignment <= CORAL_SLICE_SIZE) {
        /* Every block of a class whose size is a multiple of the alignment
         * is aligned (pages start on a 64 KiB boundary). The class of
         * rounded (a multiple of the alignment A) always is such a class:
         * classes are the multiples of a step (16, or 1/8 of the power of
         * two below); if A <= step, the class is a multiple of A; if
         * A > step, rounded is a multiple of the step, so it is a class. */
        size_t rounded = (size + alignment - 1) & ~(alignment - 1);
        if (rounded <= CORAL_CLASS_MAX_SIZE) return coral_malloc_generic(rounded, heap, zero);
    }
    return coral_malloc_large(heap, size, alignment, zero);
}

static bool is_power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

int coral_posix_memalign(void **out, size_t alignment, size_t size) {
    if (!is_power_of_two(alignment) || alignment % sizeof(void *) != 0) return EINVAL;
    int saved = errno;
    void *p = coral_malloc_aligned_in(coral_tls_heap, size, alignment, false);
    if (p == NULL) {
        errno = saved;
        return ENOMEM;
    }
    *out = p;
    return 0;
}

void *coral_memalign(size_t alignment, size_t size) {
    if (!is_power_of_two(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    return coral_malloc_aligned_in(coral_tls_heap, size, alignment, false);
}

void *coral_aligned_alloc(size_t alignment, size_t size) { return coral_memalign(alignment, size); }

void *coral_valloc(size_t size) {
    return coral_malloc_aligned_in(coral_tls_heap, size, CORAL_OS_PAGE_SIZE, false);
}

void *coral_pvalloc(size_t size) {
    if (size > CORAL_MAX_REQUEST) return enomem();
    size_t rounded = (size + CORAL_OS_PAGE_SIZE - 1) & ~(CORAL_OS_PAGE_SIZE - 1);
    if (rounded == 0) rounded = CORAL_OS_PAGE_SIZE;
    return coral_malloc_aligned_in(coral_tls_heap, rounded, CORAL_OS_PAGE_SIZE, false);
}

/* ---- realloc ---------------------------------------------------------------------------- */

static void *realloc_move(void *p, size_t old_usable, size_t size) {
    void *q = coral_malloc_inline(size);
    if (q == NULL) return NULL;
    size_t copy = old_usable < size ? old_usable : size;
    /* Before the copy writes it (populate.c). A copy of at most 56 KiB
     * spans at most 15 OS pages, below CORAL_POPULATE_MIN_BYTES: the common
     * small realloc makes no call here. */
    if (copy > CORAL_POPULATE_MIN_BYTES - 2 * CORAL_OS_PAGE_SIZE && coral_populate_adaptive())
        coral_populate_copy(q, copy);
    memcpy(q, p, copy);
    coral_free_inline(p);
    return q;
}

void *coral_realloc(void *p, size_t size) {
    if (p == NULL) return coral_malloc_inline(size);
    if (size == 0) { /* glibc's behaviour: free and return NULL */
        coral_free_inline(p);
        return NULL;
    }
    if (size > CORAL_MAX_REQUEST) return enomem();
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL) coral_fatal("realloc(): invalid pointer %p (not allocated by coralloc)", p);
    size_t usable = usable_size_of(seg, p);
    if (seg->kind == CORAL_SEGMENT_HUGE) {
        if (size > CORAL_LARGE_MAX_SIZE) return coral_huge_realloc(seg, p, size);
        return realloc_move(p, usable, size);
    }
    coral_page_t *page = coral_segment_page_of(seg, p);
    if (page->slice_count == 0) coral_fatal("realloc(): invalid pointer %p (freed block?)", p);
    bool owner = atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == coral_thread_id();
    if (page->class_idx == CORAL_CLASS_LARGE && owner && size > CORAL_CLASS_MAX_SIZE &&
        size <= CORAL_LARGE_MAX_SIZE) {
        void *q = coral_realloc_large_in_place(page, p, size);
        if (q != NULL) return q;
    } else if (size <= usable && size >= usable / 2) {
        return p; /* shrinking by less than half: keep the block */
    }
    return realloc_move(p, usable, size);
}

void *coral_reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return enomem();
    return coral_realloc(p, total);
}

/* ---- collection ---------------------------------------------------------------------------- */

void coral_collect(int force) {
    /* A forced collect adopts abandoned segments, which needs a heap. */
    coral_heap_t *heap = force ? heap_ready() : coral_tls_heap;
    if (heap != NULL && heap != &coral_heap_empty) {
        coral_stash_flush_own(heap);
        for (coral_heap_t *h = heap->tld->heaps; h != NULL; h = h->next_heap)
            coral_heap_collect(h, force != 0);
        if (force) {
            coral_segments_adopt_all(heap);
            coral_heap_collect(heap, true);
        }
    }
    coral_purge_now();
}
