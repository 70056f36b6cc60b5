/* Memory goes back to the OS: after a burst of small, large and huge blocks
 * is freed, resident memory falls back near where it started
 *   - once the purge delay has passed, with no call from the program: the
 *     background purge thread does it (CORALLOC_PURGE_DELAY_MS=100; the
 *     test moves coralloc's clock past the delay and waits for the thread's
 *     next pass: coral_test_advance_clock, coral_test_purge_pass);
 *   - at once on coral_collect(1), with the purge thread off.
 * The purge thread starts only once 1 MiB or more waits to be purged.
 * Until it is purged, freed memory is reused by any later segment (the
 * chunk pool): a freed huge block's pages serve normal segments, several
 * freed huge blocks' pages are moved under one bigger block, and a huge
 * block grows in place into pooled chunks right after it, and a pooled
 * region never counts pages as resident that are not (its partly touched
 * end stays apart from a dirty neighbour). And a new page of small blocks
 * touches only its first OS page for its first blocks, and goes to the
 * segment of the thread's other small pages, not to the newest segment,
 * which large blocks then hand back to the pool whole.
 * And the huge-page policy: a small program's segment keeps 4 KiB pages,
 * a thread's further segments get huge pages while it writes its pages
 * densely (not when it touches one page of each 64 KiB block), a huge
 * block gets them (its resident pages not advised again when it is reused;
 * a 2 MiB page it would fill less than half of not advised at all),
 * a process whose huge pages are slow to fault in stops
 * asking for them, and CORALLOC_HUGE_PAGES=0 advises nothing.
 * Each case runs in a child process with its options in the environment.
 * RSS figures are only meaningful without a sanitizer: release only. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "proc.h"
#include "stats_json.h"
#include "testutil.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum { SMALL = 1 << 20, LARGE = 96, HUGE = 8 };
static void *small[SMALL], *large[LARGE], *huge[HUGE];

/* About 64 MiB of small blocks, 96 MiB of large and 80 MiB of huge ones. */
static void burst(void) {
    tu_rng rng = {7};
    for (size_t i = 0; i < SMALL; i++) {
        size_t n = rng_range(&rng, 16, 112);
        small[i] = coral_malloc(n);
        CHECK_NOT_NULL(small[i]);
        memset(small[i], 1, n);
    }
    for (size_t i = 0; i < LARGE; i++) {
        large[i] = coral_malloc(MiB);
        CHECK_NOT_NULL(large[i]);
        memset(large[i], 2, MiB);
    }
    for (size_t i = 0; i < HUGE; i++) {
        huge[i] = coral_malloc(10 * MiB);
        CHECK_NOT_NULL(huge[i]);
        memset(huge[i], 3, 10 * MiB);
    }
}

static void release(void) {
    /* Scrambled order, so pages empty at different times. */
    for (size_t i = 0; i < SMALL; i++) coral_free(small[(i * 7919) % SMALL]);
    for (size_t i = 0; i < LARGE; i++) coral_free(large[i]);
    for (size_t i = 0; i < HUGE; i++) coral_free(huge[i]);
}

static int child_background(void) {
    coral_free(coral_malloc(1)); /* set up */
    size_t before = rss_mib();
    burst();
    size_t peak = rss_mib();
    CHECK_GE(peak, before + 200);
    release();
    /* Past the delay the burst is still within the demand window (4
     * delays): the program used it lately, so it is kept... */
    coral_test_advance_clock(100);
    CHECK_EQ(coral_test_purge_pass(), 1); /* the purge thread runs */
    size_t kept = rss_mib();
    CHECK_GE(kept, before + 150);
    /* ...and once the window has moved past it, it goes back. */
    coral_test_advance_clock(4 * 100 + 100);
    CHECK_EQ(coral_test_purge_pass(), 1);
    size_t after = rss_mib();
    printf("background purge: RSS %zu -> %zu -> %zu (delay) -> %zu MiB (window)\n", before, peak,
           kept, after);
    CHECK_LE(after, before + 24);
    /* Purged memory reads as zero again. */
    char *p = coral_calloc(1, 4 * MiB - 100 * 1024);
    for (size_t i = 0; i < 4 * MiB - 100 * 1024; i += 4096) CHECK_EQ(p[i], 0);
    coral_free(p);
    return 0;
}

/* Blocks of every class above 64 KiB (8 a page below 128 KiB, then one),
 * written and freed: their pages, the first of each class's queue
 * included, go back once the delay has passed, with no call from this
 * thread (a kept first page of each class held them for good). */
static int child_big_classes(void) {
    coral_free(coral_malloc(1));
    size_t before = rss_kib();
    enum { SIZES = 22 };
    void *blocks[SIZES];
    for (size_t i = 0; i < SIZES; i++) {
        size_t n = (80 + 20 * i) * KiB; /* 80-500 KiB: 22 classes */
        blocks[i] = coral_malloc(n);
        CHECK_NOT_NULL(blocks[i]);
        memset(blocks[i], 7, n);
    }
    size_t peak = rss_kib();
    CHECK_GE(peak, before + 5 * 1024);
    for (size_t i = 0; i < SIZES; i++) coral_free(blocks[i]);
    /* The delay, then the demand window from the pass that saw the peak. */
    coral_test_advance_clock(100);
    CHECK_EQ(coral_test_purge_pass(), 1);
    coral_test_advance_clock(5 * 100);
    CHECK_EQ(coral_test_purge_pass(), 1);
    size_t after = rss_kib();
    printf("big classes: RSS %zu -> %zu -> %zu KiB once the delay passed\n", before, peak, after);
    CHECK_LE(after, before + 1024);
    return 0;
}

/* A block of a class of 128 KiB or more (160 KiB here) has a page of its own:
 * freed while another block of its class lives, its span
 * goes back to its segment at once (free slices, which any span reuses
 * and the purger returns). A page of 8 such blocks stayed whole while one
 * of them lived, the freed blocks' memory resident. */
static int child_big_class_page(void) {
    void *a = coral_malloc(160 * KiB), *b = coral_malloc(160 * KiB);
    CHECK_NOT_NULL(a);
    CHECK_NOT_NULL(b);
    memset(a, 1, 160 * KiB);
    memset(b, 1, 160 * KiB);
    long long pages = stats_get("page_bytes");
    coral_free(a);
    CHECK_LE(stats_get("page_bytes"), pages - (long long)(160 * KiB));
    coral_free(b);
    return 0;
}

/* ---- empty pages a thread keeps, and an idle thread ------------------------------------
 * A thread fills pages of two classes and frees every block: of each class
 * the first page of the queue stays kept as it is, and the pages behind it
 * within the keep limit (3 of 64-byte blocks, 7 of 15 KiB blocks: 1,088 KiB
 * in all) are parked (page/page.c, "Parked pages"). The thread then makes
 * no call while the test moves the clock past the purge delay and waits for
 * the purge thread's pass: the parked pages' memory goes back; the first
 * pages stay resident. Before parking, every one of those pages stayed
 * resident for as long as the thread made no call. */

enum { KEPT_SMALL_N = 4 * 1024, KEPT_SMALL_SIZE = 64, KEPT_MID_N = 8 * 8 };
#define KEPT_MID_SIZE (15 * KiB) /* a class of 8 blocks a page, 2 slices */
#define KEPT_PARKED_BYTES ((3 + 7 * 2) * 64 * KiB)
static char *kept_small[KEPT_SMALL_N], *kept_mid[KEPT_MID_N];

/* blocks[0..n) = n calloc'd blocks of size bytes, each checked to read as
 * zero (a block of a page the purger took back is carved anew). */
static void calloc_checked(char **blocks, size_t n, size_t size) {
    for (size_t i = 0; i < n; i++) {
        CHECK_NOT_NULL(blocks[i] = coral_calloc(1, size));
        for (size_t b = 0; b < size; b++) CHECK_EQ(blocks[i][b], 0);
    }
}
/* The step a two-thread case has reached: one thread sets it, the other
 * waits for it (each case runs in a child process of its own, so the cases
 * share these). The kept-pages cases: 1: the thread freed its blocks; 2: it
 * may go on; 3: done. */
static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cond = PTHREAD_COND_INITIALIZER;
static int step_now;

static void step_set(int step) {
    pthread_mutex_lock(&step_lock);
    step_now = step;
    pthread_cond_broadcast(&step_cond);
    pthread_mutex_unlock(&step_lock);
}

static void step_wait(int step) {
    pthread_mutex_lock(&step_lock);
    while (step_now < step) pthread_cond_wait(&step_cond, &step_lock);
    pthread_mutex_unlock(&step_lock);
}

/* Allocate and write every block (pattern `fill`), in allocation order. */
static void kept_fill(int fill) {
    for (size_t i = 0; i < KEPT_SMALL_N; i++) {
        CHECK_NOT_NULL(kept_small[i] = coral_malloc(KEPT_SMALL_SIZE));
        memset(kept_small[i], fill, KEPT_SMALL_SIZE);
    }
    for (size_t i = 0; i < KEPT_MID_N; i++) {
        CHECK_NOT_NULL(kept_mid[i] = coral_malloc(KEPT_MID_SIZE));
        memset(kept_mid[i], fill, KEPT_MID_SIZE);
    }
}

static void kept_free(void) {
    for (size_t i = 0; i < KEPT_SMALL_N; i++) coral_free(kept_small[i]);
    for (size_t i = 0; i < KEPT_MID_N; i++) coral_free(kept_mid[i]);
}

/* OS pages of [p, p + n) resident now. */
static size_t resident_pages(const void *p, size_t n) {
    size_t os = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~(os - 1), hi = ((uintptr_t)p + n + os - 1) & ~(os - 1);
    static unsigned char vec[(1 << 20) / 4096 + 1];
    CHECK_LE((hi - lo) / os, sizeof vec);
    CHECK_EQ(mincore((void *)lo, hi - lo, vec), 0);
    size_t r = 0;
    for (size_t i = 0; i < (hi - lo) / os; i++) r += vec[i] & 1;
    return r;
}

/* Resident OS pages under the blocks of the parked pages: every page of
 * blocks but the last of each class (the first of its queue, kept). */
static size_t kept_parked_resident(void) {
    size_t r = 0;
    for (size_t i = 0; i < KEPT_SMALL_N - 1024; i += 1024)
        r += resident_pages(kept_small[i], 1024 * KEPT_SMALL_SIZE);
    for (size_t i = 0; i < KEPT_MID_N - 8; i += 8)
        r += resident_pages(kept_mid[i], 8 * KEPT_MID_SIZE);
    return r;
}

static void *kept_idle_thread(void *arg) {
    (void)arg;
    kept_fill(0xab);
    kept_free();
    step_set(1);
    step_wait(2); /* no call into the allocator meanwhile */
    /* Back: the same blocks again, from the pages the purger took (zero
     * memory, carved anew: calloc's blocks read as zero). */
    calloc_checked(kept_small, KEPT_SMALL_N, KEPT_SMALL_SIZE);
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 0; i < KEPT_SMALL_N; i++) coral_free(kept_small[i]);
    step_set(3);
    return NULL;
}

static int child_idle_kept(void) {
    coral_free(coral_malloc(1));
    long long reclaimed0 = stats_get("parked_bytes_reclaimed");
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, kept_idle_thread, NULL), 0);
    step_wait(1);
    size_t before = kept_parked_resident();
    CHECK_GE(before, (size_t)KEPT_PARKED_BYTES / 4096 / 2); /* the blocks were written */
    coral_test_advance_clock(3600 * 1000);                  /* past the delay, the thread idle */
    CHECK_EQ(coral_test_purge_pass(), 1);                   /* a pass of the purge thread */
    size_t after = kept_parked_resident();
    long long reclaimed = stats_get("parked_bytes_reclaimed") - reclaimed0;
    printf("idle thread: its parked pages %zu -> %zu OS pages resident, %lld KiB returned\n",
           before, after, reclaimed / 1024);
    CHECK_EQ(after, 0);
    CHECK_EQ(reclaimed, (long long)KEPT_PARKED_BYTES);
    /* The first page of each queue stays kept, resident. */
    CHECK_GT(resident_pages(kept_small[KEPT_SMALL_N - 1024], 1024 * KEPT_SMALL_SIZE), 0);
    step_set(2);
    step_wait(3);
    CHECK_EQ(pthread_join(t, NULL), 0);
    return 0;
}

/* A thread that uses its kept pages again within the delay keeps them: it
 * frees, reuses after most of the delay, frees again (the pages, still
 * listed, are parked again with one CAS each: RENEWED); a pass past the
 * first free's delay (not the second's) returns nothing, and the pages
 * stay resident. A pass a whole delay after that one returns them all: a
 * renewal puts a page off by one delay, not for good. The kept blocks,
 * dirty, are cleared by calloc. */
static int child_active_kept(void) {
    coral_free(coral_malloc(1));
    long long reclaimed0 = stats_get("parked_bytes_reclaimed");
    kept_fill(0xab);
    kept_free(); /* parked */
    coral_test_advance_clock(3000 * 1000);
    (void)coral_test_purge_pass(); /* not due yet */
    calloc_checked(kept_small, KEPT_SMALL_N, KEPT_SMALL_SIZE);
    for (size_t i = 0; i < KEPT_SMALL_N; i++) memset(kept_small[i], 0xcd, KEPT_SMALL_SIZE);
    for (size_t i = 0; i < KEPT_MID_N; i++)
        CHECK_NOT_NULL(kept_mid[i] = coral_malloc(KEPT_MID_SIZE));
    size_t before = kept_parked_resident();
    CHECK_EQ(coral_test_check(), 0);
    kept_free();                           /* parked again: due a delay from now */
    coral_test_advance_clock(1000 * 1000); /* the first free's delay is past */
    (void)coral_test_purge_pass();
    long long reclaimed = stats_get("parked_bytes_reclaimed") - reclaimed0;
    size_t after = kept_parked_resident();
    printf("active thread: %lld bytes of its kept pages returned, %zu -> %zu OS pages resident\n",
           reclaimed, before, after);
    CHECK_EQ(reclaimed, 0);
    CHECK_EQ(after, before);
    coral_test_advance_clock(3600 * 1000); /* a delay after the renewal */
    (void)coral_test_purge_pass();
    reclaimed = stats_get("parked_bytes_reclaimed") - reclaimed0;
    printf("a delay later: %lld KiB of its kept pages returned\n", reclaimed / 1024);
    CHECK_EQ(reclaimed, (long long)KEPT_PARKED_BYTES);
    return 0;
}

/* ---- pages set aside (page/page.c, "Aside pages") ---------------------------------------
 * A thread fills two pages of 256-byte blocks and part of a third, frees
 * one block of each full page itself (so those two go back to the class
 * queue behind the third, the first, with a block on their owner's own
 * list: no orphan, which needs every block on thread_free), and then waits
 * with no call into the allocator, while the main thread frees every other
 * block of the first page and all but one of the second's. A purge pass
 * past the delay returns the first page (not one of its OS pages resident,
 * its 64 KiB counted as returned), not the second (a block live) nor the
 * third (first in its queue). The thread comes back and allocates from all
 * three (zero memory where it was returned) and its heap checks out. */
enum { ASIDE_PER_PAGE = 256, ASIDE_N = 2 * ASIDE_PER_PAGE + 100, ASIDE_LIVE = 300 };
#define ASIDE_SIZE 256
static char *aside_blocks[ASIDE_N];

static void *aside_idle_thread(void *arg) {
    (void)arg;
    for (size_t i = 0; i < ASIDE_N; i++) {
        CHECK_NOT_NULL(aside_blocks[i] = coral_malloc(ASIDE_SIZE));
        memset(aside_blocks[i], 0xab, ASIDE_SIZE);
    }
    /* blocks 0-255 and 256-511 fill the first two pages */
    CHECK_EQ((size_t)(aside_blocks[ASIDE_PER_PAGE - 1] - aside_blocks[0]),
             (size_t)(ASIDE_PER_PAGE - 1) * ASIDE_SIZE);
    coral_free(aside_blocks[0]);
    coral_free(aside_blocks[ASIDE_PER_PAGE]);
    step_set(1);
    step_wait(2); /* no call into the allocator meanwhile */
    coral_free(aside_blocks[ASIDE_LIVE]);
    calloc_checked(aside_blocks, 2 * ASIDE_PER_PAGE, ASIDE_SIZE);
    CHECK_EQ(coral_test_check(), 0);
    for (size_t i = 0; i < ASIDE_N; i++) coral_free(aside_blocks[i]);
    step_set(3);
    return NULL;
}

static int child_idle_aside(void) {
    coral_free(coral_malloc(1));
    long long reclaimed0 = stats_get("aside_bytes_reclaimed");
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, aside_idle_thread, NULL), 0);
    step_wait(1);
    for (size_t i = 1; i < 2 * ASIDE_PER_PAGE; i++)
        if (i != ASIDE_PER_PAGE && i != ASIDE_LIVE) coral_free(aside_blocks[i]);
    const size_t page = ASIDE_PER_PAGE * ASIDE_SIZE;
    size_t before = resident_pages(aside_blocks[0], page);
    CHECK_EQ(before, page / 4096);
    coral_test_advance_clock(3600 * 1000); /* past the delay, the thread idle */
    (void)coral_test_purge_pass();
    size_t after = resident_pages(aside_blocks[0], page);
    long long reclaimed = stats_get("aside_bytes_reclaimed") - reclaimed0;
    printf("idle owner: its page freed by another thread %zu -> %zu OS pages resident, "
           "%lld KiB returned\n",
           before, after, reclaimed / 1024);
    CHECK_EQ(after, 0);
    CHECK_EQ(reclaimed, (long long)page);
    /* The page with a live block, and the first page of the queue, stay. */
    CHECK_EQ(resident_pages(aside_blocks[ASIDE_PER_PAGE], page), page / 4096);
    CHECK_GT(resident_pages(aside_blocks[2 * ASIDE_PER_PAGE], 100 * ASIDE_SIZE), 0);
    step_set(2);
    step_wait(3);
    CHECK_EQ(pthread_join(t, NULL), 0);
    return 0;
}

/* A page set aside again while listed (RENEWED), every block of which is
 * free by the purger's next look, and no push after: the look that clears
 * RENEWED keeps the page listed, and the next one, a delay later, returns
 * it. A thread fills a page of 256-byte blocks (A) and part of a second and
 * frees one block of A (A goes behind the second: aside); the main thread
 * frees another (listed). The thread comes back: it fills the second page,
 * so A becomes first, takes both blocks again and one more, so A goes to
 * the full queue and a new page comes first, and frees the first one:
 * A goes behind the new page, set aside again while listed. Then it idles;
 * the main thread frees A's other 255 blocks (no push lists A: it is
 * listed). A first pass past the delay returns nothing, a second one A. */
static char *renewed_blocks[ASIDE_PER_PAGE];

static void *aside_renewed_thread(void *arg) {
    (void)arg;
    for (size_t i = 0; i < ASIDE_PER_PAGE; i++)
        CHECK_NOT_NULL(renewed_blocks[i] = coral_malloc(ASIDE_SIZE));
    CHECK_EQ((size_t)(renewed_blocks[ASIDE_PER_PAGE - 1] - renewed_blocks[0]),
             (size_t)(ASIDE_PER_PAGE - 1) * ASIDE_SIZE);
    for (size_t i = 0; i < 100; i++) CHECK_NOT_NULL(coral_malloc(ASIDE_SIZE)); /* (kept) */
    coral_free(renewed_blocks[0]);
    step_set(1);
    step_wait(2); /* the main thread freed block 1 */
    char *p, *first = renewed_blocks[0];
    do { /* the second page's blocks, then A's (kept) */
        CHECK_NOT_NULL(p = coral_malloc(ASIDE_SIZE));
    } while (p < first || p >= first + ASIDE_PER_PAGE * ASIDE_SIZE);
    CHECK(p == renewed_blocks[0]);
    CHECK(coral_malloc(ASIDE_SIZE) == renewed_blocks[1]); /* taken from thread_free */
    CHECK_NOT_NULL(p = coral_malloc(ASIDE_SIZE));         /* A full: a new first page (kept) */
    CHECK(p < first || p >= first + ASIDE_PER_PAGE * ASIDE_SIZE);
    coral_free(renewed_blocks[0]); /* A set aside again, listed: RENEWED */
    step_set(3);
    step_wait(4); /* no call into the allocator meanwhile */
    CHECK_EQ(coral_test_check(), 0);
    step_set(5);
    return NULL;
}

static int child_idle_aside_renewed(void) {
    coral_free(coral_malloc(1));
    long long reclaimed0 = stats_get("aside_bytes_reclaimed");
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, aside_renewed_thread, NULL), 0);
    step_wait(1);
    coral_free(renewed_blocks[1]); /* lists A */
    step_set(2);
    step_wait(3);
    for (size_t i = 1; i < ASIDE_PER_PAGE; i++) coral_free(renewed_blocks[i]);
    const size_t page = ASIDE_PER_PAGE * ASIDE_SIZE;
    coral_test_advance_clock(3600 * 1000);
    (void)coral_test_purge_pass();
    size_t after1 = resident_pages(renewed_blocks[0], page);
    long long reclaimed1 = stats_get("aside_bytes_reclaimed") - reclaimed0;
    coral_test_advance_clock(3600 * 1000);
    (void)coral_test_purge_pass();
    size_t after2 = resident_pages(renewed_blocks[0], page);
    long long reclaimed2 = stats_get("aside_bytes_reclaimed") - reclaimed0;
    printf("idle owner, page set aside again: %zu, then %zu OS pages resident; %lld, then %lld "
           "KiB returned\n",
           after1, after2, reclaimed1 / 1024, reclaimed2 / 1024);
    CHECK_EQ(after1, page / 4096);
    CHECK_EQ(reclaimed1, 0);
    CHECK_EQ(after2, 0);
    CHECK_EQ(reclaimed2, (long long)page);
    step_set(4);
    step_wait(5);
    CHECK_EQ(pthread_join(t, NULL), 0);
    return 0;
}

/* ---- the demand window ------------------------------------------------------------------ */

/* A thread fills 32 MiB and frees it, then exits; a thread waiting to start
 * takes the same amount once the delay has passed and a purge pass has run.
 * The purge leaves that memory resident (the program's demand was that high
 * within the window), so the waiting thread faults none of it in again:
 * before the window, the pass purged the exited thread's segments from the
 * cache and the next thread faulted in every page anew (8,192 faults). */
enum { WINDOW_BLOCKS = 128 };
#define WINDOW_BLOCK (256 * KiB)
static pthread_mutex_t window_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t window_cond = PTHREAD_COND_INITIALIZER;
static bool window_go;

static void window_fill(void **blocks) {
    for (size_t i = 0; i < WINDOW_BLOCKS; i++) {
        blocks[i] = coral_malloc(WINDOW_BLOCK);
        CHECK_NOT_NULL(blocks[i]);
        memset(blocks[i], 9, WINDOW_BLOCK);
    }
}

static void *window_leaver(void *arg) {
    (void)arg;
    void *blocks[WINDOW_BLOCKS];
    window_fill(blocks);
    for (size_t i = 0; i < WINDOW_BLOCKS; i++) coral_free(blocks[i]);
    return NULL;
}

static long thread_minor_faults(void) {
    struct rusage ru;
    CHECK_EQ(getrusage(RUSAGE_THREAD, &ru), 0);
    return ru.ru_minflt;
}

static void *window_taker(void *arg) {
    pthread_mutex_lock(&window_lock);
    while (!window_go) pthread_cond_wait(&window_cond, &window_lock);
    pthread_mutex_unlock(&window_lock);
    long before = thread_minor_faults();
    void *blocks[WINDOW_BLOCKS];
    window_fill(blocks);
    *(long *)arg = thread_minor_faults() - before;
    for (size_t i = 0; i < WINDOW_BLOCKS; i++) coral_free(blocks[i]);
    return NULL;
}

static int child_window(void) {
    coral_free(coral_malloc(1));
    long faults = -1;
    pthread_t taker, leaver;
    CHECK_EQ(pthread_create(&taker, NULL, window_taker, &faults), 0);
    CHECK_EQ(pthread_create(&leaver, NULL, window_leaver, NULL), 0);
    CHECK_EQ(pthread_join(leaver, NULL), 0);
    long long purged = stats_os_bytes("purge");
    coral_test_advance_clock(100); /* the leaver's memory is due */
    CHECK_EQ(coral_test_purge_pass(), 1);
    long long purged_now = stats_os_bytes("purge") - purged;
    pthread_mutex_lock(&window_lock);
    window_go = true;
    pthread_cond_broadcast(&window_cond);
    pthread_mutex_unlock(&window_lock);
    CHECK_EQ(pthread_join(taker, NULL), 0);
    printf("demand window: %lld KiB purged past the delay; the next thread took 32 MiB with %ld "
           "faults\n",
           purged_now >> 10, faults);
    CHECK_LE(purged_now, (long long)(2 * MiB));
    CHECK_LT(faults, 1024); /* 32 MiB faulted in anew is 8,192 */
    return 0;
}

/* Each segment's own window: thread A frees its blocks in its segment
 * while thread B takes as many in B's, so the process's demand stays
 * flat and its window keeps nothing. A's free slices are still A's next
 * spans: the purge past the delay leaves them resident (A's segment had
 * them in spans within the window), and A takes them again with no fault.
 * Without the segment's window the pass purged them (3 MiB) and A faulted
 * every page in again (768 faults). */
enum { SEG_WINDOW_BLOCKS = 12 };
static struct {
    void *blocks[SEG_WINDOW_BLOCKS]; /* B's */
    long faults;                     /* A's, as it takes its blocks again */
} seg_window = {{0}, -1};

static void seg_window_fill(void **blocks) {
    for (size_t i = 0; i < SEG_WINDOW_BLOCKS; i++) {
        blocks[i] = coral_malloc(WINDOW_BLOCK);
        CHECK_NOT_NULL(blocks[i]);
        memset(blocks[i], 5, WINDOW_BLOCK);
    }
}

static void seg_window_empty(void **blocks) {
    for (size_t i = 0; i < SEG_WINDOW_BLOCKS; i++) coral_free(blocks[i]);
}

/* Thread A's first steps: fills (step 1 done), frees at step 2 (step 3
 * done). */
static void seg_window_fill_free(void **blocks) {
    seg_window_fill(blocks);
    step_set(1);
    step_wait(2);
    seg_window_empty(blocks);
    step_set(3);
}

/* A: fills (step 1 done), frees (step 3 done), fills again after the
 * purge pass, counting its faults, and frees (step 6 done). A small block
 * keeps its segment in use until step 7. */
static void *seg_window_a(void *arg) {
    (void)arg;
    void *keep = coral_malloc(64);
    void *blocks[SEG_WINDOW_BLOCKS];
    seg_window_fill_free(blocks);
    step_wait(5);
    long before = thread_minor_faults();
    seg_window_fill(blocks);
    seg_window.faults = thread_minor_faults() - before;
    seg_window_empty(blocks);
    step_set(6);
    step_wait(7);
    coral_free(keep);
    return NULL;
}

/* B: takes as many blocks as A gave back (step 4 done), keeps them until
 * step 7. */
static void *seg_window_b(void *arg) {
    (void)arg;
    step_wait(3);
    seg_window_fill(seg_window.blocks);
    step_set(4);
    step_wait(7);
    seg_window_empty(seg_window.blocks);
    return NULL;
}

static int child_segment_window(void) {
    coral_free(coral_malloc(1));
    pthread_t a, b;
    CHECK_EQ(pthread_create(&a, NULL, seg_window_a, NULL), 0);
    CHECK_EQ(pthread_create(&b, NULL, seg_window_b, NULL), 0);
    step_wait(1);
    step_set(2);
    step_wait(4);
    long long purged = stats_os_bytes("purge");
    coral_test_advance_clock(100); /* A's free slices are due */
    CHECK_EQ(coral_test_purge_pass(), 1);
    long long purged_now = stats_os_bytes("purge") - purged;
    step_set(5);
    step_wait(6);
    /* A freed its 3 MiB again, within its segment's window: a forced
     * purge returns them anyway, as it ignores the process's window. */
    purged = stats_os_bytes("purge");
    coral_collect(1);
    long long forced = stats_os_bytes("purge") - purged;
    step_set(7);
    CHECK_EQ(pthread_join(a, NULL), 0);
    CHECK_EQ(pthread_join(b, NULL), 0);
    printf("segment window: %lld KiB purged past the delay; thread A took its 3 MiB again with "
           "%ld faults; coral_collect(1) then purged %lld KiB\n",
           purged_now >> 10, seg_window.faults, forced >> 10);
    CHECK_GE(forced, (long long)(3 * MiB));
    CHECK_LT(purged_now, (long long)(512 * KiB));
    CHECK_LT(seg_window.faults, 128); /* 3 MiB faulted in anew is 768 */
    return 0;
}

/* An abandoned segment keeps no window of its own: thread A fills 3 MiB,
 * frees them and exits, a small block of its still live (so its segment is
 * abandoned, not cached), while thread B took as many in its own segment
 * after A's free: the process's demand stayed flat, its window keeps
 * nothing, and the purge past the delay returns A's free slices. No thread
 * takes spans from an abandoned segment but the one that adopts it, which
 * the process's window covers (the "window" case); held by the segment's
 * window, they stayed resident (0 KiB purged) for as long as the window. */
static void *abandoned_window_a(void *arg) {
    *(void **)arg = coral_malloc(64);
    void *blocks[SEG_WINDOW_BLOCKS];
    seg_window_fill_free(blocks);
    step_wait(4); /* B took its spans before this segment was abandoned */
    return NULL;
}

static int child_abandoned_window(void) {
    coral_free(coral_malloc(1));
    void *keep = NULL;
    pthread_t a, b;
    CHECK_EQ(pthread_create(&a, NULL, abandoned_window_a, &keep), 0);
    CHECK_EQ(pthread_create(&b, NULL, seg_window_b, NULL), 0); /* B: as above */
    step_wait(1);
    step_set(2);
    step_wait(4);
    CHECK_EQ(pthread_join(a, NULL), 0); /* A's segment abandoned: keep is live */
    long long purged = stats_os_bytes("purge");
    coral_test_advance_clock(100); /* A's free slices are due */
    CHECK_EQ(coral_test_purge_pass(), 1);
    long long purged_now = stats_os_bytes("purge") - purged;
    step_set(7);
    CHECK_EQ(pthread_join(b, NULL), 0);
    coral_free(keep);
    printf("abandoned window: %lld KiB of the exited thread's 3 MiB purged past the delay\n",
           purged_now >> 10);
    CHECK_GE(purged_now, (long long)(2 * MiB));
    return 0;
}

static int child_collect(void) {
    coral_free(coral_malloc(1));
    size_t before = rss_mib();
    burst();
    size_t peak = rss_mib();
    release();
    size_t held = rss_mib(); /* the delay is an hour: nothing purged yet */
    coral_collect(1);
    size_t after = rss_mib();
    printf("coral_collect(1): RSS %zu -> %zu -> %zu (held) -> %zu MiB\n", before, peak, held,
           after);
    CHECK_GE(held, before + 100);
    CHECK_LE(after, before + 24);
    return 0;
}

/* ---- the purge thread starts once enough waits -------------------------------------------- */

static int threads_now(void) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK_NOT_NULL(f);
    char line[256];
    int threads = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "Threads: %d", &threads) == 1) break;
    fclose(f);
    CHECK_GT(threads, 0);
    return threads;
}

static void *touched(size_t size) {
    void *p = coral_malloc(size);
    CHECK_NOT_NULL(p);
    memset(p, 5, size);
    return p;
}

static int child_thread_start(void) {
    coral_free(coral_malloc(1));
    CHECK_EQ(threads_now(), 1);
    /* A 640 KiB large block freed: too little to start a thread for. */
    coral_free(touched(640 * KiB));
    coral_free(coral_malloc(100));
    CHECK_EQ(threads_now(), 1);
    /* Two more (one reuses the first's slices): 1.25 MiB waits, and the
     * thread starts at the end of the free that got there. */
    void *a = touched(640 * KiB), *b = touched(640 * KiB);
    coral_free(a);
    CHECK_EQ(threads_now(), 1);
    coral_free(b);
    CHECK_EQ(threads_now(), 2);
    printf("purge thread: not started for 640 KiB, started at 1.25 MiB\n");
    return 0;
}

/* ---- the chunk pool ------------------------------------------------------------------------- */

/* A freed huge block's chunks (and resident pages) become normal segments. */
static int child_pool_kinds(void) {
    coral_free(coral_malloc(1));
    coral_free(touched(64 * MiB));
    size_t rss0 = rss_mib();
    long long maps0 = stats_os_calls("mmap");
    enum { N = 48 };
    static void *large[N]; /* 1 MiB each: 16 segments of 3 */
    for (size_t i = 0; i < N; i++) large[i] = touched(MiB);
    size_t rss1 = rss_mib();
    printf("pool: 48 MiB of large blocks after a 64 MiB huge one: RSS %zu -> %zu MiB, %lld mmaps\n",
           rss0, rss1, stats_os_calls("mmap") - maps0);
    CHECK_EQ(stats_os_calls("mmap"), maps0); /* no segment was mapped anew */
    CHECK_LE(rss1, rss0 + 4);                /* nor faulted in */
    for (size_t i = 0; i < N; i++) coral_free(large[i]);
    return 0;
}

/* Freed huge blocks, apart from each other, are moved under a bigger one:
 * it reads as zero from calloc, its pages are theirs (RSS hardly grows),
 * and it keeps its contents when it grows (moved again: now its range is
 * several mappings, which the kernel moves one at a time). */
static int child_pool_gather(void) {
    coral_free(coral_malloc(1));
    void *keep[4], *gone[4];
    for (size_t i = 0; i < 4; i++) {
        gone[i] = touched(8 * MiB);
        keep[i] = touched(8 * MiB); /* so that no two freed ones are adjacent */
    }
    for (size_t i = 0; i < 4; i++) coral_free(gone[i]);
    size_t rss0 = rss_mib();
    long long remaps0 = stats_os_calls("mremap");
    size_t size = 30 * MiB;
    unsigned char *big = coral_calloc(1, size);
    CHECK_NOT_NULL(big);
    for (size_t i = 0; i < size; i++) CHECK_EQ(big[i], 0);
    fill_pattern(big, size, 11);
    size_t rss1 = rss_mib();
    printf("pool: a 30 MiB block over four freed 8 MiB ones: RSS %zu -> %zu MiB, %lld mremaps\n",
           rss0, rss1, stats_os_calls("mremap") - remaps0);
    /* Each freed block gives its resident chunks; only their partly
     * touched last chunks fault (a fresh block would fault 30 MiB). */
    CHECK_LE(rss1, rss0 + 12);
    CHECK_GT(stats_os_calls("mremap"), remaps0);
    big = coral_realloc(big, 100 * MiB);
    CHECK_NOT_NULL(big);
    CHECK_EQ(pattern_mismatch(big, size, 11), (size_t)-1);
    coral_free(big);
    for (size_t i = 0; i < 4; i++) coral_free(keep[i]);
    return 0;
}

/* A huge block takes the front of a freed bigger one; it grows in place
 * into the rest, with no system call. */
static int child_pool_grow(void) {
    coral_free(coral_malloc(1));
    coral_free(touched(24 * MiB)); /* 7 chunks in the pool */
    void *p = touched(8 * MiB);    /* their first 3 */
    fill_pattern(p, 8 * MiB, 3);
    long long maps0 = stats_os_calls("mmap"), remaps0 = stats_os_calls("mremap");
    void *q = coral_realloc(p, 20 * MiB); /* 6 chunks */
    CHECK(q == p);
    CHECK_EQ(stats_os_calls("mmap"), maps0);
    CHECK_EQ(stats_os_calls("mremap"), remaps0);
    CHECK_EQ(pattern_mismatch(q, 8 * MiB, 3), (size_t)-1);
    CHECK_GE(coral_malloc_usable_size(q), 20 * MiB);
    memset(q, 6, 20 * MiB);
    coral_free(q);
    printf("pool: a huge block grew in place into pooled chunks after it\n");
    return 0;
}

/* A freed, partly touched region followed by a freed, touched one stay two
 * regions: joined, their dirty length would count the first one's clean
 * end as resident, and a block taking them would fault it in while a
 * touched chunk elsewhere in the pool stayed unused. */
static int child_pool_exact(void) {
    coral_free(coral_malloc(1));
    const size_t header = 64 * KiB;
    /* Four chunks of one mapping, purged: clean, in the pool. */
    coral_free(coral_malloc(16 * MiB - header));
    coral_collect(1);
    void *a = touched(2 * MiB);               /* chunk 0: 2 MiB of 4 touched */
    void *b = touched(8 * MiB - header);      /* chunks 1-2, touched */
    void *c = coral_malloc(4 * MiB - header); /* chunk 3: kept, a neighbour in use */
    void *e = touched(4 * MiB - header);      /* a chunk elsewhere, touched */
    void *k = coral_malloc(4 * MiB - header); /* kept: e's region stands alone */
    coral_free(e);
    coral_free(b);
    coral_free(a);
    /* 12 MiB: chunks 1-2 and e's chunk are all resident; chunk 0 half. */
    long faults0 = minor_faults();
    size_t rss0 = rss_kib();
    void *d = touched(12 * MiB - header);
    long faults = minor_faults() - faults0;
    printf("pool: a 12 MiB block over 12 MiB of resident pooled chunks: %ld faults, RSS +%zu KiB\n",
           faults, rss_kib() - rss0);
    CHECK_LT(faults, 128); /* not the 496 of chunk 0's clean half */
    coral_free(d);
    coral_free(c);
    coral_free(k);
    return 0;
}

/* The first block of a new page of 3072-byte blocks: linking the blocks
 * carved with it touches no OS page after its own (16 KiB worth were
 * linked before: three pages faulted in for blocks nobody asked for). */
static int child_first_carve(void) {
    coral_free(coral_malloc(1));
    unsigned char *p = coral_malloc(3000);
    CHECK_NOT_NULL(p);
    CHECK_EQ((uintptr_t)p % (64 * KiB), 0); /* the first block of a fresh page */
    p[0] = 1;
    unsigned char resident[4];
    CHECK_EQ(mincore(p, 16 * KiB, resident), 0);
    printf("first carve of a 3 KiB class page: OS pages resident %d %d %d %d\n", resident[0] & 1,
           resident[1] & 1, resident[2] & 1, resident[3] & 1);
    CHECK_EQ(resident[0] & 1, 1);
    for (size_t i = 1; i < 4; i++) CHECK_EQ(resident[i] & 1, 0);
    coral_free(p);
    return 0;
}

/* Segment A holds the small pages and two large blocks, B (newer) a third
 * large block; a new page of 288-byte blocks goes to A, so B goes back to
 * the pool when its block is freed. */
static int child_small_apart(void) {
    const uintptr_t segment_mask = ~(uintptr_t)(4 * MiB - 1);
    void *first = coral_malloc(16);
    CHECK_NOT_NULL(first);
    void *l1 = coral_malloc(1900 * KiB), *l2 = coral_malloc(1900 * KiB); /* 30 slices each */
    void *l3 = coral_malloc(1900 * KiB);
    CHECK(l1 && l2 && l3);
    CHECK_EQ((uintptr_t)l1 & segment_mask, (uintptr_t)first & segment_mask);
    CHECK_EQ((uintptr_t)l2 & segment_mask, (uintptr_t)first & segment_mask);
    CHECK(((uintptr_t)l3 & segment_mask) != ((uintptr_t)first & segment_mask));
    long long segments = stats_get("segments");
    void *small = coral_malloc(288);
    CHECK_NOT_NULL(small);
    CHECK_EQ((uintptr_t)small & segment_mask, (uintptr_t)first & segment_mask);
    coral_free(l3);
    CHECK_EQ(stats_get("segments"), segments - 1); /* B went back to the pool */
    printf("a new small page joins the older small pages: the newest segment was released\n");
    coral_free(small);
    coral_free(l2);
    coral_free(l1);
    coral_free(first);
    return 0;
}

/* The huge-page policy (CORALLOC_HUGE_PAGES, on by default). */
static long long hugepage_advice(void) { return stats_os_calls("hugepage"); }

/* A small program (up to three segments) gets no huge page advice; a
 * thread that needs more segments, writing the pages it carves, gets it for
 * each segment from its fourth on. */
static int child_hugepages_dense(void) {
    coral_test_huge_page_cost(0); /* whatever this machine's huge pages cost */
    enum { SMALL = 30000 };       /* 30 MiB of 1000 B blocks: 7+ segments */
    static void *small[SMALL];
    size_t n = 0;
    while (n < SMALL && stats_get("segments") < 3) CHECK_NOT_NULL(small[n++] = coral_malloc(1000));
    CHECK_EQ(hugepage_advice(), 0);
    while (n < SMALL) CHECK_NOT_NULL(small[n++] = coral_malloc(1000));
    long long segments = stats_get("segments"), advised = hugepage_advice();
    printf("huge pages: %lld of %lld segments advised\n", advised, segments);
    CHECK_GE(segments, 7);
    CHECK_EQ(advised, segments - 3);
    for (size_t i = 0; i < n; i++) coral_free(small[i]);
    return 0;
}

/* A segment made for a large block of 1 MiB or more gets huge pages even
 * among a thread's first three: the block fills them. */
static int child_hugepages_big_span(void) {
    coral_test_huge_page_cost(0);
    void *small = coral_malloc(1000);
    CHECK_NOT_NULL(small);
    CHECK_EQ(stats_get("segments"), 1);
    enum { BIG = 8 }; /* 3 fit in a segment */
    void *big[BIG];
    for (size_t i = 0; i < BIG; i++) CHECK_NOT_NULL(big[i] = coral_malloc(MiB + 64 * KiB));
    long long segments = stats_get("segments");
    printf("huge pages, big spans: %lld of %lld segments advised\n", hugepage_advice(), segments);
    CHECK_GE(segments, 3);
    CHECK_EQ(hugepage_advice(), segments - 1);
    for (size_t i = 0; i < BIG; i++) coral_free(big[i]);
    coral_free(small);
    return 0;
}

/* A program that touches one OS page of each 64 KiB block (its pages
 * measured sparse by the populate policy) gets no huge page: its RSS is
 * the pages it touches, not 2 MiB for each. */
static int child_hugepages_sparse(void) {
    enum { N = 1600 }; /* 100 MiB of blocks */
    static char *blocks[N];
    size_t rss0 = rss_kib();
    for (size_t i = 0; i < N; i++) {
        CHECK_NOT_NULL(blocks[i] = coral_malloc(64 * KiB));
        blocks[i][0] = 1;
    }
    size_t grown = rss_kib() - rss0;
    printf("huge pages, sparse: %lld advised, RSS +%zu KiB for %d touched pages\n",
           hugepage_advice(), grown, N);
    CHECK_GE(stats_get("segments"), 20);
    CHECK_EQ(hugepage_advice(), 0);
    CHECK_LT(grown, 16 * MiB / KiB);
    for (size_t i = 0; i < N; i++) coral_free(blocks[i]);
    return 0;
}

/* THP is available to madvise (the kernel's mode is madvise or always). */
static bool thp_madvise_works(void) {
    char mode[128] = {0};
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f == NULL) return false;
    bool ok = fgets(mode, sizeof mode, f) != NULL && strstr(mode, "[never]") == NULL;
    fclose(f);
    return ok;
}

/* A huge block gets huge pages: written whole, it faults once per 2 MiB
 * (where the kernel gives THP), not once per 4 KiB. */
static int child_hugepages_block(void) {
    enum { SIZE = 32 << 20 };
    coral_test_huge_page_cost(0);
    long long advised = hugepage_advice();
    long faults = minor_faults();
    char *p = coral_malloc(SIZE);
    CHECK_NOT_NULL(p);
    memset(p, 5, SIZE);
    faults = minor_faults() - faults;
    printf("huge pages: a 32 MiB block written in %ld faults\n", faults);
    CHECK_EQ(hugepage_advice(), advised + 1);
    if (thp_madvise_works()) CHECK_LT(faults, SIZE / (64 * 1024)); /* 4 KiB pages: 8192 */
    coral_free(p);
    /* Taken again from the segment cache while its pages are resident:
     * the resident block is not advised again (the call would change
     * nothing); at most the clean 2 MiB past its end is. */
    long long advised_bytes = stats_os_bytes("hugepage");
    p = coral_malloc(SIZE);
    CHECK_NOT_NULL(p);
    memset(p, 6, SIZE);
    CHECK_LE(stats_os_bytes("hugepage") - advised_bytes, 2 * MiB);
    coral_free(p);
    return 0;
}

/* A huge block of 2 MiB ends 64 KiB into its mapping's second 2 MiB (the
 * header slice comes first): only the first 2 MiB, which header and block
 * fill, is advised for huge pages, so the second does not fault in whole
 * for the block's last 64 KiB. */
static int child_hugepages_2m_block(void) {
    coral_test_huge_page_cost(0);
    long long advised_bytes = stats_os_bytes("hugepage");
    char *p = coral_malloc(2 * MiB);
    CHECK_NOT_NULL(p);
    memset(p, 7, 2 * MiB);
    long long advised = stats_os_bytes("hugepage") - advised_bytes;
    printf("huge pages: a 2 MiB block's mapping advised for %lld KiB\n", advised / 1024);
    CHECK_EQ(advised, 2 * MiB);
    coral_free(p);
    return 0;
}

/* Where huge pages are slow to fault in (each taken to cost 5 ms here),
 * the process stops asking for them after the second: the segments after
 * those two, and a huge block then, get no advice, and the advice is
 * withdrawn from clean memory it may still cover. */
static int child_hugepages_slow(void) {
    coral_test_huge_page_cost(5000000);
    void *small[1000];
    for (size_t i = 0; i < 1000; i++) CHECK_NOT_NULL(small[i] = coral_malloc(1000));
    enum { BIG = 40 }; /* 40 MiB in 1 MiB blocks: 10+ segments */
    void *big[BIG];
    for (size_t i = 0; i < BIG; i++) CHECK_NOT_NULL(big[i] = coral_malloc(MiB));
    long long segments = stats_get("segments"), advised = hugepage_advice();
    printf("slow huge pages: %lld of %lld segments advised, %lld pages slow\n", advised, segments,
           stats_get("huge_pages_slow"));
    CHECK_GE(segments, 10);
    CHECK_EQ(advised, 2);
    CHECK_EQ(stats_get("huge_pages_slow"), 2);
    /* The segment whose first 2 MiB made the second slow page had the
     * advice withdrawn from its other 2 MiB before they were touched. */
    CHECK_EQ(stats_os_calls("nohugepage"), 1);
    CHECK_EQ(stats_os_bytes("nohugepage"), 2 * MiB);
    void *huge = coral_malloc(32 * MiB);
    CHECK_NOT_NULL(huge);
    CHECK_EQ(hugepage_advice(), 2);
    coral_free(huge);
    /* Memory taken again from the cache has the advice withdrawn from its
     * clean 2 MiB pages (an earlier take may have given it): the huge
     * block's, freed untouched. */
    huge = coral_malloc(32 * MiB);
    CHECK_NOT_NULL(huge);
    CHECK_EQ(stats_os_calls("nohugepage"), 2);
    CHECK_GE(stats_os_bytes("nohugepage"), 2 * MiB + 2 * MiB);
    CHECK_EQ(hugepage_advice(), 2);
    coral_free(huge);
    for (size_t i = 0; i < BIG; i++) coral_free(big[i]);
    for (size_t i = 0; i < 1000; i++) coral_free(small[i]);
    return 0;
}

/* CORALLOC_HUGE_PAGES=0: the same work advises nothing. */
static int child_hugepages_off(void) {
    void *big[20];
    for (size_t i = 0; i < 20; i++) CHECK_NOT_NULL(big[i] = coral_malloc(MiB));
    void *huge = coral_malloc(32 * MiB);
    CHECK_NOT_NULL(huge);
    CHECK_EQ(hugepage_advice(), 0);
    coral_free(huge);
    for (size_t i = 0; i < 20; i++) coral_free(big[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "background") == 0) return child_background();
    if (argc == 2 && strcmp(argv[1], "collect") == 0) return child_collect();
    if (argc == 2 && strcmp(argv[1], "window") == 0) return child_window();
    if (argc == 2 && strcmp(argv[1], "big-classes") == 0) return child_big_classes();
    if (argc == 2 && strcmp(argv[1], "big-class-page") == 0) return child_big_class_page();
    if (argc == 2 && strcmp(argv[1], "hugepages-dense") == 0) return child_hugepages_dense();
    if (argc == 2 && strcmp(argv[1], "hugepages-big-span") == 0) return child_hugepages_big_span();
    if (argc == 2 && strcmp(argv[1], "hugepages-sparse") == 0) return child_hugepages_sparse();
    if (argc == 2 && strcmp(argv[1], "hugepages-block") == 0) return child_hugepages_block();
    if (argc == 2 && strcmp(argv[1], "hugepages-2m-block") == 0) return child_hugepages_2m_block();
    if (argc == 2 && strcmp(argv[1], "hugepages-off") == 0) return child_hugepages_off();
    if (argc == 2 && strcmp(argv[1], "hugepages-slow") == 0) return child_hugepages_slow();
    if (argc == 2 && strcmp(argv[1], "thread-start") == 0) return child_thread_start();
    if (argc == 2 && strcmp(argv[1], "segment-window") == 0) return child_segment_window();
    if (argc == 2 && strcmp(argv[1], "abandoned-window") == 0) return child_abandoned_window();
    if (argc == 2 && strcmp(argv[1], "pool-kinds") == 0) return child_pool_kinds();
    if (argc == 2 && strcmp(argv[1], "pool-gather") == 0) return child_pool_gather();
    if (argc == 2 && strcmp(argv[1], "pool-grow") == 0) return child_pool_grow();
    if (argc == 2 && strcmp(argv[1], "pool-exact") == 0) return child_pool_exact();
    if (argc == 2 && strcmp(argv[1], "first-carve") == 0) return child_first_carve();
    if (argc == 2 && strcmp(argv[1], "small-apart") == 0) return child_small_apart();
    if (argc == 2 && strcmp(argv[1], "idle-kept") == 0) return child_idle_kept();
    if (argc == 2 && strcmp(argv[1], "active-kept") == 0) return child_active_kept();
    if (argc == 2 && strcmp(argv[1], "idle-aside") == 0) return child_idle_aside();
    if (argc == 2 && strcmp(argv[1], "idle-aside-renewed") == 0) return child_idle_aside_renewed();
    static const char *const bg[] = {"CORALLOC_PURGE_DELAY_MS=100", NULL};
    static const char *const co[] = {"CORALLOC_PURGE_DELAY_MS=3600000", "CORALLOC_PURGE_THREAD=0",
                                     NULL};
    static const char *const held[] = {"CORALLOC_PURGE_DELAY_MS=3600000", NULL};
    static const char *const none[] = {NULL};
    run_child("background", bg);
    run_child("collect", co);
    static const char *const big[] = {"CORALLOC_PURGE_DELAY_MS=100", "CORALLOC_HUGE_PAGES=0", NULL};
    run_child("big-classes", big);
    run_child("big-class-page", none);
    static const char *const window[] = {"CORALLOC_PURGE_DELAY_MS=100", "CORALLOC_HUGE_PAGES=0",
                                         NULL};
    run_child("window", window);
    run_child("segment-window", window);
    run_child("abandoned-window", window);
    static const char *const kept[] = {"CORALLOC_PURGE_DELAY_MS=3600000", "CORALLOC_HUGE_PAGES=0",
                                       NULL};
    run_child("idle-kept", kept);
    run_child("active-kept", kept);
    run_child("idle-aside", kept);
    run_child("idle-aside-renewed", kept);
    run_child("thread-start", none);
    run_child("pool-kinds", held);
    run_child("pool-gather", held);
    run_child("pool-grow", held);
    run_child("pool-exact", held);
    run_child("first-carve", none);
    run_child("small-apart", held);
    run_child("hugepages-dense", none);
    run_child("hugepages-big-span", none);
    run_child("hugepages-sparse", none);
    run_child("hugepages-block", none);
    run_child("hugepages-2m-block", none);
    run_child("hugepages-slow", none);
    static const char *const hp_off[] = {"CORALLOC_HUGE_PAGES=0", NULL};
    run_child("hugepages-off", hp_off);
    return 0;
}
