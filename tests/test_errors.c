/* Bad input and out-of-memory: each scenario runs in a child process (the
 * test runs itself with the scenario's name, and options in the
 * environment, since coralloc reads them at start-up) and the parent checks
 * how the child ended and what it printed:
 *   double-free / double-free-bulk / bulk-dup-pointer / double-free-huge /
 *   double-free-remote-between (another thread's frees of p, q, p) /
 *   double-free-cached / free-of-cached (blocks in the bulk cache) /
 *   double-free-orphan / bulk-released-remote / invalid-pointer /
 *   free-interior-remote (another thread's free inside a block): abort with
 *   a message;
 *   bad-option: one clear line naming the variable, then a normal run;
 *   fail-os: the first OS mapping fails -> NULL with ENOMEM, the next works,
 *   and the statistics count that one injected failure;
 *   rlimit: under RLIMIT_AS, a large request fails cleanly and the allocator
 *   stays usable (release build only: sanitizers reserve terabytes). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "stats_json.h"
#include "testutil.h"

static int child_double_free(void) {
    void *keep = coral_malloc(32); /* so the page is not the page's last block */
    void *p = opaque(coral_malloc(32));
    coral_free(p);
    coral_free(p);
    coral_free(keep);
    return 0; /* not reached */
}

/* Another thread frees p, then q, then p again: the second push of p
 * finds its own mark (page.c, "Remote marks"), so the owner walks the list
 * when it takes it and finds the cycle. Without the mark the list would be
 * taken unwalked and p, q handed out over and over. */
static void *free_p_q_p(void *arg) {
    void **pq = arg;
    coral_free(pq[0]);
    coral_free(pq[1]);
    coral_free(pq[0]);
    return NULL;
}

static int child_double_free_remote_between(void) {
    void *keep = coral_malloc(64); /* so the page keeps a block in use */
    void *pq[2] = {opaque(coral_malloc(64)), coral_malloc(64)};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_p_q_p, pq), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    coral_collect(0); /* the owner takes the list */
    coral_free(keep);
    return 0; /* not reached */
}

/* Another thread frees a pointer 16 bytes into a block of a full page: the
 * page's state sends the free down the full remote path, which finds that
 * it is not a block's start (page.c, coral_page_freed_block) instead of
 * pushing it, after which the owner would hand out a block overlapping two. */
static void *free_inside(void *p) {
    coral_free((char *)p + 16);
    return NULL;
}

static int child_free_interior_remote(void) {
    char *first = coral_malloc(64);
    /* Until a block comes from another 64 KiB slice: the first page is full. */
    for (char *q = first; ((uintptr_t)q >> 16) == ((uintptr_t)first >> 16);) q = coral_malloc(64);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, free_inside, opaque(first)), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    return 0; /* not reached */
}

/* The same array freed twice in bulk: more blocks than the page has in use. */
static int child_double_free_bulk(void) {
    enum { N = 20 };
    void *p[N];
    CHECK_EQ(coral_malloc_bulk(32, N, p), N);
    coral_free_bulk(opaque(p), N);
    coral_free_bulk(opaque(p), N);
    return 0; /* not reached */
}

/* One block twice in a row in one array. */
static int child_double_free_bulk_pair(void) {
    void *keep = coral_malloc(32); /* so the page keeps a block in use */
    void *p[2];
    p[0] = p[1] = coral_malloc(32);
    coral_free_bulk(opaque(p), 2);
    coral_free(keep);
    return 0; /* not reached */
}

/* A block free() just freed, given to coral_free_bulk: free() pushed it
 * on its page's free list, the bulk free's chain starts with it. */
static int child_free_then_bulk(void) {
    void *keep = coral_malloc(32); /* so the page keeps a block in use */
    void *p = coral_malloc(32);
    coral_free(p);
    coral_free_bulk(opaque(&p), 1);
    coral_free(keep);
    return 0; /* not reached */
}

/* Blocks in the thread's bulk cache (src/stash.h): a shuffled array of
 * blocks of a class coral_malloc_bulk asked for, freed in bulk. */
enum { CACHED = 64, CACHED_SIZE = 1700 };
static void *cached[CACHED];

static void fill_bulk_cache(void) {
    CHECK_EQ(coral_malloc_bulk(CACHED_SIZE, CACHED, cached), CACHED);
    coral_free_bulk(opaque(cached), CACHED);                          /* makes the cache */
    CHECK_EQ(coral_malloc_bulk(CACHED_SIZE, CACHED, cached), CACHED); /* asks for the class */
    tu_rng rng = {1}; /* shuffled over the blocks' 2-3 slices: no stretch of one slice */
    for (size_t i = CACHED - 1; i > 0; i--) {
        size_t j = rng_range(&rng, 0, i);
        void *t = cached[i];
        cached[i] = cached[j];
        cached[j] = t;
    }
    coral_free_bulk(opaque(cached), CACHED);
}

/* A cached block given to coral_free_bulk again. */
static int child_double_free_cached(void) {
    fill_bulk_cache();
    void *again[1] = {cached[CACHED / 2]};
    coral_free_bulk(opaque(again), 1);
    return 0; /* not reached */
}

/* A cached block freed with free(): seen when the cache gives it out. */
static int child_free_of_cached(void) {
    fill_bulk_cache();
    coral_free(opaque(cached[CACHED / 2]));
    CHECK_EQ(coral_malloc_bulk(CACHED_SIZE, CACHED, cached), CACHED);
    return 0; /* not reached */
}

static int child_double_free_huge(void) {
    void *p = opaque(coral_malloc(10u << 20));
    coral_free(p);
    coral_free(p);
    return 0;
}

/* A page whose blocks another thread freed, all of them, is reclaimed
 * (src/reclaim.c) while its owner idles; freeing one of them again must be
 * caught, not corrupt the reclaimed page. */
enum { PAGE_OF_1K = 64 }; /* 1 KiB blocks in one 64 KiB page */
static void *page_of_1k[PAGE_OF_1K];
static int ready_pipe[2], idle_pipe[2];

/* Run prepare on a new thread that then idles for good (its segments stay
 * owned), and wait until prepare is done. */
static void (*owner_prepare)(void);

static void *idling_thread(void *arg) {
    (void)arg;
    owner_prepare();
    char c = 1;
    CHECK_EQ(write(ready_pipe[1], &c, 1), 1);
    CHECK_EQ(read(idle_pipe[0], &c, 1), 1); /* idles here forever */
    return NULL;
}

static void start_idle_owner(void (*prepare)(void)) {
    CHECK_EQ(pipe(ready_pipe), 0);
    CHECK_EQ(pipe(idle_pipe), 0);
    pthread_t owner;
    owner_prepare = prepare;
    CHECK_EQ(pthread_create(&owner, NULL, idling_thread, NULL), 0);
    char c;
    CHECK_EQ(read(ready_pipe[0], &c, 1), 1);
}

static void fill_page_of_1k(void) {
    for (size_t i = 0; i < PAGE_OF_1K; i++) page_of_1k[i] = coral_malloc(1024);
}

static int child_double_free_reclaimed(void) {
    start_idle_owner(fill_page_of_1k);
    for (size_t i = 0; i < PAGE_OF_1K; i++) coral_free(page_of_1k[i]);
    coral_collect(1); /* reclaims the page now */
    coral_free(page_of_1k[7]);
    return 0; /* not reached */
}

/* coral_free_bulk of a block of another thread's page that its owner has
 * freed and released already: reported as the ordinary free would, not
 * pushed onto the released span's list. The owner fills six pages of
 * 1 KiB blocks and frees them all: the pages behind the front 256 KiB of
 * the class queue (which the heap keeps) go back to the segment
 * (malloc_usable_size then says 0). */
enum { SIX_PAGES_OF_1K = 6 * PAGE_OF_1K };
static void *released_blocks[SIX_PAGES_OF_1K];

static void fill_and_free_three_pages(void) {
    for (size_t i = 0; i < SIX_PAGES_OF_1K; i++) released_blocks[i] = coral_malloc(1024);
    for (size_t i = 0; i < SIX_PAGES_OF_1K; i++) coral_free(released_blocks[i]);
}

static int child_bulk_free_released_remote(void) {
    start_idle_owner(fill_and_free_three_pages);
    void *released = NULL;
    for (size_t i = 0; i < SIX_PAGES_OF_1K && released == NULL; i++)
        if (coral_malloc_usable_size(released_blocks[i]) == 0) released = released_blocks[i];
    CHECK_NOT_NULL(released);
    void *one[1] = {released};
    coral_free_bulk(opaque(one), 1);
    return 0; /* not reached */
}

static int child_invalid_pointer(void) {
    int on_stack;
    coral_free(opaque(&on_stack));
    return 0;
}

static int child_bad_option(void) {
    void *p = coral_malloc(100);
    CHECK_NOT_NULL(p);
    coral_free(p);
    return 0;
}

static int child_fail_os(void) {
    errno = 0;
    void *p = coral_malloc(64); /* the first mapping (the thread's heap) fails */
    CHECK_NULL(p);
    CHECK_EQ(errno, ENOMEM);
    /* ... because the injection failed it (and nothing else did). */
    CHECK_EQ(stats_get("os_failures_injected"), 1);
    p = coral_malloc(64);
    CHECK_NOT_NULL(p);
    memset(p, 1, 64);
    coral_free(p);
    CHECK_EQ(stats_get("os_failures_injected"), 1); /* the first call only */
    return 0;
}

static __attribute__((unused)) int child_rlimit(void) {
    void *warm = coral_malloc(64); /* set the thread up before the limit */
    CHECK_NOT_NULL(warm);
    struct rlimit lim = {(rlim_t)1 << 30, (rlim_t)1 << 30}; /* 1 GiB of address space */
    CHECK_EQ(setrlimit(RLIMIT_AS, &lim), 0);
    errno = 0;
    void *big = coral_malloc((size_t)2 << 30);
    CHECK_NULL(big);
    CHECK_EQ(errno, ENOMEM);
    /* Fill what is left with 1 MiB blocks until the kernel says no. */
    enum { MAX = 2048 };
    static void *blocks[MAX];
    size_t n = 0;
    errno = 0;
    while (n < MAX && (blocks[n] = coral_malloc(1u << 20)) != NULL) memset(blocks[n++], 7, 64);
    CHECK_LT(n, MAX);
    CHECK_EQ(errno, ENOMEM);
    for (size_t i = 0; i < n; i++) coral_free(blocks[i]);
    coral_collect(1);
    /* Consistent afterwards: memory can be had again. */
    for (size_t i = 0; i < n / 2; i++) {
        blocks[i] = coral_malloc(1u << 20);
        CHECK_NOT_NULL(blocks[i]);
    }
    for (size_t i = 0; i < n / 2; i++) coral_free(blocks[i]);
    coral_free(warm);
    return 0;
}

typedef struct {
    const char *name;
    int (*run)(void);
    const char *env; /* NAME=value for the child, or NULL */
    int signal;      /* expected terminating signal, 0 for a normal exit */
    const char *stderr_has;
} scenario_t;

static const scenario_t scenarios[] = {
    {"double-free", child_double_free, NULL, SIGABRT, "double free"},
    {"double-free-bulk", child_double_free_bulk, NULL, SIGABRT, "double free"},
    {"bulk-dup-pointer", child_double_free_bulk_pair, NULL, SIGABRT, "double free"},
    {"free-then-bulk", child_free_then_bulk, NULL, SIGABRT, "double free"},
    {"double-free-remote-between", child_double_free_remote_between, NULL, SIGABRT, "double free"},
    {"double-free-huge", child_double_free_huge, NULL, SIGABRT, "double free"},
    {"double-free-cached", child_double_free_cached, NULL, SIGABRT,
     "double free detected: coral_free_bulk was given"},
    {"free-of-cached", child_free_of_cached, NULL, SIGABRT,
     "double free or write after free detected"},
    {"double-free-orphan", child_double_free_reclaimed, NULL, SIGABRT, "double free"},
    {"bulk-released-remote", child_bulk_free_released_remote, NULL, SIGABRT, "invalid pointer"},
    {"invalid-pointer", child_invalid_pointer, NULL, SIGABRT, "invalid pointer"},
    {"free-interior-remote", child_free_interior_remote, NULL, SIGABRT, "not its start"},
    {"bad-option", child_bad_option, "CORALLOC_PURGE_DELAY_MS=soon", 0,
     "CORALLOC_PURGE_DELAY_MS=soon is not valid"},
    {"bad-bool", child_bad_option, "CORALLOC_VERBOSE=maybe", 0,
     "CORALLOC_VERBOSE=maybe is not valid"},
    {"fail-os", child_fail_os, "CORALLOC_FAIL_OS_AFTER=1", 0, NULL},
#ifdef CORAL_TEST_RELEASE
    {"rlimit", child_rlimit, NULL, 0, NULL},
#endif
};

static void run_scenario(const char *self, const scenario_t *s) {
    int err[2];
    CHECK_EQ(pipe(err), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        close(err[0]);
        if (s->env) putenv((char *)s->env);
        execl(self, self, s->name, (char *)NULL);
        _exit(127);
    }
    close(err[1]);
    char out[4096];
    size_t len = 0;
    ssize_t n;
    while ((n = read(err[0], out + len, sizeof out - 1 - len)) > 0) len += (size_t)n;
    out[len] = '\0';
    close(err[0]);
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    if (s->signal) {
        CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == s->signal,
                  "%s: expected signal %d, status 0x%x; stderr:\n%s\n", s->name, s->signal, status,
                  out);
    } else {
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "%s: expected a clean exit, status 0x%x; stderr:\n%s\n", s->name, status, out);
    }
    if (s->stderr_has)
        CHECK_MSG(strstr(out, s->stderr_has) != NULL, "%s: stderr lacks \"%s\":\n%s\n", s->name,
                  s->stderr_has, out);
    printf("%-18s ok\n", s->name);
}

int main(int argc, char **argv) {
    size_t count = sizeof scenarios / sizeof *scenarios;
    if (argc == 2) {
        for (size_t i = 0; i < count; i++)
            if (strcmp(argv[1], scenarios[i].name) == 0) return scenarios[i].run();
        return 2;
    }
    for (size_t i = 0; i < count; i++) run_scenario("/proc/self/exe", &scenarios[i]);
    return 0;
}
