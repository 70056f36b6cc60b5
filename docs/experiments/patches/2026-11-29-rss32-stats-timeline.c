/* rss32 (2026-11-29): preloaded after coralloc, prints every TS_MS ms (default 20) the
 * process RSS, page_bytes (spans in use), segments, abandoned/adopted counts and the bytes
 * purged and populated so far, from coral_stats_json. gcc -O2 -shared -fPIC -o ts.so this.c -ldl -lpthread */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static size_t (*js)(char *, size_t);
static char buf[16384];
static long get(const char *k) { char pat[64]; snprintf(pat, sizeof pat, "\"%s\":", k); char *p = strstr(buf, pat); return p ? atol(p + strlen(pat)) : -1; }
static long getcall(const char *k) { char pat[64]; snprintf(pat, sizeof pat, "\"%s\":", k); char *p = strstr(buf, pat); if(!p) return -1; p = strstr(p, "bytes\":"); return p? atol(p+7):-1; }
static void *run(void *a) {
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    long ms = getenv("TS_MS") ? atol(getenv("TS_MS")) : 20;
    for (;;) { usleep(ms * 1000); js(buf, sizeof buf); clock_gettime(CLOCK_MONOTONIC, &t);
        fprintf(stderr, "TS %6.3f rss %6ld pages %6ld segs %4ld aband %5ld adopt %5ld purged %7ld popul %7ld\n", (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9,
            get("rss") >> 10, get("page_bytes") >> 10, get("segments"), get("segments_abandoned"), get("segments_adopted"), getcall("purge") >> 10, getcall("populate") >> 10); }
    return 0;
}
__attribute__((constructor)) static void init(void) { js = dlsym(RTLD_DEFAULT, "coral_stats_json"); pthread_t th; pthread_create(&th, 0, run, 0); pthread_detach(th); }
