/* The program tests/valgrind/run_requests.py runs under memcheck, linked
 * with coralloc built with its Valgrind client requests (CORAL_VALGRIND=1),
 * through the coral_ names (which valgrind never redirects: every call is
 * coralloc's). `requests MODE`:
 *   clean         every kind of block made, used, resized and freed
 *                 correctly, on two threads, with a user heap destroyed
 *                 whole: memcheck must report no error and no leak;
 *   leak          a block lost: memcheck must report it definitely lost;
 *   read-freed    a block read after its free: an invalid read;
 *   double-free   a block freed twice: an invalid free. */
#include "coralloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void *volatile sink;

static void use(void *p, size_t n) {
    memset(p, 0x5a, n);
    sink = p;
}

static void *free_remote(void *p) {
    coral_free(p);
    return NULL;
}

static int clean(void) {
    enum { N = 200 };
    void *blocks[N];
    for (int i = 0; i < N; i++) {
        size_t n = (size_t)(i * 37 % 5000) + 1;
        blocks[i] = coral_malloc(n);
        use(blocks[i], n);
    }
    unsigned char *z = coral_calloc(100, 10); /* reads of calloc'd memory are defined */
    int sum = 0;
    for (int i = 0; i < 1000; i++) sum += z[i];
    coral_free(z);
    char *r = coral_malloc(100);
    use(r, 100);
    r = coral_realloc(r, 60); /* kept in place */
    use(r, 60);
    r = coral_realloc(r, 3000); /* moved */
    use(r, 3000);
    r = coral_realloc(r, 1 << 20); /* large */
    use(r, 1 << 20);
    r = coral_realloc(r, (1 << 20) + (1 << 17)); /* large, grown in place */
    use(r, (1 << 20) + (1 << 17));
    r = coral_realloc(r, 8 << 20); /* huge */
    use(r, 8 << 20);
    r = coral_realloc(r, 24 << 20); /* huge, grown */
    use(r, 24 << 20);
    coral_free(r);
    void *a = coral_aligned_alloc(4096, 10000);
    use(a, 10000);
    coral_free(a);
    void *bulk[64];
    size_t got = coral_malloc_bulk(48, 64, bulk);
    for (size_t i = 0; i < got; i++) use(bulk[i], 48);
    coral_free_bulk(bulk, got);
    coral_heap_t *heap = coral_heap_new();
    for (int i = 0; i < 100; i++) use(coral_heap_malloc(heap, 100), 100); /* live at destroy */
    use(coral_heap_malloc(heap, 6 << 20), 6 << 20);
    coral_heap_destroy(heap);
    pthread_t t;
    pthread_create(&t, NULL, free_remote, blocks[0]);
    pthread_join(t, NULL);
    for (int i = 1; i < N; i++) coral_free(blocks[i]);
    coral_collect(1);
    return sum; /* 0 */
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (strcmp(argv[1], "clean") == 0) return clean();
    if (strcmp(argv[1], "leak") == 0) {
        /* (Not the first block of its page: the page's descriptor holds
         * that one's address, which memcheck's leak scan finds.) */
        char *first = coral_malloc(4000), *p = coral_malloc(4000);
        use(p, 4000);
        sink = NULL;
        p = NULL;
        coral_free(first);
        return 0;
    }
    if (strcmp(argv[1], "read-freed") == 0) {
        char *p = coral_malloc(64), *keep = coral_malloc(64);
        use(p, 64);
        coral_free(p);
        sink = (void *)(uintptr_t)((volatile char *)p)[8];
        coral_free(keep);
        return 0;
    }
    if (strcmp(argv[1], "double-free") == 0) {
        char *p = coral_malloc(64), *keep = coral_malloc(64);
        use(p, 64);
        coral_free(p);
        coral_free(keep);
        coral_free(sink = p);
        return 0;
    }
    return 2;
}
