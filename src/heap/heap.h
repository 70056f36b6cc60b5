/* Layer 5, heap: who allocates from which pages.
 *
 * It owns: heaps (a queue of pages per size class, the first of which is
 * the allocation target, reachable through direct[] for small sizes, and a
 * queue of full pages), thread heaps and first-class heaps alike (a user
 * heap is a heap with is_default false: same struct, same code), threads
 * (set-up on first use, exit: abandonment of segments, adoption by live
 * threads), large and huge blocks (large.c), the heap pool and registry,
 * process start-up and fork (thread.c).
 *
 * Everything here runs on the heap's owner thread, except what the page
 * layer's remote-free protocol does (owner.delayed_pages) and the huge-block
 * list of a user heap (any thread's free unlinks one, under the one
 * huge-list lock of large.c). */
#ifndef CORAL_HEAP_H
#define CORAL_HEAP_H

#include "page/page.h"

#define CORAL_QUEUE_FULL (CORAL_CLASS_LARGE + 1) /* the queue of pages with no free block */
#define CORAL_QUEUE_COUNT (CORAL_QUEUE_FULL + 1)
_Static_assert(CORAL_QUEUE_COUNT <= CORAL_STAT_CLASSES, "a statistics row for every queue");
/* Blocks up to this size are served through heap->direct[] (fast path). */
#define CORAL_DIRECT_MAX_SIZE ((size_t)1024)
/* An entry per size in bytes, 0 to CORAL_DIRECT_MAX_SIZE: malloc indexes
 * direct[] with the size itself, no rounding to 16 bytes (two instructions
 * fewer on its fast path), at 8 KiB a heap. */
#define CORAL_DIRECT_COUNT (CORAL_DIRECT_MAX_SIZE + 1)
#define CORAL_DIRECT_LAST_CLASS CORAL_CLASS_OF_POW2(10) /* coral_size_class(1024) */

/* The direct[] entries of class cls (at most CORAL_DIRECT_LAST_CLASS): the
 * sizes it serves, *lo to *hi (class 1 serves size 0 too). Those classes
 * are not skewed, so their blocks have their nominal size. */
CORAL_INLINE void coral_direct_entries(unsigned cls, size_t *lo, size_t *hi) {
    *lo = cls == 1 ? 0 : coral_class_nominal_size(cls - 1) + 1;
    *hi = coral_class_nominal_size(cls);
}

/* A thread's state, shared by all its heaps; lives in its default heap. */
typedef struct coral_thread_s {
    coral_thread_segments_t segments;
    coral_heap_t *heap_default;
    coral_list_t heaps; /* every heap of the thread, through heap->thread_link */
    /* Set by the thread's first exit-cleanup call when it waited a
     * destructor round for its user heaps (thread.c, thread_done). */
    bool exit_deferred;
    /* Set at its first user heap: it will learn that its exit began
     * (thread.c, coral_thread_watch_rounds). */
    bool rounds_watched;
    /* Listed by its thread id (thread.c, heaps_by_tid), under the heap
     * pool's lock, from the thread's set-up until its heap goes back. */
    bool tid_listed;
    uint32_t tid_generation; /* the process's forks when it was listed */
    coral_link_t tid_link;
} coral_thread_t;

/* Per size class block counts (CORAL_STATS builds): written by the owner
 * with relaxed atomic stores, read by anyone. Index: class, or
 * CORAL_CLASS_LARGE for large and huge blocks. */
typedef struct coral_heap_counts_s {
    uint64_t allocs[CORAL_QUEUE_COUNT];
    uint64_t frees[CORAL_QUEUE_COUNT];
} coral_heap_counts_t;

struct coral_heap_s {
    /* The sizes below this are served through direct[]: CORAL_DIRECT_COUNT
     * in a heap set up by coral_heap_init, 0 in the empty heap (thread.c),
     * whose table the default build never reads and leaves empty, and 0 in
     * a heap the profiler counts (no_direct, set after coral_heap_init). The
     * malloc fast path compares the size with it before it reads direct[]
     * (the compare a constant bound would cost). */
    size_t direct_end;
    /* direct[size]: the first page of the size class serving that size
     * (or coral_page_empty). The malloc fast path reads only this and
     * direct_end: two lines of the heap for every size but 0 to 6. */
    coral_page_t *direct[CORAL_DIRECT_COUNT];
    coral_list_t queues[CORAL_QUEUE_COUNT]; /* pages, through page->link */
    coral_page_owner_t owner;               /* what the page layer knows of us */
    coral_thread_t *thread;                 /* NULL once destroyed */
    bool is_default;                        /* the thread's own heap */
    /* Set by the api layer's profiler (api/profile.h) before the heap's
     * first page, with direct_end 0: every allocation takes the api layer's
     * slow path, which counts it (and pops from direct[] as the fast path
     * would). In the secure build, whose fast path does not read
     * direct_end, direct[] stays coral_page_empty instead (this layer
     * leaves it alone), so that path misses. */
    bool no_direct;
    uint32_t heartbeat; /* slow-path calls, for periodic work */
    /* The api layer's profiler's countdown for a heap it counts (set with
     * no_direct): bytes the heap may still allocate before its next
     * sample. Written by the heap's allocations only (its owner thread, or
     * the exit heap's lock holder). Beside no_direct, which the counted
     * path reads first: one line for both. */
    int64_t profile_left;
    /* The heap's huge blocks (through seg->link), for coral_heap_destroy and
     * coral_heap_visit:
     * any thread's free unlinks one, hence a lock. It is one lock for every
     * heap's list (coral_huge_lists_lock), not one in the heap: a free reads
     * the block's owner under it, and a heap struct can be gone (its thread
     * exited) and made another heap between that read and the locking. */
    coral_list_t huge_blocks;
    coral_link_t registry_link; /* every live heap (thread.c), under its lock */
    /* A user heap whose thread exited without destroying it: that thread's
     * kernel id. Its struct stays out of the pool (so the handle never names
     * another heap) until that thread is gone; 0 otherwise. */
    int exited_tid;
    coral_link_t thread_link; /* in thread->heaps; next also links the free pool */
#if CORAL_STATS_ENABLED
    coral_heap_counts_t counts;
#endif
#if CORAL_SECURE
    /* The secure build: the heap's freed large blocks, oldest first, each
     * inaccessible (heap.c, "the quarantine of large blocks"), through
     * page->link; their bytes. The owner's alone. */
    coral_list_t quarantine;
    size_t quarantine_bytes;
    uint32_t quarantine_count;
#endif
    coral_thread_t thread_storage; /* the thread's state, in its default heap */
};

CORAL_INLINE coral_heap_t *coral_heap_of_owner(coral_page_owner_t *owner) {
    return coral_container_of(owner, coral_heap_t, owner);
}

/* The heap a page belongs to (NULL while abandoned). */
CORAL_INLINE coral_heap_t *coral_page_heap(coral_page_t *page) {
    coral_page_owner_t *owner = atomic_load_explicit(&page->owner, memory_order_relaxed);
    return owner != NULL ? coral_heap_of_owner(owner) : NULL;
}

/* The first page of queue q, or NULL. */
CORAL_INLINE coral_page_t *coral_queue_first(coral_heap_t *heap, unsigned q) {
    return coral_list_entry(heap->queues[q].first, coral_page_t, link);
}

/* CORAL_STATS builds: count in a heap's per class counters. */
#if CORAL_STATS_ENABLED
#define coral_heap_count(heap, field, cls, n)                                                      \
    __atomic_store_n(&(heap)->counts.field[cls],                                                   \
                     __atomic_load_n(&(heap)->counts.field[cls], __ATOMIC_RELAXED) + (n),          \
                     __ATOMIC_RELAXED)
#else
#define coral_heap_count(heap, field, cls, n) ((void)(heap), (void)(cls), (void)(n))
#endif

/* ---- the calling thread ------------------------------------------------------- */

/* The calling thread's heap: coral_heap_empty until its first allocation. */
extern __thread coral_heap_t *coral_tls_heap __attribute__((tls_model("initial-exec")));
/* Every direct[] entry names coral_page_empty, so every pop misses. */
extern coral_heap_t coral_heap_empty;

/* Set up the calling thread (and the process on its first call); its heap,
 * or NULL when the OS has no memory, the thread's exit has begun, or a
 * signal handler interrupted the thread's own setup (thread.c). */
coral_heap_t *coral_thread_init(void);
/* From its first user heap on, the calling thread watches for the start
 * of its exit, which says whether its exit cleanup may wait a key
 * destructor round (thread.c): unwatched tells whether it should start
 * now; watch starts it, with a registration that glibc makes with calloc
 * and that ends the process when that calloc fails. */
bool coral_thread_rounds_unwatched(const coral_thread_t *thread);
void coral_thread_watch_rounds(coral_thread_t *thread);
/* The calling thread's exit has begun (its heaps are abandoned): it
 * allocates from the exit heap (thread.c). */
bool coral_thread_exiting(void);
/* The process-wide heap of exiting threads, locked (NULL: no memory, not
 * locked); every use ends with coral_exit_heap_release. */
coral_heap_t *coral_exit_heap_acquire(void);
void coral_exit_heap_release(void);
/* The process set up (options read), without allocating. */
void coral_process_init(void);
/* Called at the start of a thread's exit, before its heaps are abandoned
 * (the api layer's bulk cache gives its blocks back there). */
typedef void (*coral_thread_exit_fn)(void);
void coral_thread_exit_hook_set(coral_thread_exit_fn fn);
/* The same, unless a hook is set already. */
void coral_thread_exit_hook_set_if_none(coral_thread_exit_fn fn);
/* The layer above's fork handlers: prepare runs first of all (before any
 * lock of the layers below is taken), parent and child last. parent must
 * only release what prepare took: a fork's prepare that must wait for a
 * lock of the layers below runs parent, then prepare again (thread.c,
 * fork_lock_to_pool). */
typedef void (*coral_fork_fn)(void);
void coral_fork_hooks_set(coral_fork_fn prepare, coral_fork_fn parent, coral_fork_fn child);
/* The layer above's fork handlers for locks that are leaves (no allocator
 * lock is taken while one is held, and one may be taken while an allocator
 * lock is held: the profiler's tables): prepare runs once every lock of the
 * layers below is taken, parent and child before any is released. */
void coral_fork_inner_hooks_set(coral_fork_fn prepare, coral_fork_fn parent, coral_fork_fn child);
/* A user heap of an exiting thread (its pages abandoned): its handle stops
 * working, except that its own thread may still destroy it, until the end
 * of its exit (later key destructors, a Rust thread_local's drop). */
void coral_heap_park_exited(coral_heap_t *heap);
/* heap was parked by the calling thread's exit. */
bool coral_heap_exited_by_caller(const coral_heap_t *heap);
/* Destroy of a parked heap by its own thread: its struct back to the pool. */
void coral_heap_forget_exited(coral_heap_t *heap);
/* A heap struct from the pool (zeroed, registered), or NULL; back to it. */
coral_heap_t *coral_heap_pool_get(void);
void coral_heap_pool_put(coral_heap_t *heap);
/* Run fn on every live heap, under the registry lock. */
typedef void (*coral_heap_visit_fn)(coral_heap_t *heap, void *arg);
void coral_heaps_visit(coral_heap_visit_fn fn, void *arg);

/* ---- heaps (heap.c) --------------------------------------------------------------- */

void coral_heap_init(coral_heap_t *heap, coral_thread_t *thread);
/* A new user heap of the calling thread, or NULL when the OS has no memory. */
coral_heap_t *coral_heap_create(void);
/* A user heap's pages and huge blocks are freed, live blocks and all; the
 * heap is forgotten (destroy) or made empty again (reset). */
void coral_heap_free_all(coral_heap_t *heap, bool keep);
/* fn on every page of the heap (owner): its class pages, full pages,
 * large pages, and its huge blocks' descriptors (those under the huge-list
 * lock: fn must take no lock and free nothing). */
typedef void (*coral_heap_page_fn)(coral_page_t *page, void *arg);
void coral_heap_pages_visit(coral_heap_t *heap, coral_heap_page_fn fn, void *arg);
/* Work done now and then on the slow paths: start the purge thread when it
 * is wanted, and purge from this thread every 256th time. */
CORAL_INLINE void coral_heap_periodic_work(coral_heap_t *heap) {
    coral_purger_start_if_wanted();
    if ((++heap->heartbeat & 255) == 0) coral_purge_tick();
}
/* The first page of class cls with a free block or blocks still to carve,
 * made first in its queue; NULL when the OS has no memory. */
coral_page_t *coral_heap_find_room(coral_heap_t *heap, unsigned cls);
/* The same, with a block on its free list. */
coral_page_t *coral_heap_find_page(coral_heap_t *heap, unsigned cls);
/* Take back the pages other threads' frees gave space again (the heap's
 * delayed_pages): back to their class queues, the empty ones released.
 * Every allocation slow path calls it, whatever the size. */
void coral_heap_collect_delayed(coral_heap_t *heap);
/* Collect every page (page layer); release_empty: release the pages whose
 * blocks are all free. */
void coral_heap_collect(coral_heap_t *heap, bool release_empty);
/* Adopt every abandoned segment into the thread of heap. */
void coral_heap_adopt_all(coral_heap_t *heap);
/* A span of n slices for a new page of heap (adopting abandoned segments
 * or making a new one when the thread's have no room); NULL: no memory. */
coral_page_t *coral_heap_span_alloc(coral_heap_t *heap, size_t n);
/* A large page (one block, just allocated) joins the full queue. */
void coral_heap_add_large_page(coral_heap_t *heap, coral_page_t *page);
/* The heap's thread exits: release what is free, leave the rest for
 * adoption. */
void coral_heap_abandon(coral_heap_t *heap);
/* In a fork's child, for the forking thread's heaps. */
void coral_heap_after_fork_child(coral_heap_t *heap);

/* An empty page there stays in the heap: it is a class page within the
 * front 256 KiB of its class queue, or the first page of it, of a class of
 * blocks of at most CORAL_KEEP_EMPTY_MAX_BLOCK bytes. (One that is not
 * first is parked by coral_heap_page_retire: the purger may return it.) */
bool coral_heap_keeps_empty_page(const coral_page_t *page);

/* Empty pages of classes of bigger blocks (above 64 KiB: 8 a page below
 * 128 KiB, one a page from there) are released at once, the first of their queue too: their
 * slices stay resident in the thread's segment, where the class's next page
 * takes them without a fault, and the purger returns them after the purge
 * delay if none does, with no call from the thread. Kept, the first page of
 * each such class held up to 1 MiB for as long as the thread made no call:
 * a window of 64 KiB-2 MiB blocks left about 22 MiB resident after every
 * block was freed. */
#define CORAL_KEEP_EMPTY_MAX_BLOCK ((size_t)66 * 1024)

/* The free fast path emptied `page`: whether it goes to
 * coral_heap_page_retire, which the first page of its queue does only
 * when its blocks are too big to keep. */
CORAL_INLINE bool coral_heap_retire_when_empty(const coral_page_t *page) {
    return page->link.prev != NULL || page->block_size > CORAL_KEEP_EMPTY_MAX_BLOCK;
}
/* The page's last block was freed: release it unless the heap keeps it
 * (coral_heap_keeps_empty_page) or a notice is pending. */
void coral_heap_page_retire(coral_page_t *page);
/* A block of a full page was freed: back to its class queue. */
void coral_heap_page_unfull(coral_page_t *page);
/* A free by the owner that the fast path left alone. */
void coral_heap_free_local(coral_page_t *page, void *p);
/* The owner's free of block, a block of page (checked, its freed mark and
 * fill written, counted), back to the page at once: the tail of
 * coral_heap_free_local for a block known to be live (a full page taken
 * back to its queue, an emptied one retired). */
void coral_heap_free_local_now(coral_page_t *page, coral_block_t *block);

/* ---- the secure build's ring of freed blocks (heap.c) --------------------------------
 * The owner's frees on the free fast path (blocks of a size class in a
 * page's head slice, api.h) do not go back to their pages at once: each
 * takes a slot of the thread's ring drawn at random, and the block that
 * held the slot leaves it, its fill checked, for its page's free list.
 * Without it a page reuses its freed blocks last in, first out, so a block
 * written after its free that is not handed out again soon was never
 * checked; with it every block's fill is checked within a few frees (each
 * free takes a given block out with probability 1/CORAL_RING_SLOTS).
 * While a block waits it holds the ring's fill (page.h:
 * coral_secure_ring_fill: its bytes 8 to 71, or from 0 up to its mark in
 * a smaller block) and its freed mark, not yet its link; its page still
 * counts it in use (page->used), so the page is neither retired nor
 * released under it.
 * Bounded: CORAL_RING_SLOTS blocks (below), each of a page's head
 * slice, so at most CORAL_RING_SLOTS * CORAL_SLICE_SIZE bytes a thread.
 * Blocks of more than CORAL_RING_MAX_USABLE bytes (below) go back to
 * their page at once.
 * The calling thread's alone (thread-local), every block of a page it owns.
 * So it is emptied (coral_heap_ring_flush) before the thread's heaps are
 * abandoned (thread exit: closed, later frees bypass it), before a user
 * heap's pages are released (destroy, reset), before a heap's blocks are
 * walked (coral_heap_visit, the profiler's walk) and on coral_collect
 * (malloc_trim). A fork needs nothing: the child's one thread keeps its
 * own ring, the other threads' blocks stay counted in use as their other
 * blocks do.
 * Signal handlers: a free() in a handler (POSIX does not allow it;
 * programs do it) may interrupt this thread's own put between its read of
 * a slot and its write of it. A handler's put that drew the same slot
 * would take the same block out (the interrupted put then pushes it a
 * second time: the page's free list loops) and lose its own (overwritten).
 * So the ring is changed only with `busy` set: by the thread
 * (coral_heap_ring_enter, below: a test, then a store, then a signal
 * fence, as the handler runs on this thread) before its draw and its swap
 * of a slot (the put) or its emptying of a slot (the flush), and cleared
 * (coral_heap_ring_exit) once the slot holds its new block, before the
 * block that left goes back to its page (which may free again: a nested
 * put finds the ring free to use). A put that finds `busy` set (a
 * handler's) leaves the ring alone: its block goes back to its page at
 * once, with the fill a page's free blocks hold (coral_heap_ring_bypass);
 * a flush that finds it set empties nothing. A handler's
 * free that interrupts the page push itself, after the swap, is not
 * supported, as for the page lists of every build.
 * An empty slot holds coral_ring_idle (block and page): a page whose
 * tid_flags, 0, equal no thread's id, so that the put's one test of the
 * leaving block's page (owned by the caller, unflagged) also sends an
 * empty slot to coral_heap_ring_out_slow, with no test of its own. */
/* Blocks of more than CORAL_RING_MAX_USABLE usable bytes (those of 8 KiB
 * and up, whose pages hold few blocks: 8 of the biggest) skip the ring and
 * go back at once. A block waiting in the ring keeps its page in use; for a
 * page of few blocks that moves, often and by much, the moment it empties
 * and is parked (heap.c), and so what waits to be purged: in glibc's
 * tst-mallocfork2 (blocks up to 70,000 bytes) the parked pages' bytes then
 * reached the purge thread's start threshold (os/purge.c) during the test
 * now and then, and the thread it started made the process multi-threaded
 * (a fork in a signal handler then waited forever for glibc's atfork lock:
 * docs/DESIGN.md, "Thread exit, adoption, fork"); without the ring, and
 * with it up to this size, they reached it only in the test's final frees. */
#define CORAL_RING_MAX_USABLE ((size_t)4096)
#define CORAL_RING_SLOTS 4u
#define CORAL_RING_SLOT_BITS 2 /* (log2 of the slots) */
/* The draws: the top bits of a multiplicative generator modulo 2^64 (odd
 * state; an odd multiplier of 32 bits, an immediate operand), seeded from
 * a secret at the first put of the thread (coral_heap_ring_out_slow). */
#define CORAL_RING_MUL 0x2c9277b5u
/* The ring: its slots and its draws. One ring for every size: the put's
 * fill and the leaving block's check take their offsets from a table by
 * the block's class (page.h: coral_ring_shape_of), so that a free has no
 * branch on the size (page.h, coral_fill_step). */
typedef struct coral_ring_s {
    uint64_t draw;                                /* the generator's state (odd) */
    coral_block_t *blocks[CORAL_RING_SLOTS];      /* coral_ring_idle: an empty slot */
    struct coral_page_s *pages[CORAL_RING_SLOTS]; /* each block's page */
    uint32_t busy; /* 1: the thread is changing the ring (above: signal handlers) */
    bool seeded;   /* the state holds the secret (else the initial constant) */
    bool closed;   /* the thread's exit cleanup began: frees bypass the ring */
} coral_ring_t;
#if CORAL_SECURE
extern __thread coral_ring_t coral_ring_tls __attribute__((tls_model("initial-exec")));
extern coral_page_t coral_ring_idle;
#endif
/* The thread starts a change of its ring r: sets r->busy and tells
 * whether it was set already (a free in a signal handler that interrupted
 * a change: the caller changes nothing and leaves r->busy set). A test,
 * then a store, not one atomic test-and-set: a handler runs wholly on this
 * thread between two of its instructions and leaves `busy` as it found it
 * (it sets it only if it found it clear, and clears it again when done),
 * so one between the test and the store finds it clear, as the test did,
 * and its change is over before the store. (For the same reason the
 * compiler may take the value this thread stored last for the test.)
 * A signal fence after the store keeps the change's accesses after it. */
CORAL_INLINE bool coral_heap_ring_enter(coral_ring_t *r) {
    bool was = r->busy != 0;
    r->busy = 1;
    atomic_signal_fence(memory_order_seq_cst);
    return was;
}

/* The change of r that coral_heap_ring_enter started is over. */
CORAL_INLINE void coral_heap_ring_exit(coral_ring_t *r) {
    atomic_signal_fence(memory_order_seq_cst);
    r->busy = 0;
}
/* Every block leaves the calling thread's ring (checked, back to its
 * page); close: later frees bypass it (the thread's exit). */
void coral_heap_ring_flush(bool close);
#if CORAL_SECURE
/* A block that left the ring's slot of the last draw and that the inline
 * path did not take (its page flagged now, full say; its fill changed; or
 * coral_ring_idle, an empty slot): a changed fill is reported (a write
 * after free, fatal), else it goes back to its page by
 * coral_heap_free_local_now. An empty slot: the ring is filling (the
 * draws seeded at the first), or closed (the block just put goes back at
 * once: a closed ring stays empty). */
void coral_heap_ring_out_slow(coral_page_t *page, coral_block_t *block);
/* A put that found the ring busy (a free in a signal handler that
 * interrupted a change of the ring): block (freed mark written, counted)
 * gets the fill of a page's free blocks and goes back to page at once. */
void coral_heap_ring_bypass(coral_page_t *page, coral_block_t *block);
#endif

/* A free by a thread that does not own the segment (huge blocks too). */
void coral_heap_free_remote(coral_segment_t *seg, coral_page_t *page, void *p);

/* ---- invariants (check.c) ------------------------------------------------------------ */

/* Walk the calling thread's heaps, pages and segments: 0 when every
 * invariant holds, else -1 with the first one broken and where. */
int coral_heap_check_thread(const char **why, const void **where);

/* ---- large and huge blocks (large.c) ------------------------------------------------ */

/* A block above CORAL_CLASS_MAX_SIZE (or aligned above the slice size). */
void *coral_heap_malloc_large(coral_heap_t *heap, size_t size, size_t alignment, bool zero);
void *coral_realloc_large_in_place(coral_page_t *page, void *p, size_t size);
void *coral_huge_realloc(coral_segment_t *seg, void *p, size_t size);
/* The secure build: p was a huge block, lately freed (its mapping gone or inaccessible). */
bool coral_huge_was_freed(const void *p);
/* What malloc_usable_size says of the huge block p: its usable bytes; in
 * the secure build its request. */
size_t coral_huge_usable(coral_segment_t *seg, const void *p);
/* Where a huge block starting offset bytes into its segment ends for a
 * request of size bytes (its usable size is the difference). */
size_t coral_huge_block_end(size_t offset, size_t size);
void coral_huge_free(coral_segment_t *seg);
/* The secure build: a huge block's canary, the 8 bytes right after its
 * request (the canary of its start, coral_canary_of, in the epoch its
 * header got at the allocation: a canary's bytes, never NUL or ASCII),
 * written by its allocation and every realloc (large.c). Whether they are
 * intact: checked at its free (by any thread), realloc,
 * malloc_usable_size, the sized frees and its heap's destroy, so that a
 * write of the byte past the request is found there, as a small block's
 * request canary finds it (its guard region starts where the block's
 * 2 MiB rounding ends, too far for a fault). The owner writes them before
 * it hands the block out or back; any thread reads them after the program
 * handed the block over (as huge_request, segment.h). Only called in the
 * secure build. */
CORAL_INLINE bool coral_huge_canary_intact(const coral_segment_t *seg) {
    const coral_page_t *page = &seg->pages[0];
    uint64_t word;
    memcpy(&word, page->start + seg->huge_request, sizeof word);
    return word == coral_canary_of(page, page->start);
}
/* The lock of every heap's huge-block list and of the huge blocks'
 * owner field (pages[0].owner of a huge segment): held by whoever links,
 * unlinks or detaches one. A fork takes it (thread.c). */
void coral_huge_lists_lock(void);
void coral_huge_lists_unlock(void);
void coral_huge_release(coral_segment_t *seg);

#endif /* CORAL_HEAP_H */
