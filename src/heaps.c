/* First-class heaps: coral_heap_new / coral_heap_malloc / ... /
 * coral_heap_destroy.
 *
 * Rules (docs/DESIGN.md, tested in tests/test_heaps.c):
 * - A heap belongs to the thread that created it. Only that thread may
 *   allocate from it, reset it or destroy it (others get a clear error).
 * - Any thread may free a block of a heap, with coral_heap_free, coral_free
 *   or plain free, like any other block.
 * - coral_heap_destroy frees every block of the heap at once, in time
 *   proportional to its pages; coral_heap_reset does the same and keeps the
 *   heap. A block of a destroyed or reset heap must not be used or freed
 *   again (as after free).
 * - When the owner thread exits, its heaps go with it: their live blocks
 *   stay valid and can still be freed (by any thread), the handles may not
 *   be used any more.
 */
#include <errno.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"

static coral_heap_t *heap_of_caller(coral_heap_t *heap, const char *what) {
    if (heap == NULL) return NULL;
    if (coral_unlikely(heap->tld == NULL || heap->tld->thread_id != coral_thread_id()))
        coral_fatal("%s(%p): the heap belongs to another thread (or was destroyed)", what,
                    (void *)heap);
    return heap;
}

coral_heap_t *coral_heap_new(void) {
    coral_heap_t *self = coral_tls_heap;
    if (self == &coral_heap_empty && (self = coral_thread_init()) == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    coral_heap_t *heap = coral_heap_pool_get();
    if (heap == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    coral_tld_t *tld = self->tld;
    coral_heap_init(heap, tld);
    heap->next_heap = tld->heaps;
    tld->heaps = heap;
    return heap;
}

/* For destroy and reset: the heap must also be a user heap. */
static coral_heap_t *user_heap_of_caller(coral_heap_t *heap, const char *what) {
    if (heap_of_caller(heap, what) == NULL) return NULL;
    if (heap->is_default) coral_fatal("%s: %p is a thread's own heap", what, (void *)heap);
    return heap;
}

void coral_heap_destroy(coral_heap_t *heap) {
    if (user_heap_of_caller(heap, "coral_heap_destroy") == NULL) return;
    coral_heap_release_all(heap);
    coral_tld_t *tld = heap->tld;
    for (coral_heap_t **link = &tld->heaps; *link != NULL; link = &(*link)->next_heap) {
        if (*link == heap) {
            *link = heap->next_heap;
            break;
        }
    }
    heap->tld = NULL;
    coral_heap_pool_put(heap);
}

void coral_heap_reset(coral_heap_t *heap) {
    if (user_heap_of_caller(heap, "coral_heap_reset") == NULL) return;
    coral_heap_release_all(heap);
    coral_heap_init(heap, heap->tld);
}

void *coral_heap_malloc(coral_heap_t *heap, size_t size) {
    if (heap_of_caller(heap, "coral_heap_malloc") == NULL) return coral_malloc_inline(size);
    if (coral_likely(size <= CORAL_DIRECT_MAX_SIZE)) return coral_pop_small(heap, size, false);
    return coral_malloc_generic(size, heap, false);
}

void *coral_heap_calloc(coral_heap_t *heap, size_t n, size_t size) {
    if (heap_of_caller(heap, "coral_heap_calloc") == NULL) return coral_calloc_inline(n, size);
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (coral_likely(total <= CORAL_DIRECT_MAX_SIZE)) return coral_pop_small(heap, total, true);
    return coral_malloc_generic(total, heap, true);
}

/* The heap a block was allocated from (NULL for huge blocks of a thread's
 * own heap). */
static coral_heap_t *block_heap(const void *p) {
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL) coral_fatal("coral_heap_realloc(): invalid pointer %p", p);
    coral_page_t *page = seg->kind == CORAL_SEGMENT_HUGE ? &seg->pages[0]
                                                          : coral_segment_page_of(seg, p);
    return atomic_load_explicit(&page->heap, memory_order_relaxed);
}

void *coral_heap_realloc(coral_heap_t *heap, void *p, size_t size) {
    if (heap_of_caller(heap, "coral_heap_realloc") == NULL) return coral_realloc(p, size);
    if (p == NULL) return coral_heap_malloc(heap, size);
    if (size == 0) {
        coral_free_inline(p);
        return NULL;
    }
    size_t usable = coral_malloc_usable_size(p);
    if (size <= usable && size >= usable / 2 && block_heap(p) == heap) return p;
    void *q = coral_heap_malloc(heap, size);
    if (q == NULL) return NULL;
    memcpy(q, p, usable < size ? usable : size);
    coral_free_inline(p);
    return q;
}

void coral_heap_free(coral_heap_t *heap, void *p) {
    (void)heap; /* any heap's block may be freed by anyone */
    coral_free_inline(p);
}
