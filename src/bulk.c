/* Bulk allocation: many blocks per call.
 *
 * coral_malloc_bulk takes whole runs of a page's free list at once, instead
 * of one fast-path call per block. coral_free_bulk groups the blocks of an
 * array by page (a few pages open at a time), so each page's list is touched
 * once per group: one push of a chain for the owner, one CAS for others. */
#include <errno.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"
#include "stats.h"

size_t coral_malloc_bulk(size_t size, size_t n, void **out) {
    if (n <= 1) { /* nothing to batch: the fast path */
        if (n == 0) return 0;
        return (out[0] = coral_malloc_inline(size)) != NULL;
    }
    coral_heap_t *heap = coral_tls_heap;
    if (size > CORAL_CLASS_MAX_SIZE || heap == &coral_heap_empty) {
        /* One block first: it sets the thread up, and large blocks have no
         * free list to take from. */
        size_t got = 0;
        if (size <= CORAL_CLASS_MAX_SIZE) {
            if ((out[0] = coral_malloc_generic(size, heap, false)) == NULL) return 0;
            return 1 + coral_malloc_bulk(size, n - 1, out + 1);
        }
        while (got < n && (out[got] = coral_malloc_generic(size, heap, false)) != NULL) got++;
        return got;
    }
    unsigned cls = coral_size_class(size);
    size_t got = 0;
    while (got < n) {
        coral_page_t *page = heap->queues[cls].first;
        if (page == NULL || page->free == NULL) {
            coral_heap_delayed_pages_collect(heap);
            page = coral_heap_find_page(heap, cls);
            if (page == NULL) {
                errno = ENOMEM;
                break;
            }
        }
        coral_block_t *block = page->free;
        size_t taken = 0;
        while (block != NULL && got + taken < n) {
            out[got + taken++] = block;
            block = block->next;
        }
        page->free = block;
        page->used += (uint32_t)taken;
#if CORAL_STATS_ENABLED
        __atomic_store_n(&heap->stat_allocs[cls], heap->stat_allocs[cls] + taken, __ATOMIC_RELAXED);
#endif
        got += taken;
    }
    return got;
}

/* A chain of blocks of one page, built while scanning the array. */
typedef struct run_s {
    coral_page_t *page;
    coral_block_t *head, *tail;
    uint32_t count;
} run_t;

/* Open runs, direct-mapped by page: an array mixing blocks of up to about
 * this many pages keeps one run per page. */
#define OPEN_RUNS 64

/* Owner: the chain goes on local_free in one push. */
static void run_free_local(run_t *run) {
    coral_page_t *page = run->page;
    if (page->used < run->count)
        coral_fatal("double free detected: free_bulk gave %u blocks to a page with %u in use",
                    run->count, page->used);
    run->tail->next = page->local_free;
    page->local_free = run->head;
    page->used -= run->count;
    if (page->used == 0 && page->prev != NULL) coral_page_retire(page);
}

/* Another thread's page: the chain goes on thread_free in one CAS. */
static void run_free_remote(run_t *run) {
    coral_page_push_remote(run->page, run->head, run->tail, run->count);
}

static void run_flush(run_t *run) {
    if (run->count == 0) return;
    coral_count_frees(run->page->class_idx, run->count);
    coral_segment_t *seg = coral_ptr_segment(run->page);
    if (atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == coral_thread_id())
        run_free_local(run);
    else
        run_free_remote(run);
    run->count = 0;
    run->page = NULL;
}

static unsigned run_slot(const coral_page_t *page) {
    return (unsigned)(((uintptr_t)page >> 7) ^ ((uintptr_t)page >> 22)) % OPEN_RUNS;
}

void coral_free_bulk(void **ptrs, size_t n) {
    run_t runs[OPEN_RUNS];
    for (unsigned r = 0; r < OPEN_RUNS; r++) runs[r].count = 0, runs[r].page = NULL;
    for (size_t i = 0; i < n; i++) {
        void *p = ptrs[i];
        uintptr_t a = (uintptr_t)p;
        if (coral_unlikely(coral_map_kind(a) != CORAL_MAP_SEGMENT)) {
            coral_free_slow(p);
            continue;
        }
        coral_segment_t *seg = coral_ptr_segment(p);
        coral_page_t *page = coral_segment_page_of(seg, p);
        /* Full, aligned, large or huge pages: the ordinary free knows them. */
        if (coral_unlikely(seg->kind != CORAL_SEGMENT_NORMAL ||
                           __atomic_load_n(&page->flags, __ATOMIC_RELAXED) != 0)) {
            coral_free_inline(p);
            continue;
        }
        coral_block_t *block = p;
        run_t *run = &runs[run_slot(page)];
        if (run->page != page) {
            run_flush(run); /* another page's run held the slot */
            run->page = page;
            run->head = run->tail = block;
            block->next = NULL;
            run->count = 1;
            continue;
        }
        block->next = run->head;
        run->head = block;
        run->count++;
    }
    for (unsigned r = 0; r < OPEN_RUNS; r++) run_flush(&runs[r]);
}
