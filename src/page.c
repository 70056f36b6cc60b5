/* Pages: spans of slices holding blocks of one size class.
 *
 * Free lists of a page:
 *   free        the blocks malloc pops (owner only);
 *   local_free  blocks the owner freed; moved to `free` when `free` runs
 *               out, so the fast path returns to the slow path regularly;
 *   thread_free blocks other threads freed (atomic, see below).
 *
 * Remote free protocol (page->thread_free = block pointer | 2-bit state):
 *   - Any thread may push a block: CAS the head from (h, s) to (b, s) with
 *     b->next = h, release order, so the owner sees b->next.
 *   - Only the owner takes blocks: CAS (h, s) -> (NULL, s), acquire order.
 *   - State USE (set only by the owner, when the page moves to its heap's full
 *     queue): the next remote freer does not push on the page; it CASes
 *     USE -> FREEING, pushes the block on page->heap->delayed_free, then sets
 *     FREEING -> NONE. That tells the owner the page has a free block again,
 *     without the owner ever scanning its full pages.
 *   - State NEVER (set by an owner before it lets go of its heap: thread
 *     exit, coral_heap_destroy/reset): remote frees only push on the page;
 *     the heap is never touched.
 *   - The owner changes the state with a CAS loop that waits while the state
 *     is FREEING. So once an exiting owner has set NEVER on all its pages, no
 *     thread is still pushing to its heap, and the heap can be reused.
 */
#include <string.h>

#include "internal.h"

void coral_page_init(coral_heap_t *heap, coral_page_t *page, unsigned cls, size_t block_size) {
    page->free = NULL;
    page->local_free = NULL;
    page->used = 0;
    page->capacity = 0;
    page->reserved = (uint32_t)(((size_t)page->slice_count * CORAL_SLICE_SIZE) / block_size);
    __atomic_store_n(&page->flags, 0, __ATOMIC_RELAXED);
    page->free_is_zero = 0;
    page->class_idx = (uint8_t)cls;
    page->block_size = block_size;
    page->next = page->prev = NULL;
    atomic_store_explicit(&page->thread_free, CORAL_DELAY_NONE, memory_order_relaxed);
    atomic_store_explicit(&page->heap, heap, memory_order_release);
}

/* Carve more blocks out of the span onto the (empty) free list: 4 KiB worth,
 * or 16 blocks when that is more (at most 16 KiB), so memory is touched only
 * as it is needed. The blocks carved first keep circulating between free and
 * local_free, so the count also sets how often a page's free list runs dry
 * and malloc takes the slow path. */
void coral_page_extend(coral_page_t *page) {
    size_t bs = page->block_size;
    size_t span = bs < 1024 ? 16 * bs : 16 * 1024;
    if (span < CORAL_OS_PAGE_SIZE) span = CORAL_OS_PAGE_SIZE;
    uint32_t step = span > bs ? (uint32_t)(span / bs) : 1u;
    uint32_t n = page->reserved - page->capacity;
    if (n > step) n = step;
    uint8_t *first = page->start + (size_t)page->capacity * bs;
    uint8_t *last = first + (size_t)(n - 1) * bs;
    for (uint8_t *b = first; b < last; b += bs) ((coral_block_t *)b)->next = (coral_block_t *)(b + bs);
    ((coral_block_t *)last)->next = NULL;
    page->free = (coral_block_t *)first;
    page->capacity += n;
    page->free_is_zero = page->is_fresh;
}

/* Owner: every block of the page is free again (used is 0, so no block is
 * on thread_free or on its way there: each of those still counts in used).
 * Forget the free lists and carve the blocks again from the first: they
 * are then handed out by address, no list to walk. The span is no longer
 * fresh: blocks carved again are not zero. */
void coral_page_reset_empty(coral_page_t *page) {
    page->free = NULL;
    page->local_free = NULL;
    page->capacity = 0;
    page->free_is_zero = 0;
    page->is_fresh = 0;
}

/* Owner: take the remote-freed blocks onto local_free. */
bool coral_page_thread_free_collect(coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    do {
        if ((tf & ~CORAL_DELAY_MASK) == 0) return false;
    } while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf & CORAL_DELAY_MASK,
                                                    memory_order_acquire, memory_order_relaxed));
    coral_block_t *head = (coral_block_t *)(tf & ~CORAL_DELAY_MASK), *tail = head;
    uint32_t count = 1;
    while (tail->next != NULL) {
        tail = tail->next;
        if (++count > page->used)
            coral_fatal("double free detected: more blocks freed than allocated in a page of "
                        "%zu-byte blocks (block %p)", page->block_size, (void *)tail);
    }
    if (count > page->used)
        coral_fatal("double free detected: a block of %zu bytes freed twice (page %p)",
                    page->block_size, (void *)page->start);
    tail->next = page->local_free;
    page->local_free = head;
    page->used -= count;
    return true;
}

/* Owner: gather every free block it can onto the free list. */
void coral_page_collect(coral_page_t *page) {
    if (atomic_load_explicit(&page->thread_free, memory_order_relaxed) & ~CORAL_DELAY_MASK)
        coral_page_thread_free_collect(page);
    if (page->local_free == NULL) return;
    if (page->free == NULL) {
        page->free = page->local_free;
    } else {
        coral_block_t *tail = page->local_free;
        while (tail->next) tail = tail->next;
        tail->next = page->free;
        page->free = page->local_free;
    }
    page->local_free = NULL;
    page->free_is_zero = 0;
}

/* Owner: set the delay state (see the protocol above). A page in state NEVER
 * keeps it unless override_never. */
void coral_page_set_delay(coral_page_t *page, uintptr_t state, bool override_never) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    for (;;) {
        uintptr_t now = tf & CORAL_DELAY_MASK;
        if (now == CORAL_DELAY_FREEING) { /* a remote push to the heap: short */
            __builtin_ia32_pause();
            tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
            continue;
        }
        if (now == state || (now == CORAL_DELAY_NEVER && !override_never)) return;
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                  (tf & ~CORAL_DELAY_MASK) | state,
                                                  memory_order_acq_rel, memory_order_relaxed))
            return;
    }
}

/* The start of the block that p points into. */
uint8_t *coral_page_block_start(const coral_page_t *page, const void *p) {
    uint8_t *start = page->start;
    size_t offset = (size_t)((const uint8_t *)p - start);
    if (page->class_idx == CORAL_CLASS_LARGE) return start;
    return start + (offset / page->block_size) * page->block_size;
}

static CORAL_COLD void invalid_free(const void *p, const char *why) {
    coral_fatal("free(): invalid pointer %p (%s)", p, why);
}

/* A free by a thread that does not own the segment. */
void coral_free_remote(coral_segment_t *seg, coral_page_t *page, void *p) {
    if (seg->kind == CORAL_SEGMENT_HUGE) {
        if (p != (void *)page->start) invalid_free(p, "inside a huge block, not its start");
        coral_huge_free(seg);
        return;
    }
    if (page->slice_count == 0) invalid_free(p, "in no page in use: double free?");
    coral_block_t *block = p;
    if (__atomic_load_n(&page->flags, __ATOMIC_RELAXED) & CORAL_PAGE_HAS_ALIGNED)
        block = (coral_block_t *)coral_page_block_start(page, p);

    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed), next;
    bool to_heap;
    do {
        to_heap = (tf & CORAL_DELAY_MASK) == CORAL_DELAY_USE;
        if (coral_unlikely(to_heap)) {
            next = (tf & ~CORAL_DELAY_MASK) | CORAL_DELAY_FREEING;
        } else {
            block->next = (coral_block_t *)(tf & ~CORAL_DELAY_MASK);
            next = (uintptr_t)block | (tf & CORAL_DELAY_MASK);
        }
    } while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, next,
                                                    memory_order_release, memory_order_relaxed));
    if (coral_likely(!to_heap)) return;

    /* State FREEING: the owner cannot let go of its heap until we are done. */
    coral_heap_t *heap = atomic_load_explicit(&page->heap, memory_order_acquire);
    coral_block_t *head = atomic_load_explicit(&heap->delayed_free, memory_order_relaxed);
    do {
        block->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&heap->delayed_free, &head, block,
                                                    memory_order_release, memory_order_relaxed));
    tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                  (tf & ~CORAL_DELAY_MASK) | CORAL_DELAY_NONE,
                                                  memory_order_release, memory_order_relaxed)) {
    }
}

/* A free by the owner that the fast path left alone: the page is full or
 * holds aligned blocks, or this was its last (or only a suspicious) block. */
void coral_free_local_generic(coral_page_t *page, void *p) {
    if (page->slice_count == 0) invalid_free(p, "in no page in use: double free?");
    coral_block_t *block = p;
    if (page->flags & CORAL_PAGE_HAS_ALIGNED)
        block = (coral_block_t *)coral_page_block_start(page, p);
    if (page->used == 0 || block == page->local_free)
        coral_fatal("double free detected: block %p of %zu bytes was already free", p,
                    page->block_size);
    block->next = page->local_free;
    page->local_free = block;
    page->used--;
    if (page->flags & CORAL_PAGE_IN_FULL) coral_page_unfull(page);
    if (page->used == 0) coral_page_retire(page);
}
