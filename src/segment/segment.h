/* Layer 3, segment: the address space the allocator carves.
 *
 * It owns: segments (4 MiB, 4 MiB-aligned regions cut into 64 slices of
 * 64 KiB; slice 0 holds the segment header and the 64 slice descriptors),
 * spans (runs of free slices handed to the page layer), the segment map
 * (address to segment, for free), the segment cache (cache.c: freed
 * segments' address space kept mapped for reuse, purged after the delay),
 * the purge of a segment's free slices, and the list of segments abandoned
 * by exited threads (adopted by the heap layer).
 *
 * A block's segment is its address rounded down to 4 MiB, its slice
 * descriptor the slice index into seg->pages: arithmetic, no lookup. Blocks
 * bigger than a segment's spans (huge blocks) get a segment of their own,
 * bigger than 4 MiB, whose pages[0] describes the one block.
 *
 * Ownership: a normal segment belongs to one thread (seg->thread_id, and
 * the thread's coral_thread_segments_t). That thread alone takes and frees
 * its spans and touches the owner-only fields of its descriptors; other
 * threads free blocks into it through the page layer's remote-free
 * protocol. */
#ifndef CORAL_SEGMENT_H
#define CORAL_SEGMENT_H

#include "os/os.h"

/* ---- geometry ------------------------------------------------------------ */
#define CORAL_SEGMENT_SHIFT 22
#define CORAL_SEGMENT_SIZE ((size_t)1 << CORAL_SEGMENT_SHIFT)
#define CORAL_SEGMENT_MASK (CORAL_SEGMENT_SIZE - 1)
#define CORAL_SLICE_SHIFT 16
#define CORAL_SLICE_SIZE ((size_t)1 << CORAL_SLICE_SHIFT)
#define CORAL_SLICES_PER_SEGMENT 64
/* The secure build keeps the last slice of every normal segment out of
 * use and inaccessible: a guard between the segment's blocks and whatever
 * is mapped after it (often the next segment's header). Its bit is set in
 * used_slices for the segment's whole life, so no span takes it. */
#define CORAL_GUARD_SLICE (CORAL_SLICES_PER_SEGMENT - 1)
#define CORAL_GUARD_SLICE_BITS (CORAL_SECURE ? (uint64_t)1 << CORAL_GUARD_SLICE : 0)
/* Requests above this fail with ENOMEM (C says objects must fit ptrdiff_t). */
#define CORAL_MAX_REQUEST ((size_t)PTRDIFF_MAX - 2 * CORAL_SEGMENT_SIZE)

/* ---- the slice descriptor ------------------------------------------------------
 * One per slice, in the segment header. The descriptor of a span's first
 * slice (its head) describes the span in use: a *page* (the page layer's
 * word: blocks of one size class, or one large block). The other slices of
 * a span are INTERIOR and lead back to the head (slice_offset).
 *
 * Who writes what: the span fields (slice_offset, slice_count, start,
 * is_fresh, the INTERIOR and FREED flags) belong to this layer; the block
 * lists, the counts, the remote-free word and the page flags to the page
 * layer (page/page.h has the protocol); `link` and `owner` to the heap that
 * holds the page; tid_flags is written as its comment says.
 *
 * 128 bytes, a power of two, so finding one is a shift. Two cache lines,
 * cut by who writes them, so that a free from another thread never touches
 * the line its owner writes at every malloc and free (measured in
 * docs/experiments/, "The secure build"):
 *
 *   - the first line is the owner's alone: its fast paths write free,
 *     local_free and used at every call, its slow paths the rest (link at
 *     queue changes; capacity, free_is_zero, is_fresh when carving and
 *     collecting; the owner's view of the block geometry once, at page
 *     init). No other thread reads or writes it. The owner's malloc reads
 *     nothing else of the descriptor (the secure build's checks read that
 *     view: page/page.h).
 *   - the second line is shared. Remote frees write thread_free (their
 *     push, a CAS; the owner's collect and the purger CAS it too) and, to
 *     tell the owner of a full page, delayed_next and delayed_listed; they
 *     read the rest: tid_flags, slice_offset, slice_count, reserved, owner,
 *     and the block geometry (class_idx, block_size, start, and the secure
 *     build's epoch, with which a remote free checks the block's canary and
 *     writes its freed mark at the call, as the owner's free does). The
 *     geometry and reserved are written by the owner at page init (start
 *     and slice fields by the segment layer before it; a large block's
 *     block_size also when it is resized in place), while no other thread
 *     can hold a block of the page; tid_flags as its comment says. The
 *     owner's free reads this line too (tid_flags; the secure build's
 *     checks read the owner's view on the first), never writes it on its
 *     fast path.
 */
typedef struct coral_block_s {
    struct coral_block_s *next;
} coral_block_t;

struct coral_page_owner_s; /* the page layer's view of a heap */

typedef struct coral_page_s {
    /* First cache line: the owner's. Written by the segment's owner thread
     * at every malloc and free; no other thread reads or writes it. */
    coral_block_t *free;       /* blocks malloc pops */
    coral_block_t *local_free; /* blocks the owner freed, moved to free later */
    uint32_t used;             /* blocks handed out and not yet returned */
    uint32_t capacity;         /* blocks carved out of the span so far */
    /* The owner's view of the block geometry (second line), for its malloc
     * and free of a block of a size class (the secure build's checks of
     * the canary, freed mark and fill, and what they write, page/page.h):
     * block_size less the canary's 8 bytes (the canary's word is at
     * block + owner_usable_size, an addressing mode); the low 32 bits of
     * start (a block of the page's segment is in the page when its address
     * less them, in 32 bits, is at most the last block's offset: the
     * segment is 4 MiB); the offset of the last block from start
     * ((reserved - 1) * block_size); the canary of the block at address 0,
     * the secret key with the page's epoch folded in (a block's canary is
     * this with the block's address folded in). So a malloc reads no line
     * that remote frees write. Written at page init, never changed after (a
     * large page's block_size may: its malloc and free never read these). */
    /* The default build keeps neither here: the block-start multiplier of
     * its free fast path, which is also the page's freed mark, and the
     * product that bounds the carved blocks' starts (page/page.h, "block
     * starts") take their places. Written at page init and reset, and
     * (carved_x) whenever capacity changes. */
    union {
        struct {
            uint32_t owner_usable_size; /* the secure build: block_size - 8 */
            uint32_t owner_start_low;   /* the secure build */
        };
        uint64_t owner_start_mul; /* the default build */
    };
    union {
        uint64_t owner_canary;   /* the secure build */
        uint64_t owner_carved_x; /* the default build */
    };
    uint32_t owner_last_block;
    uint8_t free_is_zero; /* every block on `free` is zero but its link (page/page.h) */
    uint8_t is_fresh;     /* the span came zeroed from the OS */
    /* Parked: its free blocks all given to thread_free (page/page.c,
     * "Parked pages"); the owner takes them back before any use. */
    uint8_t is_parked;
    /* Set aside: ASIDE in thread_free (page/page.c, "Aside pages"), the
     * owner's own note of it, so that it clears ASIDE before it touches
     * the page's lists with no load of the shared word when it is not. */
    uint8_t is_aside;
    coral_link_t link; /* in the owner heap's queue; link.prev NULL: first */
    /* Second cache line: shared with other threads (who writes which
     * field, and when: above). Remote frees read it and write thread_free. */
    _Alignas(64) _Atomic(uintptr_t) thread_free; /* remote-freed blocks, count, state */
    _Atomic(struct coral_page_owner_s *) owner;  /* NULL while abandoned */
    _Atomic(struct coral_page_s *) delayed_next; /* in owner->delayed_pages */
    /* The owner thread's id ORed with the slice's flags shifted to the top
     * byte (coral_slice_flags): equal to coral_thread_id() exactly when the
     * calling thread owns the page and no flag is set, the one test of the
     * free fast path. The thread-id part is the segment owner's on the head
     * of a span in use, 0 elsewhere (interior and free slices, huge and
     * abandoned segments). Written only by the segment's owner (or, for an
     * abandoned segment, the thread adopting it: before it frees into the
     * page), with relaxed stores; any thread reads it. A reader that is not
     * the owner can never see its own id: the word holds either 0 or the id
     * of a thread that is alive (an exiting owner clears the id before it
     * abandons the segment). */
    _Atomic(uintptr_t) tid_flags;
    size_t block_size;
    uint8_t *start; /* first block */
    uint32_t epoch; /* the secure build: a new value at every page init (page/secure.c) */
    /* 16 bits each: an offset is at most 63 descriptors (8064 bytes), a
     * span at most 64 slices, a page at most 4095 blocks (the remote-free
     * word's count has 12 bits; coral_test_check asserts it). */
    uint16_t slice_offset; /* every descriptor: bytes back to the span's head */
    uint16_t slice_count;  /* head descriptor: slices in the span; 0 = free */
    uint16_t reserved;     /* blocks that fit in the span */
    uint8_t class_idx;     /* size class, or CORAL_CLASS_LARGE */
    /* The page was made for a user heap (coral_heap_new), whose destroy
     * frees it whatever is live: never in a bulk cache. Set at page init,
     * kept when the page is adopted; read by any thread. */
    uint8_t is_user_heap;
    /* Set by the remote freer that pushes the page on owner->delayed_pages,
     * cleared by the owner when it takes it off; a listed page is never
     * released (page/page.c). */
    _Atomic(uint8_t) delayed_listed;
    _Atomic(uint8_t) orphan_listed;
    /* A large page whose block was allocated with an alignment above a
     * slice (CORAL_PAGE_HAS_ALIGNED): the block starts this many slices
     * after start (coral_page_large_block), 0 otherwise. Written by the
     * owner before the block is handed out; any thread reads it. */
    uint16_t aligned_slices;
} coral_page_t;

_Static_assert(sizeof(coral_page_t) == 128, "slice descriptors are 128 bytes");
_Static_assert(offsetof(coral_page_t, thread_free) == 64 &&
                   offsetof(coral_page_t, block_size) / 64 == 1 &&
                   offsetof(coral_page_t, epoch) / 64 == 1 &&
                   offsetof(coral_page_t, link) + sizeof(coral_link_t) <= 64,
               "what a remote free reads lies on the second cache line, what the owner's "
               "malloc reads on the first");

/* A page's place in the orphan list (page/reclaim.c), kept in the segment
 * header beside the descriptors (seg->orphans[i] for seg->pages[i]), not
 * in them: the descriptors' lines have no room left. Under the list's
 * lock. */
typedef struct coral_orphan_entry_s {
    coral_link_t link;
    uint64_t since_ms; /* when the page was listed */
    int64_t bytes;     /* counted in the purge backlog for this listing (0: aside) */
} coral_orphan_entry_t;

/* ---- slice flags -------------------------------------------------------------------
 * The top byte of tid_flags (user-space addresses, and so thread ids, are
 * below 2^56 on every target). Any flag set makes the free fast path step
 * aside. This layer's two: */
#define CORAL_SLICE_FLAG_SHIFT 56
#define CORAL_SLICE_TID_MASK ((((uintptr_t)1) << CORAL_SLICE_FLAG_SHIFT) - 1)
/* a later slice of a span, not its head (the heap's path resolves it) */
#define CORAL_PAGE_INTERIOR 4u
/* the head of a span given back (slice_count 0), until a page is made there
 * again: a free into it (a double free of a block of a released page)
 * leaves the fast path for the heap's, which reports it */
#define CORAL_SLICE_FREED 16u

CORAL_INLINE uintptr_t coral_slice_tid_flags(const coral_page_t *s) {
    return atomic_load_explicit(&((coral_page_t *)s)->tid_flags, memory_order_relaxed);
}
CORAL_INLINE unsigned coral_slice_flags(const coral_page_t *s) {
    return (unsigned)(coral_slice_tid_flags(s) >> CORAL_SLICE_FLAG_SHIFT);
}
/* The owner thread's id part (0: none). */
CORAL_INLINE uintptr_t coral_slice_tid(const coral_page_t *s) {
    return coral_slice_tid_flags(s) & CORAL_SLICE_TID_MASK;
}
/* Writer (see tid_flags): both parts at once. */
CORAL_INLINE void coral_slice_set(coral_page_t *s, uintptr_t tid, unsigned flags) {
    atomic_store_explicit(&s->tid_flags, tid | ((uintptr_t)flags << CORAL_SLICE_FLAG_SHIFT),
                          memory_order_relaxed);
}
CORAL_INLINE void coral_slice_set_flags(coral_page_t *s, unsigned flags) {
    coral_slice_set(s, coral_slice_tid(s), flags);
}
CORAL_INLINE void coral_slice_set_tid(coral_page_t *s, uintptr_t tid) {
    coral_slice_set(s, tid, coral_slice_flags(s));
}

/* ---- segments ----------------------------------------------------------------- */
#define CORAL_SEGMENT_NORMAL 1u
#define CORAL_SEGMENT_HUGE 2u

typedef struct coral_thread_segments_s coral_thread_segments_t;

typedef struct coral_segment_s {
    /* The owner thread's id, 0 while abandoned, cached, or huge. Written by
     * the owner (or the adopter), read by any thread that frees into the
     * segment. */
    _Atomic(uintptr_t) thread_id;
    uint32_t kind;       /* CORAL_SEGMENT_*; never changes while mapped */
    uint32_t used_pages; /* owner-only: spans in use */
    size_t size;         /* bytes mapped; never changes while a block is live */
    /* Slice bitmaps (bit i = slice i; bit 0 is the header).
     * used_slices: in a span. Written by the owner only; the purger reads it.
     * dirty_slices: touched since mapped or purged. Written only under
     * span_lock: by the owner when it takes slices, by the purger when it
     * purges free ones. Taking slices also needs span_lock, so a slice the
     * purger saw free stays free until it is done. */
    _Atomic(uint64_t) used_slices;
    _Atomic(uint64_t) dirty_slices;
    _Atomic(int) span_lock;         /* try-lock, never held across a wait */
    _Atomic(uint64_t) purge_due_ms; /* 0: nothing to purge; else when to purge */
    /* The segment's own demand window (segment_purge_free), under
     * span_lock. used_high: the most slices in spans since the purger last
     * looked, raised by the owner as it takes slices, set back to the
     * count then by the purger. window_peak: the most the purger saw in
     * the window that began at window_ms (purger only). */
    uint8_t used_high;
    uint8_t window_peak;
    uint64_t window_ms;
    coral_thread_segments_t *owner; /* NULL when not owned */
    /* In the owner's list, the abandoned list, or (huge) a user heap's list
     * of huge blocks: whoever holds the segment says which, and guards it. */
    coral_link_t link;
    coral_link_t registry_link; /* every mapped normal segment, for the purger */
    size_t huge_dirty; /* huge segments, owner only: bytes from the base that may hold data */
    /* Huge segments, secure build, owner only: bytes made inaccessible
     * right after the block (its guard: heap/large.c). */
    size_t huge_guard;
    /* Huge segments, owner only (any thread reads it at the block's free
     * and malloc_usable_size, after the program handed the block over):
     * the program's request, which the secure build's malloc_usable_size
     * reports and its sized frees must name (heap/large.c: written at the
     * allocation and at every realloc). */
    size_t huge_request;
    /* A hint for adopters: bit (cls % 128) set when the exiting owner left
     * a page of class cls with free blocks here. Written by the owner
     * before it publishes the segment on the abandoned list, read under
     * that list's lock, cleared when adopted. */
    uint64_t room_classes[2];
    _Alignas(128) coral_page_t pages[CORAL_SLICES_PER_SEGMENT];
    coral_orphan_entry_t orphans[CORAL_SLICES_PER_SEGMENT]; /* beside pages[], same index */
} coral_segment_t;

/* A thread's segments: the segments it takes spans from. Owner-only. */
struct coral_thread_segments_s {
    uintptr_t thread_id;
    coral_list_t segments; /* owned segments that have spans in use */
    /* The segment of the last one-slice span, tried first for the next: one
     * of `segments` or NULL (cleared when it leaves the thread). */
    coral_segment_t *small_segment;
    /* Segments this thread took new from the cache (never adopted ones):
     * huge pages wait for the second (span_wants_huge_pages). */
    uint32_t segments_made;
};

CORAL_INLINE coral_segment_t *coral_ptr_segment(const void *p) {
    return (coral_segment_t *)((uintptr_t)p & ~(uintptr_t)CORAL_SEGMENT_MASK);
}

CORAL_INLINE uint8_t *coral_segment_base(coral_segment_t *seg) { return (uint8_t *)seg; }

/* The descriptor of p's slice. (p >> 9) & 0x1f80 is the slice index times
 * 128, the descriptor size, in one shift and one mask. */
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

/* ---- the segment map -------------------------------------------------------------
 * One byte per 4 MiB chunk of the 47-bit user address space: NONE, the start
 * of a segment, or a later chunk of a huge segment. Written only while no
 * block of the chunk is live; read by free. */
#define CORAL_MAP_NONE 0
#define CORAL_MAP_SEGMENT 1
#define CORAL_MAP_HUGE_TAIL 2
#define CORAL_MAP_CHUNKS ((size_t)1 << (47 - CORAL_SEGMENT_SHIFT))
extern uint8_t coral_segment_map[CORAL_MAP_CHUNKS];

/* Entries are written with atomic stores and read plainly here: an entry
 * only changes while no block of its chunk is live, so no free can read the
 * byte being written. (Under TSan the read is atomic too, which keeps the
 * tool's model exact.) */
CORAL_INLINE uint8_t coral_map_kind_of_chunk(uintptr_t chunk) {
    if (coral_unlikely(chunk >= CORAL_MAP_CHUNKS)) return CORAL_MAP_NONE;
#if defined(__SANITIZE_THREAD__)
    return __atomic_load_n(&coral_segment_map[chunk], __ATOMIC_RELAXED);
#else
    return coral_segment_map[chunk];
#endif
}

CORAL_INLINE uint8_t coral_map_kind(uintptr_t addr) {
    return coral_map_kind_of_chunk(addr >> CORAL_SEGMENT_SHIFT);
}

void coral_segment_map_set(void *start, size_t size, bool present);
/* The segment holding p, also deep inside a huge block; NULL when coralloc
 * does not manage p. */
coral_segment_t *coral_segment_of_any(const void *p);

/* ---- the segment cache (cache.c) ---------------------------------------------------- */
typedef struct coral_cache_got_s {
    size_t dirty; /* bytes from the base that may hold old data; the rest is zero */
    bool fresh;   /* a new mapping */
    bool header;  /* the first slice holds a freed segment's header, every descriptor free */
} coral_cache_got_t;
/* `size` bytes (whole chunks), 4 MiB-aligned, from the cache or the OS;
 * its first `huge_bytes` (a multiple of 2 MiB; 0: none) advised for huge
 * pages before anything is written there (coral_huge_pages_for_*). */
void *coral_segment_cache_take(size_t size, size_t huge_bytes, coral_cache_got_t *got);
/* The range [addr, addr + size), if the cache holds all of it in one region. */
bool coral_segment_cache_take_range(void *addr, size_t size);
/* Free chunks (bytes up to base + dirty may hold data): kept or unmapped. */
void coral_segment_cache_put(void *base, size_t size, size_t dirty, bool header);
/* Bytes of cached regions that may hold data. */
int64_t coral_segment_cache_dirty(void);
/* What a purge at `now` may return of the free memory that may hold data
 * (free slices of segments in use, cached regions): what they hold beyond
 * what the demand window keeps (coral_purge_keep_bytes). The stages spend
 * it in whole runs, the cache's regions first, then free slices. */
int64_t coral_segment_purge_budget(uint64_t now);
/* The purge stage of the cache (registered by coral_segments_init). */
uint64_t coral_segment_cache_purge(uint64_t now, bool force);
void coral_segment_cache_prefork(void);
void coral_segment_cache_postfork(void);

/* ---- segments and spans (segment.c) -------------------------------------------------- */

/* Called once at start-up: the purge stages of this layer. */
void coral_segments_init(void);
/* The header fields of a segment taken from the cache (not the descriptors). */
void coral_segment_header_reset(coral_segment_t *seg);
/* A span of n slices (1..63) in one of the thread's segments; NULL if none
 * has room (the caller may adopt abandoned segments, then ask for a new). */
coral_page_t *coral_span_alloc_owned(coral_thread_segments_t *ts, size_t n);
/* A span of n slices in a new segment of the thread; NULL (errno ENOMEM)
 * when the OS has no memory. */
coral_page_t *coral_span_alloc_new(coral_thread_segments_t *ts, size_t n);
/* Return a span's slices to its segment (owner only); a segment left with
 * no span goes to the segment cache. */
void coral_span_free(coral_page_t *page);
/* Grow or shrink a span in place to `slices` (owner only). */
bool coral_span_resize(coral_page_t *page, size_t slices);
/* Slice i (>= 1) of a span: leads back to the head. */
void coral_slice_mark_interior(coral_page_t *slice, size_t i);

/* A thread exits: its segments with spans in use are abandoned (the caller
 * has taken their pages out of its heaps), the others go to the cache. */
void coral_segments_abandon(coral_thread_segments_t *ts);
/* The oldest abandoned segment, made the thread's; NULL if none. The caller
 * gives its spans in use a heap. */
/* How many segments are abandoned: changed under the abandoned list's
 * lock, read without it as a hint (a miss only delays an adoption). */
extern _Atomic(size_t) coral_abandoned_count;
CORAL_INLINE bool coral_segments_abandoned_any(void) {
    return atomic_load_explicit(&coral_abandoned_count, memory_order_relaxed) != 0;
}

/* The exiting owner left a page of class cls with free blocks in seg. */
CORAL_INLINE void coral_segment_note_room(coral_segment_t *seg, unsigned cls) {
    seg->room_classes[(cls / 64) & 1] |= (uint64_t)1 << (cls % 64);
}

/* Adopt an abandoned segment: the oldest (cls 0), or among the oldest few
 * one with free blocks of class cls (NULL if none of them has). */
coral_segment_t *coral_segment_adopt_next(coral_thread_segments_t *ts, unsigned cls);
/* The span after `page` in its segment (NULL at the end): walks the spans
 * in use of an adopted segment, starting from NULL. */
coral_page_t *coral_segment_next_span(coral_segment_t *seg, coral_page_t *page);
void coral_segment_locks_prefork(void);
void coral_segment_locks_postfork(bool child);

#endif /* CORAL_SEGMENT_H */
