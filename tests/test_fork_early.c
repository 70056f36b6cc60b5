/* Fork handlers registered before coralloc's, that allocate.
 *
 * A library the program links registers its pthread_atfork handlers from
 * its constructor, which the loader runs before an LD_PRELOADed coralloc's:
 * its prepare handler then runs after coralloc's (every allocator lock
 * held) and its parent and child handlers before coralloc's (still held;
 * in the child, before coralloc's child handler has set right what the
 * parent's other threads left in flight). Here a constructor of priority
 * 101 registers them before coralloc's (default priority, the same order);
 * each case sets what they do. The process has a second thread, so the
 * fork takes the locks. Run as `test_fork_early [CASE]` (default:
 * allocate). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "hooks.h"

/* What the early handlers do (NULL: nothing), set by the case before it
 * forks. The child's handler starts the child's alarm (a hang detector:
 * alarms are not inherited). */
static void (*early_in_prepare)(void), (*early_in_parent)(void), (*early_in_child)(void);

static void early_prepare(void) {
    if (early_in_prepare != NULL) early_in_prepare();
}

static void early_parent(void) {
    if (early_in_parent != NULL) early_in_parent();
}

static void early_child(void) {
    alarm(20);
    if (early_in_child != NULL) early_in_child();
}

__attribute__((constructor(101))) static void register_early(void) {
    CHECK_EQ(pthread_atfork(early_prepare, early_parent, early_child), 0);
}

static int idle_pipe[2];

static void *idle_thread(void *arg) {
    (void)arg;
    char c;
    CHECK_EQ(read(idle_pipe[0], &c, 1), 1);
    return NULL;
}

/* A second thread that allocates nothing, so that each fork takes the
 * locks (a single-threaded process's takes none). */
static pthread_t idle_start(void) {
    CHECK_EQ(pipe(idle_pipe), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, idle_thread, NULL), 0);
    return t;
}

static void idle_stop(pthread_t t) {
    CHECK_EQ(write(idle_pipe[1], "x", 1), 1);
    CHECK_EQ(pthread_join(t, NULL), 0);
}

/* The cases whose child starts a thread. */
static void skip_under_sanitizers(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("SKIPPED: under the sanitizers no thread may start in the child of a multi-threaded "
           "fork\n");
    exit(77);
#endif
}

/* Fork; the child runs child_then (if any) and exits 0; the parent expects
 * that (SIGALRM: the child hung; its alarm is set by early_child). */
static void fork_and_wait(const char *what, void (*child_then)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (child_then != NULL) child_then();
        _exit(0);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s: child status 0x%x (SIGALRM: it hung; exit 1: a check failed)", what, status);
}

/* ---- allocate: blocks of every size range ---------------------------------------------
 * Each handler allocates and frees small, medium, large and huge blocks
 * (the heap pool, segment, segment cache and huge-list locks); each fork's
 * child allocates again. Before coralloc's handlers let the forking
 * thread's own allocations through (coral_fork_holding), the first
 * handler's malloc waited forever for a lock its own thread held. */

#define FORKS 20

static const size_t sizes[] = {64, 4000, 300 * 1024, 8u << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static void allocate_each_size(void) {
    void *p[NSIZES];
    for (size_t i = 0; i < NSIZES; i++) {
        p[i] = coral_malloc(sizes[i]);
        CHECK(p[i] != NULL);
        memset(p[i], 0x5a, 64);
    }
    for (size_t i = 0; i < NSIZES; i++) coral_free(p[i]);
}

static void case_allocate(void) {
    early_in_prepare = early_in_parent = early_in_child = allocate_each_size;
    pthread_t t = idle_start();
    coral_free(coral_malloc(100));
    for (int i = 0; i < FORKS; i++) fork_and_wait("allocate", allocate_each_size);
    idle_stop(t);
}

/* ---- purge_pass: a handler waits for a purge pass --------------------------------------
 * coral_test_purge_pass waits for the purge thread's next pass. In the
 * parent that pass needs the locks the fork holds (its wait let the purge
 * thread go on, which then waited for them: both waited forever); in the
 * child, before coralloc's child handler, the purge thread is the
 * parent's, which the child does not have (it waited forever). Now, while
 * the fork holds the locks, the call runs a pass itself. */

static void purge_pass_in_handler(void) {
    CHECK_EQ(coral_test_purge_pass(), 0); /* 0: run here, not by the thread */
}

static void case_purge_pass(void) {
    pthread_t t = idle_start();
    /* Freed memory to purge starts the purge thread. */
    void *big = coral_malloc(8u << 20);
    CHECK(big != NULL);
    memset(big, 1, 8u << 20);
    coral_free(big);
    coral_free(coral_malloc(100)); /* (a safe point: the thread starts) */
    if (coral_test_purge_pass() != 1) {
        printf("SKIPPED: no purge thread (CORALLOC_PURGE_THREAD=0?)\n");
        exit(77);
    }
    early_in_prepare = early_in_parent = early_in_child = purge_pass_in_handler;
    for (int i = 0; i < 3; i++) fork_and_wait("purge_pass", NULL);
    early_in_prepare = early_in_parent = early_in_child = NULL;
    CHECK_EQ(coral_test_purge_pass(), 1); /* the thread still runs its passes */
    idle_stop(t);
}

/* ---- purger_start: the child's handler frees enough to start the purge thread ----------
 * The parent has no purge thread. The child's early handler frees 8 MiB,
 * which wants the purge thread. Started there, before coralloc's child
 * handler, it was the child's one thread besides the forking one when that
 * handler made the purge thread's lock and condition variables anew under
 * it and marked it not running: the next free started a second one. Now
 * no purge thread starts while the fork holds the locks: the child starts
 * one, once, after its handlers. */

static void free_8mib(void) {
    void *big = coral_malloc(8u << 20);
    CHECK(big != NULL);
    memset(big, 1, 8u << 20);
    coral_free(big);
}

static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    CHECK(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void child_starts_purger(void) {
    free_8mib();
    coral_free(coral_malloc(100)); /* (a safe point: the thread starts) */
    CHECK_EQ(coral_test_purge_pass(), 1);
    CHECK_MSG(task_count() == 2, "%d threads in the child: its own and more than one purge thread",
              task_count());
}

static void case_purger_start(void) {
    skip_under_sanitizers();
    pthread_t t = idle_start();
    coral_free(coral_malloc(100));
    CHECK_EQ(coral_test_purge_pass(), 0); /* no purge thread yet */
    early_in_child = free_8mib;
    fork_and_wait("purger_start", child_starts_purger);
    idle_stop(t);
}

/* ---- child_freeing: a remote free tells the forking thread at the fork ------------------
 * The forking thread's first page of 16 KiB blocks is full (in the full
 * queue, state USE); another thread frees one of its blocks and is held
 * after pushing the page on the heap's delayed_pages, the page in state
 * FREEING; the thread forks. In the child that freer does not exist, and
 * coralloc's child handler sets the state back, but the early child
 * handler runs before it: its allocations take the delayed page back,
 * which waited forever for FREEING to end. Now an owner in the child
 * before that handler knows FREEING for stale. */

#define CF_BLOCK ((size_t)16384)
#define CF_MAX 64

static void *cf_blocks[CF_MAX];

static void allocate_past_the_page(void) {
    for (size_t i = 0; i < 2 * CF_MAX; i++) CHECK(coral_malloc(CF_BLOCK) != NULL);
}

static void *free_first_block(void *arg) {
    (void)arg;
    coral_free(cf_blocks[0]); /* held at NOTIFY_PUSHED, the page FREEING */
    return NULL;
}

/* The forking thread's first page of CF_BLOCK blocks, filled: its blocks
 * in cf_blocks (the page is then in the full queue, state USE). */
static void fill_first_page(void) {
    char *first = coral_malloc(CF_BLOCK), *next = NULL;
    CHECK(first != NULL);
    size_t stride = coral_malloc_usable_size(first), count = 0;
    cf_blocks[count++] = first;
    while (next == NULL) { /* carved in address order until the page is full */
        char *p = coral_malloc(CF_BLOCK);
        CHECK(p != NULL && count < CF_MAX);
        if (p == first + count * stride)
            cf_blocks[count++] = p;
        else
            next = p;
    }
}

static void case_child_freeing(void) {
    fill_first_page();
    gate_arm(CORAL_TP_NOTIFY_PUSHED, -1);
    pthread_t freer;
    CHECK_EQ(pthread_create(&freer, NULL, free_first_block, NULL), 0);
    gate_wait_held();
    early_in_child = allocate_past_the_page;
    fork_and_wait("child_freeing", NULL);
    early_in_child = NULL;
    gate_open();
    CHECK_EQ(pthread_join(freer, NULL), 0);
    allocate_past_the_page(); /* (the parent's page, FREEING ended) */
}

/* ---- child_thread: a thread the child's handler starts frees ---------------------------
 * The parent's purge thread runs and has nothing pending. The child's
 * early handler starts a thread that frees every block of a page of the
 * forking thread's: the last free lists the page as an orphan (waiting for
 * the orphan lock until coralloc's child handler releases it) and wakes
 * the purge thread. That thread took the purge thread's lock, still held
 * from the parent, and waited; the child handler then made the lock anew
 * under it, so that it waited forever (the child's alarm ends it). The
 * child handler is held where it makes the lock anew until the thread is
 * done or waits for that lock (its /proc/self/task/TID/syscall: futex on
 * the lock's address). Now no thread signals the purge thread in a
 * fork's child before its child handler released the locks. */

#define CT_BLOCKS 1024 /* 64-byte blocks: one 64 KiB page of a new heap */

static void *ct_blocks[CT_BLOCKS];
static _Atomic(pid_t) ct_tid;
static _Atomic(bool) ct_done;
static pthread_t ct_thread;

static void *free_the_page(void *arg) {
    (void)arg;
    atomic_store(&ct_tid, (pid_t)syscall(SYS_gettid));
    for (size_t i = 0; i < CT_BLOCKS; i++) coral_free(ct_blocks[i]);
    atomic_store(&ct_done, true);
    return NULL;
}

static void start_freer(void) {
    CHECK_EQ(pthread_create(&ct_thread, NULL, free_the_page, NULL), 0);
}

/* Whether task tid waits in a futex call on lock (NULL: on any; its
 * syscall file: the call's number, then its arguments in hex). No
 * allocation. */
static bool waits_on(pid_t tid, const void *lock) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK_MSG(fd >= 0, "cannot open %s", path);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    char *end;
    long nr = strtol(buf, &end, 10);
    return nr == SYS_futex &&
           (lock == NULL || strtoull(end, NULL, 16) == (unsigned long long)(uintptr_t)lock);
}

/* Until the thread *tid (0: not started yet) is done or, once *ready (NULL:
 * at once), waits in a futex call on lock (NULL: on any). */
static void wait_until_waits(_Atomic(pid_t) *tid, _Atomic(bool) *done, _Atomic(bool) *ready,
                             const void *lock) {
    for (;;) {
        if (atomic_load(done)) return;
        pid_t t = atomic_load(tid);
        if (t != 0 && (ready == NULL || atomic_load(ready)) && waits_on(t, lock)) return;
        sched_yield();
    }
}

static void hold_until_freer_settled(int point, const void *object) {
    if (point == CORAL_TP_FORK_CHILD_PURGER) wait_until_waits(&ct_tid, &ct_done, NULL, object);
}

static void join_freer(void) {
    CHECK_EQ(pthread_join(ct_thread, NULL), 0);
    CHECK(atomic_load(&ct_done));
}

static void case_child_thread(void) {
    skip_under_sanitizers();
    pthread_t t = idle_start();
    free_8mib();
    coral_free(coral_malloc(100)); /* (a safe point: the purge thread starts) */
    if (coral_test_purge_pass() != 1) {
        printf("SKIPPED: no purge thread (CORALLOC_PURGE_THREAD=0?)\n");
        exit(77);
    }
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    for (size_t i = 0; i < CT_BLOCKS; i++) CHECK((ct_blocks[i] = coral_heap_malloc(heap, 64)));
    coral_test_point_set(hold_until_freer_settled);
    early_in_child = start_freer;
    CHECK_EQ(coral_test_purge_pass(), 1); /* (nothing pending at the fork) */
    fork_and_wait("child_thread", join_freer);
    early_in_child = NULL;
    coral_test_point_set(NULL);
    coral_heap_destroy(heap);
    idle_stop(t);
}

/* ---- child_freeing_push: a thread the child's handler starts frees into a FREEING page -----
 * As child_freeing, a parent thread is held at the fork having told the
 * forking thread that its full page of 16 KiB blocks has a free block
 * (the page in state FREEING, on the heap's delayed_pages). The child's
 * early handler starts a thread that frees a second block of that page:
 * a push on its thread_free, no lock. coralloc's child handler sets the
 * page's stale FREEING back to NONE meanwhile; it is held after it read
 * the word until that push is done. Before, it then stored the word it
 * had read: the push was lost, and the block with it (never handed out
 * again in the child: a leak of the block and of its page). Now the state
 * is set back with a CAS, which keeps the push: the child's allocations
 * get both freed blocks back. */

static _Atomic(bool) cfp_at_point, cfp_pushed;

static void *free_second_block(void *arg) {
    (void)arg;
    while (!atomic_load(&cfp_at_point)) sched_yield();
    coral_free(cf_blocks[1]);
    atomic_store(&cfp_pushed, true);
    return NULL;
}

static void start_second_freer(void) {
    CHECK_EQ(pthread_create(&ct_thread, NULL, free_second_block, NULL), 0);
}

static void hold_until_pushed(int point, const void *object) {
    (void)object;
    if (point != CORAL_TP_FORK_CHILD_FREEING || atomic_load(&cfp_at_point)) return;
    atomic_store(&cfp_at_point, true);
    while (!atomic_load(&cfp_pushed)) sched_yield();
}

static void both_blocks_back(void) {
    CHECK_EQ(pthread_join(ct_thread, NULL), 0);
    CHECK(atomic_load(&cfp_pushed));
    bool first = false, second = false;
    for (size_t i = 0; i < 2 * CF_MAX; i++) {
        void *p = coral_malloc(CF_BLOCK);
        CHECK(p != NULL);
        first |= p == cf_blocks[0];
        second |= p == cf_blocks[1];
    }
    CHECK_MSG(first, "the block freed at the fork was not handed out again");
    CHECK_MSG(second, "the block the child's thread freed was lost (never handed out again)");
}

static void case_child_freeing_push(void) {
    skip_under_sanitizers();
    fill_first_page();
    gate_arm(CORAL_TP_NOTIFY_PUSHED, -1);
    pthread_t freer;
    CHECK_EQ(pthread_create(&freer, NULL, free_first_block, NULL), 0);
    gate_wait_held();
    coral_test_point_set(hold_until_pushed);
    early_in_child = start_second_freer;
    fork_and_wait("child_freeing_push", both_blocks_back);
    early_in_child = NULL;
    coral_test_point_set(gate_hook);
    gate_open();
    CHECK_EQ(pthread_join(freer, NULL), 0);
}

/* ---- nested_parked: the child's handler forks again, the forking thread past its exit -----
 * A thread forks in a key destructor that runs after coralloc's exit
 * cleanup parked its user heap (test_lifetime child_destroys_parked); the
 * child's early handler forks again. Each child's coralloc handler gives
 * the parked heaps of the forking thread's parent id the thread's new id
 * (the child's), so that its thread may destroy them there. The nested
 * fork's prepare overwrote that parent id with the child's id, though the
 * heaps still had the first parent's: neither the inner child nor the
 * child renamed them, and each destroy of the heap stopped with "the heap
 * belongs to another thread" (and their reapers took its thread for gone,
 * free to reuse its struct). Now a nested fork keeps the outermost fork's
 * parent id. */

static pthread_key_t np_key;
static __thread bool np_rearmed;
static coral_heap_t *np_heap;
static int np_inner_status = -1, np_status = -1;

static int np_wait(pid_t pid) {
    int status = -1;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    return status;
}

static bool np_exit_0(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

/* The early child handler, in the child: fork again; the inner child
 * destroys the heap. */
static void fork_inner_destroy(void) {
    early_in_child = NULL;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        coral_heap_destroy(np_heap);
        _exit(0);
    }
    np_inner_status = np_wait(pid);
}

static void fork_from_late_destructor(void *value) {
    /* A thread with user heaps runs coralloc's cleanup in the second round
     * of destructors: this one forks in that round, after it. */
    if (!np_rearmed) {
        np_rearmed = true;
        CHECK_EQ(pthread_setspecific(np_key, value), 0);
        return;
    }
    np_heap = value;
    early_in_child = fork_inner_destroy;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        coral_heap_destroy(np_heap);
        _exit(np_exit_0(np_inner_status) ? 0 : 2);
    }
    early_in_child = NULL;
    np_status = np_wait(pid);
    coral_heap_destroy(np_heap);
}

static void *heap_then_exit(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    memset(coral_heap_malloc(heap, 64), 5, 64);
    CHECK_EQ(pthread_setspecific(np_key, heap), 0);
    return NULL;
}

static void case_nested_parked(void) {
    pthread_t t = idle_start();
    coral_free(coral_malloc(16)); /* coralloc's key first: its destructor runs before np_key's */
    CHECK_EQ(pthread_key_create(&np_key, fork_from_late_destructor), 0);
    pthread_t exiting;
    CHECK_EQ(pthread_create(&exiting, NULL, heap_then_exit, NULL), 0);
    CHECK_EQ(pthread_join(exiting, NULL), 0);
    CHECK_MSG(np_exit_0(np_status),
              "a destroy of the forking thread's parked heap failed in the %s (status 0x%x)",
              WIFEXITED(np_status) && WEXITSTATUS(np_status) == 2 ? "inner child" : "child",
              np_status);
    idle_stop(t);
}

/* ---- child_thread_forks: a thread the child's early handler starts forks ---------------
 * The parent is multi-threaded when glibc's fork begins, so glibc makes
 * stdio's list lock (and every stream's lock) anew in the child before the
 * child handlers run. The early child handler starts a thread that forks at
 * once, and returns once that thread's fork is in coralloc's prepare
 * handler and waits (a futex call): it has taken the list lock and waits
 * for the allocator's locks, which the forking thread holds until
 * coralloc's child handler. That handler made the list lock anew again,
 * under the thread's hold: the thread's parent handler then released it
 * once more than it was taken (count -1), and the child's next fork or
 * fflush(NULL) waited forever for it (SIGALRM). Now the handler makes
 * nothing anew that glibc made anew. The child then flushes every stream
 * (another thread's fflush(NULL)) and forks, three times. */

static pthread_t cf_thread;
static _Atomic(pid_t) cf_tid;
static _Atomic(bool) cf_in_prepare;
static _Atomic(int) cf_forked = -1; /* the thread's child's wait status */
static _Atomic(bool) cf_done;

static void note_thread_prepare(int point, const void *object) {
    (void)object;
    if (point == CORAL_TP_FORK_PREPARE && (pid_t)syscall(SYS_gettid) == atomic_load(&cf_tid))
        atomic_store(&cf_in_prepare, true);
}

static void *thread_forks(void *arg) {
    (void)arg;
    atomic_store(&cf_tid, (pid_t)syscall(SYS_gettid));
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status = -1;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    atomic_store(&cf_forked, status);
    atomic_store(&cf_done, true);
    return NULL;
}

static void start_forking_thread(void) {
    atomic_store(&cf_tid, 0);
    atomic_store(&cf_in_prepare, false);
    CHECK_EQ(pthread_create(&cf_thread, NULL, thread_forks, NULL), 0);
    wait_until_waits(&cf_tid, &cf_done, &cf_in_prepare, NULL);
}

static void *flush_all(void *arg) {
    CHECK_EQ(fflush(NULL), 0);
    return arg;
}

static void join_forking_thread(void) {
    CHECK_EQ(pthread_join(cf_thread, NULL), 0);
    CHECK_EQ(atomic_load(&cf_forked), 0);
    early_in_child = NULL;
    for (int i = 0; i < 3; i++) {
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, flush_all, NULL), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        fork_and_wait("child_thread_forks (the child's child)", NULL);
        coral_free(coral_malloc(100));
    }
}

static void case_child_thread_forks(void) {
    skip_under_sanitizers();
    pthread_t t = idle_start();
    coral_free(coral_malloc(100));
    coral_test_point_set(note_thread_prepare);
    early_in_child = start_forking_thread;
    for (int i = 0; i < FORKS; i++) fork_and_wait("child_thread_forks", join_forking_thread);
    coral_test_point_set(NULL);
    idle_stop(t);
}

/* ---- child_list_waiter: a thread of the child waits for stdio's list lock ---------------
 * The process has one thread when glibc's fork begins, so glibc makes
 * nothing anew in the child; a prepare handler registered after coralloc's
 * (run before it) starts a thread, so coralloc's prepare takes stdio's list
 * lock. The child's early handler starts a thread that flushes every
 * stream (fflush(NULL)) and returns once that thread waits (a futex call:
 * for the list lock, which the forking thread holds). coralloc's child
 * handler made the lock anew, which wakes no waiter: the thread waited
 * forever (SIGALRM). Now it releases its take, as the parent handler does,
 * and the thread goes on. */

static pthread_t lw_prepare_thread, lw_thread;
static _Atomic(pid_t) lw_tid;
static _Atomic(bool) lw_done;

static void prepare_starts_thread(void) {
    CHECK_EQ(pthread_create(&lw_prepare_thread, NULL, idle_thread, NULL), 0);
}

static void *flush_when_free(void *arg) {
    atomic_store(&lw_tid, (pid_t)syscall(SYS_gettid));
    CHECK_EQ(fflush(NULL), 0);
    atomic_store(&lw_done, true);
    return arg;
}

static void start_list_waiter(void) {
    CHECK_EQ(pthread_create(&lw_thread, NULL, flush_when_free, NULL), 0);
    wait_until_waits(&lw_tid, &lw_done, NULL, NULL);
}

static void join_list_waiter(void) {
    CHECK_EQ(pthread_join(lw_thread, NULL), 0);
    CHECK(atomic_load(&lw_done));
}

static void case_child_list_waiter(void) {
    skip_under_sanitizers();
    if (!__libc_single_threaded) {
        printf("SKIPPED: the process has a thread already\n");
        exit(77);
    }
    CHECK_EQ(pipe(idle_pipe), 0);
    CHECK_EQ(pthread_atfork(prepare_starts_thread, NULL, NULL), 0);
    early_in_child = start_list_waiter;
    fork_and_wait("child_list_waiter", join_list_waiter);
    idle_stop(lw_prepare_thread);
}

int main(int argc, char **argv) {
    alarm(60); /* (a hang detector for the parent's own handlers) */
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {
        {"allocate", case_allocate},
        {"purge_pass", case_purge_pass},
        {"purger_start", case_purger_start},
        {"child_freeing", case_child_freeing},
        {"child_thread", case_child_thread},
        {"child_freeing_push", case_child_freeing_push},
        {"nested_parked", case_nested_parked},
        {"child_thread_forks", case_child_thread_forks},
        {"child_list_waiter", case_child_list_waiter},
    };
    const char *name = argc > 1 ? argv[1] : "allocate";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (strcmp(cases[i].name, name) != 0) continue;
        cases[i].run();
        printf("test_fork_early %s: ok\n", name);
        return 0;
    }
    fprintf(stderr, "test_fork_early: no case %s\n", name);
    return 2;
}
