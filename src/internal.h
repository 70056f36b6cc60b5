/* coralloc internals: the data structures every module shares.
 *
 * Memory comes from the OS in segments: 4 MiB, 4 MiB-aligned regions. A
 * segment is cut into 64 slices of 64 KiB. Slice 0 holds the segment header
 * (this struct and the page descriptors); the others are grouped into spans,
 * and each span in use is a *page*: blocks of one size class, or one large
 * block. A block's segment is its address rounded down to 4 MiB, and its page
 * descriptor is found from the slice index: arithmetic, no lookup.
 *
 * Blocks larger than a segment can hold (huge blocks) get a segment of their
 * own, bigger than 4 MiB, whose header describes the one block.
 *
 * Ownership: a segment belongs to one thread (segment->thread_id). That thread
 * alone touches the owner-only fields of the segment and its pages. Any other
 * thread that frees a block of the segment pushes it on the page's atomic
 * thread_free list (page.c documents the protocol).
 */
#ifndef CORAL_INTERNAL_H
#define CORAL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coralloc.h"

#define CORAL_INLINE static inline __attribute__((always_inline))
#define CORAL_NOINLINE __attribute__((noinline))
#define CORAL_COLD __attribute__((cold, noinline))
#define coral_likely(x) __builtin_expect(!!(x), 1)
#define coral_unlikely(x) __builtin_expect(!!(x), 0)

/* ---- geometry ------------------------------------------------------------ */
#define CORAL_SEGMENT_SHIFT 22
#define CORAL_SEGMENT_SIZE ((size_t)1 << CORAL_SEGMENT_SHIFT)
#define CORAL_SEGMENT_MASK (CORAL_SEGMENT_SIZE - 1)
#define CORAL_SLICE_SHIFT 16
#define CORAL_SLICE_SIZE ((size_t)1 << CORAL_SLICE_SHIFT)
#define CORAL_SLICES_PER_SEGMENT 64
#define CORAL_OS_PAGE_SIZE ((size_t)4096)
#define CORAL_ALIGNMENT 16 /* every malloc result is aligned to this */

/* ---- size classes ----------------------------------------------------------
 * Classes 1..8 are 16, 32, ..., 128 bytes (every result must be 16-aligned,
 * so there is no 8-byte class). Above 128 each power of two is split in 8:
 * 144, 160, ..., 256, 288, ..., 512, ... up to 512 KiB (class 104). The
 * internal waste is at most 12.5% above 128 bytes. */
#define CORAL_CLASS_SMALL_LAST 8
#define CORAL_CLASS_COUNT 105 /* classes 1..104; 0 is unused */
#define CORAL_CLASS_MAX_SIZE ((size_t)512 * 1024)
#define CORAL_CLASS_LARGE 105 /* a span holding one block, within a segment */
#define CORAL_QUEUE_FULL 106  /* heap queue of pages with no free block */
#define CORAL_QUEUE_COUNT 107
/* Blocks up to this size are served through heap->direct[] (fast path). */
#define CORAL_DIRECT_MAX_SIZE ((size_t)1024)
#define CORAL_DIRECT_COUNT (CORAL_DIRECT_MAX_SIZE / 16 + 1)
#define CORAL_DIRECT_LAST_CLASS 32 /* coral_size_class(1024) */
/* Largest block a normal segment holds in a span: half its slices, less
 * one. A bigger block could never share its segment with another one like
 * it: it is a huge block instead, whole chunks from the pool (pool.c). */
#define CORAL_LARGE_MAX_SIZE ((CORAL_SLICES_PER_SEGMENT / 2 - 1) * CORAL_SLICE_SIZE)
/* Requests above this fail with ENOMEM (C says objects must fit ptrdiff_t). */
#define CORAL_MAX_REQUEST ((size_t)PTRDIFF_MAX - 2 * CORAL_SEGMENT_SIZE)

CORAL_INLINE unsigned coral_size_class(size_t size) {
    if (size <= 128) return size <= 16 ? 1u : (unsigned)((size + 15) >> 4);
    size_t s = size - 1;
    unsigned bit = 63u - (unsigned)__builtin_clzl(s); /* >= 7 */
    return 9u + (bit - 7u) * 8u + (unsigned)((s >> (bit - 3u)) & 7u);
}

CORAL_INLINE size_t coral_class_size(unsigned cls) {
    if (cls <= CORAL_CLASS_SMALL_LAST) return (size_t)cls * 16;
    unsigned group = (cls - 9u) / 8u, step = (cls - 9u) % 8u;
    return (size_t)(9u + step) << (group + 4u);
}

/* ---- blocks, pages, segments, heaps --------------------------------------- */
typedef struct coral_block_s {
    struct coral_block_s *next;
} coral_block_t;

typedef struct coral_heap_s coral_heap_t;
typedef struct coral_tld_s coral_tld_t;

/* page->flags bits. Both make the free fast path step aside. */
#define CORAL_PAGE_IN_FULL 1u     /* in the heap's full queue */
#define CORAL_PAGE_HAS_ALIGNED 2u /* may hold pointers inside blocks */
#define CORAL_PAGE_INTERIOR 4u    /* not a span's head: a later slice of it */
/* page->shared_flags only: the page was made for a user heap (coral_heap_new),
 * whose destroy frees it whatever is live: never in a bulk cache (stash.h).
 * Set at page init, kept when the page is adopted (so never cleared while
 * another thread may read it). */
#define CORAL_PAGE_USER_HEAP 8u

/* page->thread_free packs, from the low bits up (page.c has the protocol):
 *   bits 0-1   the delay state;
 *   bit 2      RECLAIMED: every block of the page was remote-freed and the
 *              purger took them all (reclaim.c); the owner resets the page;
 *   bit 3      BUSY: the purger is returning the page's memory right now;
 *   bits 4-47  the list of remote-freed blocks (16-aligned pointers);
 *   bits 48-63 how many blocks the list holds (a page has at most 4096). */
#define CORAL_DELAY_NONE 0u     /* remote frees push on thread_free */
#define CORAL_DELAY_USE 1u      /* the next remote free tells the heap (delayed_pages) */
#define CORAL_DELAY_FREEING 2u  /* a remote thread is pushing the page to the heap now */
#define CORAL_DELAY_NEVER 3u    /* page is abandoned: never use the heap */
#define CORAL_DELAY_MASK ((uintptr_t)3)
#define CORAL_TF_RECLAIMED ((uintptr_t)4)
#define CORAL_TF_BUSY ((uintptr_t)8)
#define CORAL_TF_COUNT_SHIFT 48
#define CORAL_TF_LIST_MASK ((((uintptr_t)1) << CORAL_TF_COUNT_SHIFT) - 16)

CORAL_INLINE struct coral_block_s *coral_tf_list(uintptr_t tf) {
    return (struct coral_block_s *)(tf & CORAL_TF_LIST_MASK);
}
CORAL_INLINE uint32_t coral_tf_count(uintptr_t tf) { return (uint32_t)(tf >> CORAL_TF_COUNT_SHIFT); }

/* A page descriptor is 128 bytes, a power of two so that finding it is a
 * shift. The first cache line holds what the owner's fast paths write on
 * every call (free, local_free, used) and what only the owner reads; a
 * remote free never reads it. The second holds what remote frees write
 * (thread_free) and everything they read (slice_offset, slice_count,
 * reserved, shared_flags, heap): a free from another thread then costs the
 * owner nothing on its malloc and free lines. (With slice_offset and
 * reserved on the first line, every remote free pulled the line the owner
 * was writing into the freer's cache and back.) */
typedef struct coral_page_s {
    /* First cache line: the owner's. Written only by the segment's owner
     * thread. A remote free reads none of it, except to resolve a pointer
     * inside an aligned block (start, block_size) and, in CORAL_STATS
     * builds, to count the free (class_idx); the purger reads
     * orphan_since_ms under the orphan lock (reclaim.c). */
    coral_block_t *free;       /* blocks malloc pops */
    coral_block_t *local_free; /* blocks the owner freed, moved to free later */
    uint32_t used;             /* blocks handed out and not yet returned */
    uint32_t capacity;         /* blocks carved out of the span so far */
    uint8_t flags;             /* CORAL_PAGE_* */
    uint8_t free_is_zero;      /* every block on `free` is zero but its link */
    uint8_t is_fresh;          /* the span came zeroed from the OS */
    uint8_t class_idx;         /* size class, or CORAL_CLASS_LARGE */
    uint32_t padding1;
    size_t block_size;
    uint8_t *start;            /* first block */
    struct coral_page_s *prev; /* in the owner heap's queue; NULL: first */
    uint64_t orphan_since_ms;  /* when it was listed as an orphan (reclaim.c) */
    /* Second cache line: shared with other threads. The plain fields are
     * written by the owner only while no other thread can free into the
     * span (it is being set up or torn down), and read by remote frees. */
    struct coral_page_s *next;
    _Atomic(uintptr_t) thread_free; /* remote-freed blocks, count, state */
    _Atomic(coral_heap_t *) heap;   /* owner heap; NULL while abandoned */
    /* heap->delayed_pages link. delayed_listed is set by the remote freer
     * that pushes the page there, cleared by the owner when it takes it off;
     * a listed page is never released (page.c, heap.c). */
    _Atomic(struct coral_page_s *) delayed_next;
    /* The orphan list (reclaim.c), under its lock: pages all of whose blocks
     * were remote-freed, waiting for their owner or the purger. */
    struct coral_page_s *orphan_next, *orphan_prev;
    uint32_t slice_offset;     /* every descriptor: bytes back to the span's head */
    uint32_t slice_count;      /* head descriptor: slices in the span; 0 = free */
    uint32_t reserved;         /* blocks that fit in the span */
    _Atomic(uint8_t) delayed_listed;
    _Atomic(uint8_t) orphan_listed;
    /* CORAL_PAGE_HAS_ALIGNED, mirrored from flags when the owner sets it
     * (before the block that needs it is handed out), for other threads. */
    uint8_t shared_flags;
    uint8_t padding2;
} coral_page_t;

_Static_assert(sizeof(coral_page_t) == 128, "page descriptors are 128 bytes");

#define CORAL_SEGMENT_NORMAL 1u
#define CORAL_SEGMENT_HUGE 2u

typedef struct coral_segment_s {
    /* The owner thread's id, 0 while abandoned, cached, or huge. Written by
     * the owner (or the adopter under the abandoned-list lock), read by any
     * thread that frees into the segment. */
    _Atomic(uintptr_t) thread_id;
    uint32_t kind;       /* CORAL_SEGMENT_* */
    uint32_t used_pages; /* owner-only: spans in use */
    size_t size;         /* bytes mapped */
    /* Slice bitmaps (bit i = slice i; bit 0 is the header).
     * used_slices: in a span. Written by the owner only; the purger reads it.
     * dirty_slices: touched since mapped or purged. Written only under
     * span_lock: by the owner when it takes slices, by the purger when it
     * purges free ones. Taking slices also needs span_lock, so a slice the
     * purger saw free stays free until it is done. */
    _Atomic(uint64_t) used_slices;
    _Atomic(uint64_t) dirty_slices;
    _Atomic(int) span_lock;       /* try-lock, never held across a wait */
    _Atomic(uint64_t) purge_due_ms; /* 0: nothing to purge; else when to purge */
    coral_tld_t *tld;      /* owner thread data; NULL when not owned */
    struct coral_segment_s *next, *prev; /* owner's list, or a global list */
    struct coral_segment_s *all_next, *all_prev; /* registry of mapped segments */
    size_t huge_dirty; /* huge segments, owner only: bytes from the base that may hold data */
    _Alignas(128) coral_page_t pages[CORAL_SLICES_PER_SEGMENT];
} coral_segment_t;

typedef struct coral_page_queue_s {
    coral_page_t *first, *last;
} coral_page_queue_t;

/* Per-thread data shared by all heaps of a thread. */
struct coral_tld_s {
    uintptr_t thread_id;
    coral_heap_t *heap_default;
    coral_heap_t *heaps;         /* all heaps of the thread (list via next_heap) */
    coral_segment_t *segments;   /* owned segments that have pages in use */
    /* The segment of the last one-slice page (blocks up to 8 KiB), tried
     * first for the next: one of `segments` or NULL (cleared when it
     * leaves the thread). */
    coral_segment_t *small_segment;
};

struct coral_heap_s {
    /* direct[(size+15)/16]: the first page of the size class serving that
     * size (or the empty page). The malloc fast path reads only this. */
    coral_page_t *direct[CORAL_DIRECT_COUNT];
    coral_page_queue_t queues[CORAL_QUEUE_COUNT];
    /* Full pages of this heap that other threads freed a block into (linked
     * through page->delayed_next). Many threads push (CAS), the owner takes
     * the whole list (exchange): a push-only stack, so no ABA. */
    _Atomic(coral_page_t *) delayed_pages;
    coral_tld_t *tld;
    coral_heap_t *next_heap; /* in tld->heaps, or the free pool */
    bool is_default;
    /* User heaps (coral_heap_new) track their huge blocks so that destroy
     * can free them: any thread's free unlinks one, hence the lock. */
    pthread_mutex_t huge_lock;
    coral_segment_t *huge_blocks;
    coral_heap_t *all_next, *all_prev; /* registry of live heaps (init.c) */
    uint64_t stat_allocs[CORAL_QUEUE_COUNT]; /* by class (CORAL_STATS) */
    uint64_t stat_frees[CORAL_QUEUE_COUNT];
    uint32_t heartbeat; /* slow-path calls, for periodic work */
    /* The thread's bulk cache (stash.h), made by its first coral_free_bulk;
     * default heaps only. Written by the owner (made, or gone at exit),
     * read by the purger under the heap registry lock. */
    _Atomic(struct coral_stash_s *) stash;
    coral_tld_t tld_storage; /* the thread's tld, in its default heap */
};

/* ---- the segment map ---------------------------------------------------------
 * One byte per 4 MiB chunk of the 47-bit user address space: NONE, the start
 * of a segment, or a later chunk of a huge segment. Written only while the
 * segment is mapped and before any block of it is handed out; read by free. */
#define CORAL_MAP_NONE 0
#define CORAL_MAP_SEGMENT 1
#define CORAL_MAP_HUGE_TAIL 2
#define CORAL_MAP_CHUNKS ((size_t)1 << (47 - CORAL_SEGMENT_SHIFT))
extern uint8_t coral_segment_map[CORAL_MAP_CHUNKS];

/* Entries are written with atomic stores (segment.c) and read plainly here:
 * an entry only changes while no block of its chunk is live, so no free can
 * read the byte being written. (Under TSan the read is atomic too, which
 * keeps the tool's model exact.) */
CORAL_INLINE uint8_t coral_map_kind(uintptr_t addr) {
    size_t chunk = addr >> CORAL_SEGMENT_SHIFT;
    if (coral_unlikely(chunk >= CORAL_MAP_CHUNKS)) return CORAL_MAP_NONE;
#if defined(__SANITIZE_THREAD__)
    return __atomic_load_n(&coral_segment_map[chunk], __ATOMIC_RELAXED);
#else
    return coral_segment_map[chunk];
#endif
}

/* ---- thread identity and the thread's heap ----------------------------------
 * The thread pointer is unique among live threads; a dying thread clears it
 * from every segment it owned before it exits. */
CORAL_INLINE uintptr_t coral_thread_id(void) { return (uintptr_t)__builtin_thread_pointer(); }

extern __thread coral_heap_t *coral_tls_heap __attribute__((tls_model("initial-exec")));
extern coral_heap_t coral_heap_empty; /* every direct entry = coral_page_empty */
extern coral_page_t coral_page_empty; /* never has a free block */

CORAL_INLINE coral_segment_t *coral_ptr_segment(const void *p) {
    return (coral_segment_t *)((uintptr_t)p & ~(uintptr_t)CORAL_SEGMENT_MASK);
}

/* The descriptor of p's page: the slice's descriptor, minus its offset back
 * to the head of the span. (p >> 9) & 0x1f80 is the slice index times 128,
 * the descriptor size, in one shift and one mask. */
CORAL_INLINE coral_page_t *coral_segment_slice_of(coral_segment_t *seg, const void *p) {
    _Static_assert(sizeof(coral_page_t) == (size_t)1 << (CORAL_SLICE_SHIFT - 9), "shift below");
    uintptr_t slice_bytes = ((uintptr_t)p >> 9) & ((CORAL_SLICES_PER_SEGMENT - 1) << 7);
    return (coral_page_t *)((uint8_t *)seg->pages + slice_bytes);
}

/* The head descriptor of a slice's span. */
CORAL_INLINE coral_page_t *coral_slice_head(coral_page_t *slice) {
    return (coral_page_t *)((uint8_t *)slice - slice->slice_offset);
}

CORAL_INLINE coral_page_t *coral_segment_page_of(coral_segment_t *seg, const void *p) {
    return coral_slice_head(coral_segment_slice_of(seg, p));
}

CORAL_INLINE uint8_t *coral_segment_base(coral_segment_t *seg) { return (uint8_t *)seg; }

/* ---- module interfaces ------------------------------------------------------ */

/* diagnostics (init.c) */
CORAL_COLD __attribute__((noreturn, format(printf, 1, 2))) void coral_fatal(const char *fmt, ...);
CORAL_COLD __attribute__((format(printf, 1, 2))) void coral_message(const char *fmt, ...);
uint64_t coral_clock_ms(void);

/* os.c: every mmap/munmap/madvise/mremap goes through here. */
void *coral_os_map(size_t size);
void *coral_os_map_aligned(size_t size, size_t alignment);
void coral_os_unmap(void *p, size_t size);
bool coral_os_purge(void *p, size_t size);
bool coral_os_extend(void *end, size_t size);
void coral_os_move(void *src, void *dst, size_t size, bool keep);
void coral_os_populate(void *p, size_t size);
bool coral_os_resident(const void *p, size_t size, unsigned char *vec);
void coral_os_advise_hugepage(void *p, size_t size);

/* populate.c: the adaptive populate policy (CORALLOC_POPULATE=adaptive).
 * Below CORAL_POPULATE_MIN_BYTES a populate costs more than the traps it
 * saves: it never populates a smaller range. */
#define CORAL_POPULATE_MIN_BYTES ((size_t)64 << 10)
bool coral_populate_adaptive(void);
void coral_populate_class_page(coral_page_t *page, size_t bytes, size_t block_size,
                               const coral_page_t *full);
void coral_populate_big_block(uint8_t *p, size_t size);
void coral_populate_note_big_block(const uint8_t *p, size_t size);
void coral_populate_growth(uint8_t *p, size_t old_size, size_t new_size);
void coral_populate_copy(void *dst, size_t size);

/* pool.c: freed segments' address space, kept mapped for reuse */
typedef struct coral_pool_got_s {
    size_t dirty; /* bytes from the base that may hold old data; the rest is zero */
    bool fresh;   /* a new mapping */
    bool header;  /* the first slice holds a freed segment's header, every descriptor free */
} coral_pool_got_t;
void *coral_pool_take(size_t size, coral_pool_got_t *got);
bool coral_pool_take_range(void *addr, size_t size);
void coral_pool_put(void *base, size_t size, size_t dirty, bool header);
uint64_t coral_pool_purge(uint64_t now, bool force);
void coral_pool_prefork(void);
void coral_pool_postfork(void);

/* segment.c */
void coral_segment_header_reset(coral_segment_t *seg);
coral_page_t *coral_segment_page_alloc(coral_heap_t *heap, size_t slices);
void coral_segment_page_free(coral_page_t *page);
bool coral_segment_span_resize(coral_page_t *page, size_t slices);
void coral_slice_mark_interior(coral_page_t *slice, size_t i);
void coral_segment_map_set(void *start, size_t size, bool present);
coral_segment_t *coral_segment_of_any(const void *p);
void coral_segments_abandon(coral_tld_t *tld);
void coral_segments_adopt_all(coral_heap_t *heap);
void coral_segment_registry_add(coral_segment_t *seg);
void coral_segment_registry_remove(coral_segment_t *seg);
uint64_t coral_segments_purge_due(uint64_t now, bool force);
void coral_segment_mark_purgeable(coral_segment_t *seg);

/* purge.c: delayed purging, by the allocating threads or a background one */
void coral_purge_tick(void);
void coral_purge_now(void);
void coral_purger_notify(void);
void coral_purge_backlog_add(int64_t bytes);
void coral_purger_start_if_wanted(void);
void coral_purger_prefork(void);
void coral_purger_postfork(bool child);
void coral_segment_locks_prefork(void);
void coral_segment_locks_postfork(void);

/* reclaim.c: pages all of whose blocks were freed by other threads */
void coral_orphans_lock(void);
void coral_orphans_unlock(void);
void coral_orphan_add(coral_page_t *page);
void coral_orphan_take_back(coral_page_t *page);
void coral_orphan_forget(coral_page_t *page);
uint64_t coral_orphans_reclaim_due(uint64_t now, bool force);
void coral_orphans_prefork(void);
void coral_orphans_postfork(bool child);

/* page.c */
void coral_page_init(coral_heap_t *heap, coral_page_t *page, unsigned cls, size_t block_size);
void coral_page_extend(coral_page_t *page);
void coral_page_top_up_first_carve(coral_page_t *page);
/* A carve step links this many blocks of sizes 256 B-1 KiB, fewer above,
 * more below (page.c). So a page with this many carved needs no top-up:
 * above 256 bytes a step is at most this many, and up to 256 bytes the
 * first carve (an OS page) is a whole step. */
#define CORAL_CARVE_MIN_BLOCKS 16u
void coral_page_reset_empty(coral_page_t *page);
void coral_page_collect(coral_page_t *page);
bool coral_page_thread_free_collect(coral_page_t *page);
void coral_page_push_remote(coral_page_t *page, coral_block_t *head, coral_block_t *tail, uint32_t n);
void coral_page_wait_not_busy(coral_page_t *page);
void coral_page_set_delay(coral_page_t *page, uintptr_t state, bool override_never);
void coral_free_remote(coral_segment_t *seg, coral_page_t *page, void *p);
void coral_free_local_generic(coral_page_t *page, void *p);
uint8_t *coral_page_block_start(const coral_page_t *page, const void *p);

/* heap.c */
void coral_queue_push_front(coral_heap_t *heap, unsigned q, coral_page_t *page);
void coral_queue_remove(coral_heap_t *heap, unsigned q, coral_page_t *page);
void coral_page_unfull(coral_page_t *page);
bool coral_page_notice_pending(coral_page_t *page);
void coral_page_retire(coral_page_t *page);
void coral_page_release(coral_page_t *page);
coral_page_t *coral_heap_find_room(coral_heap_t *heap, unsigned cls);
coral_page_t *coral_heap_find_page(coral_heap_t *heap, unsigned cls);
void coral_heap_delayed_pages_collect(coral_heap_t *heap);
void coral_heap_collect(coral_heap_t *heap, bool release_empty);
void coral_heap_init(coral_heap_t *heap, coral_tld_t *tld);
bool coral_heap_adopt_page(coral_heap_t *heap, coral_page_t *page);
void coral_heap_add_large_page(coral_heap_t *heap, coral_page_t *page);
void coral_heap_abandon(coral_heap_t *heap);
void coral_heap_release_all(coral_heap_t *heap);
void coral_heap_after_fork_child(coral_heap_t *heap);

/* alloc.c: the slow paths of alloc.h */
void *coral_malloc_generic(size_t size, coral_heap_t *heap, bool zero);
void *coral_malloc_refill(size_t size, coral_heap_t *heap, bool zero);
void coral_periodic_work(coral_heap_t *heap);
void coral_free_slow(void *p);
void *coral_malloc_aligned_in(coral_heap_t *heap, size_t size, size_t alignment, bool zero);

/* large.c */
void *coral_malloc_large(coral_heap_t *heap, size_t size, size_t alignment, bool zero);
void *coral_huge_alloc(coral_heap_t *heap, size_t size, size_t alignment, bool zero);
void coral_huge_release(coral_segment_t *seg);
void coral_huge_free(coral_segment_t *seg);
void coral_huge_locks_prefork(void);
void coral_huge_locks_postfork(void);
void *coral_realloc_large_in_place(coral_page_t *page, void *p, size_t size);
void *coral_huge_realloc(coral_segment_t *seg, void *p, size_t size);
size_t coral_huge_usable(coral_segment_t *seg, const void *p);

/* bulk.c: free blocks to their pages, never to the bulk cache, without
 * counting them as freed again (the stash's flush: stash.c). */
void coral_bulk_free_unstashed(void *const *ptrs, size_t n);

/* init.c */
typedef void (*coral_heap_visit_fn)(coral_heap_t *heap, void *arg);
void coral_heaps_visit(coral_heap_visit_fn fn, void *arg);
coral_heap_t *coral_thread_init(void);
void coral_malloc_ready(void);
void coral_thread_done(void *value);
coral_heap_t *coral_heap_pool_get(void);
void coral_heap_pool_put(coral_heap_t *heap);

#endif /* CORAL_INTERNAL_H */
