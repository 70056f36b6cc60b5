/* Pages: spans of slices holding blocks of one size class.
 *
 * Free lists of a page:
 *   free        the blocks malloc pops, and the owner's free pushes
 *               (owner only);
 *   local_free  blocks collected from thread_free and chains the owner
 *               freed in bulk; moved to `free` when `free` runs out;
 *   thread_free blocks other threads freed (atomic, see below).
 *
 * The owner's free pushes on `free`, not on a list kept aside until
 * `free` runs out: a block freed is the next one handed out. A program
 * that allocates a temporary, frees it and allocates an object it keeps
 * then gets the temporary's place for it, next to the objects it
 * allocated before, so the objects it keeps lie in the order it allocated
 * them, a few cache lines apart. Set aside, the freed blocks would be
 * handed out only after the rest of the carved blocks, in the reverse
 * order of their frees: the kept objects would be spread out, and a walk
 * over them in allocation order (a garbage collector's) would jump
 * backwards through memory (docs/experiments/, "Reuse order").
 *
 * So a loop of mallocs and frees of one class may never return to the
 * slow path: remote frees into its page wait on thread_free until `free`
 * runs out (at most a page's blocks), and the purge work of the slow path
 * (CORALLOC_PURGE_THREAD=0) waits for the next slow path.
 *
 * Remote free protocol (page->thread_free = list | count | flags | state,
 * laid out in page.h):
 *   - Any thread may push a chain of n blocks: CAS the word from
 *     (h, c, s) to (b, c + n, s) with the chain's tail linked to h, release
 *     order, so the owner sees the links. The count therefore says how many
 *     blocks the list holds, with no walk.
 *   - Only the owner takes blocks: CAS (h, c, s) -> (NULL, 0, s), acquire
 *     and release (the remote generation, below).
 *   - State USE (set only by the owner, when the page moves to its heap's
 *     full queue): the next remote freer pushes its blocks and sets FREEING
 *     in the same CAS, then pushes the *page* on page->owner->delayed_pages
 *     (setting delayed_listed first), then sets FREEING -> NONE. That tells
 *     the owner the page has free blocks again, without the owner ever
 *     scanning its full pages.
 *   - State NEVER (set by an owner before it lets go of its heap: thread
 *     exit, coral_heap_destroy/reset): remote frees only push on the page;
 *     the heap is never touched.
 *   - The owner changes the state with a CAS loop that waits while the state
 *     is FREEING. So once an exiting owner has set NEVER on all its pages, no
 *     thread is still pushing to its heap, and the heap can be reused.
 *
 * Orphans (reclaim.c): a push that brings the count to page->reserved has
 * made every block of the page free, all of them on this list, whatever the
 * owner is doing: the owner's free lists are then empty and it has no live
 * block there, so it touches the page's memory only after taking the list.
 * That freer lists the page as an orphan. It takes the orphan lock *before*
 * its CAS and lists the page after it, so an owner that takes the full list
 * and then takes the same lock (always, even when the page does not look
 * listed yet) always finds it listed, and unlists it. The purger may later
 * claim an orphan: one CAS from (all blocks, reserved, s) to
 * (NULL, 0, s | RECLAIMED | BUSY), return its memory to the OS, then clear
 * BUSY (release). An owner that finds RECLAIMED
 * waits for BUSY to clear (acquire) and resets the page to empty, its memory
 * zero. A remote push that finds RECLAIMED is a double free.
 *
 * Parked pages (coral_page_park): an empty page that its owner keeps for
 * reuse, at the front of its class queue but not first in it (no direct[]
 * slot and no malloc fast path leads to it: those pop from the first page
 * only), is handed to the orphan protocol above by its owner, so that the
 * purger can return it while the owner idles. The owner moves its free
 * blocks, as they are (free and local_free joined: nothing is carved
 * again), onto thread_free in one CAS from (NULL, 0, s) to (chain,
 * reserved, s) (release: its writes to the blocks come before any purge),
 * counts every block in use (used = reserved: they are all "on
 * thread_free"; the chain holds the `capacity` carved ones, the count says
 * `reserved` so that the purger's claim applies) and sets is_parked, which
 * only it reads and writes (the purger reads it after a claim, which
 * ordered it). Whether the page must be listed is in the same word:
 *   - LISTED clear: the owner takes the orphan lock, makes its CAS setting
 *     LISTED, and lists the page (since now). Only that hold of the lock
 *     sets LISTED, and whoever unlists a page clears it, under the lock;
 *   - LISTED set (parked before, taken back within the delay, and not
 *     looked at by the purger since): the CAS alone, keeping LISTED and
 *     setting RENEWED, no lock. A program that fills and empties a few
 *     pages in rounds pays this CAS and the take's.
 * The purger, under the lock, looks at a listed page that is due
 * (reclaim.c, orphan_look), one CAS on the word whatever it finds:
 *   - every block on it and RENEWED clear: claimed as an orphan is;
 *   - every block on it and RENEWED set: RENEWED cleared, the page listed
 *     again as the newest: a page the owner parked again is claimed only
 *     after a whole delay with no take and no park;
 *   - anything else (the owner took it back): LISTED cleared in the CAS
 *     that saw it so, then unlisted. An owner about to park it again with
 *     its CAS that needs LISTED fails, sees LISTED clear and lists it
 *     under the lock (window_parked_again): no page stays parked unlisted.
 * The owner takes a parked page back with its usual take, (h, c, s) ->
 * (NULL, 0, s) keeping LISTED: is_parked tells it the list is its own
 * chain (it becomes local_free, unwalked) and the page stays listed for
 * the purger to unlist or renew. Claimed first, the owner finds
 * RECLAIMED, waits for BUSY to clear and gets the page empty and uncarved,
 * with zero memory (page_take_reclaimed). So:
 *   - the owner touches the page's lists only after taking thread_free,
 *     and the malloc fast path cannot reach the page: pops go through
 *     direct[] or the first page of the queue, and when the page becomes
 *     first its free list is empty, so the pop takes the slow path, which
 *     takes thread_free (coral_page_collect); the free fast path has no
 *     live block of the page to free;
 *   - of the owner's take and the purger's claim, one CAS wins: an owner
 *     that resumes at any step (before the claim, between claim and purge,
 *     during the purge, after it) never uses memory the purger returns;
 *   - no legitimate remote free reaches a parked page (it has no live
 *     block); a misuse push finds count = reserved and is reported as an
 *     overflow, or finds RECLAIMED and is reported as a double free.
 * Only the owner parks, and only on its slow paths (a page emptied that is
 * not first): the malloc and free fast paths are unchanged. The first page
 * of each queue is never parked: the fast path pops from it with no
 * atomic operation, so nothing but the owner's next call could tell the
 * purger it may take it.
 *
 * Aside pages: a page behind the first of its class queue whose blocks
 * other threads free while its owner makes no call (larson's main thread,
 * a producer that waits) would stay resident: the orphan protocol needs
 * every block on thread_free, and some of them are on the owner's own
 * lists. So the owner sets such a page aside (coral_page_set_aside, when
 * the page goes behind the first: the heap layer's queues), and the
 * purger may claim it once no block of it is live:
 *   - the owner sets is_aside (its own field) and ASIDE in the word with
 *     one RMW, release: its last writes to used and to the lists come
 *     before. While the page is aside the owner's only change to it is
 *     the free of a live block (the free fast path, a bulk run, the
 *     profiler's return): `used` only goes down. Anything else it does to
 *     the page (make it first, collect it, park, release or walk it) comes
 *     after coral_page_unaside: one RMW clearing ASIDE and RENEWED; when
 *     that RMW finds RECLAIMED, the purger claimed the page: the owner
 *     waits for BUSY to clear and takes the page back empty, uncarved,
 *     zero (its lists are forgotten: their memory is gone);
 *   - when the word has LISTED, the owner's RMW that sets ASIDE sets
 *     RENEWED too, which only the purger clears (pushes keep it, and a
 *     take of the owner comes after an unaside, which clears it). So once
 *     the owner took a page back and set it aside again, the word differs
 *     from any the purger read before, whatever pushes and takes came
 *     between: a claim CAS from a word the purger read earlier fails;
 *   - the first push onto a word with ASIDE and not LISTED lists the page
 *     (reclaim.c, not counted in the purge backlog): it holds the orphan
 *     lock around its CAS, which sets LISTED, and the listing. So only
 *     pages other threads free into are listed, and a single-threaded
 *     program lists none;
 *   - the purger, at a listed page due (reclaim.c, orphan_look), under the
 *     lock: ASIDE and RENEWED, it clears RENEWED and, when every block is
 *     free (`used` equals the count), lists the page as the newest (a look
 *     a delay later may claim it, though no push comes), else unlists it
 *     as below; ASIDE (no RENEWED, RECLAIMED or BUSY): it reads `used`
 *     (after its acquire load that saw ASIDE, so a value the owner wrote
 *     at or after its RMW: at least the value now) and, when it equals
 *     the count, claims the page with one CAS from exactly that word to
 *     RECLAIMED | BUSY, purges it outside the lock and clears BUSY;
 *     otherwise it clears LISTED in one CAS and unlists the page, and the
 *     next push lists it again;
 *   - why a claim is safe: `used` >= the count always (a block on
 *     thread_free counts in `used` until the owner takes it); the purger
 *     read u == c, u at least `used` then, and the CAS saw the count still
 *     c: so `used` == c when the CAS succeeded, no block was live, and the
 *     owner, which has not unasided the page (its RMW would have changed
 *     the word, and a later aside would have set RENEWED), can reach it
 *     only through coral_page_unaside, which finds RECLAIMED;
 *   - the purger's read of `used` is a data race by the C11 rules: the
 *     fast paths write it with plain stores, and making it atomic would
 *     add instructions to both. It is an aligned 32-bit load (one
 *     instruction), a stale value is larger and only delays a claim, and
 *     it is made in one function that TSan does not instrument
 *     (reclaim.c, aside_used).
 *   tests/model_protocol.py (`aside`) explores the claim against the
 *   owner's free, its return and a remote free.
 *
 * Freed marks (the default build; page.h): every block freed, by its
 * owner or by another thread, holds the page's freed mark in its second
 * word until malloc hands it out again. A remote freer reads the word and
 * writes the mark before its push (a plain load and store, no locked
 * instruction: page.h, coral_remote_mark_write); when the word held the
 * mark already, the block may be free now (on one of the owner's lists,
 * on thread_free, in a bulk cache), and the push sets SUSPECT. Of two
 * frees of one block, whatever came between them, the second sees the
 * first's mark: nothing in between clears it but a malloc that hands the
 * block out (then the second free is no double free). So a list taken
 * without SUSPECT holds each block once and becomes local_free unwalked; a
 * list with SUSPECT is checked against the owner's lists
 * (thread_free_collect): a block found twice is reported, anything else
 * (the program's data that equals the mark) costs the walk. Chains (bulk
 * frees) carry marks too and always set SUSPECT.
 * Two other threads that free one block at the same instant may both read
 * the word before either writes the mark. So a remote freer reads
 * thread_free (acquire) before it reads the mark word, and its push sets
 * SUSPECT unless its CAS finds the word it read then: the first of the two
 * to push wrote the mark before its CAS (release), so the second either
 * read thread_free after that CAS, and then the mark, or finds the word
 * changed (window_remote_mark_race: before, the second push made the list
 * x, y, x, ... unflagged and malloc handed x out twice). A push that found
 * nothing changed costs nothing more. A take of the first push between
 * the second's read and its CAS changes the word too: the second push is
 * flagged, and the take of it finds its block twice on the owner's lists,
 * or handed out since (window_remote_mark_take). Not caught, the block
 * then handed out twice: the same take with the list empty both times (the
 * word is then the same again); a take and a malloc that hands the block
 * out again, both before the second's mark write (the second free then
 * frees the block's next life, as a free through a stale pointer after the
 * block's reuse does, which no mark tells apart); and the owner's free and
 * another thread's at the same instant (the owner's free fast path reads
 * and writes the mark, no atomic operation). Any other order is caught.
 */
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "page/page.h"

coral_page_t coral_page_empty; /* free == NULL forever */

/* The default build: a new block-start multiplier for the page (page.h,
 * "block starts and freed marks"), at init and whenever every block is
 * free again: j drawn from the secret, kept in epoch for other threads. */
static void page_new_start_mul(coral_page_t *page) {
    if (CORAL_SECURE) return;
    page->epoch = coral_secure_next_epoch();
    page->owner_start_mul = coral_page_start_mul(page);
}

void coral_page_init(coral_page_t *page, coral_page_owner_t *owner, bool user_heap, unsigned cls,
                     size_t block_size) {
    page->free = NULL;
    page->local_free = NULL;
    page->used = 0;
    size_t fit = ((size_t)page->slice_count * CORAL_SLICE_SIZE) / block_size;
    page->reserved = (uint16_t)(fit < CORAL_PAGE_MAX_BLOCKS ? fit : CORAL_PAGE_MAX_BLOCKS);
    /* The owner makes its pages: the id is the segment's, no flag set. */
    coral_slice_set(
        page, atomic_load_explicit(&coral_ptr_segment(page)->thread_id, memory_order_relaxed), 0);
    page->is_user_heap = user_heap;
    page->free_is_zero = 0;
    page->is_parked = 0;
    page->is_aside = 0;
    page->class_idx = (uint8_t)cls;
    page->block_size = block_size;
    page->aligned_slices = 0;
    if (CORAL_SECURE) {
        page->owner_usable_size = (uint32_t)(block_size - CORAL_CANARY_SIZE);
        page->owner_start_low = (uint32_t)(uintptr_t)page->start;
    }
    /* (A span holds at least one block: reserved >= 1.) */
    page->owner_last_block = (uint32_t)((size_t)(page->reserved - 1) * block_size);
    if (CORAL_SECURE) {
        page->epoch = coral_secure_next_epoch();
        page->owner_canary = coral_canary_with(page->epoch, NULL);
    } else {
        page_new_start_mul(page);
    }
    coral_page_set_capacity(page, 0);
    page->link.next = page->link.prev = NULL;
    atomic_store_explicit(&page->thread_free, CORAL_DELAY_NONE, memory_order_relaxed);
    atomic_store_explicit(&page->delayed_listed, 0, memory_order_relaxed);
    atomic_store_explicit(&page->owner, owner, memory_order_release);
}

/* Blocks per carve once a page is past its first: 4 KiB worth, or 16
 * blocks when that is more (at most 16 KiB). Blocks of an OS page or more
 * go one at a time from a fresh span (linking more would fault in a page
 * each for blocks nobody asked for yet), 16 KiB worth, rounded up to whole
 * blocks, from a span already touched (its pages are resident: linking
 * faults nothing in). */
static uint32_t carve_step(const coral_page_t *page) {
    size_t bs = page->block_size;
    if (bs >= CORAL_OS_PAGE_SIZE && page->is_fresh) return 1;
    size_t span = bs < 1024 ? CORAL_CARVE_MIN_BLOCKS * bs : CORAL_CARVE_MIN_BLOCKS * 1024;
    if (span < CORAL_OS_PAGE_SIZE) span = CORAL_OS_PAGE_SIZE;
    return (uint32_t)((span + bs - 1) / bs);
}

/* Link up to n more blocks after the carved ones, in front of page->free. */
static void page_carve(coral_page_t *page, uint32_t n) {
    size_t bs = page->block_size;
    if (n > page->reserved - page->capacity) n = page->reserved - page->capacity;
    if (n == 0) return;
    uint8_t *first = page->start + (size_t)page->capacity * bs;
    /* Carved blocks of a fresh span are zero (not in the secure build:
     * their fill and mark); blocks already on the list keep the list's
     * mark (a collected list is never marked zero). */
    page->free_is_zero =
        !CORAL_SECURE && page->is_fresh && (page->free == NULL || page->free_is_zero);
    coral_page_set_capacity(page, page->capacity + n);
    if (CORAL_SECURE) { /* each block gets its fill and freed mark as it is linked */
        page->free = coral_secure_carve(page, first, n, page->free);
        return;
    }
    /* Each block linked gets the carve's mark in word 1, on the line its
     * link is written to (page.h, "Freed marks": free then finds a mark on
     * a block never handed out). */
    uint8_t *last = first + (size_t)(n - 1) * bs;
    for (uint8_t *b = first; b < last; b += bs) {
        coral_block_set_next((coral_block_t *)b, (coral_block_t *)(b + bs));
        if (CORAL_FREED_MARKS) *coral_block_mark_word((coral_block_t *)b) = CORAL_CARVED_MARK;
    }
    coral_block_set_next((coral_block_t *)last, page->free);
    if (CORAL_FREED_MARKS) *coral_block_mark_word((coral_block_t *)last) = CORAL_CARVED_MARK;
    page->free = (coral_block_t *)first;
}

/* How many blocks from `first` (bs bytes each, bs below an OS page) the
 * carve touches only in first's OS page: the blocks that start there,
 * whose link is all it writes; in the secure build the blocks that end
 * there, since it writes each block's last word too (its mark,
 * page_mark_carved): a block that ran into the next OS page would fault
 * it in for a block nobody asked for yet. At least one block. */
static uint32_t blocks_in_os_page(uintptr_t first, size_t bs) {
    size_t room = ((first | (CORAL_OS_PAGE_SIZE - 1)) + 1) - first;
    size_t n = CORAL_SECURE ? room / bs : (room + bs - 1) / bs;
    return n != 0 ? (uint32_t)n : 1;
}

/* Carve a step of blocks (carve_step) onto the (empty) free list, so memory
 * is touched only as it is needed. The first carve of a page links only the
 * blocks of its first OS page (blocks_in_os_page): many pages (a class used
 * once) never get past their first blocks, and linking a step of bigger
 * blocks would fault in pages for blocks never used. With to_os_page_end
 * (the caller knows the page's memory is untouched and not prefaulted)
 * every carve stops there: a small program faults in the pages its blocks
 * lie on, not a step ahead of them. */
void coral_page_extend(coral_page_t *page, bool to_os_page_end) {
    size_t bs = page->block_size;
    uint32_t step = carve_step(page);
    if (bs < CORAL_OS_PAGE_SIZE && (page->capacity == 0 || to_os_page_end)) {
        uintptr_t first = (uintptr_t)page->start + (size_t)page->capacity * bs;
        uint32_t in_page = blocks_in_os_page(first, bs);
        if (page->capacity == 0 || in_page < step) step = in_page;
    }
    page_carve(page, step);
}

/* Owner, when malloc found the page's free list dry and refilled it from
 * local_free: a page that has only had its short first carve (fewer blocks
 * than a step) and is in use again gets the rest of a step now, so that
 * its free list does not run dry again after those few blocks. */
void coral_page_top_up_first_carve(coral_page_t *page) {
    uint32_t step = carve_step(page);
    if (page->capacity < step && page->capacity < page->reserved)
        page_carve(page, step - page->capacity);
}

/* One step of a wait for a few steps of another thread (a notifier leaving
 * FREEING, the purger's madvise), which may be preempted: spin, then yield,
 * then sleep 50 us at a time. Only the sleep lets that thread run when it
 * has a lower real-time priority on this CPU (SCHED_FIFO: a yield gives way
 * to equal priorities only; window_rt_notice_wait). A raw system call:
 * nanosleep is a cancellation point, which an allocator must not be. */
static void wait_step(unsigned *spins) {
    unsigned n = ++*spins;
    if (n < 64) {
        coral_spin_pause();
    } else if (n < 128) {
        sched_yield();
    } else {
        struct timespec pause = {0, 50 * 1000};
        syscall(SYS_nanosleep, &pause, NULL);
    }
}

/* Until the purger has returned a claimed page's memory (BUSY clear). Short:
 * one madvise. Acquire: the page's memory is the caller's afterwards. */
void coral_page_wait_not_busy(coral_page_t *page) {
    unsigned spins = 0;
    while (atomic_load_explicit(&page->thread_free, memory_order_acquire) & CORAL_TF_BUSY) {
        if (spins == 0) coral_test_point(CORAL_TP_WAIT_BUSY, page);
        wait_step(&spins);
    }
}

/* Owner: the purger took every block of the page (RECLAIMED) and returned
 * its memory. The page is empty again, its memory zero: blocks are carved
 * anew as they are needed. */
static CORAL_NOINLINE void page_reset_reclaimed(coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf & CORAL_DELAY_MASK,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    page->free = page->local_free = NULL;
    page->used = 0;
    page->is_parked = 0;                              /* (the claim unlisted it) */
    if (page->class_idx == CORAL_CLASS_LARGE) return; /* one block: nothing to carve */
    coral_page_set_capacity(page, 0);
    page->is_fresh = 1;
    page->free_is_zero = 0;
}

static void page_take_reclaimed(coral_page_t *page) {
    coral_page_wait_not_busy(page);
    if (page->used != page->reserved || page->free != NULL || page->local_free != NULL)
        coral_fatal("double free detected: a page of %zu-byte blocks had all %u blocks freed by "
                    "other threads, yet its owner still counts %u in use",
                    page->block_size, page->reserved, page->used);
    page_reset_reclaimed(page);
}

CORAL_NOINLINE void coral_page_set_aside(coral_page_t *page) {
    if (page->is_aside || page->is_parked) return;
    page->is_aside = 1;
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed), renewed;
    do {
        renewed = (tf & CORAL_TF_LISTED) ? CORAL_TF_RENEWED : 0;
    } while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                    tf | CORAL_TF_ASIDE | renewed,
                                                    memory_order_release, memory_order_relaxed));
}

/* The purger claimed a page set aside: its lists led into memory that is
 * zero now. */
static CORAL_COLD void aside_take_reclaimed(coral_page_t *page) {
    coral_page_wait_not_busy(page);
    page_reset_reclaimed(page);
}

CORAL_NOINLINE void coral_page_unaside_slow(coral_page_t *page) {
    page->is_aside = 0;
    uintptr_t tf = atomic_fetch_and_explicit(
        &page->thread_free, ~(CORAL_TF_ASIDE | CORAL_TF_RENEWED), memory_order_acq_rel);
    coral_test_point(CORAL_TP_UNASIDE, page);
    if (coral_unlikely(tf & CORAL_TF_RECLAIMED)) aside_take_reclaimed(page);
}

static CORAL_COLD void thread_free_overflow(const coral_page_t *page, const void *block) {
    coral_fatal("double free detected: more blocks freed than allocated in a page of "
                "%zu-byte blocks (block %p)",
                page->block_size, block);
}

/* Owner: every block of the page is free again (used is 0, so no block is
 * on thread_free or on its way there: each of those still counts in used).
 * Forget the free lists and carve the blocks again from the first: they
 * are then handed out by address, no list to walk. The span is no longer
 * fresh: blocks carved again are not zero. */
void coral_page_reset_empty(coral_page_t *page) {
    page->free = NULL;
    page->local_free = NULL;
    page->free_is_zero = 0;
    page->is_fresh = 0;
    page_new_start_mul(page);
    coral_page_set_capacity(page, 0);
}

/* Owner: the page's free blocks as one chain (local_free, usually empty,
 * walked to its tail and joined in front of free), its lists emptied. */
static coral_block_t *page_free_chain(coral_page_t *page) {
    coral_block_t *chain = page->free, *local = page->local_free;
    page->free = page->local_free = NULL;
    if (local == NULL) return chain;
    if (chain != NULL) {
        coral_block_t *tail = local;
        for (uint32_t n = 1; n < page->reserved && coral_block_next(tail) != NULL; n++)
            tail = coral_block_next(tail);
        coral_block_set_next(tail, chain);
    }
    return local;
}

bool coral_page_park(coral_page_t *page) {
    /* A page set aside: the park's CAS takes it back too (it needs ASIDE
     * and RENEWED as they are and clears them: "Aside pages"), one RMW
     * where the take back and the park took two. Claimed already: taken
     * back first (empty). */
    uintptr_t aside = 0;
    if (page->is_aside) {
        if (atomic_load_explicit(&page->thread_free, memory_order_relaxed) & CORAL_TF_RECLAIMED)
            coral_page_unaside(page);
        else
            aside = CORAL_TF_ASIDE | CORAL_TF_RENEWED;
    }
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    if (tf & ~(CORAL_TF_KEPT | aside)) {
        coral_page_unaside(page);
        return false; /* a block pushed: taken (and reported) at the next take */
    }
    coral_block_t *chain = page_free_chain(page);
    uintptr_t parked = (uintptr_t)chain | ((uintptr_t)page->reserved << CORAL_TF_COUNT_SHIFT);
    page->used = page->reserved;
    page->is_parked = 1;
    /* Still listed: parked again in one CAS that needs LISTED, so that a
     * purger that unlists the page meanwhile (clearing LISTED first) makes
     * it fail; RENEWED tells the purger the page was in use since. */
    while (tf & CORAL_TF_LISTED) {
        coral_test_point(CORAL_TP_PARK_AGAIN, page);
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                  parked | (tf & CORAL_TF_KEPT) | CORAL_TF_RENEWED,
                                                  memory_order_release, memory_order_relaxed)) {
            page->is_aside = 0;
            return true;
        }
        if (tf & ~(CORAL_TF_KEPT | aside)) goto pushed;
    }
    /* Not listed (LISTED is set only with the lock held, so it stays
     * clear): parked and listed in one hold of the lock. */
    coral_orphans_lock();
    tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    do {
        if (tf & ~(CORAL_TF_KEPT | aside)) {
            coral_orphans_unlock();
            goto pushed;
        }
    } while (!atomic_compare_exchange_weak_explicit(
        &page->thread_free, &tf, parked | (tf & CORAL_DELAY_MASK) | CORAL_TF_LISTED,
        memory_order_release, memory_order_relaxed));
    page->is_aside = 0;
    bool first = coral_orphan_add(page, true);
    coral_orphans_unlock();
    /* The purger learns of a due time only when the list was empty: a page
     * listed behind others is due after them, and the purger's pass that
     * finds the first due sees the next one's time. */
    if (first) coral_purger_notify();
    return true;
pushed:
    page->free = chain;
    page->used = 0;
    page->is_parked = 0;
    coral_page_unaside(page);
    return false;
}

/* A set of a page's blocks, by index (a page has at most 4095). */
typedef struct block_set_s {
    uint64_t bits[4096 / 64];
} block_set_t;

/* Adds block to the set; false when it was there already or is no block
 * start of the page (a list that leads outside its page). */
static bool block_set_add(block_set_t *set, const coral_page_t *page, const coral_block_t *block) {
    if (!coral_page_is_block_start(page, block)) return false;
    size_t i = (size_t)((const uint8_t *)block - page->start) / page->block_size;
    uint64_t bit = (uint64_t)1 << (i % 64);
    if (set->bits[i / 64] & bit) return false;
    set->bits[i / 64] |= bit;
    return true;
}

/* Owner: the blocks of `list` (at most `limit` of them followed) added to
 * the set; the first block found twice (or outside the page), else NULL. */
static const coral_block_t *block_set_add_list(block_set_t *set, const coral_page_t *page,
                                               const coral_block_t *list, uint32_t limit) {
    for (uint32_t n = 0; list != NULL && n < limit; n++, list = coral_block_next(list))
        if (!block_set_add(set, page, list)) return list;
    return NULL;
}

/* Whether a block taken off thread_free still holds the freed mark its
 * push wrote: nothing clears it while the block is free but malloc
 * handing it out. */
static bool taken_block_marked(coral_block_t *block) {
    return !CORAL_FREED_MARKS || coral_freed_mark_seen(block);
}

static CORAL_COLD void taken_block_live(const coral_page_t *page, const void *block) {
    coral_fatal("double free detected: block %p of a page of %zu-byte blocks was freed by another "
                "thread while it was free, and handed out since",
                block, page->block_size);
}

/* Owner: a taken list of count blocks that may hold a block twice, one
 * already on the owner's lists, or one handed out since its push
 * (SUSPECT: a push found a freed mark, so its block was free already:
 * if the owner handed it out since, the malloc cleared the mark). Checked
 * against all three, block by block. Returns its tail. */
static coral_block_t *thread_free_check(coral_page_t *page, coral_block_t *head, uint32_t count) {
    block_set_t *set = &(block_set_t){{0}};
    uint32_t limit = page->reserved;
    if (block_set_add_list(set, page, page->free, limit) != NULL ||
        block_set_add_list(set, page, page->local_free, limit) != NULL)
        coral_fatal("free list corrupted: a page of %zu-byte blocks has a block twice on its "
                    "lists (a write after free?)",
                    page->block_size);
    coral_block_t *tail = head;
    for (uint32_t i = 0; i < count; i++) {
        if (!block_set_add(set, page, tail)) thread_free_overflow(page, tail);
        if (!taken_block_marked(tail)) taken_block_live(page, tail);
        if (i + 1 < count) tail = coral_block_next(tail);
    }
    return tail;
}

/* Owner: take the remote-freed blocks onto local_free. A list marked
 * SUSPECT is checked block by block against itself and the owner's lists
 * (thread_free_check): a block freed twice is reported rather than handed
 * out twice. A list that joins blocks already on local_free is walked to
 * its tail, and its length checked against the count the pushes kept. Any
 * other list becomes local_free as it is, unwalked: its blocks were each
 * pushed once ("Freed marks" above), and the walk's loads would miss the
 * cache when another core built the list (docs/DESIGN.md, "Remote
 * frees"). */
static void thread_free_collect(coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    for (;;) {
        if (coral_unlikely(tf & CORAL_TF_RECLAIMED)) {
            page_take_reclaimed(page);
            return;
        }
        if ((tf & ~CORAL_TF_KEPT) == 0) return;
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf & CORAL_TF_KEPT,
                                                  memory_order_acquire, memory_order_relaxed))
            break;
    }
    /* A page it parked: its own free blocks, as it left them (no push can
     * have joined them: the count was `reserved`). It stays listed, if it
     * is, for the purger to unlist (see above). */
    if (page->is_parked) {
        page->is_parked = 0;
        page->used = 0;
        page->local_free = coral_tf_list(tf);
        coral_test_point(CORAL_TP_PARKED_TAKEN, page);
        return;
    }
    uint32_t count = coral_tf_count(tf);
    /* Every block was on the list: the freer of the last one lists the
     * page as an orphan (see above); it is ours again. */
    if (count == page->reserved) coral_orphan_take_back(page);
    if (count > page->used) thread_free_overflow(page, coral_tf_list(tf));
    coral_block_t *head = coral_tf_list(tf), *tail = head;
    page->used -= count;
    if ((tf & CORAL_TF_SUSPECT) == 0 && page->local_free == NULL) {
        page->local_free = head;
        return;
    }
    if (tf & CORAL_TF_SUSPECT)
        tail = thread_free_check(page, head, count);
    else
        for (uint32_t i = 1; i < count; i++) tail = coral_block_next(tail);
    if (coral_block_next(tail) != NULL) thread_free_overflow(page, coral_block_next(tail));
    coral_block_set_next(tail, page->local_free);
    page->local_free = head;
}

/* Owner: whether block, which holds the page's freed mark, is free: on
 * thread_free (taken first, which checks it), local_free or free. Bounded
 * by the page's blocks. */
bool coral_page_holds_free(coral_page_t *page, const coral_block_t *block) {
    coral_page_unaside(page);
    coral_page_take_remote(page);
    const coral_block_t *lists[2] = {page->free, page->local_free};
    for (size_t l = 0; l < 2; l++) {
        const coral_block_t *b = lists[l];
        for (uint32_t n = 0; b != NULL && n < page->reserved; n++, b = coral_block_next(b))
            if (b == block) return true;
    }
    return false;
}

void coral_page_take_remote(coral_page_t *page) {
    if (atomic_load_explicit(&page->thread_free, memory_order_relaxed) & ~CORAL_TF_KEPT)
        thread_free_collect(page);
}

bool coral_page_all_free(const coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    return page->used == coral_tf_count(tf);
}

static void local_free_to_free(coral_page_t *page) {
    if (page->local_free == NULL) return;
    page->free = page->local_free;
    page->local_free = NULL;
    page->free_is_zero = 0;
}

/* A non-empty free list stays as it is: joining another list to it would
 * walk that list to its tail, a load per block, and the blocks of
 * local_free and thread_free are taken when it runs dry. The remote-freed
 * blocks are taken only onto an empty local_free, which needs no walk
 * either (thread_free_collect). */
void coral_page_collect(coral_page_t *page) {
    if (page->free != NULL) return;
    if (page->local_free == NULL) coral_page_take_remote(page);
    local_free_to_free(page);
}

/* In a fork's child before its child handler (base.h, "the locks a fork
 * holds": a program's handler registered before coralloc's allocates
 * there), the forking thread's pages in state FREEING were told by the
 * parent's other threads, which the child does not have: the state is
 * stale, and set back to NONE here as that handler does for every page of
 * the forking thread's heaps (coral_heap_after_fork_child; before, the
 * early handler's allocation waited forever: test_fork_early
 * child_freeing). True when so (*tf: the word now). Out of line: the
 * owner's wait stays small. */
static CORAL_COLD bool freeing_stale(coral_page_t *page, uintptr_t *tf) {
    if (!coral_fork_child_unreleased()) return false;
    *tf = coral_page_freeing_reset(page, *tf);
    return true;
}

uintptr_t coral_page_freeing_reset(coral_page_t *page, uintptr_t tf) {
    while ((tf & CORAL_DELAY_MASK) == CORAL_DELAY_FREEING) {
        uintptr_t none = (tf & ~CORAL_DELAY_MASK) | CORAL_DELAY_NONE;
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, none,
                                                  memory_order_acq_rel, memory_order_acquire))
            return none;
    }
    return tf;
}

/* Owner: wait while a remote freer is telling the owner (state FREEING):
 * a few steps of that freer (page_notify_owner), but it may be preempted,
 * or run at a lower priority on this CPU (wait_step). Returns the word
 * seen once the state is another. */
CORAL_INLINE uintptr_t wait_not_freeing(coral_page_t *page, uintptr_t tf) {
    unsigned spins = 0;
    while ((tf & CORAL_DELAY_MASK) == CORAL_DELAY_FREEING) {
        if (coral_unlikely(coral_fork_holding) && freeing_stale(page, &tf)) return tf;
        if (spins == 0) coral_test_point(CORAL_TP_WAIT_FREEING, page);
        wait_step(&spins);
        tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    }
    return tf;
}

void coral_page_wait_notice_done(coral_page_t *page) {
    (void)wait_not_freeing(page, atomic_load_explicit(&page->thread_free, memory_order_acquire));
}

/* Owner: set the delay state (see the protocol above). A page in state NEVER
 * keeps it unless override_never. */
void coral_page_set_delay(coral_page_t *page, uintptr_t state, bool override_never) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    for (;;) {
        tf = wait_not_freeing(page, tf);
        uintptr_t now = tf & CORAL_DELAY_MASK;
        if (now == state || (now == CORAL_DELAY_NEVER && !override_never)) return;
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                  (tf & ~CORAL_DELAY_MASK) | state,
                                                  memory_order_acq_rel, memory_order_relaxed))
            return;
    }
}

/* (From state USE, which only the owner sets, or NONE: never NEVER.) */
void coral_page_unfull_aside(coral_page_t *page) {
    if (page->is_aside || page->is_parked) {
        coral_page_set_delay(page, CORAL_DELAY_NONE, false);
        return;
    }
    page->is_aside = 1;
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed), add;
    do {
        tf = wait_not_freeing(page, tf);
        add = CORAL_TF_ASIDE | ((tf & CORAL_TF_LISTED) ? CORAL_TF_RENEWED : 0);
    } while (!atomic_compare_exchange_weak_explicit(
        &page->thread_free, &tf, (tf & ~CORAL_DELAY_MASK) | CORAL_DELAY_NONE | add,
        memory_order_acq_rel, memory_order_relaxed));
}

/* The start of the block that p points into. */
uint8_t *coral_page_block_start(const coral_page_t *page, const void *p) {
    uint8_t *start = page->start;
    size_t offset = (size_t)((const uint8_t *)p - start);
    if (page->class_idx == CORAL_CLASS_LARGE) return start;
    return start + (offset / page->block_size) * page->block_size;
}

void coral_page_invalid_free(const void *p, const char *why) {
    coral_misuse("free(): invalid pointer %p (%s)", p, why);
}

static CORAL_COLD void remote_double_free(const coral_page_t *page, const void *p) {
    coral_misuse("double free detected: block %p freed into a page of %zu-byte blocks whose "
                 "blocks were all free already",
                 p, page->block_size);
}

/* More blocks freed than the page holds, or the block freed last by other
 * threads freed again. */
static CORAL_COLD void remote_overflow(const coral_page_t *page, const void *block) {
    coral_misuse("double free detected: block %p freed again into a page of %zu-byte blocks by "
                 "another thread",
                 block, page->block_size);
}

/* The page was full (state USE): tell its owner, then leave state FREEING
 * (see the protocol above). */
static void page_notify_owner(coral_page_t *page) {
    coral_page_owner_t *owner = atomic_load_explicit(&page->owner, memory_order_acquire);
    atomic_store_explicit(&page->delayed_listed, 1, memory_order_relaxed);
    coral_page_t *head = atomic_load_explicit(&owner->delayed_pages, memory_order_relaxed);
    do {
        atomic_store_explicit(&page->delayed_next, head, memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(&owner->delayed_pages, &head, page,
                                                    memory_order_release, memory_order_relaxed));
    coral_test_point(CORAL_TP_NOTIFY_PUSHED, page);
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                  (tf & ~CORAL_DELAY_MASK) | CORAL_DELAY_NONE,
                                                  memory_order_release, memory_order_relaxed)) {
    }
}

/* Any thread but the owner: push the chain head..tail of n blocks of the
 * page on its thread_free (see the protocol above), SUSPECT if `suspect`
 * says so (their freed marks are written) or if the word is no longer
 * `seen`, what the caller read (acquire) before it read the blocks' mark
 * words ("Freed marks" above). Not inlined: one copy of the loop serves
 * every push (the resident window, cmake/hot-text.ld, has no room for
 * more). */
static CORAL_NOINLINE void push_remote(coral_page_t *page, coral_block_t *head, coral_block_t *tail,
                                       uint32_t n, uintptr_t suspect, uintptr_t seen) {
    uint32_t reserved = page->reserved;
    bool locked = false, list_aside;
    uintptr_t tf = seen, state;
    uint32_t count;
    for (;;) {
        /* A misuse leaves the page's lists as they were (nothing pushed). */
        if (coral_unlikely(tf & (CORAL_TF_RECLAIMED | CORAL_TF_BUSY))) {
            if (locked) coral_orphans_unlock();
            remote_double_free(page, head);
            return;
        }
        count = coral_tf_count(tf) + n;
        if (coral_unlikely(count > reserved || coral_tf_list(tf) == head)) {
            if (locked) coral_orphans_unlock();
            remote_overflow(page, head);
            return;
        }
        /* An aside page not listed: this push lists it ("Aside pages"). */
        list_aside = (tf & (CORAL_TF_ASIDE | CORAL_TF_LISTED)) == CORAL_TF_ASIDE;
        if (coral_unlikely(count == reserved || list_aside) && !locked) {
            coral_orphans_lock(); /* before the CAS that frees the last block */
            locked = true;
            tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
            continue;
        }
        if (tf != seen) suspect = CORAL_TF_SUSPECT;
        state = tf & CORAL_DELAY_MASK;
        uintptr_t next_state = state == CORAL_DELAY_USE ? CORAL_DELAY_FREEING : state;
        coral_block_set_next(tail, coral_tf_list(tf));
        /* (RECLAIMED and BUSY are clear: checked above.) */
        uintptr_t next = coral_tf_pushed(tf, head, count, suspect, next_state) |
                         (list_aside ? CORAL_TF_LISTED : 0);
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, next,
                                                  memory_order_release, memory_order_acquire))
            break;
    }
    if (coral_unlikely(locked)) {
        bool first = false;
        if (count == reserved || list_aside) first = coral_orphan_add(page, count == reserved);
        coral_orphans_unlock();
        if (first || count == reserved) coral_purger_notify();
        if (count == reserved) coral_purger_start_if_wanted(); /* no lock held: a safe point */
    }
    if (coral_unlikely(state == CORAL_DELAY_USE)) page_notify_owner(page);
}

static uintptr_t remote_word(coral_page_t *page) {
    return atomic_load_explicit(&page->thread_free, memory_order_acquire);
}

void coral_page_push_remote(coral_page_t *page, coral_block_t *head, coral_block_t *tail,
                            uint32_t n) {
    /* (the owner checks a chain) */
    push_remote(page, head, tail, n, CORAL_TF_SUSPECT, remote_word(page));
}

void coral_page_push_remote_marked(coral_page_t *page, coral_block_t *block, uintptr_t suspect) {
    push_remote(page, block, block, 1, suspect, remote_word(page));
}

coral_block_t *coral_page_freed_block(const coral_page_t *page, void *p) {
    if (page->slice_count == 0) {
        coral_page_invalid_free(p, "in no page in use: double free?");
        return NULL;
    }
    if (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) {
        if ((uint8_t *)p == coral_page_large_block(page)) return (coral_block_t *)page->start;
        coral_page_invalid_free(p, "inside a block, not its start");
        return NULL;
    }
    if (!coral_page_is_block_start(page, p)) {
        size_t offset = (size_t)((uint8_t *)p - page->start);
        coral_page_invalid_free(p, offset < (size_t)page->reserved * page->block_size
                                       ? "inside a block, not its start"
                                       : "past the page's last block: no block starts there");
        return NULL;
    }
    return p;
}

void coral_page_push_remote_run(coral_page_t *page, coral_block_t *head, coral_block_t *tail,
                                uint32_t n, uintptr_t seen) {
    /* The push's checks read the word as it is now, not `seen`: since then
     * the owner may have taken the list and handed its blocks out again
     * (its count, and its head, which may be this run's head now). */
    uintptr_t now = remote_word(page);
    push_remote(page, head, tail, n, now != seen ? CORAL_TF_SUSPECT : 0, now);
}

void coral_page_free_remote(coral_page_t *page, void *p) {
    coral_block_t *block = coral_page_freed_block(page, p);
    if (block == NULL) return;
    uintptr_t seen = remote_word(page); /* before the mark is read ("Freed marks" above) */
    push_remote(page, block, block, 1, coral_remote_mark_write(block), seen);
}

/* A remote freer pushes its block (state FREEING) before it lists the page
 * on its owner's delayed_pages, and sets NONE (release) only after, so a
 * page may already have all its blocks back while the freer has still to
 * list it: state FREEING says so. */
bool coral_page_notice_pending(coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    return (tf & CORAL_DELAY_MASK) == CORAL_DELAY_FREEING ||
           atomic_load_explicit(&page->delayed_listed, memory_order_relaxed);
}

size_t coral_page_blocks_bytes(const coral_page_t *page, size_t block_size) {
    size_t span = (size_t)page->slice_count * CORAL_SLICE_SIZE;
    return span / block_size * block_size;
}

/* Whoever releases a page takes whatever is left on its thread_free (a
 * destroyed heap's page may hold the blocks other threads freed into it),
 * waiting first for a purge in progress (BUSY). No purge can start on a
 * page once it is released, whose span may hold another page's live
 * blocks next: the purger claims only listed pages (reclaim.c), and the
 * release unlisted it first. */
static void thread_free_seal(coral_page_t *page) {
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    for (;;) {
        if (tf & CORAL_TF_BUSY) {
            coral_page_wait_not_busy(page);
            tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
            continue;
        }
        if ((tf & ~CORAL_DELAY_MASK) == 0) return;
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf & CORAL_DELAY_MASK,
                                                  memory_order_acq_rel, memory_order_acquire))
            return;
    }
}

void coral_page_release_span(coral_page_t *page) {
    coral_page_unaside(page);
    /* A page released with blocks on its thread_free (coral_heap_destroy)
     * may be an orphan, or being purged by the purger: neither may outlive
     * it. */
    coral_orphan_forget(page);
    thread_free_seal(page);
    /* (The secure build) a block freed and never handed out again:
     * checked for a write after its free (a parked page's lists are
     * empty: its blocks are not checked, see coral_page_check_free_fills). */
    if (CORAL_SECURE) coral_page_check_free_fills(page);
    /* A large block placed on clean memory: how much of it the program
     * wrote tells the adaptive populate policy about big blocks. */
    if (page->class_idx == CORAL_CLASS_LARGE && page->is_fresh && coral_populate_adaptive())
        coral_populate_note_big_block(page->start, page->block_size);
    /* (The secure build) its guard page, and the block too when it left
     * the heap's quarantine (heap layer): one range, made accessible. */
    if (CORAL_SECURE && page->class_idx == CORAL_CLASS_LARGE)
        (void)coral_os_protect(page->start, page->block_size + CORAL_GUARD_SIZE, true);
    coral_span_free(page);
}

uint32_t coral_page_live_blocks(coral_page_t *page, uint64_t live[CORAL_PAGE_LIVE_WORDS]) {
    if (page->class_idx == CORAL_CLASS_LARGE) { /* one block: freed if used or pushed remotely */
        live[0] = page->used != 0 && !coral_page_all_free(page);
        return 1;
    }
    if (coral_page_is_parked(page)) return 0; /* no live block, and left for the purger */
    coral_page_unaside(page);
    coral_page_take_remote(page);
    block_set_t *free_seen = &(block_set_t){{0}};
    if (block_set_add_list(free_seen, page, page->free, page->reserved) != NULL ||
        block_set_add_list(free_seen, page, page->local_free, page->reserved) != NULL)
        return 0; /* lists that hold a block twice: the live ones are unknown */
    uint32_t n = page->capacity;
    for (uint32_t w = 0; w < (n + 63) / 64; w++) live[w] = ~free_seen->bits[w];
    if (n % 64 != 0) live[n / 64] &= ((uint64_t)1 << (n % 64)) - 1;
    return n;
}

void coral_page_each_live(coral_page_t *page, void (*fn)(coral_page_t *page, uint8_t *block)) {
    uint64_t live[CORAL_PAGE_LIVE_WORDS];
    uint32_t n = coral_page_live_blocks(page, live);
    for (uint32_t i = 0; i < n; i++)
        if (live[i / 64] >> (i % 64) & 1) fn(page, page->start + (size_t)i * page->block_size);
}

#if CORAL_VALGRIND
static void valgrind_forget_block(coral_page_t *page, uint8_t *block) {
    (void)page;
    VALGRIND_FREELIKE_BLOCK(block, 0);
}

void coral_page_valgrind_forget(coral_page_t *page) {
    if (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) return;
    coral_page_each_live(page, valgrind_forget_block);
}
#else
void coral_page_valgrind_forget(coral_page_t *page) { (void)page; }
#endif
