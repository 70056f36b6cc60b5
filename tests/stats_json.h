/* Reading numbers out of coral_stats_json's object, for the tests. */
#ifndef CORAL_TEST_STATS_JSON_H
#define CORAL_TEST_STATS_JSON_H

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coralloc.h"

/* The whole JSON object, in a buffer the caller frees with free(). */
static inline char *stats_json(void) {
    size_t n = coral_stats_json(NULL, 0);
    CHECK_GT(n, 2);
    size_t cap = n + 4096; /* figures may grow between the two calls */
    char *buf = (char *)malloc(cap);
    CHECK_NOT_NULL(buf);
    size_t m = coral_stats_json(buf, cap);
    CHECK_LT(m, cap);
    CHECK_EQ(strlen(buf), m);
    return buf;
}

/* The number right after the first `pattern` in the JSON (which must have it). */
static inline long long stats_number_after(const char *pattern) {
    char *json = stats_json();
    const char *at = strstr(json, pattern);
    CHECK_MSG(at != NULL, "no %s in %s\n", pattern, json);
    long long v = strtoll(at + strlen(pattern), NULL, 10);
    free(json);
    return v;
}

/* The value of "key": in the object's top level. */
static inline long long stats_get(const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    return stats_number_after(pattern);
}

/* allocated/freed/live/peak of the class of `size` bytes; 0 if absent. */
static inline long long stats_class(long long size, const char *field) {
    char *json = stats_json(), pattern[64];
    snprintf(pattern, sizeof pattern, "\"size\":%lld,", size);
    const char *at = strstr(json, pattern);
    long long v = 0;
    if (at != NULL) {
        char key[32];
        snprintf(key, sizeof key, "\"%s\":", field);
        const char *f = strstr(at, key);
        CHECK_NOT_NULL(f);
        v = strtoll(f + strlen(key), NULL, 10);
    }
    free(json);
    return v;
}

/* How many OS calls of one kind ("mmap", "purge", "hugepage", ...) were made. */
static inline long long stats_os_calls(const char *kind) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":{\"calls\":", kind);
    return stats_number_after(pattern);
}

/* How many bytes the OS calls of one kind covered. */
static inline long long stats_os_bytes(const char *kind) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":{\"calls\":", kind);
    char *json = stats_json();
    const char *at = strstr(json, pattern);
    CHECK_MSG(at != NULL, "no %s in %s\n", pattern, json);
    at = strstr(at, "\"bytes\":");
    CHECK_MSG(at != NULL, "no bytes after %s in %s\n", pattern, json);
    long long v = strtoll(at + strlen("\"bytes\":"), NULL, 10);
    free(json);
    return v;
}

static inline int stats_per_class(void) {
    char *json = stats_json();
    int on = strstr(json, "\"per_class\":true") != NULL;
    free(json);
    return on;
}

#endif
