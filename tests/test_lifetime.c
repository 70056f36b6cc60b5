/* Process and thread lifetime with coralloc serving malloc (libcoralloc.so,
 * the standard names): a process whose last thread ends with pthread_exit
 * ends (in a fork child too), a thread that allocates in every round of the
 * key destructors leaves nothing behind, and a user heap's handle stops at
 * its thread's exit. Run as `test_lifetime CASE`. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "stats_json.h"
#include "testutil.h"

/* Threads of this process (entries of /proc/self/task). */
static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    CHECK(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* Enough freed to start coralloc's purge thread (1 MiB waiting to be
 * purged): many small blocks and an 8 MiB one, as a program would. */
static void start_purge_thread(void) {
    static void *blocks[200000];
    for (size_t i = 0; i < 200000; i++) blocks[i] = opaque(malloc(64));
    for (size_t i = 0; i < 200000; i++) free(blocks[i]);
    char *big = opaque(malloc((size_t)8 << 20));
    memset(big, 1, (size_t)8 << 20);
    free(big);
    free(opaque(malloc(64))); /* a safe point: the purge thread starts */
}

/* Wait for child `pid` for at most `seconds` (a hang detector, not a
 * timing: the process should end at once); its wait status, or -1 after
 * killing it. */
static int wait_or_kill(pid_t pid, int seconds) {
    for (int i = 0; i < seconds * 100; i++) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        CHECK(got >= 0);
        if (got == pid) return status;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void expect_exit_0(pid_t pid, const char *what) {
    int status = wait_or_kill(pid, 30);
    CHECK_MSG(status != -1, "%s: the process did not end (killed after 30 s)", what);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status 0x%x", what, status);
}

/* main ends with pthread_exit once the purge thread runs: the process ends,
 * status 0 (POSIX: the last thread's end ends the process). */
static void case_main_pthread_exit(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        start_purge_thread();
        CHECK_MSG(task_count() == 2, "%d threads: the purge thread did not start", task_count());
        pthread_exit(NULL);
    }
    expect_exit_0(pid, "main_pthread_exit");
}

/* A fork child whose only thread (the forking one, not main) returns from
 * its thread function once the child's purge thread runs. */
static void *fork_and_return(void *arg) {
    (void)arg;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        start_purge_thread();
        CHECK_MSG(task_count() == 2, "%d threads: the purge thread did not start", task_count());
        return NULL; /* the child's last thread ends */
    }
    expect_exit_0(pid, "child_thread_return");
    return NULL;
}

static void case_child_thread_return(void) {
    pid_t pid = fork(); /* a clean process to make the forking thread in */
    CHECK(pid >= 0);
    if (pid == 0) {
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, fork_and_return, NULL), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        _exit(0);
    }
    expect_exit_0(pid, "child_thread_return (outer)");
}

/* A key destructor that re-arms itself and allocates in every round glibc
 * runs (PTHREAD_DESTRUCTOR_ITERATIONS): a heap made in the last round was
 * never abandoned, with every segment it took. 1,600 threads must leave
 * the address space small (before: gigabytes of VmSize). */
static pthread_key_t rounds_key;

static void rounds_destructor(void *value) {
    free(value);
    void *p = opaque(malloc(100));
    memset(p, 1, 100);
    pthread_setspecific(rounds_key, p);
}

static void *rounds_thread(void *arg) {
    (void)arg;
    pthread_setspecific(rounds_key, opaque(malloc(100)));
    return NULL;
}

/* The process's address space (VmSize of /proc/self/status), in bytes. */
static long long vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "VmSize:", 7) == 0) kb = strtoll(line + 7, NULL, 10);
    fclose(f);
    CHECK_GE(kb, 0);
    return kb * 1024;
}

static void case_key_destructor_rounds(void) {
    CHECK_EQ(pthread_key_create(&rounds_key, rounds_destructor), 0);
    long long before = vm_size();
    for (int i = 0; i < 1600; i++) {
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, rounds_thread, NULL), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
    }
    long long grown = vm_size() - before;
    printf("key_destructor_rounds: VmSize grew by %lld MiB\n", grown >> 20);
    CHECK_MSG(grown < (64ll << 20), "VmSize grew by %lld MiB after 1600 threads", grown >> 20);
}

/* A user heap's handle after its thread exited: a clear error, also for a
 * later thread that got the same thread id and heap struct (glibc reuses
 * stacks; the pool reuses structs). */
static void *make_heap_and_exit(void *arg) {
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    free(coral_heap_malloc(heap, 32));
    *(coral_heap_t **)arg = heap;
    return NULL;
}

static void *use_stale_heap(void *arg) {
    if (coral_heap_malloc(*(coral_heap_t **)arg, 32) != NULL)
        fprintf(stderr, "stale heap accepted\n");
    return NULL; /* not reached: the call aborts */
}

static void case_heap_after_exit(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        coral_heap_t *heap = NULL;
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, make_heap_and_exit, &heap), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        CHECK_EQ(pthread_create(&t, NULL, use_stale_heap, &heap), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        _exit(0);
    }
    int status = wait_or_kill(pid, 30);
    CHECK_MSG(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
              "a stale heap handle was accepted (status 0x%x)", status);
}

/* The same thread may still destroy its user heap after coralloc's exit
 * cleanup (a later key destructor, a Rust thread_local): no error, and the
 * struct is not handed to another heap while that thread may hold it. */
static pthread_key_t late_key;

static void late_destroy(void *value) { coral_heap_destroy(value); }

static void *heap_destroyed_late(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    void *p = coral_heap_malloc(heap, 64);
    memset(p, 2, 64);
    pthread_setspecific(late_key, heap);
    return NULL;
}

static void case_heap_destroyed_late(void) {
    /* Created after coralloc's key (set up by the first malloc): its
     * destructor runs after coralloc's thread exit cleanup. */
    free(opaque(malloc(16)));
    CHECK_EQ(pthread_key_create(&late_key, late_destroy), 0);
    for (int i = 0; i < 200; i++) {
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, heap_destroyed_late, NULL), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
    }
}

/* A fork child's thread allocates after coralloc's exit cleanup (a later
 * key destructor): the exit heap serves it, under a recursive lock that
 * every fork takes. Unlocking it in the child failed (the child's thread
 * has another kernel id than its owner: EPERM), so the child hung on it. */
static pthread_key_t child_late_key;

static void child_late_malloc(void *value) {
    (void)value;
    void *p = opaque(malloc(100));
    memset(p, 3, 100);
    free(p);
}

static void case_child_exit_heap(void) {
    free(opaque(malloc(16))); /* coralloc's key first */
    CHECK_EQ(pthread_key_create(&child_late_key, child_late_malloc), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        pthread_setspecific(child_late_key, &child_late_key);
        pthread_exit(NULL); /* the child's only thread: the process ends, status 0 */
    }
    expect_exit_0(pid, "child_exit_heap");
}

/* User heaps left undestroyed at their thread's exit are parked until that
 * thread's kernel id is gone, then reused. The reaper looked at the first
 * four parked heaps only: four whose thread is still alive (a later key
 * destructor that blocks; or a new thread that got the dead one's id)
 * stopped it for good, and every heap parked after them was never reused
 * (each new user heap took a new struct). */
static pthread_key_t stuck_key;
static pthread_mutex_t stuck_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stuck_cond = PTHREAD_COND_INITIALIZER;
static int stuck_waiting;
static bool stuck_release;

static void stuck_destructor(void *value) {
    /* A thread with user heaps runs coralloc's cleanup in the second round
     * of destructors: this one blocks in that round, after it. */
    if (value != &stuck_key) {
        pthread_setspecific(stuck_key, &stuck_key);
        return;
    }
    pthread_mutex_lock(&stuck_lock);
    stuck_waiting++;
    pthread_cond_broadcast(&stuck_cond);
    while (!stuck_release) pthread_cond_wait(&stuck_cond, &stuck_lock);
    pthread_mutex_unlock(&stuck_lock);
}

static void *park_heap_and_stick(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    free(coral_heap_malloc(heap, 32));
    pthread_setspecific(stuck_key, heap); /* its destructor blocks after the heap is parked */
    return NULL;
}

static void *park_heap(void *arg) {
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    free(coral_heap_malloc(heap, 32));
    *(coral_heap_t **)arg = heap;
    return NULL; /* exits with the heap undestroyed */
}

static void case_parked_heaps_reaped(void) {
    free(opaque(malloc(16))); /* coralloc's key first */
    CHECK_EQ(pthread_key_create(&stuck_key, stuck_destructor), 0);
    pthread_t stuck[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(pthread_create(&stuck[i], NULL, park_heap_and_stick, NULL), 0);
    pthread_mutex_lock(&stuck_lock);
    while (stuck_waiting < 4) pthread_cond_wait(&stuck_cond, &stuck_lock);
    pthread_mutex_unlock(&stuck_lock);
    enum { ROUNDS = 64 };
    coral_heap_t *seen[ROUNDS];
    int distinct = 0;
    for (int i = 0; i < ROUNDS; i++) {
        coral_heap_t *heap = NULL;
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, park_heap, &heap), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        bool known = false;
        for (int j = 0; j < distinct; j++) known |= seen[j] == heap;
        if (!known) seen[distinct++] = heap;
    }
    pthread_mutex_lock(&stuck_lock);
    stuck_release = true;
    pthread_cond_broadcast(&stuck_cond);
    pthread_mutex_unlock(&stuck_lock);
    for (int i = 0; i < 4; i++) CHECK_EQ(pthread_join(stuck[i], NULL), 0);
    printf("parked_heaps_reaped: %d distinct user heap structs in %d rounds\n", distinct, ROUNDS);
    CHECK_MSG(distinct < 16, "%d of %d user heaps took a new struct: parked ones never reused",
              distinct, ROUNDS);
}

/* A thread forks in a key destructor that runs after coralloc's exit
 * cleanup parked its user heap; in the child, that same thread (with a new
 * kernel id) destroys the heap, as its own thread may. The parked heap
 * kept the parent's id: the child's destroy stopped with "the heap belongs
 * to another thread" (and the child's reaper took the heap's thread for
 * gone, free to reuse its struct). */
static pthread_key_t fork_late_key;
static int fork_late_status = -1;

static __thread bool fork_late_rearmed;

static void fork_then_destroy(void *value) {
    coral_heap_t *heap = value;
    /* A thread with user heaps runs coralloc's cleanup in the second round
     * of destructors: this one forks in that round, after it. */
    if (!fork_late_rearmed) {
        fork_late_rearmed = true;
        pthread_setspecific(fork_late_key, heap);
        return;
    }
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        coral_heap_destroy(heap);
        _exit(0);
    }
    fork_late_status = wait_or_kill(pid, 30);
    coral_heap_destroy(heap);
}

static void *heap_then_fork_at_exit(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    memset(coral_heap_malloc(heap, 64), 5, 64);
    pthread_setspecific(fork_late_key, heap);
    return NULL;
}

/* Makes *key (with destructor) after coralloc's key, so that its
 * destructor runs after coralloc's in a round, then runs fn in a thread
 * to its end. */
static void late_key_thread(pthread_key_t *key, void (*destructor)(void *), void *(*fn)(void *)) {
    free(opaque(malloc(16))); /* coralloc's key first */
    CHECK_EQ(pthread_key_create(key, destructor), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, fn, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
}

static void case_child_destroys_parked(void) {
    late_key_thread(&fork_late_key, fork_then_destroy, heap_then_fork_at_exit);
    CHECK_MSG(
        fork_late_status != -1 && WIFEXITED(fork_late_status) && WEXITSTATUS(fork_late_status) == 0,
        "the child's destroy of its thread's parked heap failed (status 0x%x)", fork_late_status);
}

/* ---- the process's end by the purge thread (no program thread left) -------------------
 * When every program thread has ended with pthread_exit, coralloc's purge
 * thread calls exit(0), as glibc would have in the last thread: the
 * program's atexit handlers and static destructors then run on the purge
 * thread, and should run as they would have on a program thread. */

static int exit_report = -1; /* the write end of a pipe to the parent */

/* fork, with a pipe from the child (its write end: exit_report) to the
 * parent (*from_child, its read end). */
static pid_t fork_reporting(int *from_child) {
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        exit_report = fds[1];
        return 0;
    }
    close(fds[1]);
    *from_child = fds[0];
    return pid;
}

/* The child: the purge thread runs, `handler` is registered with atexit,
 * main ends with pthread_exit. The parent gets status 0 and what the
 * handler wrote (up to size - 1 bytes, NUL-terminated). */
static void end_by_purge_thread(void (*handler)(void), char *got, size_t size) {
    int from_child;
    pid_t pid = fork_reporting(&from_child);
    if (pid == 0) {
        start_purge_thread();
        CHECK_MSG(task_count() == 2, "%d threads: the purge thread did not start", task_count());
        CHECK_EQ(atexit(handler), 0);
        pthread_exit(NULL);
    }
    size_t n = 0;
    for (ssize_t r; n + 1 < size && (r = read(from_child, got + n, size - 1 - n)) > 0;)
        n += (size_t)r;
    got[n] = 0;
    close(from_child);
    expect_exit_0(pid, "end_by_purge_thread");
}

/* An atexit handler that needs 256 KiB of stack (a program thread has
 * 8 MiB): the purge thread had 64 KiB, and the handler overflowed it
 * (SIGSEGV instead of status 0). */
static __attribute__((noinline)) void deep_handler(void) {
    volatile char buf[256 * 1024];
    for (size_t i = 0; i < sizeof buf; i += 256) buf[i] = (char)(i >> 8);
    char ok = buf[sizeof buf - 256] == (char)((sizeof buf - 256) >> 8) ? 'y' : 'n';
    CHECK_EQ(write(exit_report, &ok, 1), 1);
}

static void case_atexit_stack(void) {
    char got[8];
    end_by_purge_thread(deep_handler, got, sizeof got);
    CHECK_MSG(strcmp(got, "y") == 0, "the atexit handler wrote \"%s\"", got);
}

/* An atexit handler runs with the program's signal mask (here: none
 * blocked), not the purge thread's (every signal blocked): a handler that
 * waits for a signal (a child's SIGCHLD, an alarm) would wait forever. */
static void mask_handler(void) {
    sigset_t now;
    CHECK_EQ(pthread_sigmask(SIG_BLOCK, NULL, &now), 0);
    char c = sigismember(&now, SIGCHLD) || sigismember(&now, SIGALRM) ? 'b' : 'u';
    CHECK_EQ(write(exit_report, &c, 1), 1);
}

static void case_atexit_signals(void) {
    char got[8];
    end_by_purge_thread(mask_handler, got, sizeof got);
    CHECK_MSG(strcmp(got, "u") == 0, "the atexit handler ran with SIGCHLD/SIGALRM blocked (\"%s\")",
              got);
}

/* While a program thread runs, the purge thread must never end the
 * process. Its look at /proc/self/task took a task whose stat it could not
 * open for an ended one: with the process's file descriptors all in use
 * but one (a server at its limit), it found every other thread "ended"
 * and called exit(0) under the running main thread. */
static void *allocate_and_exit(void *arg) {
    (void)arg;
    free(opaque(malloc(64))); /* its exit tells the purge thread to look */
    return NULL;
}

static void case_exit_watch_fd_limit(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        start_purge_thread();
        struct rlimit lim;
        CHECK_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
        lim.rlim_cur = 64;
        CHECK_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
        int last = -1;
        for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) last = fd;
        CHECK(last >= 0 && errno == EMFILE);
        close(last); /* one left: the purge thread opens /proc/self/task */
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, allocate_and_exit, NULL), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        /* Two whole passes: after each, the purge thread looks (it is
         * watching since the thread's exit). */
        CHECK_EQ(coral_test_purge_pass(), 1);
        CHECK_EQ(coral_test_purge_pass(), 1);
        _exit(7); /* main's own status: the purge thread never ended the process */
    }
    int status = wait_or_kill(pid, 30);
    CHECK_MSG(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 7,
              "the process ended with status 0x%x while its main thread ran (expected exit 7)",
              status);
}

/* A user heap destroyed by a key destructor that runs after coralloc's
 * (same round): its pages go back at once, as on any destroy, instead of
 * being abandoned with the thread and kept by blocks nobody will free. */
enum { FILL_BLOCKS = 20000, FILL_SIZE = 64 };

static void *heap_filled_then_dropped(void *arg) {
    (void)arg;
    coral_heap_t *heap = coral_heap_new();
    CHECK(heap != NULL);
    for (int i = 0; i < FILL_BLOCKS; i++) memset(coral_heap_malloc(heap, FILL_SIZE), i, FILL_SIZE);
    pthread_setspecific(late_key, heap);
    return NULL;
}

static void case_heap_freed_late(void) {
    free(opaque(malloc(16))); /* coralloc's key first */
    CHECK_EQ(pthread_key_create(&late_key, late_destroy), 0);
    long long before = stats_get("page_bytes");
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, heap_filled_then_dropped, NULL), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    long long grown = stats_get("page_bytes") - before;
    CHECK_MSG(grown < (long long)FILL_BLOCKS * FILL_SIZE,
              "a heap destroyed after its thread's other destructors still holds %lld KiB of pages",
              grown >> 10);
}

/* A thread that never allocated makes its first user heap in a key
 * destructor's third round (the key set itself again, as glibc allows for
 * PTHREAD_DESTRUCTOR_ITERATIONS = 4 rounds) and destroys it in the fourth.
 * coralloc's destructor then first runs in the fourth round, the last: a
 * cleanup put off to a next round never ran, and the thread's own heap was
 * never abandoned (the threads gauge stayed one up per thread). */
static pthread_key_t last_rounds_key;
static __thread int last_rounds_seen;

static void last_rounds_destructor(void *value) {
    if (++last_rounds_seen == 4) {
        coral_heap_destroy(value);
        return;
    }
    if (last_rounds_seen == 3) {
        coral_heap_t *heap = coral_heap_new();
        CHECK(heap != NULL);
        memset(coral_heap_malloc(heap, 64), 4, 64);
        value = heap;
    }
    pthread_setspecific(last_rounds_key, value);
}

static void *set_round_key(void *key) {
    pthread_setspecific(*(pthread_key_t *)key, key); /* allocates nothing */
    return NULL;
}

/* 50 threads in a row whose only allocations are in destructor of *key
 * (made after coralloc's key, so visited after it in a round; value:
 * key): how many the threads gauge kept. */
static long long round_threads_left(pthread_key_t *key, void (*destructor)(void *)) {
    free(opaque(malloc(16))); /* coralloc's key first: its destructor runs first in a round */
    CHECK_EQ(pthread_key_create(key, destructor), 0);
    long long before = stats_get("threads");
    for (int i = 0; i < 50; i++) {
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, set_round_key, key), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
    }
    return stats_get("threads") - before;
}

static void case_heap_made_in_last_rounds(void) {
    long long left = round_threads_left(&last_rounds_key, last_rounds_destructor);
    CHECK_MSG(left == 0,
              "%lld of 50 threads whose heaps came in their third key destructor round "
              "were never cleaned up",
              left);
}

/* A thread that never allocated allocates first in its fourth (last) key
 * destructor round, from a key made after coralloc's (so visited after
 * it in the round): coralloc's key is set after its turn, its destructor
 * never runs, and the thread's
 * heap was never abandoned (threads gauge one up per thread, 64 KiB of
 * pages each). Now the next thread that gets its thread id (glibc gives a
 * new thread the joined one's stack) finishes that cleanup: of 50 such
 * threads in a row, at most the last is left. */
static pthread_key_t first_last_key;
static __thread int first_last_seen;

static void first_in_last_round(void *value) {
    if (++first_last_seen == 4) {
        memset(opaque(malloc(100)), 8, 100); /* the thread's first allocation */
        return;
    }
    pthread_setspecific(first_last_key, value);
}

static void case_first_alloc_in_last_round(void) {
    long long left = round_threads_left(&first_last_key, first_in_last_round);
    CHECK_MSG(left <= 1,
              "%lld of 50 threads that first allocated in their last key destructor "
              "round were never cleaned up",
              left);
}

/* The purge thread is started by a thread past coralloc's exit cleanup
 * (a later key destructor frees 4 MiB), after main ended with
 * pthread_exit: that thread's exit notice, given before the purge thread
 * ran, was dropped, so when the thread ended, no program thread was left
 * and nothing ended the process. */
static pthread_key_t started_late_key;

static void free_big(void *value) { free(value); }

static void *set_big_and_return(void *arg) {
    (void)arg;
    char *big = opaque(malloc((size_t)4 << 20));
    memset(big, 5, (size_t)4 << 20);
    pthread_setspecific(started_late_key, big);
    return NULL;
}

static void case_purger_started_after_exit(void) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        free(opaque(malloc(16))); /* coralloc's key first: its cleanup runs first */
        CHECK_EQ(pthread_key_create(&started_late_key, free_big), 0);
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, set_big_and_return, NULL), 0);
        pthread_exit(NULL);
    }
    expect_exit_0(pid, "purger_started_after_exit");
}

/* A thread forks from a key destructor after coralloc's exit cleanup; the
 * child (whose only thread it is) frees 4 MiB, which starts the child's
 * purge thread, and returns from the destructor: the thread ends, and
 * with it the child (its notice was the parent's purge thread's only). */
static pthread_key_t fork_late_key;

static void fork_and_free_big(void *value) {
    (void)value;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char *big = opaque(malloc((size_t)4 << 20));
        memset(big, 6, (size_t)4 << 20);
        free(big);
        free(opaque(malloc(64))); /* a safe point: the purge thread starts */
        CHECK_MSG(task_count() == 2, "%d threads: the child's purge thread did not start",
                  task_count());
        return; /* the thread's exit goes on: the child's last program thread ends */
    }
    expect_exit_0(pid, "child_forked_after_exit (the child)");
}

static void *set_fork_late_and_return(void *arg) {
    (void)arg;
    free(opaque(malloc(32)));
    pthread_setspecific(fork_late_key, &fork_late_key);
    return NULL;
}

static void case_child_forked_after_exit(void) {
    /* (The key of case_child_destroys_parked, another destructor.) */
    late_key_thread(&fork_late_key, fork_and_free_big, set_fork_late_and_return);
}

/* A thread's first user heap has glibc register a TLS destructor (a
 * calloc of 32 bytes, through coralloc), and glibc ends the process when
 * that calloc fails. With the kernel refusing the page it needs,
 * coral_heap_new ended the process ("Fatal glibc error: failed to
 * register TLS destructor: out of memory", SIGABRT) instead of working or
 * failing cleanly. A new thread of a fork child (each the same) takes
 * 32-byte blocks up to the point where the next one needs a kernel call
 * (a new segment): one child counts how many (its next malloc fails with
 * CORALLOC_FAIL_OS_AFTER=1), the next takes that many and then makes its
 * first user heap with the next kernel call failing. */
enum { OOM_SIZE = 32 };
static long long oom_fill = -1; /* -1: count them */

static void *oom_thread(void *arg) {
    /* No prefaulting (its calls' failures are harmless): the next kernel
     * call is the mapping of a segment. */
    CHECK_EQ(coral_option_set("POPULATE", 0), 0);
    (void)opaque(malloc(64)); /* the thread's heap, and a page of 64-byte blocks */
    long long n = 0;
    if (oom_fill < 0) {
        CHECK_EQ(coral_option_set("FAIL_OS_AFTER", 1), 0);
        while (opaque(malloc(OOM_SIZE)) != NULL) n++;
    } else {
        for (; n < oom_fill; n++) CHECK(opaque(malloc(OOM_SIZE)) != NULL);
        CHECK_EQ(coral_option_set("FAIL_OS_AFTER", 1), 0);
        coral_heap_t *heap = coral_heap_new();
        CHECK_EQ(coral_option_set("FAIL_OS_AFTER", 0), 0);
        CHECK_MSG(heap != NULL, "coral_heap_new failed (the kernel refused one call)");
        CHECK_MSG(stats_get("os_failures_injected") == 1,
                  "coral_heap_new made no kernel call (no TLS destructor registered)");
        memset(coral_heap_malloc(heap, 64), 7, 64);
        coral_heap_destroy(heap);
    }
    *(long long *)arg = n;
    return NULL;
}

/* In a fork child: oom_thread, run to its end. Returns its count (the
 * child's exit status must be 0), through a pipe. */
static long long oom_child(long long fill) {
    int from_child;
    pid_t pid = fork_reporting(&from_child);
    if (pid == 0) {
        oom_fill = fill;
        long long n = -1;
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, oom_thread, &n), 0);
        CHECK_EQ(pthread_join(t, NULL), 0);
        CHECK_EQ(write(exit_report, &n, sizeof n), (ssize_t)sizeof n);
        _exit(0);
    }
    long long n = -1;
    ssize_t got = read(from_child, &n, sizeof n);
    close(from_child);
    int status = wait_or_kill(pid, 30);
    CHECK_MSG(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status 0x%x%s",
              fill < 0 ? "counting the blocks" : "coral_heap_new", status,
              WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT ? " (SIGABRT)" : "");
    CHECK_EQ(got, (ssize_t)sizeof n);
    return n;
}

static void case_heap_new_out_of_memory(void) {
    coral_heap_destroy(coral_heap_new()); /* a free heap struct: no kernel call for one */
    long long fill = oom_child(-1);
    CHECK_EQ(oom_child(fill), fill);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_lifetime CASE\n");
        return 2;
    }
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {
        {"main_pthread_exit", case_main_pthread_exit},
        {"child_thread_return", case_child_thread_return},
        {"key_destructor_rounds", case_key_destructor_rounds},
        {"heap_after_exit", case_heap_after_exit},
        {"heap_destroyed_late", case_heap_destroyed_late},
        {"heap_freed_late", case_heap_freed_late},
        {"heap_made_in_last_rounds", case_heap_made_in_last_rounds},
        {"purger_started_after_exit", case_purger_started_after_exit},
        {"child_forked_after_exit", case_child_forked_after_exit},
        {"child_exit_heap", case_child_exit_heap},
        {"parked_heaps_reaped", case_parked_heaps_reaped},
        {"child_destroys_parked", case_child_destroys_parked},
        {"atexit_stack", case_atexit_stack},
        {"atexit_signals", case_atexit_signals},
        {"exit_watch_fd_limit", case_exit_watch_fd_limit},
        {"heap_new_out_of_memory", case_heap_new_out_of_memory},
        {"first_alloc_in_last_round", case_first_alloc_in_last_round},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(argv[1], cases[i].name) == 0) {
            cases[i].run();
            printf("%s: passed\n", argv[1]);
            return 0;
        }
    fprintf(stderr, "test_lifetime: no case %s\n", argv[1]);
    return 2;
}
