/* Heaps: the per-thread allocation state. A heap owns pages, kept in one
 * queue per size class (pages that may have free blocks, the first one the
 * allocation target, reachable through direct[] for small sizes) and one
 * queue of full pages. Everything here runs on the heap's owner thread, in
 * the slow paths; only heap->owner.delayed_pages is written by other
 * threads (the page layer's remote-free protocol). */
#include <errno.h>
#include <string.h>

#include "heap/heap.h"

/* ---- queues ------------------------------------------------------------------ */

static unsigned queue_of(const coral_page_t *page) {
    return (coral_slice_flags(page) & CORAL_PAGE_IN_FULL) ? CORAL_QUEUE_FULL : page->class_idx;
}

/* Keep direct[] pointing at the first page of each small class (in a
 * profiled heap too: the api layer's counted path pops from it; the
 * secure build's stays empty, heap.h). */
static void direct_update(coral_heap_t *heap, unsigned q) {
    if (q > CORAL_DIRECT_LAST_CLASS || (CORAL_SECURE && heap->no_direct)) return;
    coral_page_t *page = coral_queue_first(heap, q);
    if (page == NULL) page = &coral_page_empty;
    size_t lo, hi;
    coral_direct_entries(q, &lo, &hi);
    for (size_t w = lo; w <= hi; w++) heap->direct[w] = page;
}

/* Pages behind the first of a class queue are set aside (page layer,
 * coral_page_set_aside): no fast path pops from them, and the purger may
 * claim one once none of its blocks is live, with no call from this
 * thread (its blocks freed by other threads while it idles). A page is
 * taken back (coral_page_unaside) before it becomes first, so before
 * direct[] leads to it, and before this layer collects it
 * (page_collect_all_free: find_room and page_try_full collect only the
 * first page of a queue); the page layer takes it back itself before it
 * parks, walks or releases it. Not the full queue (no block of its pages
 * is free) nor large pages (one block each). */
static bool queue_sets_aside(unsigned q) { return q < CORAL_CLASS_LARGE; }

/* The first page of queue q changed: taken back, and direct[] leads to it. */
CORAL_INLINE void queue_first_changed(coral_heap_t *heap, unsigned q) {
    coral_page_t *first = coral_queue_first(heap, q);
    if (first != NULL) coral_page_unaside(first);
    if (q <= CORAL_DIRECT_LAST_CLASS) direct_update(heap, q);
}

static CORAL_NOINLINE void queue_push_front(coral_heap_t *heap, unsigned q, coral_page_t *page) {
    coral_page_t *behind = coral_queue_first(heap, q);
    coral_list_push_front(&heap->queues[q], &page->link);
    queue_first_changed(heap, q);
    if (behind != NULL && queue_sets_aside(q)) coral_page_set_aside(behind);
}

static void queue_push_back(coral_heap_t *heap, unsigned q, coral_page_t *page) {
    bool was_empty = heap->queues[q].first == NULL;
    coral_list_push_back(&heap->queues[q], &page->link);
    if (was_empty)
        queue_first_changed(heap, q);
    else if (queue_sets_aside(q))
        coral_page_set_aside(page);
}

static void queue_remove(coral_heap_t *heap, unsigned q, coral_page_t *page) {
    bool was_first = page->link.prev == NULL;
    coral_list_remove(&heap->queues[q], &page->link);
    if (was_first) queue_first_changed(heap, q);
}

/* ---- full pages ---------------------------------------------------------------- */

/* The full queue: no direct[] entry, no page set aside. */
static void full_push_front(coral_heap_t *heap, coral_page_t *page) {
    coral_list_push_front(&heap->queues[CORAL_QUEUE_FULL], &page->link);
}
static void full_remove(coral_heap_t *heap, coral_page_t *page) {
    coral_list_remove(&heap->queues[CORAL_QUEUE_FULL], &page->link);
}

static void page_push_full(coral_heap_t *heap, coral_page_t *page) {
    coral_page_set_delay(page, CORAL_DELAY_USE, false);
    coral_slice_set_flags(page, coral_slice_flags(page) | CORAL_PAGE_IN_FULL);
    full_push_front(heap, page);
}

static bool page_has_room(const coral_page_t *page) {
    return page->free != NULL || page->capacity < page->reserved;
}

/* The page has no free block: park it in the full queue, where remote frees
 * notify the heap (delay state USE). Returns false, leaving the page where
 * it is, when a remote free arrived just before the state changed. */
static bool page_try_full(coral_heap_t *heap, coral_page_t *page) {
    coral_page_set_delay(page, CORAL_DELAY_USE, false);
    coral_page_collect(page);
    if (page_has_room(page)) {
        coral_page_set_delay(page, CORAL_DELAY_NONE, false);
        return false;
    }
    queue_remove(heap, page->class_idx, page);
    coral_slice_set_flags(page, coral_slice_flags(page) | CORAL_PAGE_IN_FULL);
    full_push_front(heap, page);
    return true;
}

void coral_heap_add_large_page(coral_heap_t *heap, coral_page_t *page) {
    page_push_full(heap, page);
}

void coral_heap_page_unfull(coral_page_t *page) {
    coral_heap_t *heap = coral_page_heap(page);
    full_remove(heap, page);
    coral_slice_set_flags(page, coral_slice_flags(page) & ~CORAL_PAGE_IN_FULL);
    /* Behind the first: set aside in the CAS that leaves state USE. */
    if (heap->queues[page->class_idx].first != NULL && queue_sets_aside(page->class_idx))
        coral_page_unfull_aside(page);
    else
        coral_page_set_delay(page, CORAL_DELAY_NONE, false);
    queue_push_back(heap, page->class_idx, page);
}

/* ---- releasing pages --------------------------------------------------------------- */

static void page_release(coral_page_t *page) {
    queue_remove(coral_page_heap(page), queue_of(page), page);
    coral_page_release_span(page);
}

/* Empty pages at the front of a class queue are kept up to this many bytes
 * of the queue (the first page whatever its size): the next mallocs of the
 * class take them before any other, so releasing them would only make new
 * ones at once, e.g. in a program that fills and empties a few pages of a
 * class in rounds. A kept page's memory is returned when the page is
 * released: once it is found further back on emptying again, at
 * a forced coral_collect / malloc_trim (coral_heap_collect), or at thread
 * exit; and a kept page that is not first in its queue is parked
 * (page_park below), so the purger returns it once it stayed unused for
 * the purge delay, with no call from this thread. The secure build keeps one slice more: its blocks
 * of a power-of-two request are 16 bytes larger (the canary's class, page.h), so what 4 slices hold
 * in the default build (64 blocks of 4 KiB, 16 a slice) takes 5 there (15 blocks of 4112 bytes a
 * slice). Classes of 8 KiB to 64 KiB keep up to 1 MiB: 64 blocks of 8 KiB take more than 4 slices,
 * and a page of blocks of 16 KiB and more holds only 8 of them. Bigger classes keep none
 * (CORAL_KEEP_EMPTY_MAX_BLOCK, heap.h). */
#define KEEP_EMPTY_BYTES ((CORAL_SECURE ? 5 : 4) * CORAL_SLICE_SIZE)
#define KEEP_EMPTY_BYTES_BIG (16 * CORAL_SLICE_SIZE)

static size_t page_span_bytes(const coral_page_t *page) {
    return (size_t)page->slice_count * CORAL_SLICE_SIZE;
}

bool coral_heap_keeps_empty_page(const coral_page_t *page) {
    if (page->class_idx == CORAL_CLASS_LARGE || (coral_slice_flags(page) & CORAL_PAGE_IN_FULL) ||
        page->block_size > CORAL_KEEP_EMPTY_MAX_BLOCK)
        return false;
    if (page->link.prev == NULL) return true;
    size_t keep =
        page->block_size >= 2 * CORAL_OS_PAGE_SIZE ? KEEP_EMPTY_BYTES_BIG : KEEP_EMPTY_BYTES;
    size_t bytes = page_span_bytes(page);
    for (const coral_link_t *l = page->link.prev; l != NULL && bytes <= keep; l = l->prev)
        bytes += page_span_bytes(coral_container_of(l, coral_page_t, link));
    return bytes <= keep;
}

/* A kept empty page that is not first in its queue (so no fast path
 * reaches it) is parked (page layer, coral_page_park): it stays in its
 * queue, in its place, its free blocks as they are, and the next
 * find_room that comes to it takes it back (coral_page_collect), unless it
 * stayed parked for the purge delay: then the purger has returned its
 * memory with no call from this thread, and the owner takes it back as
 * zero memory. A page parked and taken back again within the delay (a
 * program that fills and empties a few pages in rounds) stays listed:
 * parking it again is one CAS. The first page of a queue is not parked:
 * the malloc fast path pops from it with no atomic operation, so only the
 * owner could hand it over, and an idle owner makes no call
 * (docs/DESIGN.md, "Empty pages a thread keeps"). */
static void page_park(coral_page_t *page) {
    if (!coral_page_is_listed(page)) {
        /* (A safe point, as for a release below: the purge thread starts
         * if the page brings the backlog to its threshold. Its start may
         * allocate from this page: then it is parked no more.) */
        coral_purger_start_ahead((int64_t)page_span_bytes(page));
        if (page->used != 0 || page->link.prev == NULL || coral_page_is_parked(page)) return;
    }
    (void)coral_page_park(page);
}

/* ---- the quarantine of large blocks (secure build) ------------------------------------
 * A large block its owner frees, or takes back from another thread's free
 * (coral_heap_collect_delayed), is made inaccessible (PROT_NONE: with its
 * guard page, one range) and waits in its heap's quarantine, its span
 * still held, before the span is released as in the default build: a read
 * or write through a stale pointer faults, and a second free finds the
 * page in use with no block in use (used 0), which the api layer names
 * without touching the block. The quarantine is per heap, its owner's
 * alone: the span goes back to the owner's segment, which only the owner
 * changes, so the list needs no lock. Bounds: the last
 * LARGE_QUARANTINE_COUNT blocks and LARGE_QUARANTINE_BYTES of spans per
 * heap (the oldest leaves first), and about LARGE_QUARANTINE_PROCESS
 * blocks over the process (a counter, read before each put): each one is a
 * range of its own protection inside a segment's mapping, so up to two
 * more kernel mappings (VMAs) of the 65530 a process may have
 * (vm.max_map_count), as many as the block had while it was live (its
 * guard page). Past the process bound, a heap gives up its own oldest
 * block first, else releases the new one at once (unprotected). A heap
 * that is trimmed or abandoned (coral_heap_collect releasing empty pages:
 * malloc_trim, thread exit) or destroyed releases its quarantine first. A
 * leaving block's span is made accessible, guard and all, by its release
 * (coral_page_release_span). */
#define LARGE_QUARANTINE_COUNT 16
#define LARGE_QUARANTINE_BYTES ((size_t)16 << 20)
#define LARGE_QUARANTINE_PROCESS 4096
#if CORAL_SECURE
static _Atomic(uint32_t) large_quarantined; /* blocks in every heap's quarantine */

static void quarantine_release_oldest(coral_heap_t *heap) {
    coral_page_t *page = coral_list_entry(heap->quarantine.first, coral_page_t, link);
    coral_list_remove(&heap->quarantine, &page->link);
    heap->quarantine_bytes -= page_span_bytes(page);
    heap->quarantine_count--;
    atomic_fetch_sub_explicit(&large_quarantined, 1, memory_order_relaxed);
    coral_page_release_span(page);
}

/* Owner: a large page of heap whose block is free (used 0), in its queue
 * with no notice pending, into the quarantine. False (nothing changed):
 * the caller releases it. It is flagged IN_FULL there, in no queue, so
 * that every free of the block leaves the fast path (which would read its
 * canary) for the checked one, which names the double free. */
static bool quarantine_put(coral_heap_t *heap, coral_page_t *page) {
    if (atomic_fetch_add_explicit(&large_quarantined, 1, memory_order_relaxed) >=
        LARGE_QUARANTINE_PROCESS) {
        atomic_fetch_sub_explicit(&large_quarantined, 1, memory_order_relaxed);
        if (heap->quarantine.first == NULL) return false;
        quarantine_release_oldest(heap);
        atomic_fetch_add_explicit(&large_quarantined, 1, memory_order_relaxed);
    }
    if (!coral_os_protect(page->start, page->block_size, false)) {
        atomic_fetch_sub_explicit(&large_quarantined, 1, memory_order_relaxed);
        return false;
    }
    queue_remove(heap, queue_of(page), page);
    coral_slice_set_flags(page, coral_slice_flags(page) | CORAL_PAGE_IN_FULL);
    coral_list_push_back(&heap->quarantine, &page->link);
    heap->quarantine_bytes += page_span_bytes(page);
    heap->quarantine_count++;
    while (heap->quarantine_count > LARGE_QUARANTINE_COUNT ||
           heap->quarantine_bytes > LARGE_QUARANTINE_BYTES) {
        /* (A safe point, as in coral_heap_page_retire below.) */
        coral_purger_start_ahead((int64_t)page_span_bytes(page));
        quarantine_release_oldest(heap);
    }
    return true;
}
#endif

/* Owner: every block of heap's quarantine released (a no-op outside the
 * secure build). */
static void quarantine_release_all(coral_heap_t *heap) {
#if CORAL_SECURE
    while (heap->quarantine.first != NULL) quarantine_release_oldest(heap);
#else
    (void)heap;
#endif
}

/* Give the span back unless the page is kept (coral_heap_keeps_empty_page). A page
 * with a notice pending (page layer) stays too: the owner releases it when
 * it takes the notice. The secure build's large pages wait in the
 * quarantine first (above). */
void coral_heap_page_retire(coral_page_t *page) {
    if (coral_heap_keeps_empty_page(page)) {
        if (page->link.prev != NULL && !coral_page_notice_pending(page)) page_park(page);
        return;
    }
    if (coral_page_notice_pending(page)) return;
#if CORAL_SECURE
    if (page->class_idx == CORAL_CLASS_LARGE && quarantine_put(coral_page_heap(page), page)) return;
#endif
    /* The end of a free, a safe point: the purge thread starts, if the
     * span released brings the backlog to its threshold, before the
     * release, so that pthread_create's allocations cannot take the span
     * (a second free of a block of it then finds it in no page). */
    coral_purger_start_ahead((int64_t)page_span_bytes(page));
    page_release(page);
}

/* Owner: collect the page (walking no list), and tell whether every block
 * is free. Its remote-freed blocks are taken (and so checked) when they
 * would make it so, even onto a local_free that must then be walked: the
 * page is about to be released. */
static bool page_collect_all_free(coral_page_t *page) {
    coral_page_unaside(page);
    coral_page_collect(page);
    if (page->used != 0 && coral_page_all_free(page)) coral_page_take_remote(page);
    return page->used == 0;
}

/* ---- spans: the thread's segments, then adopted ones, then a new one ------------ */

/* A page of an abandoned segment joins `heap`. Returns true when the page
 * turned out empty and was released instead. */
static bool heap_adopt_page(coral_heap_t *heap, coral_page_t *page) {
    atomic_store_explicit(&page->owner, &heap->owner, memory_order_release);
    coral_slice_set_tid(page, heap->thread->segments.thread_id);
    coral_page_set_delay(page, CORAL_DELAY_NONE, true);
    if (page_collect_all_free(page)) {
        coral_page_release_span(page);
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
    page_release(page);
    return true;
}

/* Adopt an abandoned segment (the oldest, or with cls != 0 one with free
 * blocks of class cls): its pages join the thread's own heap, never a user
 * heap (coral_heap_destroy frees a user heap's pages, and the adopted
 * blocks are someone else's). */
static bool heap_adopt_one(coral_heap_t *heap, unsigned cls) {
    coral_heap_t *own = heap->thread->heap_default;
    coral_segment_t *seg = coral_segment_adopt_next(&heap->thread->segments, cls);
    if (seg == NULL) return false;
    coral_page_t *page = coral_segment_next_span(seg, NULL);
    while (page != NULL) {
        /* Releasing the last page releases the segment to the cache, where
         * another thread may take it at once: touch nothing of it then. */
        bool last_page = seg->used_pages == 1;
        coral_page_t *next = last_page ? NULL : coral_segment_next_span(seg, page);
        if (heap_adopt_page(own, page) && last_page) break;
        page = next;
    }
    return true;
}

void coral_heap_adopt_all(coral_heap_t *heap) {
    while (heap_adopt_one(heap, 0)) {
    }
}

/* A span of n slices for a new page of heap: in the thread's segments, else
 * in an abandoned one (a few at most per call: they may hold free space, and
 * their live blocks need an owner anyway), else in a new segment. */
coral_page_t *coral_heap_span_alloc(coral_heap_t *heap, size_t n) {
    coral_thread_segments_t *ts = &heap->thread->segments;
    coral_page_t *page = coral_span_alloc_owned(ts, n);
    for (int tries = 0; page == NULL && tries < 4 && heap_adopt_one(heap, 0); tries++)
        page = coral_span_alloc_owned(ts, n);
    if (page == NULL) page = coral_span_alloc_new(ts, n);
    return page;
}

/* ---- finding a page with a free block ------------------------------------------------ */

/* The heap's newest full page of class cls, among the 8 newest full pages;
 * NULL if none. (Only looked for when a new clean page of the class is
 * made: the full queue is then usually short to scan.) */
static const coral_page_t *class_full_page(coral_heap_t *heap, unsigned cls) {
    unsigned seen = 0;
    for (coral_link_t *l = heap->queues[CORAL_QUEUE_FULL].first; l != NULL && seen < 8;
         l = l->next, seen++) {
        const coral_page_t *p = coral_container_of(l, coral_page_t, link);
        if (p->class_idx == cls) return p;
    }
    return NULL;
}

/* The slices of a new page of blocks of block_size: one (64 KiB) up to
 * 8 KiB blocks; below 128 KiB, enough for 8 blocks; from 128 KiB
 * (CORAL_ONE_BLOCK_PAGE_MIN) to 512 KiB, enough for one block, as
 * mimalloc gives each object above 128 KiB a page of its own. Pages of
 * classes above 64 KiB are never kept empty, so with one block a page a
 * freed block's slices go back to its segment at once, where any span
 * reuses them and the purger returns them after the delay; with 8 a page
 * (up to 16 slices), one live block kept the whole page, resident where
 * its freed blocks had been written. Not from 72 KiB: every free of such
 * a block then gives slices back, enough to start the purge thread in a
 * program that frees many (glibc's tst-mallocfork2, blocks up to 70,000
 * bytes), which then forks in a signal handler while multi-threaded: the
 * hang docs/DESIGN.md describes (fork). Not at 64 KiB or below: a program
 * that allocates and frees thousands of such blocks would take a new span
 * every malloc. (The figures are in the commit that made this choice.) */
#define CORAL_ONE_BLOCK_PAGE_MIN ((size_t)128 * 1024)
static size_t class_page_slices(size_t block_size) {
    if (block_size <= CORAL_SLICE_SIZE / 8) return 1;
    size_t blocks = block_size >= CORAL_ONE_BLOCK_PAGE_MIN ? 1 : 8;
    size_t slices = (block_size * blocks + CORAL_SLICE_SIZE - 1) / CORAL_SLICE_SIZE;
    return slices > 16 ? 16 : slices;
}

/* Adaptive populate of a new page: a clean (never touched, or purged) span
 * for a class that already filled a page of this heap, and wrote it, is
 * faulted in with one system call instead of a fault per 4 KiB. The first
 * page of a class is left to fault in as it is used, so a small program's
 * footprint does not grow. */
static void page_populate(coral_heap_t *heap, coral_page_t *page, unsigned cls, size_t bs) {
    if (!page->is_fresh || heap->queues[CORAL_QUEUE_FULL].first == NULL ||
        !coral_populate_adaptive())
        return;
    const coral_page_t *full = class_full_page(heap, cls);
    coral_populate_class_span(page->start, coral_page_blocks_bytes(page, bs), bs,
                              full ? full->start : NULL,
                              full ? (size_t)full->slice_count * CORAL_SLICE_SIZE : 0);
}

/* A new page of class cls, first in its queue, with every block still to
 * carve (nothing on its free list yet). */
static coral_page_t *page_new(coral_heap_t *heap, unsigned cls) {
    size_t block_size = coral_class_size(cls);
    coral_page_t *page = coral_heap_span_alloc(heap, class_page_slices(block_size));
    if (page == NULL) return NULL;
    page_populate(heap, page, cls, block_size);
    coral_page_init(page, &heap->owner, !heap->is_default, cls, block_size);
    queue_push_front(heap, cls, page);
    return page;
}

/* Owner: take back the full pages other threads freed blocks into: collect
 * them, move them back to their class queues, release the empty ones. */
void coral_heap_collect_delayed(coral_heap_t *heap) {
    if (atomic_load_explicit(&heap->owner.delayed_pages, memory_order_relaxed) == NULL) return;
    coral_page_t *page =
        atomic_exchange_explicit(&heap->owner.delayed_pages, NULL, memory_order_acquire);
    while (page != NULL) {
        coral_page_t *next = atomic_load_explicit(&page->delayed_next, memory_order_relaxed);
        /* Its notifier may not have left FREEING yet: a retire below that
         * still saw it would leave an empty page in the full queue, with no
         * block left to notify again. */
        coral_page_wait_notice_done(page);
        atomic_store_explicit(&page->delayed_listed, 0, memory_order_relaxed);
        if (page_collect_all_free(page))
            coral_heap_page_retire(page);
        else if (coral_slice_flags(page) & CORAL_PAGE_IN_FULL)
            coral_heap_page_unfull(page);
        page = next;
    }
}

/* The fullest page of class cls with room among the first ADOPT_SCAN of
 * its queue, or NULL. */
#define ADOPT_SCAN 32
static coral_page_t *fullest_with_room(coral_heap_t *heap, unsigned cls) {
    coral_page_t *best = NULL;
    unsigned seen = 0;
    for (coral_link_t *l = heap->queues[cls].first; l != NULL && seen < ADOPT_SCAN;
         l = l->next, seen++) {
        coral_page_t *page = coral_container_of(l, coral_page_t, link);
        /* (A parked page is the purger's to claim until it is taken back:
         * its lists are not to be touched before that.) */
        if (coral_page_is_parked(page)) continue;
        if (page_has_room(page) && (best == NULL || page->used > best->used)) best = page;
    }
    return best;
}

/* No page of class cls has room: before a fresh page is carved, the
 * thread adopts an abandoned segment where the exited owner left a page of
 * the class with free blocks (coral_segment_note_room; up to ADOPT_TRIES),
 * and takes the fullest page of the class with room. So the free space of
 * pages that exited threads left with a few live blocks is filled before
 * new memory is touched, and those pages get an owner to release them
 * once empty; segments without such a page stay for the threads that need
 * their class, or a span (coral_heap_span_alloc). Only for the thread's
 * own heap, the one adopted pages join. */
#define ADOPT_TRIES 1
static coral_page_t *adopted_page_with_room(coral_heap_t *heap, unsigned cls) {
    if (!coral_segments_abandoned_any() || heap != heap->thread->heap_default) return NULL;
    for (int tries = 0; tries < ADOPT_TRIES && heap_adopt_one(heap, cls); tries++) {
        coral_page_t *page = fullest_with_room(heap, cls);
        if (page != NULL) return page;
    }
    return NULL;
}

/* Pages found full on the way move to the full queue: each page is passed
 * over at most once before it has space again. */
CORAL_INLINE coral_page_t *find_room(coral_heap_t *heap, unsigned cls) {
    /* First the pages other threads freed into: that empties delayed_pages,
     * so no page of the walk below is still listed there when it may be
     * made full (and listed again) by page_try_full. */
    coral_heap_collect_delayed(heap);
    coral_page_t *page = coral_queue_first(heap, cls);
    while (page != NULL) {
        coral_page_t *next = coral_list_entry(page->link.next, coral_page_t, link);
        coral_page_collect(page);
        if (coral_unlikely(page->used > page->reserved))
            coral_fatal("double free detected in a page of %zu-byte blocks at %p", page->block_size,
                        (void *)page->start);
        if (page_has_room(page)) break;
        if (!page_try_full(heap, page)) break;
        page = next;
    }
    if (page == NULL) page = adopted_page_with_room(heap, cls);
    if (page == NULL) return page_new(heap, cls);
    if (page->link.prev != NULL) {
        queue_remove(heap, cls, page);
        queue_push_front(heap, cls, page);
    }
    return page;
}

coral_page_t *coral_heap_find_room(coral_heap_t *heap, unsigned cls) {
    return find_room(heap, cls);
}

coral_page_t *coral_heap_find_page(coral_heap_t *heap, unsigned cls) {
    coral_page_t *page = find_room(heap, cls);
    if (page == NULL) return NULL;
    /* A fresh page of a heap with no full page was not prefaulted
     * (page_populate): carve it an OS page at a time, so a small program
     * faults in only what its blocks lie on. */
    if (page->free == NULL)
        coral_page_extend(page, page->is_fresh && heap->queues[CORAL_QUEUE_FULL].first == NULL);
    /* (Only a page still below a step needs a top-up: cheap test first.) */
    else if (coral_unlikely(page->capacity < CORAL_CARVE_MIN_BLOCKS))
        coral_page_top_up_first_carve(page);
    return page;
}

/* ---- frees the fast path leaves to the heap -------------------------------------- */

/* The page is full or holds aligned blocks, or this was its last (or only
 * a suspicious) block. A misuse found here leaves the page as it was. */
void coral_heap_free_local(coral_page_t *page, void *p) {
    coral_block_t *block = coral_page_freed_block(page, p);
    if (block == NULL) return;
    if (page->used == 0 || coral_page_freed_last(page, block)) {
        coral_misuse("double free detected: block %p of %zu bytes was already free", p,
                     page->block_size);
        return;
    }
    coral_heap_free_local_now(page, block);
}

void coral_heap_free_local_now(coral_page_t *page, coral_block_t *block) {
    coral_page_push_free(page, block); /* as the fast path does (api.h) */
    page->used--;
    if (coral_slice_flags(page) & CORAL_PAGE_IN_FULL) coral_heap_page_unfull(page);
    if (page->used == 0) coral_heap_page_retire(page);
}

/* ---- the secure build's ring of freed blocks (heap.h) ---------------------------------- */

#if CORAL_SECURE
/* An empty slot's block and page (heap.h); never written: its tid_flags
 * stay 0. */
coral_page_t coral_ring_idle;
#define RING_IDLE ((coral_block_t *)(void *)&coral_ring_idle)

__thread coral_ring_t coral_ring_tls __attribute__((tls_model("initial-exec"))) = {
    .draw = 0x9e3779b97f4a7c15ull,
    .blocks = {RING_IDLE, RING_IDLE, RING_IDLE, RING_IDLE},
    .pages = {&coral_ring_idle, &coral_ring_idle, &coral_ring_idle, &coral_ring_idle},
};
_Static_assert(CORAL_RING_SLOTS == 4, "coral_ring_tls names every slot");

/* Every block of the ring r leaves it (checked, back to its page). Each
 * slot is emptied, with the ring busy (heap.h: a handler's put then leaves
 * the ring alone), before its block goes back: that may retire the page,
 * whose release may start the purge thread and so free again on this
 * thread (a nested put finds the ring free to use and the slot empty). */
static void ring_flush(coral_ring_t *r) {
    for (unsigned i = 0; i < CORAL_RING_SLOTS; i++) {
        if (coral_heap_ring_enter(r)) return; /* (in a handler, inside a change) */
        coral_block_t *block = r->blocks[i];
        coral_page_t *page = r->pages[i];
        r->blocks[i] = RING_IDLE;
        r->pages[i] = &coral_ring_idle;
        coral_heap_ring_exit(r);
        if (page != &coral_ring_idle) coral_heap_ring_out_slow(page, block);
    }
}

void coral_heap_ring_out_slow(coral_page_t *page, coral_block_t *block) {
    coral_ring_t *r = &coral_ring_tls;
    if (page == &coral_ring_idle) {
        if (r->closed) { /* (the block just put, alone in the ring) */
            ring_flush(r);
        } else if (!r->seeded) {
            r->seeded = true;
            r->draw ^= ((uint64_t)coral_secure_next_epoch() << 32 | coral_secure_next_epoch()) << 1;
        }
        return;
    }
    if (!coral_secure_ring_intact(page, (uint8_t *)block, coral_ring_fill_vec()))
        coral_secure_ring_write_after_free(page, (uint8_t *)block);
    coral_heap_free_local_now(page, block);
}

void coral_heap_ring_bypass(coral_page_t *page, coral_block_t *block) {
    /* The fill's third word is the mark's in a 32-byte block, all three in
     * a 16-byte one (page.h): the mark, written already, is kept. */
    uint64_t *mark = coral_mark_word(page, block), freed = *mark;
    coral_secure_fill_words((uint8_t *)block, page->owner_usable_size);
    *mark = freed;
    coral_heap_free_local_now(page, block);
}

void coral_heap_ring_flush(bool close) {
    coral_ring_t *r = &coral_ring_tls;
    if (close) r->closed = true;
    ring_flush(r);
}
#else
void coral_heap_ring_flush(bool close) { (void)close; } /* (no ring) */
#endif

void coral_heap_free_remote(coral_segment_t *seg, coral_page_t *page, void *p) {
    if (seg->kind == CORAL_SEGMENT_HUGE) {
        if (p != (void *)page->start) {
            coral_page_invalid_free(p, "inside a huge block, not its start");
            return;
        }
        coral_huge_free(seg);
        return;
    }
    coral_page_free_remote(page, p);
}

/* ---- whole-heap operations -------------------------------------------------------------- */

void coral_heap_init(coral_heap_t *heap, coral_thread_t *thread) {
    memset(heap->queues, 0, sizeof(heap->queues));
#if CORAL_SECURE
    heap->quarantine.first = heap->quarantine.last = NULL;
    heap->quarantine_bytes = 0;
    heap->quarantine_count = 0;
#endif
    for (size_t w = 0; w < CORAL_DIRECT_COUNT; w++) heap->direct[w] = &coral_page_empty;
    heap->direct_end = CORAL_DIRECT_COUNT;
    atomic_store_explicit(&heap->owner.delayed_pages, NULL, memory_order_relaxed);
    heap->thread = thread;
    heap->heartbeat = 0;
}

coral_heap_t *coral_heap_create(void) {
    coral_heap_t *self = coral_tls_heap;
    if (self == &coral_heap_empty && (self = coral_thread_init()) == NULL) return NULL;
    coral_heap_t *heap = coral_heap_pool_get();
    if (heap == NULL) return NULL;
    coral_heap_init(heap, self->thread);
    coral_list_push_back(&self->thread->heaps, &heap->thread_link);
    return heap;
}

void coral_heap_collect(coral_heap_t *heap, bool release_empty) {
    coral_heap_collect_delayed(heap);
    if (release_empty) quarantine_release_all(heap);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        coral_page_t *page = coral_queue_first(heap, q);
        while (page != NULL) {
            coral_page_t *next = coral_list_entry(page->link.next, coral_page_t, link);
            /* A parked (or aside) page stays so unless it is to be
             * released: taken back, it would stay where the purger cannot
             * reach it. */
            if (!release_empty && (coral_page_is_parked(page) || coral_page_is_aside(page))) {
                page = next;
                continue;
            }
            if (page_collect_all_free(page) && release_empty && !coral_page_notice_pending(page))
                page_release(page);
            page = next;
        }
    }
}

/* Every page of the heap to delay state NEVER: from then on no other thread
 * pushes to heap->owner.delayed_pages (see page/page.c). */
static void heap_pages_never_notify(coral_heap_t *heap) {
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++)
        for (coral_link_t *l = heap->queues[q].first; l != NULL; l = l->next)
            coral_page_set_delay(coral_container_of(l, coral_page_t, link), CORAL_DELAY_NEVER,
                                 true);
}

/* The heap's thread exits: release what is free, and leave the rest for
 * adoption. First the pages stop notifying, then what was pushed is taken. */
void coral_heap_abandon(coral_heap_t *heap) {
    heap_pages_never_notify(heap);
    coral_heap_collect(heap, true);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        coral_link_t *l = heap->queues[q].first;
        while (l != NULL) {
            coral_link_t *next = l->next;
            coral_page_t *page = coral_container_of(l, coral_page_t, link);
            if (q < CORAL_CLASS_LARGE && page_has_room(page))
                coral_segment_note_room(coral_ptr_segment(page), q);
            page->link.next = page->link.prev = NULL;
            coral_slice_set_flags(page, coral_slice_flags(page) & ~CORAL_PAGE_IN_FULL);
            atomic_store_explicit(&page->owner, NULL, memory_order_release);
            l = next;
        }
        heap->queues[q].first = heap->queues[q].last = NULL;
    }
    for (size_t w = 0; w < CORAL_DIRECT_COUNT; w++) heap->direct[w] = &coral_page_empty;
    /* The heap's huge blocks outlive it: they stop pointing at it. Each
     * block's link is read before its owner is cleared: a free that finds
     * the owner NULL releases the segment without the lock (large.c), so
     * the segment may be another thread's from that store on. The store
     * releases (the free's load acquires) so that these reads come before
     * the segment's reuse. */
    coral_huge_lists_lock();
    for (coral_link_t *l = heap->huge_blocks.first, *next; l != NULL; l = next) {
        next = l->next;
        atomic_store_explicit(&coral_container_of(l, coral_segment_t, link)->pages[0].owner, NULL,
                              memory_order_release);
    }
    heap->huge_blocks.first = heap->huge_blocks.last = NULL;
    coral_huge_lists_unlock();
}

void coral_heap_pages_visit(coral_heap_t *heap, coral_heap_page_fn fn, void *arg) {
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++)
        for (coral_link_t *l = heap->queues[q].first; l != NULL; l = l->next)
            fn(coral_container_of(l, coral_page_t, link), arg);
    /* Any thread may free a huge block: its free unlinks it under the
     * lock before the segment goes, so fn runs under the lock. */
    coral_huge_lists_lock();
    for (coral_link_t *l = heap->huge_blocks.first; l != NULL; l = l->next)
        fn(&coral_container_of(l, coral_segment_t, link)->pages[0], arg);
    coral_huge_lists_unlock();
}

/* Free every page of the heap, live blocks and all, in time proportional
 * to the pages. First every page stops notifying, so no remote free is
 * still pushing to delayed_pages, whose pages are then released with the
 * others. */
static void heap_release_all(coral_heap_t *heap) {
    quarantine_release_all(heap);
    heap_pages_never_notify(heap);
    for (coral_page_t *page =
             atomic_exchange_explicit(&heap->owner.delayed_pages, NULL, memory_order_acquire);
         page != NULL; page = atomic_load_explicit(&page->delayed_next, memory_order_relaxed))
        atomic_store_explicit(&page->delayed_listed, 0, memory_order_relaxed);
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++)
        while (heap->queues[q].first != NULL) {
            if (CORAL_VALGRIND) coral_page_valgrind_forget(coral_queue_first(heap, q));
            if (CORAL_SECURE) coral_page_check_live_canaries(coral_queue_first(heap, q));
            page_release(coral_queue_first(heap, q));
        }
    /* The blocks are detached (owner NULL) under the lock: a free of one in
     * flight then finds it detached and leaves the (gone) list alone. */
    coral_huge_lists_lock();
    coral_link_t *l = heap->huge_blocks.first;
    for (coral_link_t *e = l; e != NULL; e = e->next)
        atomic_store_explicit(&coral_container_of(e, coral_segment_t, link)->pages[0].owner, NULL,
                              memory_order_relaxed);
    heap->huge_blocks.first = heap->huge_blocks.last = NULL;
    coral_huge_lists_unlock();
    while (l != NULL) {
        coral_link_t *next = l->next;
        coral_segment_t *seg = coral_container_of(l, coral_segment_t, link);
        CORAL_VG(VALGRIND_FREELIKE_BLOCK(seg->pages[0].start, 0));
        if (CORAL_SECURE && !coral_huge_canary_intact(seg))
            coral_misuse("heap overflow detected: huge block %p of %zu bytes was written past its "
                         "end (found when its heap was destroyed or reset)",
                         (void *)seg->pages[0].start, seg->huge_request);
        coral_huge_release(seg);
        l = next;
    }
}

void coral_heap_free_all(coral_heap_t *heap, bool keep) {
    if (CORAL_SECURE) coral_heap_ring_flush(false); /* (it may hold blocks of heap's pages) */
    heap_release_all(heap);
    if (keep) {
        coral_heap_init(heap, heap->thread);
        return;
    }
    coral_list_remove(&heap->thread->heaps, &heap->thread_link);
    heap->thread = NULL;
    coral_heap_pool_put(heap);
}

/* In the child of a fork, for the forking thread's heaps: a thread that was
 * in the middle of a remote free into one of them (delay state FREEING, see
 * page/page.c) does not exist in the child and will never finish it. The
 * page is either on delayed_pages already or never will be: then its free
 * blocks stay on thread_free until a collect of the whole heap (a leak at
 * worst, never a double use); the state goes back to NONE so the owner does
 * not wait for it forever. Threads that a program's child handler started
 * may push on those pages meanwhile: coral_page_freeing_reset keeps their
 * pushes. */
void coral_heap_after_fork_child(coral_heap_t *heap) {
    for (unsigned q = 0; q < CORAL_QUEUE_COUNT; q++) {
        for (coral_link_t *l = heap->queues[q].first; l != NULL; l = l->next) {
            coral_page_t *page = coral_container_of(l, coral_page_t, link);
            uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
            if ((tf & CORAL_DELAY_MASK) != CORAL_DELAY_FREEING) continue;
            coral_test_point(CORAL_TP_FORK_CHILD_FREEING, page);
            (void)coral_page_freeing_reset(page, tf);
        }
    }
}
