/* Process and thread lifetime with coralloc serving malloc (libcoralloc.so,
 * the standard names): a process whose last thread ends with pthread_exit
 * ends (in a fork child too), a thread that allocates in every round of the
 * key destructors leaves nothing behind, and a user heap's handle stops at
 * its thread's exit. Run as `test_lifetime CASE`. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
