/* stats_at_exit.so: what served a process's allocations, written at its
 * exit. run_programs.py preloads it before the allocator under test
 * (LD_PRELOAD="stats_at_exit.so libcoralloc.so"); in each process that ends
 * through exit() it writes $CORAL_PROGRAMS_STATS_DIR/<pid>.json (a new
 * name if a process of the same pid wrote before):
 *
 *   {"exe": "/usr/bin/git", "argv0": "git", "malloc": "/path/libcoralloc.so",
 *    "free": ..., "calloc": ..., "realloc": ...,
 *    "stats": {coral_stats_json()} or null}
 *
 * "malloc" & co are the files that define the symbols the process's own
 * references resolve to (the first definition in the global scope, as ld.so
 * binds them); "stats" is coral_stats_json() of the coralloc found there, so
 * its peaks show how much the process allocated through it. Built without
 * coralloc; it writes from a static buffer with open/write.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char out[1 << 16];
static size_t used;

static void put(const char *s) {
    size_t n = strlen(s);
    if (used + n >= sizeof out) n = sizeof out - 1 - used;
    memcpy(out + used, s, n);
    used += n;
    out[used] = 0;
}

/* A JSON string of s (paths and the like: quotes and backslashes escaped). */
static void put_string(const char *s) {
    put("\"");
    for (; *s; s++) {
        char c[3] = {*s, 0, 0};
        if (*s == '"' || *s == '\\') c[0] = '\\', c[1] = *s;
        if ((unsigned char)*s < 0x20) c[0] = '?';
        put(c);
    }
    put("\"");
}

/* The file whose definition of `symbol` the process's references are bound
 * to: the first in the global scope (dlsym(RTLD_DEFAULT)), except that a
 * non-PIE executable that takes a function's address "defines" it as its
 * own PLT entry (an undefined symbol with a value), which jumps to where
 * the executable's own reference is bound: the first definition after it,
 * which is what RTLD_NEXT from here finds (this library comes first in
 * LD_PRELOAD and defines no allocation function). */
static void put_owner(const char *symbol) {
    void *p = dlsym(RTLD_DEFAULT, symbol);
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (p && dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_shndx == SHN_UNDEF)
        p = dlsym(RTLD_NEXT, symbol);
    put(",\"");
    put(symbol);
    put("\":");
    if (p && dladdr(p, &info) && info.dli_fname)
        put_string(info.dli_fname);
    else
        put("null");
}

__attribute__((destructor)) static void stats_at_exit(void) {
    const char *dir = getenv("CORAL_PROGRAMS_STATS_DIR");
    if (!dir) return;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    used = 0;
    put("{\"exe\":");
    put_string(exe);
    /* argv[0] (Debian's redis-server is a link to redis-check-rdb) */
    char argv0[4096] = "";
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t got = read(fd, argv0, sizeof argv0 - 1);
        argv0[got > 0 ? got : 0] = 0;
        close(fd);
    }
    put(",\"argv0\":");
    put_string(argv0);
    static const char *const owners[] = {"malloc", "free", "calloc", "realloc"};
    for (size_t i = 0; i < sizeof owners / sizeof *owners; i++) put_owner(owners[i]);
    put(",\"stats\":");
    size_t (*stats_json)(char *, size_t) =
        (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "coral_stats_json");
    if (stats_json) {
        size_t room = sizeof out - used - 2;
        if (stats_json(out + used, room) >= room) return; /* truncated: no file */
        used += strlen(out + used);
    } else {
        put("null");
    }
    put("}\n");

    /* <pid>.json, or <pid>.<k>.json if a process of the same pid wrote
     * before (pids are reused) */
    char path[4096];
    fd = -1;
    for (int k = 0; fd < 0 && k < 100; k++) {
        if (k == 0)
            snprintf(path, sizeof path, "%s/%ld.json", dir, (long)getpid());
        else
            snprintf(path, sizeof path, "%s/%ld.%d.json", dir, (long)getpid(), k);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) return;
    for (size_t off = 0; off < used;) {
        ssize_t w = write(fd, out + off, used - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(fd);
}
