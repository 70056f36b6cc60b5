/* Options from the environment: CORALLOC_<NAME>=value, read once at start-up.
 * Parsing uses no allocation (start-up may run before libc is fully up). A
 * bad value prints one line naming the variable and what it accepts, and the
 * default stays. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

typedef struct option_desc_s {
    const char *name; /* after CORALLOC_ */
    int64_t value;    /* default */
    int64_t min, max;
    bool is_bool;
    const char *help;
    bool runtime;             /* coral_option_set may change it */
    const char *const *names; /* named values (value = index), or NULL */
} option_desc_t;

static const char *const populate_names[] = {"off", "on", "adaptive", NULL};
static const char *const on_error_names[] = {"abort", "warn", NULL};

static const option_desc_t option_descs[CORAL_OPT_COUNT] = {
    [CORAL_OPT_VERBOSE] = {"VERBOSE", 0, 0, 1, true, "print the options in force at start-up",
                           false},
    [CORAL_OPT_SHOW_STATS] = {"SHOW_STATS", 0, 0, 1, true, "print statistics to stderr at exit",
                              false},
    [CORAL_OPT_PURGE_DELAY_MS] = {"PURGE_DELAY_MS", 250, 0, 3600000, false,
                                  "milliseconds freed memory stays before it is returned to the OS",
                                  true},
    [CORAL_OPT_SEGMENT_CACHE] =
        {"SEGMENT_CACHE", 64, 0, 4096, false,
         "freed segments and huge blocks kept mapped for reuse, in 4 MiB units", true},
    [CORAL_OPT_PURGE_THREAD] = {"PURGE_THREAD", 1, 0, 1, true,
                                "purge from a background thread (else from allocating threads)",
                                false},
    [CORAL_OPT_FAIL_OS_AFTER] = {"FAIL_OS_AFTER", 0, 0, INT64_MAX, false,
                                 "testing: make the Nth kernel call fail (0: never)", true},
    [CORAL_OPT_POPULATE] = {"POPULATE", CORAL_POPULATE_ADAPTIVE, 0, 2, false,
                            "prefault policy: off, on (every mapping) or adaptive", true,
                            populate_names},
    [CORAL_OPT_BULK_CACHE_KB] = {"BULK_CACHE_KB", 2048, 0, 1048576, false,
                                 "KiB of blocks coral_free_bulk keeps per thread for the next "
                                 "coral_malloc_bulk calls (0: off)",
                                 true},
    [CORAL_OPT_HUGE_PAGES] = {"HUGE_PAGES", 1, 0, 1, true,
                              "transparent huge pages for huge blocks and for a thread's "
                              "segments after its first, while pages are written densely",
                              false},
    [CORAL_OPT_ON_ERROR] = {"ON_ERROR", CORAL_ON_ERROR_ABORT, 0, 1, false,
                            "a misuse detected (double free, invalid pointer, overflow): abort, "
                            "or warn (print, leak the block, go on)",
                            true, on_error_names},
    [CORAL_OPT_OLD_MREMAP] = {"OLD_MREMAP", 0, 0, 1, true,
                              "testing: mremap behaves as on kernels before 6.17 (a move of a "
                              "range of several mappings unmaps the destination, then fails)",
                              true},
    [CORAL_OPT_PROFILE_RATE] = {"PROFILE_RATE", 524288, 1, (int64_t)1 << 40, false,
                                "heap profiler (CORALLOC_PROFILE=FILE): mean bytes allocated "
                                "between two samples",
                                false},
    [CORAL_OPT_PROFILE_SIGNAL] = {"PROFILE_SIGNAL", 0, 0, 64, false,
                                  "heap profiler: a signal number that writes the profile "
                                  "(FILE.PID) when received (0: none)",
                                  false},
    [CORAL_OPT_PROFILE_LEAKS] = {"PROFILE_LEAKS", 0, 0, 1, true,
                                 "heap profiler: print the sites of sampled blocks still live "
                                 "at exit (profiles even without CORALLOC_PROFILE)",
                                 false},
};

int64_t coral_options[CORAL_OPT_COUNT];

static bool parse_bool(const char *s, int64_t *out) {
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no",
                                                                                "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return (*out = 1), true;
        if (strcasecmp(s, no[i]) == 0) return (*out = 0), true;
    }
    return false;
}

static bool parse_int(const char *s, int64_t *out) {
    if (*s == '\0') return false;
    int64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (INT64_MAX - (*s - '0')) / 10) return false;
        v = v * 10 + (*s - '0');
    }
    if (*s != '\0') return false;
    *out = v;
    return true;
}

/* The text of an option's variable: a boolean word, a whole number or one of
 * its names, within its range. */
static bool option_parse(const option_desc_t *d, const char *s, int64_t *out) {
    int64_t v;
    bool ok = d->is_bool ? parse_bool(s, &v) : parse_int(s, &v);
    for (int k = 0; !ok && d->names && d->names[k]; k++) {
        if (strcasecmp(s, d->names[k]) == 0) {
            v = k;
            ok = true;
        }
    }
    if (!ok || v < d->min || v > d->max) return false;
    *out = v;
    return true;
}

/* "CORALLOC_" + name, without snprintf: this runs in every process at
 * start-up, and the formatting code is pages to fault in. */
static void option_var_name(char *out, size_t cap, const char *name) {
    static const char prefix[] = "CORALLOC_";
    size_t n = sizeof prefix - 1, len = strlen(name);
    if (n + len >= cap) len = cap - n - 1;
    memcpy(out, prefix, n);
    memcpy(out + n, name, len);
    out[n + len] = '\0';
}

/* "a, b or c", without snprintf (see option_var_name). */
static void names_list(const char *const *names, char *out, size_t cap) {
    size_t n = 0;
    for (int k = 0; names[k] != NULL; k++) {
        const char *sep = k == 0 ? "" : names[k + 1] == NULL ? " or " : ", ";
        for (const char *t = sep; *t && n + 1 < cap; t++) out[n++] = *t;
        for (const char *t = names[k]; *t && n + 1 < cap; t++) out[n++] = *t;
    }
    out[n] = '\0';
}

static _Atomic(bool) options_read;

/* secure_getenv: in a process that runs with privileges its user lacks
 * (set-user-ID or set-group-ID, file capabilities: the kernel's AT_SECURE)
 * every CORALLOC_* variable reads as unset, as glibc ignores its own
 * MALLOC_* settings there. Such a process takes its environment from the
 * user who starts it, and these variables create files (CORALLOC_PROFILE:
 * FILE.PID, created and truncated with the process's privileges), make its
 * kernel calls fail (CORALLOC_FAIL_OS_AFTER) or print its statistics. */
const char *coral_env(const char *var) { return secure_getenv(var); }

int64_t coral_option_now(coral_option_t opt) {
    if (atomic_load_explicit(&options_read, memory_order_acquire)) return coral_option(opt);
    const option_desc_t *d = &option_descs[opt];
    char var[64];
    option_var_name(var, sizeof var, d->name);
    const char *s = coral_env(var);
    int64_t v;
    return s != NULL && option_parse(d, s, &v) ? v : d->value;
}

void coral_options_init(void) {
    for (int i = 0; i < CORAL_OPT_COUNT; i++) {
        const option_desc_t *d = &option_descs[i];
        coral_options[i] = d->value;
        char var[64];
        option_var_name(var, sizeof var, d->name);
        const char *s = coral_env(var);
        if (s == NULL) continue;
        int64_t v;
        if (option_parse(d, s, &v)) {
            coral_options[i] = v;
        } else if (d->names) {
            char list[128];
            names_list(d->names, list, sizeof list);
            coral_message("%s=%s is not valid: use %s; keeping %s", var, s, list,
                          d->names[d->value]);
        } else if (d->is_bool) {
            coral_message("%s=%s is not valid: use 1/0, true/false, yes/no or on/off; keeping %lld",
                          var, s, (long long)d->value);
        } else {
            coral_message("%s=%s is not valid: use a whole number from %lld to %lld; keeping %lld",
                          var, s, (long long)d->min, (long long)d->max, (long long)d->value);
        }
    }
    atomic_store_explicit(&options_read, true, memory_order_release);
}

void coral_options_print(void) {
    for (int i = 0; i < CORAL_OPT_COUNT; i++)
        coral_message("option CORALLOC_%s=%lld (%s)", option_descs[i].name,
                      (long long)coral_options[i], option_descs[i].help);
}

/* ---- by name (the api layer's coral_option_get / coral_option_set) ---------- */

int coral_option_index(const char *name) {
    if (name == NULL) return -1;
    if (strncmp(name, "CORALLOC_", 9) == 0) name += 9;
    for (int i = 0; i < CORAL_OPT_COUNT; i++)
        if (strcasecmp(name, option_descs[i].name) == 0) return i;
    return -1;
}

int coral_option_check(int i, long long value) {
    const option_desc_t *d = &option_descs[i];
    if (value < d->min || value > d->max) return EINVAL;
    return d->runtime ? 0 : EPERM;
}

/* ---- the table, for tools ------------------------------------------------------------ */

int coral_option_describe(size_t index, coral_option_info_t *out) {
    if (index >= CORAL_OPT_COUNT || out == NULL) return EINVAL;
    const option_desc_t *d = &option_descs[index];
    *out = (coral_option_info_t){.name = d->name,
                                 .help = d->help,
                                 .default_value = d->value,
                                 .min = d->min,
                                 .max = d->max,
                                 .value = coral_option((coral_option_t)index),
                                 .is_bool = d->is_bool,
                                 .runtime = d->runtime,
                                 .names = d->names};
    return 0;
}

int coral_option_parse(const char *name, const char *text, long long *value) {
    int i = coral_option_index(name);
    int64_t v;
    if (i < 0 || text == NULL || !option_parse(&option_descs[i], text, &v)) return EINVAL;
    if (value != NULL) *value = (long long)v;
    return 0;
}

const char *coral_version(void) { return CORALLOC_VERSION; }
