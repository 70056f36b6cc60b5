/* Statistics and options.
 * - coral_stats_json: snprintf semantics (full length returned, truncated
 *   output NUL-terminated), one balanced object;
 * - always-on counters follow a known sequence of calls (huge blocks live,
 *   large allocations, bytes in pages, mapped, OS calls);
 * - per size class counts (builds with CORAL_STATS) match the calls exactly;
 * - coral_option_get/set: defaults, run-time changes, EPERM/EINVAL;
 * - every option from the environment: a good value is taken, a bad one
 *   gives one line naming the variable and keeps the default (children);
 * - with the override (STATS_OVERRIDE build): mallinfo2 and malloc_stats. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "coralloc.h"
#include "stats_json.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

static void test_json_shape(void) {
    size_t full = coral_stats_json(NULL, 0);
    char small[16];
    size_t n = coral_stats_json(small, sizeof small);
    CHECK_GE(n, full - 64); /* figures like RSS may change a little */
    CHECK_EQ(strlen(small), sizeof small - 1);
    char *json = stats_json();
    CHECK_EQ(json[0], '{');
    CHECK_EQ(json[strlen(json) - 1], '}');
    int depth = 0;
    for (const char *c = json; *c; c++) {
        depth += (*c == '{' || *c == '[') - (*c == '}' || *c == ']');
        CHECK_GE(depth, 0);
    }
    CHECK_EQ(depth, 0);
    free(json);
}

static void test_known_sequence(void) {
    long long huge0 = stats_get("huge_live"), huge_allocs0 = stats_get("huge_allocs");
    long long large0 = stats_get("large_allocs"), pages0 = stats_get("page_bytes");
    void *h1 = coral_malloc(9 * MiB), *h2 = coral_malloc(20 * MiB);
    CHECK_EQ(stats_get("huge_live"), huge0 + 2);
    CHECK_EQ(stats_get("huge_allocs"), huge_allocs0 + 2);
    CHECK_GE(stats_get("huge_bytes"), (long long)(29 * MiB));
    CHECK_GE(stats_get("mapped"), (long long)(29 * MiB));
    void *l = coral_malloc(1 * MiB); /* large: up to half a segment */
    CHECK_EQ(stats_get("large_allocs"), large0 + 1);
    long long pages1 = stats_get("page_bytes");
    CHECK_GE(pages1, pages0 + (long long)(1 * MiB));
    coral_free(l);
    /* (with the override, the JSON buffer itself may take a new page) */
    CHECK_LE(stats_get("page_bytes"), pages1 - (long long)(1 * MiB) + (long long)(256 * 1024));
    coral_free(h1);
    coral_free(h2);
    CHECK_EQ(stats_get("huge_live"), huge0);
    coral_collect(1);
    CHECK_GT(stats_get("threads_peak"), 0);
    char *json = stats_json();
    CHECK(strstr(json, "\"mmap\":{\"calls\":") != NULL);
    free(json);
}

static void test_per_class(void) {
    if (!stats_per_class()) {
        /* Not compiled in (CORAL_STATS off): no class rows, however much
         * was allocated. */
        void *q = coral_malloc(48);
        char *json = stats_json();
        CHECK(strstr(json, "\"classes\":[]") != NULL);
        free(json);
        coral_free(q);
        return;
    }
    enum { N = 1000 };
    void *p[N];
    long long a0 = stats_class(48, "allocated"), f0 = stats_class(48, "freed");
    long long live0 = stats_class(48, "live");
    for (int i = 0; i < N; i++) p[i] = coral_malloc(40 + i % 9); /* 40..48: class 48 */
    CHECK_EQ(stats_class(48, "allocated"), a0 + N);
    CHECK_EQ(stats_class(48, "live"), live0 + N);
    CHECK_GE(stats_class(48, "peak"), live0 + N);
    for (int i = 0; i < N; i++) coral_free(p[i]);
    CHECK_EQ(stats_class(48, "freed"), f0 + N);
    CHECK_EQ(stats_class(48, "live"), live0);
    /* bulk calls count too */
    CHECK_EQ(coral_malloc_bulk(48, N, p), N);
    CHECK_EQ(stats_class(48, "allocated"), a0 + 2 * N);
    coral_free_bulk(p, N);
    CHECK_EQ(stats_class(48, "freed"), f0 + 2 * N);
    printf("per-class counts: ok\n");
}

static void test_option_calls(void) {
    long long v = -1;
    CHECK_EQ(coral_option_get("PURGE_DELAY_MS", &v), 0);
    CHECK_EQ(v, 250);
    CHECK_EQ(coral_option_set("CORALLOC_PURGE_DELAY_MS", 500), 0);
    CHECK_EQ(coral_option_get("purge_delay_ms", &v), 0);
    CHECK_EQ(v, 500);
    CHECK_EQ(coral_option_set("PURGE_DELAY_MS", -1), EINVAL);
    CHECK_EQ(coral_option_set("PURGE_DELAY_MS", 3600001), EINVAL);
    CHECK_EQ(coral_option_set("NO_SUCH_OPTION", 1), EINVAL);
    CHECK_EQ(coral_option_get("NO_SUCH_OPTION", &v), EINVAL);
    CHECK_EQ(coral_option_set("VERBOSE", 1), EPERM);
    CHECK_EQ(coral_option_set("PURGE_THREAD", 0), EPERM);
    CHECK_EQ(coral_option_set("PURGE_DELAY_MS", 250), 0);
}

/* Each option from the environment, in a child: a good value is in force, a
 * bad one is named on stderr and the default stays. */
typedef struct {
    const char *name, *good;
    long long good_value, default_value;
    const char *bad;
} env_case_t;

static const env_case_t env_cases[] = {
    {"VERBOSE", "yes", 1, 0, "2"},
    {"SHOW_STATS", "on", 1, 0, "maybe"},
    {"PURGE_DELAY_MS", "1234", 1234, 250, "-5"},
    {"SEGMENT_CACHE", "7", 7, 64, "99999"},
    {"PURGE_THREAD", "false", 0, 1, "x"},
    {"FAIL_OS_AFTER", "0", 0, 0, "1e3"},
    {"POPULATE", "off", 0, 2, "sometimes"},
    {"HUGE_PAGES", "0", 0, 1, "huge"},
};

static int child_print_option(const char *name) {
    long long v = -1;
    CHECK_EQ(coral_option_get(name, &v), 0);
    printf("%lld\n", v);
    fflush(stdout);
    return 0;
}

static void run_env_case(const char *name, const char *value, long long expect,
                         int expect_message) {
    int out[2], err[2];
    CHECK_EQ(pipe(out), 0);
    CHECK_EQ(pipe(err), 0);
    char var[128];
    snprintf(var, sizeof var, "CORALLOC_%s=%s", name, value);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        putenv(var);
        execl("/proc/self/exe", "test_stats", "--print-option", name, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    char obuf[64] = {0}, ebuf[8192] = {0};
    size_t on = 0, en = 0;
    ssize_t r;
    while ((r = read(out[0], obuf + on, sizeof obuf - 1 - on)) > 0) on += (size_t)r;
    while ((r = read(err[0], ebuf + en, sizeof ebuf - 1 - en)) > 0) en += (size_t)r;
    close(out[0]);
    close(err[0]);
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status 0x%x\n%s", var, status,
              ebuf);
    CHECK_MSG(strtoll(obuf, NULL, 10) == expect, "%s: got %s, expected %lld\n", var, obuf, expect);
    char needle[128];
    snprintf(needle, sizeof needle, "CORALLOC_%s=%s is not valid", name, value);
    CHECK_MSG((strstr(ebuf, needle) != NULL) == expect_message, "%s: stderr was:\n%s\n", var, ebuf);
}

static void test_env_options(void) {
    for (size_t i = 0; i < sizeof env_cases / sizeof *env_cases; i++) {
        const env_case_t *c = &env_cases[i];
        run_env_case(c->name, c->good, c->good_value, 0);
        run_env_case(c->name, c->bad, c->default_value, 1);
    }
}

#ifdef STATS_OVERRIDE
/* glibc-compatible answers through the standard names. */
static void test_mallinfo(void) {
    struct mallinfo2 before = mallinfo2();
    void *h = malloc(16 * MiB), *l = malloc(MiB);
    struct mallinfo2 during = mallinfo2();
    CHECK_EQ(during.hblks, before.hblks + 1);
    CHECK_GE(during.hblkhd, before.hblkhd + 16 * MiB);
    CHECK_GE(during.uordblks, before.uordblks + 17 * MiB);
    CHECK_GE(during.arena + during.hblkhd, during.uordblks);
    free(h);
    free(l);
    struct mallinfo2 after = mallinfo2();
    CHECK_EQ(after.hblks, before.hblks);
    CHECK_EQ(malloc_trim(0), 1);
    malloc_stats(); /* glibc's format on stderr */
}
#endif

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--print-option") == 0) return child_print_option(argv[2]);
    test_json_shape();
    test_known_sequence();
    test_per_class();
    test_option_calls();
    test_env_options();
#ifdef STATS_OVERRIDE
    test_mallinfo();
#endif
    printf("stats and options: ok\n");
    return 0;
}
