/* malloc-witness: a small library preloaded after the allocator under test
 * into real programs (and every process they start), which says at start-up
 * (the dynamic linker has loaded every object by then) which shared object
 * that process's malloc calls are bound to.
 *
 * The dynamic linker binds an undefined `malloc` to the first object of the
 * global scope that defines it: the executable, then the LD_PRELOAD objects,
 * then the needed libraries, in load order (dl_iterate_phdr's order). The
 * witness walks that order and names the first object (the executable
 * included) whose dynamic symbol table defines malloc; it appends
 * "<pid> <path>" (the executable is "<pid> [main]") to the file named by
 * CORALLOC_WITNESS_FILE. A program that links libjemalloc (Debian's
 * redis-server) is served by jemalloc unless something earlier in the scope
 * defines malloc: this tells which one did.
 *
 * Written with system calls and a stack buffer: no allocation of its own.
 * It runs as a constructor, not at exit: a process that leaves with _exit
 * (a shell) still reports, and dlopen/dlclose at exit made mimalloc 3.4.3
 * print a stray newline on stderr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct search {
    const char *found;
    int index;
};

static int visit(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct search *s = (struct search *)arg;
    int index = s->index++;
    if (s->found != NULL) return 0;
    const char *name = info->dlpi_name;
    void *handle = index == 0 ? dlopen(NULL, RTLD_LAZY | RTLD_NOLOAD)
                              : (name && *name ? dlopen(name, RTLD_LAZY | RTLD_NOLOAD) : NULL);
    if (handle == NULL) return 0;
    void *sym = dlsym(handle, "malloc");
    Dl_info where;
    /* defined in this object itself, not in one of its dependencies (a
     * handle's lookup also searches those) */
    if (sym != NULL && dladdr(sym, &where) != 0 && where.dli_fname != NULL &&
        (uintptr_t)where.dli_fbase == (uintptr_t)info->dlpi_addr)
        s->found = index == 0 ? "[main]" : where.dli_fname;
    dlclose(handle);
    return 0;
}

__attribute__((constructor)) static void witness(void) {
    const char *file = getenv("CORALLOC_WITNESS_FILE");
    if (file == NULL || *file == '\0') return;
    struct search s = {NULL, 0};
    dl_iterate_phdr(visit, &s);
    char line[4200];
    int n = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), s.found ? s.found : "-");
    if (n <= 0 || (size_t)n >= sizeof line) return;
    int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}
