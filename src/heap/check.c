/* The invariants of the calling thread's heaps, pages and segments, checked
 * by walking them (tests, and the fuzzer's debug hook): O(blocks), never on
 * a normal path. Each check names what it found in *why. */
#include <string.h>

#include "heap/heap.h"

typedef struct check_s {
    const char *why; /* the first invariant found broken, or NULL */
    const void *where;
} check_t;

static bool fail(check_t *c, const char *why, const void *where) {
    if (c->why == NULL) {
        c->why = why;
        c->where = where;
    }
    return false;
}

/* Blocks of a list: each a block start inside the carved part, none twice
 * (seen: one bit per block); their number, or -1. */
static long list_blocks(check_t *c, const coral_page_t *page, const coral_block_t *b,
                        uint8_t *seen) {
    long n = 0;
    for (; b != NULL; b = coral_block_next(b), n++) {
        size_t off = (size_t)((const uint8_t *)b - page->start);
        if ((const uint8_t *)b < page->start || off >= (size_t)page->capacity * page->block_size ||
            off % page->block_size != 0)
            return fail(c, "a free list leads outside its page's carved blocks", b), -1;
        size_t i = off / page->block_size;
        if (seen[i / 8] & (1u << (i % 8))) return fail(c, "a block is free twice", b), -1;
        seen[i / 8] |= (uint8_t)(1u << (i % 8));
    }
    return n;
}

/* A parked page (page/page.c, "Parked pages"): no list of its own, every
 * block counted in use, and on thread_free a chain of its carved blocks,
 * each once, counted as `reserved`; or taken by the purger (RECLAIMED,
 * count 0). The chain is walked under the orphan lock, which a claim
 * needs: no purge can start meanwhile. */
static bool check_parked(check_t *c, const coral_page_t *page) {
    if (page->free != NULL || page->local_free != NULL || page->used != page->reserved)
        return fail(c, "a parked page has lists of its own or blocks not given away", page);
    coral_orphans_lock();
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    bool ok = (tf & CORAL_TF_RECLAIMED) != 0;
    if (!ok && coral_tf_count(tf) == page->reserved) {
        uint8_t seen[4096 / 8 + 1] = {0};
        ok = list_blocks(c, page, coral_tf_list(tf), seen) == (long)page->capacity;
    }
    coral_orphans_unlock();
    return ok || fail(c, "a parked page's chain is not its carved blocks, each once", page);
}

static bool check_lists(check_t *c, const coral_page_t *page);

/* A class page: free + local_free + in use = carved <= reserved. A page
 * set aside (page/page.c, "Aside pages") is checked under the orphan
 * lock, which a claim needs: none can start meanwhile; one made already
 * (RECLAIMED) left lists its owner forgets when it takes the page back. */
static bool check_blocks(check_t *c, const coral_page_t *page) {
    if (page->capacity > page->reserved) return fail(c, "more blocks carved than fit", page);
    if (coral_page_is_parked(page)) return check_parked(c, page);
    if (!page->is_aside) return check_lists(c, page);
    coral_orphans_lock();
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    bool ok = (tf & CORAL_TF_RECLAIMED) != 0 || check_lists(c, page);
    coral_orphans_unlock();
    return ok;
}

static bool check_lists(check_t *c, const coral_page_t *page) {
    uint8_t seen[4096 / 8 + 1] = {0};
    if (page->reserved > CORAL_PAGE_MAX_BLOCKS)
        return fail(c, "more than 4095 blocks in a page", page);
    long nfree = list_blocks(c, page, page->free, seen);
    long nlocal = nfree < 0 ? -1 : list_blocks(c, page, page->local_free, seen);
    if (nlocal < 0) return false;
    if ((uint64_t)nfree + (uint64_t)nlocal + page->used != page->capacity)
        return fail(c, "free + local_free + used != carved", page);
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    if (coral_tf_count(tf) > page->used)
        return fail(c, "more remote frees than blocks in use", page);
    return true;
}

/* The span of a page: its head descriptor, its interior slices leading
 * back to it, its slices used in the segment. */
static bool check_span(check_t *c, coral_segment_t *seg, const coral_page_t *page) {
    size_t first = (size_t)(page - seg->pages), n = page->slice_count;
    if (page->slice_offset != 0 || n == 0 || first == 0 || first + n > CORAL_SLICES_PER_SEGMENT)
        return fail(c, "a page is not the head of a span", page);
    uint64_t used = atomic_load_explicit(&seg->used_slices, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        if (!(used & ((uint64_t)1 << (first + i))))
            return fail(c, "a page's slice is not marked used", page);
        const coral_page_t *s = &seg->pages[first + i];
        if (i > 0 &&
            (s->slice_offset != i * sizeof *s || !(coral_slice_flags(s) & CORAL_PAGE_INTERIOR)))
            return fail(c, "an interior slice does not lead to its head", s);
    }
    if (page->start != coral_segment_base(seg) + first * CORAL_SLICE_SIZE)
        return fail(c, "a page does not start at its slice", page);
    return true;
}

/* The owner's view of a page of a size class (segment.h) is its geometry:
 * the secure build's fast paths check blocks against it. */
static bool check_owner_view(check_t *c, const coral_page_t *page) {
    if ((CORAL_SECURE ? page->owner_usable_size != page->block_size - CORAL_CANARY_SIZE ||
                            page->owner_start_low != (uint32_t)(uintptr_t)page->start
                      : page->owner_start_mul != coral_page_start_mul(page) ||
                            page->owner_carved_x != coral_page_carved_x(page, page->capacity)) ||
        page->owner_last_block != (size_t)(page->reserved - 1) * page->block_size ||
        (CORAL_SECURE && page->owner_canary != coral_canary_of(page, NULL)))
        return fail(c, "a page's owner view of its blocks is not its geometry", page);
    return true;
}

static bool check_heap(check_t *c, coral_heap_t *heap) {
    for (unsigned q = 1; q < CORAL_QUEUE_COUNT; q++) {
        for (coral_link_t *l = heap->queues[q].first; l != NULL; l = l->next) {
            coral_page_t *page = coral_container_of(l, coral_page_t, link);
            coral_segment_t *seg = coral_ptr_segment(page);
            if (coral_page_heap(page) != heap)
                return fail(c, "a page's owner is not its heap", page);
            bool full = (coral_slice_flags(page) & CORAL_PAGE_IN_FULL) != 0;
            if (full != (q == CORAL_QUEUE_FULL) || (!full && page->class_idx != q))
                return fail(c, "a page is in the wrong queue", page);
            if (!check_span(c, seg, page)) return false;
            /* A page in the full queue gets a notice with the first block
             * freed into it: one with every block free and none pending is
             * stranded there (nothing will ever move it back). */
            if (full && coral_page_all_free(page) && !coral_page_notice_pending(page))
                return fail(c, "an empty page is stranded in the full queue", page);
            if (page->class_idx != CORAL_CLASS_LARGE &&
                (!check_owner_view(c, page) || !check_blocks(c, page)))
                return false;
        }
    }
    return true;
}

/* A segment of the thread: mapped, owned, its span count right. */
static bool check_segment(check_t *c, coral_segment_t *seg, uintptr_t thread_id) {
    if (coral_map_kind((uintptr_t)seg) != CORAL_MAP_SEGMENT)
        return fail(c, "a segment has no segment map entry", seg);
    if (atomic_load_explicit(&seg->thread_id, memory_order_relaxed) != thread_id)
        return fail(c, "a segment of the thread has another owner", seg);
    uint32_t heads = 0;
    for (coral_page_t *p = coral_segment_next_span(seg, NULL); p != NULL;
         p = coral_segment_next_span(seg, p)) {
        if (coral_slice_tid(p) != thread_id)
            return fail(c, "a page's tid_flags does not name its segment's owner", p);
        heads++;
    }
    if (heads != seg->used_pages) return fail(c, "a segment's span count is wrong", seg);
    return true;
}

int coral_heap_check_thread(const char **why, const void **where) {
    check_t c = {NULL, NULL};
    coral_heap_t *own = coral_tls_heap;
    if (own != &coral_heap_empty) {
        coral_thread_t *thread = own->thread;
        for (coral_link_t *l = thread->heaps.first; l != NULL && c.why == NULL; l = l->next)
            check_heap(&c, coral_container_of(l, coral_heap_t, thread_link));
        for (coral_link_t *l = thread->segments.segments.first; l != NULL && c.why == NULL;
             l = l->next)
            check_segment(&c, coral_container_of(l, coral_segment_t, link),
                          thread->segments.thread_id);
    }
    *why = c.why;
    *where = c.where;
    return c.why == NULL ? 0 : -1;
}
