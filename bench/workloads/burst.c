/* burst: memory returned after a burst, with no call from the program.
 *
 * Allocates --small-mib MiB of 48-byte blocks and --large-mib MiB of 1 MiB
 * blocks, writes them all, frees them all (the small ones in a scrambled
 * order), then only watches its resident memory (/proc/self/statm) every
 * 10 ms for --watch seconds, calling nothing of the allocator.
 *
 * --window=N: first a window of 16 blocks of 64 KiB-8 MiB (sizes spread
 * evenly on a log scale), each replaced N times in turn, then all freed; the
 * burst follows (issue 30's window-then-burst shape: memory a thread keeps
 * for classes it used once must go back too). --small-size sets the small
 * blocks' size (default 48 bytes).
 *
 * --handoff=1: a second thread allocates and writes the blocks, hands them
 * to the main thread, which frees them all, and then stays idle (blocked on
 * a pipe, no allocator call) until the watch is over. An allocator whose
 * memory goes back only through its owner thread keeps it all.
 *
 * Figure: settle_sec, the time after the last free until RSS is back within
 * --slack-mib of where it started (the --watch time when it never is), and
 * rss_after_mib, the RSS at the end of the watch.
 */
#include "common.h"

#include <time.h>

static long rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (f == NULL || fscanf(f, "%ld %ld", &size, &resident) != 2) check_failed("burst: statm");
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE) / 1048576;
}

static size_t g_ns, g_nl, g_small_size = 48;
static unsigned char **g_small, **g_large;
static int g_ready[2], g_done[2]; /* pipes: blocks written; watch over */

static void allocate_burst(void) {
    for (size_t i = 0; i < g_ns; i++) {
        g_small[i] = (unsigned char *)xmalloc(g_small_size);
        memset(g_small[i], (int)(i & 0xff), g_small_size);
    }
    for (size_t i = 0; i < g_nl; i++) {
        g_large[i] = (unsigned char *)xmalloc(1048576);
        memset(g_large[i], (int)(i & 0xff), 1048576);
    }
}

/* --handoff: the owner allocates, says so, then idles until the end. */
static void *owner_main(void *arg) {
    (void)arg;
    allocate_burst();
    char c = 1;
    if (write(g_ready[1], &c, 1) != 1 || read(g_done[0], &c, 1) != 1) check_failed("burst: pipe");
    return NULL;
}

static void free_burst(void) {
    for (size_t i = 0; i < g_ns; i++) {
        size_t k = (i * 7919) % g_ns;
        if (g_small[k][g_small_size - 1] != (unsigned char)(k & 0xff))
            check_failed("burst: small block %zu", k);
        free(g_small[k]);
    }
    for (size_t i = 0; i < g_nl; i++) {
        if (g_large[i][1048575] != (unsigned char)(i & 0xff))
            check_failed("burst: large block %zu", i);
        free(g_large[i]);
    }
    free(g_small); /* the pointer arrays too: nothing of the burst stays live */
    free(g_large);
}

/* The window: 16 places, each a block of its own size between 64 KiB and
 * 8 MiB, replaced `rounds` times in turn, every page written; all freed. */
static void run_window(long rounds) {
    enum { PLACES = 16 };
    unsigned char *place[PLACES] = {0};
    size_t size[PLACES];
    double s = 65536.0; /* 64 KiB * 2^(7 i / 15): 64 KiB .. 8 MiB */
    for (int i = 0; i < PLACES; i++, s *= 1.3814819) size[i] = (size_t)s;
    for (long r = 0; r < rounds; r++) {
        for (int i = 0; i < PLACES; i++) {
            free(place[i]);
            place[i] = (unsigned char *)xmalloc(size[i]);
            for (size_t off = 0; off < size[i]; off += 4096) place[i][off] = (unsigned char)r;
        }
    }
    for (int i = 0; i < PLACES; i++) free(place[i]);
}

int main(int argc, char **argv) {
    long small_mib = 512, large_mib = 512, slack_mib = 16, watch_ms = 3000, handoff = 0;
    long window = 0, small_size = 48;
    opt_t opts[] = {
        {"small-mib", "MiB of 48-byte blocks", &small_mib, NULL},
        {"small-size", "bytes of each small block (16-1024)", &small_size, NULL},
        {"large-mib", "MiB of 1 MiB blocks", &large_mib, NULL},
        {"window", "rounds of a 64 KiB-8 MiB window before the burst", &window, NULL},
        {"slack-mib", "settled: RSS within this of the start", &slack_mib, NULL},
        {"watch", "milliseconds to watch RSS after the frees", &watch_ms, NULL},
        {"handoff", "1: another thread allocates, then idles", &handoff, NULL},
    };
    OPTS_PARSE(argc, argv, "Memory returned after a burst, with no call from the program.", opts);
    if (small_size < 16 || small_size > 1024) check_failed("burst: --small-size must be 16-1024");
    g_small_size = (size_t)small_size;
    g_ns = (size_t)small_mib * 1048576 / (g_small_size + 16);
    g_nl = (size_t)large_mib;
    g_small = (unsigned char **)xmalloc(sizeof(void *) * (g_ns ? g_ns : 1));
    g_large = (unsigned char **)xmalloc(sizeof(void *) * (g_nl ? g_nl : 1));
    pthread_t owner;
    long start = rss_mib();
    run_window(window);
    if (handoff) {
        char c;
        if (pipe(g_ready) != 0 || pipe(g_done) != 0) check_failed("burst: pipe");
        if (pthread_create(&owner, NULL, owner_main, NULL) != 0) check_failed("burst: thread");
        if (read(g_ready[0], &c, 1) != 1) check_failed("burst: pipe");
    } else {
        allocate_burst();
    }
    long peak = rss_mib();
    free_burst();
    double t0 = now_sec(), settle = -1;
    long now = rss_mib();
    while (now_sec() - t0 < (double)watch_ms / 1000.0) {
        if (settle < 0 && now <= start + slack_mib) settle = now_sec() - t0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        now = rss_mib();
    }
    if (settle < 0) settle = (double)watch_ms / 1000.0;
    if (handoff) {
        char c = 1;
        if (write(g_done[1], &c, 1) != 1 || pthread_join(owner, NULL) != 0)
            check_failed("burst: join");
    }
    report_malloc_lib();
    printf("info: rss_start_mib=%ld rss_peak_mib=%ld handoff=%ld window=%ld\n", start, peak,
           handoff, window);
    printf("result: settle_sec=%.3f rss_after_mib=%ld\n", settle, now);
    return 0;
}
