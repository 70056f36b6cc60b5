/* The secure build's quarantine (heap.h): blocks a heap's owner freed wait
 * in a small per-heap set before they go back to their pages.
 *
 * Why: a page reuses its freed blocks last in, first out, so a block
 * freed and then written (a write after free) that is not handed out
 * again soon was never checked. Here every block leaves within a bounded
 * number of frees, in a random order, and its fill and freed mark are
 * checked as it leaves (page layer, coral_secure_quarantine_leave); a big
 * block waits inaccessible (a read after free faults).
 *
 * Owner only: remote frees go to their page's thread_free as before (a
 * block of another thread's heap held here could outlive that heap's
 * destroy). Every step leaves the set consistent before a block goes back
 * to its page, since that may release a span, start the purge thread and
 * so allocate and free again on this thread (a nested put). */
#include <stdatomic.h>

#include "heap/heap.h"

#if CORAL_SECURE

__thread uint8_t coral_tls_popping __attribute__((tls_model("initial-exec")));

/* A draw uniform in 0..n-1 (n >= 1) from the heap's xorshift generator,
 * seeded from the page layer's secret generator on first use. */
static uint32_t quarantine_draw(coral_quarantine_t *q, uint32_t n) {
    uint64_t x = q->draw;
    if (coral_unlikely(x == 0))
        x = ((uint64_t)coral_secure_next_epoch() << 32 | coral_secure_next_epoch()) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    q->draw = x;
    return (uint32_t)(((x >> 32) * n) >> 32);
}

/* Slot i leaves the set (the last slot takes its place), then its block
 * is checked and goes back to its page. */
static void quarantine_release(coral_quarantine_t *q, uint32_t i) {
    coral_block_t *block = q->blocks[i];
    coral_page_t *page = q->pages[i];
    q->count--;
    q->blocks[i] = q->blocks[q->count];
    q->pages[i] = q->pages[q->count];
    q->bytes -= page->block_size;
    coral_secure_quarantine_leave(page, (uint8_t *)block);
    coral_heap_free_local_now(page, block);
}

/* busy is set while the set is being changed or a block leaving it goes
 * back: a free nested in that (a signal handler's, or the purge thread's
 * start allocating) goes straight back to its page instead, so no slot is
 * ever taken twice. The compiler keeps the flag's stores around the
 * changes (signal fences). So does a free (a handler's) nested in this
 * thread's pop of a free list (coral_tls_popping, heap.h), and a flush
 * there leaves the blocks where they are: no list changes under the pop. */
static bool quarantine_enter_busy(coral_quarantine_t *q) {
    if (q->busy || q->closed || coral_tls_popping != 0) return false;
    q->busy = true;
    atomic_signal_fence(memory_order_seq_cst);
    return true;
}

static void quarantine_leave_busy(coral_quarantine_t *q) {
    atomic_signal_fence(memory_order_seq_cst);
    q->busy = false;
}

void coral_heap_quarantine_put(coral_page_t *page, coral_block_t *block) {
    coral_heap_t *heap = coral_page_heap(page);
    if (coral_unlikely(heap == NULL || !quarantine_enter_busy(&heap->quarantine))) {
        coral_heap_free_local_now(page, block);
        return;
    }
    coral_quarantine_t *q = &heap->quarantine;
    size_t bytes = page->block_size;
    coral_secure_quarantine_enter(page, (uint8_t *)block);
    while (q->count == CORAL_QUARANTINE_SLOTS ||
           (q->count != 0 && q->bytes + bytes > CORAL_QUARANTINE_BYTES))
        quarantine_release(q, quarantine_draw(q, q->count));
    q->blocks[q->count] = block;
    q->pages[q->count] = page;
    q->count++;
    q->bytes += bytes;
    quarantine_leave_busy(q);
}

void coral_heap_quarantine_flush(coral_heap_t *heap, bool close) {
    coral_quarantine_t *q = &heap->quarantine;
    if (!quarantine_enter_busy(q)) return; /* (nested in a put: it goes on after) */
    while (q->count != 0) quarantine_release(q, q->count - 1);
    if (close) q->closed = true;
    quarantine_leave_busy(q);
}

#else
void coral_heap_quarantine_put(coral_page_t *page, coral_block_t *block) {
    coral_heap_free_local_now(page, block);
}
void coral_heap_quarantine_flush(coral_heap_t *heap, bool close) {
    (void)heap;
    (void)close;
}
#endif
