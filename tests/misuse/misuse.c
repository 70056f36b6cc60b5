/* One misuse of the allocator per case, for tests/misuse/run_misuse.py:
 * `misuse CASE` does it through the standard names (so that the same
 * program runs under glibc or under a preloaded allocator), then goes on
 * allocating and freeing a little, and exits 0 if it got that far. What the
 * allocator does about it (abort with a message, a fault, or nothing) is
 * what the runner records. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <dlfcn.h>

/* C23's sized frees, where the allocator has them (glibc 2.36 does not:
 * exit 3, "not available"). */
static void *c23_call(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    if (f == NULL) exit(3);
    return f;
}

/* Keep the compiler from reasoning about the blocks. */
static void *volatile sink;
static void *launder(void *p) {
    sink = p;
    return sink;
}

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static void churn(size_t size) {
    void *a[64];
    for (int i = 0; i < 64; i++) a[i] = malloc(size);
    for (int i = 0; i < 64; i++) free(a[i]);
}

static void double_free(size_t size) {
    void *p = launder(malloc(size));
    free(p);
    free(p);
}

static void double_free_delayed(size_t size) {
    void *p = launder(malloc(size)), *q = malloc(size), *r = malloc(size);
    free(p);
    free(q);
    free(r);
    free(p);
}

/* A block of a page that has since been released (all its blocks freed,
 * behind the front 256 KiB of its class queue, which the heap keeps) freed
 * again. Freed last to first, a[100]'s page empties last, behind the kept
 * ones. */
static void double_free_released(void) {
    enum { N = 8000 }; /* six pages of 48-byte blocks */
    static void *a[N];
    void *keep = malloc(48);
    for (int i = 0; i < N; i++) a[i] = malloc(48);
    for (int i = N - 1; i >= 0; i--) free(a[i]);
    free(launder(a[100]));
    free(keep);
}

static void *free_in_thread(void *p) {
    free(p);
    return NULL;
}

static void double_free_remote(void) {
    void *p = launder(malloc(64));
    void *keep = malloc(64); /* the page stays in use */
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, p);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, free_in_thread, p);
    pthread_join(t, NULL);
    free(keep);
}

/* Another thread frees p, q, then p again: p is twice on its page's list
 * of remote frees, found when the owner takes the list (the page's blocks
 * run out below). */
static void *free_p_q_p(void *arg) {
    void **pq = arg;
    free(pq[0]);
    free(pq[1]);
    free(pq[0]);
    return NULL;
}

/* A thread frees two blocks, then p (another thread's blocks of one page),
 * and before that thread exits, p is freed again: by a second thread, or by
 * its owner. In the default build the first free of p is held in the first
 * thread's run of remote frees (api/remote_run.h), found changed when its
 * exit pushes the run; the secure build finds its freed mark at the second
 * free. */
static pthread_barrier_t pending_freed, pending_second_done;

static void *free_then_wait(void *qqp) {
    void **qqp_ = qqp;
    for (int i = 0; i < 3; i++) free(qqp_[i]); /* the third free in a row into a page opens a run */
    pthread_barrier_wait(&pending_freed);
    pthread_barrier_wait(&pending_second_done);
    return NULL;
}

static void double_free_while_pending(int by_owner) {
    void *qqp[3] = {malloc(64), malloc(64), launder(malloc(64))};
    void *p = qqp[2];
    void *keep = malloc(64); /* the page stays in use */
    pthread_barrier_init(&pending_freed, NULL, 2);
    pthread_barrier_init(&pending_second_done, NULL, 2);
    pthread_t first, second;
    pthread_create(&first, NULL, free_then_wait, qqp);
    pthread_barrier_wait(&pending_freed);
    if (by_owner) {
        free(p);
    } else {
        pthread_create(&second, NULL, free_in_thread, p);
        pthread_join(second, NULL);
    }
    pthread_barrier_wait(&pending_second_done);
    pthread_join(first, NULL);
    free(keep);
}
static void double_free_pending_remote(void) { double_free_while_pending(0); }
static void double_free_pending_owner(void) { double_free_while_pending(1); }

static void double_free_remote_delayed(void) {
    enum { N = 4000 }; /* more 48-byte blocks than a page holds */
    static void *a[N];
    void *pq[2] = {launder(malloc(48)), malloc(48)};
    void *keep = malloc(48); /* the page stays in use */
    pthread_t t;
    pthread_create(&t, NULL, free_p_q_p, pq);
    pthread_join(t, NULL);
    for (int i = 0; i < N; i++) a[i] = malloc(48);
    for (int i = 0; i < N; i++) free(a[i]);
    free(keep);
}

static void free_stack(void) {
    char buf[64];
    free(launder(buf));
}

static char static_buf[64];
static void free_static(void) { free(launder(static_buf)); }

static void free_mmap(void) {
    void *m = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    free((char *)m + 4096);
}

static void free_interior(size_t size) {
    char *p = launder(malloc(size));
    free(p + 16);
}

static void realloc_after_free(void) {
    void *p = launder(malloc(64));
    free(p);
    p = realloc(p, 200);
    free(p);
}

static void realloc_foreign(void) {
    char buf[64];
    free(realloc(launder(buf), 200));
}

static void overflow(size_t size, size_t by) {
    char *p = launder(malloc(size));
    size_t usable = malloc_usable_size(p);
    memset(p + usable, 0x5a, by);
    free(p);
    churn(size);
}

static void write_after_free(size_t size) {
    char *p = launder(malloc(size));
    free(p);
    memset(p, 0x5a, size < 64 ? size : 64);
    churn(size);
}

/* Past the first word of a block freed some time ago: what a stale
 * pointer's field write does. */
static void write_after_free_tail(void) {
    char *p = launder(malloc(48));
    void *keep[8];
    free(p);
    for (int i = 0; i < 8; i++) keep[i] = malloc(48); /* others come and go */
    for (int i = 0; i < 8; i++) free(keep[i]);
    p[24] = 0x5a;
    churn(48);
}

static void read_after_free_huge(void) {
    volatile char *p = launder(malloc(16 * MiB));
    p[8 * MiB] = 1;
    free((void *)p);
    sink = (void *)(uintptr_t)p[8 * MiB];
}

/* The program goes on with huge blocks of the same size after the free:
 * 8 come and go, one stays. Where a freed block's address is handed out
 * again, the stale pointer reaches another live block. */
static char *huge_reuse_after_free(void) {
    for (int i = 0; i < 8; i++) {
        char *q = malloc(16 * MiB);
        q[8 * MiB] = 2;
        free(q);
    }
    char *q = launder(malloc(16 * MiB));
    q[8 * MiB] = 2;
    return q;
}

static void read_after_free_huge_reused(void) {
    volatile char *p = launder(malloc(16 * MiB));
    p[8 * MiB] = 1;
    free((void *)p);
    char *q = huge_reuse_after_free();
    sink = (void *)(uintptr_t)p[8 * MiB];
    free(q);
}

static void write_after_free_huge_reused(void) {
    volatile char *p = launder(malloc(16 * MiB));
    p[8 * MiB] = 1;
    free((void *)p);
    char *q = huge_reuse_after_free();
    p[8 * MiB] = 0x5a;
    free(q);
}

static void double_free_huge_reused(void) {
    char *p = launder(malloc(16 * MiB));
    p[8 * MiB] = 1;
    free(p);
    char *q = huge_reuse_after_free();
    free(p);
    free(q);
}

static void malloc0_write(void) {
    char *p = launder(malloc(0));
    memset(p, 0x5a, 32);
    free(p);
    churn(16);
}

static void malloc0_read(void) {
    volatile char *p = launder(malloc(0));
    sink = (void *)(uintptr_t)p[0];
    free((void *)p);
}

static void sized_mismatch(void) {
    void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))c23_call("free_sized");
    void *p = launder(malloc(32));
    free_sized(p, 4000);
}

static void aligned_sized_mismatch(void) {
    void (*free_aligned_sized)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))c23_call("free_aligned_sized");
    char *p = launder(aligned_alloc(64, 128));
    free_aligned_sized(p + 16, 64, 64);
}

/* A pointer one byte past a block's start, on a fresh page. */
static void free_plus1(size_t size) {
    char *p = launder(malloc(size));
    free(p + 1);
}

/* Two blocks freed, then the first again (the second is the one freed
 * last, so only a freed mark in the first finds it). */
static void double_free_pqp(size_t size) {
    void *p = launder(malloc(size)), *q = malloc(size);
    free(p);
    free(q);
    free(p);
}

/* A pointer 16 KiB into the same segment: free space or another page's
 * block, never a block handed out by the malloc above. */
static void free_space(void) {
    char *p = launder(malloc(16));
    free(p + 4096 * 4);
}

static void usable_free_space(void) {
    char *p = launder(malloc(16));
    sink = (void *)malloc_usable_size(p + 4096 * 4);
}

static void usable_interior(void) {
    char *p = launder(malloc(48));
    sink = (void *)malloc_usable_size(p + 16);
}

static void usable_after_free(void) {
    void *p = launder(malloc(48)), *q = malloc(48);
    free(p);
    free(q);
    sink = (void *)malloc_usable_size(p);
}

/* C++'s sized deletes, as a C++ program calls them: the first definition
 * in the process (a preloaded allocator's, else libstdc++'s, loaded here
 * as a C++ program has it; exit 3 without one). */
static void *cxx_call(const char *name) {
    if (dlopen("libstdc++.so.6", RTLD_NOW | RTLD_GLOBAL) == NULL) exit(3);
    return c23_call(name);
}

/* A 32-byte block given to the sized delete `name` with 4096 bytes. */
static void sized_delete_mismatch(const char *name) {
    void (*sized_delete)(void *, size_t) = (void (*)(void *, size_t))cxx_call(name);
    sized_delete(launder(malloc(32)), 4096);
}

/* A 64-byte block aligned to 64 given to the aligned sized delete `name`
 * with 4096 bytes. */
static void aligned_sized_delete_mismatch(const char *name) {
    void (*aligned_delete)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))cxx_call(name);
    aligned_delete(launder(aligned_alloc(64, 64)), 4096, 64);
}

static void cxx_sized_delete_mismatch(void) { sized_delete_mismatch("_ZdlPvm"); }
static void cxx_aligned_sized_delete_mismatch(void) {
    aligned_sized_delete_mismatch("_ZdlPvmSt11align_val_t");
}

/* The secure build's freed mark lies in the word after the usable bytes:
 * one bit of it flipped after the free (a stray write), then the block
 * freed again. */
static void double_free_bitflip(void) {
    unsigned char *p = launder(malloc(100));
    size_t usable = malloc_usable_size(p);
    free(p);
    p[usable] ^= 1;
    free(p);
}

/* The attack on the secure build's links: b's link, read after its free
 * (by another thread: on its page's list at once), gives the list key (link = next ^ key ^ b, next
 * being a); a link forged with it to a live block of another class (whose first word, the
 * attacker's data, encodes the end of the list), then two mallocs of b's
 * class. With no encoding (the default build, glibc's other scheme) the
 * forged link is the victim's address, or garbage. */
static void forge_link(void) {
    uintptr_t a, b;
    do { /* two blocks of one 64 KiB slice: one page, so b's link is a */
        a = (uintptr_t)launder(malloc(8));
        b = (uintptr_t)malloc(8);
    } while ((a >> 16) != (b >> 16));
    char *victim = malloc(200);
    memset(victim, 'v', 200);
    /* Freed by another thread: pushed on the page's list of remote frees
     * at once (the secure build's owner frees wait in its ring of freed
     * blocks before their page's list), b linking to a. */
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, (void *)a);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, free_in_thread, (void *)b);
    pthread_join(t, NULL);
    uintptr_t key = *(volatile uintptr_t *)b ^ a ^ b;
    *(volatile uintptr_t *)b = (uintptr_t)victim ^ key ^ b;
    *(volatile uintptr_t *)victim = key ^ (uintptr_t)victim; /* a link that ends the list */
    /* The owner takes the remote frees once its own list is empty: b is
     * handed out, then what its link leads to. */
    for (int i = 0; i < 100000; i++) {
        if ((uintptr_t)launder(malloc(8)) != b) continue;
        char *got = malloc(8);
        if (got == victim) memset(got, 'x', 8); /* two live blocks overlap */
        return;
    }
}

/* A block of a first-class heap (coralloc's own calls: exit 3 without
 * them) overflowed by one byte, never freed: the heap destroyed. */
static void overflow_heap_destroy(void) {
    void *(*heap_new)(void) = (void *(*)(void))c23_call("coral_heap_new");
    void *(*heap_malloc)(void *, size_t) = (void *(*)(void *, size_t))c23_call("coral_heap_malloc");
    void (*heap_destroy)(void *) = (void (*)(void *))c23_call("coral_heap_destroy");
    void *heap = heap_new();
    char *p = launder(heap_malloc(heap, 100));
    memset(p, 'A', malloc_usable_size(p) + 1);
    heap_destroy(heap);
}

/* A large block allocated with an alignment above 64 KiB, freed 4 KiB
 * inside. */
static void interior_large_aligned(void) {
    char *p = launder(aligned_alloc(256 * KiB, 600 * KiB));
    free(p + 4096);
}

/* Zero-size aligned requests: a byte written to what they return. */
static void aligned_alloc0_write(void) { *(volatile char *)launder(aligned_alloc(64, 0)) = 1; }
static void posix_memalign0_write(void) {
    void *p = NULL;
    if (posix_memalign(&p, 32, 0) != 0) exit(1);
    *(volatile char *)launder(p) = 1;
}
static void memalign0_write(void) { *(volatile char *)launder(memalign(4096, 0)) = 1; }

static void *free_plus16_in_thread(void *p) {
    free((char *)p + 16);
    return NULL;
}

/* Another thread frees a pointer inside a block of this thread's page. */
static void interior_remote(size_t size) {
    void *p = launder(malloc(size));
    void *keep = malloc(size);
    pthread_t t;
    pthread_create(&t, NULL, free_plus16_in_thread, p);
    pthread_join(t, NULL);
    free(keep);
}

/* Allocates n blocks of size bytes, all kept, and stops the program
 * (abort, with no allocator's message) if one is handed out twice. */
static void allocate_checking_twice(size_t size, int n) {
    static void *a[4000];
    for (int i = 0; i < n; i++) {
        a[i] = malloc(size);
        for (int k = 0; k < i; k++)
            if (a[k] == a[i]) {
                fprintf(stderr, "misuse: block %p handed out twice\n", a[i]);
                abort();
            }
    }
}

/* The owner frees p, then another thread frees it again; then the owner
 * allocates more blocks than the page holds, all kept. */
static void double_free_owner_then_remote(void) {
    void *p = launder(malloc(48)), *keep = malloc(48);
    free(p);
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, p);
    pthread_join(t, NULL);
    allocate_checking_twice(48, 1500);
    free(keep);
}

/* Issue 32, item 4: another thread frees b; the owner takes the page's
 * remote frees (coral_collect), so b is on its local list; a third thread
 * frees y, a fourth frees b again. With marks tied to a generation of the
 * remote list, the second push of b looked new (the owner had moved on),
 * the list b -> y was joined to the one already holding b, and malloc
 * handed b out twice; the freed mark finds it whatever came between. */
static void double_free_remote_across_take(void) {
    void (*collect)(int) = (void (*)(int))c23_call("coral_collect");
    void *b = launder(malloc(48)), *y = malloc(48), *keep = malloc(48);
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, b);
    pthread_join(t, NULL);
    collect(0);
    pthread_create(&t, NULL, free_in_thread, y);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, free_in_thread, b);
    pthread_join(t, NULL);
    allocate_checking_twice(48, 1500); /* more than the page's blocks: its lists are taken */
    free(keep);
}

typedef void (*free_bulk_fn)(void **, size_t);
typedef size_t (*malloc_bulk_fn)(size_t, size_t, void **);

/* One block given to coral_free_bulk eight times (one stretch). */
static void bulk_same_8(void) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    void *keep = malloc(64);
    void *p = launder(malloc(64));
    void *a[8] = {p, p, p, p, p, p, p, p};
    free_bulk(a, 8);
    free(keep);
}

/* free(p), then coral_free_bulk(&p, 1) for a class the bulk cache takes. */
static void bulk_after_free(void) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    malloc_bulk_fn malloc_bulk = (malloc_bulk_fn)c23_call("coral_malloc_bulk");
    void *a[64];
    size_t got = malloc_bulk(64, 64, a); /* the class the cache takes */
    void *p = launder(a[10]);
    free(p);
    void *b[1] = {p};
    free_bulk(b, 1);
    for (size_t i = 0; i < got; i++)
        if (i != 10) free(a[i]);
    got = malloc_bulk(64, 64, a);
    free_bulk(a, got);
}

static void *bulk_free_interior_in_thread(void *p) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    void *a[1] = {(char *)p + 4096};
    free_bulk(a, 1);
    return NULL;
}

/* Another thread gives coral_free_bulk a pointer inside this thread's
 * large block. */
static void bulk_interior_remote_large(void) {
    (void)c23_call("coral_free_bulk");
    void *p = launder(malloc(256 * KiB));
    pthread_t t;
    pthread_create(&t, NULL, bulk_free_interior_in_thread, p);
    pthread_join(t, NULL);
    free(p);
}

/* Large blocks after their free (issue 33): a read, or a write, through
 * the stale pointer after work that does not reuse the block. The secure
 * build serves requests of 256 KiB and up as large blocks and keeps a
 * freed one inaccessible in its heap's quarantine; a 64 KiB block is one
 * of a size class there, readable after its free. */
static void unrelated_allocations(void) {
    static void *keep[2000]; /* more 128-byte blocks than a fresh page has: a slow path */
    for (int i = 0; i < 2000; i++) keep[i] = malloc(128);
    sink = keep[1999];
    for (int i = 0; i < 100000; i++) free(launder(malloc(128)));
    void *big = malloc(100 * KiB);
    free(big);
}

static volatile char *freed_large(size_t size) {
    volatile char *p = launder(malloc(size));
    memset((void *)p, 7, size);
    free((void *)p);
    return p;
}

static void read_after_free_large_of(size_t size) {
    volatile char *p = freed_large(size);
    unrelated_allocations();
    sink = (void *)(uintptr_t)p[size / 2];
}

static void write_after_free_large_noreuse_of(size_t size) {
    volatile char *p = freed_large(size);
    p[65] = 'a';
    for (int i = 0; i < 100000; i++) free(launder(malloc(128)));
}

static void read_after_free_large(void) { read_after_free_large_of(256 * KiB); }
static void read_after_free_large_64k(void) { read_after_free_large_of(64 * KiB); }
static void read_after_free_large_1m(void) { read_after_free_large_of(1 * MiB); }
static void waf_large_noreuse(void) { write_after_free_large_noreuse_of(256 * KiB); }
static void waf_large_noreuse_64k(void) { write_after_free_large_noreuse_of(64 * KiB); }
static void waf_large_noreuse_1m(void) { write_after_free_large_noreuse_of(1 * MiB); }

/* Another thread frees this thread's 256 KiB block; this thread goes on
 * allocating (its slow paths take the other thread's frees back), then
 * reads or writes the block. */
static void after_remote_free_large(int write) {
    volatile char *p = launder(malloc(256 * KiB));
    memset((void *)p, 7, 256 * KiB);
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, (void *)p);
    pthread_join(t, NULL);
    unrelated_allocations();
    if (write)
        p[65] = 'a';
    else
        sink = (void *)(uintptr_t)p[128 * KiB];
}

static void read_after_free_large_remote(void) { after_remote_free_large(0); }
static void write_after_free_large_remote(void) { after_remote_free_large(1); }

/* The stale pointer read by another thread than the one that freed it. */
static void *read_in_thread(void *p) {
    sink = (void *)(uintptr_t)((volatile char *)p)[1000];
    return NULL;
}

static void read_after_free_large_other_thread(void) {
    volatile char *p = freed_large(256 * KiB);
    pthread_t t;
    pthread_create(&t, NULL, read_in_thread, (void *)p);
    pthread_join(t, NULL);
}

/* Issue 33, the neighbours of its cases: the same misuse in each size
 * range (small 48 bytes, medium 2000, large 256 KiB, huge 16 MiB), by the
 * owning thread and by another one, through each entry that frees. */
static const size_t range_size[] = {48, 2000, 256 * KiB, 16 * MiB};
enum { SMALL, MEDIUM, LARGE, HUGE };

/* Another thread frees p, q, then p again; the owner then allocates more
 * blocks of the size than a page holds, all kept (its pages' lists of
 * remote frees are taken on the way). */
static void double_free_pqp_remote(int range, int n) {
    size_t size = range_size[range];
    void *pq[2] = {launder(malloc(size)), malloc(size)};
    void *keep = malloc(size);
    pthread_t t;
    pthread_create(&t, NULL, free_p_q_p, pq);
    pthread_join(t, NULL);
    allocate_checking_twice(size, n);
    free(keep);
}

/* A block start that no malloc handed out: eight blocks of the size
 * taken (the block size is the least distance between two of them), the
 * pointer one block past the highest. */
static void *never_handed_out_after(size_t size, void *b[8]) {
    uintptr_t top = 0, step = SIZE_MAX;
    for (int i = 0; i < 8; i++) {
        b[i] = launder(malloc(size));
        if ((uintptr_t)b[i] > top) top = (uintptr_t)b[i];
    }
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 8; k++)
            if ((uintptr_t)b[k] > (uintptr_t)b[i] && (uintptr_t)b[k] - (uintptr_t)b[i] < step)
                step = (uintptr_t)b[k] - (uintptr_t)b[i];
    return (void *)(top + step);
}

static void *never_handed_out(size_t size) {
    void *b[8];
    return never_handed_out_after(size, b);
}

static void free_never_handed_out(size_t size) { free(never_handed_out(size)); }

/* The same, freed by another thread; the owner then allocates more
 * blocks than the page holds (its lists are taken). */
static void free_never_handed_out_remote(size_t size) {
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, never_handed_out(size));
    pthread_join(t, NULL);
    allocate_checking_twice(size, 1500);
}

/* The same after other frees by that thread into the same page, so that
 * the freer holds them in a run of remote frees (src/api/remote_run.h)
 * when it comes to the block never handed out: it must go the checked
 * way, not into the run. */
typedef struct {
    void *live[4], *never;
} run_then_never_t;

static void *free_run_then_never(void *arg) {
    run_then_never_t *r = arg;
    for (int i = 0; i < 4; i++) free(r->live[i]);
    free(r->never);
    return NULL;
}

static void free_never_handed_out_remote_run(size_t size) {
    run_then_never_t r;
    void *b[8];
    r.never = never_handed_out_after(size, b);
    for (int i = 0; i < 4; i++) r.live[i] = b[i];
    pthread_t t;
    pthread_create(&t, NULL, free_run_then_never, &r);
    pthread_join(t, NULL);
    allocate_checking_twice(size, 1500);
}

/* The same, given to coral_free_bulk by the owner. */
static void bulk_never_handed_out(size_t size) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    void *a[1] = {never_handed_out(size)};
    free_bulk(a, 1);
    allocate_checking_twice(size, 1500);
}

/* A pointer 512 KiB past a large block's start: free slices of its
 * segment, another span or no segment, never a block handed out. */
static void free_space_large(void) {
    char *p = launder(malloc(256 * KiB));
    free(p + 512 * KiB);
}

static void usable_interior_of(size_t size) {
    char *p = launder(malloc(size));
    sink = (void *)malloc_usable_size(p + 4096);
}

static void usable_after_free_of(size_t size) {
    void *p = launder(malloc(size)), *q = malloc(size);
    free(p);
    free(q);
    sink = (void *)malloc_usable_size(p);
}

/* coral_free_bulk given one interior pointer by the owner. */
static void bulk_interior(size_t size) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    char *p = launder(malloc(size));
    void *a[1] = {p + 16};
    free_bulk(a, 1);
}

static void *bulk_free_plus16_in_thread(void *p) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    void *a[1] = {(char *)p + 16};
    free_bulk(a, 1);
    return NULL;
}

/* Another thread gives coral_free_bulk a pointer 16 bytes inside this
 * thread's block. */
static void bulk_interior_remote(size_t size) {
    (void)c23_call("coral_free_bulk");
    void *p = launder(malloc(size)), *keep = malloc(size);
    pthread_t t;
    pthread_create(&t, NULL, bulk_free_plus16_in_thread, p);
    pthread_join(t, NULL);
    free(keep);
}

/* free(p), then coral_free_bulk(&p, 1). */
static void bulk_after_free_of(size_t size) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    void *keep = malloc(size);
    void *p = launder(malloc(size));
    free(p);
    void *a[1] = {p};
    free_bulk(a, 1);
    free(keep);
}

/* coral_free_bulk given p, q, p. */
static void bulk_pqp(size_t size) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    void *keep = malloc(size);
    void *p = launder(malloc(size)), *q = malloc(size);
    void *a[3] = {p, q, p};
    free_bulk(a, 3);
    free(keep);
}

/* Every C++ delete the shared library defines, or libstdc++ defines over
 * one of them, given a pointer 64 bytes inside a 128-byte block aligned
 * to 64 (so that the aligned deletes' own alignment check passes). */
typedef void (*delete_fn)(void *);
typedef void (*delete_tag_fn)(void *, const void *);
typedef void (*delete_al_fn)(void *, size_t);
typedef void (*delete_al_tag_fn)(void *, size_t, const void *);
static char nothrow_tag; /* std::nothrow_t is empty: its address is all */

static char *interior_aligned_64(void) { return (char *)launder(aligned_alloc(64, 128)) + 64; }

static void cxx_delete_interior(void) { ((delete_fn)cxx_call("_ZdlPv"))(interior_aligned_64()); }
static void cxx_delete_array_interior(void) {
    ((delete_fn)cxx_call("_ZdaPv"))(interior_aligned_64());
}
static void cxx_delete_nothrow_interior(void) {
    ((delete_tag_fn)cxx_call("_ZdlPvRKSt9nothrow_t"))(interior_aligned_64(), &nothrow_tag);
}
static void cxx_delete_array_nothrow_interior(void) {
    ((delete_tag_fn)cxx_call("_ZdaPvRKSt9nothrow_t"))(interior_aligned_64(), &nothrow_tag);
}
static void cxx_aligned_delete_interior(void) {
    ((delete_al_fn)cxx_call("_ZdlPvSt11align_val_t"))(interior_aligned_64(), 64);
}
static void cxx_aligned_array_delete_interior(void) {
    ((delete_al_fn)cxx_call("_ZdaPvSt11align_val_t"))(interior_aligned_64(), 64);
}
static void cxx_aligned_nothrow_delete_interior(void) {
    ((delete_al_tag_fn)cxx_call("_ZdlPvSt11align_val_tRKSt9nothrow_t"))(interior_aligned_64(), 64,
                                                                        &nothrow_tag);
}
static void cxx_aligned_array_nothrow_delete_interior(void) {
    ((delete_al_tag_fn)cxx_call("_ZdaPvSt11align_val_tRKSt9nothrow_t"))(interior_aligned_64(), 64,
                                                                        &nothrow_tag);
}
static void cxx_array_sized_delete_mismatch(void) { sized_delete_mismatch("_ZdaPvm"); }
static void cxx_aligned_array_sized_delete_mismatch(void) {
    aligned_sized_delete_mismatch("_ZdaPvmSt11align_val_t");
}

static void realloc_interior(void) {
    char *p = launder(malloc(48));
    free(realloc(p + 16, 200));
}

static void free_sized_interior(void) {
    void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))c23_call("free_sized");
    char *p = launder(malloc(48));
    free_sized(p + 16, 32);
}

/* The write after free without reuse: a byte at `offset` of a
 * freed block of `size` bytes written, then 100,000 malloc+free pairs of
 * `churn_size` bytes (of the same size: the block freed last is reused
 * first, so the stale block comes back at once or never). */
static void write_after_free_noreuse(size_t size, size_t offset, size_t churn_size) {
    volatile char *p = launder(malloc(size));
    free((void *)p);
    p[offset] = 'a';
    for (int i = 0; i < 100000; i++) free(launder(malloc(churn_size)));
}

/* Bytes written past the request but inside the usable size (the size
 * class's rounding). */
static void overflow_request(size_t size, size_t by) {
    char *p = launder(malloc(size));
    memset(p + size, 0x5a, by);
    free(p);
}

/* Review finding 5: x's canary read by an over-read gives the canary an
 * interior pointer x + 16 would need (a canary is the key XOR the
 * address's bits 1-6 of each byte, CORAL_CANARY_VARY); planted in the next
 * block's data, where x + 16's canary word lies, free(x + 16) passes. */
static void free_interior_planted_canary(void) {
    const uintptr_t vary = 0x7e7e7e7e7e7e7e7eull;
    char *b[32];
    /* (56 bytes: a 64-byte block's usable bytes, so the secure build's
     * canary word is at the request's end, with no slack folded in) */
    for (int i = 0; i < 32; i++) b[i] = malloc(56);
    size_t usable = malloc_usable_size(b[0]);
    for (int i = 0; i < 32; i++)
        for (int k = 0; k < 32; k++) {
            char *x = launder(b[i]);
            if (b[k] != x + usable + 8 && b[k] != x + usable) continue;
            uintptr_t canary, planted;
            memcpy(&canary, x + usable, 8); /* the over-read */
            planted = canary ^ (((uintptr_t)x ^ (uintptr_t)(x + 16)) & vary);
            memcpy(x + 16 + usable, &planted, 8); /* inside b[k]'s data */
            free(x + 16);
            return;
        }
    exit(1); /* no two blocks were neighbours */
}

static void df_pqp_remote_medium(void) { double_free_pqp_remote(MEDIUM, 100); }
static void df_pqp_remote_large(void) { double_free_pqp_remote(LARGE, 8); }
static void df_pqp_remote_huge(void) { double_free_pqp_remote(HUGE, 4); }
static void interior_remote_large(void) { interior_remote(range_size[LARGE]); }
static void interior_remote_huge(void) { interior_remote(range_size[HUGE]); }
static void never_handed_out_small(void) { free_never_handed_out(range_size[SMALL]); }
static void never_handed_out_medium(void) { free_never_handed_out(range_size[MEDIUM]); }
static void never_handed_out_remote_small(void) { free_never_handed_out_remote(range_size[SMALL]); }
static void never_handed_out_remote_run_small(void) {
    free_never_handed_out_remote_run(range_size[SMALL]);
}
static void bulk_never_handed_out_small(void) { bulk_never_handed_out(range_size[SMALL]); }
static void usable_interior_large(void) { usable_interior_of(range_size[LARGE]); }
static void usable_interior_huge(void) { usable_interior_of(range_size[HUGE]); }
static void usable_after_free_large(void) { usable_after_free_of(range_size[LARGE]); }
static void usable_after_free_huge(void) { usable_after_free_of(range_size[HUGE]); }
static void bulk_interior_small(void) { bulk_interior(range_size[SMALL]); }
static void bulk_interior_medium(void) { bulk_interior(range_size[MEDIUM]); }
static void bulk_interior_large(void) { bulk_interior(range_size[LARGE]); }
static void bulk_interior_huge(void) { bulk_interior(range_size[HUGE]); }
static void bulk_interior_remote_small(void) { bulk_interior_remote(range_size[SMALL]); }
static void bulk_interior_remote_huge(void) { bulk_interior_remote(range_size[HUGE]); }
static void bulk_after_free_medium(void) { bulk_after_free_of(range_size[MEDIUM]); }
static void bulk_after_free_large(void) { bulk_after_free_of(range_size[LARGE]); }
static void bulk_after_free_huge(void) { bulk_after_free_of(range_size[HUGE]); }
static void bulk_pqp_small(void) { bulk_pqp(range_size[SMALL]); }
static void bulk_pqp_medium(void) { bulk_pqp(range_size[MEDIUM]); }
static void bulk_pqp_large(void) { bulk_pqp(range_size[LARGE]); }
static void bulk_pqp_huge(void) { bulk_pqp(range_size[HUGE]); }
static void waf_small_noreuse(void) { write_after_free_noreuse(128, 65, 128); }
static void waf_small_noreuse_head(void) { write_after_free_noreuse(128, 16, 200); }
static void waf_medium_noreuse(void) { write_after_free_noreuse(2000, 65, 2000); }
/* A block of the secure build's small ring (a 64-byte block: 56 usable
 * bytes), written at its last usable word. */
static void waf_small48_noreuse(void) { write_after_free_noreuse(48, 40, 48); }

/* A block freed, back on its page's free list (malloc_trim empties the
 * secure build's ring of freed blocks, checking it), written, and never
 * handed out again: every other block of its page is freed, and
 * malloc_trim empties the ring again, so the page empties and is parked
 * or released. No block of the class is allocated after the write. */
static void write_after_free_retire(void) {
    enum { N = 2000 };
    static char *b[N];
    for (int i = 0; i < N; i++) b[i] = launder(malloc(200));
    volatile char *p = b[N / 2];
    free((void *)p);
    malloc_trim(0);
    p[16] = 'a';
    for (int i = 0; i < N; i++)
        if (i != N / 2) free(b[i]);
    malloc_trim(0);
}
/* A sized free of a block of `size` bytes told `told` bytes (at most its
 * usable size: only the request tells them apart). */
static void free_sized_wrong(size_t size, size_t told) {
    void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))c23_call("free_sized");
    free_sized(launder(malloc(size)), told);
}
static void free_sized_plus1_small(void) { free_sized_wrong(20, 21); }
static void free_sized_minus1_medium(void) { free_sized_wrong(2000, 1999); }
static void free_sized_minus1_large(void) { free_sized_wrong(300000, 299999); }
static void free_sized_plus1_huge(void) { free_sized_wrong(8 * MiB + 100, 8 * MiB + 101); }
/* 64 bytes short, in a class above 1 KiB with a slack of 64 or more. */
static void free_sized_minus64_wide(void) { free_sized_wrong(1050, 986); }
/* The first byte past a huge block's request rounded up to 2 MiB (the
 * secure build's huge blocks end there). */
static void overflow_huge_rounding(void) {
    char *p = launder(malloc(16 * MiB));
    volatile char *end =
        (char *)(((uintptr_t)p + 16 * MiB + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
    *end = 0x5a;
    free(p);
}
/* calloc's request is the product. */
static void free_sized_calloc_wrong(void) {
    void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))c23_call("free_sized");
    free_sized(launder(calloc(10, 10)), 10);
}
static void free_aligned_sized_plus1(void) {
    void (*free_aligned_sized)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))c23_call("free_aligned_sized");
    free_aligned_sized(launder(aligned_alloc(64, 100)), 64, 101);
}
/* C++: an object of 40 bytes deleted as one of 32 (a delete through a
 * pointer to a smaller base without a virtual destructor). */
static void cxx_sized_delete_wrong_size(void) {
    void (*sized_delete)(void *, size_t) = (void (*)(void *, size_t))cxx_call("_ZdlPvm");
    sized_delete(launder(malloc(40)), 32);
}
static void cxx_aligned_sized_delete_wrong_size(void) {
    void (*aligned_delete)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))cxx_call("_ZdlPvmSt11align_val_t");
    aligned_delete(launder(aligned_alloc(64, 100)), 96, 64);
}
static void overflow_request_small(void) { overflow_request(100, 4); }
static void overflow_request_large(void) { overflow_request(300000, 4); }
/* One byte past the request, in each size range. */
static void overflow_request1_small(void) { overflow_request(100, 1); }
static void overflow_request1_medium(void) { overflow_request(2000, 1); }
static void overflow_request1_large(void) { overflow_request(300000, 1); }
/* Past a request whose slack is below 8 bytes (malloc(20): a 32-byte
 * block, 24 usable bytes). */
static void overflow_request1_slack4(void) { overflow_request(20, 1); }
/* A class above 1 KiB with a slack of 64 or more (1050 bytes: 94). */
static void overflow_request1_wide(void) { overflow_request(1050, 1); }

static void overflow_request_calloc(void) {
    char *p = launder(calloc(1, 100));
    p[100] = 'a';
    free(p);
}

/* realloc keeps the block (growing within it, shrinking by less than
 * half), then one byte is written past the new request. */
static void overflow_realloc(size_t from, size_t to) {
    char *p = launder(malloc(from));
    char *q = launder(realloc(p, to));
    if (q != p) exit(1); /* not in place: the case needs the same block */
    q[to] = 'a';
    free(q);
}
static void overflow_realloc_grown(void) { overflow_realloc(100, 102); }
static void overflow_realloc_shrunk(void) { overflow_realloc(100, 90); }
static void overflow_realloc_large_shrunk(void) { overflow_realloc(300000, 290000); }

/* One byte past a huge block's request (the secure build reports the
 * request as malloc_usable_size), however the block came: malloc of a
 * size that is no multiple of 16, aligned_alloc above the 64 KiB header,
 * calloc; realloc that keeps its end (within its 2 MiB rounding), moves
 * its end (its guard region moves: the pages may move too) or shrinks it;
 * found by a free in another thread, by realloc, by malloc_usable_size,
 * by the destroy of its first-class heap. */
static void overflow_request1_huge(void) { overflow_request(8 * MiB + 100, 1); }
static void overflow_request1_huge_aligned(void) {
    char *p = launder(aligned_alloc(256 * KiB, 16 * MiB + 100));
    p[16 * MiB + 100] = 'a';
    free(p);
}
static void overflow_request1_huge_calloc(void) {
    char *p = launder(calloc(1, 16 * MiB + 100));
    p[16 * MiB + 100] = 'a';
    free(p);
}
/* realloc of a huge block, wherever its pages end up. */
static void overflow_realloc_huge(size_t from, size_t to) {
    char *q = launder(realloc(launder(malloc(from)), to));
    if (q == NULL) exit(1);
    q[to] = 'a';
    free(q);
}
static void overflow_realloc_huge_grown(void) { overflow_realloc_huge(16 * MiB, 16 * MiB + 100); }
static void overflow_realloc_huge_grown_far(void) {
    overflow_realloc_huge(16 * MiB, 24 * MiB + 100);
}
static void overflow_realloc_huge_shrunk(void) { overflow_realloc_huge(16 * MiB, 12 * MiB + 100); }
static void overflow_request1_huge_remote(void) {
    char *p = launder(malloc(16 * MiB));
    p[16 * MiB] = 'a';
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, p);
    pthread_join(t, NULL);
}
/* realloc and malloc_usable_size of the overflowed block report it (under
 * CORALLOC_ON_ERROR=warn the block is left alone: not freed after). */
static void overflow_request1_huge_realloc(void) {
    char *p = launder(malloc(16 * MiB));
    p[16 * MiB] = 'a';
    char *q = realloc(p, 20 * MiB);
    if (q != NULL) free(q);
}
static void overflow_request1_huge_usable(void) {
    char *p = launder(malloc(16 * MiB));
    p[16 * MiB] = 'a';
    sink = (void *)malloc_usable_size(p);
}
/* Through coral_free_bulk, and through C23's free_sized with the right
 * size. */
static void overflow_request1_huge_bulk(void) {
    free_bulk_fn free_bulk = (free_bulk_fn)c23_call("coral_free_bulk");
    char *p = launder(malloc(16 * MiB));
    p[16 * MiB] = 'a';
    void *a[1] = {p};
    free_bulk(a, 1);
}
static void overflow_request1_huge_free_sized(void) {
    void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))c23_call("free_sized");
    char *p = launder(malloc(16 * MiB));
    p[16 * MiB] = 'a';
    free_sized(p, 16 * MiB);
}
static void overflow_huge_heap_destroy(void) {
    void *(*heap_new)(void) = (void *(*)(void))c23_call("coral_heap_new");
    void *(*heap_malloc)(void *, size_t) = (void *(*)(void *, size_t))c23_call("coral_heap_malloc");
    void (*heap_destroy)(void *) = (void (*)(void *))c23_call("coral_heap_destroy");
    void *heap = heap_new();
    char *p = launder(heap_malloc(heap, 16 * MiB));
    p[16 * MiB] = 'a';
    heap_destroy(heap);
}

typedef struct misuse_case_s {
    const char *name;
    void (*run)(void);
} misuse_case_t;

static void df_small(void) { double_free(48); }
static void df_large(void) { double_free(1 * MiB); }
static void df_huge(void) { double_free(16 * MiB); }
static void df_small_delayed(void) { double_free_delayed(48); }
static void df_large_delayed(void) { double_free_delayed(1 * MiB); }
static void interior_small(void) { free_interior(48); }
static void interior_large(void) { free_interior(1 * MiB); }
static void interior_huge(void) { free_interior(16 * MiB); }
static void overflow1_small(void) { overflow(48, 1); }
static void overflow8_small(void) { overflow(48, 8); }
static void overflow1_large(void) { overflow(1 * MiB, 1); }
static void overflow1_huge(void) { overflow(16 * MiB, 1); }
static void waf_small(void) { write_after_free(48); }
static void waf_medium(void) { write_after_free(2000); }

static void plus1_small(void) { free_plus1(16); }
static void plus1_medium(void) { free_plus1(2000); }
static void plus1_large(void) { free_plus1(256 * KiB); }
static void plus1_huge(void) { free_plus1(16 * MiB); }
static void pqp_small(void) { double_free_pqp(16); }
static void pqp_medium(void) { double_free_pqp(2000); }
static void pqp_large(void) { double_free_pqp(256 * KiB); }
static void pqp_huge(void) { double_free_pqp(16 * MiB); }
static void interior_remote_small(void) { interior_remote(48); }
static void interior_remote_medium(void) { interior_remote(2000); }

static const misuse_case_t cases[] = {
    {"free-plus1-small", plus1_small},
    {"free-plus1-medium", plus1_medium},
    {"free-plus1-large", plus1_large},
    {"free-plus1-huge", plus1_huge},
    {"double-free-pqp-small", pqp_small},
    {"double-free-pqp-medium", pqp_medium},
    {"double-free-pqp-large", pqp_large},
    {"double-free-pqp-huge", pqp_huge},
    {"double-free-owner-then-remote", double_free_owner_then_remote},
    {"free-interior-remote-small", interior_remote_small},
    {"free-interior-remote-medium", interior_remote_medium},
    {"free-free-space", free_space},
    {"usable-size-free-space", usable_free_space},
    {"usable-size-interior", usable_interior},
    {"usable-size-after-free", usable_after_free},
    {"double-free-remote-across-take", double_free_remote_across_take},
    {"bulk-same-block-8", bulk_same_8},
    {"bulk-after-free", bulk_after_free},
    {"bulk-interior-remote-large", bulk_interior_remote_large},
    {"double-free-small", df_small},
    {"double-free-small-delayed", df_small_delayed},
    {"double-free-large", df_large},
    {"double-free-large-delayed", df_large_delayed},
    {"double-free-huge", df_huge},
    {"double-free-remote", double_free_remote},
    {"double-free-remote-delayed", double_free_remote_delayed},
    {"double-free-pending-remote", double_free_pending_remote},
    {"double-free-pending-owner", double_free_pending_owner},
    {"double-free-released", double_free_released},
    {"free-stack", free_stack},
    {"free-static", free_static},
    {"free-mmap", free_mmap},
    {"free-interior-small", interior_small},
    {"free-interior-large", interior_large},
    {"free-interior-huge", interior_huge},
    {"realloc-after-free", realloc_after_free},
    {"realloc-foreign", realloc_foreign},
    {"overflow-1-small", overflow1_small},
    {"overflow-8-small", overflow8_small},
    {"overflow-1-large", overflow1_large},
    {"overflow-1-huge", overflow1_huge},
    {"write-after-free-small", waf_small},
    {"write-after-free-medium", waf_medium},
    {"write-after-free-tail", write_after_free_tail},
    {"read-after-free-huge", read_after_free_huge},
    {"read-after-free-huge-reused", read_after_free_huge_reused},
    {"write-after-free-huge-reused", write_after_free_huge_reused},
    {"double-free-huge-reused", double_free_huge_reused},
    {"malloc0-write", malloc0_write},
    {"malloc0-read", malloc0_read},
    {"free-sized-mismatch", sized_mismatch},
    {"free-aligned-sized-mismatch", aligned_sized_mismatch},
    {"cxx-sized-delete-mismatch", cxx_sized_delete_mismatch},
    {"cxx-aligned-sized-delete-mismatch", cxx_aligned_sized_delete_mismatch},
    {"double-free-bitflip", double_free_bitflip},
    {"forge-link", forge_link},
    {"aligned-alloc0-write", aligned_alloc0_write},
    {"posix-memalign0-write", posix_memalign0_write},
    {"memalign0-write", memalign0_write},
    {"overflow-heap-destroy", overflow_heap_destroy},
    {"free-interior-large-aligned", interior_large_aligned},
    {"read-after-free-large", read_after_free_large},
    {"read-after-free-large-64k", read_after_free_large_64k},
    {"read-after-free-large-1m", read_after_free_large_1m},
    {"write-after-free-large-noreuse", waf_large_noreuse},
    {"write-after-free-large-noreuse-64k", waf_large_noreuse_64k},
    {"write-after-free-large-noreuse-1m", waf_large_noreuse_1m},
    {"read-after-free-large-remote", read_after_free_large_remote},
    {"write-after-free-large-remote", write_after_free_large_remote},
    {"read-after-free-large-other-thread", read_after_free_large_other_thread},
    {"double-free-pqp-remote-medium", df_pqp_remote_medium},
    {"double-free-pqp-remote-large", df_pqp_remote_large},
    {"double-free-pqp-remote-huge", df_pqp_remote_huge},
    {"free-interior-remote-large", interior_remote_large},
    {"free-interior-remote-huge", interior_remote_huge},
    {"free-never-handed-out-small", never_handed_out_small},
    {"free-never-handed-out-medium", never_handed_out_medium},
    {"free-never-handed-out-remote-small", never_handed_out_remote_small},
    {"free-never-handed-out-remote-run-small", never_handed_out_remote_run_small},
    {"bulk-never-handed-out-small", bulk_never_handed_out_small},
    {"free-free-space-large", free_space_large},
    {"usable-size-interior-large", usable_interior_large},
    {"usable-size-interior-huge", usable_interior_huge},
    {"usable-size-after-free-large", usable_after_free_large},
    {"usable-size-after-free-huge", usable_after_free_huge},
    {"bulk-interior-small", bulk_interior_small},
    {"bulk-interior-medium", bulk_interior_medium},
    {"bulk-interior-large", bulk_interior_large},
    {"bulk-interior-huge", bulk_interior_huge},
    {"bulk-interior-remote-small", bulk_interior_remote_small},
    {"bulk-interior-remote-huge", bulk_interior_remote_huge},
    {"bulk-after-free-medium", bulk_after_free_medium},
    {"bulk-after-free-large", bulk_after_free_large},
    {"bulk-after-free-huge", bulk_after_free_huge},
    {"bulk-pqp-small", bulk_pqp_small},
    {"bulk-pqp-medium", bulk_pqp_medium},
    {"bulk-pqp-large", bulk_pqp_large},
    {"bulk-pqp-huge", bulk_pqp_huge},
    {"cxx-delete-interior", cxx_delete_interior},
    {"cxx-delete-array-interior", cxx_delete_array_interior},
    {"cxx-delete-nothrow-interior", cxx_delete_nothrow_interior},
    {"cxx-delete-array-nothrow-interior", cxx_delete_array_nothrow_interior},
    {"cxx-aligned-delete-interior", cxx_aligned_delete_interior},
    {"cxx-aligned-array-delete-interior", cxx_aligned_array_delete_interior},
    {"cxx-aligned-nothrow-delete-interior", cxx_aligned_nothrow_delete_interior},
    {"cxx-aligned-array-nothrow-delete-interior", cxx_aligned_array_nothrow_delete_interior},
    {"cxx-array-sized-delete-mismatch", cxx_array_sized_delete_mismatch},
    {"cxx-aligned-array-sized-delete-mismatch", cxx_aligned_array_sized_delete_mismatch},
    {"realloc-interior", realloc_interior},
    {"free-sized-interior", free_sized_interior},
    {"write-after-free-small-noreuse", waf_small_noreuse},
    {"write-after-free-small-noreuse-head", waf_small_noreuse_head},
    {"write-after-free-medium-noreuse", waf_medium_noreuse},
    {"overflow-request-small", overflow_request_small},
    {"overflow-request-large", overflow_request_large},
    {"free-interior-planted-canary", free_interior_planted_canary},
    {"overflow-request1-small", overflow_request1_small},
    {"overflow-request1-medium", overflow_request1_medium},
    {"overflow-request1-large", overflow_request1_large},
    {"overflow-request1-slack4", overflow_request1_slack4},
    {"overflow-request-calloc", overflow_request_calloc},
    {"overflow-realloc-grown", overflow_realloc_grown},
    {"overflow-realloc-shrunk", overflow_realloc_shrunk},
    {"overflow-realloc-large-shrunk", overflow_realloc_large_shrunk},
    {"write-after-free-small48-noreuse", waf_small48_noreuse},
    {"write-after-free-retire", write_after_free_retire},
    {"free-sized-plus1-small", free_sized_plus1_small},
    {"free-sized-minus1-medium", free_sized_minus1_medium},
    {"free-sized-minus1-large", free_sized_minus1_large},
    {"free-sized-plus1-huge", free_sized_plus1_huge},
    {"overflow-huge-rounding", overflow_huge_rounding},
    {"overflow-request1-wide", overflow_request1_wide},
    {"free-sized-minus64-wide", free_sized_minus64_wide},
    {"free-sized-calloc-wrong", free_sized_calloc_wrong},
    {"free-aligned-sized-plus1", free_aligned_sized_plus1},
    {"cxx-sized-delete-wrong-size", cxx_sized_delete_wrong_size},
    {"cxx-aligned-sized-delete-wrong-size", cxx_aligned_sized_delete_wrong_size},
    {"overflow-request1-huge", overflow_request1_huge},
    {"overflow-request1-huge-aligned", overflow_request1_huge_aligned},
    {"overflow-request1-huge-calloc", overflow_request1_huge_calloc},
    {"overflow-realloc-huge-grown", overflow_realloc_huge_grown},
    {"overflow-realloc-huge-grown-far", overflow_realloc_huge_grown_far},
    {"overflow-realloc-huge-shrunk", overflow_realloc_huge_shrunk},
    {"overflow-request1-huge-remote", overflow_request1_huge_remote},
    {"overflow-request1-huge-realloc", overflow_request1_huge_realloc},
    {"overflow-request1-huge-usable", overflow_request1_huge_usable},
    {"overflow-huge-heap-destroy", overflow_huge_heap_destroy},
    {"overflow-request1-huge-bulk", overflow_request1_huge_bulk},
    {"overflow-request1-huge-free-sized", overflow_request1_huge_free_sized},
};

int main(int argc, char **argv) {
    size_t n = sizeof cases / sizeof cases[0];
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) puts(cases[i].name);
        return 0;
    }
    for (size_t i = 0; argc == 2 && i < n; i++) {
        if (strcmp(argv[1], cases[i].name) != 0) continue;
        cases[i].run();
        churn(64);
        return 0;
    }
    fprintf(stderr, "usage: misuse --list | misuse CASE\n");
    return 2;
}
