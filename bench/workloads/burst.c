/* burst: memory returned after a burst, with no call from the program.
 *
 * Allocates --small-mib MiB of 48-byte blocks and --large-mib MiB of 1 MiB
 * blocks, writes them all, frees them all (the small ones in a scrambled
 * order), then only watches its resident memory (/proc/self/statm) every
 * 10 ms for --watch seconds, calling nothing of the allocator.
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

int main(int argc, char **argv) {
    long small_mib = 512, large_mib = 512, slack_mib = 16, watch_ms = 3000;
    opt_t opts[] = {
        {"small-mib", "MiB of 48-byte blocks", &small_mib, NULL},
        {"large-mib", "MiB of 1 MiB blocks", &large_mib, NULL},
        {"slack-mib", "settled: RSS within this of the start", &slack_mib, NULL},
        {"watch", "milliseconds to watch RSS after the frees", &watch_ms, NULL},
    };
    OPTS_PARSE(argc, argv, "Memory returned after a burst, with no call from the program.", opts);
    size_t ns = (size_t)small_mib * 1048576 / 64, nl = (size_t)large_mib;
    unsigned char **s = (unsigned char **)xmalloc(sizeof(void *) * (ns ? ns : 1));
    unsigned char **l = (unsigned char **)xmalloc(sizeof(void *) * (nl ? nl : 1));
    long start = rss_mib();
    for (size_t i = 0; i < ns; i++) {
        s[i] = (unsigned char *)xmalloc(48);
        memset(s[i], (int)(i & 0xff), 48);
    }
    for (size_t i = 0; i < nl; i++) {
        l[i] = (unsigned char *)xmalloc(1048576);
        memset(l[i], (int)(i & 0xff), 1048576);
    }
    long peak = rss_mib();
    for (size_t i = 0; i < ns; i++) {
        size_t k = (i * 7919) % ns;
        if (s[k][47] != (unsigned char)(k & 0xff)) check_failed("burst: small block %zu", k);
        free(s[k]);
    }
    for (size_t i = 0; i < nl; i++) {
        if (l[i][1048575] != (unsigned char)(i & 0xff)) check_failed("burst: large block %zu", i);
        free(l[i]);
    }
    free(s); /* the pointer arrays too: nothing of the burst stays live */
    free(l);
    double t0 = now_sec(), settle = -1;
    long now = rss_mib();
    while (now_sec() - t0 < (double)watch_ms / 1000.0) {
        if (settle < 0 && now <= start + slack_mib) settle = now_sec() - t0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        now = rss_mib();
    }
    if (settle < 0) settle = (double)watch_ms / 1000.0;
    report_malloc_lib();
    printf("info: rss_start_mib=%ld rss_peak_mib=%ld\n", start, peak);
    printf("result: settle_sec=%.3f rss_after_mib=%ld\n", settle, now);
    return 0;
}
