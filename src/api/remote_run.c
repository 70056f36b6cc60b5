/* Runs of remote frees: what remote_run.h says, and the push's checks. */
#include "api/remote_run.h"

#include "api/api.h"

__thread coral_remote_run_t coral_remote_run_tls __attribute__((tls_model("initial-exec")));

/* A block of the run changed while the run held it: freed again (by the
 * owner, or by another thread that then pushed it), or written after its
 * free. */
static CORAL_COLD void run_block_changed(const coral_page_t *page, const coral_block_t *block) {
    coral_misuse("double free detected: block %p of %zu bytes was freed again (or written) "
                 "while its first free was pending",
                 (const void *)block, page->block_size);
}

/* Push the open run onto its page's thread_free, each block's pending mark
 * checked and turned into the freed mark. A changed block is reported
 * (when the program goes on after a report: CORALLOC_ON_ERROR) and the run
 * is cut before it: the blocks linked after it cannot be reached (its
 * link may be another list's now), so they stay in use for their page,
 * and it is on whichever list its second free put it. No run is open
 * after. Busy. Not inlined: one copy for its three callers (the resident
 * window, cmake/hot-text.ld, has no room for more). */
static CORAL_NOINLINE void run_push(coral_remote_run_t *r) {
    coral_block_t *block = r->head, *last = NULL;
    uint32_t n = 0;
    while (n < r->n) {
        uintptr_t *word = coral_block_mark_word(block);
        if (coral_unlikely(*word != CORAL_PENDING_MARK)) {
            run_block_changed(r->page, block);
            break;
        }
        *word = CORAL_FREED_MARK;
        last = block;
        if (++n < r->n) block = coral_block_next(block);
    }
    if (n != 0) coral_page_push_remote_run(r->page, r->head, last, n, r->seen);
    r->page = NULL;
    r->n = 0;
    r->streak = CORAL_RUN_OPEN; /* the stretch of frees into `last` goes on in a new run */
}

void coral_remote_runs_flush(void) {
    coral_remote_run_t *r = &coral_remote_run_tls;
    if (r->n_busy != 0 && !r->busy) {
        coral_remote_run_enter(r);
        run_push(r);
        coral_remote_run_exit(r);
    }
}

coral_run_result_t coral_remote_run_leave(const coral_page_t *page) {
    coral_remote_run_t *r = &coral_remote_run_tls;
    if (r->busy) return CORAL_RUN_NOT_HELD;
    coral_remote_run_enter(r);
    if (r->n != 0) run_push(r);
    r->last = page;
    r->streak = 0;
    coral_remote_run_exit(r);
    return CORAL_RUN_NOT_HELD;
}

/* Whether the open run holds block. */
static bool run_holds(const coral_block_t *block) {
    const coral_remote_run_t *r = &coral_remote_run_tls;
    const coral_block_t *b = r->head;
    for (uint32_t k = 0; k < r->n; k++, b = coral_block_next(b))
        if (b == block) return true;
    return false;
}

/* A block whose mark word holds the pending mark: in the open run (a
 * double free, reported), in another thread's run (a double free that
 * run's push reports), or the program's data. The latter two: pushed now,
 * alone, with SUSPECT, its freed mark written (which the other run's push
 * then finds). */
static CORAL_COLD void pending_block_free(coral_page_t *page, coral_block_t *block) {
    if (run_holds(block)) {
        coral_misuse("double free detected: block %p of %zu bytes was already free", (void *)block,
                     page->block_size);
        return;
    }
    *coral_block_mark_word(block) = CORAL_FREED_MARK;
    coral_page_push_remote_marked(page, block, CORAL_TF_SUSPECT);
}

/* Whether the calling thread may open a run on page (the page of its last
 * remote free, no run open): NOT_HELD before the CORAL_RUN_OPEN-th free in
 * a row into it, when page's blocks may not be held (remote_run.h), or
 * when the page's word says the purger reclaims or returns it (it holds no
 * live block: the ordinary push reports the free); NEEDS_HEAP for a thread
 * with no heap (the streak kept, so that the caller's call again opens the
 * run). While a run holds a block of the page, the page has one in use, so
 * this is looked at once per run. *seen: the page's word, read (acquire)
 * before the caller reads the first block's mark. */
static coral_run_result_t run_may_open(coral_page_t *page, uintptr_t *seen) {
    coral_remote_run_t *r = &coral_remote_run_tls;
    if (r->streak < CORAL_RUN_OPEN - 2) {
        r->streak++;
        return CORAL_RUN_NOT_HELD;
    }
    if (page->class_idx == CORAL_CLASS_LARGE || page->is_user_heap ||
        (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED)) {
        r->streak = 0; /* (tried again after as many frees) */
        return CORAL_RUN_NOT_HELD;
    }
    if (coral_tls_heap == &coral_heap_empty) return CORAL_RUN_NEEDS_HEAP;
    r->streak = 0;
    *seen = atomic_load_explicit(&page->thread_free, memory_order_acquire);
    if (*seen & (CORAL_TF_RECLAIMED | CORAL_TF_BUSY)) return CORAL_RUN_NOT_HELD;
    /* An aside page: not its last live blocks (remote_run.h). `used` read
     * after the acquire load that saw ASIDE, as the purger reads it: at
     * least its value now. */
    if ((*seen & CORAL_TF_ASIDE) &&
        (int64_t)coral_page_aside_used(page) - coral_tf_count(*seen) <= (int64_t)CORAL_RUN_MAX)
        return CORAL_RUN_NOT_HELD;
    return CORAL_RUN_HELD;
}

/* coral_remote_run_add, busy. */
static coral_run_result_t run_add(coral_remote_run_t *r, coral_page_t *page, void *p) {
    uintptr_t seen = 0;
    bool open = page != r->page;
    if (open) {
        /* A run of another page is open only when a signal handler's free
         * opened it between the caller's look at `last` and its call. */
        if (coral_unlikely(r->n != 0)) run_push(r);
        coral_run_result_t may = run_may_open(page, &seen);
        if (may != CORAL_RUN_HELD) return may;
    }
    /* (The ordinary free reports a pointer that is no block's start.) */
    if (!coral_page_is_block_start(page, p)) return CORAL_RUN_NOT_HELD;
    coral_block_t *block = p;
    uintptr_t *word = coral_block_mark_word(block);
    uintptr_t mark = *word;
    coral_test_point(CORAL_TP_REMOTE_RUN_MARK_READ, block);
    /* The freed mark, or the carve's (a block never handed out): the block
     * may be free already; the ordinary push (SUSPECT) lets the owner tell. */
    if (coral_unlikely(coral_mark_low_freed((uint32_t)mark))) return CORAL_RUN_NOT_HELD;
    if (coral_unlikely(mark == CORAL_PENDING_MARK)) {
        pending_block_free(page, block);
        return CORAL_RUN_HELD;
    }
    if (open) {
        r->page = page;
        r->head = NULL;
        r->seen = seen;
    }
    *word = CORAL_PENDING_MARK;
    coral_test_point(CORAL_TP_REMOTE_RUN_LINKING, block);
    coral_block_set_next(block, r->head);
    r->head = block;
    if (++r->n == CORAL_RUN_MAX) run_push(r);
    return CORAL_RUN_HELD;
}

coral_run_result_t coral_remote_run_add(coral_page_t *page, void *p) {
    if (!CORAL_FREED_MARKS) return CORAL_RUN_NOT_HELD;
    coral_remote_run_t *r = &coral_remote_run_tls;
    if (r->busy) return CORAL_RUN_NOT_HELD; /* a signal handler's free, nested in a change */
    coral_remote_run_enter(r);
    coral_run_result_t got = run_add(r, page, p);
    coral_remote_run_exit(r);
    return got;
}
