/* json: a parser-and-builder of many small strings and nodes (single thread).
 *
 * --docs times: build a random JSON document of about --nodes values
 * (objects, arrays, strings with escapes, integers, booleans, nulls),
 * serialize it into a buffer grown with realloc, parse the text back into a
 * new tree (every string and node its own allocation, member arrays grown
 * with realloc), flatten both trees into "path=value" strings, check that
 * the trees, the texts and the flattened strings agree, and free
 * everything. Small, short-lived objects: the cfrac/espresso kind of
 * profile.
 *
 * Figure: ops_per_sec (one op = one document built, printed, parsed,
 * flattened, compared and freed) and mb_per_sec of JSON text parsed.
 */
#include "common.h"

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv_s jv_t;
typedef struct {
    char *key;
    size_t klen;
    jv_t *val;
} member_t;

struct jv_s {
    int type;
    union {
        int b;
        int64_t num;
        struct {
            char *s;
            size_t len;
        } str;
        struct {
            jv_t **items;
            size_t n, cap;
        } arr;
        struct {
            member_t *m;
            size_t n, cap;
        } obj;
    } u;
};

/* ---- growable string buffer ---- */
typedef struct {
    char *p;
    size_t len, cap;
} sbuf_t;

static void sb_grow(sbuf_t *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 16;
    while (cap < b->len + extra + 1) cap *= 2;
    b->p = (char *)xrealloc(b->p, cap);
    b->cap = cap;
}
static void sb_putc(sbuf_t *b, char c) {
    sb_grow(b, 1);
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}
static void sb_put(sbuf_t *b, const char *s, size_t n) {
    sb_grow(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static jv_t *jv_new(int type) {
    jv_t *v = (jv_t *)xmalloc(sizeof(jv_t));
    memset(v, 0, sizeof(*v));
    v->type = type;
    return v;
}

static void jv_free(jv_t *v) {
    switch (v->type) {
    case J_STR:
        free(v->u.str.s);
        break;
    case J_ARR:
        for (size_t i = 0; i < v->u.arr.n; i++) jv_free(v->u.arr.items[i]);
        free(v->u.arr.items);
        break;
    case J_OBJ:
        for (size_t i = 0; i < v->u.obj.n; i++) {
            free(v->u.obj.m[i].key);
            jv_free(v->u.obj.m[i].val);
        }
        free(v->u.obj.m);
        break;
    default:
        break;
    }
    free(v);
}

static void arr_push(jv_t *a, jv_t *v) {
    if (a->u.arr.n == a->u.arr.cap) {
        a->u.arr.cap = a->u.arr.cap ? a->u.arr.cap * 2 : 2;
        a->u.arr.items = (jv_t **)xrealloc(a->u.arr.items, a->u.arr.cap * sizeof(jv_t *));
    }
    a->u.arr.items[a->u.arr.n++] = v;
}

static void obj_push(jv_t *o, char *key, size_t klen, jv_t *v) {
    if (o->u.obj.n == o->u.obj.cap) {
        o->u.obj.cap = o->u.obj.cap ? o->u.obj.cap * 2 : 2;
        o->u.obj.m = (member_t *)xrealloc(o->u.obj.m, o->u.obj.cap * sizeof(member_t));
    }
    member_t *m = &o->u.obj.m[o->u.obj.n++];
    m->key = key;
    m->klen = klen;
    m->val = v;
}

/* ---- random documents ---- */
static char *rand_string(rng_t *r, size_t maxlen, size_t *len_out) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789_-\"\\\n\t/\x01";
    size_t len = (size_t)rng_range(r, 0, maxlen);
    char *s = (char *)xmalloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        uint64_t x = rng_next(r);
        /* mostly letters, sometimes a character that needs escaping */
        s[i] = (x & 15) ? alphabet[x % 26] : alphabet[(x >> 8) % (sizeof(alphabet) - 1)];
    }
    s[len] = '\0';
    *len_out = len;
    return s;
}

static jv_t *gen(rng_t *r, int depth, long *budget) {
    --*budget;
    uint64_t x = rng_next(r) % 100;
    if (depth < 8 && *budget > 0 && x < 25) {
        int is_obj = (x & 1) == 0;
        jv_t *c = jv_new(is_obj ? J_OBJ : J_ARR);
        long n = (long)rng_range(r, 0, 12);
        for (long i = 0; i<n && * budget> 0; i++) {
            jv_t *v = gen(r, depth + 1, budget);
            if (is_obj) {
                size_t klen;
                char *k = rand_string(r, 12, &klen);
                obj_push(c, k, klen, v);
            } else {
                arr_push(c, v);
            }
        }
        return c;
    }
    if (x < 60) {
        jv_t *v = jv_new(J_STR);
        v->u.str.s = rand_string(r, 40, &v->u.str.len);
        return v;
    }
    if (x < 85) {
        jv_t *v = jv_new(J_NUM);
        v->u.num = (int64_t)(rng_next(r) >> (rng_next(r) % 60)) * ((x & 1) ? -1 : 1);
        return v;
    }
    if (x < 95) {
        jv_t *v = jv_new(J_BOOL);
        v->u.b = (int)(x & 1);
        return v;
    }
    return jv_new(J_NULL);
}

/* ---- printing ---- */
static void print_str(sbuf_t *b, const char *s, size_t len) {
    sb_putc(b, '"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            sb_put(b, "\\\"", 2);
            break;
        case '\\':
            sb_put(b, "\\\\", 2);
            break;
        case '\n':
            sb_put(b, "\\n", 2);
            break;
        case '\t':
            sb_put(b, "\\t", 2);
            break;
        default:
            if (c < 0x20) {
                char u[8];
                snprintf(u, sizeof(u), "\\u%04x", c);
                sb_put(b, u, 6);
            } else {
                sb_putc(b, (char)c);
            }
        }
    }
    sb_putc(b, '"');
}

static void print_jv(sbuf_t *b, const jv_t *v) {
    char num[32];
    switch (v->type) {
    case J_NULL:
        sb_put(b, "null", 4);
        break;
    case J_BOOL:
        v->u.b ? sb_put(b, "true", 4) : sb_put(b, "false", 5);
        break;
    case J_NUM:
        sb_put(b, num, (size_t)snprintf(num, sizeof(num), "%lld", (long long)v->u.num));
        break;
    case J_STR:
        print_str(b, v->u.str.s, v->u.str.len);
        break;
    case J_ARR:
        sb_putc(b, '[');
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) sb_putc(b, ',');
            print_jv(b, v->u.arr.items[i]);
        }
        sb_putc(b, ']');
        break;
    case J_OBJ:
        sb_putc(b, '{');
        for (size_t i = 0; i < v->u.obj.n; i++) {
            if (i) sb_putc(b, ',');
            print_str(b, v->u.obj.m[i].key, v->u.obj.m[i].klen);
            sb_putc(b, ':');
            print_jv(b, v->u.obj.m[i].val);
        }
        sb_putc(b, '}');
        break;
    }
}

/* ---- parsing ---- */
typedef struct {
    const char *s;
    size_t pos, len;
} parser_t;

static NORETURN void parse_error(parser_t *p, const char *what) {
    check_failed("json: parse error at %zu: %s", p->pos, what);
}

static void skip_ws(parser_t *p) {
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\n')) p->pos++;
}

static char *parse_str(parser_t *p, size_t *len_out) {
    if (p->s[p->pos] != '"') parse_error(p, "expected a string");
    p->pos++;
    sbuf_t b = {NULL, 0, 0};
    sb_grow(&b, 8);
    for (;;) {
        if (p->pos >= p->len) parse_error(p, "unterminated string");
        char c = p->s[p->pos++];
        if (c == '"') break;
        if (c != '\\') {
            sb_putc(&b, c);
            continue;
        }
        char e = p->s[p->pos++];
        switch (e) {
        case '"':
            sb_putc(&b, '"');
            break;
        case '\\':
            sb_putc(&b, '\\');
            break;
        case '/':
            sb_putc(&b, '/');
            break;
        case 'n':
            sb_putc(&b, '\n');
            break;
        case 't':
            sb_putc(&b, '\t');
            break;
        case 'u': {
            unsigned v = 0;
            for (int i = 0; i < 4; i++) {
                char h = p->s[p->pos++];
                v = v * 16 + (unsigned)(h >= 'a'   ? h - 'a' + 10
                                        : h >= 'A' ? h - 'A' + 10
                                                   : h - '0');
            }
            if (v >= 0x80) parse_error(p, "non-ASCII escape");
            sb_putc(&b, (char)v);
            break;
        }
        default:
            parse_error(p, "bad escape");
        }
    }
    /* shrink to fit, like a real parser keeping the string */
    b.p = (char *)xrealloc(b.p, b.len + 1);
    *len_out = b.len;
    return b.p;
}

static jv_t *parse_jv(parser_t *p) {
    skip_ws(p);
    if (p->pos >= p->len) parse_error(p, "unexpected end");
    char c = p->s[p->pos];
    if (c == '{') {
        jv_t *o = jv_new(J_OBJ);
        p->pos++;
        skip_ws(p);
        if (p->s[p->pos] == '}') {
            p->pos++;
            return o;
        }
        for (;;) {
            skip_ws(p);
            size_t klen;
            char *k = parse_str(p, &klen);
            skip_ws(p);
            if (p->s[p->pos++] != ':') parse_error(p, "expected ':'");
            obj_push(o, k, klen, parse_jv(p));
            skip_ws(p);
            char d = p->s[p->pos++];
            if (d == '}') return o;
            if (d != ',') parse_error(p, "expected ',' or '}'");
        }
    }
    if (c == '[') {
        jv_t *a = jv_new(J_ARR);
        p->pos++;
        skip_ws(p);
        if (p->s[p->pos] == ']') {
            p->pos++;
            return a;
        }
        for (;;) {
            arr_push(a, parse_jv(p));
            skip_ws(p);
            char d = p->s[p->pos++];
            if (d == ']') return a;
            if (d != ',') parse_error(p, "expected ',' or ']'");
        }
    }
    if (c == '"') {
        jv_t *v = jv_new(J_STR);
        v->u.str.s = parse_str(p, &v->u.str.len);
        return v;
    }
    if (c == 't' && strncmp(p->s + p->pos, "true", 4) == 0) {
        p->pos += 4;
        jv_t *v = jv_new(J_BOOL);
        v->u.b = 1;
        return v;
    }
    if (c == 'f' && strncmp(p->s + p->pos, "false", 5) == 0) {
        p->pos += 5;
        return jv_new(J_BOOL);
    }
    if (c == 'n' && strncmp(p->s + p->pos, "null", 4) == 0) {
        p->pos += 4;
        return jv_new(J_NULL);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char *end;
        errno = 0;
        long long n = strtoll(p->s + p->pos, &end, 10);
        if (errno || end == p->s + p->pos) parse_error(p, "bad number");
        p->pos = (size_t)(end - p->s);
        jv_t *v = jv_new(J_NUM);
        v->u.num = (int64_t)n;
        return v;
    }
    parse_error(p, "unexpected character");
}

/* ---- comparing and flattening ---- */
static int jv_equal(const jv_t *a, const jv_t *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case J_NULL:
        return 1;
    case J_BOOL:
        return a->u.b == b->u.b;
    case J_NUM:
        return a->u.num == b->u.num;
    case J_STR:
        return a->u.str.len == b->u.str.len && memcmp(a->u.str.s, b->u.str.s, a->u.str.len) == 0;
    case J_ARR:
        if (a->u.arr.n != b->u.arr.n) return 0;
        for (size_t i = 0; i < a->u.arr.n; i++)
            if (!jv_equal(a->u.arr.items[i], b->u.arr.items[i])) return 0;
        return 1;
    case J_OBJ:
        if (a->u.obj.n != b->u.obj.n) return 0;
        for (size_t i = 0; i < a->u.obj.n; i++) {
            const member_t *x = &a->u.obj.m[i], *y = &b->u.obj.m[i];
            if (x->klen != y->klen || memcmp(x->key, y->key, x->klen) != 0 ||
                !jv_equal(x->val, y->val))
                return 0;
        }
        return 1;
    }
    return 0;
}

/* Every leaf becomes a freshly allocated "a.b.3.c=value" string; they are
 * hashed (FNV-1a) and freed in batches. */
typedef struct {
    char **lines;
    size_t n, cap;
    uint64_t hash;
    uint64_t count;
} flat_t;

static void flat_flush(flat_t *f) {
    for (size_t i = 0; i < f->n; i++) {
        for (const char *c = f->lines[i]; *c; c++)
            f->hash = (f->hash ^ (unsigned char)*c) * 0x100000001b3ULL;
        free(f->lines[i]);
    }
    f->n = 0;
}

static void flatten(flat_t *f, const jv_t *v, const char *path, size_t plen) {
    if (v->type == J_ARR || v->type == J_OBJ) {
        size_t n = v->type == J_ARR ? v->u.arr.n : v->u.obj.n;
        for (size_t i = 0; i < n; i++) {
            char idx[24];
            const char *seg;
            size_t slen;
            if (v->type == J_ARR) {
                slen = (size_t)snprintf(idx, sizeof(idx), "%zu", i);
                seg = idx;
            } else {
                seg = v->u.obj.m[i].key;
                slen = v->u.obj.m[i].klen;
            }
            char *sub = (char *)xmalloc(plen + slen + 2);
            memcpy(sub, path, plen);
            sub[plen] = '.';
            memcpy(sub + plen + 1, seg, slen);
            sub[plen + slen + 1] = '\0';
            flatten(f, v->type == J_ARR ? v->u.arr.items[i] : v->u.obj.m[i].val, sub,
                    plen + slen + 1);
            free(sub);
        }
        return;
    }
    sbuf_t b = {NULL, 0, 0};
    sb_put(&b, path, plen);
    sb_putc(&b, '=');
    print_jv(&b, v);
    if (f->n == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 64;
        f->lines = (char **)xrealloc(f->lines, f->cap * sizeof(char *));
    }
    f->lines[f->n++] = b.p;
    f->count++;
    if (f->n >= 256) flat_flush(f);
}

static void flat_done(flat_t *f) {
    flat_flush(f);
    free(f->lines);
}

int main(int argc, char **argv) {
    long docs = 300, nodes = 2000, seed = 1;
    opt_t opts[] = {
        {"docs", "documents built, printed, parsed and compared", &docs, NULL},
        {"nodes", "values per document (about)", &nodes, NULL},
        {"seed", "random seed", &seed, NULL},
    };
    OPTS_PARSE(argc, argv, "JSON builder and parser: many small strings and nodes.", opts);
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    double text_bytes = 0;
    uint64_t leaves = 0;
    double t0 = now_sec();
    for (long d = 0; d < docs; d++) {
        long budget = nodes;
        jv_t *doc = jv_new(J_ARR);
        while (budget > 0) arr_push(doc, gen(&rng, 1, &budget));
        sbuf_t text = {NULL, 0, 0};
        print_jv(&text, doc);
        parser_t p = {text.p, 0, text.len};
        jv_t *back = parse_jv(&p);
        if (p.pos != text.len) check_failed("json: trailing text after the document");
        if (!jv_equal(doc, back)) check_failed("json: document %ld parsed back differs", d);
        sbuf_t text2 = {NULL, 0, 0};
        print_jv(&text2, back);
        if (text2.len != text.len || memcmp(text.p, text2.p, text.len) != 0)
            check_failed("json: document %ld printed back differs", d);
        flat_t f1 = {NULL, 0, 0, 0xcbf29ce484222325ULL, 0}, f2 = f1;
        flatten(&f1, doc, "$", 1);
        flatten(&f2, back, "$", 1);
        flat_done(&f1);
        flat_done(&f2);
        if (f1.hash != f2.hash || f1.count != f2.count)
            check_failed("json: document %ld flattened differently", d);
        leaves += f1.count;
        text_bytes += (double)text.len;
        free(text.p);
        free(text2.p);
        jv_free(doc);
        jv_free(back);
    }
    double elapsed = now_sec() - t0;
    report_malloc_lib();
    printf("info: docs=%ld nodes=%ld leaves=%llu text_mib=%.2f seconds=%.4f\n", docs, nodes,
           (unsigned long long)leaves, text_bytes / 1048576.0, elapsed);
    printf("result: ops_per_sec=%.1f mb_per_sec=%.2f\n", (double)docs / elapsed,
           text_bytes / 1048576.0 / elapsed);
    return 0;
}
