/* hot_text: the code and read-only data a program that only calls the
 * allocator makes libcoralloc.so run and read lie in the library's first
 * 64 KiB (cmake/hot-text.ld; docs/DESIGN.md, "Start-up and exit"). The
 * kernel maps a file's pages 64 KiB at a time around each fault, so one
 * page touched past that window puts up to 64 KiB more of the library in
 * the process's resident memory.
 *
 * usage: LD_PRELOAD=LIBCORALLOC_SO hot_text LIBCORALLOC_SO
 *
 * Once started (the library's load ran), the program makes every page of
 * the library's code mapping past its first 64 KiB inaccessible, then does
 * what programs do: small blocks of every class, calloc, realloc growing
 * and shrinking, aligned blocks, large and huge blocks, a thread that
 * allocates, frees another thread's blocks and exits, and a thread that
 * takes over what the first left. (Not a fork: the fork handlers come
 * right after the window, cmake/hot-text.ld, and a process that forks maps
 * one window more.) A touch of a
 * protected page traps: the handler notes the page and the code that
 * touched it, gives the page back and lets the program go on. It fails
 * (exit 1) when any was touched, listing the library's offsets (`addr2line
 * -f -e LIBCORALLOC_SO OFFSET` names the function), also for a touch during
 * exit, after main. A touch from coralloc's purge thread, which blocks
 * every signal, cannot be caught: the kernel ends the process with SIGSEGV,
 * a failure too. Built without coralloc: the preload is what puts it in,
 * and the program checks that its malloc is the library's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

enum { WINDOW = 64 * 1024, MAX_TOUCHED = 64 };

static uintptr_t lib_base, lib_end, armed_from; /* the code mapping, and what is protected */
static struct { uintptr_t page, by; } touched[MAX_TOUCHED];
static atomic_int touched_count;
static atomic_bool main_returned;

static void say(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* "touched 0x... (by code at 0x...)" with offsets into the library, without
 * stdio (the handler may run inside it). */
static void say_touch(const char *what, uintptr_t page, uintptr_t by) {
    char line[128], *p = line;
    const char *hex = "0123456789abcdef";
    uintptr_t v[2] = {page, by};
    for (const char *t = what; *t; t++) *p++ = *t;
    for (int k = 0; k < 2; k++) {
        const char *lead = k == 0 ? ": the library's page at 0x" : ", first by its code at 0x";
        for (const char *t = lead; *t; t++) *p++ = *t;
        if (k == 1 && v[1] == UINTPTR_MAX) {
            for (const char *t = "? (outside the library)"; *t; t++) *p++ = *t;
            continue;
        }
        char digits[16];
        int n = 0;
        do digits[n++] = hex[v[k] % 16];
        while ((v[k] /= 16) != 0);
        while (n > 0) *p++ = digits[--n];
    }
    *p++ = '\n';
    *p = '\0';
    say(line);
}

static uintptr_t instruction_pointer(void *ctx) {
#if defined(__x86_64__)
    return (uintptr_t)((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)((ucontext_t *)ctx)->uc_mcontext.pc;
#else
    (void)ctx;
    return 0;
#endif
}

static void on_fault(int sig, siginfo_t *si, void *ctx) {
    uintptr_t a = (uintptr_t)si->si_addr;
    if (a < armed_from || a >= lib_end) { /* a real fault: die of it */
        signal(sig, SIG_DFL);
        return;
    }
    uintptr_t page = a & ~(uintptr_t)4095;
    mprotect((void *)page, 4096, PROT_READ | PROT_EXEC);
    uintptr_t ip = instruction_pointer(ctx);
    uintptr_t by = ip >= lib_base && ip < lib_end ? ip - lib_base : UINTPTR_MAX;
    int i = atomic_fetch_add(&touched_count, 1);
    if (i < MAX_TOUCHED) {
        touched[i].page = page - lib_base;
        touched[i].by = by;
    }
    if (atomic_load(&main_returned)) { /* exit runs it: report now, there is no later */
        say_touch("hot_text: FAIL: exit touched", page - lib_base, by);
        _exit(1);
    }
}

/* The library's code mapping: the executable mapping of LIB at file offset
 * 0 (with -z noseparate-code, its code and read-only data). */
static int find_library(const char *lib) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL) return -1;
    char line[PATH_MAX + 128], path[PATH_MAX];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        char perms[8];
        path[0] = '\0';
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %4095s", &lo, &hi, perms, &off, path) < 4)
            continue;
        if (strcmp(path, lib) == 0 && perms[2] == 'x' && off == 0) {
            lib_base = lo;
            lib_end = hi;
            found = 0;
        }
    }
    fclose(f);
    return found;
}

static void check_served(const char *lib) {
    Dl_info info;
    char served[PATH_MAX];
    void *(*m)(size_t) = malloc;
    if (!dladdr((void *)m, &info) || info.dli_fname == NULL ||
        realpath(info.dli_fname, served) == NULL || strcmp(served, lib) != 0) {
        fprintf(stderr, "hot_text: FAIL: malloc is not %s's (not preloaded?)\n", lib);
        exit(1);
    }
}

static void *must(void *p) {
    if (p == NULL) {
        fprintf(stderr, "hot_text: FAIL: an allocation failed\n");
        exit(1);
    }
    return p;
}

enum { BLOCKS = 600 };
static void *blocks[BLOCKS];

/* Small blocks of every class, half of them freed. */
static void small_blocks(void) {
    unsigned size = 16;
    for (int i = 0; i < BLOCKS; i++) {
        size = size * 7 % 4093 + 16;
        blocks[i] = must(malloc(size));
        memset(blocks[i], i, size);
    }
    for (int i = 0; i < BLOCKS; i += 2) free(blocks[i]);
    void *z = must(calloc(100, 24));
    free(z);
}

static void realloc_blocks(void) {
    char *p = must(malloc(8));
    for (size_t n = 16; n <= (size_t)1 << 20; n = n * 3 / 2) p = must(realloc(p, n));
    for (size_t n = (size_t)1 << 20; n >= 16; n /= 3) p = must(realloc(p, n));
    free(p);
}

static void aligned_and_big_blocks(void) {
    void *a = NULL;
    if (posix_memalign(&a, 64, 200) != 0) must(NULL);
    void *b = must(aligned_alloc(4096, 8192));
    void *c = must(memalign(256, 1000));
    if (malloc_usable_size(c) < 1000) must(NULL);
    free(a);
    free(b);
    free(c);
    void *large = must(malloc(600 * 1024));
    void *huge = must(malloc(24u << 20));
    memset(large, 1, 4096);
    memset(huge, 1, 4096);
    free(large);
    free(huge);
}

/* A thread that allocates, frees blocks main allocated (remote frees) and
 * exits with blocks still allocated (its heap is abandoned). */
static void *first_thread(void *arg) {
    (void)arg;
    for (int i = 1; i < BLOCKS; i += 2) free(blocks[i]);
    for (int i = 0; i < BLOCKS; i++) blocks[i] = must(malloc(32 + (unsigned)i % 500));
    for (int i = 0; i < BLOCKS; i += 3) free(blocks[i]);
    return NULL;
}

/* A thread that allocates where the first one left off (adoption). */
static void *second_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < BLOCKS; i++) free(must(malloc(32 + (unsigned)i % 500)));
    return NULL;
}

static void threads(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, first_thread, NULL) != 0 || pthread_join(t, NULL) != 0) must(NULL);
    for (int i = 1; i < BLOCKS; i += 3) free(blocks[i]); /* frees to an abandoned heap */
    if (pthread_create(&t, NULL, second_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
        must(NULL);
}

/* The touches noted since the FROMth; how many. */
static int report(const char *who, int from) {
    int n = atomic_load(&touched_count);
    for (int i = from; i < n && i < MAX_TOUCHED; i++)
        say_touch(who, touched[i].page, touched[i].by);
    return n - from;
}

int main(int argc, char **argv) {
    char lib[PATH_MAX];
    if (argc != 2 || realpath(argv[1], lib) == NULL) {
        fprintf(stderr, "usage: LD_PRELOAD=LIBCORALLOC_SO hot_text LIBCORALLOC_SO\n");
        return 2;
    }
    check_served(lib);
    if (find_library(lib) != 0) {
        fprintf(stderr, "hot_text: FAIL: no executable mapping of %s at offset 0\n", lib);
        return 1;
    }
    if (lib_base % WINDOW != 0)
        printf("hot_text: note: the library is mapped at %#lx, not on a 64 KiB boundary: its "
               "first window in the process is not the file's first 64 KiB\n",
               (unsigned long)lib_base);
    if (lib_end - lib_base <= WINDOW) {
        printf("hot_text: the library's code mapping is %lu bytes: all of it in one window\n",
               (unsigned long)(lib_end - lib_base));
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    armed_from = lib_base + WINDOW;
    if (sigaction(SIGSEGV, &sa, NULL) != 0 ||
        mprotect((void *)armed_from, lib_end - armed_from, PROT_NONE) != 0) {
        perror("hot_text: FAIL: arming the trap");
        return 1;
    }
    printf("hot_text: armed %lu KiB of the library past its first %d KiB\n",
           (unsigned long)(lib_end - armed_from) / 1024, WINDOW / 1024);
    fflush(stdout);

    small_blocks();
    realloc_blocks();
    aligned_and_big_blocks();
    threads();

    if (report("hot_text: FAIL: touched", 0) > 0) return 1;
    printf("hot_text: none of it touched by the calls; exit follows\n");
    fflush(stdout);
    atomic_store(&main_returned, true);
    return 0;
}
