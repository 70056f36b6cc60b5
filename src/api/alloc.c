/* The allocation API (coral_ names), first-class heaps' calls, and the
 * slow paths behind api.h. Every call takes its heap as a parameter: the
 * thread's own (coral_tls_heap) for malloc & co., a user heap for
 * coral_heap_*; the code is the same. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/bulk_cache.h"
#include "api/profile.h"
#include "api/remote_run.h"

static void show_stats_at_exit(void) { coral_stats_print(stderr); }

/* Once per process, on its first thread's set-up: what the api layer
 * needs that may allocate. */
static void api_process_init(void) {
    static _Atomic(int) done;
    if (atomic_exchange_explicit(&done, 1, memory_order_relaxed)) return;
    if (coral_option(CORAL_OPT_SHOW_STATS)) atexit(show_stats_at_exit);
    coral_profile_init();
}

/* Out of line: its callers are first-call paths, and one copy keeps the
 * library's first code window (cmake/hot-text.ld) from filling up. */
CORAL_NOINLINE coral_heap_t *coral_heap_ready(void) {
    coral_heap_t *heap = coral_tls_heap;
    if (coral_likely(heap != &coral_heap_empty)) return heap;
    heap = coral_thread_init();
    if (heap == NULL) return NULL;
    api_process_init();
    if (coral_profile_on) coral_profile_heap_start(heap); /* before its first page */
    return heap;
}

static void *enomem(void) {
    errno = ENOMEM;
    return NULL;
}

/* A block off page's free list (it has one), for a request of size bytes
 * of class cls; zero: cleared. The secure build's size counts the canary:
 * the block is checked and gets its canary here (page.h), with the page at
 * hand, and the bytes before the canary are cleared after the check. */
CORAL_INLINE void *page_pop(coral_heap_t *heap, coral_page_t *page, unsigned cls, size_t size,
                            bool zero) {
    coral_block_t *block = page->free;
    page->free = coral_block_next(block);
    page->used++;
    coral_heap_count(heap, allocs, cls, 1);
    if (CORAL_SECURE) return coral_secure_small_out(page, block, size - CORAL_CANARY_SIZE, 0, zero);
    if (zero) {
        if (coral_block_is_zero(page, block))
            block->next = NULL;
        else
            memset(block, 0, size);
    }
    coral_freed_mark_clear(block);
    return block;
}

static void *aligned_plain(coral_heap_t *heap, size_t size, size_t alignment, bool zero);

/* A thread whose exit has begun: from the exit heap, under its lock
 * (heap/thread.c). alignment 0: malloc's. */
static CORAL_NOINLINE void *malloc_exiting(size_t size, size_t alignment, bool zero) {
    coral_heap_t *heap = coral_exit_heap_acquire();
    if (heap == NULL) return enomem();
    /* Profiled as every heap is: each allocation is counted (the counted
     * path of coral_malloc_generic, or below), and sampled under the exit
     * heap's lock. */
    if (coral_profile_on && !heap->no_direct) coral_profile_heap_start(heap);
    void *p = alignment == 0 ? coral_malloc_generic(size, heap, zero)
                             : aligned_plain(heap, size, alignment, zero);
    if (alignment != 0 && heap->no_direct) p = coral_profile_count(heap, p, size);
    coral_exit_heap_release();
    return p;
}

/* A thread's first allocation: set it up. (Or the malloc of stdio's
 * witness for the fork handlers, made by the first fork's prepare with
 * the thread's heap reading as the empty one: base.h,
 * coral_libc_streams_lock; its storage is its own. The secure build's
 * size counts the canary.) */
static CORAL_NOINLINE void *malloc_first(size_t size, bool zero) {
    void *witness = coral_libc_streams_witness_storage(size - CORAL_CANARY_SIZE);
    if (coral_unlikely(witness != NULL)) return witness;
    if (coral_unlikely(coral_thread_exiting())) return malloc_exiting(size, 0, zero);
    coral_heap_t *heap = coral_heap_ready();
    if (heap == NULL) return enomem();
    return coral_malloc_generic(size, heap, zero);
}

/* ---- a spare block for glibc's registration -------------------------------------------
 * A thread's first user heap has glibc register a TLS destructor
 * (coral_thread_watch_rounds), whose calloc ends the process when it fails
 * ("failed to register TLS destructor: out of memory"). So the registration
 * is made only with a spare block in hand: while it runs, a small
 * allocation of the thread that finds no memory gets the spare instead of
 * NULL (spare_or_enomem); if none did, the spare is freed after. It is of
 * the size glibc asks for (struct dtor_list: four pointers), so it takes
 * no page that glibc's block would not. Only where malloc is coralloc's
 * (override.c defines coral_serves_malloc): else glibc's calloc is
 * glibc's own. Set and read by its own thread only. */
#define SPARE_SIZE (4 * sizeof(void *))
static __thread void *coral_tls_spare __attribute__((tls_model("initial-exec")));
extern const char coral_serves_malloc __attribute__((weak));

/* A small allocation of size bytes (the secure build's counts the canary)
 * found no memory: the spare, when one is held and fits, else NULL. */
static CORAL_NOINLINE void *spare_or_enomem(size_t size, bool zero) {
    void *spare = coral_tls_spare;
    size_t asked = size - CORAL_CANARY_SIZE;
    if (spare == NULL || asked > SPARE_SIZE) return enomem();
    coral_tls_spare = NULL;
    if (zero) memset(spare, 0, asked);
    return spare;
}

/* The first page of the class of size (at most CORAL_CLASS_MAX_SIZE) has no
 * free block, or the thread is not set up yet: the slow path's periodic
 * work and other threads' frees, then the next page with a free block. */
static void *class_refill(coral_heap_t *heap, unsigned cls, size_t size, bool zero) {
    coral_heap_periodic_work(heap);
    coral_page_t *page = coral_heap_find_page(heap, cls); /* takes other threads' frees first */
    if (page == NULL) return spare_or_enomem(size, zero);
    /* (Only a profiled heap's pages are flagged: profile.h.) */
    if (coral_unlikely(coral_slice_flags(page) & CORAL_PAGE_SAMPLED))
        coral_profile_page_refilled(page);
    return page_pop(heap, page, cls, size, zero);
}

/* A block of class cls (a set-up heap): from the first page of its queue,
 * as the direct[] fast path pops, else through the refill. */
CORAL_INLINE void *class_alloc(coral_heap_t *heap, unsigned cls, size_t size, bool zero) {
    coral_page_t *page = coral_queue_first(heap, cls);
    if (coral_unlikely(page == NULL || page->free == NULL))
        return class_refill(heap, cls, size, zero);
    return page_pop(heap, page, cls, size, zero);
}

/* A heap the profiler counts (no_direct: its direct[] names no page, so
 * the secure build's small mallocs come here): the block as the fast path
 * would pop it, counted. The size the secure build passes holds the
 * canary, which the program did not ask for. */
static CORAL_NOINLINE void *counted_class_alloc(coral_heap_t *heap, size_t size, bool zero) {
    return coral_profile_count(heap, class_alloc(heap, coral_size_class(size), size, zero),
                               size - CORAL_CANARY_SIZE);
}

void *coral_malloc_refill(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_unlikely(heap == &coral_heap_empty)) return malloc_first(size, zero);
    if (coral_unlikely(heap->no_direct)) return counted_class_alloc(heap, size, zero);
    return class_refill(heap, coral_size_class(size), size, zero);
}

CORAL_INLINE void *generic_alloc(coral_heap_t *heap, size_t size, bool zero) {
    if (size > CORAL_CLASS_SERVED_MAX) return coral_heap_malloc_large(heap, size, 0, zero);
    return class_alloc(heap, coral_size_class(size), size, zero);
}

/* counted_pop's block when direct[] has none to give: a size above
 * CORAL_DIRECT_MAX_SIZE or calloc's, or the page's list empty (then from
 * the first page of its class, which direct[] names: empty too, so the
 * refill). Out of line, parameters as they come, so that counted_pop's
 * common case moves no register. */
static CORAL_NOINLINE void *counted_pop_other(size_t size, coral_heap_t *heap, bool zero) {
    return generic_alloc(heap, size, zero);
}

/* A heap the profiler counts (no_direct; direct_end 0 sends all its
 * mallocs here), its allocation already counted: the block the fast path
 * would have handed out (the default build keeps direct[] for it, heap.h:
 * the block freed last first), else the refill's or a larger size's. */
CORAL_INLINE void *counted_pop(size_t size, coral_heap_t *heap, bool zero) {
    if (CORAL_SECURE) return generic_alloc(heap, size, zero);
    /* (calloc's from its class's first page too, which direct[] names: the
     * common case then makes no call but in tail position.) */
    if (size >= CORAL_DIRECT_COUNT || zero) return counted_pop_other(size, heap, zero);
    coral_page_t *page;
    coral_block_t *block = coral_pop_direct(heap, size, &page);
    if (coral_unlikely(block == NULL)) return counted_pop_other(size, heap, false);
    coral_freed_mark_clear(block);
    return block;
}

/* The allocation that runs the countdown out: made, then sampled. */
static CORAL_NOINLINE void *sampled_generic_alloc(size_t size, coral_heap_t *heap, bool zero) {
    void *p = counted_pop(size, heap, zero);
    return p == NULL ? NULL : coral_profile_sample(heap, p, size - CORAL_CANARY_SIZE);
}

/* Counted first, against the heap's countdown (coral_profile_count's test,
 * before the block is taken, so that the common case's calls stay tail
 * calls). Its parameters in the order coral_malloc_slow (api.h) has them,
 * and its calls' too, so that the common case moves no register. */
CORAL_INLINE void *counted_alloc(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_unlikely((heap->profile_left -= (int64_t)(size - CORAL_CANARY_SIZE)) < 0))
        return sampled_generic_alloc(size, heap, zero);
    return counted_pop(size, heap, zero);
}
void *coral_alloc_profiled(size_t size, coral_heap_t *heap, bool zero) {
    return counted_alloc(size, heap, zero);
}
void *coral_malloc_profiled(size_t size, coral_heap_t *heap) {
    return counted_alloc(size, heap, false);
}

void *coral_malloc_countdown_out(size_t size, coral_heap_t *heap) {
    if (coral_unlikely(!heap->no_direct)) {
        heap->profile_left = INT64_MAX;
        return coral_malloc_unprofiled(size, heap, false);
    }
    return sampled_generic_alloc(size, heap, false);
}

/* The other sizes: above CORAL_DIRECT_MAX_SIZE (no direct[] entry: their
 * pop is here, from the first page of their class, as direct[] pages are;
 * it saves no register), large and huge sizes, a thread's first call. (The
 * empty heap's no_direct is false: its first call comes here.) */
CORAL_NOINLINE void *coral_malloc_unprofiled(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_unlikely(heap == &coral_heap_empty)) return malloc_first(size, zero);
    return generic_alloc(heap, size, zero);
}

void *coral_malloc_generic(size_t size, coral_heap_t *heap, bool zero) {
    if (coral_unlikely(heap->no_direct)) return coral_alloc_profiled(size, heap, zero);
    return coral_malloc_unprofiled(size, heap, zero);
}

/* ---- free -------------------------------------------------------------------------- */

/* Not a pointer into the start chunk of a segment: NULL, a huge block's
 * later part (an aligned huge block), or not ours. */
void coral_free_slow(void *p) {
    if (p == NULL) return;
    if (CORAL_SECURE && coral_zero_slot_free(p)) return;
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL && CORAL_SECURE && coral_huge_was_freed(p)) {
        coral_misuse("double free detected: huge block %p was already free (and inaccessible)", p);
        return;
    }
    if (seg == NULL) {
        coral_page_invalid_free(p, "not allocated by coralloc");
        return;
    }
    coral_count_frees(CORAL_CLASS_LARGE, 1);
    if (coral_unlikely(coral_slice_flags(&seg->pages[0]) & CORAL_PAGE_SAMPLED))
        coral_profile_forget(&seg->pages[0], p);
    coral_heap_free_remote(seg, &seg->pages[0], p); /* huge segments only get here */
}

/* The owner's free of p, in page, that holds the page's freed mark: a
 * double free when the block is on the page's lists; else the program's
 * data happened to equal the mark. (A block in a bulk cache holds no
 * freed mark: the cache finds a second free of it, bulk_cache.h.) */
static CORAL_COLD bool owner_free_is_double(coral_page_t *page, void *p) {
    return coral_page_holds_free(page, p);
}

/* The owner's free that left the fast path: the block checked (a block
 * start of a page in use, not free already), then freed by the heap. */
CORAL_INLINE void owner_free(coral_page_t *page, void *p) {
    if (page->slice_count != 0 && page->class_idx != CORAL_CLASS_LARGE &&
        (size_t)((uint8_t *)p - page->start) >= (size_t)page->capacity * page->block_size &&
        coral_page_is_block_start(page, p)) {
        coral_page_invalid_free(p, "a block never handed out");
        return;
    }
    if (CORAL_FREED_MARKS && page->slice_count != 0 &&
        !(coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) && coral_page_is_block_start(page, p) &&
        coral_freed_mark_seen(p) && owner_free_is_double(page, p)) {
        coral_misuse("double free detected: block %p of %zu bytes was already free", p,
                     page->block_size);
        return;
    }
    coral_heap_free_local(page, p);
}

/* A thread with no heap is about to open a run of remote frees (api/
 * remote_run.h): it gets one first (its exit pushes the run from there),
 * with the run busy: getting it takes the heap pool's lock, and a signal
 * handler's free meanwhile that went the same way would wait for that lock
 * on its own thread for good; with the run busy it leaves the run alone
 * and takes the lock-free push (window_remote_run_heap_signal). Not once
 * the thread's exit has begun, nor in a forked child whose fork still holds
 * the locks (the heap pool's among them: a free there must not wait for
 * it). */
static CORAL_NOINLINE coral_run_result_t remote_run_with_heap(coral_page_t *page, void *p) {
    coral_remote_run_t *r = &coral_remote_run_tls;
    if (r->busy) return CORAL_RUN_NOT_HELD; /* a signal handler's free, nested */
    coral_remote_run_enter(r);
    bool ready =
        !coral_thread_exiting() && !coral_fork_child_unreleased() && coral_heap_ready() != NULL;
    coral_remote_run_exit(r);
    return ready ? coral_remote_run_add(page, p) : CORAL_RUN_NOT_HELD;
}

/* Another thread's block of a normal segment: the quick push, else the
 * full one (which checks p), the freed mark written once. */
CORAL_INLINE void remote_free(coral_segment_t *seg, coral_page_t *page, void *p) {
    uintptr_t suspect;
    /* A span no page holds (released, its segment perhaps cached): no
     * block lives there, so this is a double or invalid free. */
    if (coral_unlikely(page->slice_count == 0)) {
        coral_page_invalid_free(p, "in no page in use: double free?");
        return;
    }
    if (CORAL_FREED_MARKS) {
        coral_run_result_t run = coral_remote_run_free(page, p);
        if (coral_unlikely(run == CORAL_RUN_NEEDS_HEAP)) run = remote_run_with_heap(page, p);
        if (run == CORAL_RUN_HELD) return;
    }
    if (coral_page_free_remote_quick(page, p, &suspect)) return;
    if (suspect & CORAL_TF_MARKED)
        coral_page_push_remote_marked(page, p, suspect & CORAL_TF_SUSPECT);
    else
        coral_heap_free_remote(seg, page, p);
}

/* The owner's free of p, a block of slice (a page's head) whose only flag
 * is CORAL_PAGE_SAMPLED (the profiler has forgotten p): the fast path's
 * own tests and push (api.h), so that a page holding a sampled block
 * costs its other blocks' frees the profiler's look-up only. */
static bool sampled_page_free_fast(coral_page_t *slice, void *p) {
    const uintptr_t sampled = (uintptr_t)CORAL_PAGE_SAMPLED << CORAL_SLICE_FLAG_SHIFT;
    if ((coral_slice_tid_flags(slice) & ~sampled) != coral_thread_id() ||
        !coral_block_start_fast(slice, p) ||
        (CORAL_FREED_MARKS ? coral_freed_mark_seen(p) : p == slice->free))
        return false;
    coral_free_push_local(slice, p);
    return true;
}

/* The free of p, a block of page (slice's head), past the profiler's
 * part: by its owner, or another thread's. */
CORAL_INLINE void free_checked(coral_segment_t *seg, coral_page_t *page, void *p) {
    coral_count_frees(page->class_idx, 1);
    /* The segment says who owns it: the slice's own id part is 0 on an
     * interior or released slice. */
    if (atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == coral_thread_id())
        owner_free(page, p);
    else if (CORAL_SECURE || seg->kind != CORAL_SEGMENT_NORMAL)
        coral_heap_free_remote(seg, page, p);
    else
        remote_free(seg, page, p);
}

/* The free of p, a block of a page with CORAL_PAGE_SAMPLED (profiling on).
 * Most blocks of a flagged page have no record, which their address count
 * says (profile.h): the free of one makes no call into the profiler, and
 * the owner's is the fast path's push where the fast path's tests allow
 * it; a block that may have a record loses it first. Out of line and
 * out of the library's first code window (cmake/hot-text.ld): a program
 * that does not profile never runs it. */
static CORAL_NOINLINE void free_in_sampled_page_rest(coral_segment_t *seg, coral_page_t *slice,
                                                     coral_page_t *page, void *p, bool held) {
    if (held) {
        coral_profile_forget(page, p);
        if (!CORAL_SECURE && page == slice && sampled_page_free_fast(slice, p)) return;
    }
    free_checked(seg, page, p);
}
/* (Its common case, a block with no record pushed, in a function of its
 * own: no registers to save.) */
static CORAL_NOINLINE void free_in_sampled_page(coral_segment_t *seg, coral_page_t *slice,
                                                coral_page_t *page, void *p) {
    bool held = coral_profile_may_hold(page, p);
    if (!CORAL_SECURE && !held && page == slice && sampled_page_free_fast(slice, p)) return;
    free_in_sampled_page_rest(seg, slice, page, p, held);
}

void coral_free_unusual(coral_segment_t *seg, coral_page_t *slice, void *p) {
    coral_page_t *page = coral_slice_head(slice);
    if (coral_unlikely(coral_slice_flags(page) & CORAL_PAGE_SAMPLED)) {
        free_in_sampled_page(seg, slice, page, p);
        return;
    }
    free_checked(seg, page, p);
}

/* ---- usable size ---------------------------------------------------------------------- */

static size_t usable_size_of(coral_segment_t *seg, const void *p) {
    if (seg->kind == CORAL_SEGMENT_HUGE) return coral_huge_usable(seg, p);
    coral_page_t *page = coral_segment_page_of(seg, p);
    if (page->slice_count == 0) return 0;
    uint8_t *block = (uint8_t *)p;
    if (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) block = coral_page_block_start(page, p);
    size_t usable = (size_t)(block + page->block_size - CORAL_CANARY_SIZE - (const uint8_t *)p);
    /* The secure build: the request, from its canary word (checked before:
     * block_problem), as glibc's MALLOC_CHECK_ reports it. */
    if (CORAL_SECURE)
        return coral_secure_request_of(usable, *coral_mark_word(page, block),
                                       coral_canary_of(page, block));
    return usable;
}

/* The secure build: the canary word of the block p starts, in page (an
 * aligned large block's usable bytes end there too), and the canary of
 * the block that word ends. */
static uint64_t *secure_word_of(coral_page_t *page, const void *p, uint64_t *canary) {
    uint8_t *block = (uint8_t *)p;
    if (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) block = coral_page_block_start(page, p);
    *canary = coral_canary_of(page, block);
    return coral_mark_word(page, block);
}

/* The secure build: p's canaries (page.h) for a request of size bytes, at
 * most its block's usable bytes. */
static void secure_request_moved(coral_page_t *page, void *p, size_t size) {
    uint64_t canary, *word = secure_word_of(page, p, &canary);
    coral_secure_canaries_out(p, (size_t)((uint8_t *)word - (uint8_t *)p), size, canary);
}

/* The secure build: a block start whose mark word holds its freed mark is
 * free (any thread can tell: page.h), one that holds neither the mark nor
 * its canary was overflowed. */
static const char *secure_block_problem(coral_page_t *page, const void *p) {
    uint64_t canary, *word = secure_word_of(page, p, &canary);
    uint64_t mark = *word;
    if (coral_likely(coral_secure_canaries_intact(p, (size_t)((uint8_t *)word - (const uint8_t *)p),
                                                  mark, canary)))
        return NULL;
    if (mark == coral_freed_mark_of(canary)) return "a freed block";
    return "its canary was overwritten: a heap overflow";
}

/* What free would say of p, a pointer into seg, without freeing it: NULL
 * when p is a live block's start (or a pointer into an aligned block),
 * else why not. Any thread: a block another thread owns is not checked
 * against its freed mark (its owner's lists cannot be read here). */
CORAL_INLINE const char *block_problem(coral_segment_t *seg, const void *p) {
    if (seg->kind == CORAL_SEGMENT_HUGE) {
        coral_page_t *page = &seg->pages[0];
        if (page->used == 0) return "a huge block already freed";
        if (CORAL_SECURE && p == page->start && !coral_huge_canary_intact(seg))
            return "its canary was overwritten: a heap overflow";
        return p == page->start ? NULL : "inside a huge block, not its start";
    }
    coral_page_t *page = coral_segment_page_of(seg, p);
    if (page->slice_count == 0) return "in no page in use: double free?";
    if (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED)
        return (const uint8_t *)p == coral_page_large_block(page) ? NULL : "not a block's start";
    if (!coral_page_is_block_start(page, p)) return "not a block's start";
    if (page->class_idx == CORAL_CLASS_LARGE && page->used == 0) return "a freed large block";
    bool owner = atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == coral_thread_id();
    if (owner &&
        (size_t)((const uint8_t *)p - page->start) >= (size_t)page->capacity * page->block_size)
        return "a block never handed out";
    if (owner && coral_freed_mark_seen((const coral_block_t *)p) &&
        owner_free_is_double(page, (void *)p))
        return "a freed block";
    if (CORAL_SECURE) return secure_block_problem(page, p);
    return NULL;
}

/* The usable size of p (not NULL) for `call`, which names a misuse: 0
 * then (reported). */
static size_t checked_usable_size(const void *p, const char *call) {
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL) {
        if (coral_is_zero_slot(p)) return 0;
        coral_misuse("%s: invalid pointer %p (not allocated by coralloc)", call, p);
        return 0;
    }
    const char *why = block_problem(seg, p);
    if (coral_unlikely(why != NULL)) {
        coral_misuse("%s: invalid pointer %p (%s)", call, p, why);
        return 0;
    }
    return usable_size_of(seg, p);
}

size_t coral_malloc_usable_size(const void *p) {
    return p == NULL ? 0 : checked_usable_size(p, "malloc_usable_size()");
}

int coral_owns(const void *p) {
    return p != NULL && (coral_segment_of_any(p) != NULL || coral_is_zero_slot(p));
}

/* The usable bytes of the block malloc(size) gets (coralloc.h). In the
 * secure build a block keeps CORAL_CANARY_SIZE bytes after them, and a
 * large block ends at the OS page after its canary, where its guard page
 * starts (heap/large.c, secure_large_end; page.h). */
size_t coral_good_size(size_t size) {
    if (CORAL_SECURE && size == 0) return 0; /* an inaccessible slot */
    size_t inner = coral_secure_inner_size(size);
    if (inner <= CORAL_CLASS_SERVED_MAX)
        return coral_class_size(coral_size_class(inner)) - CORAL_CANARY_SIZE;
    if (inner > CORAL_MAX_REQUEST) return 0;
    if (inner + CORAL_GUARD_SIZE <= CORAL_LARGE_MAX_SIZE) {
        size_t end = CORAL_SECURE ? CORAL_OS_PAGE_SIZE : CORAL_SLICE_SIZE;
        return ((inner + end - 1) & ~(end - 1)) - CORAL_CANARY_SIZE;
    }
    /* huge: the block starts after the 64 KiB header */
    return coral_huge_block_end(CORAL_SLICE_SIZE, inner) - CORAL_SLICE_SIZE;
}

/* ---- the standard calls ---------------------------------------------------------------- */

void *coral_malloc(size_t size) { return coral_malloc_inline(size); }
void coral_free(void *p) { coral_free_inline(p); }
void *coral_calloc(size_t n, size_t size) {
    return coral_heap_calloc_inline(coral_tls_heap, n, size);
}

/* Whether size fits the block p (NULL fits any); call names the call: at
 * most its usable size; in the secure build its request, which
 * checked_usable_size reports there (the canary word or a huge block's
 * segment holds it exactly; C23's free_sized and C++'s sized deletes are
 * given the size asked for), or 0, no size (C++'s unsized aligned deletes
 * pass it; free_sized(p, 0) is free(p)). A
 * pointer checked_usable_size reported is refused whatever the size (an
 * unsized aligned delete asks with 0): under CORALLOC_ON_ERROR=warn the
 * call then does nothing, where free() would report it a second time. */
static bool sized_free_fits(void *p, size_t size, const char *call) {
    if (p == NULL) return true;
    size_t usable = checked_usable_size(p, call);
    if (usable == 0 && !coral_is_zero_slot(p)) return false; /* reported */
    if (CORAL_SECURE) {
        if (coral_likely(size == usable || size == 0)) return true;
        coral_misuse("%s(%p, %zu): not the size the block was allocated with (%zu bytes)", call, p,
                     size, usable);
        return false;
    }
    if (coral_likely(size <= usable)) return true;
    coral_misuse("%s(%p, %zu): the block has only %zu bytes", call, p, size, usable);
    return false;
}

/* The secure build: the owner's free of a block of its unflagged page
 * (slice, the page's head) whose canary word holds a slack of 64 or more,
 * which the free fast path leaves here (page.h): checked as that path
 * checks, every field decoded, and put in the ring of freed blocks as it
 * puts the others. False: not such a free (nothing done). */
CORAL_INLINE bool secure_free_wide(coral_page_t *slice, void *p, size_t size) {
    uint64_t freed;
    if (coral_slice_tid_flags(slice) != coral_thread_id() ||
        !coral_secure_free_fast_wide(slice, p, size, &freed))
        return false;
    coral_secure_ring_put(slice, p, slice->owner_usable_size, freed);
    return true;
}

void coral_free_sized_checked(void *p, size_t size, const char *call) {
    if (CORAL_SECURE) {
        /* (a block with a slack of 64 or more freed by its owner: as free
         * takes it, with its size checked) */
        coral_segment_t *seg = coral_segment_of_any(p);
        if (seg != NULL && seg->kind == CORAL_SEGMENT_NORMAL &&
            secure_free_wide(coral_segment_slice_of(seg, p), p, size))
            return;
    }
    if (sized_free_fits(p, size, call)) coral_free_inline(p);
}

void coral_free_sized(void *p, size_t size) { coral_free_sized_inline(p, size, "free_sized"); }

void coral_free_aligned_sized_as(void *p, size_t alignment, size_t size, const char *call) {
    if (coral_unlikely(((uintptr_t)p & (alignment - 1)) != 0)) {
        coral_misuse("%s(%p): not aligned to %zu", call, p, alignment);
        return;
    }
    if (sized_free_fits(p, size, call)) coral_free_inline(p);
}

void coral_free_aligned_sized(void *p, size_t alignment, size_t size) {
    coral_free_aligned_sized_as(p, alignment, size, "free_aligned_sized");
}

/* ---- the secure build ------------------------------------------------------------------ */

void *coral_secure_alloc_zero(coral_heap_t *heap) {
    void *slot = coral_zero_slot_alloc(CORAL_ALIGNMENT);
    if (slot != NULL) return slot;
    return coral_malloc_generic(CORAL_CANARY_SIZE, heap, false); /* every slot is taken: a block */
}

/* Whether a block of page that passed its checks (coral_secure_page_check:
 * the block-start test among them, page.h) is another thread's
 * block of a size class that can be pushed at once: no aligned block in
 * the page (whose free gives back another pointer), not sampled by the
 * profiler (whose free forgets it first). */
CORAL_INLINE bool secure_plain_remote(const coral_segment_t *seg, const coral_page_t *page) {
    return page->class_idx != CORAL_CLASS_LARGE &&
           !(coral_slice_flags(page) & (CORAL_PAGE_HAS_ALIGNED | CORAL_PAGE_SAMPLED)) &&
           atomic_load_explicit(&seg->thread_id, memory_order_relaxed) != coral_thread_id();
}

/* The checks that name the misuse, then the free. */
static CORAL_NOINLINE void secure_free_named(coral_segment_t *seg, coral_page_t *slice, void *p) {
    if (seg->kind == CORAL_SEGMENT_NORMAL) {
        coral_page_t *page = coral_slice_head(slice);
        /* A large page in use with no block in use waits in its heap's
         * quarantine, its block inaccessible (heap layer): named before
         * the canary check would read it. */
        if (CORAL_SECURE && page->slice_count != 0 && page->class_idx == CORAL_CLASS_LARGE &&
            page->used == 0) {
            if ((uint8_t *)p == coral_page_large_block(page))
                coral_misuse("double free detected: large block %p was already free "
                             "(inaccessible in the quarantine)",
                             p);
            else
                coral_page_invalid_free(p, "inside a freed large block");
            return;
        }
        if (page->slice_count != 0) {
            if (!coral_secure_page_check(page, p, true)) return;
            /* Another thread's block: pushed on its page's remote list
             * (which checks the count and the page's state); the check
             * made the block-start test. */
            if (coral_likely(secure_plain_remote(seg, page))) {
                coral_count_frees(page->class_idx, 1);
                coral_page_free_remote_checked(page, p);
                return;
            }
        }
    }
    coral_free_in_segment(seg, slice, p, 0, NULL);
}

/* (The wide free first, with no stack frame: the rest is a tail call.) */
void coral_secure_free_checked(coral_segment_t *seg, coral_page_t *slice, void *p) {
    if (secure_free_wide(slice, p, 0)) return;
    secure_free_named(seg, slice, p);
}

/* ---- CORAL_VALGRIND builds ------------------------------------------------------------- */

/* p handed out: memcheck's block, cleared after it is one when zero. */
static void *valgrind_told(void *p, size_t size, bool zero) {
    if (p == NULL) return NULL;
    CORAL_VG(VALGRIND_MALLOCLIKE_BLOCK(p, coral_malloc_usable_size(p), 0, zero));
    if (zero) memset(p, 0, size);
    return p;
}

void *coral_valgrind_alloc(coral_heap_t *heap, size_t size, bool zero) {
    return valgrind_told(coral_heap_alloc_plain(heap, size, false), size, zero);
}

/* realloc kept or moved p (of old_usable bytes) to q without malloc and
 * free: memcheck's block follows. */
static void *valgrind_resized(void *p, size_t old_usable, void *q) {
#if CORAL_VALGRIND
    if (q == NULL) return q;
    size_t usable = coral_malloc_usable_size(q);
    if (q == p) {
        VALGRIND_RESIZEINPLACE_BLOCK(p, old_usable, usable, 0);
        return q;
    }
    VALGRIND_FREELIKE_BLOCK(p, 0);
    VALGRIND_MALLOCLIKE_BLOCK(q, usable, 0, 0);
    VALGRIND_MAKE_MEM_DEFINED(q, old_usable < usable ? old_usable : usable);
#else
    (void)p;
    (void)old_usable;
#endif
    return q;
}

static void *aligned_checked(coral_heap_t *heap, size_t size, size_t alignment, bool zero);

/* Aligned allocation; alignment is a power of two. */
void *coral_malloc_aligned_in(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    if (alignment <= CORAL_ALIGNMENT) return coral_heap_alloc_inline(heap, size, zero);
    void *p = aligned_checked(heap, size, alignment, zero);
    /* (The empty heap: the call set the thread's up, or the thread exits.) */
    if (heap == &coral_heap_empty) heap = coral_tls_heap;
    if (coral_unlikely(heap->no_direct)) return coral_profile_count(heap, p, size);
    return p;
}

/* (alignment above CORAL_ALIGNMENT, heap set up.) */
static void *aligned_checked(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    if (CORAL_VALGRIND)
        return valgrind_told(aligned_plain(heap, size, alignment, false), size, zero);
    if (!CORAL_SECURE) return aligned_plain(heap, size, alignment, zero);
    if (size == 0) { /* an inaccessible slot, as malloc(0) gives */
        void *slot = coral_zero_slot_alloc(alignment);
        if (slot != NULL) return slot;
    }
    /* (Checked and given its canary where its block was taken: page.h.) */
    void *p = aligned_plain(heap, coral_secure_inner_size(size), alignment, false);
    if (p == NULL) return NULL;
    /* A block of a size class got the canaries of the size rounded up to
     * the alignment: they move to the request's end, so that
     * malloc_usable_size and free_aligned_sized see the request (a large
     * block's are there already). */
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg->kind != CORAL_SEGMENT_HUGE) {
        coral_page_t *page = coral_segment_page_of(seg, p);
        if (page->class_idx != CORAL_CLASS_LARGE) secure_request_moved(page, p, size);
    }
    if (zero) memset(p, 0, size);
    return p;
}

static void *aligned_plain(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    if (size > CORAL_MAX_REQUEST || alignment > CORAL_MAX_REQUEST) return enomem();
    if (size == 0) size = 1; /* rounds up to one alignment unit below */
    if (heap == &coral_heap_empty) {
        if (coral_unlikely(coral_thread_exiting())) return malloc_exiting(size, alignment, zero);
        if ((heap = coral_heap_ready()) == NULL) return enomem();
    }
    if (alignment <= CORAL_SLICE_SIZE) {
        /* Every block of a class whose size is a multiple of the alignment
         * is aligned (pages start on a 64 KiB boundary). The nominal size
         * of rounded's class (rounded is a multiple of the alignment A) is
         * such a multiple: nominal sizes are the multiples of a step (16,
         * or 1/8 of the power of two below); if A <= step, the class is a
         * multiple of A; if A > step, rounded is a multiple of the step,
         * so it is a nominal size. A skewed class (page.h) is a multiple
         * of A only up to 128: above, its twin's blocks, of the nominal
         * size, are. */
        size_t rounded = (size + alignment - 1) & ~(alignment - 1);
        if (rounded <= CORAL_CLASS_SERVED_MAX) {
            unsigned cls = coral_size_class(rounded);
            if ((coral_class_size(cls) & (alignment - 1)) != 0) cls = coral_class_twin(cls);
            return class_alloc(heap, cls, rounded, zero);
        }
    }
    return coral_heap_malloc_large(heap, size, alignment, zero);
}

static bool is_power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* On failure errno is ENOMEM as well as the result, as with glibc's and
 * musl's posix_memalign (glibc's own tests read it). */
int coral_posix_memalign(void **out, size_t alignment, size_t size) {
    if (!is_power_of_two(alignment) || alignment % sizeof(void *) != 0) return EINVAL;
    void *p = coral_malloc_aligned_in(coral_tls_heap, size, alignment, false);
    if (p == NULL) {
        errno = ENOMEM;
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

/* Zeroed like calloc: memory known to be fresh from the OS (zero) is not
 * cleared again, so a large block costs no resident memory until written. */
void *coral_aligned_calloc(size_t alignment, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return enomem();
    if (!is_power_of_two(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    return coral_malloc_aligned_in(coral_tls_heap, total, alignment, true);
}

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

static void *realloc_move(coral_heap_t *heap, void *p, size_t old_usable, size_t size) {
    void *q = coral_heap_alloc_inline(heap, size, false);
    if (q == NULL) return NULL;
    size_t copy = old_usable < size ? old_usable : size;
    /* Before the copy writes it (os/populate.c). A copy of at most 56 KiB
     * spans at most 15 OS pages, below CORAL_POPULATE_MIN_BYTES: the common
     * small realloc makes no call here. */
    if (copy > CORAL_POPULATE_MIN_BYTES - 2 * CORAL_OS_PAGE_SIZE && coral_populate_adaptive())
        coral_populate_copy(q, copy);
    memcpy(q, p, copy);
    coral_free_inline(p);
    return q;
}

/* A misuse: with CORALLOC_ON_ERROR=warn, realloc fails (EINVAL) and p is
 * left alone. */
static CORAL_COLD void *realloc_invalid(void *p, const char *why) {
    coral_misuse("realloc(): invalid pointer %p (%s)", p, why);
    errno = EINVAL;
    return NULL;
}

/* realloc of p into heap. A block may stay where it is (or grow in place)
 * only if it is heap's, or any heap's when any_heap (plain realloc keeps a
 * user heap's block in its heap); when it moves, it moves into heap. */
/* realloc of the huge block p of seg (usable bytes) where it lies, or with
 * its pages moved: the profiler keys its records by address and size, so a
 * sampled block's record goes with the old block and the new one is
 * sampled again, as a new allocation of its heap (when the resize fails, p
 * stays unsampled: the profile then undercounts it). */
static void *huge_realloc(coral_heap_t *heap, coral_segment_t *seg, void *p, size_t usable,
                          size_t size) {
    coral_page_t *page = &seg->pages[0];
    bool sampled = coral_slice_flags(page) & CORAL_PAGE_SAMPLED;
    coral_heap_t *owner = coral_page_heap(page) != NULL ? coral_page_heap(page) : heap;
    if (coral_unlikely(sampled)) coral_profile_forget(page, p);
    void *q = valgrind_resized(p, usable, coral_huge_realloc(seg, p, size));
    if (coral_unlikely(sampled) && q != NULL) coral_profile_sample(owner, q, size);
    return q;
}

/* The bytes of the block p starts in page (a live block), less the
 * canary's: `usable` in the default build, which has no request canary. */
static size_t block_usable(coral_page_t *page, const void *p, size_t usable) {
    if (!CORAL_SECURE) return usable;
    uint64_t canary;
    return (size_t)((uint8_t *)secure_word_of(page, p, &canary) - (const uint8_t *)p);
}

CORAL_INLINE void *realloc_in(coral_heap_t *heap, void *p, size_t size, bool any_heap) {
    if (p == NULL) return coral_heap_alloc_inline(heap, size, false);
    if (size == 0) { /* glibc's behaviour: free and return NULL */
        coral_free_inline(p);
        return NULL;
    }
    if (size > CORAL_MAX_REQUEST) return enomem();
    coral_segment_t *seg = coral_segment_of_any(p);
    if (seg == NULL) {
        if (!coral_is_zero_slot(p)) return realloc_invalid(p, "not allocated by coralloc");
        void *q = coral_heap_alloc_inline(heap, size, false); /* a malloc(0) block: no bytes */
        if (q != NULL) coral_zero_slot_free(p);
        return q;
    }
    const char *why = block_problem(seg, p);
    if (coral_unlikely(why != NULL)) return realloc_invalid(p, why);
    size_t usable = usable_size_of(seg, p);
    if (seg->kind == CORAL_SEGMENT_HUGE) {
        bool same = any_heap || coral_page_heap(&seg->pages[0]) == heap ||
                    (coral_page_heap(&seg->pages[0]) == NULL && heap->is_default);
        if (same && size > CORAL_LARGE_MAX_SIZE) return huge_realloc(heap, seg, p, usable, size);
        return realloc_move(heap, p, usable, size);
    }
    coral_page_t *page = coral_segment_page_of(seg, p);
    if (page->slice_count == 0) return realloc_invalid(p, "freed block?");
    if (CORAL_SECURE && !coral_secure_page_check(page, p, false)) { /* reported */
        errno = EINVAL;
        return NULL;
    }
    bool same = any_heap || coral_page_heap(page) == heap;
    bool owner = atomic_load_explicit(&seg->thread_id, memory_order_relaxed) == coral_thread_id();
    size_t room; /* the block's bytes (the secure build's usable is the request) */
    if (page->class_idx == CORAL_CLASS_LARGE && owner && same && size > CORAL_CLASS_SERVED_MAX &&
        size <= CORAL_LARGE_MAX_SIZE) {
        void *q = coral_realloc_large_in_place(page, p, size);
        if (q != NULL) return valgrind_resized(p, usable, q);
    } else if (same && size <= (room = block_usable(page, p, usable)) && size >= room / 2) {
        /* Shrinking by less than half, or growing within the block: kept;
         * the secure build's canaries move to the new request's end. */
        if (CORAL_SECURE) secure_request_moved(page, p, size);
        return valgrind_resized(p, usable, p);
    }
    return realloc_move(heap, p, usable, size);
}

void *coral_realloc(void *p, size_t size) { return realloc_in(coral_tls_heap, p, size, true); }

void *coral_reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return enomem();
    return coral_realloc(p, total);
}

/* ---- collection ---------------------------------------------------------------------------- */

void coral_collect(int force) {
    coral_remote_runs_flush();
    /* A forced collect adopts abandoned segments, which needs a heap. */
    coral_heap_t *heap = force ? coral_heap_ready() : coral_tls_heap;
    if (heap != NULL && heap != &coral_heap_empty) {
        coral_bulk_cache_flush_own();
        if (CORAL_SECURE) coral_heap_ring_flush(false);
        for (coral_link_t *l = heap->thread->heaps.first; l != NULL; l = l->next)
            coral_heap_collect(coral_container_of(l, coral_heap_t, thread_link), force != 0);
        if (force) {
            coral_heap_adopt_all(heap);
            coral_heap_collect(heap, true);
        }
    }
    coral_purge_now();
}

/* ---- first-class heaps -------------------------------------------------------------------
 * Rules (docs/DESIGN.md, tested in tests/test_heaps.c): a heap belongs to
 * the thread that created it; only that thread allocates from it, resets or
 * destroys it (others get a clear error). Any thread may free its blocks.
 * Destroy and reset free every block at once, in time proportional to the
 * heap's pages. When the owner thread exits, its heaps go with it: their
 * live blocks stay valid and freeable, the handles do not. A NULL heap is
 * the calling thread's own. */

/* heap, checked to be the calling thread's; the thread's own for NULL. */
static coral_heap_t *heap_of_caller(coral_heap_t *heap, const char *what) {
    if (heap == NULL) return coral_tls_heap;
    if (coral_unlikely(heap->thread == NULL ||
                       heap->thread->segments.thread_id != coral_thread_id()))
        coral_fatal("%s(%p): the heap belongs to another thread, was destroyed, or its thread "
                    "has exited",
                    what, (void *)heap);
    return heap;
}

/* The thread's first user heap: it watches for its exit's start, with the
 * spare in hand (above). The spare is taken as page_pop hands blocks out,
 * uncounted by the profiler, which counts it once if it is handed out.
 * Without memory for it the thread is not watched yet (its exit cleanup
 * does not wait a round, as without glibc's function); its next user heap
 * tries again. */
static void watch_rounds(coral_heap_t *self) {
    if (coral_likely(!coral_thread_rounds_unwatched(self->thread))) return;
    if (&coral_serves_malloc == NULL) {
        coral_thread_watch_rounds(self->thread);
        return;
    }
    size_t size = SPARE_SIZE + CORAL_CANARY_SIZE;
    void *spare = class_alloc(self, coral_size_class(size), size, false);
    if (spare == NULL) return;
    coral_tls_spare = spare;
    coral_thread_watch_rounds(self->thread);
    spare = coral_tls_spare;
    coral_tls_spare = NULL;
    if (spare != NULL) coral_free(spare);
}

coral_heap_t *coral_heap_new(void) {
    coral_heap_t *self = coral_heap_ready();
    if (self == NULL) return enomem();
    coral_heap_t *heap = coral_heap_create();
    if (heap == NULL) return enomem();
    if (coral_profile_on) coral_profile_heap_start(heap); /* before its first page */
    watch_rounds(self);
    return heap;
}

/* For destroy and reset: a user heap of the caller (NULL: nothing to do). */
static coral_heap_t *user_heap_of_caller(coral_heap_t *heap, const char *what) {
    if (heap == NULL) return NULL;
    heap_of_caller(heap, what);
    if (heap->is_default) coral_fatal("%s: %p is a thread's own heap", what, (void *)heap);
    return heap;
}

/* destroy (keep false) or reset a user heap: its blocks go at once, and
 * with them the profiler's records of them. */
static void user_heap_free_all(coral_heap_t *heap, bool keep) {
    if (!coral_profile_on) {
        coral_heap_free_all(heap, keep);
        return;
    }
    coral_profile_forget_heap(heap);
    coral_heap_free_all(heap, keep);
    if (keep) coral_profile_heap_start(heap);
}

void coral_heap_destroy(coral_heap_t *heap) {
    /* Its own thread, after coralloc's exit cleanup abandoned its pages
     * (a later key destructor, a Rust thread_local): its blocks stay valid
     * until freed, as every block of an exited thread does. */
    if (heap != NULL && coral_heap_exited_by_caller(heap)) {
        coral_heap_forget_exited(heap);
        return;
    }
    if (user_heap_of_caller(heap, "coral_heap_destroy") != NULL) user_heap_free_all(heap, false);
}

void coral_heap_reset(coral_heap_t *heap) {
    if (user_heap_of_caller(heap, "coral_heap_reset") != NULL) user_heap_free_all(heap, true);
}

void *coral_heap_malloc(coral_heap_t *heap, size_t size) {
    return coral_heap_alloc_inline(heap_of_caller(heap, "coral_heap_malloc"), size, false);
}

void *coral_heap_calloc(coral_heap_t *heap, size_t n, size_t size) {
    return coral_heap_calloc_inline(heap_of_caller(heap, "coral_heap_calloc"), n, size);
}

void *coral_heap_realloc(coral_heap_t *heap, void *p, size_t size) {
    if (heap == NULL) return coral_realloc(p, size);
    return realloc_in(heap_of_caller(heap, "coral_heap_realloc"), p, size, false);
}

void coral_heap_free(coral_heap_t *heap, void *p) {
    (void)heap; /* any heap's block may be freed by anyone */
    coral_free_inline(p);
}

int coral_heap_visit(coral_heap_t *heap, coral_block_visit_fn fn, void *arg) {
    heap = heap_of_caller(heap, "coral_heap_visit");
    if (heap == &coral_heap_empty) return 0; /* the thread never allocated */
    /* Blocks the thread holds apart from their pages' lists go back first:
     * its bulk cache's (freed blocks), the secure build's ring (freed
     * blocks). */
    coral_bulk_cache_flush_own();
    if (CORAL_SECURE) coral_heap_ring_flush(false);
    return coral_heap_walk(heap, fn, arg);
}

/* ---- testing ---------------------------------------------------------------------------- */

void coral_test_advance_clock(unsigned long long ms) { coral_clock_advance((uint64_t)ms); }

void coral_test_huge_page_cost(long long ns) { coral_huge_pages_cost_override((int64_t)ns); }

int coral_test_purge_pass(void) {
    coral_process_init();
    return coral_purge_wait_pass() ? 1 : 0;
}

int coral_test_check(void) {
    const char *why;
    const void *where;
    if (coral_heap_check_thread(&why, &where) == 0) return 0;
    coral_message("invariant broken: %s (at %p)", why, where);
    return -1;
}
