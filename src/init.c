/* Process and thread set-up, thread exit, fork, diagnostics.
 *
 * Start-up runs on the first allocation of the process, from static memory
 * and without allocating: under LD_PRELOAD that call can come from the
 * dynamic loader or libc before they are fully up. A thread's heap is made
 * on its first allocation; a pthread key's destructor abandons it when the
 * thread exits. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "options.h"
#include "stash.h"
#include "stats.h"

__thread coral_heap_t *coral_tls_heap __attribute__((tls_model("initial-exec"))) =
    &coral_heap_empty;

coral_page_t coral_page_empty; /* free == NULL forever */
coral_heap_t coral_heap_empty = {.direct = {[0 ... CORAL_DIRECT_COUNT - 1] = &coral_page_empty}};

/* ---- diagnostics -------------------------------------------------------------- */

static void write_line(const char *prefix, const char *fmt, va_list ap) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, buf, len);
    (void)ignored;
}

void coral_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_line("coralloc: error: ", fmt, ap);
    va_end(ap);
    abort();
}

void coral_message(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_line("coralloc: ", fmt, ap);
    va_end(ap);
}

uint64_t coral_clock_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the heap pool: heap structs for threads (and user heaps) ---------------------- */

static pthread_mutex_t heap_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_heap_t *heap_pool_free;
static uint8_t *heap_pool_carve; /* the rest of the latest mapping, not yet handed out */
static size_t heap_pool_carve_left;
static coral_heap_t *heaps_live; /* every heap handed out, for statistics */

/* Run fn on every live heap, under the pool lock (statistics). */
void coral_heaps_visit(coral_heap_visit_fn fn, void *arg) {
    pthread_mutex_lock(&heap_pool_lock);
    for (coral_heap_t *h = heaps_live; h != NULL; h = h->all_next) fn(h, arg);
    pthread_mutex_unlock(&heap_pool_lock);
}

/* A heap's counts outlive it in the global totals. */
static void heap_stats_retire(coral_heap_t *heap) {
    for (int c = 0; c < CORAL_QUEUE_COUNT && CORAL_STATS_ENABLED; c++) {
        atomic_fetch_add_explicit(&coral_gstats.class_allocs[c], (int64_t)heap->stat_allocs[c],
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&coral_gstats.class_frees[c], (int64_t)heap->stat_frees[c],
                                  memory_order_relaxed);
    }
}

coral_heap_t *coral_heap_pool_get(void) {
    pthread_mutex_lock(&heap_pool_lock);
    /* Heaps are carved from 64 KiB mappings one at a time, when needed:
     * carving them all at once would touch (fault in) every page. */
    size_t chunk = 16 * CORAL_OS_PAGE_SIZE, each = (sizeof(coral_heap_t) + 63) & ~(size_t)63;
    if (heap_pool_free == NULL && heap_pool_carve_left < each) {
        heap_pool_carve = coral_os_map(chunk);
        heap_pool_carve_left = heap_pool_carve != NULL ? chunk : 0;
    }
    coral_heap_t *heap = heap_pool_free;
    if (heap) {
        heap_pool_free = heap->next_heap;
    } else if (heap_pool_carve_left >= each) {
        heap = (coral_heap_t *)heap_pool_carve;
        heap_pool_carve += each;
        heap_pool_carve_left -= each;
    }
    if (heap) {
        memset(heap, 0, sizeof *heap);
        heap->all_next = heaps_live;
        if (heaps_live) heaps_live->all_prev = heap;
        heaps_live = heap;
    }
    pthread_mutex_unlock(&heap_pool_lock);
    return heap;
}

void coral_heap_pool_put(coral_heap_t *heap) {
    pthread_mutex_lock(&heap_pool_lock);
    heap_stats_retire(heap);
    if (heap->all_prev) heap->all_prev->all_next = heap->all_next;
    else heaps_live = heap->all_next;
    if (heap->all_next) heap->all_next->all_prev = heap->all_prev;
    heap->next_heap = heap_pool_free;
    heap_pool_free = heap;
    pthread_mutex_unlock(&heap_pool_lock);
}

/* ---- fork -------------------------------------------------------------------------------
 * The child has one thread (the forking one); every lock must be free in it.
 * The other threads' heaps stay as they were: their blocks remain valid and
 * can be freed (as remote frees) in the child. */

static void fork_prepare(void) {
    coral_purger_prefork();
    pthread_mutex_lock(&heap_pool_lock);
    coral_segment_locks_prefork();
    coral_huge_locks_prefork();
    coral_orphans_prefork();
}

static void fork_unlock(bool child) {
    coral_orphans_postfork(child);
    coral_huge_locks_postfork();
    coral_segment_locks_postfork();
    pthread_mutex_unlock(&heap_pool_lock);
    coral_purger_postfork(child);
}

static void fork_parent(void) { fork_unlock(false); }

static void fork_child(void) {
    fork_unlock(true);
    coral_heap_t *heap = coral_tls_heap;
    if (heap == &coral_heap_empty) return;
    for (coral_heap_t *h = heap->tld->heaps; h != NULL; h = h->next_heap)
        coral_heap_after_fork_child(h);
}

/* ---- process start-up ------------------------------------------------------------------- */

static pthread_key_t thread_key;
static _Atomic(int) process_state; /* 0: not started, 1: starting, 2: ready */
static _Atomic(int) fork_handlers_state;

static void show_stats_at_exit(void) { coral_stats_print_to(stderr); }

static void process_init(void) {
    if (atomic_load_explicit(&process_state, memory_order_acquire) == 2) return;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&process_state, &expected, 1)) {
        while (atomic_load_explicit(&process_state, memory_order_acquire) != 2) sched_yield();
        return;
    }
    coral_options_init(); /* reads the environment; does not allocate */
    if (pthread_key_create(&thread_key, coral_thread_done) != 0)
        coral_message("pthread_key_create failed: heaps of exiting threads are not reclaimed");
    atomic_store_explicit(&process_state, 2, memory_order_release);
}

/* Set-up that may allocate: done once the first heap exists. */
static void process_init_late(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&fork_handlers_state, &expected, 1)) return;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (coral_option(CORAL_OPT_SHOW_STATS)) atexit(show_stats_at_exit);
    if (coral_option(CORAL_OPT_VERBOSE)) coral_options_print();
}

/* Make sure the process is set up (options read) without allocating. */
void coral_malloc_ready(void) { process_init(); }

/* ---- threads ----------------------------------------------------------------------------- */

coral_heap_t *coral_thread_init(void) {
    process_init();
    coral_heap_t *heap = coral_heap_pool_get();
    if (heap == NULL) return NULL;
    coral_tld_t *tld = &heap->tld_storage;
    tld->thread_id = coral_thread_id();
    tld->heap_default = heap;
    tld->heaps = heap;
    tld->small_segment = NULL;
    coral_heap_init(heap, tld);
    heap->is_default = true;
    coral_tls_heap = heap;
    pthread_setspecific(thread_key, heap);
    coral_stat_gauge(&coral_gstats.threads, &coral_gstats.threads_peak, 1);
    process_init_late();
    return heap;
}

/* The pthread key's destructor: the thread is exiting. */
void coral_thread_done(void *value) {
    coral_heap_t *heap = value;
    if (heap == NULL || heap != coral_tls_heap) return;
    coral_tld_t *tld = heap->tld;
    /* The bulk cache first: its blocks go back to pages the thread still owns. */
    coral_stash_t *stash = coral_stash_thread_exit(heap);
    for (coral_heap_t *h = tld->heaps; h != NULL; h = h->next_heap) coral_heap_abandon(h);
    coral_segments_abandon(tld);
    coral_tls_heap = &coral_heap_empty;
    coral_heap_t *h = tld->heaps;
    while (h != NULL) {
        coral_heap_t *next = h->next_heap;
        if (h != heap) coral_heap_pool_put(h);
        h = next;
    }
    atomic_store_explicit(&heap->stash, NULL, memory_order_relaxed);
    coral_heap_pool_put(heap); /* last: it holds the tld */
    coral_stash_unmap(stash);  /* the heap left the registry: no purger sees the stash */
    coral_stat_count(&coral_gstats.threads, -1);
    coral_purger_start_if_wanted();
}
