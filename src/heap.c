/* Heaps: the per-thread allocation state. A heap owns pages, kept in one
 * queue per size class (pages that may have free blocks, the first one the
 * allocation target, reachable through direct[] for small sizes) and one
 * queue of full pages. Everything here runs on the heap's owner thread, in
 * the slow paths; only heap->delayed_pages is written by other threads. */
#include <string.h>

#include "internal.h"
#include "options.h"

/* ---- queues ------------------------------------------------------------------ */

static unsigned queue_of(const coral_page_t *page) {
    return (page->flags & CORAL_PAGE_IN_FULL) ? CORAL_QUEUE_FULL : page->class_idx;
}

/* Keep direct[] pointing at the first page of each small class. */
static void direct_update(coral_heap_t *heap, unsigned q) {
    if (q > CORAL_DIRECT_LAST_CLASS) return;
    coral_page_t *page = heap->queues[q].first ? heap->queues[q].first : &coral_page_empty;
    size_t lo = q == 1 ? 0 : coral_class_size(q - 1) / 16 + 1, hi = coral_class_size(q) / 16;
    for (size_t w = lo; w <= hi; w++) heap->direct[w] = page;
}

void coral_queue_push_front(coral_heap_t *heap, unsigned q, coral_page_t *page) {
    coral_page_queue_t *queue = &heap->queues[q];
    page->prev = NULL;
    page->next = queue->first;
    if (queue->first) queue->first->prev = page;
    else queue->last = page;
    queue->first = page;
    direct_update(heap, q);
}

static void queue_push_back(coral_heap_t *heap, unsigned q, coral_page_t *page) {
    coral_page_queue_t *queue = &heap->queues[q];
    if (queue->first == NULL) {
        coral_queue_push_front(heap, q, page);
        return;
    }
    page->next = NULL;
    page->prev = queue->last;
    queue->last->next = page;
    queue->last = page;
}

void coral_queue_remove(coral_heap_t *heap, unsigned q, coral_page_t *page) {
    coral_page_queue_t *queue = &heap->queues[q];
    bool was_first = queue->first == page;
    if (page->prev) page->prev->next = page->next;
    else queue->first = page->next;
    if (page->next) page->next->prev = page->prev;
    else queue->last = page->prev;
    page->next = page->prev = NULL;
    if (was_first) direct_update(heap, q);
}

/* ---- full pages ---------------------------------------------------------------- */

static void page_push_full(coral_heap_t *heap, coral_page_t *page) {
    coral_page_set_delay(page, CORAL_DELAY_USE, false);
    __atomic_store_n(&page->flags, page->flags | CORAL_PAGE_IN_FULL, __ATOMIC_RELAXED);
    coral_queue_push_front(heap, CORAL_QUEUE_FULL, page);
}

/* The page has no free block: park it in the full queue, where remote frees
 * notify the heap (delay state USE). Returns false, leaving the page where
 * it is, when a remote free arrived just before the state changed. */
static bool page_try_full(coral_heap_t *heap, coral_page_t *page) {
    coral_page_set_delay(page, CORAL_DELAY_USE, false);
    coral_page_collect(page);
    if (page->free != NULL) {
        coral_page_set_delay(page, CORAL_DELAY_NONE, false);
        return false;
    }
    coral_queue_remove(heap, page->class_idx, page);
    __atomic_store_n(&page->flags, page->flags | CORAL_PAGE_IN_FULL, __ATOMIC_RELAXED);
    coral_queue_push_front(heap, CORAL_QUEUE_FULL, page);
    return true;
}

/* A block of a full page was freed: back to its class queue. */
void coral_page_unfull(coral_page_t *page) {
    coral_heap_t *heap = atomic_load_explicit(&page->heap, memory_order_relaxed);
    coral_queue_remove(heap, CORAL_QUEUE_FULL, page);
    __atomic_store_n(&page->flags, page->flags & ~CORAL_PAGE_IN_FULL, __ATOMIC_RELAXED);
    coral_page_set_delay(page, CORAL_DELAY_NONE, false);
    queue_push_back(heap, page->class_idx, page);
}

/* ---- releasing pages --------------------------------------------------------------- */

void coral_page_release(coral_page_t *page) {
    coral_heap_t *heap = atomic_load_explicit(&page->heap, memory_order_relaxed);
    coral_queue_remove(heap, queue_of(page), page);
    coral_segment_page_free(page);
}

/* Is a remote freer telling the heap about this page, or has it told it
 * (the page is on heap->delayed_pages)? Such a page must not be released:
 * the owner releases it when it takes it off that list. The freer pushes
 * its block (state FREEING) before it lists the page, and sets NONE (release)
 * only after, so a page may already have all its blocks back while the
 * freer has still to list it: state FREEING says so. */
bool coral_page_notice_pending(coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    return (tf & CORAL_DELAY_MASK) == CORAL_DELAY_FREEING ||
           atomic_load_explicit(&page->delayed_listed, memory_order_relaxed);
}

/* The page's last block was freed. Give its span back to the segment unless
 * it is the first page of its class queue: the next malloc of the class takes
 * that page, so releasing it would only make a new one at once. A page with
 * a heap notice pending stays too (above). */
void coral_page_retire(coral_page_t *page) {
    if (page->class_idx != CORAL_CLASS_LARGE && page->prev == NULL &&
        !(page->flags & CORAL_PAGE_IN_FULL))
        return;
    if (coral_page_notice_pending(page)) return;
    coral_page_release(page);
    /* The end of a free: a safe point to start the purge thread if the
     * release left memory to purge (see purge.c). */
    coral_purger_start_if_wanted();
}

/* ---- finding a page with a free block ------------------------------------------------ */

/* The heap's newest full page of class cls, among the 8 newest full pages;
 * NULL if none. (Only looked for when a new clean page of the class is
 * made: the full queue is then usually short to scan.) */
static const coral_page_t *class_full_page(coral_heap_t *heap, unsigned cls) {
    unsigned seen = 0;
    for (coral_page_t *p = heap->queues[CORAL_QUEUE_FULL].first; p != NULL && seen < 8;
         p = p->next, seen++)
        if (p->class_idx == cls) return p;
    return NULL;
}

static size_t class_page_slices(size_t block_size) {
    if (block_size <= CORAL_SLICE_SIZE / 8) return 1;
    size_t slices = (block_size * 8 + CORAL_SLICE_SIZE - 1) / CORAL_SLICE_SIZE;
    return slices > 16 ? 16 : slices;
}

/* The bytes a span's blocks of block_size fill (the tail past the last
 * whole block is never used). */
static size_t page_blocks_bytes(const coral_page_t *page, size_t block_size) {
    size_t span = (size_t)page->slice_count * CORAL_SLICE_SIZE;
    return span / block_size * block_size;
}

/* A new page of class cls, first in its queue, with every block still to
 * carve (nothing on its free list yet). */
static coral_page_t *page_new(coral_heap_t *heap, unsigned cls) {
    size_t block_size = coral_class_size(cls);
    coral_page_t *page = coral_segment_page_alloc(heap, class_page_slices(block_size));
    if (page == NULL) return NULL;
    /* Adaptive populate: a clean (never touched, or purged) span for a
     * class that already filled a page of this heap, and wrote it (see
     * populate.c), is faulted in with one system call instead of a fault
     * per 4 KiB. The first page of a class is left to fault in as it is
     * used, so a small program's footprint does not grow. */
    if (page->is_fresh && heap->queues[CORAL_QUEUE_FULL].first != NULL && coral_populate_adaptive())
        coral_populate_class_page(page, page_blocks_bytes(page, block_size), block_size,
                                  class_full_page(heap, cls));
    coral_page_init(heap, page, cls, block_size);
    coral_queue_push_front(heap, cls, page);
    return page;
}

static bool page_has_room(const coral_page_t *page) {
    return page->free != NULL || page->capacity < page->reserved;
}

/* The first page of class cls with a free block or blocks still to carve,
 * made first in its queue (so direct[] points at it). Pages found full on
 * the way move to the full queue: each page is passed over at most once
 * before it has space again. */
coral_page_t *coral_heap_find_room(coral_heap_t *heap, unsigned cls) {
    /* First the pages other threads freed into: that empties delayed_pages,
     * so no page of the walk below is still listed there when it may be
     * made full (and listed again) by page_try_full. */
    coral_heap_delayed_pages_collect(heap);
    coral_page_queue_t *queue = &heap->queues[cls];
    coral_page_t *page = queue->first;
    while (page != NULL) {
        coral_page_t *next = page->next;
        coral_page_collect(page);
        if (coral_unlikely(page->used > page->reserved))
            coral_fatal("double free detected in a page of %zu-byte blocks at %p",
                        page->block_size, (void *)page->start);
        if (page_has_room(page)) break;
        if (!page_try_full(heap, page)) break;
        page = next;
    }
    if (page == NULL) return page_new(heap, cls);
    if (queue->first != page) {
        coral_queue_remove(heap, cls, page);
        coral_queue_push_front(heap, cls, page);
    }
    return page;
}

/* The first page of class cls with a free block on its free list (carved
 * now if need be), made first in its queue. */
coral_page_t *coral_heap_find_page(coral_heap_t *heap, unsigned cls) {
    coral_page_t *page = coral_heap_find_room(heap, cls);
    if (page == NULL) return NULL;
    if (page->free == NULL) coral_page_extend(page);
    /* (Only a page still below a step needs a top-up: cheap test first.) */
    else if (coral_unlikely(page->capacity < CORAL_CARVE_MIN_BLOCKS))
        coral_page_top_up_first_carve(page);
    return page;
}

/* Owner: take back the full pages other threads freed blocks into: collect
 * them, move them back to their class queues, release the empty ones. */
void coral_heap_delayed_pages_collect(coral_heap_t *heap) {
    if (atomic_load_explicit(&heap->delayed_pages, memory_order_relaxed) == NULL) return;
    coral_page_t *page = atomic_exchange_explicit(&heap->delayed_pages, NULL, memory_order_acquire);
    while (page != NULL) {
        coral_page_t *next = atomic_load_explicit(&page->delayed_next, memory_order_relaxed);
        atomic_store_explicit(&page->delayed_listed, 0, memory_order_relaxed);
        coral_page_collect(page);
        if (page->used == 0) coral_page_retire(page);
        else if (page->flags & CORAL_PAGE_IN_FULL) coral_page_unfull(page);
        page = next;
    }
}

/* ---- whole-heap operations -------------------------------------------------------------- */

void coral_heap_init(coral_heap_t *heap, coral_tld_t *tld) {
    memset(heap->queues, 0, sizeof(heap->queues));
    for (size_t w = 0; w < CORAL_DIRECT_COUNT; w++) heap->direct[w] = &coral_page_empty;
    atomic_store_explicit(&heap->delayed_pages, NULL, memory_order_relaxed);
    heap->tld = tld;
    heap->heartbeat = 0;
}

/* Collect every page's free blocks; with release_empty, give pages with no
 * live block back to their segments (even the last of a class). */
void coral_heap_collect(coral_heap_t *heap, bool release_empty) {
    coral_heap_delayed_pages_collect(heap);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        coral_page_t *page = heap->queues[q].first;
        while (page != NULL) {
            coral_page_t *next = page->next;
            coral_page_collect(page);
            if (release_empty && page->used == 0 && !coral_page_notice_pending(page))
                coral_page_release(page);
            page = next;
        }
    }
}

/* The heap's thread exits: release what is free, and leave the rest for
 * adoption. First every page is set to NEVER so no other thread pushes to
 * heap->delayed_pages any more (see page.c), then what was pushed is taken. */
void coral_heap_abandon(coral_heap_t *heap) {
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++)
        for (coral_page_t *page = heap->queues[q].first; page != NULL; page = page->next)
            coral_page_set_delay(page, CORAL_DELAY_NEVER, true);
    coral_heap_collect(heap, true);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        coral_page_t *page = heap->queues[q].first;
        while (page != NULL) {
            coral_page_t *next = page->next;
            page->next = page->prev = NULL;
            __atomic_store_n(&page->flags, page->flags & ~CORAL_PAGE_IN_FULL, __ATOMIC_RELAXED);
            atomic_store_explicit(&page->heap, NULL, memory_order_release);
            page = next;
        }
        heap->queues[q].first = heap->queues[q].last = NULL;
    }
    for (size_t w = 0; w < CORAL_DIRECT_COUNT; w++) heap->direct[w] = &coral_page_empty;
    /* A user heap's huge blocks outlive it: they stop pointing at it. */
    pthread_mutex_lock(&heap->huge_lock);
    for (coral_segment_t *seg = heap->huge_blocks; seg != NULL; seg = seg->next)
        atomic_store_explicit(&seg->pages[0].heap, NULL, memory_order_relaxed);
    heap->huge_blocks = NULL;
    pthread_mutex_unlock(&heap->huge_lock);
}

/* Free every page of the heap, live blocks and all (coral_heap_destroy and
 * coral_heap_reset): in time proportional to the pages. First every page is
 * set to NEVER, so no remote free is still pushing to heap->delayed_pages,
 * whose pages are then released with the others. */
void coral_heap_release_all(coral_heap_t *heap) {
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++)
        for (coral_page_t *page = heap->queues[q].first; page != NULL; page = page->next)
            coral_page_set_delay(page, CORAL_DELAY_NEVER, true);
    for (coral_page_t *page = atomic_exchange_explicit(&heap->delayed_pages, NULL, memory_order_acquire);
         page != NULL; page = atomic_load_explicit(&page->delayed_next, memory_order_relaxed))
        atomic_store_explicit(&page->delayed_listed, 0, memory_order_relaxed);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        while (heap->queues[q].first != NULL) coral_page_release(heap->queues[q].first);
    }
    pthread_mutex_lock(&heap->huge_lock);
    coral_segment_t *seg = heap->huge_blocks;
    heap->huge_blocks = NULL;
    pthread_mutex_unlock(&heap->huge_lock);
    while (seg != NULL) {
        coral_segment_t *next = seg->next;
        atomic_store_explicit(&seg->pages[0].heap, NULL, memory_order_relaxed);
        coral_huge_release(seg);
        seg = next;
    }
}

/* A page of an abandoned segment joins `heap` (segment.c's adoption).
 * Returns true when the page turned out empty and was freed instead. */
bool coral_heap_adopt_page(coral_heap_t *heap, coral_page_t *page) {
    atomic_store_explicit(&page->heap, heap, memory_order_release);
    coral_page_set_delay(page, CORAL_DELAY_NONE, true);
    coral_page_collect(page);
    if (page->used == 0) {
        coral_segment_page_free(page);
        return true;
    }
    if (page->class_idx != CORAL_CLASS_LARGE) {
        queue_push_back(heap, page->class_idx, page);
        return false;
    }
    /* A large block is live: full queue. Re-check for a remote free that came
     * before the state was USE. */
    page_push_full(heap, page);
    coral_page_collect(page);
    if (page->used != 0 || coral_page_notice_pending(page)) return false;
    coral_page_release(page);
    return true;
}

/* A large page (one block, just allocated) joins the full queue. */
void coral_heap_add_large_page(coral_heap_t *heap, coral_page_t *page) { page_push_full(heap, page); }

/* In the child of a fork, for the forking thread's heaps: a thread that was
 * in the middle of a remote free into one of them (delay state FREEING, see
 * page.c) does not exist in the child and will never finish it. The page
 * is either on delayed_pages already or never will be: then its free blocks
 * stay on thread_free until a collect of the whole heap (a leak at worst,
 * never a double use); the state goes back to NONE so the owner does not
 * wait for it forever. A user heap's huge_lock may have been held by such a thread
 * too. */
void coral_heap_after_fork_child(coral_heap_t *heap) {
    pthread_mutex_init(&heap->huge_lock, NULL);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        for (coral_page_t *page = heap->queues[q].first; page != NULL; page = page->next) {
            uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
            if ((tf & CORAL_DELAY_MASK) == CORAL_DELAY_FREEING)
                atomic_store_explicit(&page->thread_free, (tf & ~CORAL_DELAY_MASK) | CORAL_DELAY_NONE,
                                      memory_order_relaxed);
        }
    }
}
