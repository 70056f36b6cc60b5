/* Layer 4, page: spans of slices holding blocks of one size class.
 *
 * It owns: the size classes; a page's three free lists (free, local_free,
 * thread_free) and the carving of fresh blocks; the remote-free protocol
 * (page.c: how any thread frees into a page it does not own, and how the
 * page tells its owner); orphan pages (reclaim.c: pages all of whose blocks
 * other threads freed, reclaimed by the purger); and the release of a
 * page's span back to its segment.
 *
 * A page belongs to an owner (coral_page_owner_t): the heap layer's heap,
 * seen here only as the list where remote freers post full pages that have
 * free blocks again. */
#ifndef CORAL_PAGE_H
#define CORAL_PAGE_H

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* the ring's check (coral_secure_ring_intact) */
#endif

#include "segment/segment.h"

/* ---- size classes ----------------------------------------------------------
 * Classes 1..8 are 16, 32, ..., 128 bytes (every result must be 16-aligned,
 * so there is no 8-byte class). Above 128 each power of two is split in 8:
 * 144, 160, ..., 256, 288, ..., 512, ... up to 512 KiB (class 104). The
 * internal waste is at most 12.5% above 128 bytes. These are the nominal
 * sizes, the largest request of each class; the blocks of the classes
 * from 8 KiB to 64 KiB are 128 bytes longer (the skew, below).
 *
 * The secure build asks for 8 bytes more than the program (the canary, see
 * "the secure build" below), so a request of a power of two would take the
 * class 12.5% above it, with fewer blocks per page and, from 4 KiB on, one
 * more OS page touched per block. It has a class 16 bytes above every power
 * of two from 256 B to 256 KiB as well: each power-of-two group after the
 * first starts with it (272, 288, ..., 512, 528, 576, ...: nine classes a
 * group, classes 1..115). Every other class is the default build's, so a
 * class whose nominal size is a multiple of an alignment still exists
 * (aligned allocation relies on it). */
#define CORAL_CLASS_SMALL_LAST 8
#define CORAL_CLASS_EXTRA (CORAL_SECURE ? 1u : 0u) /* classes a group adds */
#define CORAL_CLASS_PER_GROUP (8u + CORAL_CLASS_EXTRA)
#define CORAL_CLASS_COUNT (CORAL_SECURE ? 116 : 105) /* classes 1..COUNT-1; 0 is unused */
#define CORAL_CLASS_MAX_SIZE ((size_t)512 * 1024)
/* The class of a request of 2^k bytes, k >= 8: the last of its group. */
#define CORAL_CLASS_OF_POW2(k) (16u + ((unsigned)(k)-8u) * CORAL_CLASS_PER_GROUP)
/* The skewed classes (8 KiB to 64 KiB, "the skew" below) and their twins:
 * the same nominal sizes unskewed, for requests aligned to more than 128
 * bytes (alloc.c), classes COUNT to COUNT + TWINS - 1 (coral_size_class
 * never gives one). */
#define CORAL_CLASS_SKEWED_FIRST CORAL_CLASS_OF_POW2(13)
#define CORAL_CLASS_SKEWED_LAST CORAL_CLASS_OF_POW2(16)
#define CORAL_CLASS_TWINS ((int)(CORAL_CLASS_SKEWED_LAST - CORAL_CLASS_SKEWED_FIRST + 1))
#define CORAL_CLASS_LARGE (CORAL_CLASS_COUNT + CORAL_CLASS_TWINS) /* a span holding one block */
/* Largest block a normal segment holds in a span: half its slices, less
 * one. A bigger block could never share its segment with another one like
 * it: it is a huge block instead, a segment of its own. */
#define CORAL_LARGE_MAX_SIZE ((CORAL_SLICES_PER_SEGMENT / 2 - 1) * CORAL_SLICE_SIZE)
/* The largest block (with the secure build's canary) a size class serves;
 * bigger ones are large blocks. The secure build serves blocks of more than
 * 256 KiB (a request of 256 KiB and up) as large blocks: a span each, on
 * OS page boundaries, which its free makes inaccessible while it waits in
 * the heap's quarantine (heap/heap.c, "the quarantine of large blocks"). A
 * block of a size class shares its first and last OS page with its
 * neighbours, so it could not be protected whole. */
#define CORAL_CLASS_SERVED_MAX (CORAL_SECURE ? (size_t)256 * 1024 : CORAL_CLASS_MAX_SIZE)

CORAL_INLINE unsigned coral_size_class(size_t size) {
    if (size <= 128) return size <= 16 ? 1u : (unsigned)((size + 15) >> 4);
    size_t s = size - 1;
    unsigned bit = 63u - (unsigned)__builtin_clzl(s); /* >= 7 */
    unsigned group = bit - 7u;
    /* (secure build) 2^bit < size <= 2^bit + 16, i.e. 2^bit <= s < 2^bit + 16:
     * the class above 2^bit. */
    if (CORAL_CLASS_EXTRA && group != 0 && ((s - 16) >> bit) == 0)
        return 8u + group * CORAL_CLASS_PER_GROUP;
    return 9u + group * CORAL_CLASS_PER_GROUP + (unsigned)((s >> (bit - 3u)) & 7u);
}

/* The twin of a skewed class, and back. */
CORAL_INLINE unsigned coral_class_twin(unsigned cls) {
    return cls - CORAL_CLASS_SKEWED_FIRST + CORAL_CLASS_COUNT;
}
CORAL_INLINE unsigned coral_class_untwinned(unsigned cls) {
    return cls >= CORAL_CLASS_COUNT ? cls - CORAL_CLASS_COUNT + CORAL_CLASS_SKEWED_FIRST : cls;
}
CORAL_INLINE bool coral_class_is_skewed(unsigned cls) {
    return cls >= CORAL_CLASS_SKEWED_FIRST && cls <= CORAL_CLASS_SKEWED_LAST;
}

/* The largest request of class cls: what coral_size_class maps to it (a
 * twin: its skewed class). */
CORAL_INLINE size_t coral_class_nominal_size(unsigned cls) {
    cls = coral_class_untwinned(cls);
    if (cls <= CORAL_CLASS_SMALL_LAST) return (size_t)cls * 16;
    unsigned group = (cls - 9u) / CORAL_CLASS_PER_GROUP, step = (cls - 9u) % CORAL_CLASS_PER_GROUP;
    if (step == 8u) return ((size_t)1 << (group + 8u)) + 16; /* the next group's extra class */
    return (size_t)(9u + step) << (group + 4u);
}

/* ---- the skew ----------------------------------------------------------------------
 * Classes from 8 KiB to 64 KiB are multiples of 1 KiB, so the blocks of a
 * page, laid out back to back, would start at most 4 distinct offsets
 * modulo 4 KiB: every block head (and every word at the same offset in
 * each 4 KiB of a block) would fall in the same few sets of an L1 cache
 * indexed by address bits 6-11. A program that touches the start of many
 * such blocks, or a word in each of their OS pages, would evict its own
 * lines from an 8-way L1 after 8 blocks. So these classes are CORAL_CLASS_SKEW
 * bytes (two 64-byte lines) longer than their nominal size: a block of
 * 16k + 2 lines puts the heads of 32 consecutive blocks in 32 distinct
 * sets. A skewed class is a multiple of 128 still, so of every alignment
 * up to 128 (aligned allocation relies on it: alloc.c); a request aligned
 * to more takes the class's twin, whose blocks have the nominal size.
 * Smaller classes are touched whole as a rule; a larger one would lose
 * a block of its 8 a page to the skew, or from 128 KiB, where a page holds
 * one block (heap.c, class_page_slices), take a slice more (128 KiB and 2
 * lines: 3 slices). */
#define CORAL_CLASS_SKEW ((size_t)128)

/* The size of the blocks of class cls: its nominal size, and the skew. */
CORAL_INLINE size_t coral_class_size(unsigned cls) {
    return coral_class_nominal_size(cls) + (coral_class_is_skewed(cls) ? CORAL_CLASS_SKEW : 0);
}

/* ---- page flags ----------------------------------------------------------------
 * The flags of the slice descriptor (coral_slice_flags, segment.h), beside
 * the segment layer's INTERIOR and FREED. Any bit set makes the free fast
 * path step aside; other threads read them too. */
#define CORAL_PAGE_IN_FULL 1u     /* in the heap's full queue */
#define CORAL_PAGE_HAS_ALIGNED 2u /* may hold pointers inside blocks */
/* holds a block the api layer's profiler sampled (api/profile.h): its free
 * leaves the fast path, and the profiler forgets the block there. Set and
 * cleared by the segment's owner; kept when the page is abandoned. */
#define CORAL_PAGE_SAMPLED 32u
/* ---- the remote-free word ---------------------------------------------------------
 * page->thread_free packs, from the low bits up (page.c has the protocol):
 *   bits 0-1   the delay state;
 *   bit 2      RECLAIMED: every block of the page was remote-freed and the
 *              purger took them all (reclaim.c); the owner resets the page;
 *   bit 3      BUSY: the purger is returning the page's memory right now;
 *   bits 4-47  the list of remote-freed blocks (16-aligned pointers);
 *   bits 48-59 how many blocks the list holds (a page has at most 4095:
 *              CORAL_PAGE_MAX_BLOCKS);
 *   bit 60     ASIDE: the page, behind the first of its class queue, is
 *              one the purger may claim once no block of it is live, with
 *              no call from its owner (page.c, "Aside pages"): set and
 *              cleared by the owner, kept by pushes;
 *   bit 61     LISTED: the page, parked once by its owner, is on the
 *              orphan list (page.c, "Parked pages"): set with the listing,
 *              kept by the owner's takes and by pushes, cleared by whoever
 *              unlists it, under the orphan lock;
 *   bit 62     RENEWED: the owner parked the page, or set it aside, again
 *              while it was still listed: the purger's next look renews
 *              its time instead of claiming it; kept by pushes, cleared by
 *              the purger and by the owner's take back;
 *   bit 63     SUSPECT: a block of the list may be on it twice, so the
 *              owner walks the list when it takes it (page.c, "Remote
 *              marks"). */
#define CORAL_DELAY_NONE 0u    /* remote frees push on thread_free */
#define CORAL_DELAY_USE 1u     /* the next remote free tells the owner (delayed_pages) */
#define CORAL_DELAY_FREEING 2u /* a remote thread is telling the owner now */
#define CORAL_DELAY_NEVER 3u   /* page is abandoned: never tell the owner */
#define CORAL_DELAY_MASK ((uintptr_t)3)
#define CORAL_TF_RECLAIMED ((uintptr_t)4)
#define CORAL_TF_BUSY ((uintptr_t)8)
#define CORAL_TF_COUNT_SHIFT 48
#define CORAL_TF_LIST_MASK ((((uintptr_t)1) << CORAL_TF_COUNT_SHIFT) - 16)
#define CORAL_TF_COUNT_MASK ((uintptr_t)0xfff)
/* The most blocks a page holds: what the count can say (a slice of 16-byte
 * blocks would fit 4096, and gives up its last). */
#define CORAL_PAGE_MAX_BLOCKS 4095u
#define CORAL_TF_ASIDE ((uintptr_t)1 << 60)
#define CORAL_TF_LISTED ((uintptr_t)1 << 61)
#define CORAL_TF_RENEWED ((uintptr_t)1 << 62)
#define CORAL_TF_SUSPECT ((uintptr_t)1 << 63)
/* What a take of the list keeps of the word: the delay state and LISTED. */
#define CORAL_TF_KEPT (CORAL_DELAY_MASK | CORAL_TF_LISTED)
/* (Never in the word: what coral_page_free_remote_quick tells the full
 * path when it wrote a block's freed mark already.) */
#define CORAL_TF_MARKED ((uintptr_t)1)

CORAL_INLINE coral_block_t *coral_tf_list(uintptr_t tf) {
    return (coral_block_t *)(tf & CORAL_TF_LIST_MASK);
}
CORAL_INLINE uint32_t coral_tf_count(uintptr_t tf) {
    return (uint32_t)((tf >> CORAL_TF_COUNT_SHIFT) & CORAL_TF_COUNT_MASK);
}

/* The word after a push whose first block is head, onto a list tf (its
 * tail linked to tf's list): count blocks, tf's SUSPECT, LISTED, ASIDE and
 * RENEWED kept and the push's SUSPECT added, delay state `state`;
 * RECLAIMED and BUSY clear (set only on words no push may change). RENEWED
 * must stay: on an aside page it is what makes a claim from a word read
 * before the owner took the page back fail, and a push may bring the list
 * and count back to the ones read (page.c, "Aside pages";
 * window_aside_reaside_pushed). (A parked page, its other holder, takes no
 * push: its count is `reserved`.) */
CORAL_INLINE uintptr_t coral_tf_pushed(uintptr_t tf, const coral_block_t *head, uint32_t count,
                                       uintptr_t suspect, uintptr_t state) {
    return (uintptr_t)head | ((uintptr_t)count << CORAL_TF_COUNT_SHIFT) |
           (tf & (CORAL_TF_SUSPECT | CORAL_TF_LISTED | CORAL_TF_ASIDE | CORAL_TF_RENEWED)) |
           suspect | state;
}

/* ---- block starts and freed marks (the default build; page.c has the protocol) ----
 * Block starts: whether an offset n from a page's start is the start of a
 * block carved so far, with no division: (n * M) mod 2^64 < X, M the
 * page's multiplier (owner_start_mul) and X the product of the carved
 * blocks (owner_carved_x). M = ceil(2^64 / d) + j for blocks of d bytes,
 * 1 <= j <= 2^16 drawn from a per-process secret at each page init and
 * reset; e = d * M - 2^64 = e0 + j * d, above 0 and at most 2^17 * d. The product of
 * n = k * d + r is k * e + r * M (mod 2^64): for r = 0 it grows with k,
 * so it is below X = capacity * e exactly for the carved blocks; for
 * 0 < r < d it is at least M (2^42 and more, d being at most 4 MiB) and
 * never wraps ((reserved + 1) * e < 2^40 < M), so above X. Checked for
 * every class, large size and span by tests/test_block_starts.c
 * (ctest block_starts). A page whose blocks are larger than a slice has
 * X = 0 (coral_page_set_capacity): its first block, the only one in its
 * head slice, is freed through the slow path, which applies the rule that
 * retires such a page when it empties (coral_heap_retire_when_empty); the
 * fast path then asks only whether the page heads its queue.
 *
 * Freed marks: every block the program frees gets CORAL_FREED_MARK in its
 * second word; malloc clears the word when it hands the block out. So a
 * free that finds the mark may be a double free, however many frees came
 * between: the owner then checks the page's lists
 * (coral_page_holds_free: bounded by the page's blocks) and reports only a
 * block it finds there, so the program's own data never causes a false
 * report, only a walk. The mark is a constant, an immediate in the free
 * fast path's compare and store (no load): being secret would buy nothing
 * but protection against a program that plants it to make its frees walk;
 * a mark left in a span's memory by an earlier page is harmless, as a
 * live block never holds it (malloc cleared it) and a never-handed-out
 * block fails the start test, or, carved, is on the free list with the
 * carve's mark (CORAL_CARVED_MARK, below), which free finds as it finds
 * the freed mark: its free is a double free (misuse
 * free-never-handed-out-small; without the carve's mark the block was
 * pushed again and the free list looped through it). Another thread writes the mark too (a
 * plain load and store: of two frees of a block one sees the other's mark
 * unless they run at the same instant) and, when the word held it already,
 * pushes with SUSPECT: the owner then checks the list it takes against its
 * own lists. The secure build has its own freed mark at the block's end
 * (secure.c); a CORAL_VALGRIND build keeps freed blocks inaccessible and
 * walks every list (SUSPECT always). */
#define CORAL_FREED_MARKS (!CORAL_SECURE && !CORAL_VALGRIND)
/* Sign-extended from 32 bits (an immediate operand), with the high half
 * all ones: no pointer, no small number, not zero. */
#define CORAL_FREED_MARK ((uint64_t)0xffffffffc0a1fdeeull)
/* What the carve writes in word 1 of every block it links (page.c): the
 * freed mark's low half, the high half zero. The tests for a mark compare
 * the low half only (one 32-bit compare with an immediate, as before), so
 * a free of a carved block never handed out finds a mark and is checked
 * against the page's lists (a double free: the block is on `free`); the
 * high half tells the two apart where it matters, in calloc's test of a
 * list of carved blocks (coral_block_is_zero): a carved block of a fresh
 * span is zero but its link and this mark, a block freed onto that list
 * is not. */
#define CORAL_CARVED_MARK ((uint64_t)0x00000000c0a1fdeeull)
/* A block another thread freed and holds in a run of its own, not yet
 * pushed (api/remote_run.h): the push checks it is still there and writes
 * the freed mark. Of the same form as the freed mark, its low half another
 * (every test for a mark compares the low halves). */
#define CORAL_PENDING_MARK ((uint64_t)0xffffffffc0a1fdedull)
/* The default and valgrind builds check every block start on the free fast
 * path (below); the secure build checks its canary there instead. */
#define CORAL_START_CHECK (!CORAL_SECURE)

CORAL_INLINE uintptr_t *coral_block_mark_word(coral_block_t *block) {
    return (uintptr_t *)(void *)block + 1; /* every block has 16 bytes at least */
}

/* M for blocks of d bytes and the page's draw j, 1 <= j <= 2^16 (e is
 * then never 0, as j = 0 would make it for a power of two). */
CORAL_INLINE uint64_t coral_block_start_mul_of(size_t d, uint32_t j) {
    return UINT64_MAX / d + 1 + j;
}

/* The page's M from the line any thread reads (page init wrote block_size
 * and epoch: j is epoch's low 16 bits). A large page whose block grew or
 * shrank in place gives another value than owner_start_mul: its owner
 * never uses this one. */
CORAL_INLINE uint64_t coral_page_start_mul(const coral_page_t *page) {
    return coral_block_start_mul_of(page->block_size, (page->epoch & 0xffffu) + 1);
}

/* X for the first n blocks of the page (owner); 0, for the free fast
 * path, for blocks larger than a slice (above). */
CORAL_INLINE uint64_t coral_page_carved_x(const coral_page_t *page, uint32_t n) {
#if CORAL_SECURE
    (void)page;
    (void)n;
    return 0;
#else
    if (page->block_size > CORAL_SLICE_SIZE) return 0;
    return (uint64_t)n * ((uint64_t)page->block_size * page->owner_start_mul);
#endif
}

/* Owner: the page has n blocks carved (X follows). */
CORAL_INLINE void coral_page_set_capacity(coral_page_t *page, uint32_t n) {
    page->capacity = n;
    if (!CORAL_SECURE) page->owner_carved_x = coral_page_carved_x(page, n);
}

CORAL_INLINE bool coral_block_start_test(uint64_t mul, uint64_t x_bound, size_t offset) {
    return (uint64_t)offset * mul < x_bound;
}

/* The free fast path's test of p, in the head slice of `slice`'s page
 * (whose first block starts at the slice): one multiply and one compare
 * (the owner's line only). */
CORAL_INLINE bool coral_block_start_fast(const coral_page_t *slice, const void *p) {
    if (!CORAL_START_CHECK) return true;
    return coral_block_start_test(slice->owner_start_mul, slice->owner_carved_x,
                                  (uintptr_t)p & (CORAL_SLICE_SIZE - 1));
}

/* Block freed (its mark written: word 1). */
CORAL_INLINE void coral_freed_mark_set(coral_block_t *block) {
    if (CORAL_FREED_MARKS) *coral_block_mark_word(block) = CORAL_FREED_MARK;
}

/* The low half of a block's word 1 (memcpy: a 32-bit load however the
 * word was written). */
CORAL_INLINE uint32_t coral_block_mark_low(const coral_block_t *block) {
    uint32_t low;
    memcpy(&low, (const uint8_t *)(const void *)block + sizeof(uint64_t), sizeof low);
    return low;
}

/* Is `low`, the low half of a mark word, the freed mark's or the carve's
 * (they share it: CORAL_CARVED_MARK)? Every test for a mark asks this. */
CORAL_INLINE bool coral_mark_low_freed(uint32_t low) { return low == (uint32_t)CORAL_FREED_MARK; }

/* Does block hold the freed mark, or the carve's (CORAL_CARVED_MARK)? */
CORAL_INLINE bool coral_freed_mark_seen(const coral_block_t *block) {
    return CORAL_FREED_MARKS && coral_mark_low_freed(coral_block_mark_low(block));
}

/* A block handed out: its mark cleared. */
CORAL_INLINE void coral_freed_mark_clear(coral_block_t *block) {
    if (CORAL_FREED_MARKS) *coral_block_mark_word(block) = 0;
}

/* Any thread but the owner, about to push block: the mark written;
 * SUSPECT when it was there already (a double free, or the program's data:
 * the owner tells them apart). The caller read thread_free (acquire)
 * before, and its push sets SUSPECT too when that word changed since: so
 * of two threads freeing one block at the same instant, both reading no
 * mark, the second to push flags its list (page.c, "Freed marks"). A
 * plain load and store, not an atomic exchange: an exchange is a locked
 * instruction (a full barrier on x86) on every remote free, dear where
 * many cores free remotely at once. */
CORAL_INLINE uintptr_t coral_remote_mark_write(coral_block_t *block) {
    if (!CORAL_FREED_MARKS) return CORAL_VALGRIND ? CORAL_TF_SUSPECT : 0;
    uint32_t old = coral_block_mark_low(block);
    coral_test_point(CORAL_TP_REMOTE_MARK_READ, block);
    *coral_block_mark_word(block) = CORAL_FREED_MARK;
    return coral_mark_low_freed(old) ? CORAL_TF_SUSPECT : 0;
}

/* The page layer's view of a page's owner: where remote freers post the
 * owner's full pages that have free blocks again (linked through
 * page->delayed_next). Many threads push (CAS), the owner takes the whole
 * list (exchange): a push-only stack, so no ABA. */
typedef struct coral_page_owner_s {
    _Atomic(coral_page_t *) delayed_pages;
} coral_page_owner_t;

/* A page with no free block, ever: what an empty direct[] entry names. */
extern coral_page_t coral_page_empty;

/* ---- pages (page.c) --------------------------------------------------------------- */

/* A new span (slices and start set by the segment layer) as a page of
 * class cls (or CORAL_CLASS_LARGE), blocks of block_size, owned by owner. */
void coral_page_init(coral_page_t *page, coral_page_owner_t *owner, bool user_heap, unsigned cls,
                     size_t block_size);
/* Carve the next step of blocks onto the (empty) free list; with
 * to_os_page_end, no block that starts past the OS page of the first. */
void coral_page_extend(coral_page_t *page, bool to_os_page_end);
/* A carve step links this many blocks of sizes 256 B-1 KiB, fewer above,
 * more below. So a page with this many carved needs no top-up: above
 * 256 bytes a step is at most this many, and up to 256 bytes the first
 * carve (an OS page) is a whole step. */
#define CORAL_CARVE_MIN_BLOCKS 16u
void coral_page_top_up_first_carve(coral_page_t *page);
/* Owner: every block is free (used == 0): carve again from the first. */
void coral_page_reset_empty(coral_page_t *page);
/* Owner: park an empty page the malloc fast path cannot reach (one that is
 * not first in its class queue): its free blocks, as they are (the chain
 * of free and local_free, nothing carved again), are given to thread_free
 * at once as a list counted as `reserved` blocks, and the page is listed
 * as an orphan unless it still is (LISTED), so the purger may return its
 * memory once it stayed parked for the purge delay, with no call from the
 * owner. The owner takes it back as it takes any page's remote frees
 * (coral_page_collect): its chain becomes local_free. page.c has the
 * protocol ("Parked pages"). Returns false, the page left as it was, when
 * a block was pushed on its thread_free (a double free, reported when the
 * owner takes it). */
bool coral_page_park(coral_page_t *page);
/* Owner: set aside a page of a class queue that is not first in it (no
 * fast path pops from it): the purger may claim it, with no call from the
 * owner, once none of its blocks is live (page.c, "Aside pages"). Not a
 * parked page (it is the purger's already). */
void coral_page_set_aside(coral_page_t *page);
/* Owner: take back a page set aside, before anything but the free of a
 * live block touches it. A page the purger claimed meanwhile comes back
 * empty, uncarved, its memory zero. The page layer's entry points that
 * park, release or walk a page do it themselves; coral_page_collect and
 * coral_page_take_remote do not (the heap layer collects the first page
 * of a queue, taken back when it became first, and calls this before it
 * collects any other). */
void coral_page_unaside_slow(coral_page_t *page);
CORAL_INLINE void coral_page_unaside(coral_page_t *page) {
    if (coral_unlikely(page->is_aside)) coral_page_unaside_slow(page);
}
/* Owner: the page is set aside (coral_page_set_aside). */
CORAL_INLINE bool coral_page_is_aside(const coral_page_t *page) { return page->is_aside != 0; }
/* Owner: a page it parked before is still listed (LISTED): parking it
 * again takes one CAS, no lock, nothing new to purge. */
CORAL_INLINE bool coral_page_is_listed(const coral_page_t *page) {
    return atomic_load_explicit(&page->thread_free, memory_order_relaxed) & CORAL_TF_LISTED;
}
/* Owner: the page is parked, or was and the purger took it (the owner has
 * not taken it back yet). */
CORAL_INLINE bool coral_page_is_parked(const coral_page_t *page) { return page->is_parked != 0; }
/* Owner: a free block on the free list if the page has one on its own
 * lists, walking none: an empty free list takes local_free, or else the
 * remote-freed blocks. page->used still counts remote-freed blocks not
 * taken (coral_page_all_free counts them). */
void coral_page_collect(coral_page_t *page);
/* Owner: take the remote-freed blocks, if any, onto local_free: page->used
 * then counts exactly the blocks in use. */
void coral_page_take_remote(coral_page_t *page);
/* Owner: every block is free, on the page's lists or remote-freed and not
 * yet taken (a double free can make it say so early: take the remote
 * blocks, which checks them, before releasing the page). */
bool coral_page_all_free(const coral_page_t *page);
/* Any thread but the owner: push the chain head..tail of n blocks. */
void coral_page_push_remote(coral_page_t *page, coral_block_t *head, coral_block_t *tail,
                            uint32_t n);
/* The same for one block whose freed mark a remote freer wrote
 * already (coral_page_free_remote_quick), SUSPECT as it found. */
void coral_page_push_remote_marked(coral_page_t *page, coral_block_t *block, uintptr_t suspect);
/* A run of n blocks of page, head to tail, that one thread freed, each with
 * its freed mark written and each block once (the freer checked: api/
 * remote_run.h), SUSPECT if the page's word is no longer `seen`, what the
 * freer read (acquire) before it read the first block's mark. */
void coral_page_push_remote_run(coral_page_t *page, coral_block_t *head, coral_block_t *tail,
                                uint32_t n, uintptr_t seen);
/* Owner: whether block, which holds the page's freed mark, is on one of
 * the page's free lists (a double free), the remote-freed blocks taken
 * first. Bounded by the page's blocks. */
bool coral_page_holds_free(coral_page_t *page, const coral_block_t *block);
/* The block a free of p (a pointer into the page) gives back: the block p
 * points into when the page holds aligned blocks, else p, which must be a
 * block's start. NULL, the misuse reported, for a page not in use or a
 * pointer inside a block. Any thread (it reads what page init wrote). */
coral_block_t *coral_page_freed_block(const coral_page_t *page, void *p);
/* A free of block p (a pointer into a page of a normal segment) by a thread
 * that does not own it. */
void coral_page_free_remote(coral_page_t *page, void *p);
/* Owner: set the delay state; NEVER is kept unless override_never. */
void coral_page_set_delay(coral_page_t *page, uintptr_t state, bool override_never);
/* Owner: a page leaves the full queue for a place behind the first of its
 * class queue: delay state NONE and set aside (coral_page_set_aside) in
 * one CAS. */
void coral_page_unfull_aside(coral_page_t *page);
/* Is a remote freer telling the owner about this page, or has it told it?
 * Such a page must not be released before the owner takes the notice. */
bool coral_page_notice_pending(coral_page_t *page);
/* Owner, in a fork's child: the page's state FREEING (its word read as
 * tf), left by a parent thread the child does not have, set back to NONE
 * with a CAS, as threads of the child (those a program's child handler
 * started) may push on thread_free meanwhile (fork_early_child_freeing_push:
 * a store of the word read lost their push). Returns the word after. */
uintptr_t coral_page_freeing_reset(coral_page_t *page, uintptr_t tf);
/* Until the purger has returned a claimed page's memory. */
void coral_page_wait_not_busy(coral_page_t *page);
/* Owner: a page taken off delayed_pages was pushed there by a remote freer
 * that may still be in state FREEING: wait until it has left it, so that
 * coral_page_notice_pending tells only of notices still to come. */
void coral_page_wait_notice_done(coral_page_t *page);
/* A free of p that is a misuse: "free(): invalid pointer p (why)"
 * (coral_misuse: the caller then leaves p alone). */
CORAL_COLD void coral_page_invalid_free(const void *p, const char *why);
/* The start of the block that p points into. */
uint8_t *coral_page_block_start(const coral_page_t *page, const void *p);
/* Where a large page's one block starts, the pointer its free must be
 * given: start, or past it for an alignment above a slice. */
CORAL_INLINE uint8_t *coral_page_large_block(const coral_page_t *page) {
    return page->start + (size_t)page->aligned_slices * CORAL_SLICE_SIZE;
}
/* Owner: give the page's span back to its segment (orphan listing, a purge
 * in progress and the populate policy's measure settled first). */
void coral_page_release_span(coral_page_t *page);
/* The bytes a page's span holds in whole blocks of block_size. */
size_t coral_page_blocks_bytes(const coral_page_t *page, size_t block_size);

/* ---- free-list links ---------------------------------------------------------------
 * Every link of a block list (free, local_free, and the chains on
 * thread_free) is read and written through these two, never as
 * block->next. In the secure build a link is stored encoded with the
 * process's secret key and the block's own address, and a decoded link
 * must stay in the block's segment and be 16-aligned: a link an overflow
 * or a write after free changed is found when the list is followed
 * (coral_fatal), not followed into memory of the attacker's choice. */
#if CORAL_SECURE
/* The keys are hidden (the library's own): the fast paths read them
 * directly, not through the GOT (-fvisibility=hidden covers definitions,
 * not extern declarations). */
extern __attribute__((visibility("hidden"))) uintptr_t coral_list_key;
CORAL_COLD __attribute__((noreturn)) void coral_bad_link(const coral_block_t *block,
                                                         uintptr_t next);
#endif

CORAL_INLINE coral_block_t *coral_block_next(const coral_block_t *block) {
#if CORAL_VALGRIND
    VALGRIND_MAKE_MEM_DEFINED(block, sizeof *block); /* a free block: inaccessible */
    coral_block_t *next = block->next;
    VALGRIND_MAKE_MEM_NOACCESS(block, sizeof *block);
    return next;
#elif CORAL_SECURE
    /* d = next ^ block: in the block's segment and 16-aligned, next leaves
     * only bits 4-21 of d set; a NULL link makes d the block itself. */
    uintptr_t d = (uintptr_t)block->next ^ coral_list_key;
    const uintptr_t outside = ~(uintptr_t)(CORAL_SEGMENT_MASK & ~(CORAL_ALIGNMENT - 1));
    if (coral_unlikely((d & outside) != 0) && d != (uintptr_t)block)
        coral_bad_link(block, d ^ (uintptr_t)block);
    return (coral_block_t *)(d ^ (uintptr_t)block);
#else
    return block->next;
#endif
}

CORAL_INLINE void coral_block_set_next(coral_block_t *block, coral_block_t *next) {
#if CORAL_VALGRIND
    VALGRIND_MAKE_MEM_UNDEFINED(block, sizeof *block);
    block->next = next;
    VALGRIND_MAKE_MEM_NOACCESS(block, sizeof *block);
#elif CORAL_SECURE
    block->next = (coral_block_t *)((uintptr_t)next ^ coral_list_key ^ (uintptr_t)block);
#else
    block->next = next;
#endif
}

/* The first block of the page whose head descriptor is `page` (a page of
 * a normal segment), from the descriptor's address: no load. */
CORAL_INLINE uint8_t *coral_page_start_of(const coral_page_t *page) {
    coral_segment_t *seg = coral_ptr_segment(page);
    return coral_segment_base(seg) + (size_t)(page - seg->pages) * CORAL_SLICE_SIZE;
}

/* Owner: a block it freed, pushed on `free`, where the next malloc of its
 * class takes it again (page.c says why). The caller counts it out of
 * `used`. A list marked zero stays so: free_is_zero says that every block
 * on `free` with the carve's mark is zero but its link and that mark
 * (coral_block_is_zero), and this one has the freed mark. (Without freed marks, the CORAL_VALGRIND
 * build, the list is no longer zero; the secure build never marks a list
 * zero: its carved blocks hold their fill and freed mark, page.c.) */
CORAL_INLINE void coral_page_push_free(coral_page_t *page, coral_block_t *block) {
    coral_freed_mark_set(block);
    coral_block_set_next(block, page->free);
    page->free = block;
    if (!CORAL_SECURE && !CORAL_FREED_MARKS) page->free_is_zero = 0;
}

/* Owner: whether block, just popped off page's `free` (its freed mark not
 * cleared yet), is zero but its link. */
CORAL_INLINE bool coral_block_is_zero(const coral_page_t *page, coral_block_t *block) {
    return page->free_is_zero &&
           (!CORAL_FREED_MARKS || *coral_block_mark_word(block) == CORAL_CARVED_MARK);
}

/* Owner: whether block heads one of the page's owner lists, i.e. it is
 * the block freed last (by free, on `free`; by a bulk free, on
 * local_free), being freed again: the secure build's O(1) double-free
 * test of the slow path (the default build has the freed mark). */
CORAL_INLINE bool coral_page_freed_last(const coral_page_t *page, const coral_block_t *block) {
    return block == page->free || block == page->local_free;
}

/* Whether p (in page's span) is the start of one of its blocks: a
 * multiple of the block size from the start, before the end of the last
 * block. Any thread (it reads what page init wrote, on the line remote
 * frees read): one division. */
CORAL_INLINE bool coral_page_is_block_start(const coral_page_t *page, const void *p) {
    size_t offset = (size_t)((const uint8_t *)p - page->start);
    if (page->class_idx == CORAL_CLASS_LARGE) return offset == 0;
    return offset < (size_t)page->reserved * page->block_size && offset % page->block_size == 0;
}

/* Whether a push of one block p onto the remote-free word tf of page may
 * take the quick way: no purge or reclaim under way, a push that neither
 * tells the owner (state USE), nor lists an aside page (ASIDE without
 * LISTED), nor frees the page's last block (the orphan lock), and p not
 * the block pushed last. */
CORAL_INLINE bool coral_tf_quick_push_ok(const coral_page_t *page, uintptr_t tf, const void *p) {
    return !((tf & (CORAL_TF_RECLAIMED | CORAL_TF_BUSY)) != 0 ||
             (tf & (CORAL_TF_ASIDE | CORAL_TF_LISTED)) == CORAL_TF_ASIDE ||
             (tf & CORAL_DELAY_MASK) == CORAL_DELAY_USE ||
             coral_tf_count(tf) + 1 >= page->reserved ||
             coral_tf_list(tf) == (const coral_block_t *)p);
}

/* The quick push of block on tf (coral_tf_quick_push_ok said so): one CAS
 * attempt, false when another push came first. */
CORAL_INLINE bool coral_tf_quick_push(coral_page_t *page, uintptr_t tf, coral_block_t *block,
                                      uintptr_t suspect) {
    coral_block_set_next(block, coral_tf_list(tf));
    uintptr_t next =
        coral_tf_pushed(tf, block, coral_tf_count(tf) + 1, suspect, tf & CORAL_DELAY_MASK);
    return coral_likely(atomic_compare_exchange_strong_explicit(
        &page->thread_free, &tf, next, memory_order_release, memory_order_relaxed));
}

/* The common case of coral_page_free_remote, inline: a block of a size
 * class (no aligned blocks in the page) whose push neither tells the owner
 * (state USE) nor frees the page's last block (the orphan lock). One CAS
 * attempt, with the same checks as the full path (a page in use, p a block
 * start, no purge or reclaim under way, a count within the page, not the
 * block pushed last); false, with nothing done, sends the free down the
 * full path, which reports a misuse. The freed mark is written once,
 * before the attempt, and stays if the attempt fails: the full path is
 * told what it found (*suspect), and SUSPECT, as the word changed since
 * it was read (page.c, "Freed marks"). */
CORAL_INLINE bool coral_page_free_remote_quick(coral_page_t *page, void *p, uintptr_t *suspect) {
    *suspect = 0;
    if (coral_unlikely(page->slice_count == 0 || page->class_idx == CORAL_CLASS_LARGE ||
                       (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) ||
                       !coral_page_is_block_start(page, p)))
        return false;
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    if (coral_unlikely(!coral_tf_quick_push_ok(page, tf, p))) return false;
    coral_block_t *block = p;
    *suspect = coral_remote_mark_write(block) | CORAL_TF_MARKED;
    if (coral_likely(coral_tf_quick_push(page, tf, block, *suspect & CORAL_TF_SUSPECT)))
        return true;
    /* The word changed since it was read, before the mark (page.c, "Freed
     * marks"): another free of this block may have read no mark either. */
    *suspect |= CORAL_TF_SUSPECT;
    return false;
}

/* The secure build's push of p, a block start of page (a size class, no
 * aligned block: its checks passed, the block-start test among them), by a thread that does not own
 * it: the quick push when it may, else the full one (which checks the count and the page's state).
 * The secure build has no remote freed mark to write (its mark, in the block, was written by the
 * check). */
CORAL_INLINE void coral_page_free_remote_checked(coral_page_t *page, void *p) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    if (coral_likely(coral_tf_quick_push_ok(page, tf, p)) &&
        coral_tf_quick_push(page, tf, (coral_block_t *)p, 0))
        return;
    coral_page_push_remote_marked(page, (coral_block_t *)p, 0);
}

/* ---- the secure build (secure.c) ----------------------------------------------------
 * What CORAL_SECURE adds to every block, and the checks it makes:
 *   - the last 8 bytes of every block of a size class and of every large
 *     block are not the program's: while the block is live they hold its
 *     canary with its slack folded in, and the byte at the request's end
 *     the canary's byte 0 (the request canary, below; malloc_usable_size
 *     says the request), once it is freed its freed mark, both keyed by the
 *     secret key, the page's epoch (a random value drawn at every page init)
 *     and the block's address. A free finds the mark (a double free, however
 *     many frees came between) or anything but the canaries (an overflow
 *     past the request).
 *   - a freed block of a size class is filled with CORAL_FILL_BYTE past its
 *     link, up to the block's first CORAL_FILL_END bytes (or its mark);
 *     malloc finds a block whose fill changed (a write after free). A block
 *     carved onto a free list gets them too (page.c): every block on a free
 *     list looks freed, so malloc checks the fill of every block it takes
 *     without reading its mark.
 *   - large blocks end at a guard page (the OS page after their request and
 *     canary word: heap/large.c, secure_large_end),
 *     huge blocks too (the page after the block), normal segments with a
 *     guard slice (segment.h); a freed huge block is made inaccessible
 *     (or unmapped) at once (heap/large.c).
 *   - fresh blocks are linked in a random order, each drawn from the
 *     next CORAL_CARVE_WINDOW blocks in address order.
 *   - malloc(0) returns a slot of an inaccessible region.
 * None of it exists in the default build: the constants are 0 and the
 * calls fold away. */
#define CORAL_CANARY_SIZE (CORAL_SECURE ? (size_t)8 : 0)
#define CORAL_GUARD_SIZE (CORAL_SECURE ? CORAL_OS_PAGE_SIZE : 0)
#define CORAL_FILL_BYTE 0xdf
#define CORAL_FILL_WORD (0x0101010101010101ull * CORAL_FILL_BYTE)
/* The fill covers the words at offsets 8, 16 and 24: with the link, the
 * first 32 bytes of a block (a 32-byte block's last word is its mark; a
 * 16-byte block has no room for a fill). */
#define CORAL_FILL_END ((size_t)32)

/* The bytes asked of the plain allocator for a request of size bytes: room
 * for the canary (saturating: a size near SIZE_MAX still fails). */
CORAL_INLINE size_t coral_secure_inner_size(size_t size) {
    return size + CORAL_CANARY_SIZE < size ? SIZE_MAX : size + CORAL_CANARY_SIZE;
}

/* Called once at start-up, before any block is linked: the keys. */
void coral_secure_init(void);
/* A new page's epoch: a random value, part of its blocks' canaries and
 * freed marks, so that the marks a span's earlier pages left in its memory
 * never match a new page's blocks. */
uint32_t coral_secure_next_epoch(void);
/* Link n >= 1 fresh blocks of page from `first` in a random order in
 * front of `rest`: the head of the new list. Each gets the fill and freed
 * mark of a freed block as it is linked (so every block on a free list
 * looks freed, page.h above; and the first touch of a fresh block's last
 * word is a write, not the read of malloc's check: a read of an untouched
 * OS page maps the zero page, and the write after it faults a second
 * time). Each block is drawn
 * uniformly from the CORAL_CARVE_WINDOW lowest blocks not linked yet (so
 * log2 of it, 2 bits, of secret randomness per block while the window is
 * full), which keeps the order close to the address order (secure.c). */
#define CORAL_CARVE_WINDOW 4u
coral_block_t *coral_secure_carve(const coral_page_t *page, uint8_t *first, uint32_t n,
                                  coral_block_t *rest);
/* malloc(0) and every other zero-size request: a slot of an
 * inaccessible region, aligned to `alignment` (NULL when no such slot is
 * left, or alignment is above the region's 4 MiB: the caller then gives a
 * plain block); whether p is such a slot; free one (false when p is
 * none). */
void *coral_zero_slot_alloc(size_t alignment);
bool coral_is_zero_slot(const void *p);
bool coral_zero_slot_free(void *p);
/* The slow half of the checks below (secure.c): p is not a block start
 * (an aligned block, or a misuse), or its mark is not its canary. */
bool coral_secure_check_slow(coral_page_t *page, void *p, bool release);
/* Reports a block handed out of a page it is not in (a forged link), else
 * a write after free (fatal): never returns, though not declared so, so
 * that the malloc fast path can reach it by a tail call. */
CORAL_COLD void *coral_secure_write_after_free(const coral_page_t *page, const uint8_t *block);
/* A block leaving the ring of freed blocks (heap.h) whose ring fill
 * changed: reported (fatal), with the offset of the first byte written. */
CORAL_COLD void coral_secure_ring_write_after_free(const coral_page_t *page, const uint8_t *block);

#if CORAL_SECURE
/* Written once by coral_secure_init; read-only afterwards. Every byte of
 * the canary key is in 0x80..0xfe and even; the page key is a second
 * secret, from which a page's 32-bit epoch is spread over 64 bits. */
extern __attribute__((visibility("hidden"))) uint64_t coral_canary_key;
extern __attribute__((visibility("hidden"))) uint64_t coral_page_key;
#endif

/* A canary's bytes are all in 0x80..0xfe, even: never NUL, an ASCII
 * character or 0xff, so an overflow by one byte of a string (its NUL, a
 * character) or of those fills always changes it. The key's bytes are so;
 * what the page and the address change of it is bits 1-6 of each byte
 * (CORAL_CANARY_VARY), which keeps them so. */
#define CORAL_CANARY_HIGH 0x8080808080808080ull
#define CORAL_CANARY_EVEN 0xfefefefefefefefeull
#define CORAL_CANARY_VARY 0x7e7e7e7e7e7e7e7eull

/* A page's 64-bit key from its 32-bit epoch: a mix keyed by the secret
 * page key, so that every byte of a canary varies from page to page, and
 * one page's canaries (read by an over-read) tell nothing of another's:
 * its 48 varying bits are a fresh guess (tests/test_secure.c checks the
 * spread). */
CORAL_INLINE uint64_t coral_page_key_of(uint32_t epoch) {
#if CORAL_SECURE
    uint64_t z = ((uint64_t)epoch ^ coral_page_key) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    return z ^ (z >> 29);
#else
    return epoch;
#endif
}

/* The canary of the block at `block` of a page whose epoch is `epoch`. */
CORAL_INLINE uint64_t coral_canary_with(uint32_t epoch, const void *block) {
#if CORAL_SECURE
    return coral_canary_key ^ (((uintptr_t)block ^ coral_page_key_of(epoch)) & CORAL_CANARY_VARY);
#else
    (void)epoch;
    return (uintptr_t)block;
#endif
}

CORAL_INLINE uint64_t coral_canary_of(const coral_page_t *page, const void *block) {
    return coral_canary_with(page->epoch, block);
}

/* The same from the owner's line (segment.h): owner_canary is the canary
 * of address 0, and the mask distributes over the xor. */
CORAL_INLINE uint64_t coral_owner_canary_of(const coral_page_t *page, const void *block) {
    return page->owner_canary ^ ((uintptr_t)block & CORAL_CANARY_VARY);
}

/* A freed mark is the block's canary with all 48 bits that vary (bits 1-6
 * of each byte) flipped: no change of fewer than 48 bits (a bit flip, a
 * byte written) turns a freed block back into a live one, and its bytes
 * keep a canary's form (0x80..0xfe, even: no ASCII, NUL or fill byte). */
CORAL_INLINE uint64_t coral_freed_mark_of(uint64_t canary) { return canary ^ CORAL_CANARY_VARY; }

/* The request canary. A live block's canary word (at its usable size, the
 * end of the block) holds its canary with its slack, the usable bytes past
 * the program's request (usable - request), folded in three 6-bit fields:
 * bits 1-6 of its byte 0 (the slack's bits 0-5), of its byte 1 (bits
 * 6-11) and of its byte 2 (bits 12-17), so the word keeps a canary's form
 * and stays 30 bits from its freed mark. One byte is checked at the
 * request's end: the byte at
 * block + usable - slack holds the canary's byte 0 (with a slack of 0 that
 * is the word's byte 0, whose field is 0), so a write of the byte just
 * past the request is found at the block's free as a heap overflow (a
 * write of that byte's value is not: it is the canary's, random, never
 * ASCII or NUL; a write that skips the byte is found at the word only).
 * Every writer writes the slack itself (every block's usable size is
 * below CORAL_SLACK_MAX: the static assert): malloc's fast path (classes
 * up to 1 KiB, whose spacing is at most 64 bytes: a slack below 64) the
 * first field alone, with no `and`; the others (malloc's slow path,
 * page_pop, for every class; large blocks, whose slack is below an OS
 * page: heap/large.c; realloc within a block; an aligned block of a size
 * class, api/alloc.c) every field (coral_slack_code). The free fast path
 * (coral_secure_free_fast) decodes the first field alone and leaves a word
 * with another field set (a slack of 64 or more) to the checked path,
 * which decodes all three (coral_secure_free_fast_wide first: such a
 * block freed by its owner still goes to the ring). */
#define CORAL_SLACK_LOW 0x7eull      /* the field the fast paths use */
#define CORAL_SLACK_BITS 0x7e7e7eull /* the three fields */
#define CORAL_SLACK_MAX (((size_t)1 << 18) - 1)
/* (the largest block of a size class: CORAL_CLASS_SERVED_MAX bytes) */
_Static_assert(!CORAL_SECURE || CORAL_CLASS_SERVED_MAX - CORAL_CANARY_SIZE <= CORAL_SLACK_MAX,
               "a class block's slack fits the word");

/* The code of a slack (the three fields; a slack above CORAL_SLACK_MAX,
 * which no block has, would be cut to it). */
CORAL_INLINE uint64_t coral_slack_code(size_t slack) {
    uint64_t s = slack < CORAL_SLACK_MAX ? slack : CORAL_SLACK_MAX;
    return ((s & 0x3f) | ((s & 0xfc0) << 2) | ((s & 0x3f000) << 4)) << 1;
}

/* The slack of a code (the three fields; the bits outside them ignored). */
CORAL_INLINE size_t coral_slack_of(uint64_t code) {
    return (size_t)(((code >> 1) & 0x3f) | ((code >> 3) & 0xfc0) | ((code >> 5) & 0x3f000));
}

/* The canaries of a live block of `usable` bytes (its canary word at
 * block + usable) for a request of `request` bytes (at most usable): the
 * checked byte (above), then the word. */
CORAL_INLINE void coral_secure_canaries_out(uint8_t *block, size_t usable, size_t request,
                                            uint64_t canary) {
    uint64_t code = coral_slack_code(usable - request);
    block[usable - coral_slack_of(code)] = (uint8_t)canary;
    *(uint64_t *)(void *)(block + usable) = canary ^ code;
}

/* Whether `word`, the canary word of a block of `usable` bytes whose
 * canary is `canary`, is a live block's (its slack at most usable), and
 * the byte at its request's end the canary's (above). */
CORAL_INLINE bool coral_secure_canaries_intact(const uint8_t *block, size_t usable, uint64_t word,
                                               uint64_t canary) {
    uint64_t code = word ^ canary;
    size_t slack = (size_t)(code >> 1);
    if (coral_unlikely((code & ~CORAL_SLACK_LOW) != 0)) {
        /* (the second or third field set: a large block, a block realloc
         * kept, an aligned block; or not a live block's word) */
        if ((code & ~CORAL_SLACK_BITS) != 0) return false;
        slack = coral_slack_of(code);
    }
    return slack <= usable && block[usable - slack] == (uint8_t)canary;
}

/* The bytes of a live block the program may use (its request: above),
 * from its canary word (usable when the word's slack is out of bounds:
 * not a live block's word, which its free reports). */
CORAL_INLINE size_t coral_secure_request_of(size_t usable, uint64_t word, uint64_t canary) {
    size_t slack = coral_slack_of(word ^ canary);
    return slack <= usable ? usable - slack : usable;
}

/* The word after the usable bytes of the block at `block`. */
CORAL_INLINE uint64_t *coral_mark_word(const coral_page_t *page, void *block) {
    return (uint64_t *)(void *)((uint8_t *)block + page->block_size - CORAL_CANARY_SIZE);
}

/* The fill's three stores, and the three loads of malloc's check of it,
 * address words 1, 1 + k and 1 + 2k of a block, k = coral_fill_step: one
 * word above 16 bytes (words 1, 2 and 3), none in a 16-byte block (which
 * has no room for a fill: the three address its word 1, its mark's). So
 * neither has a branch on the block size: the sizes a program asks for
 * need follow no pattern a branch predictor could learn (glibc-thread's,
 * 4 bytes to 32 KiB at random, are 16-byte blocks one time in two: a
 * branch there mispredicted at every other malloc and free, 3x its time). */
CORAL_INLINE size_t coral_fill_step(size_t usable) { return (size_t)(usable > 8) * 8; }

/* The fill of a freed block of a size class, of `usable` bytes before its
 * canary's word (its block size less 8): three stores (in
 * a 32-byte block the third is the mark's word, in a 16-byte one all three
 * are: the mark, written after, takes it). */
CORAL_INLINE void coral_secure_fill_words(uint8_t *block, size_t usable) {
    uint8_t *w = block + 8;
    size_t k = coral_fill_step(usable);
    *(uint64_t *)(void *)w = CORAL_FILL_WORD;
    *(uint64_t *)(void *)(w + k) = CORAL_FILL_WORD;
    *(uint64_t *)(void *)(w + 2 * k) = CORAL_FILL_WORD;
}

CORAL_INLINE void coral_secure_fill(const coral_page_t *page, uint8_t *block) {
    coral_secure_fill_words(block, page->block_size - CORAL_CANARY_SIZE);
}

/* Whether a freed block of a size class (of `usable` bytes before its
 * canary's word, its canary `canary`) has its fill and, in a block of 32
 * bytes or less, its mark as coral_secure_mark_freed left them: words 1,
 * 2 and 3 hold the fill in a block above 32 bytes; words 1 and 2 the fill
 * and word 3 the mark in a 32-byte one; word 1 the mark in a 16-byte one
 * (read three times, coral_fill_step). What each word must hold is a select, not a branch
 * (above). The words read are the block's first 32 bytes. */
CORAL_INLINE bool coral_secure_fill_intact(size_t usable, const uint8_t *block, uint64_t canary) {
    const uint8_t *w = block + 8;
    size_t k = coral_fill_step(usable);
    uint64_t away = CORAL_FILL_WORD ^ coral_freed_mark_of(canary); /* fill to mark */
    uint64_t marked12 = (uint64_t)(k != 0) - 1;                    /* all ones: 16 bytes */
    uint64_t marked3 = (uint64_t)0 - (uint64_t)(usable <= CORAL_FILL_END - CORAL_CANARY_SIZE);
    uint64_t want12 = CORAL_FILL_WORD ^ (away & marked12);
    uint64_t want3 = CORAL_FILL_WORD ^ (away & marked3);
    return ((*(const uint64_t *)(const void *)w ^ want12) |
            (*(const uint64_t *)(const void *)(w + k) ^ want12) |
            (*(const uint64_t *)(const void *)(w + 2 * k) ^ want3)) == 0;
}

/* A block of page passed the checks of its free (its canary was `canary`):
 * a block of a size class gets its fill and its freed mark (a large
 * block's span is given back). */
CORAL_INLINE void coral_secure_mark_freed(const coral_page_t *page, uint8_t *block,
                                          uint64_t canary) {
    if (page->class_idx == CORAL_CLASS_LARGE) return;
    uint64_t *mark = coral_mark_word(page, block);
    coral_secure_fill(page, block);
    *mark = coral_freed_mark_of(canary);
}

/* The fill of a block waiting in the thread's ring of freed blocks (heap
 * layer, heap.h), which the ring's put writes in place of the three words
 * of coral_secure_fill_words: four 16-byte pieces (vectors: SSE2 or NEON)
 * at offsets its class's shape gives (coral_ring_shapes): 8, 24, 40 and 56
 * in a block of 72 usable bytes or more (its bytes 8 to 71); from 0 up to
 * its mark, overlapping, in one of 24 to 56 (a block in the ring is on no
 * list: its word 0, the link, is written as it leaves); all four at 0 in a
 * 16-byte block, whose 8 usable bytes lie before its mark's word: they
 * cover the mark, which the put writes again after them, and its check
 * compares their first 8 bytes alone (the shape's `want`). So the put and
 * the check of the block that leaves have no branch on the size
 * (coral_fill_step: the sizes a program frees follow no pattern a
 * predictor could learn), and a block in the ring holds the fill every
 * freed block holds (its bytes 8 to 31, or up to its mark) and more: a
 * write at any offset the pieces cover is found as it leaves the ring.
 * Its freed mark is written after them (coral_secure_free_fast gives it). */
#define CORAL_RING_FILL_END ((size_t)72)
typedef uint64_t coral_vec2_t __attribute__((vector_size(16)));

/* Where a ring fill's four pieces lie in a block (`at`: offsets); `want`:
 * the bytes of each piece the check compares (a bit each). */
typedef struct coral_ring_shape_s {
    uint8_t at[4];
    uint32_t want;
} coral_ring_shape_t;
/* The shape of each size class's blocks (the twins' too), by class index:
 * written by coral_secure_init (secure.c), before the first block;
 * read-only afterwards. A table, not arithmetic on the size: one load of
 * the page's class, which the free fast path's line holds already. */
extern coral_ring_shape_t coral_ring_shapes[CORAL_CLASS_LARGE];

CORAL_INLINE const coral_ring_shape_t *coral_ring_shape_of(const coral_page_t *page) {
    return &coral_ring_shapes[page->class_idx];
}

CORAL_INLINE coral_vec2_t coral_vec2_load(const uint8_t *at) {
    coral_vec2_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

/* The ring's fill vector: the fill byte 16 times. The fill's and the
 * check's functions take it as an argument, so that a put, which fills
 * and checks, loads it once. */
CORAL_INLINE coral_vec2_t coral_ring_fill_vec(void) {
    const coral_vec2_t fill = {CORAL_FILL_WORD, CORAL_FILL_WORD};
    return fill;
}

CORAL_INLINE void coral_ring_fill_at(uint8_t *at, coral_vec2_t fill) {
    memcpy(at, &fill, sizeof fill);
}

CORAL_INLINE size_t coral_ring_fill_end(size_t usable) {
    return usable < CORAL_RING_FILL_END ? usable : CORAL_RING_FILL_END;
}

/* The put's fill of block, of page (of a size class; `usable`: its
 * usable bytes): its four pieces, then its freed mark `freed` (after them:
 * a 16-byte block's pieces cover its mark's word). */
CORAL_INLINE void coral_secure_ring_fill(const coral_page_t *page, uint8_t *block, size_t usable,
                                         uint64_t freed, coral_vec2_t fill) {
    const coral_ring_shape_t *shape = coral_ring_shape_of(page);
    uint64_t *mark = (uint64_t *)(void *)(block + usable);
    coral_ring_fill_at(block + shape->at[0], fill);
    coral_ring_fill_at(block + shape->at[1], fill);
    coral_ring_fill_at(block + shape->at[2], fill);
    coral_ring_fill_at(block + shape->at[3], fill);
    *mark = freed;
}

/* Whether a block leaving the ring holds the ring's fill: the same
 * pieces, read, each compared with the fill byte by byte, the bytes its
 * shape wants alone; with SSE2 the compares' results are ANDed and their
 * bytes' top bits taken at once (pmovmskb), elsewhere the pieces' XORs
 * with the fill are ORed, their bytes that count kept. */
#if defined(__SSE2__)
CORAL_INLINE __m128i coral_ring_same(const uint8_t *at, coral_vec2_t fill) {
    return _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)at), (__m128i)fill);
}

CORAL_INLINE bool coral_secure_ring_intact(const coral_page_t *page, const uint8_t *block,
                                           coral_vec2_t fill) {
    const coral_ring_shape_t *shape = coral_ring_shape_of(page);
    __m128i same = _mm_and_si128(_mm_and_si128(coral_ring_same(block + shape->at[0], fill),
                                               coral_ring_same(block + shape->at[1], fill)),
                                 _mm_and_si128(coral_ring_same(block + shape->at[2], fill),
                                               coral_ring_same(block + shape->at[3], fill)));
    uint32_t want = shape->want;
    return ((uint32_t)_mm_movemask_epi8(same) & want) == want;
}
#else
CORAL_INLINE coral_vec2_t coral_ring_changed(const uint8_t *at, coral_vec2_t fill) {
    return coral_vec2_load(at) ^ fill;
}

CORAL_INLINE bool coral_secure_ring_intact(const coral_page_t *page, const uint8_t *block,
                                           coral_vec2_t fill) {
    const coral_ring_shape_t *shape = coral_ring_shape_of(page);
    coral_vec2_t changed = coral_ring_changed(block + shape->at[0], fill) |
                           coral_ring_changed(block + shape->at[1], fill) |
                           coral_ring_changed(block + shape->at[2], fill) |
                           coral_ring_changed(block + shape->at[3], fill);
    /* (want: all 16 bytes, or the first 8: the low word's) */
    uint64_t high = shape->want > 0xff ? changed[1] : 0;
    return (changed[0] | high) == 0;
}
#endif

/* Whether p, in `page` (in use, of a normal segment), is a live block
 * start: a block start (a division, the slow path's) whose mark word,
 * which lies inside the page's blocks, holds its canary and slack, and
 * the bytes at its request's end their canary (above). */
CORAL_INLINE bool coral_secure_intact(const coral_page_t *page, uint8_t *block, uint64_t canary) {
    size_t blocks_end = (size_t)page->reserved * page->block_size; /* (the mark read is in it) */
    size_t offset = (size_t)(block - page->start), usable = page->block_size - CORAL_CANARY_SIZE;
    return offset + page->block_size <= blocks_end && offset % page->block_size == 0 &&
           coral_secure_canaries_intact(block, usable, *coral_mark_word(page, block), canary);
}

/* The checks a free (`release`: then the freed mark and the fill are
 * written) or a realloc (a live block) makes of p, in `page` (in use, of a
 * normal segment): false when it found a misuse (reported; with
 * CORALLOC_ON_ERROR=warn the caller leaves p). */
CORAL_INLINE bool coral_secure_page_check(coral_page_t *page, void *p, bool release) {
    uint64_t canary = coral_canary_of(page, p);
    if (coral_unlikely(!coral_secure_intact(page, p, canary)))
        return coral_secure_check_slow(page, p, release);
    if (release) coral_secure_mark_freed(page, p, canary);
    return true;
}

/* The free fast path's check: p's slice descriptor `slice` is the head of
 * a page in use that the calling thread owns, with no flag (its tid_flags
 * equal the thread's id: so in a normal segment, of a size class), and p
 * looks like a live block start there, allocated with `size` bytes when
 * size > 0 (a sized free): *freed is set to its freed mark, which the
 * caller writes (after the ring's fill, coral_secure_ring_fill, which
 * covers a 16-byte block's mark word). False: the caller takes the checked slow
 * path (coral_secure_page_check). A second free finds the mark, not the canary: the check also
 * stands for the default build's test against local_free. It reads the owner's line only
 * (segment.h). p lies in the span's first slice, where the page's first block starts (segment.c),
 * so its offset from that block is its offset in the slice; at most the last block's offset keeps
 * the mark read inside the page's blocks, as coral_secure_intact does, and a multiple of the block
 * size makes it a block start: the canary alone lets an interior pointer through where the
 * program planted the canary its address computes to (misuse free-interior-planted-canary). The
 * test is a 32-bit division (the owner's line has no room left for the default build's
 * multiplier and bound): one instruction, its latency off the path the branch predicts.
 * `wide` (a constant): false on the free fast path, which decodes the
 * canary word's first field alone; true out of it
 * (coral_secure_free_fast_wide), for a word whose other fields are set. */
CORAL_INLINE bool coral_secure_free_check(coral_page_t *slice, void *p, size_t size, bool wide,
                                          uint64_t *freed) {
    uint32_t offset = (uint32_t)((uintptr_t)p & (CORAL_SLICE_SIZE - 1));
    uint32_t usable = slice->owner_usable_size;
    if (coral_unlikely(offset > slice->owner_last_block) ||
        coral_unlikely(offset % (usable + (uint32_t)CORAL_CANARY_SIZE) != 0))
        return false;
    uint64_t canary = coral_owner_canary_of(slice, p);
    uint64_t *mark = (uint64_t *)(void *)((uint8_t *)p + usable);
    /* The request canary, its first field alone on the fast path (a word
     * with another field set: a slack of 64 or more, the wide check's). The
     * fast path does not compare the slack with the usable size: every
     * writer writes at most the usable size, and a word that passes the
     * field test holds the canary, which a program does not know (an
     * overwrite passes it once in 2^58), so the byte read lies in the
     * block, or for a forged word at most 63 bytes before its word. */
    uint64_t code = *mark ^ canary;
    size_t slack;
    if (wide) {
        slack = coral_slack_of(code);
        if (coral_unlikely((code & ~CORAL_SLACK_BITS) != 0) || coral_unlikely(slack > usable))
            return false;
    } else {
        if (coral_unlikely((code & ~CORAL_SLACK_LOW) != 0)) return false;
        slack = (size_t)(code >> 1);
    }
    if (coral_unlikely(((uint8_t *)mark)[-(ptrdiff_t)slack] != (uint8_t)canary)) return false;
    /* A sized free (size > 0): the request the word says (else a wrong
     * size: the checked path names it). free's size is the constant 0: the
     * test folds away. */
    if (coral_unlikely(size != 0 && size != usable - slack)) return false;
    *freed = coral_freed_mark_of(canary);
    return true;
}

CORAL_INLINE bool coral_secure_free_fast(coral_page_t *slice, void *p, size_t size,
                                         uint64_t *freed) {
    return coral_secure_free_check(slice, p, size, false, freed);
}

/* The same check of a block whose canary word holds a slack of 64 or more
 * (its other fields set: a class above 1 KiB, a block realloc kept, an
 * aligned one), which the free fast path leaves to the checked path
 * (api/alloc.c): every field decoded, the slack bounded by the usable
 * size. */
CORAL_INLINE bool coral_secure_free_fast_wide(coral_page_t *slice, void *p, size_t size,
                                              uint64_t *freed) {
    return coral_secure_free_check(slice, p, size, true, freed);
}

/* The offset of p from the first block of `page` (a page of a size class:
 * owner_start_low, segment.h), for a p in the page's segment: a
 * subtraction in 32 bits. Every block on a page's lists is in its segment
 * (the decode of each link checks it, coral_block_next, and the blocks a
 * carve or a free puts there are the page's), so a block malloc pops needs
 * no other bound; a p outside the page gives an offset above its last
 * block (an unsigned wrap below it: the segment is 4 MiB). */
CORAL_INLINE uint32_t coral_block_offset_in_page(const coral_page_t *page, const void *p) {
    return (uint32_t)(uintptr_t)p - page->owner_start_low;
}

/* A block of a size class just popped off `page`'s free list by its
 * owner: a block outside the page (a link forged or overwritten: the
 * decode kept it in the segment only) or a write after free is reported
 * (fatal), its canaries for a request of `request` bytes (at most its
 * usable size) written, the mark's word among them, and with `zero` its
 * first `request` bytes cleared. Every block on a free list has
 * its fill (free and the carve write it, and a page's memory is returned
 * to the OS only once its lists are gone), so the check reads the
 * block's first 32 bytes alone (its fill, and a 32-byte block's mark): a
 * larger block's mark word, past them, is written, never read. It reads the owner's line only
 * (segment.h), never the one remote frees write. Returns the block; the
 * report is a tail call that returns nothing (the malloc fast path then
 * keeps no stack frame for it). */
CORAL_INLINE void *coral_secure_small_out(coral_page_t *page, void *p, size_t request,
                                          size_t narrow, bool zero) {
    size_t usable = page->owner_usable_size;
    uint64_t canary = coral_owner_canary_of(page, p);
    uint32_t offset = coral_block_offset_in_page(page, p);
    if (coral_unlikely(offset > page->owner_last_block) ||
        coral_unlikely(!coral_secure_fill_intact(usable, p, canary)))
        return coral_secure_write_after_free(page, p);
    /* The request canary (above), no branch: `narrow` SIZE_MAX where the
     * class's slack is below 64 (malloc's fast path: the first field,
     * written as is), 0 for any class (every field: coral_slack_code). */
    size_t slack = usable - request;
    ((uint8_t *)p)[usable - slack] = (uint8_t)canary;
    *(uint64_t *)(void *)((uint8_t *)p + usable) =
        canary ^ (narrow ? (uint64_t)slack << 1 : coral_slack_code(slack));
    if (zero) memset(p, 0, request);
    return p;
}

/* A large block at p whose size was set (malloc, realloc in place) for a
 * request of `request` bytes: its canaries (above), at the request's end
 * and after its usable bytes. */
CORAL_INLINE void coral_secure_large_out(coral_page_t *page, uint8_t *p, size_t request) {
    uint64_t *word = coral_mark_word(page, page->start);
    coral_secure_canaries_out(p, (size_t)((uint8_t *)word - p), request,
                              coral_canary_of(page, page->start));
}

/* Owner: which blocks of the page are in use, as bits (block i: bit i % 64
 * of live[i / 64]), over the blocks carved so far (returned: the bits
 * written; 0 when its lists hold a block twice, which the secure build
 * reports when it links them: the live ones are then unknown). The
 * remote-freed blocks are taken first; a block the owner holds apart from
 * the page's lists (a batch, a cache: the layers above) counts as in use.
 * A large page: its one block. */
#define CORAL_PAGE_LIVE_WORDS (4096 / 64) /* a page has at most 4095 blocks */
uint32_t coral_page_live_blocks(coral_page_t *page, uint64_t live[CORAL_PAGE_LIVE_WORDS]);
/* Owner: fn(page, block) for every block coral_page_live_blocks finds. */
void coral_page_each_live(coral_page_t *page, void (*fn)(coral_page_t *page, uint8_t *block));
/* The secure build: a user heap frees its pages whole (destroy, reset):
 * the canary of every block still in use is checked first (a heap
 * overflow is reported, coral_misuse, as a free would). */
void coral_page_check_live_canaries(coral_page_t *page);
/* Owner, the secure build: every block on the page's free lists still
 * holds its fill (and, in a block of 32 bytes or less, its freed mark),
 * else a write after free is reported (fatal). A block freed and never
 * handed out again is checked so when its page's span is released: its
 * last chance. An empty page's carved blocks are read in address order
 * (secure.c), else the lists walked: O(blocks carved). (Not when a page is
 * parked, the empty page its owner keeps: that walk, at every park, made
 * a malloc+free of batch64 cost 20 instructions more; a parked page the
 * purger gives back to the OS is not checked.) */
void coral_page_check_free_fills(coral_page_t *page);

/* CORAL_VALGRIND builds: a user heap frees its pages whole (destroy,
 * reset): memcheck is told every block of the page still in use is freed.
 * (Blocks of aligned allocations inside a block are left out: memcheck
 * knows them by a pointer the page does not keep.) */
void coral_page_valgrind_forget(coral_page_t *page);

/* ---- orphan pages (reclaim.c) ------------------------------------------------------ */

/* Called once at start-up: the purge stage of orphan pages. */
void coral_orphans_init(void);
void coral_orphans_lock(void);
void coral_orphans_unlock(void);
/* Under the lock: list the page; true when the list was empty before.
 * Its bytes join the purge backlog when `counted` (every block is free: an
 * orphan, a parked page), not for an aside page (page.c). */
bool coral_orphan_add(coral_page_t *page, bool counted);
void coral_orphan_take_back(coral_page_t *page);
/* Another thread's read of an aside page's `used` (its owner's plain
 * stores race with it: a stale value is larger). */
uint32_t coral_page_aside_used(const coral_page_t *page);
void coral_orphan_forget(coral_page_t *page);
void coral_orphans_prefork(void);
void coral_orphans_postfork(void);

#endif /* CORAL_PAGE_H */
