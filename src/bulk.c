/* Bulk allocation: many blocks per call.
 *
 * coral_malloc_bulk fills its array from a page at a time: the page's free
 * list, then the blocks its owner freed (local_free), then blocks never
 * handed out yet, whose addresses it computes without touching them.
 *
 * coral_free_bulk keeps a run (a chain of blocks) per 64 KiB slice seen,
 * direct-mapped by the slice's number: a block whose slot holds its slice's
 * run is linked on with no page lookup, and a long stretch of one slice
 * (an array in address order) is taken whole. Each run goes on its page's
 * list in one push at the end (one CAS for other threads' pages). A run
 * that frees the last blocks in use of the calling thread's page empties
 * it: as after free(), the page goes back to its segment unless it is the
 * first of its class, which is reset instead (after a long run), so that
 * the next allocations carve its blocks by address, no list to walk. */
#include <errno.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"
#include "stats.h"

/* ---- coral_malloc_bulk -------------------------------------------------------- */

/* Blocks of *list into out[0..want), taken off the list; how many. */
static size_t take_list(coral_block_t **list, void **out, size_t want) {
    coral_block_t *block = *list;
    size_t got = 0;
    while (block != NULL && got < want) {
        out[got++] = block;
        block = block->next;
    }
    *list = block;
    return got;
}

/* Up to want blocks never handed out yet, by address: the ones after the
 * page's carved blocks (page->capacity counts blocks carved so far). */
static size_t take_uncarved(coral_page_t *page, void **out, size_t want) {
    size_t got = page->reserved - page->capacity;
    if (got > want) got = want;
    size_t bs = page->block_size;
    uint8_t *block = page->start + (size_t)page->capacity * bs;
    for (size_t i = 0; i < got; i++, block += bs) out[i] = block;
    page->capacity += (uint32_t)got;
    return got;
}

static bool page_can_serve(const coral_page_t *page) {
    return page->free != NULL || page->local_free != NULL || page->capacity < page->reserved;
}

/* Up to want blocks of page into out[]: free list, local_free, uncarved. */
static size_t take_from_page(coral_page_t *page, void **out, size_t want) {
    size_t got = take_list(&page->free, out, want);
    if (got < want && page->local_free != NULL)
        got += take_list(&page->local_free, out + got, want - got);
    if (got < want && page->capacity < page->reserved)
        got += take_uncarved(page, out + got, want - got);
    page->used += (uint32_t)got;
    return got;
}

/* Large and huge sizes, and a thread's first call: block by block. */
static size_t malloc_each(size_t size, size_t n, void **out) {
    coral_heap_t *heap = coral_tls_heap;
    if (size <= CORAL_CLASS_MAX_SIZE) {
        /* The first block sets the thread up; the rest can be batched. */
        if ((out[0] = coral_malloc_generic(size, heap, false)) == NULL) return 0;
        return 1 + coral_malloc_bulk(size, n - 1, out + 1);
    }
    size_t got = 0;
    while (got < n && (out[got] = coral_malloc_generic(size, heap, false)) != NULL) got++;
    return got;
}

/* n >= 2 blocks of one size class. */
static CORAL_NOINLINE size_t malloc_batch(size_t size, size_t n, void **out) {
    coral_heap_t *heap = coral_tls_heap;
    if (size > CORAL_CLASS_MAX_SIZE || heap == &coral_heap_empty) return malloc_each(size, n, out);
    unsigned cls = coral_size_class(size);
    size_t got = 0;
    while (got < n) {
        coral_page_t *page = heap->queues[cls].first;
        if (page == NULL || !page_can_serve(page)) {
            /* The first page is used up: the slow path's work, then the
             * next page with room (made first in the queue). */
            coral_periodic_work(heap);
            page = coral_heap_find_room(heap, cls);
            if (page == NULL) {
                errno = ENOMEM;
                break;
            }
        }
        got += take_from_page(page, out + got, n - got);
    }
#if CORAL_STATS_ENABLED
    __atomic_store_n(&heap->stat_allocs[cls], heap->stat_allocs[cls] + got, __ATOMIC_RELAXED);
#endif
    return got;
}

size_t coral_malloc_bulk(size_t size, size_t n, void **out) {
    /* A batch goes out of line, so that one block costs no more than the
     * malloc fast path (no registers to save). */
    if (coral_likely(n > 1)) return malloc_batch(size, n, out);
    if (n == 0) return 0;
    return (out[0] = coral_malloc_inline(size)) != NULL;
}

/* ---- coral_free_bulk -------------------------------------------------------------- */

/* A chain of blocks of one slice of a page, built while scanning: the
 * calling thread's page or another thread's. */
typedef struct run_s {
    uintptr_t key; /* the blocks' slice number (address >> 16), or NO_RUN */
    coral_block_t *head;
    uint32_t count;
    bool owned;
    coral_page_t *page;
    coral_block_t *tail;
} run_t;

/* No pointer's slice number: the key of a slot without a run. */
#define NO_RUN UINTPTR_MAX

/* Open runs, direct-mapped by slice: an array mixing blocks of up to about
 * this many slices keeps one run per slice. */
#define OPEN_RUNS 64

/* Another thread's page: the chain goes on thread_free in one CAS. */
static void run_free_remote(run_t *run) {
    coral_page_push_remote(run->page, run->head, run->tail, run->count);
}

/* The slot of a slice number: its index in its segment, mixed with the
 * segment's number, so that a segment's slices never share a slot. */
static unsigned run_slot(uintptr_t key) {
    return (unsigned)(key ^ (key >> (CORAL_SEGMENT_SHIFT - CORAL_SLICE_SHIFT))) % OPEN_RUNS;
}

/* The owner freed the last blocks in use of a page, `count` of them in one
 * run. As after free(), a page that is not the first of its class queue
 * goes back to its segment. The first is kept for the next allocations;
 * when every block it ever carved was in use (as after a malloc_bulk that
 * carved them), there is no list of free blocks to keep: it is reset, so
 * that the next allocations carve its blocks by address again. Else the
 * run is pushed as usual (then not carving again spares the next malloc()s
 * a carving step). Returns false when the run is still to be pushed. */
static bool page_emptied(coral_page_t *page, uint32_t count) {
    if (page->prev != NULL) {
        /* (Unless a remote free is telling the heap about it: then it stays
         * until the heap takes it, see heap.c, and the run is pushed.) */
        if (coral_page_notice_pending(page)) return false;
        page->used = 0;
        coral_page_retire(page);
        return true;
    }
    if (page->capacity != count) return false;
    page->used = 0;
    coral_page_reset_empty(page);
    return true;
}

/* The calling thread's page: the chain goes on local_free in one push (or
 * the page is emptied: page_emptied). */
static void run_free_local(run_t *run) {
    coral_page_t *page = run->page;
    /* The checks free() makes: more blocks freed than are in use, or the
     * block freed last freed again. */
    if (coral_unlikely(page->used < run->count || run->head == page->local_free))
        coral_fatal("double free detected: free_bulk gave %u blocks (one %p) to a page with "
                    "%u in use", run->count, (void *)run->head, page->used);
    if (run->count == page->used && page_emptied(page, run->count)) return;
    run->tail->next = page->local_free;
    page->local_free = run->head;
    page->used -= run->count;
}

static void run_flush(run_t *run) {
    coral_count_frees(run->page->class_idx, run->count);
    if (run->owned) run_free_local(run);
    else run_free_remote(run);
}

static void runs_flush(run_t *runs) {
    for (unsigned r = 0; r < OPEN_RUNS; r++)
        if (runs[r].key != NO_RUN) run_flush(&runs[r]);
}

/* The calling thread's class page of a slice (a full one is taken back to
 * its class queue), or NULL when the ordinary free must see the block: a
 * page with aligned blocks (it may point inside one), a large page. A slice
 * in no page is a double free (or a pointer never allocated). */
static coral_page_t *owned_class_page(coral_page_t *slice, const void *p) {
    coral_page_t *page = coral_slice_head(slice); /* a later slice leads to its head */
    if (coral_unlikely(page->slice_count == 0))
        coral_fatal("free_bulk: invalid pointer %p (in no page in use: double free?)", p);
    if (coral_likely(page->flags == 0)) return page;
    if (page->flags != CORAL_PAGE_IN_FULL || page->class_idx == CORAL_CLASS_LARGE) return NULL;
    coral_page_unfull(page);
    return page;
}

/* Another thread's class page holding p, or NULL when the ordinary free must
 * see p: a huge block, a page with aligned blocks, a full page (its owner
 * must hear of the free), a large page (always full). */
static coral_page_t *remote_class_page(coral_segment_t *seg, coral_page_t *slice) {
    if (seg->kind != CORAL_SEGMENT_NORMAL) return NULL;
    coral_page_t *page = coral_slice_head(slice);
    return __atomic_load_n(&page->flags, __ATOMIC_RELAXED) == 0 ? page : NULL;
}

/* The class page of p for a run, or NULL when the ordinary free must see
 * p: not in a segment's first 4 MiB (NULL, a huge block's later part), or
 * see owned_class_page and remote_class_page. *owned: the calling thread
 * owns the page. */
static coral_page_t *run_page(void *p, bool *owned) {
    if (coral_unlikely(coral_map_kind((uintptr_t)p) != CORAL_MAP_SEGMENT)) return NULL;
    coral_segment_t *seg = coral_ptr_segment(p);
    coral_page_t *slice = coral_segment_slice_of(seg, p);
    *owned = atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == coral_thread_id();
    return *owned ? owned_class_page(slice, p) : remote_class_page(seg, slice);
}

/* p's slice (number key) has no open run in its slot: p opens one (the run
 * in the slot is pushed first), or, when the ordinary free must see it, is
 * freed at once. */
static CORAL_NOINLINE void run_open(run_t *run, void *p, uintptr_t key) {
    bool owned = false;
    coral_page_t *page = run_page(p, &owned);
    if (coral_unlikely(page == NULL)) {
        coral_free_inline(p);
        return;
    }
    if (run->key != NO_RUN) run_flush(run);
    run->key = key;
    run->page = page;
    run->head = run->tail = p;
    run->count = 1;
    run->owned = owned;
}

static bool same_slice(const void *a, const void *b) {
    return (((uintptr_t)a ^ (uintptr_t)b) >> CORAL_SLICE_SHIFT) == 0;
}

/* The stretch of blocks[0]'s slice that starts at blocks, linked in array
 * order onto the front of its run; returns the stretch's end (the first
 * entry before end in another slice: NULL always is). */
static void *const *run_add_stretch(run_t *run, void *const *blocks, void *const *end) {
    uintptr_t first = (uintptr_t)blocks[0];
    coral_block_t *last = blocks[0];
    void *const *q = blocks + 1;
    /* Four at a time while all four are in the slice (one test for four). */
    while (end - q >= 4) {
        coral_block_t *a = q[0], *b = q[1], *c = q[2], *d = q[3];
        if (((((uintptr_t)a ^ first) | ((uintptr_t)b ^ first) | ((uintptr_t)c ^ first) |
              ((uintptr_t)d ^ first)) >> CORAL_SLICE_SHIFT) != 0)
            break;
        last->next = a;
        a->next = b;
        b->next = c;
        c->next = d;
        last = d;
        q += 4;
    }
    for (; q < end && same_slice(*q, blocks[0]); q++) {
        last->next = *q;
        last = *q;
    }
    last->next = run->head;
    run->head = blocks[0];
    run->count += (uint32_t)(q - blocks);
    return q;
}

/* How far on coral_free_bulk looks for a block of the same slice. */
#define LONG_STRETCH 8

void coral_free_bulk(void **ptrs, size_t n) {
    run_t runs[OPEN_RUNS];
    for (unsigned r = 0; r < OPEN_RUNS; r++) runs[r].key = NO_RUN;
    void *const *end = ptrs + n;
    for (void *const *q = ptrs; q < end;) {
        void *p = *q;
        uintptr_t key = (uintptr_t)p >> CORAL_SLICE_SHIFT;
        run_t *run = &runs[run_slot(key)];
        if (coral_unlikely(run->key != key)) {
            run_open(run, p, key);
            q++;
            continue;
        }
        /* The block LONG_STRETCH places on in the same slice: a long
         * stretch of it (an array in address order), taken whole. Else one
         * block. Both branches are predictable: an array is mostly one or
         * the other, and short stretches rarely pass the test. */
        if (end - q > LONG_STRETCH && same_slice(p, q[LONG_STRETCH])) {
            q = run_add_stretch(run, q, end);
            continue;
        }
        if (coral_unlikely(p == run->head)) /* as free() checks */
            coral_fatal("double free detected: free_bulk was given block %p twice in a row", p);
        ((coral_block_t *)p)->next = run->head;
        run->head = p;
        run->count++;
        q++;
    }
    runs_flush(runs);
}
