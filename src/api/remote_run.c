/* Runs of remote frees: what remote_run.h says, and the push's checks. */
#include "api/remote_run.h"

#include "api/api.h"

typedef struct run_s {
    coral_page_t *page;  /* NULL: the slot is empty */
    coral_block_t *head; /* freed last; its link leads to the earlier ones */
    coral_block_t *tail; /* freed first; linked by the push */
    uint32_t n;
} run_t;

/* The calling thread's runs: only it reads or writes them. */
static __thread run_t runs[CORAL_RUN_SLOTS] __attribute__((tls_model("initial-exec")));

/* A page's slot: pages are descriptors in their segment's header, so the
 * pages of one segment fall in different slots. */
static inline run_t *slot_of(const coral_page_t *page) {
    return &runs[((uintptr_t)page / sizeof(coral_page_t)) % CORAL_RUN_SLOTS];
}

/* A block of the run changed while the run held it: freed again (by the
 * owner, or by another thread that then pushed it), or written after its
 * free. */
static CORAL_COLD void run_block_changed(const coral_page_t *page, const coral_block_t *block) {
    coral_misuse("double free detected: block %p of %zu bytes was freed again (or written) "
                 "while its first free was pending",
                 (const void *)block, page->block_size);
}

/* Push run r onto its page's thread_free, each block's pending mark
 * checked and turned into the freed mark. A changed block is reported
 * (when the program goes on after a report: CORALLOC_ON_ERROR) and the run
 * is cut before it: the blocks linked after it cannot be reached (its
 * link may be another list's now), so they stay in use for their page,
 * and it is on whichever list its second free put it. The run's slot is
 * empty after. */
static void run_push(run_t *r) {
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
    if (n != 0) coral_page_push_remote_run(r->page, r->head, last, n, 0);
    r->page = NULL;
    r->n = 0;
}

void coral_remote_runs_flush(void) {
    for (unsigned i = 0; i < CORAL_RUN_SLOTS; i++)
        if (runs[i].n != 0) run_push(&runs[i]);
}

/* Whether one of the calling thread's runs holds block. */
static bool runs_hold(const coral_block_t *block) {
    for (unsigned i = 0; i < CORAL_RUN_SLOTS; i++) {
        const coral_block_t *b = runs[i].head;
        for (uint32_t k = 0; k < runs[i].n; k++, b = coral_block_next(b))
            if (b == block) return true;
    }
    return false;
}

/* A block whose mark word holds the pending mark: in a run of this thread
 * (a double free, reported), of another thread (a double free that run's
 * push reports), or the program's data. The latter two: pushed now,
 * alone, with SUSPECT, its freed mark written (which the other run's push
 * then finds). */
static CORAL_COLD void pending_block_free(coral_page_t *page, coral_block_t *block) {
    if (runs_hold(block)) {
        coral_misuse("double free detected: block %p of %zu bytes was already free", (void *)block,
                     page->block_size);
        return;
    }
    *coral_block_mark_word(block) = CORAL_FREED_MARK;
    coral_page_push_remote_marked(page, block, CORAL_TF_SUSPECT);
}

bool coral_remote_run_add(coral_page_t *page, void *p) {
    if (!CORAL_FREED_MARKS) return false;
    if (page->class_idx == CORAL_CLASS_LARGE || page->is_user_heap ||
        (coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED) || !coral_page_is_block_start(page, p))
        return false;
    /* A page the purger reclaims or returns holds no live block: the
     * ordinary push reports the free. */
    if (coral_unlikely(atomic_load_explicit(&page->thread_free, memory_order_relaxed) &
                       (CORAL_TF_RECLAIMED | CORAL_TF_BUSY)))
        return false;
    coral_block_t *block = p;
    uintptr_t *word = coral_block_mark_word(block);
    /* The freed mark: the block may be free already; the ordinary push
     * (SUSPECT) lets the owner tell. */
    if (coral_unlikely(*word == CORAL_FREED_MARK)) return false;
    if (coral_unlikely(*word == CORAL_PENDING_MARK)) {
        pending_block_free(page, block);
        return true;
    }
    run_t *r = slot_of(page);
    if (r->page != page) {
        if (r->n != 0) run_push(r);
        r->page = page;
        r->head = NULL;
        r->tail = block;
    }
    *word = CORAL_PENDING_MARK;
    coral_block_set_next(block, r->head);
    r->head = block;
    if (++r->n == CORAL_RUN_MAX) run_push(r);
    return true;
}
