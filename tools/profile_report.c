/* `coralloc profile FILE`: a short text report of a heap profile coralloc
 * wrote (the pprof format, profile.proto; gzipped files need pprof or
 * gunzip first), for machines without pprof: the totals, then the top
 * sites by in-use bytes and by allocated bytes. A site is a sample's stack
 * as function names (coralloc writes them into the file from the program's
 * symbols), innermost first. The reader decodes only what the report
 * needs: sample types, samples, locations, functions, strings. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profile_report.h"

#define TOP_SITES 10
#define SITE_FRAMES 4

typedef struct span_s {
    const uint8_t *p;
    size_t len;
} span_t;

typedef struct sample_s {
    span_t locations; /* packed (or one) location ids */
    int64_t values[4];
} sample_t;

typedef struct profile_s {
    span_t *strings;
    size_t nstrings;
    uint64_t *func_id, *func_name; /* parallel */
    size_t nfuncs;
    uint64_t *loc_id, *loc_func; /* the first line's function */
    size_t nlocs;
    sample_t *samples;
    size_t nsamples;
    int64_t types[4][2]; /* (type, unit) string ids */
    size_t ntypes;
    int64_t period;
} profile_t;

/* ---- decoding --------------------------------------------------------------------- */

static bool varint(span_t *s, uint64_t *out) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64 && s->len > 0; shift += 7) {
        uint8_t b = *s->p++;
        s->len--;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* The next field of s: its number and either its varint or its bytes. */
static bool field(span_t *s, unsigned *number, uint64_t *value, span_t *bytes) {
    uint64_t key;
    if (!varint(s, &key)) return false;
    *number = (unsigned)(key >> 3);
    switch (key & 7) {
    case 0:
        return varint(s, value);
    case 2:
        if (!varint(s, value) || *value > s->len) return false;
        *bytes = (span_t){s->p, (size_t)*value};
        s->p += *value;
        s->len -= (size_t)*value;
        return true;
    case 1:
    case 5: {
        size_t n = (key & 7) == 1 ? 8 : 4;
        *value = 0; /* (fixed-size fields: not read) */
        if (s->len < n) return false;
        s->p += n;
        s->len -= n;
        return true;
    }
    default:
        return false;
    }
}

static void *grow(void *array, size_t n, size_t size) {
    if ((n & (n - 1)) != 0 && n != 0) return array; /* room until the next power of two */
    void *p = realloc(array, (n ? 2 * n : 16) * size);
    if (p == NULL) {
        fprintf(stderr, "coralloc: profile: out of memory\n");
        exit(1);
    }
    return p;
}

static bool parse_sample(span_t body, sample_t *out) {
    unsigned n;
    uint64_t v = 0;
    span_t b = {0};
    size_t k = 0;
    *out = (sample_t){0};
    while (body.len > 0) {
        if (!field(&body, &n, &v, &b)) return false;
        if (n == 1) out->locations = b;
        if (n == 2) {
            span_t packed = b;
            while (packed.len > 0 && varint(&packed, &v))
                if (k < 4) out->values[k++] = (int64_t)v;
        }
    }
    return true;
}

static bool parse_pair(span_t body, uint64_t id_field, uint64_t *id, uint64_t val_field,
                       uint64_t *val, bool nested_line) {
    unsigned n;
    uint64_t v = 0;
    span_t b = {0};
    *id = *val = 0;
    while (body.len > 0) {
        if (!field(&body, &n, &v, &b)) return false;
        if (n == id_field) *id = v;
        if (!nested_line && n == val_field) *val = v;
        if (nested_line && n == val_field && *val == 0) { /* Location.line: its function_id */
            unsigned ln;
            uint64_t lv = 0;
            span_t lb;
            while (b.len > 0 && field(&b, &ln, &lv, &lb))
                if (ln == 1) *val = lv;
        }
    }
    return true;
}

static bool parse_profile(span_t s, profile_t *pr) {
    unsigned n;
    uint64_t v = 0;
    span_t b = {0};
    while (s.len > 0) {
        if (!field(&s, &n, &v, &b)) return false;
        if (n == 1 && pr->ntypes < 4) { /* sample_type */
            uint64_t t, u;
            if (!parse_pair(b, 1, &t, 2, &u, false)) return false;
            pr->types[pr->ntypes][0] = (int64_t)t;
            pr->types[pr->ntypes++][1] = (int64_t)u;
        } else if (n == 2) {
            pr->samples = grow(pr->samples, pr->nsamples, sizeof *pr->samples);
            if (!parse_sample(b, &pr->samples[pr->nsamples++])) return false;
        } else if (n == 4) {
            pr->loc_id = grow(pr->loc_id, pr->nlocs, sizeof *pr->loc_id);
            pr->loc_func = grow(pr->loc_func, pr->nlocs, sizeof *pr->loc_func);
            if (!parse_pair(b, 1, &pr->loc_id[pr->nlocs], 4, &pr->loc_func[pr->nlocs], true))
                return false;
            pr->nlocs++;
        } else if (n == 5) {
            pr->func_id = grow(pr->func_id, pr->nfuncs, sizeof *pr->func_id);
            pr->func_name = grow(pr->func_name, pr->nfuncs, sizeof *pr->func_name);
            if (!parse_pair(b, 1, &pr->func_id[pr->nfuncs], 2, &pr->func_name[pr->nfuncs], false))
                return false;
            pr->nfuncs++;
        } else if (n == 6) {
            pr->strings = grow(pr->strings, pr->nstrings, sizeof *pr->strings);
            pr->strings[pr->nstrings++] = b;
        } else if (n == 12) {
            pr->period = (int64_t)v;
        }
    }
    return true;
}

/* ---- the report ------------------------------------------------------------------- */

static span_t string_at(const profile_t *pr, uint64_t i) {
    return i < pr->nstrings ? pr->strings[i] : (span_t){(const uint8_t *)"?", 1};
}

static bool type_is(const profile_t *pr, size_t k, const char *name) {
    span_t s = string_at(pr, (uint64_t)pr->types[k][0]);
    return s.len == strlen(name) && memcmp(s.p, name, s.len) == 0;
}

/* The function name of location id (ids are usually 1..n in order). */
static span_t function_of(const profile_t *pr, uint64_t loc) {
    uint64_t func = 0;
    if (loc >= 1 && loc <= pr->nlocs && pr->loc_id[loc - 1] == loc)
        func = pr->loc_func[loc - 1];
    else
        for (size_t i = 0; i < pr->nlocs; i++)
            if (pr->loc_id[i] == loc) func = pr->loc_func[i];
    if (func >= 1 && func <= pr->nfuncs && pr->func_id[func - 1] == func)
        return string_at(pr, pr->func_name[func - 1]);
    for (size_t i = 0; i < pr->nfuncs; i++)
        if (pr->func_id[i] == func) return string_at(pr, pr->func_name[i]);
    return (span_t){(const uint8_t *)"?", 1};
}

static void print_site(const profile_t *pr, const sample_t *s) {
    span_t locs = s->locations;
    uint64_t loc;
    for (int k = 0; k < SITE_FRAMES && locs.len > 0 && varint(&locs, &loc); k++) {
        span_t name = function_of(pr, loc);
        printf("%s%.*s", k ? " < " : "", (int)name.len, (const char *)name.p);
    }
    if (locs.len > 0) printf(" < ...");
    printf("\n");
}

static void human(int64_t bytes, char *out, size_t cap) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* The top sites by value k (descending), each printed once. */
static void print_top(const profile_t *pr, size_t k, size_t objects_k, const char *title) {
    int64_t total = 0;
    for (size_t i = 0; i < pr->nsamples; i++) total += pr->samples[i].values[k];
    char t[32];
    human(total, t, sizeof t);
    printf("\n%s: %s in total\n", title, t);
    bool *shown = calloc(pr->nsamples + 1, sizeof *shown);
    if (shown == NULL) return;
    for (int rank = 0; rank < TOP_SITES; rank++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < pr->nsamples; i++)
            if (!shown[i] && pr->samples[i].values[k] > 0 &&
                (best == SIZE_MAX || pr->samples[i].values[k] > pr->samples[best].values[k]))
                best = i;
        if (best == SIZE_MAX) break;
        shown[best] = true;
        const sample_t *s = &pr->samples[best];
        char b[32];
        human(s->values[k], b, sizeof b);
        printf("  %10s %5.1f%% %9lld blocks  ", b, total ? 100.0 * s->values[k] / total : 0.0,
               (long long)s->values[objects_k]);
        print_site(pr, s);
    }
    free(shown);
}

int coralloc_profile_report(int argc, char **argv) {
    if (argc != 1) {
        fprintf(stderr, "coralloc: profile: give one file (coralloc profile FILE)\n");
        return 2;
    }
    FILE *f = fopen(argv[0], "rb");
    if (f == NULL) {
        fprintf(stderr, "coralloc: profile: cannot open %s: %s\n", argv[0], strerror(errno));
        return 1;
    }
    uint8_t *data = NULL;
    size_t len = 0, cap = 0, n;
    do {
        if (len == cap && (data = realloc(data, cap = cap ? 2 * cap : 1 << 16)) == NULL) {
            fprintf(stderr, "coralloc: profile: out of memory\n");
            return 1;
        }
        n = fread(data + len, 1, cap - len, f);
        len += n;
    } while (n > 0);
    fclose(f);
    profile_t pr = {0};
    if (len >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
        fprintf(stderr,
                "coralloc: profile: %s is gzipped: gunzip it first (coralloc writes "
                "it uncompressed)\n",
                argv[0]);
        return 1;
    }
    if (!parse_profile((span_t){data, len}, &pr) || pr.ntypes != 4 ||
        !type_is(&pr, 1, "alloc_space") || !type_is(&pr, 3, "inuse_space")) {
        fprintf(stderr, "coralloc: profile: %s is not a heap profile coralloc wrote\n", argv[0]);
        return 1;
    }
    /* Samples with the same stack (coralloc's own frames, which it leaves
     * out, may differ) count as one site. */
    for (size_t i = 0; i < pr.nsamples; i++)
        for (size_t j = 0; j < i; j++) {
            span_t a = pr.samples[i].locations, c = pr.samples[j].locations;
            if (a.len != c.len || memcmp(a.p, c.p, a.len) != 0) continue;
            for (int k = 0; k < 4; k++) {
                pr.samples[j].values[k] += pr.samples[i].values[k];
                pr.samples[i].values[k] = 0;
            }
            break;
        }
    printf("heap profile %s: %zu sites, one sample per ~%lld bytes allocated (figures are "
           "estimates from the samples)\n",
           argv[0], pr.nsamples, (long long)pr.period);
    print_top(&pr, 3, 2, "in use (not freed when the profile was written)");
    print_top(&pr, 1, 0, "allocated (since the start)");
    free(pr.strings);
    free(pr.func_id);
    free(pr.func_name);
    free(pr.loc_id);
    free(pr.loc_func);
    free(pr.samples);
    free(data);
    return 0;
}
