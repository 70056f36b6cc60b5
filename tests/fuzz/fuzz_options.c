/* fuzz_options: a libFuzzer target for the option parser, checked against
 * an independent reading of docs/OPTIONS.md.
 *
 * Input: [mode][rest]. mode % 16 below the number of options picks that
 * option's name from coral_option_info (bit 4: with the CORALLOC_ prefix,
 * bit 5: in lower case) and the rest is the text; otherwise the rest is
 * "name=text" (no '=': all name, empty text). Both are C strings (a 0 byte
 * ends them).
 *
 * For each input: coral_option_parse(name, text) returns 0 or EINVAL, the
 * same with or without a place for the value, and leaves the value alone
 * when it fails; it accepts exactly what the reference below accepts (a
 * known name, with or without the CORALLOC_ prefix, any case; a boolean's
 * 1/0, true/false, yes/no, on/off in any case; else a decimal whole number
 * or one of the option's value names, within its range), with the same
 * value. An accepted value round-trips: its canonical text parses to it;
 * coral_option_get gives what coral_option_info says is in force; a run-time
 * option takes it through coral_option_set and gives it back from
 * coral_option_get (then the old value is restored), a start-up option
 * refuses it with EPERM. A NULL name or text is EINVAL.
 *
 * A failed check prints one line and aborts (libFuzzer saves the input).
 */
#define _GNU_SOURCE
#include "coralloc.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { MAX_OPTIONS = 64, MAX_TEXT = 256 };
#define UNTOUCHED (-7777777777LL) /* a value no option can have */

static coral_option_info_t infos[MAX_OPTIONS];
static size_t ninfos;

static void fail(const char *name, const char *text, const char *fmt, ...)
    __attribute__((noreturn, cold, format(printf, 3, 4)));
static void fail(const char *name, const char *text, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "fuzz_options: name \"%s\", text \"%s\": ", name, text);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* ---- the reference ------------------------------------------------------------------ */

static const coral_option_info_t *ref_option(const char *name) {
    if (strncmp(name, "CORALLOC_", 9) == 0) name += 9;
    for (size_t i = 0; i < ninfos; i++)
        if (strcasecmp(name, infos[i].name) == 0) return &infos[i];
    return NULL;
}

static int ref_parse(const coral_option_info_t *o, const char *text, long long *out) {
    static const char *const words[] = {"0", "1", "false", "true", "no", "yes", "off", "on"};
    long long v = -1;
    if (o->is_bool) {
        for (size_t i = 0; i < sizeof words / sizeof *words; i++)
            if (strcasecmp(text, words[i]) == 0) v = (long long)(i % 2);
        if (v < 0) return 0;
    } else {
        size_t digits = strspn(text, "0123456789");
        if (text[0] != '\0' && text[digits] == '\0') {
            errno = 0;
            unsigned long long u = strtoull(text, NULL, 10);
            if (errno == ERANGE || u > (unsigned long long)INT64_MAX) return 0;
            v = (long long)u;
        }
        for (size_t k = 0; v < 0 && o->names != NULL && o->names[k] != NULL; k++)
            if (strcasecmp(text, o->names[k]) == 0) v = (long long)k;
        if (v < 0) return 0;
    }
    if (v < o->min || v > o->max) return 0;
    *out = v;
    return 1;
}

/* The text that stands for v: a word for booleans, else the number (or,
 * every other time, the value's name). */
static void canonical(const coral_option_info_t *o, long long v, int use_name, char *buf,
                      size_t cap) {
    if (o->is_bool)
        snprintf(buf, cap, "%s", v ? "on" : "false");
    else if (use_name && o->names != NULL)
        snprintf(buf, cap, "%s", o->names[v]);
    else
        snprintf(buf, cap, "%lld", v);
}

/* ---- the checks ----------------------------------------------------------------------- */

static void check_round_trip(const char *name, const char *text, const coral_option_info_t *o,
                             long long v) {
    char again[64];
    long long w = UNTOUCHED, in_force = UNTOUCHED;
    canonical(o, v, (int)(v & 1), again, sizeof again);
    if (coral_option_parse(name, again, &w) != 0 || w != v)
        fail(name, text, "value %lld written as \"%s\" parses to %lld", v, again, w);
    if (coral_option_get(name, &in_force) != 0 || in_force != o->value)
        fail(name, text, "coral_option_get gives %lld, coral_option_info %lld", in_force, o->value);
    int rc = coral_option_set(name, v);
    if (!o->runtime) {
        if (rc != EPERM) fail(name, text, "coral_option_set of a start-up option = %d", rc);
        return;
    }
    if (rc != 0) fail(name, text, "coral_option_set(%lld) = %d", v, rc);
    if (coral_option_get(name, &w) != 0 || w != v)
        fail(name, text, "coral_option_set(%lld), then coral_option_get gives %lld", v, w);
    if (coral_option_set(name, in_force) != 0)
        fail(name, text, "coral_option_set could not restore %lld", in_force);
}

static void check_one(const char *name, const char *text) {
    long long v = UNTOUCHED, want = 0;
    int rc = coral_option_parse(name, text, &v);
    if (rc != 0 && rc != EINVAL) fail(name, text, "coral_option_parse = %d", rc);
    if (coral_option_parse(name, text, NULL) != rc)
        fail(name, text, "coral_option_parse without a value pointer differs");
    const coral_option_info_t *o = ref_option(name);
    int ok = o != NULL && ref_parse(o, text, &want);
    if (!ok) {
        if (rc != EINVAL) fail(name, text, "accepted (%lld), expected EINVAL", v);
        if (v != UNTOUCHED) fail(name, text, "refused, but the value was set to %lld", v);
        return;
    }
    if (rc != 0) fail(name, text, "refused, expected %lld", want);
    if (v != want) fail(name, text, "parsed to %lld, expected %lld", v, want);
    check_round_trip(name, text, o, v);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    while (ninfos < MAX_OPTIONS && coral_option_info(ninfos, &infos[ninfos]) == 0) ninfos++;
    if (ninfos == 0 || ninfos == MAX_OPTIONS) {
        fprintf(stderr, "fuzz_options: coral_option_info lists %zu options\n", ninfos);
        abort();
    }
    coral_option_info_t past;
    if (coral_option_info(ninfos, &past) != EINVAL || coral_option_info(0, NULL) != EINVAL) {
        fprintf(stderr, "fuzz_options: coral_option_info accepts a bad call\n");
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    char rest[MAX_TEXT + 1], name[MAX_TEXT + 16];
    size_t n = size - 1 < MAX_TEXT ? size - 1 : MAX_TEXT;
    memcpy(rest, data + 1, n);
    rest[n] = '\0';
    const char *text;
    unsigned mode = data[0], i = mode % 16;
    if (i < ninfos) {
        snprintf(name, sizeof name, "%s%s", (mode & 16) ? "CORALLOC_" : "", infos[i].name);
        for (char *c = name; (mode & 32) && *c; c++) *c = (char)tolower((unsigned char)*c);
        text = rest;
    } else {
        char *eq = strchr(rest, '=');
        if (eq != NULL) *eq = '\0';
        snprintf(name, sizeof name, "%s", rest);
        text = eq != NULL ? eq + 1 : "";
    }
    long long v = UNTOUCHED;
    if (coral_option_parse(NULL, text, &v) != EINVAL ||
        coral_option_parse(name, NULL, &v) != EINVAL)
        fail(name, text, "a NULL name or text is not EINVAL");
    check_one(name, text);
    return 0;
}
