/* Bulk allocation: many blocks per call.
 *
 * coral_malloc_bulk first takes blocks of its class from the thread's bulk
 * cache (bulk_cache.h: blocks coral_free_bulk kept, addresses in arrays), then
 * fills the rest of its array from a page at a time: the page's free list,
 * then the blocks its owner freed (local_free), then blocks never handed
 * out yet, whose addresses it computes without touching them.
 *
 * coral_malloc_bulk_sizes takes a size per block: the malloc fast path in a
 * loop (one TLS load per call, no call per block), the slow paths for the
 * rest.
 *
 * coral_free_bulk puts scattered blocks of the classes coral_malloc_bulk
 * asks for in the bulk cache (see bulk_cache.h for which blocks may go there).
 * For the others it keeps a run (a chain of blocks) per 64 KiB slice seen,
 * direct-mapped by the slice's number: a block whose slot holds its slice's
 * run is linked on with no page lookup, and a stretch of one slice (8
 * entries or more: an array in address order) is taken whole. Each run goes
 * on its page's list in one push at the end (one CAS for other threads'
 * pages). A run
 * that frees the last blocks in use of the calling thread's page empties
 * it: as after free(), the page goes back to its segment unless it is the
 * first of its class, which is reset instead (after a long run), so that
 * the next allocations carve its blocks by address, no list to walk. */
#include <errno.h>
#include <string.h>

#include "api/bulk_cache.h"
#include "api/profile.h"

/* ---- the chase hint ------------------------------------------------------------
 * Taking a free list is a chase: each block's address is in the block
 * before, so a list of blocks scattered over more than the L1 cache costs a
 * cache miss per block, one after the other. coral_free_bulk knows where a
 * run's blocks lie, so in word 1 of each block it links it also writes the
 * block linked HINT_AHEAD entries earlier in its array: for a scattered run
 * that is the block about HINT_AHEAD links further down the chain, and
 * take_list prefetches it, so the chase finds its next blocks in cache.
 * Word 1 of a free block is only a hint: a block freed by free() holds the
 * program's old data there, and a prefetch of any address is harmless
 * (it never faults). Blocks are at least 16 bytes: word 1 is always there;
 * free_is_zero lists never hold a block freed by anyone (page.c), so the
 * hint never spoils a block calloc takes as zero. (A stretch, linked in
 * array order, gets the entry HINT_AHEAD after each block instead: see
 * run_add_stretch.) */
#define HINT_AHEAD 8
_Static_assert(CORAL_ALIGNMENT >= 2 * sizeof(void *), "a free block has a word 1");

/* The default build keeps a freed block's freed mark in word 1 (page.h):
 * there the chase hints give way to it. */
#define BULK_HINTS (!CORAL_FREED_MARKS)

static inline void hint_set(void *block, void *ahead) {
    if (BULK_HINTS) ((void **)block)[1] = ahead;
}
static inline void *hint_of(const coral_block_t *block) { return ((void *const *)block)[1]; }

/* Are a, b, c, d in ascending address order? (No branch: one test.) */
static inline bool ascending(const void *a, const void *b, const void *c, const void *d) {
    return ((uintptr_t)a < (uintptr_t)b) & ((uintptr_t)b < (uintptr_t)c) &
           ((uintptr_t)c < (uintptr_t)d);
}

/* ---- coral_malloc_bulk -------------------------------------------------------- */

/* Blocks of *list into out[0..want), taken off the list; how many. */
static size_t take_list(coral_block_t **list, void **out, size_t want) {
    coral_block_t *block = *list;
    size_t got = 0;
    while (block != NULL && got < want) {
        out[got++] = block;
        if (BULK_HINTS) __builtin_prefetch(hint_of(block), 0, 3);
        coral_block_t *next = coral_block_next(block);
        coral_freed_mark_clear(block); /* handed out */
        block = next;
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
    /* Blocks of a span used before may hold a freed mark its earlier
     * blocks left (page.h); a fresh span's are zero, left untouched. */
    bool clear = CORAL_FREED_MARKS && !page->is_fresh;
    for (size_t i = 0; i < got; i++, block += bs) {
        out[i] = block;
        if (clear) coral_freed_mark_clear((coral_block_t *)block);
    }
    coral_page_set_capacity(page, page->capacity + (uint32_t)got);
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
    if (size <= CORAL_CLASS_SERVED_MAX) {
        /* The first block sets the thread up; the rest can be batched. (A
         * thread past its exit stays without a heap: block by block.) */
        if ((out[0] = coral_malloc_generic(size, heap, false)) == NULL) return 0;
        if (coral_tls_heap != &coral_heap_empty) return 1 + coral_malloc_bulk(size, n - 1, out + 1);
        heap = coral_tls_heap;
    }
    size_t got = size <= CORAL_CLASS_SERVED_MAX;
    while (got < n && (out[got] = coral_malloc_generic(size, heap, false)) != NULL) got++;
    return got;
}

/* Up to n blocks of class cls from the thread's bulk cache; how many. */
static size_t take_cached(unsigned cls, void **out, size_t n) {
    coral_bulk_cache_want(cls);
    coral_bulk_cache_t *cache = coral_bulk_cache_for_alloc();
    if (cache == NULL) return 0;
    size_t got = cache->top[cls] != NULL ? coral_bulk_cache_take(cache, cls, out, n) : 0;
    coral_bulk_cache_release(cache, -(int64_t)(got * coral_class_size(cls)));
    return got;
}

/* n >= 2 blocks of one size class: the bulk cache's, then page by page. */
static CORAL_NOINLINE size_t malloc_batch(size_t size, size_t n, void **out) {
    coral_heap_t *heap = coral_tls_heap;
    if (size > CORAL_CLASS_SERVED_MAX || heap == &coral_heap_empty)
        return malloc_each(size, n, out);
    unsigned cls = coral_size_class(size);
    size_t got = take_cached(cls, out, n);
    while (got < n) {
        coral_page_t *page = coral_queue_first(heap, cls);
        if (page == NULL || !page_can_serve(page)) {
            /* The first page is used up: the slow path's work, then the
             * next page with room (made first in the queue). */
            coral_heap_periodic_work(heap);
            page = coral_heap_find_room(heap, cls);
            if (page == NULL) {
                errno = ENOMEM;
                break;
            }
        }
        got += take_from_page(page, out + got, n - got);
    }
    coral_heap_count(heap, allocs, cls, got);
    return got;
}

/* CORAL_BULK_BLOCKWISE builds: each block through malloc, with its checks. */
static size_t blockwise_malloc(const size_t *sizes, size_t size, size_t n, void **out) {
    for (size_t i = 0; i < n; i++)
        if ((out[i] = coral_malloc_inline(sizes != NULL ? sizes[i] : size)) == NULL) return i;
    return n;
}

size_t coral_malloc_bulk(size_t size, size_t n, void **out) {
    if (CORAL_BULK_BLOCKWISE || coral_profile_on) return blockwise_malloc(NULL, size, n, out);
    /* A batch goes out of line, so that one block costs no more than the
     * malloc fast path (no registers to save). */
    if (coral_likely(n > 1)) return malloc_batch(size, n, out);
    if (n == 0) return 0;
    return (out[0] = coral_malloc_inline(size)) != NULL;
}

/* ---- coral_malloc_bulk_sizes ------------------------------------------------ */

/* A block of sizes[i] bytes the inline pop could not give: the page of its
 * direct[] entry is out of free blocks, the size is above
 * CORAL_DIRECT_MAX_SIZE, or the thread is not set up yet. Out of line, so
 * that the loop below keeps its registers. */
static CORAL_NOINLINE void *malloc_sizes_slow(size_t size) {
    coral_heap_t *heap = coral_tls_heap;
    if (size <= CORAL_DIRECT_MAX_SIZE) return coral_malloc_refill(size, heap, false);
    return coral_malloc_generic(size, heap, false);
}

size_t coral_malloc_bulk_sizes(const size_t *sizes, size_t n, void **out) {
    if (CORAL_BULK_BLOCKWISE || coral_profile_on) return blockwise_malloc(sizes, 0, n, out);
    size_t i = 0;
    while (i < n) {
        /* The heap is loaded once per stretch of inline pops; the slow path
         * may set the thread up (coral_tls_heap changes from the empty heap
         * to the thread's own), so it is loaded again after each. The empty
         * heap serves no size through direct[] (direct_end 0), so its
         * calls always take the slow path. */
        coral_heap_t *heap = coral_tls_heap;
        for (; i < n; i++) {
            size_t size = sizes[i];
            if (coral_unlikely(size >= heap->direct_end)) break;
            /* The malloc fast path without the call, the TLS load and the
             * refill: a page with no free block goes to the slow path below. */
            coral_page_t *page;
            coral_block_t *block = coral_pop_direct(heap, size, &page);
            if (coral_unlikely(block == NULL)) break;
            coral_freed_mark_clear(block);
            out[i] = block;
        }
        if (i == n) break;
        void *p = malloc_sizes_slow(sizes[i]);
        if (coral_unlikely(p == NULL)) break; /* the slow path set errno to ENOMEM */
        out[i++] = p;
    }
    return i;
}

/* ---- coral_free_bulk -------------------------------------------------------------- */

/* Open runs, direct-mapped by slice: an array mixing blocks of up to about
 * this many slices keeps one run per slice. */
#define OPEN_RUNS 64

/* No pointer's slice number: the key of a slot without a run. */
#define NO_RUN UINTPTR_MAX

/* The open runs: chains of blocks of one slice of a page each, built while
 * scanning, the calling thread's page or another thread's. What the loop
 * over the blocks reads and writes per block (the slot's key, where its
 * blocks go, chain head and count) is in arrays of its own, indexed by
 * slot; the rest is only read when a run is opened or pushed. Slot r holds
 * a run exactly when key[r] != NO_RUN; then its page is page[r], and
 * head[r] .. tail[r] is its chain of count[r] blocks, all in slice
 * key[r] & ~CACHED_KEY. A slot whose key has CACHED_KEY set sends its
 * blocks to the bulk cache (class cache_cls[r], block_size[r] bytes each)
 * while the cache has room; its run may have no block (count 0, head NULL):
 * the per-block loop, which compares the key with the block's slice
 * number, then goes out of line for it, so that arrays with no block for
 * the cache pay nothing for it. */
#define CACHED_KEY ((uintptr_t)1 << 63) /* slice numbers are below 2^48 */

typedef struct runs_s {
    uintptr_t key[OPEN_RUNS]; /* the blocks' slice number (address >> 16), or NO_RUN */
    coral_block_t *head[OPEN_RUNS];
    uintptr_t count[OPEN_RUNS]; /* (a word: indexed like key and head) */
    uint32_t block_size[OPEN_RUNS];
    uint8_t cache_cls[OPEN_RUNS];
    bool owned[OPEN_RUNS]; /* page[r] is the calling thread's */
    coral_page_t *page[OPEN_RUNS];
    coral_block_t *tail[OPEN_RUNS];
    /* The default build's checks of each block (page.h): page[r]'s start,
     * block-start multiplier and end of its blocks. */
    uint8_t *start[OPEN_RUNS];
    uint64_t start_mul[OPEN_RUNS];
    uint64_t starts_x[OPEN_RUNS]; /* the bound of the products of its block starts */
    coral_bulk_cache_t *cache;    /* the thread's bulk cache, taken; NULL: none this call */
    int64_t cache_room; /* bytes it may still take (put_cls's open entries not counted yet) */
    bool cache_full;    /* it ran out of room */
    /* The put cursor: blocks of class put_cls (0: none) go to put, which
     * runs up to put_end in that class's top chunk (reserved, see bulk_cache.h),
     * put_end no further than cache_room allows. What was written since
     * put_from is committed, counted and taken off cache_room when the
     * cursor moves to another class or chunk, and at the end (put_close). */
    unsigned put_cls;
    uint32_t put_size; /* put_cls's block size */
    uintptr_t put_key; /* the cache's marker key */
    void **put, **put_end, **put_from;
    bool count_frees; /* false in a cache flush: its blocks were counted when cached */
} runs_t;

static void runs_init(runs_t *runs, coral_bulk_cache_t *cache, int64_t room, bool count_frees) {
    for (unsigned r = 0; r < OPEN_RUNS; r++) runs->key[r] = NO_RUN;
    runs->cache = cache;
    runs->cache_room = room;
    runs->cache_full = false;
    runs->put_cls = 0;
    runs->count_frees = count_frees;
}

/* The slot of a slice number: its index in its segment (so that a segment's
 * slices never share a slot; two segments' slices may). */
_Static_assert(OPEN_RUNS == CORAL_SLICES_PER_SEGMENT, "a slot per slice of a segment");
static size_t run_slot(uintptr_t key) { return key % OPEN_RUNS; }

/* The owner freed the last blocks in use of a page, `count` of them in one
 * run. As after free(), a page the heap does not keep goes back to its
 * segment. A kept one (coral_heap_keeps_empty_page) stays for the next
 * allocations; when every block it ever carved was in use (as after a
 * malloc_bulk that carved them), there is no list of free blocks to keep:
 * it is reset, so that the next allocations carve its blocks by address
 * again. Else the run is pushed as usual (then not carving again spares the
 * next malloc()s a carving step). Returns false when the run is still to be
 * pushed. */
static bool page_emptied(coral_page_t *page, uint32_t count) {
    if (!coral_heap_keeps_empty_page(page)) {
        /* (Unless a remote free is telling the heap about it: then it stays
         * until the heap takes it, see heap.c, and the run is pushed.) */
        if (coral_page_notice_pending(page)) return false;
        page->used = 0;
        coral_heap_page_retire(page);
        return true;
    }
    if (page->capacity != count) return false;
    page->used = 0;
    coral_page_reset_empty(page);
    coral_heap_page_retire(page); /* (parked unless first in its queue) */
    return true;
}

/* The calling thread's page: the chain goes on local_free in one push (or
 * the page is emptied: page_emptied). A full page first goes back to its
 * class queue, as free() does. */
static void run_free_local(runs_t *runs, size_t r) {
    coral_page_t *page = runs->page[r];
    uint32_t count = (uint32_t)runs->count[r];
    coral_block_t *head = runs->head[r];
    /* A parked page (page/page.c) counts every block in use until taken
     * back: a run into it frees blocks that were free already. */
    if (coral_unlikely(coral_page_is_parked(page))) coral_page_take_remote(page);
    /* The checks free() makes: more blocks freed than are in use, or the
     * block freed last freed again. */
    if (coral_unlikely(page->used < count ||
                       coral_page_freed_last(page, head))) { /* warn: it leaks */
        coral_misuse("double free detected: free_bulk gave %u blocks (one %p) to a page "
                     "with %u in use",
                     count, (void *)head, page->used);
        return;
    }
    if (coral_slice_flags(page) & CORAL_PAGE_IN_FULL) coral_heap_page_unfull(page);
    if (count == page->used && page_emptied(page, count)) return;
    coral_block_set_next(runs->tail[r], page->local_free);
    page->local_free = head;
    page->used -= count;
    if (page->used == 0) coral_heap_page_retire(page); /* a kept page: parked unless first */
}

/* Push run r, if it has blocks: on local_free (the calling thread's page),
 * or on thread_free in one CAS (another thread's page). */
static void run_flush(runs_t *runs, size_t r) {
    if (runs->count[r] == 0) return; /* every block went to the bulk cache */
    if (runs->count_frees) coral_count_frees(runs->page[r]->class_idx, runs->count[r]);
    if (runs->owned[r])
        run_free_local(runs, r);
    else
        coral_page_push_remote(runs->page[r], runs->head[r], runs->tail[r],
                               (uint32_t)runs->count[r]);
}

/* The blocks put since the cursor opened: committed to the cache, counted
 * as freed, their bytes taken off the room. */
static void put_close(runs_t *runs) {
    if (runs->put_cls == 0) return;
    size_t n = (size_t)(runs->put - runs->put_from);
    coral_bulk_cache_commit(runs->cache, runs->put_cls, runs->put);
    coral_count_frees(runs->put_cls, n);
    runs->cache_room -= (int64_t)(n * runs->put_size);
    runs->put_cls = 0;
}

static void runs_flush(runs_t *runs) {
    put_close(runs);
    for (unsigned r = 0; r < OPEN_RUNS; r++)
        if (runs->key[r] != NO_RUN) run_flush(runs, r);
}

/* p is no block start of its run's page, or holds the page's freed mark
 * (it may be free already, maybe in a run of this call): every run is
 * pushed and closed, then p goes through free(), which reports a misuse
 * or, for a mark that was the program's data, frees it. */
static CORAL_NOINLINE void run_refuse(runs_t *runs, void *p) {
    runs_flush(runs);
    for (unsigned r = 0; r < OPEN_RUNS; r++) runs->key[r] = NO_RUN;
    coral_free_inline(p);
}

/* Run r's checks of its blocks, for page: the owner's multiplier and
 * carved blocks' bound (its line: the page is the caller's), or, for
 * another thread's page, M computed from the shared line and the bound of
 * all its blocks (a large page: its one block). */
static void run_open_checks(runs_t *runs, size_t r, const coral_page_t *page, bool owned) {
    runs->start[r] = page->start;
    runs->start_mul[r] = owned ? page->owner_start_mul : coral_page_start_mul(page);
    uint32_t blocks = page->class_idx == CORAL_CLASS_LARGE ? 1 : page->reserved;
    runs->starts_x[r] = (uint64_t)(owned ? page->capacity : blocks) *
                        ((uint64_t)page->block_size * runs->start_mul[r]);
}

/* Does run r take p: a block start of its page, without the freed mark? */
CORAL_INLINE bool run_accepts(const runs_t *runs, size_t r, const void *p) {
    if (!CORAL_FREED_MARKS) return true;
    size_t offset = (size_t)((const uint8_t *)p - runs->start[r]);
    return coral_block_start_test(runs->start_mul[r], runs->starts_x[r], offset) &&
           !coral_freed_mark_seen(p);
}

/* p taken by run r: its freed mark written. */
CORAL_INLINE void run_mark(const runs_t *runs, size_t r, void *p) {
    (void)runs;
    (void)r;
    coral_freed_mark_set(p);
}

/* The calling thread's class page of a slice, or NULL when the ordinary
 * free must see the block: a page with aligned blocks (it may point inside
 * one), a large page, a slice in no page (a double free or a pointer never
 * allocated: the ordinary free reports it). */
static coral_page_t *owned_class_page(coral_page_t *slice) {
    coral_page_t *page = coral_slice_head(slice); /* a later slice leads to its head */
    if (coral_unlikely(page->slice_count == 0)) return NULL;
    unsigned flags = coral_slice_flags(page);
    if (coral_likely(flags == 0)) return page;
    if (flags != CORAL_PAGE_IN_FULL || page->class_idx == CORAL_CLASS_LARGE) return NULL;
    return page;
}

/* Another thread's page holding p, or NULL when the ordinary free must see
 * p: a huge block, a page with aligned blocks (p may point inside one), a
 * slice in no page (the ordinary free reports it). A run's push is what the
 * ordinary remote free does for one block (coral_page_push_remote: a full
 * page's owner hears of it there), so full and large pages take runs too.
 * Reads only the descriptor's shared cache line (segment/segment.h). */
static coral_page_t *remote_class_page(coral_segment_t *seg, coral_page_t *slice) {
    if (seg->kind != CORAL_SEGMENT_NORMAL) return NULL;
    coral_page_t *page = coral_slice_head(slice);
    if (page->slice_count == 0 || (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED)) return NULL;
    return page;
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
    return *owned ? owned_class_page(slice) : remote_class_page(seg, slice);
}

/* The class whose bulk cache takes the blocks of page (a run page), or 0:
 * none (no cache this call, a large block, a twin class's page, a page
 * with aligned blocks, a user heap's; see bulk_cache.h). Its class_idx is
 * read once per run, for another thread's page too: it never changes while
 * the page has a block in use. */
static unsigned cache_class_of(const runs_t *runs, const coral_page_t *page) {
    if (runs->cache == NULL || page->class_idx >= CORAL_CLASS_COUNT || page->is_user_heap ||
        (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED))
        return 0;
    return runs->cache->want[page->class_idx] ? page->class_idx : 0;
}

/* p's slice (number key) has no open run in its slot r: open one, with no
 * blocks yet (the run in the slot is pushed first), a cached slot if the
 * page's blocks may go to the bulk cache. Or, when the ordinary free must
 * see p, free it at once and return false. */
CORAL_INLINE bool run_open(runs_t *runs, size_t r, void *p, uintptr_t key) {
    bool owned = false;
    coral_page_t *page = run_page(p, &owned);
    if (coral_unlikely(page == NULL)) {
        coral_free_inline(p);
        return false;
    }
    if (runs->key[r] != NO_RUN) run_flush(runs, r);
    runs->page[r] = page;
    runs->head[r] = runs->tail[r] = NULL;
    runs->count[r] = 0;
    runs->owned[r] = owned;
    if (CORAL_FREED_MARKS) run_open_checks(runs, r, page, owned);
    unsigned cls = cache_class_of(runs, page);
    runs->key[r] = cls != 0 ? key | CACHED_KEY : key;
    runs->cache_cls[r] = (uint8_t)cls;
    if (cls != 0) runs->block_size[r] = (uint32_t)page->block_size;
    return true;
}

/* The cursor moved to cached slot r's class (closed first if open
 * elsewhere or full); false when the cache has no room for one more of
 * its blocks. */
static CORAL_NOINLINE bool put_open(runs_t *runs, size_t r) {
    put_close(runs);
    unsigned cls = runs->cache_cls[r];
    uint32_t size = runs->block_size[r];
    if (runs->cache_room < (int64_t)size) return false;
    void **start, **end = coral_bulk_cache_reserve(runs->cache, cls, &start);
    if (end == NULL) return false;
    size_t fit = (size_t)(runs->cache_room / size);
    if ((size_t)(end - start) > fit) end = start + fit;
    runs->put_cls = cls;
    runs->put_size = size;
    runs->put_key = runs->cache->key;
    runs->put = runs->put_from = start;
    runs->put_end = end;
    return true;
}

/* p (of cached slot r's slice) into the bulk cache; false when it has no
 * room left for it: then the slot becomes a plain run. */
CORAL_INLINE bool run_cache(runs_t *runs, size_t r, void *p) {
    if (coral_unlikely(runs->cache_cls[r] != runs->put_cls || runs->put == runs->put_end) &&
        !put_open(runs, r)) {
        runs->key[r] &= ~CACHED_KEY;
        runs->cache_full = true;
        return false;
    }
    if (coral_unlikely(!run_accepts(runs, r, p))) {
        run_refuse(runs, p);
        return true;
    }
    void **at = runs->put; /* (loaded before p's marker is stored: p might alias it) */
    coral_bulk_cache_mark_in(runs->put_key, p);
    *at = p;
    runs->put = at + 1;
    return true;
}

/* p as the first block of run r (empty). */
static void run_link_first(runs_t *runs, size_t r, void *p) {
    if (coral_unlikely(!run_accepts(runs, r, p))) {
        run_refuse(runs, p);
        return;
    }
    run_mark(runs, r, p);
    coral_block_set_next(p, NULL);
    runs->head[r] = runs->tail[r] = p;
    runs->count[r] = 1;
}

static bool same_slice(const void *a, const void *b) {
    return (((uintptr_t)a ^ (uintptr_t)b) >> CORAL_SLICE_SHIFT) == 0;
}

/* The stretch of blocks[0]'s slice that starts at blocks, linked in array
 * order onto the front of run r (open, of that slice); returns the
 * stretch's end (the first entry before end in another slice: NULL always
 * is). */
static void *const *run_add_stretch(runs_t *runs, size_t r, void *const *blocks, void *const *end) {
    if (!run_accepts(runs, r, blocks[0])) return blocks; /* (free_stretch refuses it) */
    run_mark(runs, r, blocks[0]);
    uintptr_t first = (uintptr_t)blocks[0];
    coral_block_t *last = blocks[0];
    void *const *q = blocks + 1;
    /* A stretch's chain runs in array order: a block's chase hint is the
     * entry HINT_AHEAD after it, written while there is one, for four
     * entries not in ascending address order. (An array in address order,
     * the usual stretch, is a chase the hardware prefetcher follows, and
     * its page is often emptied and reset, the list never read.) */
    /* Four at a time while all four are in the slice (one test for four). */
    while (end - q >= 4) {
        coral_block_t *a = q[0], *b = q[1], *c = q[2], *d = q[3];
        if (((((uintptr_t)a ^ first) | ((uintptr_t)b ^ first) | ((uintptr_t)c ^ first) |
              ((uintptr_t)d ^ first)) >>
             CORAL_SLICE_SHIFT) != 0)
            break;
        /* (A block given twice in the stretch finds its mark, written by
         * the first: the one-by-one loop below stops before it.) */
        if (!run_accepts(runs, r, a)) break;
        run_mark(runs, r, a);
        if (!run_accepts(runs, r, b) || !run_accepts(runs, r, c) || !run_accepts(runs, r, d)) {
            coral_block_set_next(last, a);
            last = a;
            q++;
            break;
        }
        if (end - q >= HINT_AHEAD + 4 && !ascending(a, b, c, d)) {
            hint_set(a, q[HINT_AHEAD]);
            hint_set(b, q[HINT_AHEAD + 1]);
            hint_set(c, q[HINT_AHEAD + 2]);
            hint_set(d, q[HINT_AHEAD + 3]);
        }
        run_mark(runs, r, b);
        run_mark(runs, r, c);
        run_mark(runs, r, d);
        coral_block_set_next(last, a);
        coral_block_set_next(a, b);
        coral_block_set_next(b, c);
        coral_block_set_next(c, d);
        last = d;
        q += 4;
    }
    for (; q < end && same_slice(*q, blocks[0]) && run_accepts(runs, r, *q); q++) {
        run_mark(runs, r, *q);
        coral_block_set_next(last, *q);
        last = *q;
    }
    coral_block_set_next(last, runs->head[r]);
    runs->head[r] = blocks[0];
    runs->count[r] += (uintptr_t)(q - blocks);
    return q;
}

/* p linked on the front of run r (open, of p's slice, with a block), with
 * its chase hint. */
CORAL_INLINE void run_link(runs_t *runs, size_t r, void *p, void *ahead) {
    coral_block_t *head = runs->head[r];
    if (coral_unlikely(p == head)) { /* as free() checks */
        coral_misuse("double free detected: free_bulk was given block %p twice in a row", p);
        return;
    }
    if (coral_unlikely(!run_accepts(runs, r, p))) {
        run_refuse(runs, p);
        return;
    }
    run_mark(runs, r, p);
    hint_set(p, ahead);
    coral_block_set_next(p, head);
    runs->head[r] = p;
    runs->count[r]++;
}

/* free_one's other cases: p's slot holds no run of its slice (a run is
 * opened, and p goes to the cache if the slot is a cached one), or a cached
 * run whose cache just ran out of room (now a plain run); then p is linked
 * on the run, as its first block or not. */
static CORAL_NOINLINE void free_one_other(runs_t *runs, size_t r, void *p, uintptr_t key,
                                          void *ahead) {
    if ((runs->key[r] & ~CACHED_KEY) != key) {
        if (!run_open(runs, r, p, key)) return;
        if (runs->key[r] != key && run_cache(runs, r, p)) return;
    }
    if (runs->count[r] == 0)
        run_link_first(runs, r, p);
    else
        run_link(runs, r, p, ahead);
}

/* One block of a scattered stretch: linked on its slice's open run, or
 * into the bulk cache, or (out of line) a new run. The cache's test comes
 * second: an array with no block for it pays for it only when it opens a
 * run. ahead: the array's entry HINT_AHEAD before p (or NULL), its chase
 * hint. */
CORAL_INLINE void free_one(runs_t *runs, void *p, void *ahead) {
    uintptr_t key = (uintptr_t)p >> CORAL_SLICE_SHIFT;
    size_t r = run_slot(key);
    uintptr_t slot_key = runs->key[r];
    if (coral_likely(slot_key == key))
        run_link(runs, r, p, ahead);
    else if (slot_key != (key | CACHED_KEY) || !run_cache(runs, r, p))
        free_one_other(runs, r, p, key, ahead);
}

/* The stretch of q[0]'s slice that starts at q (at least 2 entries), taken
 * whole, or as far as the bulk cache takes it; returns where it stopped. */
static CORAL_NOINLINE void *const *free_stretch(runs_t *runs, void *const *q, void *const *end) {
    uintptr_t key = (uintptr_t)q[0] >> CORAL_SLICE_SHIFT;
    size_t r = run_slot(key);
    /* The ordinary free must see q[0] (NULL, aligned blocks, a large or a
     * huge block): run_open freed it; the rest of its slice go one by one
     * (free_one sends each the same way). */
    if ((runs->key[r] & ~CACHED_KEY) != key && !run_open(runs, r, q[0], key)) return q + 1;
    if (coral_unlikely(!run_accepts(runs, r, q[0]))) {
        run_refuse(runs, q[0]);
        return q + 1;
    }
    /* A new run starts with q[0] alone, the rest linked in front of it
     * (the order docs/experiments/, "The bulk cache", measured the faster to
     * take back). */
    if (runs->count[r] == 0) run_link_first(runs, r, q++[0]);
    return run_add_stretch(runs, r, q, end);
}

/* coral_free_bulk looks at the array in groups of this many entries. */
#define GROUP 8

/* Free ptrs[0..n) through the runs (and the cache, if runs has one). */
static void free_array(runs_t *runs, void *const *ptrs, size_t n) {
    void *const *q = ptrs, *const *end = ptrs + n;
    /* A group of entries all in one slice starts a stretch taken whole (an
     * array in address order, a run of neighbours); else its entries go
     * one by one. One test per group, no branch per entry on where it
     * lies: the test is predictable (an array is mostly one kind or the
     * other), and neighbours of a few blocks are linked one by one. */
    while (end - q >= GROUP) {
        uintptr_t first = (uintptr_t)q[0], differ = 0;
        for (unsigned k = 1; k < GROUP; k++) differ |= (uintptr_t)q[k] ^ first;
        if (differ >> CORAL_SLICE_SHIFT == 0) {
            q = free_stretch(runs, q, end);
            continue;
        }
        /* (the chase hints: the entries HINT_AHEAD back, none at the start) */
        void *const *back = q - ptrs >= HINT_AHEAD ? q - HINT_AHEAD : NULL;
#pragma GCC unroll 8
        for (unsigned k = 0; k < GROUP; k++) free_one(runs, q[k], back ? back[k] : NULL);
        q += GROUP;
    }
    for (; q < end; q++) free_one(runs, *q, q - ptrs >= HINT_AHEAD ? q[-HINT_AHEAD] : NULL);
    runs_flush(runs);
}

void coral_free_bulk(void **ptrs, size_t n) {
    /* Blockwise builds: each block through free, with its checks; the
     * profiler: free forgets sampled blocks (profile.h). */
    if (CORAL_BULK_BLOCKWISE || coral_profile_on) {
        for (size_t i = 0; i < n; i++) coral_free_inline(ptrs[i]);
        return;
    }
    if (n == 0) return;
    runs_t runs;
    int64_t room = 0;
    coral_bulk_cache_t *cache = coral_bulk_cache_for_free(&room);
    runs_init(&runs, cache, room, true);
    free_array(&runs, ptrs, n);
    if (cache == NULL) return;
    int64_t added = room - runs.cache_room;
    if (runs.cache_full)
        coral_bulk_cache_release_overflowed(cache, added);
    else
        coral_bulk_cache_release(cache, added);
    /* A safe point (no lock held) to start the purge thread if the cache
     * made it wanted. */
    coral_purger_start_if_wanted();
}

void coral_bulk_free_uncached(void *const *ptrs, size_t n) {
    runs_t runs;
    runs_init(&runs, NULL, 0, false);
    free_array(&runs, ptrs, n);
}
