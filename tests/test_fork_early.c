/* Fork handlers registered before coralloc's, that allocate.
 *
 * A library the program links registers its pthread_atfork handlers from
 * its constructor, which the loader runs before an LD_PRELOADed coralloc's:
 * its prepare handler then runs after coralloc's (every allocator lock
 * held) and its parent and child handlers before coralloc's (still held).
 * Here a constructor of priority 101 registers them before coralloc's
 * (default priority, the same order), and each handler allocates and frees
 * blocks of every size range (small, medium, large, huge: the heap pool,
 * segment, segment cache and huge-list locks). The process has a second
 * thread, so the fork takes the locks. Each fork's child allocates again
 * and exits 0; before coralloc's handlers let the forking thread's own
 * allocations through, the first handler's malloc waited forever for a
 * lock its own thread held (the alarm ends it: a hang detector). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"

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

static void early_prepare(void) { allocate_each_size(); }
static void early_parent(void) { allocate_each_size(); }
static void early_child(void) { allocate_each_size(); }

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

int main(void) {
    alarm(30); /* (a hang detector for the parent's own handlers) */
    CHECK_EQ(pipe(idle_pipe), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, idle_thread, NULL), 0);
    coral_free(coral_malloc(100));
    for (int i = 0; i < FORKS; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            alarm(20);
            allocate_each_size();
            _exit(0);
        }
        int status = 0;
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "fork %d: child status 0x%x (SIGALRM: it hung)", i, status);
    }
    CHECK_EQ(write(idle_pipe[1], "x", 1), 1);
    CHECK_EQ(pthread_join(t, NULL), 0);
    puts("test_fork_early: ok");
    return 0;
}
