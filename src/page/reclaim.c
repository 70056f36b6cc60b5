/* Orphan pages: pages all of whose blocks were freed by other threads,
 * empty pages their owner keeps for reuse and parked here (page.c,
 * "Parked pages": its free blocks given to thread_free at once, counted
 * as every block), and pages their owner set aside that other threads
 * free into (page.c, "Aside pages": claimed once no block is live), so
 * that a thread that stops calling does not pin them.
 *
 * Such a page is empty, but only its owner may reuse it, and an owner that
 * stays idle (a producer thread blocked on a queue, a worker parked in a
 * pool) would hold its memory forever. So the freer of a page's last block
 * lists the page here (page.c says how it knows, with no help from the
 * owner), and the purger, once the page has stayed listed for the purge
 * delay, takes every block of it in one CAS and returns its memory to the
 * OS. The owner keeps its page descriptor and resets it when it next looks
 * at the page. An owner that comes back before the delay takes its blocks
 * as usual and unlists the page: memory freed and reused soon is never
 * purged. (A parked page taken back stays listed, LISTED in its word,
 * until the purger looks at it: then it is unlisted, or, parked again
 * meanwhile, renewed. So a page parked and taken back in rounds is listed
 * once, and looked at once a delay.)
 *
 * The list is linked through the pages' orphan entries (beside their
 * descriptors in the segment header, segment.h), oldest first, under
 * orphans_lock. Who holds the lock: a remote freer around the CAS
 * that frees a page's last block, and the listing; an owner parking a page
 * not listed, around its CAS and the listing; an owner (or whoever
 * releases the page) unlisting it; the purger looking at pages. Nobody waits
 * for anything else while holding it, and the purger returns memory only
 * after releasing it. A listed page is never released (whoever releases a
 * page unlists it first), so the purger may read any listed page's
 * descriptor under the lock; a page it claimed stays until it clears BUSY. */
#include <pthread.h>

#include <string.h>

#include "page/page.h"

static pthread_mutex_t orphans_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_list_t orphans;
static _Atomic(size_t) orphans_count; /* written under the lock; peeked without */

/* One reclaimer at a time (the purger, or coral_collect's thread), held
 * across its claims and purges: so a fork, which takes it first, never
 * leaves the child a page half purged by a purger it does not have. */
static pthread_mutex_t reclaim_lock = PTHREAD_MUTEX_INITIALIZER;

#define RECLAIM_BATCH 32

void coral_orphans_lock(void) { coral_mutex_lock(&orphans_lock); }
void coral_orphans_unlock(void) { coral_mutex_unlock(&orphans_lock); }

static coral_orphan_entry_t *orphan_entry(coral_page_t *page) {
    coral_segment_t *seg = coral_ptr_segment(page);
    return &seg->orphans[page - seg->pages];
}

static coral_page_t *orphan_page(coral_link_t *link) {
    coral_orphan_entry_t *entry = coral_container_of(link, coral_orphan_entry_t, link);
    coral_segment_t *seg = coral_ptr_segment(entry);
    return &seg->pages[entry - seg->orphans];
}

static int64_t orphan_bytes(const coral_page_t *page) {
    return (int64_t)((size_t)page->slice_count * CORAL_SLICE_SIZE);
}

/* Under the lock. An orphan's memory counts in the purge backlog (purge.c)
 * while it is listed. */
static void orphan_unlink(coral_page_t *page) {
    /* The descriptor is read while the page is still listed: once
     * orphan_listed is 0 (release), whoever releases the page may do so
     * without the lock (coral_orphan_forget) and rewrite it. */
    int64_t bytes = orphan_entry(page)->bytes;
    coral_list_remove(&orphans, &orphan_entry(page)->link);
    atomic_store_explicit(&orphans_count,
                          atomic_load_explicit(&orphans_count, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    coral_purge_backlog_add(-bytes);
    /* (The word's LISTED goes with the listing: page.c, "Parked pages".) */
    atomic_fetch_and_explicit(&page->thread_free, ~CORAL_TF_LISTED, memory_order_relaxed);
    atomic_store_explicit(&page->orphan_listed, 0, memory_order_release);
}

/* Under the lock: list the page (the newest last). The caller wakes the
 * purger after unlocking (the purger's lock is taken before this one at
 * fork). */
bool coral_orphan_add(coral_page_t *page, bool counted) {
    bool was_empty = orphans.first == NULL;
    coral_orphan_entry_t *entry = orphan_entry(page);
    entry->since_ms = coral_clock_ms();
    int64_t bytes = counted && entry->bytes == 0 ? orphan_bytes(page) : 0;
    /* A page parked (or set aside) before and listed still, whose blocks
     * other threads have all freed since: listed anew, the newest. */
    if (atomic_load_explicit(&page->orphan_listed, memory_order_relaxed)) {
        coral_list_remove(&orphans, &entry->link);
        coral_list_push_back(&orphans, &entry->link);
        entry->bytes += bytes;
        coral_purge_backlog_add(bytes);
        return false;
    }
    coral_list_push_back(&orphans, &entry->link);
    atomic_store_explicit(&page->orphan_listed, 1, memory_order_relaxed);
    atomic_store_explicit(&orphans_count,
                          atomic_load_explicit(&orphans_count, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    entry->bytes = counted ? orphan_bytes(page) : 0;
    coral_purge_backlog_add(entry->bytes);
    return was_empty;
}

/* Its owner took all the page's blocks back (the whole list, count ==
 * reserved): unlist it. The lock is taken even when the page does not look
 * listed: the freer of its last block lists it only after its CAS, holding
 * the lock from before that CAS, so waiting for the lock here is what makes
 * sure it is listed by now (and not after the page is released). */
void coral_orphan_take_back(coral_page_t *page) {
    coral_mutex_lock(&orphans_lock);
    if (atomic_load_explicit(&page->orphan_listed, memory_order_relaxed)) orphan_unlink(page);
    coral_mutex_unlock(&orphans_lock);
}

/* The page is being released, its blocks dead (coral_heap_destroy) or
 * taken back already: unlist it if it still is. No free of its blocks can
 * be in flight, and a purger that unlisted it tried its claim before
 * (orphans_reclaim_due), so the unlocked check is enough. */
void coral_orphan_forget(coral_page_t *page) {
    if (atomic_load_explicit(&page->orphan_listed, memory_order_acquire))
        coral_orphan_take_back(page);
}

/* Under the lock, the page still listed, due: the purger's look at it.
 *   - every block on thread_free (an orphan, or a page parked), RENEWED
 *     clear: claimed, all its blocks taken in one CAS;
 *   - parked, RENEWED set (its owner parked it again since it was listed
 *     or last looked at): RENEWED cleared, the page stays listed as the
 *     newest (orphan_renew), so it is claimed only once it stays parked
 *     for a whole delay;
 *   - anything else (its owner took it back, and holds it): LISTED
 *     cleared in the same CAS that sees it held, so an owner that parks it
 *     again with its one CAS that needs LISTED fails, and lists it under
 *     the lock; then unlisted.
 * Forced (coral_collect), a parked page is claimed whether renewed or not.
 * The page is not released while listed, so its descriptor (`reserved`)
 * is the page's own. Not after the unlisting: from then on whoever
 * releases the page does so without the lock, and a new page on the same
 * descriptor may have more blocks, its count reaching the old `reserved`
 * with its other blocks live (window_orphan_reuse_smaller). */
typedef enum { LOOK_HELD, LOOK_RENEWED, LOOK_CLAIMED, LOOK_CLAIMED_ASIDE, LOOK_AGAIN } look_t;

/* A read of an aside page's `used` by a thread other than its owner, which
 * writes it with plain stores on the fast paths: a data race by the C11
 * rules, accepted (page.c, "Aside pages": an aligned 32-bit load, and a
 * stale value is larger, which only delays a claim, or a run's push: api/
 * remote_run.h), so not instrumented by TSan. */
#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
__attribute__((no_sanitize("thread")))
#endif
#endif
uint32_t
coral_page_aside_used(const coral_page_t *page) {
    return *(const volatile uint32_t *)&page->used;
}

static look_t orphan_look(coral_page_t *page, bool force) {
    uint32_t reserved = page->reserved;
    uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    for (;;) {
        uintptr_t next, claimed = (tf & CORAL_DELAY_MASK) | CORAL_TF_RECLAIMED | CORAL_TF_BUSY;
        look_t got;
        if ((tf & (CORAL_TF_ASIDE | CORAL_TF_RECLAIMED | CORAL_TF_BUSY)) == CORAL_TF_ASIDE) {
            /* Set aside (page.c, "Aside pages"). The acquire load that saw
             * ASIDE orders the read of `used` after the owner's RMW that
             * set it. RENEWED (set aside again since it was listed or last
             * looked at: in use since; a claim's CAS needs the word without
             * it): forced, RENEWED cleared and the page looked at again
             * now; else, every block free, RENEWED cleared and the page
             * kept listed as the newest, so that a look a delay later may
             * claim it though no push comes to list it again. A block
             * live: unlisted (RENEWED cleared too), and the next push lists
             * it again. (`used` read here only chooses between the two:
             * no claim is made from it.) */
            if ((tf & CORAL_TF_RENEWED) && force)
                next = tf & ~CORAL_TF_RENEWED, got = LOOK_AGAIN;
            else if ((tf & CORAL_TF_RENEWED) && coral_page_aside_used(page) == coral_tf_count(tf))
                next = tf & ~CORAL_TF_RENEWED, got = LOOK_RENEWED;
            else if (tf & CORAL_TF_RENEWED)
                next = tf & ~(CORAL_TF_RENEWED | CORAL_TF_LISTED), got = LOOK_HELD;
            else if (coral_page_aside_used(page) == coral_tf_count(tf)) {
                next = claimed, got = LOOK_CLAIMED_ASIDE;
                coral_test_point(CORAL_TP_ASIDE_CLAIM, page);
            } else
                next = tf & ~CORAL_TF_LISTED, got = LOOK_HELD;
        } else if (coral_tf_count(tf) != reserved || (tf & CORAL_TF_RECLAIMED)) {
            next = tf & ~CORAL_TF_LISTED, got = LOOK_HELD;
        } else if ((tf & CORAL_TF_RENEWED) && !force) {
            next = tf & ~CORAL_TF_RENEWED, got = LOOK_RENEWED;
        } else {
            next = claimed, got = LOOK_CLAIMED;
        }
        if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, next,
                                                  memory_order_acquire, memory_order_acquire)) {
            if (got != LOOK_AGAIN) return got;
            tf = next; /* forced: looked at again as it is now */
        }
    }
}

/* Under the lock: a renewed page listed again as the newest, from now. */
static void orphan_renew(coral_page_t *page, uint64_t now) {
    coral_orphan_entry_t *entry = orphan_entry(page);
    entry->since_ms = now;
    coral_list_remove(&orphans, &entry->link);
    coral_list_push_back(&orphans, &entry->link);
}

/* Return a claimed page's whole span to the OS (it becomes zero), then let
 * its owner have it back. */
static void orphan_purge(coral_page_t *page, bool aside) {
    coral_test_point(CORAL_TP_ORPHAN_PURGING, page);
    coral_segment_t *seg = coral_ptr_segment(page);
    uint8_t *span = coral_segment_base(seg) + (size_t)(page - seg->pages) * CORAL_SLICE_SIZE;
    size_t size = (size_t)page->slice_count * CORAL_SLICE_SIZE;
    /* The owner takes the page back as zero memory: made so by hand when
     * the kernel refused, over the blocks only (a large page's span ends
     * with the secure build's guard page, which is not accessible). */
    if (!coral_os_purge(span, size))
        memset(page->start, 0, coral_page_blocks_bytes(page, page->block_size));
    /* (The owner set is_parked before the park's CAS, which the claim
     * read, and changes it only once BUSY is clear. An aside page is not
     * parked: the owner's is_aside is not read here, it may be clearing
     * it now.) */
    if (aside) {
        coral_count(&coral_counters.aside_reclaimed, 1);
        coral_count(&coral_counters.aside_bytes_reclaimed, (int64_t)size);
    } else if (page->is_parked) {
        coral_count(&coral_counters.parked_reclaimed, 1);
        coral_count(&coral_counters.parked_bytes_reclaimed, (int64_t)size);
    } else {
        coral_count(&coral_counters.orphans_reclaimed, 1);
        coral_count(&coral_counters.orphan_bytes_reclaimed, (int64_t)size);
    }
    atomic_fetch_and_explicit(&page->thread_free, ~CORAL_TF_BUSY, memory_order_release);
}

/* The purger (or coral_collect): reclaim the orphans listed for the purge
 * delay (all of them when forced), in batches of RECLAIM_BATCH claimed
 * under the list lock and purged outside it. Returns when the next one is
 * due (0: none listed). */
static uint64_t orphans_reclaim_due(uint64_t now, bool force) {
    /* A peek: a page listed just after it was read notifies the purger. */
    if (atomic_load_explicit(&orphans_count, memory_order_relaxed) == 0) return 0;
    uint64_t delay = (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS), next_due = 0;
    coral_mutex_lock(&reclaim_lock);
    for (;;) {
        coral_page_t *claimed[RECLAIM_BATCH];
        bool aside[RECLAIM_BATCH];
        size_t n = 0;
        coral_mutex_lock(&orphans_lock);
        while (orphans.first != NULL && n < RECLAIM_BATCH) {
            coral_page_t *page = orphan_page(orphans.first);
            uint64_t since_ms = orphan_entry(page)->since_ms;
            if (!force && since_ms + delay > now) {
                next_due = since_ms + delay;
                break;
            }
            /* Claimed while listed, unlisted after: a releaser that sees
             * the page unlisted (coral_orphan_forget) finds the claim made
             * (BUSY, which it waits out) or failed, never still to come. */
            coral_test_point(CORAL_TP_ORPHAN_CLAIMING, page);
            look_t got = orphan_look(page, force);
            if (got == LOOK_RENEWED) {
                orphan_renew(page, now);
                continue;
            }
            orphan_unlink(page);
            coral_test_point(CORAL_TP_ORPHAN_UNLISTED, page);
            if (got == LOOK_CLAIMED || got == LOOK_CLAIMED_ASIDE) {
                aside[n] = got == LOOK_CLAIMED_ASIDE;
                claimed[n++] = page;
            }
        }
        bool more = orphans.first != NULL && next_due == 0;
        coral_mutex_unlock(&orphans_lock);
        for (size_t i = 0; i < n; i++) orphan_purge(claimed[i], aside[i]);
        if (!more) break;
        now = coral_clock_ms();
    }
    coral_mutex_unlock(&reclaim_lock);
    return next_due;
}

void coral_orphans_init(void) {
    coral_purge_stage_set(CORAL_PURGE_ORPHAN_PAGES, orphans_reclaim_due);
}

/* fork: the child has one thread, the locks must be free in it. */
void coral_orphans_prefork(void) {
    coral_mutex_lock(&reclaim_lock);
    coral_mutex_lock(&orphans_lock);
}

void coral_orphans_postfork(void) {
    coral_mutex_unlock(&orphans_lock);
    coral_mutex_unlock(&reclaim_lock);
}
