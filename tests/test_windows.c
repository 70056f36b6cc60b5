/* The windows of coralloc's concurrency protocols, each driven
 * deterministically: a thread is held at a named test point (the hooks
 * library, tests/hooks.h) while another does exactly what the window
 * allows, then let go. Each case fails on the defect it names and passes
 * with the fix (see the comment of each). Run as `test_windows NAME`. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "hooks.h"
#include "testutil.h"

typedef void *(*thread_fn)(void *);

static pthread_t start(thread_fn fn, void *arg) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, fn, arg), 0);
    return t;
}

static void join(pthread_t t) { CHECK_EQ(pthread_join(t, NULL), 0); }

/* ---- a destroyed heap's orphan page and the purger --------------------------------------
 * A user heap's page all of whose blocks another thread freed is an orphan.
 * The purger unlists it, then claims it; between the two, the owner
 * destroys the heap and a new heap puts live blocks on the same span. The
 * purger's claim must fail: before the fix it succeeded (destroy left the
 * blocks on thread_free) and the purge zeroed the new heap's live blocks. */

#define ORPHAN_BLOCKS 1024 /* 64-byte blocks: one 64 KiB page */

static void *orphan_blocks[ORPHAN_BLOCKS];

static void *free_all_orphan_blocks(void *arg) {
    (void)arg;
    for (size_t i = 0; i < ORPHAN_BLOCKS; i++) coral_free(orphan_blocks[i]);
    return NULL;
}

static bool purge_pass_done;

static void *purge_pass_thread(void *arg) {
    (void)arg;
    coral_test_purge_pass();
    gate_signal(&purge_pass_done);
    return NULL;
}

static void case_orphan_destroy(void) {
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    for (size_t i = 0; i < ORPHAN_BLOCKS; i++) {
        orphan_blocks[i] = coral_heap_malloc(heap, 64);
        CHECK(orphan_blocks[i] != NULL);
    }
    join(start(free_all_orphan_blocks, NULL)); /* the page is an orphan now */
    coral_test_advance_clock(3600 * 1000);     /* and due for reclaim */
    gate_arm(CORAL_TP_ORPHAN_UNLISTED, -1);
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_held(); /* unlisted, not claimed */
    coral_heap_destroy(heap);
    /* The purger goes on: its claim fails (the fix), or it claims the page
     * and is held just before it purges the span (the defect). */
    gate_arm_at(1, CORAL_TP_ORPHAN_PURGING, -1);
    gate_open();
    gate_wait_for(&purge_pass_done, 1);
    coral_heap_t *next = coral_heap_new();
    static void *live[ORPHAN_BLOCKS];
    for (size_t i = 0; i < ORPHAN_BLOCKS; i++) {
        live[i] = coral_heap_malloc(next, 64);
        CHECK(live[i] != NULL);
        fill_pattern(live[i], 64, i);
    }
    gate_open_at(1);
    join(purger);
    for (size_t i = 0; i < ORPHAN_BLOCKS; i++)
        CHECK_MSG(pattern_mismatch(live[i], 64, i) == (size_t)-1, "live block %zu at %p changed", i,
                  live[i]);
    coral_heap_destroy(next);
}

/* ---- a notice still in flight when the owner takes the page back ------------------------
 * A full page's first remote free tells the owner: it pushes the page on
 * delayed_pages, then leaves state FREEING. The owner takes the page in
 * between, after other frees emptied it. Before the fix the owner's retire
 * saw FREEING and left the empty page in the full queue for good; now the
 * owner waits for the notifier (which the gate lets go when the owner
 * starts waiting) and releases the page. */

#define NOTIFY_SIZE ((size_t)16384)
#define NOTIFY_MAX 64

static void *notify_blocks[NOTIFY_MAX];
static size_t notify_count; /* the blocks of the first page */

static void *free_first_notify_block(void *arg) {
    (void)arg;
    coral_free(notify_blocks[0]); /* notifies, held at NOTIFY_PUSHED */
    return NULL;
}

static void *free_other_notify_blocks(void *arg) {
    (void)arg;
    for (size_t i = 1; i < notify_count; i++) coral_free(notify_blocks[i]);
    return NULL;
}

static void case_notify_retire(void) {
    /* A fresh page's blocks are carved in address order: the first block
     * not at its place in that run is on a new page, and the malloc that
     * made it found the first page full and parked it in the full queue. */
    char *first = coral_malloc(NOTIFY_SIZE), *next = NULL;
    size_t stride = coral_malloc_usable_size(first);
    notify_blocks[notify_count++] = first;
    while (next == NULL) {
        char *p = coral_malloc(NOTIFY_SIZE);
        CHECK(notify_count < NOTIFY_MAX);
        if (p == first + notify_count * stride)
            notify_blocks[notify_count++] = p;
        else
            next = p;
    }
    CHECK_EQ(coral_test_check(), 0);
    gate_arm(CORAL_TP_NOTIFY_PUSHED, CORAL_TP_WAIT_FREEING);
    pthread_t notifier = start(free_first_notify_block, NULL);
    gate_wait_held();
    join(start(free_other_notify_blocks, NULL));
    coral_collect(0); /* takes delayed_pages: the page comes back empty */
    gate_open();
    join(notifier);
    CHECK_EQ(coral_test_check(), 0);
    coral_free(next);
}

/* ---- a thread that allocates only large blocks ------------------------------------------
 * A producer allocates 1 MiB buffers, a consumer frees them, one live at a
 * time. Before the fix the producer never took its pages back from
 * delayed_pages (only class refills did): every buffer took a new span,
 * 3,000 buffers about 2.7 GiB of address space. Now the large path
 * collects: the address space stays within a few segments. */

static char *large_slot;
static pthread_mutex_t large_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t large_cond = PTHREAD_COND_INITIALIZER;
static int large_state; /* 0: empty slot, 1: full, 2: done */

static void *large_consumer(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&large_lock);
        while (large_state == 0) pthread_cond_wait(&large_cond, &large_lock);
        if (large_state == 2) {
            pthread_mutex_unlock(&large_lock);
            return NULL;
        }
        char *p = large_slot;
        large_state = 0;
        pthread_cond_broadcast(&large_cond);
        pthread_mutex_unlock(&large_lock);
        CHECK_EQ((unsigned char)p[12345], 0x5a);
        coral_free(p);
    }
}

static long long stat_of(const char *json, const char *key) {
    const char *at = strstr(json, key);
    CHECK_MSG(at != NULL, "no %s in the statistics", key);
    at += strlen(key);
    while (*at == '"' || *at == ':' || *at == ' ') at++;
    return strtoll(at, NULL, 10);
}

static void case_large_only(void) {
    pthread_t consumer = start(large_consumer, NULL);
    for (int i = 0; i < 3000; i++) {
        char *p = coral_malloc((size_t)1 << 20);
        CHECK(p != NULL);
        memset(p, 0x5a, (size_t)1 << 20);
        pthread_mutex_lock(&large_lock);
        while (large_state != 0) pthread_cond_wait(&large_cond, &large_lock);
        large_slot = p;
        large_state = 1;
        pthread_cond_broadcast(&large_cond);
        pthread_mutex_unlock(&large_lock);
    }
    pthread_mutex_lock(&large_lock);
    while (large_state != 0) pthread_cond_wait(&large_cond, &large_lock);
    large_state = 2;
    pthread_cond_broadcast(&large_cond);
    pthread_mutex_unlock(&large_lock);
    join(consumer);
    static char json[16384];
    CHECK_GT(coral_stats_json(json, sizeof json), 0);
    long long peak = stat_of(json, "\"mapped_peak\"");
    printf("large_only: mapped peak %lld MiB\n", peak >> 20);
    CHECK_MSG(peak < (512ll << 20), "mapped peak %lld MiB for one live 1 MiB block", peak >> 20);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_windows CASE\n");
        return 2;
    }
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {
        {"orphan_destroy", case_orphan_destroy},
        {"notify_retire", case_notify_retire},
        {"large_only", case_large_only},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(argv[1], cases[i].name) == 0) {
            cases[i].run();
            printf("%s: passed\n", argv[1]);
            return 0;
        }
    fprintf(stderr, "test_windows: no case %s\n", argv[1]);
    return 2;
}
