/* served.h: proof that a program's allocations are coralloc's, from
 * coral_stats_json's counters and coral_owns. For the installed-files tests. */
#ifndef CORAL_SERVED_H
#define CORAL_SERVED_H

#include <coralloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after "key": in the statistics, read into a buffer on the stack
 * (no allocation: the caller is counting them). */
static long long served_stat(const char *key) {
    static char json[1 << 16];
    char pattern[64];
    if (coral_stats_json(json, sizeof json) >= sizeof json) return -1;
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? strtoll(at + strlen(pattern), NULL, 10) : -1;
}

static int served_fail(const char *what) {
    fprintf(stderr, "FAIL: %s\n", what);
    return 1;
}

#define SERVED_CHECK(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) return served_fail(#cond);                                                    \
    } while (0)

#endif
