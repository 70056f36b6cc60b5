/* The windows of coralloc's concurrency protocols, each driven
 * deterministically: a thread is held at a named test point (the hooks
 * library, tests/hooks.h) while another does exactly what the window
 * allows, then let go. Each case fails on the defect it names and passes
 * with the fix (see the comment of each). Run as `test_windows NAME`. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "hooks.h"
#include "profile_totals_check.h"
#include "stats_json.h"
#include "testutil.h"

typedef void *(*thread_fn)(void *);

static pthread_t start(thread_fn fn, void *arg) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, fn, arg), 0);
    return t;
}

static void join(pthread_t t) { CHECK_EQ(pthread_join(t, NULL), 0); }

/* The fork child pid ends with status 0 (what: the defect if it never
 * ends; killed after 30 s, a hang detector, not a timing). */
static void expect_child_exit_0(pid_t pid, const char *what) {
    int status = -1;
    for (int i = 0; i < 3000 && waitpid(pid, &status, WNOHANG) == 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        status = -1;
    }
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    CHECK_MSG(status != -1, "%s (killed after 30 s)", what);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
}

/* ---- a destroyed heap's orphan page and the purger --------------------------------------
 * A user heap's page all of whose blocks another thread freed is an orphan.
 * The purger is held holding the orphan lock, the page unlisted; the owner
 * destroys the heap and a new heap puts live blocks on the same span. No
 * purge may touch the span once the new page is there: the first fix made
 * destroy seal thread_free (before it, a claim after the unlisting
 * succeeded and the purge zeroed the new heap's live blocks); the claim is
 * now made before the unlisting, and destroy waits for its purge (the
 * gate opens when it starts waiting). */

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
    gate_arm(CORAL_TP_ORPHAN_UNLISTED, CORAL_TP_WAIT_BUSY);
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

/* ---- a destroyed orphan's span reused by a page of more blocks ------------------------
 * The same window, but the new page on the span holds smaller blocks (more
 * of them: 1,024 of 64 bytes where the orphan had 512 of 128). Other
 * threads free 512 of its blocks while the purger holds the orphan lock:
 * the count on the descriptor (the same descriptor: the span starts at the
 * same slice) then equals the orphan's `reserved`, and the last of those
 * frees needs no lock (it does not free the new page's last block). A
 * claim made after the unlisting compared the count with the old
 * `reserved`, so it took the new page: the purge zeroed its 512 live
 * blocks, and its owner would have handed them out again. The claim is now
 * made while the page is listed (a releaser waits for it: the lock), so it
 * can only ever take the orphan itself. The gate opens by itself when the
 * destroyer waits for a purge in progress (the fix: the orphan was claimed
 * before the unlisting, and destroy waits for its purge). */

#define REUSE_OLD 128  /* the orphan's blocks */
#define REUSE_NEW 64   /* the new page's */
#define REUSE_MAX 1024 /* 64 KiB / 64 */

static void *reuse_old[REUSE_MAX], *reuse_new[REUSE_MAX];
static size_t reuse_old_n;

static void *free_reuse_old(void *arg) {
    (void)arg;
    for (size_t i = 0; i < reuse_old_n; i++) coral_free(reuse_old[i]);
    return NULL;
}

/* Frees the new page's first half: a count equal to the orphan's reserved. */
static void *free_reuse_new_half(void *arg) {
    (void)arg;
    for (size_t i = 0; i < reuse_old_n; i++) coral_free(reuse_new[i]);
    return NULL;
}

static uintptr_t slice_of(const void *p) { return (uintptr_t)p & ~(uintptr_t)0xffff; }

static void case_orphan_reuse_smaller(void) {
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    /* The blocks of the heap's first page: those in the first one's slice. */
    char *extra = NULL;
    while (extra == NULL) {
        char *p = coral_heap_malloc(heap, REUSE_OLD);
        CHECK(p != NULL && reuse_old_n < REUSE_MAX);
        if (reuse_old_n == 0 || slice_of(p) == slice_of(reuse_old[0]))
            reuse_old[reuse_old_n++] = p;
        else
            extra = p;
    }
    join(start(free_reuse_old, NULL)); /* the first page is an orphan now */
    coral_test_advance_clock(3600 * 1000);
    gate_arm(CORAL_TP_ORPHAN_UNLISTED, CORAL_TP_WAIT_BUSY);
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_held(); /* holding the orphan lock */
    coral_heap_destroy(heap);
    coral_heap_t *next = coral_heap_new();
    CHECK(next != NULL);
    for (size_t i = 0; i < REUSE_MAX; i++) {
        reuse_new[i] = coral_heap_malloc(next, REUSE_NEW);
        CHECK(reuse_new[i] != NULL);
        fill_pattern(reuse_new[i], REUSE_NEW, i);
    }
    CHECK_MSG(slice_of(reuse_new[0]) == slice_of(reuse_old[0]),
              "the new page is not on the orphan's span (%p, %p): the window is not driven",
              reuse_new[0], reuse_old[0]);
    CHECK_MSG(slice_of(reuse_new[REUSE_MAX - 1]) == slice_of(reuse_old[0]),
              "the new page holds fewer than %d blocks", REUSE_MAX);
    join(start(free_reuse_new_half, NULL));
    gate_arm_at(1, CORAL_TP_ORPHAN_PURGING, -1);
    gate_open();
    gate_wait_for(&purge_pass_done, 1);
    bool claimed_new = gate_holds(1);
    gate_open_at(1);
    join(purger);
    for (size_t i = reuse_old_n; i < REUSE_MAX; i++)
        CHECK_MSG(pattern_mismatch(reuse_new[i], REUSE_NEW, i) == (size_t)-1,
                  "live block %zu at %p changed (the purger claimed the new page: %d)", i,
                  reuse_new[i], claimed_new);
    CHECK_MSG(!claimed_new, "the purger claimed the new page, which holds live blocks");
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

/* ---- a huge block freed while its user heap's thread exits -----------------------------
 * Thread B frees huge block X of user heap H; before it takes the
 * huge-block list lock, H's thread exits (detaching H's huge blocks) and a
 * new user heap is made and given a huge block. Before the fix B locked
 * H's own lock with the owner read before the exit, H's struct could be
 * the new heap's, and B's unlink of X with X's stale links put H's other
 * live block Y on the new heap's list: destroying the new heap freed Y.
 * Now the owner is read again under one lock for every list: X is found
 * detached, Y stays live and freeable once. */

#define HUGE ((size_t)8 << 20)

static struct {
    coral_heap_t *heap;
    char *x, *y;
    bool ready, exit_now, second_ready, destroy_now;
} hx;

static void *huge_owner(void *arg) {
    (void)arg;
    hx.heap = coral_heap_new();
    hx.y = coral_heap_malloc(hx.heap, HUGE);
    CHECK(hx.y != NULL);
    fill_pattern(hx.y, HUGE, 7);
    hx.x = coral_heap_malloc(hx.heap, HUGE);
    CHECK(hx.x != NULL);
    gate_signal(&hx.ready);
    gate_wait_for(&hx.exit_now, GATES); /* (no gate index GATES: waits for the flag only) */
    return NULL;                        /* exits with H undestroyed */
}

static void *huge_freer(void *arg) {
    (void)arg;
    coral_free(hx.x); /* held before the huge-block list lock */
    return NULL;
}

static void *second_heap(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    CHECK(coral_heap_malloc(heap, HUGE) != NULL);
    gate_signal(&hx.second_ready);
    gate_wait_for(&hx.destroy_now, GATES);
    coral_heap_destroy(heap);
    return NULL;
}

static void case_huge_free_vs_exit(void) {
    pthread_t owner = start(huge_owner, NULL);
    gate_wait_for(&hx.ready, GATES);
    gate_arm(CORAL_TP_HUGE_FREE_UNLOCKED, -1);
    pthread_t freer = start(huge_freer, NULL);
    gate_wait_held();
    gate_signal(&hx.exit_now);
    join(owner);
    pthread_t second = start(second_heap, NULL);
    gate_wait_for(&hx.second_ready, GATES);
    gate_open();
    join(freer);
    gate_signal(&hx.destroy_now);
    join(second);
    CHECK_MSG(pattern_mismatch(hx.y, HUGE, 7) == (size_t)-1, "live huge block Y was changed");
    coral_free(hx.y); /* once: no double free reported */
}

/* ---- fork while a thread holds the huge-block list lock ---------------------------------
 * A worker frees a huge block of its user heap and is held holding the
 * lock; the main thread forks. The fork's prepare handler lets the worker
 * go (the gate's opener) and takes the lock itself, so the child finds it
 * free and can free another huge block of that heap. (Before the fix,
 * per-heap locks were not taken at fork: a child could inherit one held
 * and hang freeing; that run's outcome depended on the worker's speed.) */

static struct {
    coral_heap_t *heap;
    char *a, *b;
    bool ready, forked;
} fh;

static void *huge_lock_holder(void *arg) {
    (void)arg;
    fh.heap = coral_heap_new();
    fh.a = coral_heap_malloc(fh.heap, HUGE);
    fh.b = coral_heap_malloc(fh.heap, HUGE);
    CHECK(fh.a != NULL && fh.b != NULL);
    gate_arm(CORAL_TP_HUGE_LIST_LOCKED, CORAL_TP_FORK_PREPARE);
    gate_signal(&fh.ready);
    coral_free(fh.a); /* held with the lock until the fork prepares */
    /* Still running when the fork copies the process: a thread that had
     * ended unjoined by then is a leak to TSan in the child, which exits
     * with its report's status. */
    gate_wait_for(&fh.forked, GATES);
    return NULL;
}

static void case_fork_huge_lock(void) {
    pthread_t worker = start(huge_lock_holder, NULL);
    gate_wait_for(&fh.ready, GATES);
    gate_wait_held();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang ends the child: the parent sees SIGALRM */
        coral_free(fh.b);
        coral_free(coral_malloc(HUGE));
        _exit(0);
    }
    gate_signal(&fh.forked);
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
    join(worker);
    coral_free(fh.b);
}

/* ---- fork while the purger flushes a bulk cache -----------------------------------------
 * A thread's bulk cache holds blocks; a purge pass takes the cache to
 * flush it and is held there; that thread forks. The fork's prepare
 * handler waits for the flush (the gate opens at the fork), so in the
 * child the cache is not left taken: the child's only thread (the
 * forking one) exits through coralloc's thread-exit cleanup, which
 * waited forever for a cache left taken. */

#define FLUSH_BLOCKS 4096

static bool flush_pass_done;

static void *flush_pass(void *arg) {
    (void)arg;
    coral_test_purge_pass();
    gate_signal(&flush_pass_done);
    return NULL;
}

#ifndef CORAL_TEST_TSAN
static void *exit_in_child(void *arg) {
    (void)arg;
    return NULL;
}
#endif

static void *cache_owner(void *arg) {
    (void)arg;
    static void *blocks[FLUSH_BLOCKS];
    static void *scattered[FLUSH_BLOCKS];
    /* Twice: the first free makes the cache, the second round's malloc
     * asks for the class. Scattered over several pages (not runs of one):
     * the cache keeps them. */
    for (int round = 0; round < 2; round++) {
        CHECK_EQ(coral_malloc_bulk(48, FLUSH_BLOCKS, blocks), FLUSH_BLOCKS);
        for (size_t i = 0; i < FLUSH_BLOCKS; i++) scattered[i] = blocks[i * 1031 % FLUSH_BLOCKS];
        coral_free_bulk(scattered, FLUSH_BLOCKS);
    }
    gate_arm(CORAL_TP_CACHE_FLUSHING, CORAL_TP_FORK_PREPARE);
    pthread_t purger = start(flush_pass, NULL);
    gate_wait_for(&flush_pass_done, 0);
    CHECK_MSG(gate_holds(0), "the purge pass did not flush the bulk cache");
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        /* The child's only thread: a new thread allocates and exits (not
         * under TSan, which refuses threads after such a fork), then this
         * one exits through the thread-exit cleanup of its cache. */
#ifndef CORAL_TEST_TSAN
        pthread_t t = start(exit_in_child, NULL);
        join(t);
#endif
        pthread_exit(NULL);
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
    join(purger);
    return NULL;
}

static void case_fork_bulk_flush(void) { join(start(cache_owner, NULL)); }

/* ---- fork while a remote free tells the exit heap -------------------------------------
 * A thread past coralloc's exit cleanup allocates from the exit heap (a
 * later key destructor): its first page of 16 KiB blocks fills and is
 * parked in the full queue (state USE). Another thread frees a block of it
 * and is held after pushing the page on the exit heap's delayed_pages, the
 * page still in state FREEING; the exiting thread forks. In the child the
 * freer does not exist: the state stays FREEING unless the fork's child
 * handler resets it, as it does for the forking thread's own heaps. The
 * child's exiting thread then allocates from the exit heap until it takes
 * the delayed page back, which waits for FREEING to end: before the fix
 * it waited forever (the child's alarm ends it). */

#define EXIT_BLOCK ((size_t)16384)
#define EXIT_MAX 64

static struct {
    pthread_key_t key;
    void *blocks[EXIT_MAX];
    size_t count; /* the blocks of the exit heap's first page */
    bool filled, fork_now;
    int status;
} xh;

static void exit_heap_filler(void *value) {
    (void)value;
    char *first = coral_malloc(EXIT_BLOCK), *next = NULL;
    CHECK(first != NULL);
    size_t stride = coral_malloc_usable_size(first);
    xh.blocks[xh.count++] = first;
    while (next == NULL) { /* carved in address order until the page is full */
        char *p = coral_malloc(EXIT_BLOCK);
        CHECK(p != NULL && xh.count < EXIT_MAX);
        if (p == first + xh.count * stride)
            xh.blocks[xh.count++] = p;
        else
            next = p;
    }
    gate_signal(&xh.filled);
    gate_wait_for(&xh.fork_now, GATES);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang ends the child: the parent sees SIGALRM */
        for (size_t i = 0; i < 2 * EXIT_MAX; i++) CHECK(coral_malloc(EXIT_BLOCK) != NULL);
        _exit(0);
    }
    CHECK_EQ(waitpid(pid, &xh.status, 0), pid);
}

static void *exiting_thread(void *arg) {
    (void)arg;
    coral_free(coral_malloc(16)); /* a heap: coralloc's exit cleanup runs */
    pthread_setspecific(xh.key, &xh);
    return NULL;
}

static void *free_exit_heap_block(void *arg) {
    (void)arg;
    coral_free(xh.blocks[0]); /* held at NOTIFY_PUSHED, the page FREEING */
    return NULL;
}

static void case_fork_exit_heap_notice(void) {
    /* coralloc's key first: this one's destructor runs after its cleanup. */
    coral_free(coral_malloc(16));
    CHECK_EQ(pthread_key_create(&xh.key, exit_heap_filler), 0);
    pthread_t exiting = start(exiting_thread, NULL);
    gate_wait_for(&xh.filled, GATES);
    gate_arm(CORAL_TP_NOTIFY_PUSHED, -1);
    pthread_t freer = start(free_exit_heap_block, NULL);
    gate_wait_held();
    gate_signal(&xh.fork_now);
    join(exiting);
    gate_open();
    join(freer);
    CHECK_MSG(WIFEXITED(xh.status) && WEXITSTATUS(xh.status) == 0,
              "child status 0x%x (SIGALRM: it hung waiting for a notifier it does not have)",
              xh.status);
}

/* ---- an owner of higher real-time priority waits for a notifier -----------------------
 * A full page's first remote free is in state FREEING (pushed on
 * delayed_pages, not yet NONE) when its owner, of a higher SCHED_FIFO
 * priority on the same CPU, is woken and takes the page back: the owner
 * waits for FREEING to end. A wait that spins and yields never lets a
 * thread of lower priority run (a yield gives way only to equal ones): the
 * owner spun forever. Now the wait sleeps after a while. A hang detector
 * of 5 s (no timing: the window closes in microseconds once the notifier
 * runs) raises the notifier's priority to end the hang, then fails.
 * SKIPPED where SCHED_FIFO is refused or only one CPU is allowed. */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool ready, go, done;
    int cpu; /* the CPU the owner and the notifier share */
    void *blocks[NOTIFY_MAX];
    size_t count;
} rt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, false, -1, {0}, 0};

/* The calling thread on CPU cpu, SCHED_FIFO at prio (0: SCHED_OTHER). */
static int rt_place(int cpu, int prio) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (rc != 0 || prio == 0) return rc;
    struct sched_param sp = {.sched_priority = prio};
    return pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
}

static void rt_flag(bool *flag) {
    pthread_mutex_lock(&rt.lock);
    *flag = true;
    pthread_cond_broadcast(&rt.cond);
    pthread_mutex_unlock(&rt.lock);
}

/* The notifier, in FREEING: wake the owner, which preempts it. */
static void rt_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_NOTIFY_PUSHED) rt_flag(&rt.go);
}

static void *rt_owner(void *arg) {
    (void)arg;
    char *first = coral_malloc(NOTIFY_SIZE), *next = NULL;
    size_t stride = coral_malloc_usable_size(first);
    rt.blocks[rt.count++] = first;
    while (next == NULL) { /* the first page fills and is parked as full */
        char *p = coral_malloc(NOTIFY_SIZE);
        CHECK(rt.count < NOTIFY_MAX);
        if (p == first + rt.count * stride)
            rt.blocks[rt.count++] = p;
        else
            next = p;
    }
    CHECK_EQ(rt_place(rt.cpu, 20), 0);
    pthread_mutex_lock(&rt.lock);
    rt.ready = true;
    pthread_cond_broadcast(&rt.cond);
    while (!rt.go) pthread_cond_wait(&rt.cond, &rt.lock);
    pthread_mutex_unlock(&rt.lock);
    coral_collect(0); /* takes the page back: waits for its notifier */
    rt_flag(&rt.done);
    CHECK_EQ(rt_place(rt.cpu, 0), 0);
    for (size_t i = 1; i < rt.count; i++) coral_free(rt.blocks[i]);
    coral_free(next);
    return NULL;
}

static void *rt_notifier(void *arg) {
    (void)arg;
    CHECK_EQ(rt_place(rt.cpu, 10), 0);
    coral_free(rt.blocks[0]); /* notifies the owner: rt_hook */
    return NULL;
}

static void case_rt_notice_wait(void) {
    cpu_set_t allowed;
    CHECK_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cpus[2], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
    struct sched_param sp = {.sched_priority = 1};
    if (n < 2 || pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) != 0) {
        printf("rt_notice_wait: SKIPPED (%s)\n", n < 2 ? "one CPU" : "SCHED_FIFO refused");
        exit(77);
    }
    sp.sched_priority = 0;
    CHECK_EQ(pthread_setschedparam(pthread_self(), SCHED_OTHER, &sp), 0);
    rt.cpu = cpus[0];
    CHECK_EQ(rt_place(cpus[1], 0), 0); /* this thread watches from the other CPU */
    coral_test_point_set(rt_hook);
    pthread_t owner = start(rt_owner, NULL);
    pthread_mutex_lock(&rt.lock);
    while (!rt.ready) pthread_cond_wait(&rt.cond, &rt.lock);
    pthread_mutex_unlock(&rt.lock);
    pthread_t notifier = start(rt_notifier, NULL);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5; /* a hang detector */
    pthread_mutex_lock(&rt.lock);
    while (!rt.done && pthread_cond_timedwait(&rt.cond, &rt.lock, &until) != ETIMEDOUT) {
    }
    bool hung = !rt.done;
    pthread_mutex_unlock(&rt.lock);
    if (hung) { /* the notifier above the owner: it leaves FREEING, the owner goes on */
        sp.sched_priority = 30;
        CHECK_EQ(pthread_setschedparam(notifier, SCHED_FIFO, &sp), 0);
    }
    join(notifier);
    join(owner);
    CHECK_MSG(!hung, "the owner (SCHED_FIFO 20) waited for its notifier (SCHED_FIFO 10, same CPU) "
                     "for 5 s without letting it run");
}

/* ---- the purge thread's watch for the last thread outlasts a slow destructor -------------
 * main ends with pthread_exit while the purge thread runs; coralloc's exit
 * cleanup tells the purge thread, which then looks for the process's last
 * thread every 5 ms for EXIT_WATCH_MS (2 s), then every 100 ms. A later key
 * destructor of the program (one that flushes a log to a slow disk, say)
 * runs past the fast looks: here it moves coralloc's clock past them and
 * returns once the purge thread has slowed its watch. main then ends: the
 * slow looks find no program thread left and end the process. (When the
 * watch ended after its 2 s, nothing ever looked again and the process
 * never ended: killed after 30 s.) */

static pthread_key_t watch_key;

static void slow_last_destructor(void *value) {
    (void)value;
    coral_test_advance_clock(10 * 1000);
    gate_wait_held(); /* the purge thread is past its fast looks */
    gate_open();
}

static void case_purger_watch_expired(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        static void *blocks[200000];
        for (size_t i = 0; i < 200000; i++) blocks[i] = coral_malloc(64);
        for (size_t i = 0; i < 200000; i++) coral_free(blocks[i]);
        coral_free(coral_malloc((size_t)8 << 20));
        coral_free(coral_malloc(64)); /* a safe point: the purge thread starts */
        CHECK_MSG(coral_test_purge_pass() == 1, "the purge thread did not start");
        CHECK_EQ(pthread_key_create(&watch_key, slow_last_destructor), 0); /* after coralloc's */
        pthread_setspecific(watch_key, &watch_key);
        gate_arm(CORAL_TP_EXIT_WATCH_SLOW, -1);
        pthread_exit(NULL);
    }
    expect_child_exit_0(pid, "the process whose last thread ended never did");
}

/* ---- the purge thread's start --------------------------------------------------------------
 * Its starter creates it, then marks it RUNNING: until then an exit
 * notice or a free's notification (coral_purger_notify) signals nothing,
 * and the new thread may already have read them and gone to wait with no
 * end. So the starter, once RUNNING, wakes it for what came meanwhile
 * (purger_wake_for_notices). Each case holds the starter S (a thread with
 * no heap, freeing main's huge block) at CORAL_TP_PURGER_STARTED and the
 * new thread at its wait (CORAL_TP_PURGER_WAIT), gives the notice, then
 * lets both go, in a fork child (the purge thread starts once). */

static void *free_block(void *arg) {
    coral_free(arg); /* the purge thread starts at its end: S is held */
    return NULL;
}

/* The fork child: S and the new purge thread held. */
static pthread_t hold_purger_start(void) {
    char *big = coral_malloc((size_t)8 << 20);
    CHECK_NOT_NULL(big);
    memset(big, 1, (size_t)8 << 20);
    gate_arm_at(0, CORAL_TP_PURGER_STARTED, -1);
    gate_arm_at(1, CORAL_TP_PURGER_WAIT, -1);
    pthread_t s = start(free_block, big);
    gate_wait_held_at(0);
    gate_wait_held_at(1);
    return s;
}

static void let_purger_start(void) {
    gate_open_at(1); /* the purge thread waits */
    gate_open_at(0); /* S marks it RUNNING */
}

/* main's exit notice (main ends with pthread_exit: the purge thread must
 * end the process once S, which never told, has ended too). Before
 * 4bd63d7 the notice was dropped (the process never ended); without the
 * starter's wake, the purge thread never looked. */
static pthread_key_t started_key;

static void open_after_notice(void *value) {
    (void)value;
    let_purger_start(); /* coralloc's cleanup gave main's notice before */
}

static void case_purger_started_notice(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* No segment cache: S's free unmaps the block, and notifies
         * nothing after RUNNING (which would wake the thread anyway). */
        CHECK_EQ(coral_option_set("SEGMENT_CACHE", 0), 0);
        (void)hold_purger_start();
        CHECK_EQ(pthread_key_create(&started_key, open_after_notice), 0); /* after coralloc's */
        pthread_setspecific(started_key, &started_key);
        pthread_exit(NULL);
    }
    expect_child_exit_0(pid, "the notice given while the purge thread started was not seen");
}

/* A free's notification: memory to purge, and the purge thread's
 * `pending` set, which it clears at its next pass. The starter did not
 * wake it for that: it waited with no end, `pending` stayed set, so every
 * later notification returned at once, and nothing was ever purged again
 * by it (the slow paths leave purging to a running purge thread). */
static _Atomic(int) purger_waits;

static void count_purger_waits(int point, const void *object) {
    gate_hook(point, object);
    if (point == CORAL_TP_PURGER_WAIT) {
        gates_enter();
        atomic_fetch_add(&purger_waits, 1);
        gates_wake();
        gates_leave();
    }
}

static void case_purger_started_free(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        pthread_t s = hold_purger_start();
        coral_test_point_set(count_purger_waits);
        char *big = coral_malloc((size_t)8 << 20);
        CHECK_NOT_NULL(big);
        memset(big, 2, (size_t)8 << 20);
        coral_free(big); /* notifies: nothing signalled yet */
        let_purger_start();
        join(s);
        gates_enter(); /* its next pass ends at the same wait */
        while (atomic_load(&purger_waits) < 1) gates_wait();
        gates_leave();
        _exit(0);
    }
    expect_child_exit_0(pid,
                        "the purge thread never passed again after a free made while it started");
}

/* ---- the exit watch while main lives ------------------------------------------------------
 * Threads that start, allocate and exit while the main thread lives: the
 * process cannot end by its last thread's exit, so the purge thread does
 * not walk /proc/self/task for it. Before, every exit made it walk the
 * directory (and read each task's stat) every 5 ms for 2 s: at once after
 * the exits, in the loop turn of its next pass. */

static _Atomic(int) watch_walks;

static void count_watch_walks(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_PURGER_WATCH) atomic_fetch_add(&watch_walks, 1);
}

static void *allocate_and_exit(void *arg) {
    (void)arg;
    void *p = coral_malloc(100);
    CHECK_NOT_NULL(p);
    coral_free(p);
    return NULL;
}

static void case_exit_watch(void) {
    /* 1.5 MiB freed: the purge thread starts. */
    void *big = coral_malloc(1536 * 1024);
    CHECK_NOT_NULL(big);
    memset(big, 1, 1536 * 1024);
    coral_free(big);
    CHECK_EQ(coral_test_purge_pass(), 1);
    coral_test_point_set(count_watch_walks);
    for (int i = 0; i < 20; i++) join(start(allocate_and_exit, NULL));
    CHECK_EQ(coral_test_purge_pass(), 1);
    CHECK_EQ(coral_test_purge_pass(), 1);
    CHECK_EQ(atomic_load(&watch_walks), 0);
}

/* ---- a parked page and an owner that comes back -------------------------------------------
 * The owner (this thread) fills 4 pages of 64-byte blocks and 8 of 15 KiB
 * blocks and frees them: behind the first page of each queue, 3 and 7
 * pages are parked (page/page.c, "Parked pages"), 1,088 KiB, enough for
 * the purge thread to start. The purger is held at one step of its
 * handshake on the oldest parked page (the second of 64-byte blocks) while
 * the owner comes back: it allocates 2,048 blocks of 64 bytes with calloc,
 * which empties the first page's list and then takes the parked page, and
 * writes each block. Whatever the step, no purge may touch a block the
 * owner took (each keeps its pattern once the purger is done) and every
 * block reads as zero when handed out:
 *   - claiming: held with the orphan lock, before its claim; the owner takes
 *     the page back first (with no lock: the gate opens when it has), so
 *     the purger finds it held and unlists it;
 *   - unlisted: claimed (RECLAIMED, BUSY) and unlisted, the lock held;
 *   - purging: claimed, about to return the memory;
 * in the last two the owner finds the claim and waits for the purge to end
 * (the gate opens when it starts waiting), then uses zero memory. */

enum { PARK_SMALL = 4 * 1024, PARK_MID = 8 * 8, PARK_TAKE = 2 * 1024 };
static void *park_small[PARK_SMALL], *park_mid[PARK_MID];

static long long park_reclaimed(void) { return stats_get("parked_bytes_reclaimed"); }

static void case_parked(int point, int opener, bool claimed) {
    for (size_t i = 0; i < PARK_SMALL; i++) CHECK((park_small[i] = coral_malloc(64)) != NULL);
    for (size_t i = 0; i < PARK_MID; i++) CHECK((park_mid[i] = coral_malloc(15360)) != NULL);
    for (size_t i = 0; i < PARK_SMALL; i++) memset(park_small[i], 0xab, 64);
    for (size_t i = 0; i < PARK_SMALL; i++) coral_free(park_small[i]);
    for (size_t i = 0; i < PARK_MID; i++) coral_free(park_mid[i]);
    long long reclaimed0 = park_reclaimed();
    gate_arm(point, opener);
    coral_test_advance_clock(3600 * 1000); /* every parked page due */
    purge_pass_done = false;
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_held();
    static char *taken[PARK_TAKE];
    for (size_t i = 0; i < PARK_TAKE; i++) {
        CHECK((taken[i] = coral_calloc(1, 64)) != NULL);
        for (size_t b = 0; b < 64; b++)
            CHECK_MSG(taken[i][b] == 0, "block %zu at %p not zero", i, (void *)taken[i]);
        fill_pattern(taken[i], 64, i);
    }
    gate_open(); /* (opened already by the owner's step) */
    join(purger);
    for (size_t i = 0; i < PARK_TAKE; i++)
        CHECK_MSG(pattern_mismatch(taken[i], 64, i) == (size_t)-1, "block %zu at %p changed", i,
                  (void *)taken[i]);
    CHECK_EQ(coral_test_check(), 0);
    /* The page the owner came back to was purged only if claimed first. */
    long long reclaimed = park_reclaimed() - reclaimed0;
    CHECK_EQ(reclaimed, (long long)((claimed ? 17 : 16) * 64 * 1024));
    for (size_t i = 0; i < PARK_TAKE; i++) coral_free(taken[i]);
}

static void case_parked_claiming(void) {
    case_parked(CORAL_TP_ORPHAN_CLAIMING, CORAL_TP_PARKED_TAKEN, false);
}
static void case_parked_unlisted(void) {
    case_parked(CORAL_TP_ORPHAN_UNLISTED, CORAL_TP_WAIT_BUSY, true);
}
static void case_parked_purging(void) {
    case_parked(CORAL_TP_ORPHAN_PURGING, CORAL_TP_WAIT_BUSY, true);
}

/* ---- a page set aside and an owner that comes back ---------------------------------------
 * The owner (this thread) fills a page of 256-byte blocks and part of a
 * second, and frees one block of the full page, which goes back to the
 * class queue behind the second: set aside (page/page.c, "Aside pages").
 * Another thread frees its other blocks (the first free lists it): no
 * block of it is live, one free block on the owner's own list. The purger
 * is held at one step of its look at the page while the owner comes back:
 * it allocates 156 + 256 blocks with calloc, which fills the second page
 * and makes the aside one first (taken back), and writes each block.
 * Whatever the step, no purge touches a block the owner took, and every
 * block reads as zero when handed out (the blocks of the page, dirty, are
 * cleared by calloc unless the purge made them zero):
 *   - claiming: held with the orphan lock, before its look; the owner takes
 *     the page back first (the gate opens once its RMW cleared ASIDE), so
 *     the purger finds it held and unlists it: nothing returned;
 *   - unlisted, purging: claimed; the owner's RMW finds the claim, it waits
 *     for the purge to end (the gate opens when it starts waiting) and
 *     takes the page back empty: its 64 KiB returned. */
enum { ASIDE_PAGE = 256, ASIDE_FIRST = 100, ASIDE_TAKE = ASIDE_PAGE - ASIDE_FIRST + ASIDE_PAGE };
static char *aside_blocks[ASIDE_PAGE + ASIDE_FIRST];

static bool aside_freed, aside_done;

/* The other thread frees the page's blocks, then idles until the case is
 * done: its exit (which frees what the thread start allocated here) comes
 * after the checks. */
static void *free_aside_page(void *arg) {
    (void)arg;
    for (size_t i = 1; i < ASIDE_PAGE; i++) coral_free(aside_blocks[i]);
    gate_signal(&aside_freed);
    gate_wait_for(&aside_done, GATES);
    return NULL;
}

static void case_aside(int point, int opener, bool claimed) {
    for (size_t i = 0; i < ASIDE_PAGE + ASIDE_FIRST; i++) {
        CHECK((aside_blocks[i] = coral_malloc(256)) != NULL);
        memset(aside_blocks[i], 0xab, 256);
    }
    coral_free(aside_blocks[0]); /* the full page goes behind the first: aside */
    pthread_t freer = start(free_aside_page, NULL);
    gate_wait_for(&aside_freed, GATES);
    long long reclaimed0 = stats_get("aside_bytes_reclaimed");
    gate_arm(point, opener);
    coral_test_advance_clock(3600 * 1000); /* the page is due */
    purge_pass_done = false;
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_held();
    static char *taken[ASIDE_TAKE];
    for (size_t i = 0; i < ASIDE_TAKE; i++) {
        CHECK((taken[i] = coral_calloc(1, 256)) != NULL);
        for (size_t b = 0; b < 256; b++)
            CHECK_MSG(taken[i][b] == 0, "block %zu at %p not zero", i, (void *)taken[i]);
        fill_pattern(taken[i], 256, i);
    }
    gate_open(); /* (opened already by the owner's step) */
    join(purger);
    for (size_t i = 0; i < ASIDE_TAKE; i++)
        CHECK_MSG(pattern_mismatch(taken[i], 256, i) == (size_t)-1, "block %zu at %p changed", i,
                  (void *)taken[i]);
    CHECK_EQ(coral_test_check(), 0);
    CHECK_EQ(stats_get("aside_bytes_reclaimed") - reclaimed0, claimed ? 64 * 1024 : 0);
    gate_signal(&aside_done);
    join(freer);
    for (size_t i = 0; i < ASIDE_TAKE; i++) coral_free(taken[i]);
    for (size_t i = ASIDE_PAGE; i < ASIDE_PAGE + ASIDE_FIRST; i++) coral_free(aside_blocks[i]);
}

static void case_aside_claiming(void) {
    case_aside(CORAL_TP_ORPHAN_CLAIMING, CORAL_TP_UNASIDE, false);
}
static void case_aside_unlisted(void) {
    case_aside(CORAL_TP_ORPHAN_UNLISTED, CORAL_TP_WAIT_BUSY, true);
}
static void case_aside_purging(void) {
    case_aside(CORAL_TP_ORPHAN_PURGING, CORAL_TP_WAIT_BUSY, true);
}

/* ---- a page set aside again while the purger is about to claim it ------------------------
 * The claim's ABA (page/page.c, "Aside pages": RENEWED). The owner fills a
 * page of 256-byte blocks (A) and part of a second, and frees every block
 * of A but X itself: A goes behind the second, set aside. Another thread
 * frees X (the push lists A): no block of A is live, `used` 1, the word's
 * list X and count 1. The purger reads the word and `used` and is held
 * before its claim's CAS. The owner comes back: it fills the second page,
 * so A becomes first (taken back); it allocates A's 255 free blocks, then
 * X (its take of thread_free) and one block more, which moves A to the full
 * queue and puts a new page first. The other thread frees X again (the
 * word's list and count are again X and 1), and the owner frees one of A's
 * blocks: A goes behind the new page, set aside again. The word is then the
 * one the purger read but for RENEWED, which setting a listed page aside
 * adds: the claim's CAS fails, and none of the 254 blocks of A the owner
 * holds changes. Without RENEWED the CAS succeeds and the purge zeroes them.
 * `pushed`: the other thread frees X after the owner set A aside again: a
 * push keeps RENEWED (before the fix a push cleared it, as it does on a
 * parked page, where no push may come: then the word was the one the
 * purger read, and the purge zeroed the 254 blocks). */
static char *reaside_a[ASIDE_PAGE], *reaside_held[ASIDE_PAGE + ASIDE_PAGE];
static char *reaside_x;
static bool reaside_go[2], reaside_freed[2], reaside_done;

static void *reaside_freer(void *arg) {
    (void)arg;
    for (int i = 0; i < 2; i++) {
        gate_wait_for(&reaside_go[i], GATES);
        coral_free(reaside_x);
        gate_signal(&reaside_freed[i]);
    }
    gate_wait_for(&reaside_done, GATES);
    return NULL;
}

static bool in_page_a(const char *p) {
    return p >= reaside_a[0] && p < reaside_a[0] + ASIDE_PAGE * 256;
}

static void case_reaside(bool push_last) {
    for (size_t i = 0; i < ASIDE_PAGE; i++) CHECK((reaside_a[i] = coral_malloc(256)) != NULL);
    /* (A fresh page's blocks in address order: one page, X first.) */
    CHECK(reaside_a[ASIDE_PAGE - 1] == reaside_a[0] + (ASIDE_PAGE - 1) * 256);
    for (size_t i = 0; i < ASIDE_FIRST; i++) CHECK(coral_malloc(256) != NULL); /* (kept) */
    for (size_t i = 1; i < ASIDE_PAGE; i++) coral_free(reaside_a[i]);
    reaside_x = reaside_a[0];
    pthread_t freer = start(reaside_freer, NULL);
    gate_signal(&reaside_go[0]);
    gate_wait_for(&reaside_freed[0], GATES);
    long long reclaimed0 = stats_get("aside_bytes_reclaimed");
    gate_arm(CORAL_TP_ASIDE_CLAIM, -1);
    coral_test_advance_clock(3600 * 1000); /* the page is due */
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_held();
    /* The owner comes back: the second page's blocks, then A's. */
    size_t n = 0, in_a = 0;
    char *p;
    do {
        CHECK(n < ASIDE_PAGE && (p = coral_malloc(256)) != NULL);
        reaside_held[n++] = p;
    } while (!in_page_a(p));
    for (in_a = 1; in_a < ASIDE_PAGE - 1; in_a++) {
        CHECK((p = coral_malloc(256)) != NULL && in_page_a(p) && p != reaside_x);
        reaside_held[n++] = p;
    }
    CHECK(coral_malloc(256) == reaside_x);                   /* taken from thread_free */
    CHECK((p = coral_malloc(256)) != NULL && !in_page_a(p)); /* A full: a new first page */
    reaside_held[n++] = p;
    for (size_t i = 0; i < n; i++) fill_pattern(reaside_held[i], 256, i);
    if (!push_last) {
        gate_signal(&reaside_go[1]); /* X freed again */
        gate_wait_for(&reaside_freed[1], GATES);
    }
    size_t back = n - 2; /* a block of A: A goes back behind the first, set aside */
    CHECK(in_page_a(reaside_held[back]));
    coral_free(reaside_held[back]);
    reaside_held[back] = NULL;
    if (push_last) {
        gate_signal(&reaside_go[1]);
        gate_wait_for(&reaside_freed[1], GATES);
    }
    gate_open();
    join(purger);
    for (size_t i = 0; i < n; i++)
        if (reaside_held[i] != NULL)
            CHECK_MSG(pattern_mismatch(reaside_held[i], 256, i) == (size_t)-1,
                      "block %zu at %p changed", i, (void *)reaside_held[i]);
    CHECK_EQ(stats_get("aside_bytes_reclaimed") - reclaimed0, 0);
    CHECK_EQ(coral_test_check(), 0);
    gate_signal(&reaside_done);
    join(freer);
    for (size_t i = 0; i < n; i++) coral_free(reaside_held[i]);
}

static void case_aside_reaside(void) { case_reaside(false); }
static void case_aside_reaside_pushed(void) { case_reaside(true); }

/* A page parked, taken back and parked again while still listed: the
 * owner's one CAS that needs LISTED. The owner (a thread of its own) fills
 * 4 pages of 64-byte blocks and frees them (3 parked and listed), takes
 * the oldest two back, and frees the blocks of the oldest again: it sees
 * the page still listed and is held just before its CAS while the purger,
 * past the delay, finds the page held and unlists it (clearing LISTED).
 * The owner's CAS then fails, and it lists the page anew, under the lock:
 * a pass a delay later returns it, with no call from the owner. (Were the
 * listing read apart from the CAS, the page would stay parked and
 * unlisted, and the second pass would return nothing.) */
static bool park_again_idle, park_again_done;

static void *park_again_owner(void *arg) {
    (void)arg;
    for (size_t i = 0; i < PARK_SMALL; i++) CHECK((park_small[i] = coral_malloc(64)) != NULL);
    for (size_t i = 0; i < PARK_SMALL; i++) coral_free(park_small[i]);
    /* The first page's 1024 blocks, then the two oldest parked pages. */
    for (size_t i = 0; i < 3 * 1024; i++) CHECK((park_small[i] = coral_malloc(64)) != NULL);
    coral_test_advance_clock(3600 * 1000); /* every page listed is due */
    for (size_t i = 1024; i < 2 * 1024; i++) coral_free(park_small[i]); /* parked again */
    CHECK_EQ(coral_test_check(), 0);
    gate_signal(&park_again_idle);
    gate_wait_for(&park_again_done, GATES); /* idle: no call (its exit would take the page) */
    return NULL;
}

static void case_parked_again(void) {
    long long reclaimed0 = park_reclaimed();
    gate_arm(CORAL_TP_PARK_AGAIN, CORAL_TP_ORPHAN_UNLISTED);
    pthread_t owner = start(park_again_owner, NULL);
    gate_wait_held();
    purge_pass_done = false;
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_for(&park_again_idle, GATES);
    join(purger);
    /* The pass returned the one page still parked since the first frees. */
    CHECK_EQ(park_reclaimed() - reclaimed0, 64 * 1024);
    coral_test_advance_clock(3600 * 1000);
    coral_test_purge_pass();
    CHECK_EQ(park_reclaimed() - reclaimed0, 2 * 64 * 1024);
    gate_signal(&park_again_done);
    join(owner);
}

/* A thread that exits while the purger holds its parked pages: the owner
 * (a thread of its own) fills and frees 4 pages of 64-byte blocks and 8
 * of 15 KiB blocks, and waits; the purger, past the delay, claims every
 * parked page in one batch and is held before it returns the first one's
 * memory (BUSY). The owner then exits: it takes each claimed page back
 * once its purge ends (the gate opens when it starts waiting) and
 * releases it with the rest, so that no page or segment of the thread
 * is left: its span and segment figures fall back to where they were
 * before it started, every parked page counts as returned once, and a
 * later thread uses the memory with no trace of the old blocks. */
static bool exit_owner_freed, exit_owner_go;

static void *exiting_parker(void *arg) {
    (void)arg;
    for (size_t i = 0; i < PARK_SMALL; i++) CHECK((park_small[i] = coral_malloc(64)) != NULL);
    for (size_t i = 0; i < PARK_MID; i++) CHECK((park_mid[i] = coral_malloc(15360)) != NULL);
    for (size_t i = 0; i < PARK_SMALL; i++) memset(park_small[i], 0xab, 64);
    for (size_t i = 0; i < PARK_SMALL; i++) coral_free(park_small[i]);
    for (size_t i = 0; i < PARK_MID; i++) coral_free(park_mid[i]);
    CHECK_EQ(coral_test_check(), 0);
    gate_signal(&exit_owner_freed);
    gate_wait_for(&exit_owner_go, GATES); /* idle until the purger holds its pages */
    return NULL;                          /* exits */
}

static void *calloc_user(void *arg) {
    (void)arg;
    for (size_t i = 0; i < PARK_SMALL; i++) {
        char *p = coral_calloc(1, 64);
        CHECK(p != NULL);
        for (size_t b = 0; b < 64; b++) CHECK_MSG(p[b] == 0, "block %p not zero", (void *)p);
    }
    CHECK_EQ(coral_test_check(), 0);
    return NULL;
}

static void case_parked_exit(void) {
    coral_free(coral_malloc(1));
    long long segments0 = stats_get("segments"), pages0 = stats_get("page_bytes");
    long long reclaimed0 = park_reclaimed(), count0 = stats_get("parked_pages_reclaimed");
    pthread_t owner = start(exiting_parker, NULL);
    gate_wait_for(&exit_owner_freed, GATES);
    gate_arm(CORAL_TP_ORPHAN_PURGING, CORAL_TP_WAIT_BUSY);
    coral_test_advance_clock(3600 * 1000); /* every parked page due */
    purge_pass_done = false;
    pthread_t purger = start(purge_pass_thread, NULL);
    gate_wait_held();
    gate_signal(&exit_owner_go);
    join(owner);
    join(purger);
    long long pages = stats_get("parked_pages_reclaimed") - count0;
    printf("an owner's exit while the purger held its parked pages: %lld pages (%lld KiB) "
           "returned; segments %lld -> %lld, bytes in pages %lld -> %lld\n",
           pages, (park_reclaimed() - reclaimed0) / 1024, segments0, stats_get("segments"), pages0,
           stats_get("page_bytes"));
    /* Every page but the first of each class queue (kept, never parked):
     * 3 pages of 64-byte blocks (64 KiB each), 7 of 15 KiB blocks (128). */
    CHECK_EQ(pages, 10);
    CHECK_EQ(park_reclaimed() - reclaimed0, (3 * 64 + 7 * 128) * 1024);
    CHECK_EQ(stats_get("segments"), segments0);
    CHECK_EQ(stats_get("page_bytes"), pages0);
    CHECK_EQ(coral_test_check(), 0);
    join(start(calloc_user, NULL));
}

/* ---- a fork while the segment cache is purged --------------------------------------------
 * A purger takes a dirty region out of the segment cache, returns its
 * memory and puts it back (cache.c). A fork in between would leave the
 * child without the region: still mapped, its data resident in the child
 * (the purge was the parent's), and reused by nobody, since the child's
 * cache no longer holds it. A thread of the test runs a forced pass
 * (coral_collect(0)) and is held with the freed segment of a 6 MiB block
 * out of the table while the main thread forks; the fork waits for the
 * purge to end (the gate opens when it starts waiting), and the child
 * takes a block of the same size from that region, with no new mapping.
 * Without the wait the child mapped a new segment for it: the region was
 * lost to the child. */
#define CACHE_BLOCK ((size_t)6 << 20)

static void *forced_pass_thread(void *arg) {
    (void)arg;
    coral_collect(0); /* a forced pass: every dirty region of the cache */
    return NULL;
}

static void fork_cache_child(uintptr_t region) {
    long long maps = stats_os_calls("mmap");
    char *again = coral_malloc(CACHE_BLOCK);
    CHECK(again != NULL);
    CHECK_MSG((uintptr_t)again - region < ((size_t)8 << 20),
              "the child's block at %p is not in the region at %p, which the fork lost",
              (void *)again, (void *)region);
    CHECK_EQ(stats_os_calls("mmap"), maps);
    memset(again, 1, CACHE_BLOCK);
    coral_free(again);
    coral_collect(1);
    CHECK_EQ(coral_test_check(), 0);
    _exit(0);
}

/* A thread of the test runs fn and is held at `point` with the region at
 * `region` (the point's object) out of the cache's table; the main thread
 * forks, child(region) runs in the child, and the gate opens at `opener`,
 * where the fork starts to wait for the held thread. */
static thread_fn held_fn;
static bool held_fork_done;

/* The held thread runs on until the child has ended: the fork's wait lets
 * it go before the fork is made, and a thread that ended unjoined before
 * the fork is a thread leak to TSan at the child's exit. */
static void *held_until_fork_done(void *arg) {
    held_fn(arg);
    gate_wait_for(&held_fork_done, GATES);
    return NULL;
}

static void fork_while_held(thread_fn fn, int point, int opener, uintptr_t region,
                            void (*child)(uintptr_t)) {
    held_fn = fn;
    held_fork_done = false;
    gate_arm(point, opener);
    pthread_t held = start(held_until_fork_done, NULL);
    CHECK_EQ((uintptr_t)gate_wait_held(), region);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) child(region);
    expect_child_exit_0(pid, "the fork child did not end");
    gate_signal(&held_fork_done);
    gate_open(); /* (opened already by the fork's wait) */
    join(held);
}

static void case_fork_cache_purge(void) {
    char *block = coral_malloc(CACHE_BLOCK);
    CHECK(block != NULL);
    memset(block, 7, CACHE_BLOCK);
    uintptr_t region = (uintptr_t)block & ~(uintptr_t)((4u << 20) - 1);
    coral_free(block); /* its segment goes to the cache, dirty */
    fork_while_held(forced_pass_thread, CORAL_TP_CACHE_PURGING, CORAL_TP_FORK_CACHE_WAIT, region,
                    fork_cache_child);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a fork while the full segment cache evicts ------------------------------------------
 * A region put into the full segment cache makes room: the least recently
 * freed regions leave the table and are unmapped (cache.c, cache_insert). A
 * fork in between would leave the child those regions mapped, their data
 * resident in the child, and referenced by nothing (its cache no longer
 * holds them, and the unmap was the parent's). The cache holds two 8 MiB
 * regions (CORALLOC_SEGMENT_CACHE=4: 16 MiB), those of blocks A and B; a
 * thread of the test frees a third, C, and is held with A's region out of
 * the table, not yet unmapped, while the main thread forks; the fork waits
 * for the unmap (the gate opens when it starts waiting), and the child has
 * no mapping there. Without the wait the child kept all of A's region. */
static void *evict_block;

static void *free_evict_block(void *arg) {
    (void)arg;
    coral_free(evict_block); /* the cache is full: the oldest region leaves */
    return NULL;
}

/* Whether no page of [base, base + size) is mapped in full: mincore fails
 * with ENOMEM when any page of the range is not mapped. */
static bool range_unmapped(uintptr_t base, size_t size) {
    static unsigned char vec[((size_t)8 << 20) / 4096];
    CHECK(size / (size_t)sysconf(_SC_PAGESIZE) <= sizeof vec);
    return mincore((void *)base, size, vec) == -1 && errno == ENOMEM;
}

static void fork_evict_child(uintptr_t region) {
    CHECK_MSG(range_unmapped(region, (size_t)8 << 20),
              "the evicted region at %p is still mapped in the fork child, in no table",
              (void *)region);
    CHECK_EQ(coral_test_check(), 0);
    _exit(0);
}

static void case_fork_cache_evict(void) {
    char *blocks[3];
    for (int i = 0; i < 3; i++) {
        blocks[i] = coral_malloc(CACHE_BLOCK);
        CHECK(blocks[i] != NULL);
        memset(blocks[i], 7, CACHE_BLOCK);
    }
    uintptr_t oldest = (uintptr_t)blocks[0] & ~(uintptr_t)((4u << 20) - 1);
    coral_free(blocks[0]);
    coral_test_advance_clock(1000); /* A the least recently freed */
    coral_free(blocks[1]);
    coral_test_advance_clock(1000);
    evict_block = blocks[2];
    fork_while_held(free_evict_block, CORAL_TP_CACHE_EVICTING, CORAL_TP_FORK_EVICT_WAIT, oldest,
                    fork_evict_child);
    CHECK(range_unmapped(oldest, (size_t)8 << 20));
    CHECK_EQ(coral_test_check(), 0);
}

/* A fork child: a bulk call (and with huge, a huge block's malloc and free),
 * then the end; a hang ends it (the parent sees SIGALRM). No gate holds it
 * (one armed in the parent would hold it for good). */
static void child_bulk_call(bool huge) {
    alarm(20);
    coral_test_point_set(NULL);
    void *blocks[8];
    CHECK_EQ(coral_malloc_bulk(48, 8, blocks), 8);
    coral_free_bulk(blocks, 8);
    if (huge) coral_free(coral_malloc(HUGE));
    _exit(0);
}

/* A thread that forks; its child makes a bulk call and a huge block. */
static void *fork_and_wait(void *arg) {
    (void)arg;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) child_bulk_call(true);
    expect_child_exit_0(pid, "a fork child did not end");
    return NULL;
}

/* ---- the first bulk cache made while another thread forks ----------------------------
 * A fork must hold the bulk caches' locks (flush, registry) from its
 * prepare handler on, whether the process has made a cache yet or not: a
 * thread that makes the first cache while another is inside fork() lists
 * it under the registry lock, and a fork child that inherited that lock
 * held (by a thread the child does not have) waited forever at its first
 * bulk call. The hooks that take the locks were set by the first cache: a
 * fork whose prepare handler had looked before did not take them (and,
 * before 133d468, its parent handler unlocked them all the same). The
 * forking thread is held once it has taken every lock, in a process that
 * has made no cache; another thread makes the first cache and is held
 * while it lists it (the registry lock held). If the new cache waits for
 * the fork's registry lock, the wait lets the fork go first (the gate
 * opens there); else the fork is made while the registry lock is held, and
 * the child's bulk call waits forever (its alarm ends it). */
enum { FIRST_CACHE_BLOCKS = 64 };
static void *first_cache_blocks[FIRST_CACHE_BLOCKS];
static bool first_cache_ready, first_cache_go;

static void *first_cache_maker(void *arg) {
    (void)arg;
    /* (Its heap first: the fork holds the heap pool's lock.) */
    CHECK_EQ(coral_malloc_bulk(48, FIRST_CACHE_BLOCKS, first_cache_blocks), FIRST_CACHE_BLOCKS);
    gate_signal(&first_cache_ready);
    gate_wait_for(&first_cache_go, GATES);
    coral_free_bulk(first_cache_blocks, FIRST_CACHE_BLOCKS); /* makes the first cache */
    return NULL;
}

static void case_fork_hooks_set(void) {
    pthread_t maker = start(first_cache_maker, NULL);
    gate_wait_for(&first_cache_ready, GATES);
    gate_arm_at(0, CORAL_TP_FORK_PREPARED, CORAL_TP_BULK_REGISTRY_WAIT);
    fflush(stdout);
    pthread_t forker = start(fork_and_wait, NULL);
    gate_wait_held_at(0);
    gate_arm_at(1, CORAL_TP_BULK_CACHE_LISTING, -1);
    gate_signal(&first_cache_go);
    gate_wait_held_at(1);
    bool waited = !gate_holds(0); /* the fork was let go by the cache's wait */
    gate_open_at(0);
    join(forker);
    gate_open_at(1);
    join(maker);
    CHECK_MSG(waited, "the first bulk cache was listed while a fork held every lock but the "
                      "caches' registry lock");
    pid_t pid;
    /* The next fork takes the hooks' locks and gives them back. */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(0);
    expect_child_exit_0(pid, "the second fork child did not end");
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- two threads fork at once ----------------------------------------------------------
 * glibc (2.36) runs a fork's atfork handlers without its own lock held, so
 * the prepare handlers of two forks run at the same time: the second's
 * stops at the first lock the first fork holds. What a prepare handler
 * records for its own fork's parent and child handlers (the layer above's
 * hooks it ran, the forking thread's id) must be that fork's alone: shared
 * by the two, the second's records were written while the first fork was
 * between its prepare and its parent and child handlers, which read them.
 * The first fork is held once it has taken every lock while a second
 * thread forks; each child makes a bulk call, allocates and ends. Under
 * TSan, before the records were per fork: a data race on them. */
static void case_fork_concurrent(void) {
    void *blocks[8]; /* the bulk caches' fork hooks are set */
    CHECK_EQ(coral_malloc_bulk(48, 8, blocks), 8);
    coral_free_bulk(blocks, 8);
    fflush(stdout);
    gate_arm(CORAL_TP_FORK_PREPARED, -1);
    pthread_t first = start(fork_and_wait, NULL);
    gate_wait_held();
    pthread_t second = start(fork_and_wait, NULL); /* its prepare runs up to a held lock */
    gate_open();
    join(first);
    join(second);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a program's own fork handlers that allocate -------------------------------------
 * glibc runs the prepare handlers last registered first, the parent and
 * child handlers in the order of registration. coralloc's take and release
 * every lock it has: a program's handlers that allocate or free must run
 * outside them (its prepare before coralloc's, its parent and child
 * after), so coralloc's must come first. This program registers its own
 * before its first allocation; its prepare handler checks that coralloc's
 * has not taken its locks yet in this fork, then allocates a huge block
 * (the huge-block list lock, and the segment cache's); the parent and child
 * handlers free it and allocate and free another. When coralloc registered
 * its handlers at the first allocation, after the program's, its prepare
 * ran first and the program's malloc waited forever for a lock its own
 * thread held (under LD_PRELOAD, a 1 MiB malloc in a prepare handler
 * never returned). */
static _Atomic(int) forks_prepared; /* FORK_PREPARED points reached */
static char *atfork_block;

static void count_forks_prepared(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_FORK_PREPARED) atomic_fetch_add(&forks_prepared, 1);
}

static void atfork_prepare(void) {
    CHECK_MSG(atomic_load(&forks_prepared) == 0,
              "coralloc's fork handler took its locks before the prepare handler of a program "
              "that registered it before its first malloc: that handler's malloc would wait "
              "for them forever");
    atfork_block = coral_malloc(HUGE);
    CHECK(atfork_block != NULL);
    memset(atfork_block, 1, 4096);
}

static void atfork_after(void) {
    coral_free(atfork_block);
    coral_free(coral_malloc(HUGE));
}

static void *no_allocation(void *arg) { return arg; }

static void case_fork_atfork_first(void) {
    CHECK_EQ(pthread_atfork(atfork_prepare, atfork_after, atfork_after), 0);
    /* Multi-threaded, so that coralloc's prepare handler takes its locks (in
     * a single-threaded process it takes none); the thread allocates
     * nothing of coralloc's. */
    join(start(no_allocation, NULL));
    coral_test_point_set(count_forks_prepared);
    coral_free(coral_malloc(64)); /* the program's first allocation */
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        CHECK_EQ(coral_test_check(), 0);
        _exit(0);
    }
    expect_child_exit_0(pid, "the fork child did not end");
    CHECK_EQ(atomic_load(&forks_prepared), 1);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a fork while a thread past its exit cleanup is sampled by the profiler ----------
 * The heap profiler samples an allocation from the exit heap under the exit
 * heap's lock, and takes its own table locks for the sample. A fork's
 * handlers take the profiler's locks too: they must come after every
 * allocator lock (the profiler's are leaves), or an exiting thread that
 * holds the exit heap's lock waits for a table lock the fork holds while
 * the fork waits for the exit heap's lock. The profiler registered its own
 * atfork handlers after coralloc's, so glibc ran its prepare handler first:
 * the forking thread is held at the start of coralloc's prepare handler,
 * and a thread in a late key destructor (past coralloc's exit cleanup)
 * allocates a sampled block (CORALLOC_PROFILE_RATE=1) meanwhile. Before
 * the fix it spun for good holding the exit heap's lock (the test's alarm
 * ends it); now the allocation ends and so does the fork. */
static struct {
    pthread_key_t key;
    bool in_destructor, go, allocated;
} ps;

static void late_sampled_alloc(void *value) {
    (void)value;
    gate_signal(&ps.in_destructor);
    gate_wait_for(&ps.go, GATES);
    coral_free(coral_malloc(64)); /* from the exit heap, sampled */
    gate_signal(&ps.allocated);
}

static void *exit_late(void *arg) {
    (void)arg;
    coral_free(coral_malloc(16)); /* a heap: coralloc's exit cleanup runs */
    pthread_setspecific(ps.key, &ps);
    return NULL;
}

static void *fork_and_end(void *arg) {
    (void)arg;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(0);
    expect_child_exit_0(pid, "the fork child did not end");
    return NULL;
}

static void case_fork_profiled_exit(void) {
    alarm(60);                    /* a hang ends the test (SIGALRM) */
    coral_free(coral_malloc(16)); /* coralloc's key first, and the profiler is on */
    CHECK_EQ(pthread_key_create(&ps.key, late_sampled_alloc), 0);
    pthread_t exiting = start(exit_late, NULL);
    gate_wait_for(&ps.in_destructor, GATES);
    gate_arm(CORAL_TP_FORK_PREPARE, -1);
    fflush(stdout);
    pthread_t forker = start(fork_and_end, NULL);
    gate_wait_held();
    gate_signal(&ps.go);
    gate_wait_for(&ps.allocated, GATES);
    gate_open();
    join(forker);
    join(exiting);
}

/* ---- a fork while another thread adds a sample to its profiler tally -------------------
 * A thread adds its samples to its own tally with no lock (profile.c), so
 * the fork's locks do not keep it out of the middle of an add: the child
 * may inherit a tally entry with the sample's objects written and not its
 * bytes, from a thread that is not there to finish it. A thread is held at
 * CORAL_TP_PROFILE_TALLY_ADDING (objects written, bytes not) and the main
 * thread forks. Every allocation is of 64 bytes at CORALLOC_PROFILE_RATE=1:
 * each is sampled with probability 1 - e^-64 = 1.0 (as a double), so counts
 * exactly 1 object and 64 bytes, and every site's bytes are 64 times its
 * objects unless a sample is counted in part. Before the fix the child's
 * totals held the held thread's sample as 1 object and 0 bytes; now the
 * child counts it not at all (it was not made when the child was), and the
 * parent, once the thread goes on, whole. */
#define TALLY_BLOCK 64

static __attribute__((noinline)) void *tally_site_alloc(void) {
    void *p = coral_malloc(TALLY_BLOCK);
    __asm__ volatile("" ::"r"(p) : "memory"); /* (not a tail call: this frame stays) */
    return p;
}

static void *sample_once(void *arg) {
    (void)arg;
    coral_free(tally_site_alloc());
    return NULL;
}

static void case_profile_fork_tally(void) {
    alarm(60);
    coral_free(coral_malloc(TALLY_BLOCK)); /* the profiler is on */
    double before = 0.0;
    CHECK_EQ(profile_sites_inconsistent(TALLY_BLOCK, &before), 0);
    gate_arm(CORAL_TP_PROFILE_TALLY_ADDING, -1);
    pthread_t sampler = start(sample_once, NULL);
    gate_wait_held();
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        coral_test_point_set(NULL);
        double objects = 0.0;
        size_t bad = profile_sites_inconsistent(TALLY_BLOCK, &objects);
        CHECK_MSG(bad == 0, "the child holds %zu sites' samples counted in part", bad);
        CHECK_MSG(objects == before, "the child's samples: %g, before the fork %g", objects,
                  before);
        _exit(0);
    }
    expect_child_exit_0(pid, "the fork child did not end");
    gate_open();
    join(sampler);
    double objects = 0.0;
    CHECK_EQ(profile_sites_inconsistent(TALLY_BLOCK, &objects), 0);
    CHECK_MSG(objects == before + 1.0, "the parent's samples: %g, expected %g", objects,
              before + 1.0);
}

/* ---- a fork from a handler inside the profiler's section ------------------------------
 * A signal handler may fork while its thread is inside the profiler's
 * critical section, in a multi-threaded process: here in the middle of an
 * add to its tally (CORAL_TP_PROFILE_TALLY_ADDING, where it holds no
 * profiler lock; the hook forks as a handler run there would), while
 * another thread records a sample, holding its live bucket's lock
 * (CORAL_TP_PROFILE_RECORDING). The child returns from the handler and
 * frees that thread's block, whose record is in that bucket. Before, the
 * fork's prepare took none of the profiler's locks for a fork from inside
 * the section, so the child inherited the bucket's lock held by a thread
 * it does not have, and its free waited forever (its alarm ended it). Now
 * the prepare takes them when its thread holds none, waiting for the
 * other thread's (CORAL_TP_PROFILE_FORK_WAIT lets it go). */
static pid_t section_parent, section_child = -1;
static bool section_child_ended;

static void *sample_and_hold(void *arg) {
    void *p = tally_site_alloc(); /* held at RECORDING, its bucket's lock held */
    gate_wait_for(&section_child_ended, GATES);
    coral_free(p);
    return arg;
}

static void fork_in_tally_add(int point, const void *object) {
    gate_hook(point, object);
    if (point != CORAL_TP_PROFILE_TALLY_ADDING || section_child != -1 || !gate_holds(0)) return;
    section_child = fork(); /* (as a signal handler's) */
    if (section_child == 0) alarm(20);
}

static void case_fork_in_profile_section(void) {
    alarm(60);
    coral_free(coral_malloc(TALLY_BLOCK)); /* the profiler is on */
    section_parent = getpid();
    gate_arm(CORAL_TP_PROFILE_RECORDING, CORAL_TP_PROFILE_FORK_WAIT);
    coral_test_point_set(fork_in_tally_add);
    pthread_t sampler = start(sample_and_hold, NULL);
    void *held = (void *)gate_wait_held();
    fflush(stdout);
    void *mine = tally_site_alloc();  /* its add forks */
    if (getpid() != section_parent) { /* the child, back from the handler */
        coral_test_point_set(NULL);
        coral_free(held);
        coral_free(mine);
        _exit(coral_test_check() == 0 ? 0 : 3);
    }
    coral_test_point_set(NULL);
    CHECK(section_child > 0);
    expect_child_exit_0(section_child, "the child of the fork inside the section did not end");
    gate_open(); /* (opened by the fork's wait, after the fix) */
    gate_signal(&section_child_ended);
    join(sampler);
    coral_free(mine);
    alarm(0);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a dump from a handler inside the profiler's section ------------------------------
 * coral_profile_dump from a signal handler that interrupted its own thread
 * in the middle of an add to its tally (the hook at
 * CORAL_TP_PROFILE_TALLY_ADDING calls it as such a handler would) cannot
 * read that thread's tally: it is refused with EBUSY. Before, it returned
 * 0 and wrote a profile without the thread's samples. */
static int dump_in_section_rc = 1, dump_in_section_errno;

static void dump_in_tally_add(int point, const void *object) {
    (void)object;
    if (point != CORAL_TP_PROFILE_TALLY_ADDING || dump_in_section_rc != 1) return;
    char path[64];
    snprintf(path, sizeof path, "/tmp/coral-dump-in-section.%d", (int)getpid());
    dump_in_section_rc = coral_profile_dump(path);
    dump_in_section_errno = errno;
    unlink(path);
}

static void case_dump_in_profile_section(void) {
    coral_free(coral_malloc(TALLY_BLOCK)); /* the profiler is on */
    coral_test_point_set(dump_in_tally_add);
    void *p = tally_site_alloc(); /* its add dumps */
    coral_test_point_set(NULL);
    CHECK_MSG(dump_in_section_rc == -1 && dump_in_section_errno == EBUSY,
              "a dump from inside the section returned %d (errno %d), expected -1 (EBUSY)",
              dump_in_section_rc, dump_in_section_errno);
    coral_free(p);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a fork during the process's first allocation --------------------------------------
 * A thread's first allocation takes the heap pool's lock for its heap. The
 * fork handlers that take that lock must be registered before any thread
 * can allocate: registered by the first heap's set-up (after it took the
 * lock), a fork made meanwhile by another thread ran none of them, and the
 * child inherited the lock held by a thread it does not have: its own
 * first allocation waited forever (the storm program's one-off stall,
 * `storm-asan 6 40 3`: a child's first coral_malloc in pthread_mutex_lock
 * of heap_pool_lock, its parent in waitpid; its main thread forks right
 * after starting the workers and never allocated before). No allocation
 * before this case: a thread makes the process's first and is held with
 * the lock; the main thread forks; the fork's prepare handler lets it go
 * (the gate opens there) and waits for the lock. Before the fix no handler
 * ran: the child's first malloc hung (its alarm ends it). */
static bool first_alloc_child_done;

/* (It runs on until the child has ended: a thread that ended unjoined
 * before the fork is a thread leak to TSan in the child.) */
static void *first_allocation(void *arg) {
    (void)arg;
    coral_free(coral_malloc(16));
    gate_wait_for(&first_alloc_child_done, GATES);
    return NULL;
}

/* Forks a child whose one allocation must end (its alarm ends it if it
 * waits forever); returns the child's pid to the parent. */
static pid_t fork_child_allocating(void) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        coral_test_point_set(NULL);
        coral_free(coral_malloc(16));
        _exit(0);
    }
    return pid;
}

/* The process's first allocation, on a thread held at `point` until a
 * thread reaches `opener`, while the main thread forks: the child's first
 * allocation ends (what: the defect if it does not). */
static void fork_during_first_allocation(int point, int opener, const char *what) {
    gate_arm(point, opener);
    pthread_t first = start(first_allocation, NULL);
    gate_wait_held();
    pid_t pid = fork_child_allocating();
    expect_child_exit_0(pid, what);
    gate_signal(&first_alloc_child_done);
    gate_open(); /* (opened already by the fork's prepare handler) */
    join(first);
    CHECK_EQ(coral_test_check(), 0);
}

static void case_fork_first_alloc(void) {
    fork_during_first_allocation(CORAL_TP_HEAP_POOL_LOCKED, CORAL_TP_FORK_PREPARE,
                                 "the fork child did not end");
}

/* ---- a fork during the process's first initialisation -----------------------------------
 * The first allocation of the process runs its one-time initialisation
 * (coral_process_init); a thread that allocates meanwhile waits for its
 * end. A fork made by another thread while it runs gave the child a
 * process still "starting" with no thread to finish it: the child's first
 * allocation waited forever. No allocation before this case: a thread
 * makes the process's first and is held once it has claimed the
 * initialisation; the main thread forks. The fork's prepare handler now
 * waits for the initialisation, and the gate opens there
 * (CORAL_TP_FORK_INIT_WAIT); before the fix nothing opened it before the
 * fork, and the child hung (its alarm ends it). */
static void case_fork_process_init(void) {
    fork_during_first_allocation(CORAL_TP_PROCESS_STARTING, CORAL_TP_FORK_INIT_WAIT,
                                 "the fork child's first allocation waited for the initialisation");
}

/* The same fork, with the initialisation claimed after the prepare looked:
 * no allocation before this case; the main thread forks, and at the end
 * of its prepare (CORAL_TP_FORK_PREPARED) a second thread reads an option,
 * which runs the initialisation when none has run (and takes no lock a
 * fork holds). Before the fix the prepare found the initialisation not
 * started and left it alone: the second thread claimed it, was held there
 * (its gate), and the child's first allocation waited forever (its alarm
 * ends it). Now the prepare runs it first, the second thread finds it
 * done, and the fork goes on once that thread says so. */
static bool option_reader_go, option_reader_done, unclaimed_child_done;

static void *option_reader(void *arg) {
    (void)arg;
    gate_wait_for(&option_reader_go, GATES);
    long long value = 0;
    CHECK_EQ(coral_option_get("purge_delay_ms", &value), 0);
    gate_signal(&option_reader_done);
    gate_wait_for(&unclaimed_child_done, GATES); /* (alive at the fork: see first_allocation) */
    return NULL;
}

/* (The gate is armed here, not before the fork: the prepare's own run of
 * the initialisation passes the point it holds at.) */
static void read_option_at_prepared(int point, const void *object) {
    (void)object;
    if (point != CORAL_TP_FORK_PREPARED) return;
    gate_arm(CORAL_TP_PROCESS_STARTING, -1);
    gate_signal(&option_reader_go);
    gate_wait_for(&option_reader_done, 0); /* or held at the initialisation */
}

static void case_fork_process_init_unclaimed(void) {
    coral_test_point_set(read_option_at_prepared);
    pthread_t reader = start(option_reader, NULL);
    pid_t pid = fork_child_allocating();
    coral_test_point_set(NULL);
    gate_open();
    expect_child_exit_0(pid, "the fork child's first allocation waited for an initialisation "
                             "claimed after the prepare");
    gate_signal(&unclaimed_child_done);
    join(reader);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a fork from a signal handler, inside the allocator or inside a fork ----------------
 * fork() is async-signal-safe: a handler may fork while its thread holds
 * the allocator's locks, taken by the fork its signal interrupted (that
 * fork's prepare handler) or by a free in its slow path. A prepare handler
 * that takes them again waits for itself forever (base.h, "forks from
 * signal handlers"). Here the handler is a test point's hook: it forks at
 * the point where the thread holds them, as a handler run there would. The
 * inner child allocates (fork_nested: its handler released what the outer
 * prepare held) or only ends (fork_in_purge: the purge it interrupted
 * still holds its lock, as POSIX allows a child of a fork in a handler only
 * async-signal-safe calls). A deadlock ends the test by its alarm. */
static int inner_fork_point;
static int inner_fork_status = -1;
static bool inner_child_allocates;
static bool inner_child_returns; /* (fork_nested_child_forks) */

static void fork_at_point(int point, const void *object) {
    (void)object;
    if (point != inner_fork_point || inner_fork_status != -1) return;
    inner_fork_status = -2; /* (the inner fork's own prepare reaches no point twice) */
    pid_t pid = fork();
    if (pid == 0 && inner_child_returns) {
        coral_test_point_set(NULL);
        alarm(20);
        return; /* (into the outer fork's prepare handler) */
    }
    if (pid == 0) {
        if (inner_child_allocates) {
            void *blocks[64];
            for (int i = 0; i < 64; i++) blocks[i] = coral_malloc((size_t)16 << (i % 17));
            for (int i = 0; i < 64; i++) coral_free(blocks[i]);
            if (coral_test_check() != 0) _exit(3);
        }
        _exit(0);
    }
    int status = -1;
    if (pid > 0) waitpid(pid, &status, 0);
    inner_fork_status = status;
}

static void *touch_and_end(void *arg) {
    coral_free(coral_malloc(64));
    return arg;
}

static void *allocate_some(void *arg) {
    void *blocks[256];
    for (int round = 0; round < 16; round++) {
        for (int i = 0; i < 256; i++) blocks[i] = coral_malloc((size_t)16 << (i % 13));
        for (int i = 0; i < 256; i++) coral_free(blocks[i]);
    }
    coral_collect(1);
    return arg;
}

/* A fork from a handler that interrupted a fork of a multi-threaded process
 * after its prepare handler took every lock. */
static void case_fork_nested(void) {
    join(start(touch_and_end, NULL)); /* multi-threaded: the outer fork takes the locks */
    alarm(20);
    inner_fork_point = CORAL_TP_FORK_PREPARED;
    inner_child_allocates = true;
    coral_test_point_set(fork_at_point);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        void *p = coral_malloc(100);
        coral_free(p);
        _exit(coral_test_check() == 0 ? 0 : 3);
    }
    coral_test_point_set(NULL);
    expect_child_exit_0(pid, "the outer fork's child did not end");
    CHECK_MSG(WIFEXITED(inner_fork_status) && WEXITSTATUS(inner_fork_status) == 0,
              "the inner fork's child: status 0x%x", inner_fork_status);
    /* Every lock was given back in the parent: another thread allocates
     * (and, with the profiler on, takes samples: its locks too). */
    join(start(allocate_some, NULL));
    alarm(0);
    CHECK_EQ(coral_test_check(), 0);
}

/* A fork from a handler that interrupted a purge of the segment cache (its
 * purge_lock held) in a single-threaded process, as glibc allows with its
 * malloc. Needs CORALLOC_PURGE_THREAD=0 (the process stays single-threaded). */
static void case_fork_in_purge(void) {
    if (!__libc_single_threaded) {
        printf("SKIPPED: the process has a thread already (a sanitizer's?)\n");
        exit(77);
    }
    char *block = coral_malloc(CACHE_BLOCK);
    CHECK(block != NULL);
    memset(block, 7, CACHE_BLOCK);
    coral_free(block); /* its segment goes to the cache, dirty */
    alarm(20);
    inner_fork_point = CORAL_TP_CACHE_PURGING;
    inner_child_allocates = false;
    coral_test_point_set(fork_at_point);
    fflush(stdout);
    coral_collect(0); /* a forced pass: the purge, then the fork at its point */
    coral_test_point_set(NULL);
    alarm(0);
    CHECK_MSG(inner_fork_status != -1, "the purge never reached its test point");
    CHECK_MSG(WIFEXITED(inner_fork_status) && WEXITSTATUS(inner_fork_status) == 0,
              "the inner fork's child: status 0x%x", inner_fork_status);
    CHECK_EQ(coral_test_check(), 0);
}

/* The inner child returns from its handler: it goes on with the fork the
 * signal interrupted, whose prepare handler it is in, and makes a child of
 * its own. Its child handler released the locks that the outer prepare
 * took, so that fork's parent and child handlers, run in the inner child
 * and in its child, must release none of them again. Before, they did:
 * stdio's list lock, which glibc had made anew in the inner child and
 * taken and released for that fork, was released once more by the parent
 * handler, its count of takes left at -1: the next thread to take it kept
 * it for good, and another thread's fflush(NULL) waited forever (its
 * alarm ended the inner child). */
static void *flush_all_streams(void *arg) {
    fflush(NULL); /* (takes stdio's list lock) */
    return arg;
}

/* The end of a case: another thread takes stdio's list lock (a lock left
 * held makes it wait until the alarm), and the allocator checks. */
static void streams_check_end(void) {
    join(start(flush_all_streams, NULL));
    alarm(0);
    CHECK_EQ(coral_test_check(), 0);
}

/* In the child of a multi-threaded process's fork: fn on a thread of its
 * own, but not under the sanitizers, where no thread may start there
 * (TSan refuses it; GCC 12's ASan can deadlock). (Nor on this thread: in
 * a nested fork's child TSan still counts the recursive exit heap lock,
 * made anew, as held by it.) */
static void run_on_new_thread_in_child(thread_fn fn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    (void)fn;
#else
    join(start(fn, NULL));
#endif
}

/* Forks with a handler's fork made at point (by hook) whose inner child
 * returns from its handler: each fork's child allocates; the inner child,
 * back from the outer fork as its parent, waits for its own child, then
 * takes stdio's list lock on another thread and on this one and
 * allocates. Returns when the outer fork's child and the inner child have
 * ended well. */
static void fork_with_inner_child_returning(int point, coral_test_point_fn hook) {
    alarm(20);
    pid_t parent = getpid();
    inner_fork_point = point;
    inner_child_allocates = false;
    inner_child_returns = true;
    coral_test_point_set(hook);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) { /* the outer fork's child, or the inner child's */
        alarm(20);
        coral_free(coral_malloc(100));
        run_on_new_thread_in_child(flush_all_streams);
        fflush(NULL);
        _exit(coral_test_check() == 0 ? 0 : 3);
    }
    if (getpid() != parent) { /* the inner child, back from the outer fork */
        int status = -1;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            _exit(4);
        run_on_new_thread_in_child(flush_all_streams);
        fflush(NULL);
        run_on_new_thread_in_child(allocate_some);
        _exit(coral_test_check() == 0 ? 0 : 3);
    }
    coral_test_point_set(NULL);
    expect_child_exit_0(pid, "the outer fork's child did not end");
    CHECK_MSG(WIFEXITED(inner_fork_status) && WEXITSTATUS(inner_fork_status) == 0,
              "the inner fork's child: status 0x%x", inner_fork_status);
}

/* A multi-threaded process's fork with a handler's fork at point whose
 * inner child returns; then the parent takes stdio's list lock and
 * allocates on other threads. */
static void fork_nested_child_returning_at(int point) {
    join(start(touch_and_end, NULL)); /* multi-threaded: the outer fork takes the locks */
    fork_with_inner_child_returning(point, fork_at_point);
    join(start(flush_all_streams, NULL));
    join(start(allocate_some, NULL));
    alarm(0);
    CHECK_EQ(coral_test_check(), 0);
}

static void case_fork_nested_child_forks(void) {
    fork_nested_child_returning_at(CORAL_TP_FORK_PREPARED);
}

/* ---- a fork from a handler that interrupts the parent handler's release ----------------
 * The parent handler of a fork of a multi-threaded process releases the
 * locks that its prepare took; the fork is in progress on the thread
 * until the handler has left. A thread of the test, let go while the fork
 * holds the locks, forces a purge of the segment cache and is held with a
 * region out of the table, its purge lock held, once the parent handler
 * has released the locks; a signal (SIGUSR1) comes then
 * (CORAL_TP_FORK_RELEASED), and its handler forks. Before, that fork,
 * nested, took no lock, and its child released the purge lock under the
 * held thread: the region was lost to the child (it mapped a new one).
 * The parent handler now blocks signals until it has left: the handler's
 * fork comes after, waits for the purge (the gate opens there), and its
 * child takes its block from the region. */
static uintptr_t release_region;
static bool release_purge_go, release_purge_done;
static int release_stage; /* 1: the purge let go; 2: the signal sent */
static int release_fork_status = -1;

static void *purge_when_told(void *arg) {
    gate_wait_for(&release_purge_go, GATES);
    coral_collect(0); /* a forced pass: every dirty region of the cache */
    gate_wait_for(&release_purge_done, GATES);
    return arg;
}

static void fork_on_signal(int sig) {
    (void)sig;
    pid_t pid = fork();
    if (pid == 0) {
        coral_test_point_set(NULL);
        fork_cache_child(release_region);
    }
    int status = -1;
    if (pid > 0) waitpid(pid, &status, 0);
    release_fork_status = status;
}

static void signal_in_release(int point, const void *object) {
    gate_hook(point, object);
    if (point == CORAL_TP_FORK_PREPARED && release_stage == 0) {
        release_stage = 1;
        gate_signal(&release_purge_go);
    } else if (point == CORAL_TP_FORK_RELEASED && release_stage == 1) {
        release_stage = 2;
        CHECK_EQ((uintptr_t)gate_wait_held(), release_region);
        raise(SIGUSR1);
    }
}

static void case_fork_nested_in_release(void) {
    char *block = coral_malloc(CACHE_BLOCK);
    CHECK(block != NULL);
    memset(block, 7, CACHE_BLOCK);
    release_region = (uintptr_t)block & ~(uintptr_t)((4u << 20) - 1);
    coral_free(block); /* its segment goes to the cache, dirty */
    pthread_t purger = start(purge_when_told, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fork_on_signal;
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    alarm(20);
    /* (armed before the fork: the purge waits for it to let go; only a
     * fork that waits for the purge opens the gate) */
    gate_arm(CORAL_TP_CACHE_PURGING, CORAL_TP_FORK_CACHE_WAIT);
    coral_test_point_set(signal_in_release);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(0);
    coral_test_point_set(NULL);
    expect_child_exit_0(pid, "the outer fork's child did not end");
    gate_open(); /* (opened already by the handler's fork, after the fix) */
    CHECK_EQ(release_stage, 2);
    CHECK_MSG(WIFEXITED(release_fork_status) && WEXITSTATUS(release_fork_status) == 0,
              "the child of the handler's fork: status 0x%x", release_fork_status);
    gate_signal(&release_purge_done);
    join(purger);
    alarm(0);
    CHECK_EQ(coral_test_check(), 0);
}

/* A fork from a handler that interrupted a fork's prepare handler while it
 * waits for a purge (CORAL_TP_FORK_CACHE_WAIT: stdio's list lock and the
 * locks before the cache's taken); the inner child returns from its
 * handler and goes on with that prepare (the purge lock, held by a thread
 * it does not have, released by its child handler), then makes a child of
 * its own. That fork's parent handler, in the inner child, releases the
 * locks that its prepare took, but not stdio's list lock again, which the
 * inner child's handler made anew: before, it did, the lock's count of
 * takes left at -1 and the lock then held for good (fflush(NULL) of
 * another thread waited forever; the inner child's alarm ended it). */
static pthread_t wait_purge_thread;
static bool wait_purge_forked;

static void fork_at_cache_wait(int point, const void *object) {
    gate_hook(point, object);
    if (point != CORAL_TP_FORK_CACHE_WAIT || wait_purge_forked) return;
    wait_purge_forked = true;
    fork_at_point(CORAL_TP_FORK_CACHE_WAIT, object);
    gate_open(); /* the purge ends, and the prepare handler takes its lock */
}

static void case_fork_nested_in_prepare(void) {
    char *block = coral_malloc(CACHE_BLOCK);
    CHECK(block != NULL);
    memset(block, 7, CACHE_BLOCK);
    coral_free(block); /* its segment goes to the cache, dirty */
    held_fn = forced_pass_thread;
    held_fork_done = false;
    gate_arm(CORAL_TP_CACHE_PURGING, -1);
    wait_purge_thread = start(held_until_fork_done, NULL);
    gate_wait_held();
    fork_with_inner_child_returning(CORAL_TP_FORK_CACHE_WAIT, fork_at_cache_wait);
    CHECK(wait_purge_forked);
    gate_signal(&held_fork_done);
    join(wait_purge_thread);
    streams_check_end();
}

/* A fork from a handler that interrupted a fork's prepare handler right
 * after it took stdio's list lock, before it locked the witness
 * (CORAL_TP_FORK_STREAMS_LISTED); the inner child returns from its handler
 * and goes on with that prepare, then makes a child of its own. glibc made
 * the list lock anew in the inner child, under the prepare's hold: that
 * fork's parent handler, in the inner child, must not release it. Before,
 * the prepare recorded its hold only once it had returned, so the inner
 * child's handler did not see it, and the parent handler released the
 * lock made anew: its count of takes was left at -1, the next thread to
 * take it (the inner child's fflush(NULL) on another thread) kept it for
 * good, and the inner child's own fflush(NULL) waited forever (its alarm
 * ended it). */
static void case_fork_nested_in_streams_lock(void) {
    fork_nested_child_returning_at(CORAL_TP_FORK_STREAMS_LISTED);
}

/* ---- a program's prepare handler that starts a thread ------------------------------------
 * glibc's fork decides whether the process has other threads before it
 * runs the prepare handlers, and takes and makes anew stdio's list lock
 * only if it has. A program's prepare handler, registered after
 * coralloc's and so run before it, starts a thread in a single-threaded
 * process: coralloc's prepare sees two threads and takes every lock, the
 * list lock first; glibc makes none anew in the child. Before, the child
 * handler left the list lock to glibc: the child kept it held by its
 * thread, and another thread's fflush(NULL) there waited forever (the
 * child's alarm ended it). Needs CORALLOC_PURGE_THREAD=0. */
static pthread_t prepare_thread;
static bool prepare_thread_started, prepare_thread_release;

static void *wait_for_release(void *arg) {
    gate_wait_for(&prepare_thread_release, GATES);
    return arg;
}

static void prepare_start_thread(void) {
    if (prepare_thread_started) return;
    prepare_thread_started = true;
    prepare_thread = start(wait_for_release, NULL);
}

/* A single-threaded process whose prepare handler starts the thread
 * (SKIPPED where that cannot be). */
static void prepare_thread_setup(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("SKIPPED: under the sanitizers no thread may start in the child of a multi-threaded "
           "fork\n");
    exit(77);
#endif
    if (!__libc_single_threaded) {
        printf("SKIPPED: the process has a thread already (a sanitizer's?)\n");
        exit(77);
    }
    CHECK_EQ(pthread_atfork(prepare_start_thread, NULL, NULL), 0);
}

/* The thread started, let go; another thread takes stdio's list lock. */
static void prepare_thread_finish(void) {
    CHECK(prepare_thread_started);
    gate_signal(&prepare_thread_release);
    join(prepare_thread);
    streams_check_end();
}

static void case_fork_prepare_starts_thread(void) {
    prepare_thread_setup();
    alarm(20);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        run_on_new_thread_in_child(flush_all_streams);
        coral_free(coral_malloc(100));
        _exit(coral_test_check() == 0 ? 0 : 3);
    }
    expect_child_exit_0(pid, "the fork's child did not end");
    prepare_thread_finish();
}

/* The same fork (a program's prepare handler starts the thread), and a
 * fork from a handler at CORAL_TP_FORK_STREAMS_LISTED whose inner child
 * returns and goes on with it (as fork_nested_in_streams_lock): glibc made
 * stdio's locks anew in the inner child (its process had a thread then),
 * and the prepare there locked the witness again. The outer fork, begun
 * single-threaded, makes nothing anew in its child: its child handler
 * finds the witness its own and must release it, but not the list lock,
 * which the inner child holds no more. Before, the parent handler in the
 * inner child released the list lock made anew (its count left at -1),
 * and a release of both in the last child would too: a thread's
 * fflush(NULL) there kept it, and the next one waited forever. */
static void case_fork_prepare_thread_nested_in_streams_lock(void) {
    prepare_thread_setup();
    fork_with_inner_child_returning(CORAL_TP_FORK_STREAMS_LISTED, fork_at_point);
    prepare_thread_finish();
}

/* ---- two threads free one block of a third at the same instant --------------------------
 * A thread frees another thread's block x: it reads x's mark word (no
 * freed mark: x is live) and is held there, before it writes the mark. A
 * second thread frees x too (it reads no mark either: the first has not
 * written it), then y, a block of the same page: x and y are on the
 * page's thread_free. The first thread goes on: it writes the mark and
 * pushes x again, onto y: the list is x, y, x, y, ... (x's link now leads
 * to y), counted as 3 blocks. The owner keeps 8 blocks of the page in use,
 * so the count is within them, and takes the list when its free list runs
 * dry. Before, that push was not SUSPECT (it had read no mark): the owner
 * took the list unwalked and malloc handed x out twice (and y), silently.
 * The push now finds thread_free changed since it read the word before
 * the mark, and flags its list: the owner's take walks it and reports x
 * (coral_fatal: the child aborts). In a fork child, so that the report
 * ends the child only. */
#define RACE_LIVE 8
#define RACE_SIZE 48
#define RACE_TAKES 4096

static void *race_live[RACE_LIVE];

static void *free_arg(void *arg) {
    coral_free(arg);
    return NULL;
}

static void *free_x_then_y(void *arg) {
    (void)arg;
    coral_free(race_live[0]);
    coral_free(race_live[1]);
    return NULL;
}

static int address_order(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

/* The child's start: RACE_LIVE blocks of one page (else exit 4), z =
 * race_live[2] freed by another thread if z_first, then a thread freeing
 * x = race_live[0] held between its read of the mark and its write;
 * returns that thread. */
static pthread_t race_start_with(bool z_first, void *(*first_free)(void *), int point) {
    alarm(20);
    for (int i = 0; i < RACE_LIVE; i++) {
        race_live[i] = coral_malloc(RACE_SIZE);
        CHECK(race_live[i] != NULL);
        if (i > 0 && slice_of(race_live[i]) != slice_of(race_live[0])) _exit(4);
    }
    if (z_first) join(start(free_arg, race_live[2]));
    gate_arm(point, -1);
    pthread_t first = start(first_free, race_live[0]);
    CHECK(gate_wait_held() == race_live[0]);
    return first;
}

static pthread_t race_start(bool z_first) {
    return race_start_with(z_first, free_arg, CORAL_TP_REMOTE_MARK_READ);
}

/* The child's end: taken[n..] filled by malloc; exit 3 if a block was
 * handed out twice, else 0. */
static void race_end(void **taken, int n) {
    for (; n < RACE_TAKES; n++) taken[n] = coral_malloc(RACE_SIZE);
    qsort(taken, RACE_TAKES, sizeof taken[0], address_order);
    for (int i = 1; i < RACE_TAKES; i++)
        if (taken[i] != NULL && taken[i] == taken[i - 1]) {
            fprintf(stderr, "block %p handed out twice\n", taken[i]);
            _exit(3);
        }
    _exit(0);
}

/* Runs child in a fork child, which must end at the owner's report. */
static void race_run(void (*child)(void), const char *twice) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) child();
    int status = -1;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK_MSG(!(WIFEXITED(status) && WEXITSTATUS(status) == 3), "%s", twice);
    CHECK_MSG(!(WIFEXITED(status) && WEXITSTATUS(status) == 4), "the blocks are on two pages");
    CHECK_MSG(!(WIFEXITED(status) && WEXITSTATUS(status) == 5), "the owner's malloc never took y");
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
              "the double free was not reported (status 0x%x)", status);
}

/* The race's second free, once `first` is held at its mark read: free x,
 * then y; let the first go on; check what malloc hands out. */
static void race_second_free_then_end(pthread_t first) {
    join(start(free_x_then_y, NULL));
    gate_open();
    join(first);
    static void *taken[RACE_TAKES];
    race_end(taken, 0);
}

static void remote_mark_race_child(void) { race_second_free_then_end(race_start(false)); }

static void case_remote_mark_race(void) {
    race_run(remote_mark_race_child,
             "a block freed by two threads at the same instant was handed out twice");
}

/* ---- the owner takes a remote free between another's read and its push -----------------
 * As above, a thread frees x and is held between its read of x's mark word
 * (no mark) and its write; when it read thread_free, z (freed by another
 * thread) was on it. A second thread frees x, then y; the owner's malloc
 * takes the list (y, x, z) and hands out y only: x is on its free list.
 * The held thread goes on and pushes x again. Its CAS finds the word
 * changed (the take emptied it), so the push is SUSPECT, and the owner's
 * take of it walks it and reports x (freed while free, and handed out
 * since: its mark is gone). Without the flag the push went in unwalked and
 * malloc handed x out twice. (With nothing on thread_free at the read, the
 * take makes the word what it was, and the push is not flagged: page.c,
 * "Freed marks".) */
static void remote_mark_take_child(void) {
    pthread_t first = race_start(true);
    join(start(free_x_then_y, NULL));
    static void *taken[RACE_TAKES];
    int n = 0;
    while (n < RACE_TAKES && (n == 0 || taken[n - 1] != race_live[1]))
        taken[n++] = coral_malloc(RACE_SIZE);
    if (taken[n - 1] != race_live[1]) _exit(5);
    gate_open();
    join(first);
    race_end(taken, n);
}

static void case_remote_mark_take(void) {
    race_run(remote_mark_take_child,
             "a block freed by two threads, taken between the two, was handed out twice");
}

/* ---- a run of remote frees and a second free of its block --------------------------------
 * window_remote_run_mark_race: the race of remote_mark_race, where the
 * first freer adds x to its run of remote frees (src/api/remote_run.h): it
 * frees two other blocks of the page, then x, the third free in a row into
 * the page, which opens a run; it is held after it read x's mark word (no
 * mark), before it writes the pending mark. The second thread frees x,
 * then y (each pushed at once). The first goes on and exits, which pushes
 * its run (x, its pending mark intact): x is twice on the list. The run's
 * push must be flagged SUSPECT, as the word changed since the run read it
 * before x's mark; pushed unflagged (the word read at the push), x was
 * handed out twice. */
static void *free_two_then_x(void *x) {
    coral_free(race_live[2]);
    coral_free(race_live[3]);
    coral_free(x);
    return NULL;
}

static void remote_run_mark_race_child(void) {
    race_second_free_then_end(
        race_start_with(false, free_two_then_x, CORAL_TP_REMOTE_RUN_MARK_READ));
}

static void case_remote_run_mark_race(void) {
    race_run(
        remote_run_mark_race_child,
        "a block in a run of remote frees, freed again by another thread, was handed out twice");
}

/* ---- a free in a signal handler that interrupts a run of remote frees ------------------
 * window_remote_run_signal: a program whose signal handler frees (POSIX
 * does not allow it, but programs do it, and a remote free alone is a
 * lock-free push that survives it). A thread frees RS_RUN of this thread's
 * 48-byte blocks in address order (runs of remote frees: src/api/
 * remote_run.h); every time it is at one of the run's test points (it read
 * a block's mark; it wrote the pending mark and has not linked the block
 * in) it raises a signal, whose handler frees the next block of a second
 * set: in turn a 1000-byte block (another page: a free that pushes the
 * open run) and a 48-byte block of the run's page (a free that adds to
 * the run). Once the thread has exited (its exit pushes its run), no block
 * freed may be in use (coral_heap_visit), none reported, and the heap
 * check passes. A handler's free that changed the run in the middle of an
 * add lost a block from its chain (in use for ever), or left the run's
 * count past its chain's end (its push walked off the chain: a crash, or a
 * false double-free report). */
/* handler on SIGUSR1. */
static void sigusr1_handler_set(void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
}

/* Runs freer on a thread of its own with handler on SIGUSR1 and hook as
 * the test-point hook (which raises the signal where it chooses). */
static void run_freer_signalled(void (*handler)(int), void (*hook)(int, const void *),
                                void *(*freer)(void *)) {
    sigusr1_handler_set(handler);
    coral_test_point_set(hook);
    join(start(freer, NULL));
    coral_test_point_set(NULL);
}

/* ---- a fork from a signal handler while its thread holds the purger's lock -----------------
 * A program thread holds the purger's lock to wake the purge thread (a
 * free's notice, a thread's exit) or to wait for its pass; a fork's
 * prepare takes it. A signal handler that forked while its thread held it
 * waited for its own thread forever (rev29b's program: 32 threads exiting
 * while a handler forks, 20 hangs in 20 runs). The sections now block
 * signals: the handler runs once the lock is released. Here the signal is
 * raised inside the section of a test's wait for a pass (the purge thread
 * makes the process multi-threaded, so the handler's fork takes the
 * locks); the handler forks and its child ends. Before the fix the
 * handler ran there and its prepare waited forever (the alarm ends it). */
static volatile sig_atomic_t pl_raised, pl_forked;
static int pl_status = -1;

static void pl_handler(int sig) {
    (void)sig;
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid(pid, &pl_status, 0);
    pl_forked = 1;
}

static void pl_hook(int point, const void *object) {
    (void)object;
    if (point != CORAL_TP_PURGER_LOCKED || pl_raised) return;
    pl_raised = 1;
    raise(SIGUSR1);
}

/* The purge thread running (it makes the process multi-threaded, so that a
 * fork takes the locks): 1.5 MiB freed starts it. */
static void purge_thread_start(void) {
    void *big = coral_malloc(1536 * 1024); /* 1.5 MiB freed: the purge thread starts */
    CHECK_NOT_NULL(big);
    memset(big, 1, 1536 * 1024);
    coral_free(big);
    CHECK_MSG(coral_test_purge_pass() == 1, "the purge thread did not start");
}

static void case_purger_lock_signal(void) {
    purge_thread_start();
    /* A fork first, outside the handler: the first fork's prepare makes the
     * stdio witness (message.c), which allocates. */
    pid_t first = fork();
    CHECK(first >= 0);
    if (first == 0) _exit(0);
    expect_child_exit_0(first, "a plain fork's child did not end");
    sigusr1_handler_set(pl_handler);
    alarm(20);
    coral_test_point_set(pl_hook);
    CHECK_EQ(coral_test_purge_pass(), 1);
    coral_test_point_set(NULL);
    alarm(0);
    CHECK_MSG(pl_raised && pl_forked, "the signal was not raised in the section, or not handled");
    CHECK_MSG(WIFEXITED(pl_status) && WEXITSTATUS(pl_status) == 0,
              "the handler's fork child did not end: status 0x%x", pl_status);
    CHECK_EQ(coral_test_check(), 0);
}

/* purger_prepare_notice: a signal handler's free on the forking thread,
 * while its fork's prepare holds the purger's lock (before the fork's
 * locks are all taken), gives a notice to the purge thread. Its take of
 * that lock found it held, by its own thread, and retried for good (the
 * alarm ends the test); now the notice is left to the fork's release
 * (CORAL_TP_PURGER_SIGNAL_OWED), which wakes the purge thread. The signal
 * is raised where the prepare has just taken the lock, signals blocked:
 * the handler runs as the prepare unblocks them. */
static __thread bool pn_in_prepare;
static volatile sig_atomic_t pn_raised, pn_owed, pn_freed;
static void *pn_block;

static void pn_handler(int sig) {
    (void)sig;
    coral_free(pn_block);
    pn_freed = 1;
}

static void pn_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_FORK_PREPARE) pn_in_prepare = true;
    if (point == CORAL_TP_PURGER_LOCKED && pn_in_prepare && !pn_raised) {
        pn_raised = 1;
        raise(SIGUSR1);
    }
    if (point == CORAL_TP_PURGER_SIGNAL_OWED) pn_owed = 1;
}

static void case_purger_prepare_notice(void) {
    purge_thread_start();
    pn_block = coral_malloc(1536 * 1024);
    CHECK_NOT_NULL(pn_block);
    memset(pn_block, 2, 1536 * 1024);
    sigusr1_handler_set(pn_handler);
    alarm(20);
    coral_test_point_set(pn_hook);
    pid_t pid = fork();
    pn_in_prepare = false;
    if (pid == 0) _exit(0);
    coral_test_point_set(NULL);
    alarm(0);
    CHECK(pid > 0);
    expect_child_exit_0(pid, "the fork's child did not end");
    CHECK_MSG(pn_raised && pn_freed, "the signal was not raised in the prepare, or not handled");
    CHECK_MSG(pn_owed, "the handler's free gave no notice");
    CHECK_EQ(coral_test_purge_pass(), 1);
    CHECK_EQ(coral_test_check(), 0);
}

enum { RS_RUN = 256, RS_MORE = 128 };
static void *rs_small[RS_RUN + RS_MORE], *rs_big[RS_MORE];
static __thread bool rs_freer, rs_in_handler;
static volatile int rs_handled;

static void rs_handler(int sig) {
    (void)sig;
    rs_in_handler = true;
    int i = rs_handled++;
    if (i < 2 * RS_MORE) coral_free(i % 2 ? rs_small[RS_RUN + i / 2] : rs_big[i / 2]);
    rs_in_handler = false;
}

static void rs_hook(int point, const void *object) {
    (void)object;
    if ((point == CORAL_TP_REMOTE_RUN_MARK_READ || point == CORAL_TP_REMOTE_RUN_LINKING) &&
        rs_freer && !rs_in_handler)
        raise(SIGUSR1);
}

static void *rs_free_run(void *arg) {
    (void)arg;
    rs_freer = true;
    for (size_t i = 0; i < RS_RUN; i++) coral_free(rs_small[i]);
    return NULL;
}

static int rs_count_in_use(void *block, size_t size, size_t usable, void *arg) {
    (void)size;
    (void)usable;
    for (size_t i = 0; i < RS_RUN + RS_MORE; i++)
        if (block == rs_small[i] || (i < RS_MORE && block == rs_big[i])) ++*(int *)arg;
    return 0;
}

static void case_remote_run_signal(void) {
    for (size_t i = 0; i < RS_RUN + RS_MORE; i++) CHECK((rs_small[i] = coral_malloc(48)) != NULL);
    for (size_t i = 0; i < RS_MORE; i++) CHECK((rs_big[i] = coral_malloc(1000)) != NULL);
    run_freer_signalled(rs_handler, rs_hook, rs_free_run);
    CHECK(rs_handled >= 2 * RS_MORE);
    int in_use = 0;
    CHECK_EQ(coral_heap_visit(NULL, rs_count_in_use, &in_use), 0);
    CHECK_EQ(in_use, 0);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a signal handler's free while a run's thread gets its heap ----------------------
 * window_remote_run_heap_signal: a thread with no heap yet frees this
 * thread's 48-byte blocks; at the third free into the page it would open
 * a run, and gets a heap first, taking the heap pool's lock. A signal
 * raised there (CORAL_TP_HEAP_POOL_LOCKED, on that thread) runs a handler
 * that frees another block of the page. Before, that free found no heap
 * either, went the same way and waited for the pool's lock its own thread
 * held, for good (the alarm ended the test); now the run is busy while the
 * heap is got, and the handler's free takes the lock-free push. */
enum { RH_FREED = 4 };
static void *rh_blocks[RH_FREED + 1];
static __thread bool rh_freer;
static volatile int rh_handled;

static void rh_handler(int sig) {
    (void)sig;
    if (rh_handled++ == 0) coral_free(rh_blocks[RH_FREED]);
}

static void rh_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_HEAP_POOL_LOCKED && rh_freer && rh_handled == 0) raise(SIGUSR1);
}

static void *rh_free_blocks(void *arg) {
    (void)arg;
    rh_freer = true;
    for (size_t i = 0; i < RH_FREED; i++) coral_free(rh_blocks[i]);
    return NULL;
}

static void case_remote_run_heap_signal(void) {
    alarm(60);
    for (size_t i = 0; i <= RH_FREED; i++) CHECK((rh_blocks[i] = coral_malloc(48)) != NULL);
    run_freer_signalled(rh_handler, rh_hook, rh_free_blocks);
    alarm(0);
    CHECK_EQ(rh_handled, 1);
    CHECK_EQ(coral_test_check(), 0);
}

/* ---- a signal handler's malloc while its thread sets up its heap ---------------------
 * window_thread_setup_signal: a thread's first malloc sets up its heap,
 * taking the heap pool's lock; a signal raised there
 * (CORAL_TP_HEAP_POOL_LOCKED, on that thread) runs a handler that mallocs.
 * Before, the handler's malloc set the thread up again and waited for the
 * pool's lock its own thread held, for good (the alarm ended the test); now
 * it gets NULL (ENOMEM) and the thread's own malloc goes on. */
static __thread bool ts_first;
static volatile int ts_handled, ts_errno;
static void *volatile ts_handler_block = (void *)1;

static void ts_handler(int sig) {
    (void)sig;
    int saved = errno;
    ts_handled++;
    errno = 0;
    ts_handler_block = coral_malloc(100);
    ts_errno = errno;
    errno = saved;
}

static void ts_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_HEAP_POOL_LOCKED && ts_first && ts_handled == 0) raise(SIGUSR1);
}

static void *ts_first_malloc(void *arg) {
    (void)arg;
    ts_first = true;
    void *p = coral_malloc(24);
    ts_first = false;
    CHECK(p != NULL);
    coral_free(p);
    void *q = coral_malloc(100); /* after the setup: served */
    CHECK(q != NULL);
    coral_free(q);
    return NULL;
}

/* The handler ran once, and its malloc got NULL, ENOMEM. */
static void ts_check_refused(void) {
    CHECK_EQ(ts_handled, 1);
    CHECK(ts_handler_block == NULL);
    CHECK_EQ(ts_errno, ENOMEM);
    CHECK_EQ(coral_test_check(), 0);
}

static void case_thread_setup_signal(void) {
    alarm(60);
    run_freer_signalled(ts_handler, ts_hook, ts_first_malloc);
    alarm(0);
    ts_check_refused();
}

/* ---- a fork from a signal handler while its thread sets up its heap ---------------------
 * window_fork_thread_setup_signal: as above, the signal is raised on a
 * thread's first malloc while it holds the heap pool's lock
 * (CORAL_TP_HEAP_POOL_LOCKED); its handler forks. Before, the fork's
 * prepare handler waited for the pool's lock its own thread held, for good
 * (the alarm ended the test); now it leaves that lock to the code it
 * interrupted, which ends the setup and releases it in the parent and in
 * the child. In both, the thread then allocates, a new thread gets its
 * heap (the pool's lock is free) and a fork takes every lock again. The
 * hook is the test above's. */
static volatile pid_t fs_child = -1;
static pid_t fs_parent;

static void fs_handler(int sig) {
    (void)sig;
    int saved = errno;
    ts_handled++;
    pid_t pid = fork();
    if (pid == 0) alarm(60); /* (the child's hang detector) */
    fs_child = pid;
    errno = saved;
}

/* A thread that allocates and frees once (another thread of the process). */
static void *malloc_free_200(void *arg) {
    (void)arg;
    void *p = coral_malloc(200);
    CHECK(p != NULL);
    coral_free(p);
    return NULL;
}

static void *fs_first_malloc(void *arg) {
    ts_first_malloc(arg);
    join(start(malloc_free_200, NULL));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(coral_malloc(300) == NULL);
    expect_child_exit_0(pid, "a fork after the setup: the child hung");
    if (getpid() != fs_parent) _exit(coral_test_check() == 0 ? 0 : 3); /* the child's */
    return NULL;
}

/* thread (its first malloc, or its exit) with hook, which raises the
 * signal whose handler forks; both processes go on, and the child ends
 * with status 0. */
static void fs_run(void (*hook)(int, const void *), void *(*thread)(void *)) {
    alarm(60);
    fs_parent = getpid();
    run_freer_signalled(fs_handler, hook, thread);
    alarm(0);
    CHECK_EQ(ts_handled, 1);
    CHECK(fs_child > 0);
    expect_child_exit_0(fs_child, "the handler's fork: the child hung");
    CHECK_EQ(coral_test_check(), 0);
}

static void case_fork_thread_setup_signal(void) { fs_run(ts_hook, fs_first_malloc); }

/* window_fork_exit_signal: the same hook, armed as a thread returns,
 * raises the signal in its exit cleanup (thread_done), as it puts the
 * thread's heap back holding the pool's lock; the handler forks. Before,
 * the prepare waited for the lock its own thread held (the alarm ended the
 * test); now the cleanup goes on in both processes, and the child's only
 * thread ends it (status 0). */
static void *fx_exiting(void *arg) {
    (void)arg;
    coral_free(coral_malloc(40));
    ts_first = true;
    return NULL;
}

static void case_fork_exit_signal(void) { fs_run(ts_hook, fx_exiting); }

/* window_fork_pool_unrecorded_taken, _releasing: the same, with the signal
 * raised where the thread holds the pool's lock but pool_held does not say
 * so (CORAL_TP_HEAP_POOL_UNRECORDED): right after the take, and right
 * before the release. Before, the handler's fork did not leave the lock to
 * the code it interrupted and waited for its own thread, for good (the
 * alarm ended the test); now glibc's record of the owner says the thread
 * holds it. */
static void pu_hook(int point, const void *object, bool releasing) {
    if (point == CORAL_TP_HEAP_POOL_UNRECORDED && (object != NULL) == releasing && ts_first &&
        ts_handled == 0)
        raise(SIGUSR1);
}

static void pu_hook_taken(int point, const void *object) { pu_hook(point, object, false); }

static void pu_hook_releasing(int point, const void *object) { pu_hook(point, object, true); }

static void case_fork_pool_unrecorded_taken(void) { fs_run(pu_hook_taken, fs_first_malloc); }

static void case_fork_pool_unrecorded_releasing(void) {
    fs_run(pu_hook_releasing, fs_first_malloc);
}

/* ---- the same fork while an exiting thread makes the exit heap --------------------------
 * window_fork_setup_exit_heap: a thread past its exit cleanup (a key
 * destructor after coralloc's) makes the process's exit heap, whose heap
 * struct comes from the pool, while another thread's first malloc holds the
 * pool's lock and a handler there forks (as above). Before, the exiting
 * thread took the exit heap's lock and then waited for the pool's; the
 * fork's prepare, leaving the pool's lock to the code it interrupted, waited
 * for the exit heap's: each waited for the other for good (the alarm ended
 * the test). Now the exiting thread gets the struct before it takes the exit
 * heap's lock. The hook raises the signal once the exiting thread waits
 * (its /proc/self/task/TID/syscall: a futex call, not a sleep). */
static _Atomic(pid_t) fe_exiting_tid;
static _Atomic(bool) fe_go;
static pthread_key_t fe_key;

/* Whether task tid of this process waits in a futex call (no allocation). */
static bool fe_waits(pid_t tid) {
    char path[64], buf[32];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return atol(buf) == SYS_futex;
}

static void fe_hook(int point, const void *object) {
    (void)object;
    if (point != CORAL_TP_HEAP_POOL_LOCKED || !ts_first || ts_handled != 0) return;
    atomic_store(&fe_go, true);
    while (!fe_waits(atomic_load(&fe_exiting_tid))) sched_yield();
    raise(SIGUSR1);
}

/* The key's destructor, after coralloc's: an allocation from the exit heap. */
static void fe_exit_malloc(void *value) {
    (void)value;
    atomic_store(&fe_exiting_tid, (pid_t)syscall(SYS_gettid));
    while (!atomic_load(&fe_go)) sched_yield();
    void *p = coral_malloc(40);
    CHECK(p != NULL);
    coral_free(p);
}

static void *fe_exiting(void *arg) {
    (void)arg;
    void *p = coral_malloc(40); /* its own heap: its exit cleanup runs */
    CHECK(p != NULL);
    coral_free(p);
    CHECK_EQ(pthread_setspecific(fe_key, &fe_key), 0);
    return NULL;
}

static void case_fork_setup_exit_heap(void) {
    CHECK(coral_malloc(1) != NULL); /* coralloc's key first */
    CHECK_EQ(pthread_key_create(&fe_key, fe_exit_malloc), 0);
    pthread_t exiting = start(fe_exiting, NULL);
    while (atomic_load(&fe_exiting_tid) == 0) sched_yield();
    fs_run(fe_hook, fs_first_malloc);
    join(exiting);
}

/* ---- a signal handler's malloc while the setup finishes a dead thread's cleanup --------
 * window_clean_dead_signal: a thread whose id's previous thread first
 * allocated in its last key destructor round (its cleanup never ran)
 * finishes that cleanup in its own setup (thread_clean_dead), and puts the
 * dead heap back holding the pool's lock (CORAL_TP_HEAP_POOL_LOCKED, the
 * heap as object); a signal raised there runs the malloc handler above.
 * Before, the handler's malloc, made while the cleanup marks the thread as
 * past its exit, went to the exit heap, whose first use takes a heap from
 * the pool: it waited for the lock its own thread held, for good (the
 * alarm ended the test); now it gets NULL (ENOMEM), as in the rest of the
 * setup. glibc gives a new thread a joined one's stack and thread pointer
 * first: a setup that finds no dead heap raises nothing, and the pair is
 * made again. */
static pthread_key_t cd_key;
static __thread int cd_rounds;

static void cd_last_round(void *value) {
    if (++cd_rounds == 4) {
        coral_free(coral_malloc(100)); /* the thread's first allocation */
        return;
    }
    CHECK_EQ(pthread_setspecific(cd_key, value), 0);
}

static void *cd_set_key(void *arg) {
    (void)arg;
    CHECK_EQ(pthread_setspecific(cd_key, &cd_key), 0);
    return NULL;
}

static void cd_hook(int point, const void *object) {
    if (point == CORAL_TP_HEAP_POOL_LOCKED && object != NULL && ts_first && ts_handled == 0)
        raise(SIGUSR1);
}

static void case_clean_dead_signal(void) {
    alarm(60);
    coral_free(coral_malloc(16)); /* coralloc's key first: visited first in a round */
    CHECK_EQ(pthread_key_create(&cd_key, cd_last_round), 0);
    for (int i = 0; i < 8 && ts_handled == 0; i++) {
        join(start(cd_set_key, NULL));
        run_freer_signalled(ts_handler, cd_hook, ts_first_malloc);
    }
    alarm(0);
    ts_check_refused();
}

/* ---- forks from signal handlers that leave the pool's lock to the code they interrupted --
 * (thread.c, pool_held) */
static pid_t hf_main_pid;
static volatile pid_t hf_child = -1;
static volatile int hf_raised;

static void hf_handler(int sig) {
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0)
        alarm(20);
    else
        hf_child = pid;
    errno = saved;
}

/* fork_parked_reap: the forking thread's parked heap reaped in the handler fork's child,
 * before the deferred rename: the exiting thread's first exit-heap
 * allocation (pool_get, reaping parked heaps) is interrupted, the handler
 * forks; the child then destroys the thread's parked user heap. */
static pthread_key_t pr_key;
static __thread bool pr_rearmed, pr_raise;

static void pr_hook(int point, const void *object) {
    if (point == CORAL_TP_HEAP_POOL_LOCKED && object == NULL && pr_raise && !hf_raised) {
        hf_raised = 1;
        raise(SIGUSR1);
    }
}

static void pr_destructor(void *value) {
    if (!pr_rearmed) {
        pr_rearmed = true;
        CHECK_EQ(pthread_setspecific(pr_key, value), 0);
        return;
    }
    coral_heap_t *heap = value;
    pr_raise = true;
    void *p = coral_malloc(40); /* the exit heap's first use */
    pr_raise = false;
    if (getpid() != hf_main_pid) {
        coral_heap_destroy(heap); /* the thread's own parked heap */
        _exit(p != NULL ? 0 : 5);
    }
    coral_free(p);
    coral_heap_destroy(heap);
}

static void *pr_thread(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    memset(coral_heap_malloc(heap, 64), 5, 64);
    CHECK_EQ(pthread_setspecific(pr_key, heap), 0);
    return NULL;
}

static void case_fork_parked_reap(void) {
    alarm(20);
    hf_main_pid = getpid();
    coral_free(coral_malloc(16)); /* coralloc's key first */
    CHECK_EQ(pthread_key_create(&pr_key, pr_destructor), 0);
    run_freer_signalled(hf_handler, pr_hook, pr_thread);
    alarm(0);
    CHECK_MSG(hf_raised == 1, "the hook never fired (the exit heap existed?)");
    expect_child_exit_0(hf_child, "the handler fork's child");
    CHECK_EQ(coral_test_check(), 0);
}

/* fork_nested_stale_left: a stale fork_pool_left: thread F's first malloc forked from a
 * handler holding the pool's lock (fork_pool_left = true, left so); later,
 * while thread H holds the pool's lock (held at a gate), F forks and a
 * signal at its prepare's stdio point (before fork_pool_left is written)
 * forks again, nested: that child's handler releases every lock but the
 * pool's (stale true), then F's prepare goes on in that child and waits for
 * the pool's lock of H, a thread the child does not have. */
static __thread bool sl_f_first, sl_f_streams;
static _Atomic(bool) sl_handler2_done;
static volatile int sl_raised2;
static volatile pid_t sl_child1 = -1, sl_child2 = -1;

static void sl_handler(int sig) {
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
    } else if (sl_child1 == -1) {
        sl_child1 = pid;
    } else {
        sl_child2 = pid;
        atomic_store(&sl_handler2_done, true);
    }
    errno = saved;
}

static void sl_hook(int point, const void *object) {
    if (getpid() != hf_main_pid) return;
    if (point == CORAL_TP_HEAP_POOL_LOCKED && sl_f_first && !hf_raised) {
        hf_raised = 1;
        raise(SIGUSR1);
        return;
    }
    if (point == CORAL_TP_FORK_STREAMS_LISTED && sl_f_streams && !sl_raised2) {
        sl_raised2 = 1;
        raise(SIGUSR1);
        return;
    }
    gate_hook(point, object);
}

static void *sl_h(void *arg) {
    (void)arg;
    coral_free(coral_malloc(30)); /* held at the gate in its setup */
    return NULL;
}

static void *sl_f(void *arg) {
    (void)arg;
    sl_f_first = true;
    void *p = coral_malloc(24); /* handler fork 1, holding the pool's lock */
    sl_f_first = false;
    if (getpid() != hf_main_pid) _exit(0);
    coral_free(p);
    expect_child_exit_0(sl_child1, "first handler fork's child");
    /* H holds the pool's lock */
    gate_arm(CORAL_TP_HEAP_POOL_LOCKED, -1);
    coral_test_point_set(sl_hook);
    pthread_t h = start(sl_h, NULL);
    gate_wait_held();
    sl_f_streams = true;
    pid_t pid = fork(); /* nested handler fork at the stdio point */
    sl_f_streams = false;
    if (pid == 0) _exit(0);
    if (getpid() != hf_main_pid) {
        int st;
        waitpid(pid, &st, 0);
        _exit(0);
    }
    expect_child_exit_0(pid, "F's fork child");
    join(h);
    return NULL;
}

static void *sl_opener(void *arg) {
    (void)arg;
    while (!atomic_load(&sl_handler2_done)) sched_yield();
    gate_open();
    return NULL;
}

/* A case's start: its alarm, the main process's pid, the main thread's
 * heap, handler on SIGUSR1 and hook as the test-point hook. */
static void hf_start(unsigned alarm_s, void (*handler)(int), void (*hook)(int, const void *)) {
    alarm(alarm_s);
    hf_main_pid = getpid();
    coral_free(coral_malloc(1));
    sigusr1_handler_set(handler);
    coral_test_point_set(hook);
}

static void case_fork_nested_stale_left(void) {
    hf_start(40, sl_handler, sl_hook);
    pthread_t o = start(sl_opener, NULL);
    join(start(sl_f, NULL));
    join(o);
    coral_test_point_set(NULL);
    alarm(0);
    CHECK(sl_raised2 == 1);
    expect_child_exit_0(sl_child2, "the nested handler fork's child (stale fork_pool_left)");
    CHECK_EQ(coral_test_check(), 0);
}

/* fork_child_forks_again: the handler fork's child forks again from the same handler, before
 * the interrupted setup releases the pool's lock; each process then
 * allocates, starts a thread and forks. */
static volatile int cf2_status = -1;
static __thread bool cf2_first;

static void cf2_handler(int sig) {
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        pid_t g = fork(); /* from the child, still in the handler */
        if (g == 0) {
            alarm(20);
        } else {
            int st = -1;
            waitpid(g, &st, 0);
            cf2_status = st;
        }
    } else {
        hf_child = pid;
    }
    errno = saved;
}

static void cf2_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_HEAP_POOL_LOCKED && cf2_first && !hf_raised) {
        hf_raised = 1;
        raise(SIGUSR1);
    }
}

static void *cf2_thread(void *arg) {
    (void)arg;
    cf2_first = true;
    void *p = coral_malloc(24);
    cf2_first = false;
    CHECK(p != NULL);
    coral_free(p);
    join(start(malloc_free_200, NULL));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(coral_malloc(300) == NULL ? 7 : coral_test_check() == 0 ? 0 : 8);
    expect_child_exit_0(pid, "a later fork's child");
    CHECK_EQ(coral_test_check(), 0);
    if (getpid() != hf_main_pid) {
        /* the child (its own grandchild's status) or the grandchild (-1) */
        _exit(cf2_status == -1 || (WIFEXITED(cf2_status) && WEXITSTATUS(cf2_status) == 0) ? 0 : 9);
    }
    return NULL;
}

static void case_fork_child_forks_again(void) {
    alarm(30);
    hf_main_pid = getpid();
    coral_free(coral_malloc(1));
    run_freer_signalled(cf2_handler, cf2_hook, cf2_thread);
    alarm(0);
    expect_child_exit_0(hf_child, "the handler fork's child");
}

/* fork_two_forks: thread A's first malloc holds the heap pool's lock
 * (CORAL_TP_HEAP_POOL_LOCKED), and thread B forks: its prepare takes the
 * locks before the pool's (stdio's list lock first) and finds the pool's
 * taken. Once B waits in a futex call (/proc/self/task/TID/syscall), A's
 * hook raises the signal whose handler forks: that prepare leaves the
 * pool's lock to the code it interrupted and takes every other lock.
 * Before, B waited for the pool's lock holding the earlier ones and A's
 * fork waited for stdio's list lock, for good (the alarm ended the test);
 * now B gives them back and waits for the pool's lock holding none, A's
 * fork goes through, A's malloc releases the pool's lock and B's fork goes
 * on. Both forks' children allocate and end with status 0. */
static __thread bool tf_a_first;
static _Atomic(pid_t) tf_b_tid;
static _Atomic(bool) tf_a_holds;
static volatile pid_t tf_b_child = -1;

/* From A's hook, holding the lock: once B waits, the signal. */
static void tf_raise_once_b_waits(void) {
    hf_raised = 1;
    atomic_store(&tf_a_holds, true);
    while (!fe_waits(atomic_load(&tf_b_tid))) sched_yield();
    raise(SIGUSR1);
}

static void tf_hook(int point, const void *object) {
    if (point == CORAL_TP_HEAP_POOL_LOCKED && object == NULL && tf_a_first && !hf_raised)
        tf_raise_once_b_waits();
}

static void *tf_b(void *arg) {
    (void)arg;
    coral_free(coral_malloc(10)); /* its heap: no pool section of its own later */
    atomic_store(&tf_b_tid, (pid_t)syscall(SYS_gettid));
    while (!atomic_load(&tf_a_holds)) sched_yield();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(coral_malloc(50) == NULL ? 3 : coral_test_check() == 0 ? 0 : 4);
    tf_b_child = pid;
    return NULL;
}

static void *tf_a(void *arg) {
    (void)arg;
    while (atomic_load(&tf_b_tid) == 0) sched_yield();
    tf_a_first = true;
    void *p = coral_malloc(24); /* the handler forks here */
    tf_a_first = false;
    if (getpid() != hf_main_pid) _exit(p == NULL ? 5 : coral_test_check() == 0 ? 0 : 6);
    CHECK(p != NULL);
    coral_free(p);
    return NULL;
}

/* b_thread (B) and a_thread (A) on threads of their own; both forks' children end with
 * status 0. */
static void tf_run_b(void *(*b_thread)(void *), void *(*a_thread)(void *)) {
    pthread_t b = start(b_thread, NULL), a = start(a_thread, NULL);
    join(a);
    join(b);
    coral_test_point_set(NULL);
    alarm(0);
    CHECK_MSG(hf_raised == 1, "the hook never fired");
    expect_child_exit_0(hf_child, "A's handler fork's child");
    expect_child_exit_0(tf_b_child, "B's fork's child");
    CHECK_EQ(coral_test_check(), 0);
}

static void tf_run(void *(*a_thread)(void *)) { tf_run_b(tf_b, a_thread); }

static void case_fork_two_forks(void) {
    hf_start(20, hf_handler, tf_hook);
    tf_run(tf_a);
}

/* fork_two_forks_exit_heap: the same with the exit heap's lock: thread A,
 * past its exit (a key destructor after coralloc's), holds it to allocate
 * from the exit heap (CORAL_TP_EXIT_HEAP_LOCKED), and thread B forks; once
 * B waits in a futex call, A's hook raises the signal whose handler forks
 * (that prepare takes the recursive lock again). Before, B waited for the
 * exit heap's lock holding stdio's list lock and A's fork waited for that,
 * for good (the alarm ended the test); now B gives its locks back and
 * waits holding none. */
static pthread_key_t tx_key;
static __thread bool tx_a_exiting;

static void tx_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_EXIT_HEAP_LOCKED && tx_a_exiting && !hf_raised) tf_raise_once_b_waits();
}

/* The key's destructor, after coralloc's: an allocation from the exit heap. */
static void tx_exit_malloc(void *value) {
    (void)value;
    tx_a_exiting = true;
    void *p = coral_malloc(40); /* the handler forks here */
    tx_a_exiting = false;
    if (getpid() != hf_main_pid) _exit(p == NULL ? 5 : 0);
    CHECK(p != NULL);
    coral_free(p);
}

static void *tx_a(void *arg) {
    (void)arg;
    coral_free(coral_malloc(40)); /* its own heap: its exit cleanup runs */
    CHECK_EQ(pthread_setspecific(tx_key, &tx_key), 0);
    while (atomic_load(&tf_b_tid) == 0) sched_yield();
    return NULL;
}

static void case_fork_two_forks_exit_heap(void) {
    hf_start(20, hf_handler, tx_hook);
    CHECK_EQ(pthread_key_create(&tx_key, tx_exit_malloc), 0);
    tf_run(tx_a);
}

/* fork_back_off_nested: thread B's fork backs off from the heap pool's
 * lock, which thread A's first malloc holds (CORAL_TP_HEAP_POOL_LOCKED);
 * once B waits for it, A's malloc goes on and releases it. B takes it
 * (CORAL_TP_FORK_BACK_OFF_TAKEN) and a signal there forks from its handler:
 * nested, that fork's child handler releases every lock, the pool's too,
 * and the child goes on with B's back-off. Before, the back-off released
 * the pool's lock again there (CORAL_TP_FORK_BACK_OFF_RELEASING in the
 * child: it exits 7); now it sees that a child handler ran, and B's fork
 * goes on in that child, whose last thread then ends it with status 0. */
static void bo_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_HEAP_POOL_LOCKED && object == NULL && tf_a_first &&
        !atomic_load(&tf_a_holds)) {
        atomic_store(&tf_a_holds, true);
        while (!fe_waits(atomic_load(&tf_b_tid))) sched_yield();
        return; /* A's malloc goes on and releases the lock */
    }
    if (getpid() != hf_main_pid) {
        if (point == CORAL_TP_FORK_BACK_OFF_RELEASING) _exit(7);
        return;
    }
    if (point == CORAL_TP_FORK_BACK_OFF_TAKEN && !hf_raised) {
        hf_raised = 1;
        raise(SIGUSR1);
    }
}

static void case_fork_back_off_nested(void) {
    hf_start(20, hf_handler, bo_hook);
    tf_run(tf_a);
}

/* fork_back_off_wait_nested: the same back-off, the signal taken while B
 * still waits for the pool's lock (in the futex call; A holds the lock
 * until B's handler has forked). In that fork's child its child handler
 * releases the pool's lock (A's hold, whose thread the child lacks), and
 * B's wait there then takes it: the back-off holds it. Releasing it only if
 * no child handler ran since the wait began (fork_child_releases read
 * before the wait), the back-off kept it, and B's retry in that child
 * waited for its own hold for good (the child's alarm, status 0xe). */
static void bw_signal_b_once_waits(void) {
    atomic_store(&tf_a_holds, true);
    pid_t b = atomic_load(&tf_b_tid);
    while (!fe_waits(b)) sched_yield();
    hf_raised = 1;
    CHECK_EQ(syscall(SYS_tgkill, hf_main_pid, b, SIGUSR1), 0);
    while (hf_child == -1) sched_yield(); /* B's handler forked */
}

static void bw_hook(int point, const void *object) {
    if (point == CORAL_TP_HEAP_POOL_LOCKED && object == NULL && tf_a_first &&
        !atomic_load(&tf_a_holds))
        bw_signal_b_once_waits(); /* then A's malloc releases the lock */
}

static void case_fork_back_off_wait_nested(void) {
    hf_start(20, hf_handler, bw_hook);
    tf_run(tf_a);
}

/* fork_back_off_wait_nested_exit_heap: the same with the exit heap's lock,
 * held by thread A past its exit (CORAL_TP_EXIT_HEAP_LOCKED). In the
 * handler fork's child the lock is made anew, and B's wait there takes it.
 * Kept, it stayed B's after its fork there (a recursive lock, taken again
 * by the retry), and a thread that the child starts, allocating past its
 * exit, waited for it for good (the child's alarm, status 0xe). */
static pthread_key_t bx_key;

static void bx_hook(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_EXIT_HEAP_LOCKED && tx_a_exiting && !atomic_load(&tf_a_holds))
        bw_signal_b_once_waits(); /* then A's allocation releases the lock */
}

static void bx_exit_malloc(void *value) {
    (void)value;
    void *p = coral_malloc(40); /* from the exit heap */
    if (p == NULL) _exit(11);
    coral_free(p);
}

static void *bx_exiting(void *arg) {
    (void)arg;
    coral_free(coral_malloc(40));
    CHECK_EQ(pthread_setspecific(bx_key, &bx_key), 0);
    return NULL;
}

/* B, then in its handler fork's child a thread that allocates past its exit. */
static void *bx_b(void *arg) {
    tf_b(arg);
    if (getpid() != hf_main_pid && tf_b_child != 0) {
        join(start(bx_exiting, NULL));
        _exit(0);
    }
    return NULL;
}

static void case_fork_back_off_wait_nested_exit_heap(void) {
    hf_start(20, hf_handler, bx_hook);
    CHECK_EQ(pthread_key_create(&tx_key, tx_exit_malloc), 0);
    CHECK_EQ(pthread_key_create(&bx_key, bx_exit_malloc), 0);
    tf_run_b(bx_b, tx_a);
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
        {"thread_setup_signal", case_thread_setup_signal},
        {"fork_thread_setup_signal", case_fork_thread_setup_signal},
        {"fork_setup_exit_heap", case_fork_setup_exit_heap},
        {"clean_dead_signal", case_clean_dead_signal},
        {"fork_exit_signal", case_fork_exit_signal},
        {"fork_pool_unrecorded_taken", case_fork_pool_unrecorded_taken},
        {"fork_pool_unrecorded_releasing", case_fork_pool_unrecorded_releasing},
        {"fork_parked_reap", case_fork_parked_reap},
        {"fork_nested_stale_left", case_fork_nested_stale_left},
        {"fork_child_forks_again", case_fork_child_forks_again},
        {"fork_two_forks", case_fork_two_forks},
        {"fork_two_forks_exit_heap", case_fork_two_forks_exit_heap},
        {"fork_back_off_nested", case_fork_back_off_nested},
        {"fork_back_off_wait_nested", case_fork_back_off_wait_nested},
        {"fork_back_off_wait_nested_exit_heap", case_fork_back_off_wait_nested_exit_heap},
        {"notify_retire", case_notify_retire},
        {"large_only", case_large_only},
        {"huge_free_vs_exit", case_huge_free_vs_exit},
        {"fork_huge_lock", case_fork_huge_lock},
        {"fork_bulk_flush", case_fork_bulk_flush},
        {"orphan_reuse_smaller", case_orphan_reuse_smaller},
        {"fork_exit_heap_notice", case_fork_exit_heap_notice},
        {"purger_watch_expired", case_purger_watch_expired},
        {"rt_notice_wait", case_rt_notice_wait},
        {"exit_watch", case_exit_watch},
        {"parked_claiming", case_parked_claiming},
        {"parked_unlisted", case_parked_unlisted},
        {"parked_purging", case_parked_purging},
        {"parked_again", case_parked_again},
        {"aside_claiming", case_aside_claiming},
        {"aside_unlisted", case_aside_unlisted},
        {"aside_purging", case_aside_purging},
        {"aside_reaside", case_aside_reaside},
        {"aside_reaside_pushed", case_aside_reaside_pushed},
        {"parked_exit", case_parked_exit},
        {"purger_started_notice", case_purger_started_notice},
        {"purger_started_free", case_purger_started_free},
        {"fork_cache_purge", case_fork_cache_purge},
        {"fork_hooks_set", case_fork_hooks_set},
        {"fork_cache_evict", case_fork_cache_evict},
        {"fork_concurrent", case_fork_concurrent},
        {"fork_atfork_first", case_fork_atfork_first},
        {"fork_profiled_exit", case_fork_profiled_exit},
        {"fork_first_alloc", case_fork_first_alloc},
        {"fork_process_init", case_fork_process_init},
        {"fork_process_init_unclaimed", case_fork_process_init_unclaimed},
        {"purger_lock_signal", case_purger_lock_signal},
        {"purger_prepare_notice", case_purger_prepare_notice},
        {"profile_fork_tally", case_profile_fork_tally},
        {"fork_in_profile_section", case_fork_in_profile_section},
        {"dump_in_profile_section", case_dump_in_profile_section},
        {"fork_nested", case_fork_nested},
        {"fork_in_purge", case_fork_in_purge},
        {"fork_nested_child_forks", case_fork_nested_child_forks},
        {"fork_prepare_starts_thread", case_fork_prepare_starts_thread},
        {"fork_nested_in_release", case_fork_nested_in_release},
        {"fork_nested_in_prepare", case_fork_nested_in_prepare},
        {"fork_nested_in_streams_lock", case_fork_nested_in_streams_lock},
        {"fork_prepare_thread_nested_in_streams_lock",
         case_fork_prepare_thread_nested_in_streams_lock},
        {"remote_mark_race", case_remote_mark_race},
        {"remote_mark_take", case_remote_mark_take},
        {"remote_run_mark_race", case_remote_run_mark_race},
        {"remote_run_signal", case_remote_run_signal},
        {"remote_run_heap_signal", case_remote_run_heap_signal},
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
