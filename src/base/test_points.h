/* Test points: named places inside the allocator's concurrency protocols
 * where a test can hold a thread, so that it drives one exact interleaving
 * (a window between two steps) instead of hoping for it.
 *
 * Only the hooks library (CMake target coralloc_api_hooks, built with
 * CORAL_TEST_HOOKS=1, linked by the interleaving tests) calls them: in the
 * release, secure and sanitizer libraries coral_test_point() is nothing.
 * The hook runs on the thread at the point, with the object the point is
 * about (a page, a segment, a heap); it may block that thread until the
 * test lets it go. A test sets it with coral_test_point_set (tests/hooks.h).
 *
 * Included by base.h; tests include it for the names. */
#ifndef CORAL_TEST_POINTS_H
#define CORAL_TEST_POINTS_H

typedef enum coral_test_point_e {
    /* reclaim.c: the purger tried to claim an orphan page and unlisted it,
     * holding the orphan lock */
    CORAL_TP_ORPHAN_UNLISTED,
    /* reclaim.c: the purger claimed an orphan page and is about to purge it */
    CORAL_TP_ORPHAN_PURGING,
    /* page.c: a thread waits for the purger to return a claimed page's
     * memory (BUSY) */
    CORAL_TP_WAIT_BUSY,
    /* page.c: a remote freer pushed a full page on its owner's delayed_pages
     * and has not left state FREEING yet */
    CORAL_TP_NOTIFY_PUSHED,
    /* page.c: an owner waits for a remote freer to leave state FREEING */
    CORAL_TP_WAIT_FREEING,
    /* large.c: a free of a user heap's huge block, before it takes the
     * huge-block list lock */
    CORAL_TP_HUGE_FREE_UNLOCKED,
    /* large.c: the same free, holding the huge-block list lock */
    CORAL_TP_HUGE_LIST_LOCKED,
    /* thread.c: the fork's prepare handler starts (before any lock) */
    CORAL_TP_FORK_PREPARE,
    /* thread.c: the fork's prepare handler has taken every lock (the
     * layer above's hooks included, if set) */
    CORAL_TP_FORK_PREPARED,
    /* purge.c: the purge thread found no program thread left and is about
     * to end the process */
    CORAL_TP_PURGER_LAST_THREAD,
    /* purge.c: the purge thread's watch for the process's last thread
     * (after a thread's exit notice) is past its fast looks: it goes on
     * every EXIT_WATCH_SLOW_STEP_MS */
    CORAL_TP_EXIT_WATCH_SLOW,
    /* bulk_cache.c: the purger took idle bulk caches and is about to flush them */
    CORAL_TP_CACHE_FLUSHING,
    /* purge.c: the purge thread, watching for the process's last thread,
     * is about to walk /proc/self/task */
    CORAL_TP_PURGER_WATCH,
    /* reclaim.c: the purger, holding the orphan lock, is about to try its
     * claim of a listed page that is due */
    CORAL_TP_ORPHAN_CLAIMING,
    /* page.c: an owner took a page it parked back (its blocks off
     * thread_free), the page still listed or not */
    CORAL_TP_PARKED_TAKEN,
    /* page.c: an owner about to park a page again with one CAS, having
     * seen it still listed (LISTED) */
    CORAL_TP_PARK_AGAIN,
    /* purge.c: the purge thread's starter created it and has not yet
     * marked it RUNNING (an exit notice now signals nothing) */
    CORAL_TP_PURGER_STARTED,
    /* purge.c: the purge thread read the exit notices and is about to wait
     * with no end (it holds purger_lock) */
    CORAL_TP_PURGER_WAIT,
    /* cache.c: a purger (the purge thread, or coral_collect's thread) took
     * a dirty region out of the segment cache and is about to return its
     * memory; the object is the region's base */
    CORAL_TP_CACHE_PURGING,
    /* cache.c: the fork's prepare handler is about to wait for a purge of
     * the segment cache in progress */
    CORAL_TP_FORK_CACHE_WAIT,
    /* cache.c: a thread that put a region into the full segment cache took
     * the least recently freed ones out of the table and is about to unmap
     * them; the object is the first one's base */
    CORAL_TP_CACHE_EVICTING,
    /* cache.c: the fork's prepare handler is about to wait for an eviction
     * from the segment cache in progress */
    CORAL_TP_FORK_EVICT_WAIT,
    /* bulk_cache.c: a new bulk cache finds the caches' registry lock held
     * (by a fork, or a purger's look) and is about to wait for it; the
     * object is the cache */
    CORAL_TP_BULK_REGISTRY_WAIT,
    /* bulk_cache.c: a new bulk cache, the registry lock held, is about to
     * be listed; the object is the cache */
    CORAL_TP_BULK_CACHE_LISTING,
    /* thread.c: a thread (its first allocation, or a user heap's) holds
     * the heap pool's lock, about to take a heap struct (object NULL) or
     * to put one back (the object is that heap) */
    CORAL_TP_HEAP_POOL_LOCKED,
    /* large.c (secure build): a freed huge block's pages moved away, its
     * address range not yet reserved inaccessible; the object is the
     * range's base */
    CORAL_TP_HUGE_MOVED,
    /* thread.c: the fork's parent handler released every lock that its
     * prepare took; the fork is still in progress on the thread */
    CORAL_TP_FORK_RELEASED,
    /* purge.c: a fork's child handler released the allocator's other locks
     * and is about to make the purge thread's lock (the object) anew; only
     * in a child that has another thread (one a program's child handler
     * started before coralloc's) */
    CORAL_TP_FORK_CHILD_PURGER,
    /* page.h: a thread that frees another thread's block read the block's
     * mark word and has not written the freed mark yet; the object is the
     * block */
    CORAL_TP_REMOTE_MARK_READ,
    /* remote_run.c: a remote freer that adds a block to its run of remote
     * frees read the block's mark word and has not written the pending mark
     * yet; the object is the block */
    CORAL_TP_REMOTE_RUN_MARK_READ,
    /* remote_run.c: a remote freer wrote the pending mark of a block it
     * adds to its run of remote frees and has not linked the block into the
     * run yet; the object is the block */
    CORAL_TP_REMOTE_RUN_LINKING,
    /* heap.c: a fork's child handler read the remote-free word of a page
     * of the forking thread's, in state FREEING, and has not set it back
     * yet; the object is the page */
    CORAL_TP_FORK_CHILD_FREEING,
    /* profile.c: a thread adding a sample to its own tally (no lock held,
     * in its critical section) has written the sample's objects and not
     * yet its bytes; the object is the tally entry */
    CORAL_TP_PROFILE_TALLY_ADDING,
    /* page.c: an owner took back a page it set aside: its RMW cleared
     * ASIDE (a claim of the purger's after it fails; one before it is
     * found next) */
    CORAL_TP_UNASIDE,
    /* reclaim.c: the purger, under the orphan lock, read the word of an
     * aside page and its `used`, equal to the word's count, and has not
     * made its claim's CAS yet; the object is the page */
    CORAL_TP_ASIDE_CLAIM,
    /* message.c: the fork's prepare handler took stdio's list lock and has
     * not locked the witness stream yet (coral_libc_streams_lock) */
    CORAL_TP_FORK_STREAMS_LISTED,
    /* profile.c: a thread recording a sample holds its live bucket's lock,
     * the record listed and the page flagged; the object is the block */
    CORAL_TP_PROFILE_RECORDING,
    /* profile.c: the fork's prepare hook found one of the profiler's locks
     * held and is about to wait for it; the object is the lock */
    CORAL_TP_PROFILE_FORK_WAIT,
    /* api.h (secure build): a free's put into the ring of freed blocks
     * read its slot and has not written it yet (the ring busy); the object
     * is the block put */
    CORAL_TP_RING_SWAP,
    /* thread.c: a thread claimed the process's first initialisation
     * (coral_process_init) and has not begun it */
    CORAL_TP_PROCESS_STARTING,
    /* thread.c: the fork's prepare handler found another thread inside the
     * process's first initialisation and is about to wait for its end */
    CORAL_TP_FORK_INIT_WAIT,
    /* purge.c: a program thread holds the purger's lock, its signals
     * blocked (purger_lock_take) */
    CORAL_TP_PURGER_LOCKED,
    /* purge.c: a signal handler's notice, on a thread whose fork's prepare
     * holds the purger's lock, left the wake to the fork's release */
    CORAL_TP_PURGER_SIGNAL_OWED,
    /* thread.c: a thread past its exit holds the exit heap's lock, about
     * to allocate from it (coral_exit_heap_acquire) */
    CORAL_TP_EXIT_HEAP_LOCKED,
    /* thread.c: the thread holds the heap pool's lock without its record
     * (pool_held): just taken (object NULL), or about to release it
     * (object: the lock) */
    CORAL_TP_HEAP_POOL_UNRECORDED,
    /* thread.c: a fork's prepare, backing off, took the lock it waited for
     * (fork_back_off) and has not blocked signals to release it; the
     * object is the lock */
    CORAL_TP_FORK_BACK_OFF_TAKEN,
    /* thread.c: the same back-off is about to release that lock; the
     * object is the lock */
    CORAL_TP_FORK_BACK_OFF_RELEASING,
    CORAL_TP_COUNT
} coral_test_point_t;

typedef void (*coral_test_point_fn)(int point, const void *object);

#endif /* CORAL_TEST_POINTS_H */
