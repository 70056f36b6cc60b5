/* Runs of remote frees (the default build): a thread's consecutive frees of
 * blocks of one page that another thread owns, held back and pushed onto
 * the page's thread_free with one CAS per run instead of one per block.
 *
 * Why: a remote free writes its link into the block (the block's line was
 * last written by the thread that allocated it, on another core) and then
 * pushes with a locked CAS, which waits for that store to leave the store
 * buffer: one cache miss paid in full per free. Linked into a run with
 * plain stores, the misses of many frees overlap, and the run's one CAS
 * pays for all of them.
 *
 * Which frees: a thread has at most one open run. The third remote free in
 * a row into one page opens a run, and the next ones into that page add to
 * it; a remote free into any other page pushes the open run and goes the
 * ordinary way. So a thread whose remote frees move between pages (blocks
 * of mixed sizes handed over one by one) pays a compare and two stores
 * per free and seldom holds a block back; only stretches of frees into one
 * page are batched. (Held per page in 8 slots instead, such frees made
 * runs of about 2 blocks whose bookkeeping doubled the free's
 * instructions: xthread 1.7x slower. Opened at the second free in a row,
 * a run of one block, pushed by the full path, came at 1 free in 16 of
 * xthread's: +16 instructions a free.)
 *
 * Not in runs: blocks of user heaps (coral_heap_destroy frees their pages
 * whatever is live), of pages with aligned blocks, large and huge blocks,
 * a thread whose exit has begun or that has no heap and cannot get one (a
 * forked child whose fork still holds the locks). The thread's exit pushes
 * its run, so a thread that only frees gets a heap when it opens its first
 * run (the caller does: CORAL_RUN_NEEDS_HEAP).
 *
 * A run is pushed when a remote free into another page comes, when it
 * holds CORAL_RUN_MAX blocks, when its thread exits (the thread-exit hook)
 * and when its thread calls coral_collect / malloc_trim; by nothing else:
 * only its thread reads or writes it. So a thread that goes idle holds at
 * most CORAL_RUN_MAX - 1 freed blocks of one page back until it frees into
 * another page, collects or exits. Until then those blocks are in use for
 * everyone else: their page is neither released nor purged (nor claimed
 * as an orphan), coral_heap_visit reports them live, another thread's
 * coral_collect or malloc_trim cannot return them, and in a forked child
 * the runs of the threads but the forking one are never pushed (their
 * blocks stay in use in the child for good).
 *
 * Aside pages (page.c, "Aside pages"): the purger claims one, with no call
 * from its owner, once `used` equals the count on thread_free; a run that
 * held its last live blocks would keep it until this thread's next remote
 * free elsewhere. So a run opens on a page whose word has ASIDE only while
 * more than CORAL_RUN_MAX of its blocks are live (`used` less the count,
 * read as the purger reads it, a stale value larger), and is pushed when
 * full: a thread that alone frees an aside page's blocks pushes the last
 * ones at once, and the purger finds the page empty. (A run opened before
 * the page was set aside, or pages several threads free into, may still
 * hold its last blocks back until the push.)
 *
 * Signal handlers: a free() in a signal handler (POSIX does not allow it;
 * programs do it) may interrupt this thread's own remote free in the
 * middle of a change of the run. Every change of the run (an add, a push)
 * is made with `busy` set; a remote free that finds it set (the handler's)
 * leaves the run alone and goes the ordinary way, a lock-free push, as
 * without runs. The inline test reads n and busy in one load, so the
 * ordinary remote free pays nothing more for it; a handler's free that
 * lands outside a change finds the run consistent (the inline path writes
 * only `last` and `streak`, hints: a run that a handler opened meanwhile
 * on another page is pushed before the next one opens). Not covered: a
 * handler that frees again the very block the interrupted free is adding
 * (a double free): its push links the block onto thread_free, then the
 * add relinks it into the run, so the page's remote list is corrupted.
 * It is found before any block is handed out twice, but as the owner's
 * count overflow ("more blocks freed than allocated", coral_fatal, so
 * fatal also under CORALLOC_ON_ERROR=warn) or after a first report as a
 * second one naming a block freed once: the shape of two threads freeing
 * one block at the same instant (below).
 *
 * Invariants, who writes what:
 *   - a block in a run is counted in its page's `used` (not yet on
 *     thread_free), so its page is neither released nor reset while the
 *     run holds it: the push is always into the same page;
 *   - only the run's thread reads or writes the run and its blocks' words
 *     (link, mark) until the push; the push (coral_page_push_remote_run)
 *     publishes them with the CAS's release;
 *   - a block in a run holds CORAL_PENDING_MARK in its mark word, not the
 *     freed mark: nothing but a misuse changes it before the push (the
 *     block is on no list the owner reads, so no malloc hands it out), and
 *     the push checks it block by block and writes the freed mark. A
 *     second free of the block that comes after the pending mark was
 *     written is so caught, by any thread: the run's thread sees the
 *     pending mark and finds the block in its run (reported at once);
 *     another thread or the owner overwrites the pending mark (another
 *     thread pushes it at once with SUSPECT) and the run's push finds the
 *     word changed (reported then, before the block can be pushed twice).
 *     A write after free into the word is reported the same way;
 *   - two threads freeing one block at the same instant may both read no
 *     mark (page.c, "Freed marks"): the run keeps the page's thread_free
 *     word as read (acquire) before its first block's mark was read, and
 *     its push is flagged SUSPECT when the word at the push differs from
 *     it; the other free's push came after its own mark read, so after
 *     that read. NOT caught, as on a single push: when the owner takes the
 *     other free's push and hands the block out again before the run's
 *     push, and the word is then the same as the run read it (the list
 *     empty both times, the usual case after a take), the push is not
 *     flagged: the run wrote its pending mark over the live block's word 1
 *     and the block is handed out twice. A single push leaves the owner
 *     only the few instructions between its read of the word and its CAS
 *     for that take; a run leaves it the run's whole life, up to its push
 *     (CORAL_RUN_MAX - 1 more frees, or as long as an idle thread holds
 *     the run). The secure build has no runs;
 *   - `busy` (signal handlers, above): set with a plain store and a signal
 *     fence before any change of the run, cleared after; a free nested in
 *     a change reads it set and writes nothing of the run. */
#ifndef CORAL_REMOTE_RUN_H
#define CORAL_REMOTE_RUN_H

#include "heap/heap.h"

#define CORAL_RUN_MAX 32u
/* A run opens at the CORAL_RUN_OPEN-th remote free in a row into one page. */
#define CORAL_RUN_OPEN 3u

/* The calling thread's run: only it reads or writes it. */
typedef struct coral_remote_run_s {
    const coral_page_t *last; /* the page of the last remote free (the open run's, if any) */
    coral_page_t *page;       /* the open run's page; NULL: no run open */
    coral_block_t *head;      /* freed last; its link leads to the earlier ones */
    uintptr_t seen;           /* page's thread_free, read before the first block's mark */
    union {
        struct {
            uint32_t n;    /* blocks in the run; 0 iff page is NULL (outside a change) */
            uint32_t busy; /* 1 while the thread changes the run (above) */
        };
        uint64_t n_busy; /* both, for the inline test: 0 iff no run is open nor changed */
    };
    uint32_t streak; /* frees in a row into `last` since it or a push opened no run, less one */
} coral_remote_run_t;

extern __thread coral_remote_run_t coral_remote_run_tls __attribute__((tls_model("initial-exec")));

/* What became of a free given to the runs. */
typedef enum {
    CORAL_RUN_NOT_HELD,   /* the caller frees it the ordinary way */
    CORAL_RUN_HELD,       /* in the calling thread's run (or reported as a double free) */
    CORAL_RUN_NEEDS_HEAP, /* it would open a run, but the thread has no heap: the caller
                           * gets one (coral_heap_ready) and calls coral_remote_run_add
                           * again, or frees it the ordinary way */
} coral_run_result_t;

/* While the thread changes its run (busy set), a free that a signal
 * handler makes on the same thread must not touch it: the compiler keeps
 * the stores to busy where they are against the run's own (the handler
 * runs on this thread: a signal fence is enough). Also set while a thread
 * gets its heap for its first run (CORAL_RUN_NEEDS_HEAP: api/alloc.c). */
CORAL_INLINE void coral_remote_run_enter(coral_remote_run_t *r) {
    r->busy = 1;
    atomic_signal_fence(memory_order_seq_cst);
}

CORAL_INLINE void coral_remote_run_exit(coral_remote_run_t *r) {
    atomic_signal_fence(memory_order_seq_cst);
    r->busy = 0;
}

/* The slow part of coral_remote_run_free: p's page is the last free's. */
coral_run_result_t coral_remote_run_add(coral_page_t *page, void *p);

/* The slow part of coral_remote_run_free: a free into another page than
 * the last, with a run open or the run being changed (busy: nothing done). */
coral_run_result_t coral_remote_run_leave(const coral_page_t *page);
/* Push the calling thread's open run, if any (not while it is changed). */
void coral_remote_runs_flush(void);

/* A free of p, a block of page in a normal segment another thread owns
 * (the open run, of another page, pushed first when it goes no run). */
CORAL_INLINE coral_run_result_t coral_remote_run_free(coral_page_t *page, void *p) {
    coral_remote_run_t *r = &coral_remote_run_tls;
    if (coral_likely(page != r->last)) {
        if (coral_unlikely(r->n_busy != 0)) return coral_remote_run_leave(page);
        r->last = page;
        r->streak = 0;
        return CORAL_RUN_NOT_HELD;
    }
    return coral_remote_run_add(page, p);
}

#endif /* CORAL_REMOTE_RUN_H */
