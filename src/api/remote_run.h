/* Runs of remote frees (the default build): a thread's frees of blocks that
 * other threads own, held back per page and pushed onto the page's
 * thread_free with one CAS per run instead of one per block.
 *
 * Why: a remote free writes its link into the block (the block's line was
 * last written by the thread that allocated it, on another core) and then
 * pushes with a locked CAS, which waits for that store to leave the store
 * buffer: one cache miss paid in full per free. Linked into a run with
 * plain stores, the misses of many frees overlap, and the run's one CAS
 * pays for all of them.
 *
 * Which frees (remote_run.c decides): blocks of a size class of a thread's
 * own heap (not a user heap: coral_heap_destroy frees its pages whatever
 * is live; not a page with aligned blocks; not large or huge blocks), by a
 * thread that has a heap (its exit flushes the runs; a thread that only
 * frees gets one at its first such free) and whose exit has not begun.
 *
 * The runs: CORAL_RUN_SLOTS per thread, a page's run in the slot its
 * descriptor's address picks. A run is pushed when a free of another page
 * needs its slot, when it holds CORAL_RUN_MAX blocks, when its thread
 * exits (the thread-exit hook), and at coral_collect / malloc_trim. So a
 * thread that goes idle holds at most CORAL_RUN_SLOTS * CORAL_RUN_MAX
 * freed blocks back from their pages until it frees, collects or exits;
 * a forked child's threads but the forking one never push theirs (their
 * blocks stay in use in the child).
 *
 * Invariants, who writes what:
 *   - a block in a run is counted in its page's `used` (not yet on
 *     thread_free), so its page is neither released nor reset while the
 *     run holds it: the push is always into the same page;
 *   - only the run's thread reads or writes a run and its blocks' words
 *     (link, mark) until the push; the push (coral_page_push_remote_run)
 *     publishes them with the CAS's release;
 *   - a block in a run holds CORAL_PENDING_MARK in its mark word, not the
 *     freed mark: nothing but a misuse changes it before the push (the
 *     block is on no list the owner reads, so no malloc hands it out), and
 *     the push checks it block by block and writes the freed mark. A
 *     second free of the block meanwhile, by any thread, is so caught:
 *     the run's thread sees the pending mark and finds the block in its
 *     own runs (reported at once); another thread or the owner overwrites
 *     the pending mark (another thread pushes it at once with SUSPECT) and
 *     the run's push finds the word changed (reported then, before the
 *     block can be pushed twice). A write after free into the word is
 *     reported the same way. */
#ifndef CORAL_REMOTE_RUN_H
#define CORAL_REMOTE_RUN_H

#include "heap/heap.h"

#define CORAL_RUN_SLOTS 8u
#define CORAL_RUN_MAX 32u

/* A free of p, a block of page in a segment another thread owns, by a
 * thread with a heap whose exit has not begun (the caller checked both,
 * and that the segment is a normal one): true when p went into a run (or
 * was reported as a double free), false when the caller frees it the
 * ordinary way. */
bool coral_remote_run_add(coral_page_t *page, void *p);
/* Push every run of the calling thread. */
void coral_remote_runs_flush(void);

#endif /* CORAL_REMOTE_RUN_H */
