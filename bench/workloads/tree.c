/* tree: a long-lived AVL tree with nodes of mixed sizes.
 *
 * Each of --threads threads builds its own tree of --nodes nodes, then does
 * --ops operations: delete a random present key, insert a new random key
 * (so the size stays steady), and look up a random key. A node carries a
 * payload of random size (--min to --max bytes, in the node block) and, one
 * node in four, a separately allocated string value. This is the steady-state
 * fragmentation pattern of long-lived data structures. Payloads are checked
 * on every delete; the tree's order, balance, size and all payloads are
 * checked at the end.
 *
 * Figure: ops_per_sec, one op = one delete + one insert + one lookup.
 */
#include "common.h"

typedef struct node_s {
    struct node_s *left, *right;
    uint64_t key;
    uint64_t tag;
    char *value; /* NULL or a string of value_len bytes + NUL */
    uint32_t payload;
    uint16_t value_len;
    int8_t height;
    unsigned char data[];
} node_t;

static long g_nodes = 100000, g_ops = 300000, g_min = 16, g_max = 256, g_seed = 1;

static int height(const node_t *n) { return n ? n->height : 0; }
static void fix(node_t *n) {
    int hl = height(n->left), hr = height(n->right);
    n->height = (int8_t)((hl > hr ? hl : hr) + 1);
}
static node_t *rot_right(node_t *n) {
    node_t *l = n->left;
    n->left = l->right;
    l->right = n;
    fix(n);
    fix(l);
    return l;
}
static node_t *rot_left(node_t *n) {
    node_t *r = n->right;
    n->right = r->left;
    r->left = n;
    fix(n);
    fix(r);
    return r;
}
static node_t *balance(node_t *n) {
    fix(n);
    int b = height(n->left) - height(n->right);
    if (b > 1) {
        if (height(n->left->left) < height(n->left->right)) n->left = rot_left(n->left);
        return rot_right(n);
    }
    if (b < -1) {
        if (height(n->right->right) < height(n->right->left)) n->right = rot_right(n->right);
        return rot_left(n);
    }
    return n;
}

static node_t *new_node(rng_t *rng, uint64_t key) {
    size_t payload = (size_t)rng_range(rng, (uint64_t)g_min, (uint64_t)g_max);
    node_t *n = (node_t *)xmalloc(sizeof(node_t) + payload);
    n->left = n->right = NULL;
    n->key = key;
    n->tag = tag_make(key, 0x7ee);
    n->payload = (uint32_t)payload;
    n->height = 1;
    block_fill(n->data, payload, n->tag);
    n->value = NULL;
    n->value_len = 0;
    if ((rng_next(rng) & 3) == 0) {
        size_t len = (size_t)rng_range(rng, 1, 64);
        n->value = (char *)xmalloc(len + 1);
        for (size_t i = 0; i < len; i++) n->value[i] = (char)('a' + (key + i) % 26);
        n->value[len] = '\0';
        n->value_len = (uint16_t)len;
    }
    return n;
}

static void node_check(const node_t *n) {
    if (!block_ok(n->data, n->payload, n->tag, 0) || n->tag != tag_make(n->key, 0x7ee))
        check_failed("tree: node %llu payload overwritten", (unsigned long long)n->key);
    if (n->value) {
        for (size_t i = 0; i < n->value_len; i++)
            if (n->value[i] != (char)('a' + (n->key + i) % 26))
                check_failed("tree: node %llu value overwritten", (unsigned long long)n->key);
        if (n->value[n->value_len] != '\0') check_failed("tree: node value not terminated");
    }
}

static void node_free(node_t *n) {
    node_check(n);
    free(n->value);
    free(n);
}

/* insert key (absent); returns the new root */
static node_t *insert(node_t *t, node_t *n) {
    if (t == NULL) return n;
    if (n->key < t->key)
        t->left = insert(t->left, n);
    else
        t->right = insert(t->right, n);
    return balance(t);
}

static node_t *remove_min(node_t *t, node_t **min) {
    if (t->left == NULL) {
        *min = t;
        return t->right;
    }
    t->left = remove_min(t->left, min);
    return balance(t);
}

/* remove key (present or not); *out gets the node removed */
static node_t *erase(node_t *t, uint64_t key, node_t **out) {
    if (t == NULL) return NULL;
    if (key < t->key) {
        t->left = erase(t->left, key, out);
    } else if (key > t->key) {
        t->right = erase(t->right, key, out);
    } else {
        *out = t;
        node_t *l = t->left, *r = t->right;
        if (r == NULL) return l;
        node_t *m;
        r = remove_min(r, &m);
        m->left = l;
        m->right = r;
        return balance(m);
    }
    return balance(t);
}

static const node_t *find(const node_t *t, uint64_t key) {
    while (t && t->key != key) t = key < t->key ? t->left : t->right;
    return t;
}

/* check order, balance and payloads; returns the node count */
static long validate(const node_t *t, uint64_t lo, uint64_t hi, int *h) {
    if (t == NULL) {
        *h = 0;
        return 0;
    }
    if (t->key < lo || t->key > hi) check_failed("tree: order broken");
    node_check(t);
    int hl, hr;
    long c = validate(t->left, lo, t->key - 1, &hl) + validate(t->right, t->key + 1, hi, &hr) + 1;
    if (hl - hr > 1 || hr - hl > 1 || t->height != (hl > hr ? hl : hr) + 1)
        check_failed("tree: balance broken");
    *h = t->height;
    return c;
}

static void destroy(node_t *t) {
    if (!t) return;
    destroy(t->left);
    destroy(t->right);
    node_free(t);
}

typedef struct {
    long id;
    uint64_t found;
} targ_t;

static void *worker(void *argp) {
    targ_t *a = (targ_t *)argp;
    rng_t rng;
    rng_seed(&rng, (uint64_t)g_seed * 4099u + (uint64_t)a->id);
    /* keys present, for picking a random one to delete */
    uint64_t *keys = (uint64_t *)xmalloc(sizeof(uint64_t) * (size_t)g_nodes);
    node_t *root = NULL;
    uint64_t next_key = 1;
    for (long i = 0; i < g_nodes; i++) {
        /* unique keys in random-looking order: k * odd constant is a bijection */
        uint64_t k = next_key++ * 0x9e3779b97f4a7c15ULL;
        keys[i] = k;
        root = insert(root, new_node(&rng, k));
    }
    for (long op = 0; op < g_ops; op++) {
        long i = (long)rng_below(&rng, (uint64_t)g_nodes);
        node_t *gone = NULL;
        root = erase(root, keys[i], &gone);
        if (gone == NULL || gone->key != keys[i]) check_failed("tree: key to delete not found");
        node_free(gone);
        uint64_t k = next_key++ * 0x9e3779b97f4a7c15ULL;
        keys[i] = k;
        root = insert(root, new_node(&rng, k));
        const node_t *f = find(root, keys[rng_next(&rng) % (uint64_t)g_nodes]);
        if (f == NULL) check_failed("tree: present key not found");
        a->found += f->payload;
    }
    int h;
    long count = validate(root, 0, UINT64_MAX, &h);
    if (count != g_nodes) check_failed("tree: %ld nodes, expected %ld", count, g_nodes);
    destroy(root);
    free(keys);
    return NULL;
}

int main(int argc, char **argv) {
    long threads = 1;
    opt_t opts[] = {
        {"threads", "threads, each with its own tree", &threads, NULL},
        {"nodes", "nodes per tree (steady state)", &g_nodes, NULL},
        {"ops", "delete+insert+lookup operations per tree", &g_ops, NULL},
        {"min", "smallest node payload (bytes)", &g_min, NULL},
        {"max", "largest node payload (bytes)", &g_max, NULL},
        {"seed", "random seed", &g_seed, NULL},
    };
    OPTS_PARSE(argc, argv, "Long-lived AVL tree with nodes of mixed sizes.", opts);
    if (threads < 1 || g_nodes < 1 || g_min < 1 || g_max < g_min)
        usage_error("tree: need threads >= 1, nodes >= 1, 1 <= min <= max");
    pthread_t *th = (pthread_t *)xmalloc(sizeof(pthread_t) * (size_t)threads);
    targ_t *args = (targ_t *)xmalloc(sizeof(targ_t) * (size_t)threads);
    double t0 = now_sec();
    for (long t = 0; t < threads; t++) {
        args[t].id = t;
        args[t].found = 0;
        xthread_create(&th[t], worker, &args[t]);
    }
    for (long t = 0; t < threads; t++) xthread_join(th[t]);
    double elapsed = now_sec() - t0;
    free(th);
    free(args);
    report_malloc_lib();
    printf("info: threads=%ld nodes=%ld ops=%ld payload=%ld-%ld seconds=%.4f\n", threads, g_nodes,
           g_ops, g_min, g_max, elapsed);
    printf("result: ops_per_sec=%.1f\n", (double)(threads * g_ops) / elapsed);
    return 0;
}
