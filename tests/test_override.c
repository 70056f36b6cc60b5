/* test_override: the standard names, served by libcoralloc.so (release
 * build only; the test links the shared coralloc, which replaces malloc & co).
 *
 * Checks that every standard entry point is coralloc's (coral_owns on its
 * results, malloc_usable_size agreeing with coral_malloc_usable_size), that
 * blocks cross between the standard and the coral_ names, the key contract
 * through the standard names (alignment, errno on overflow, usable size,
 * realloc(p, 0)), pvalloc + malloc_usable_size + free, and that blocks glibc
 * allocates internally (strdup, getline, asprintf, fopen...) are coralloc's;
 * glibc's internal names (__libc_malloc & co.), cfree, the C23 sized frees,
 * mallopt, mallinfo and mallinfo2; that the first fork allocates nothing.
 * Built with -fno-builtin so that the compiler calls the functions.
 */
#define _GNU_SOURCE
#include "coralloc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static volatile size_t v_size_max = SIZE_MAX;

#define EXPECT_ERRNO_NULL(expr, err)                                                               \
    do {                                                                                           \
        errno = 0;                                                                                 \
        void *r_ = (expr);                                                                         \
        int e_ = errno;                                                                            \
        CHECK_MSG(r_ == NULL, "%s returned %p, not NULL\n", #expr, r_);                            \
        CHECK_MSG(e_ == (err), "%s: errno is %d (%s), not %s\n", #expr, e_, strerror(e_), #err);   \
    } while (0)

/* p came from coralloc: aligned, owned, usable size as coral_ says, writable.
 */
static size_t check_ours(void *p, size_t req, size_t align, const char *what) {
    CHECK_MSG(p != NULL, "%s (%zu bytes) returned NULL\n", what, req);
    p = opaque(p);
    CHECK_MSG(coral_owns(p),
              "%s: %p is not coralloc's: the standard name is "
              "not served by coralloc\n",
              what, p);
    CHECK_ALIGNED(p, align < 16 ? 16 : align);
    size_t us = malloc_usable_size(p);
    CHECK_MSG(us == coral_malloc_usable_size(p),
              "%s: malloc_usable_size %zu != coral_malloc_usable_size %zu\n", what, us,
              coral_malloc_usable_size(p));
    CHECK_MSG(us >= req, "%s: usable size %zu < %zu\n", what, us, req);
    fill_pattern(p, us, req);
    CHECK_PATTERN(p, us, req);
    return us;
}

static void test_entry_points(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    static const size_t sizes[] = {0, 1, 15, 16, 100, 4096, 70000, 700 * KiB, 3 * MiB, 20 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        void *p = malloc(n);
        check_ours(p, n, 16, "malloc");
        free(p);

        p = calloc(1, n);
        CHECK_NOT_NULL(p);
        CHECK_BYTES(p, n, 0);
        check_ours(p, n, 16, "calloc");
        free(p);

        p = realloc(NULL, n);
        check_ours(p, n, 16, "realloc(NULL)");
        p = realloc(p, n + 1000);
        check_ours(p, n + 1000, 16, "realloc");
        free(p);

        p = reallocarray(NULL, 1, n);
        check_ours(p, n, 16, "reallocarray");
        free(p);

        void *sentinel = &p;
        p = sentinel;
        CHECK_EQ(posix_memalign(&p, 256, n), 0);
        check_ours(p, n, 256, "posix_memalign");
        free(p);

        p = aligned_alloc(4096, n);
        check_ours(p, n, 4096, "aligned_alloc");
        free(p);

        p = memalign(64 * KiB, n);
        check_ours(p, n, 64 * KiB, "memalign");
        free(p);

        p = valloc(n ? n : 1);
        check_ours(p, n, page, "valloc");
        free(p);

        /* jemalloc 5.3.0 crashes here: pvalloc + malloc_usable_size + free */
        size_t want = n ? (n + page - 1) / page * page : page;
        p = pvalloc(n);
        size_t us = check_ours(p, want, page, "pvalloc");
        CHECK_GE(us, want);
        free(p);
    }

    /* Blocks cross between the two sets of names. */
    void *a = coral_malloc(100);
    CHECK_NOT_NULL(a);
    CHECK_EQ(malloc_usable_size(a), coral_malloc_usable_size(a));
    a = realloc(a, 5000);
    CHECK_NOT_NULL(a);
    free(a);
    void *b = malloc(100);
    CHECK_NOT_NULL(b);
    b = coral_realloc(b, 5000);
    CHECK_NOT_NULL(b);
    coral_free(b);
    CHECK_EQ(malloc_usable_size(NULL), 0);
    free(NULL);
}

static void test_contract(void) {
    size_t max = v_size_max, half = max / 2 + 1, big = (size_t)1 << 40;

    /* alignment of everything malloc gives */
    for (size_t n = 0; n <= 2048; n++) {
        void *p = opaque(malloc(n));
        CHECK_NOT_NULL(p);
        CHECK_ALIGNED(p, 16);
        free(p);
    }
    /* every power-of-two alignment */
    for (size_t al = sizeof(void *); al <= 16 * MiB; al <<= 1) {
        void *p = NULL;
        CHECK_EQ(posix_memalign(&p, al, al + 1), 0);
        check_ours(p, al + 1, al, "posix_memalign");
        free(p);
        p = aligned_alloc(al, 3 * al);
        check_ours(p, 3 * al, al, "aligned_alloc");
        free(p);
    }
    /* bad alignments */
    void *sentinel = &sentinel, *out = sentinel;
    CHECK_EQ(posix_memalign(&out, 24, 64), EINVAL);
    CHECK(out == sentinel);
    CHECK_EQ(posix_memalign(&out, 0, 64), EINVAL);
    CHECK(out == sentinel);
    CHECK_EQ(posix_memalign(&out, 4, 64), EINVAL);
    CHECK(out == sentinel);
    size_t bad[] = {0, 3, 24};
    for (int i = 0; i < 3; i++) {
        EXPECT_ERRNO_NULL(aligned_alloc(bad[i], 64), EINVAL);
        EXPECT_ERRNO_NULL(memalign(bad[i], 64), EINVAL);
    }

    /* overflow: NULL and ENOMEM */
    EXPECT_ERRNO_NULL(malloc(max), ENOMEM);
    EXPECT_ERRNO_NULL(malloc((size_t)PTRDIFF_MAX + 1), ENOMEM);
    EXPECT_ERRNO_NULL(calloc(half, 2), ENOMEM);
    EXPECT_ERRNO_NULL(calloc(big, big), ENOMEM);
    EXPECT_ERRNO_NULL(reallocarray(NULL, half, 2), ENOMEM);
    EXPECT_ERRNO_NULL(aligned_alloc(64, max), ENOMEM);
    EXPECT_ERRNO_NULL(memalign(64, max), ENOMEM);
    EXPECT_ERRNO_NULL(valloc(max), ENOMEM);
    EXPECT_ERRNO_NULL(pvalloc(max), ENOMEM);
    CHECK_EQ(posix_memalign(&out, 64, max), ENOMEM);
    CHECK(out == sentinel);

    /* a failed realloc keeps the block */
    char *p = malloc(1000);
    size_t us = check_ours(p, 1000, 16, "malloc");
    EXPECT_ERRNO_NULL(realloc(p, max), ENOMEM);
    EXPECT_ERRNO_NULL(reallocarray(p, half, 2), ENOMEM);
    CHECK_PATTERN(p, us, 1000);
    free(p);

    /* malloc(0) unique; realloc(p, 0) frees and returns NULL */
    void *z1 = opaque(malloc(0)), *z2 = opaque(malloc(0));
    CHECK_NOT_NULL(z1);
    CHECK_NOT_NULL(z2);
    CHECK(z1 != z2);
    free(z1);
    CHECK_NULL(realloc(z2, 0));
    p = malloc(3 * MiB);
    CHECK_NOT_NULL(p);
    CHECK_NULL(realloc(p, 0));

    /* realloc keeps content */
    p = malloc(10);
    fill_pattern(p, 10, 3);
    static const size_t steps[] = {100, 10000, 300 * KiB, 5 * MiB, 30 * MiB, 2 * MiB, 100, 7};
    size_t cur = 10;
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        p = realloc(p, steps[i]);
        CHECK_NOT_NULL(p);
        CHECK_PATTERN(p, cur < steps[i] ? cur : steps[i], 3 + i);
        fill_pattern(p, steps[i], 4 + i);
        cur = steps[i];
    }
    free(p);
}

static void test_glibc_internal(void) {
    char *s = strdup("coralloc strdup");
    CHECK_NOT_NULL(s);
    CHECK_MSG(coral_owns(s), "strdup's block is not coralloc's\n");
    CHECK(strcmp(s, "coralloc strdup") == 0);
    free(s);

    s = strndup("0123456789", 4);
    CHECK_NOT_NULL(s);
    CHECK(coral_owns(s));
    CHECK(strcmp(s, "0123") == 0);
    free(s);

    char *a = NULL;
    int n = asprintf(&a, "%s-%d-%0500d", "asprintf", 42, 7);
    CHECK_EQ(n, 8 + 1 + 2 + 1 + 500);
    CHECK_NOT_NULL(a);
    CHECK_MSG(coral_owns(a), "asprintf's block is not coralloc's\n");
    CHECK(strncmp(a, "asprintf-42-000", 15) == 0);
    free(a);

    /* getline: the buffer is malloc'ed and grown with realloc by glibc */
    char tmpl[] = "/tmp/coral_test_override_XXXXXX";
    int fd = mkstemp(tmpl);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w+");
    CHECK_NOT_NULL(f);
    for (int i = 0; i < 50; i++) {
        for (int j = 0; j < 40 * i; j++) fputc('a' + (i + j) % 26, f);
        fputc('\n', f);
    }
    rewind(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lines = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        CHECK_EQ((size_t)len, (size_t)40 * lines + 1);
        CHECK_MSG(coral_owns(line), "getline's buffer is not coralloc's\n");
        CHECK_GE(malloc_usable_size(line), cap);
        lines++;
    }
    CHECK_EQ(lines, 50);
    free(line);
    /* fopen allocates its FILE with malloc inside glibc */
    FILE *g = fopen(tmpl, "r");
    CHECK_NOT_NULL(g);
    CHECK_MSG(coral_owns(g), "fopen's FILE is not coralloc's\n");
    CHECK_EQ(fclose(g), 0);
    CHECK_EQ(fclose(f), 0);
    CHECK_EQ(unlink(tmpl), 0);

    char *rp = realpath("/tmp", NULL);
    CHECK_NOT_NULL(rp);
    CHECK(coral_owns(rp));
    free(rp);

    char *mbuf = NULL;
    size_t msize = 0;
    FILE *m = open_memstream(&mbuf, &msize);
    CHECK_NOT_NULL(m);
    for (int i = 0; i < 10000; i++) fprintf(m, "%d,", i);
    CHECK_EQ(fclose(m), 0);
    CHECK_NOT_NULL(mbuf);
    CHECK(coral_owns(mbuf));
    CHECK(strncmp(mbuf, "0,1,2,", 6) == 0);
    free(mbuf);
}

/* glibc's internal names and the other extras: not in the headers. */
void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
void *__libc_valloc(size_t);
void *__libc_pvalloc(size_t);
void __libc_free(void *);
int __posix_memalign(void **, size_t, size_t);
void cfree(void *);
void free_sized(void *, size_t);
void free_aligned_sized(void *, size_t, size_t);

static void *owned(void *p) {
    CHECK_NOT_NULL(p);
    CHECK_MSG(coral_owns(p), "block %p is not coralloc's\n", p);
    return p;
}

static void test_glibc_names(void) {
    char *p = owned(__libc_malloc(100));
    memset(p, 1, 100);
    p = owned(__libc_realloc(p, 5000));
    CHECK_EQ(p[99], 1);
    __libc_free(p);
    unsigned char *z = owned(__libc_calloc(10, 100));
    for (int i = 0; i < 1000; i++) CHECK_EQ(z[i], 0);
    cfree(z);
    void *a = owned(__libc_memalign(4096, 100));
    CHECK_EQ((uintptr_t)a % 4096, 0);
    free(a);
    a = owned(__libc_valloc(100));
    CHECK_EQ((uintptr_t)a % 4096, 0);
    free(a);
    a = owned(__libc_pvalloc(100));
    CHECK_EQ((uintptr_t)a % 4096, 0);
    CHECK_GE(malloc_usable_size(a), 4096);
    free(a);
    a = NULL;
    CHECK_EQ(__posix_memalign(&a, 256, 1000), 0);
    CHECK_EQ((uintptr_t)owned(a) % 256, 0);
    free(a);
}

/* mallinfo is deprecated in glibc's header, and still called by programs. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* mallopt answers as glibc's: glibc's tuning parameters with a value glibc
 * takes are taken (1), the values glibc refuses are refused (0); the two
 * that would change what the allocator does for the program (a check
 * action, a fill byte) and unknown parameters are refused. */
static void test_mallopt(void) {
    CHECK_EQ(mallopt(M_ARENA_MAX, 1), 1);
    CHECK_EQ(mallopt(M_ARENA_TEST, 8), 1);
    CHECK_EQ(mallopt(M_MMAP_THRESHOLD, 64 * 1024), 1);
    CHECK_EQ(mallopt(M_MMAP_THRESHOLD, 64 * 1024 * 1024), 0); /* above 32 MiB: glibc refuses */
    CHECK_EQ(mallopt(M_MMAP_THRESHOLD, -1), 0);
    CHECK_EQ(mallopt(M_MXFAST, 0), 1);
    CHECK_EQ(mallopt(M_MXFAST, 160), 1);
    CHECK_EQ(mallopt(M_MXFAST, 161), 0); /* above glibc's MAX_FAST_SIZE */
    CHECK_EQ(mallopt(M_TRIM_THRESHOLD, -1), 1);
    CHECK_EQ(mallopt(M_TOP_PAD, 64 * 1024), 1);
    CHECK_EQ(mallopt(M_MMAP_MAX, 0), 1);
    CHECK_EQ(mallopt(M_PERTURB, 0xa5), 0);
    CHECK_EQ(mallopt(M_CHECK_ACTION, 1), 0);
    CHECK_EQ(mallopt(12345, 1), 0);
    free(owned(malloc(100))); /* the allocator works on */
}

/* malloc_stats and the statistics table are not cancellation points, as
 * glibc's malloc_stats is not: a thread with a cancellation request
 * pending writes them whole and returns (before, the first fprintf acted
 * on it and the thread ended in the middle of the output). */
static pthread_barrier_t cancel_gate;
static volatile int stats_returned;

static void *stats_with_cancel_pending(void *arg) {
    pthread_barrier_wait(&cancel_gate); /* (not a cancellation point) */
    malloc_stats();
    coral_stats_print(NULL);
    stats_returned = 1;
    pthread_testcancel();
    return arg;
}

static void test_stats_not_cancellation_points(void) {
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    CHECK(saved >= 0 && null >= 0);
    CHECK(dup2(null, 2) == 2); /* (the output itself does not matter) */
    CHECK_EQ(pthread_barrier_init(&cancel_gate, NULL, 2), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, stats_with_cancel_pending, NULL), 0);
    CHECK_EQ(pthread_cancel(t), 0);
    pthread_barrier_wait(&cancel_gate);
    void *result = NULL;
    CHECK_EQ(pthread_join(t, &result), 0);
    dup2(saved, 2);
    close(saved);
    close(null);
    CHECK(result == PTHREAD_CANCELED);
    CHECK_MSG(stats_returned, "the statistics output acted on the pending cancellation");
}

static void test_extras(void) {
    void *p = owned(malloc(100));
    free_sized(p, 100);
    p = owned(aligned_alloc(64, 640));
    free_aligned_sized(p, 64, 640);
    test_mallopt();
    test_stats_not_cancellation_points();
    struct mallinfo2 before = mallinfo2();
    struct mallinfo old_before = mallinfo();
    void *huge = owned(malloc(8 * MiB));
    struct mallinfo2 during = mallinfo2();
    struct mallinfo old_during = mallinfo();
    CHECK_EQ(during.hblks, before.hblks + 1);
    CHECK_GE(during.hblkhd, before.hblkhd + 8 * MiB);
    CHECK_EQ(old_during.hblks, old_before.hblks + 1);
    free(huge);
    CHECK_EQ(mallinfo2().hblks, before.hblks);
}

static int count_block(void *block, size_t block_size, size_t usable, void *arg) {
    (void)block, (void)block_size, (void)usable;
    ++*(size_t *)arg;
    return 0;
}

static size_t blocks_in_use(void) {
    size_t n = 0;
    CHECK_EQ(coral_heap_visit(NULL, count_block, &n), 0);
    return n;
}

static void *wait_for_gate(void *arg) {
    pthread_barrier_wait(arg);
    return NULL;
}

/* The process's first fork, with another thread running (its handlers take
 * the locks), allocates nothing on the forking thread: a first fork made
 * from a signal handler allocated there (stdio's witness, made by the
 * fork's prepare: a block of the forking thread's heap, in the middle of
 * whatever the interrupted code was doing to it). The witness is made at
 * load, from storage of its own. First in main: an earlier fork would have
 * made it. */
static void test_first_fork_allocates_nothing(void) {
    pthread_barrier_t gate;
    CHECK_EQ(pthread_barrier_init(&gate, NULL, 2), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, wait_for_gate, &gate), 0);
    size_t before = blocks_in_use();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(0);
    int status = -1;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    size_t after = blocks_in_use();
    CHECK_MSG(after == before, "the first fork allocated %zd blocks on the forking thread",
              (ssize_t)(after - before));
    pthread_barrier_wait(&gate);
    CHECK_EQ(pthread_join(t, NULL), 0);
    pthread_barrier_destroy(&gate);
}

int main(void) {
    double t0 = now_seconds();
    test_first_fork_allocates_nothing();
    printf("the first fork allocates nothing\n");
    test_glibc_names();
    printf("glibc's internal names ok\n");
    test_extras();
    printf("sized frees, mallopt, mallinfo ok\n");
    test_entry_points();
    printf("entry points ok\n");
    test_contract();
    printf("contract ok\n");
    test_glibc_internal();
    printf("glibc-internal allocations ok\n");
    printf("test_override: all passed in %.2f s\n", now_seconds() - t0);
    return 0;
}
