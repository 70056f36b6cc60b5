/* alloc-probe: which shared object serves this process's allocation calls.
 *
 * For each entry point, the symbol the dynamic linker resolves
 * (dlsym(RTLD_DEFAULT, name)) and the shared object that defines it
 * (dladdr), one line each: "sym <name> <path>" (or "sym <name> -" when the
 * process has no such symbol). The runner runs this under each allocator's
 * LD_PRELOAD and requires malloc, free, calloc and realloc to come from that
 * allocator's library (from libc for the system allocator) before it trusts
 * any number. When coralloc is present its coral_owns() must also claim a
 * block that plain malloc returned ("owns 1"). Then it allocates and frees a
 * little to show the calls work.
 */
#include "common.h"

static const char *const names[] = {
    "malloc",        "free",     "calloc", "realloc", "posix_memalign",
    "aligned_alloc", "memalign", "valloc", "pvalloc", "malloc_usable_size",
    "reallocarray",
};

int main(void) {
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *sym = dlsym(RTLD_DEFAULT, names[i]);
        Dl_info info;
        const char *where = "-";
        if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL)
            where = info.dli_fname;
        printf("sym %s %s\n", names[i], where);
    }
    /* exercise the calls, and ask coralloc whether it owns a malloc'ed block */
    void *p = malloc(100);
    void *q = calloc(10, 10);
    p = realloc(p, 1000);
    if (p == NULL || q == NULL) out_of_memory(1000);
    memset(p, 1, 1000);
    int (*owns)(const void *) = (int (*)(const void *))(uintptr_t)dlsym(RTLD_DEFAULT, "coral_owns");
    if (owns != NULL) printf("owns %d\n", owns(p) ? 1 : 0);
    free(p);
    free(q);
    printf("ok\n");
    return 0;
}
