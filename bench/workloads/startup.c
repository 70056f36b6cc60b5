/* startup: many short processes, as compilers, shells and git start them.
 *
 * The parent starts --procs children one after another (posix_spawn of this
 * program with --child, the environment inherited, so LD_PRELOAD loads the
 * allocator under test into each) and waits for each. A child does what a
 * small program does between start and exit: a few hundred allocations of
 * 16-2048 B (tagged, a few grown with realloc, a string table), checks them,
 * frees half and exits with the rest still allocated. It also checks that
 * its malloc comes from the same shared object as the parent's (passed on
 * its command line) and exits 3 otherwise.
 *
 * With --exec=PROGRAM the children run PROGRAM (no arguments, the same
 * environment) instead: the bare cost of starting and ending a process
 * under the allocator, e.g. --exec=/bin/true, which makes no allocation.
 *
 * Figure: procs_per_sec, ms_per_proc (wall time per process, start to exit);
 * also the children's CPU time and minor faults per process (getrusage).
 */
#include "common.h"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

extern char **environ;

static const char *malloc_lib(void) {
    void *sym = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL) return info.dli_fname;
    return "unknown";
}

/* The child: a small program's allocations, checked. */
static int child(long seed, long blocks, const char *want_lib) {
    if (strcmp(malloc_lib(), want_lib) != 0)
        check_failed("startup: child's malloc is in %s, the parent's in %s", malloc_lib(),
                     want_lib);
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    unsigned char **p = (unsigned char **)xmalloc(sizeof(void *) * (size_t)blocks);
    size_t *sizes = (size_t *)xmalloc(sizeof(size_t) * (size_t)blocks);
    for (long i = 0; i < blocks; i++) {
        sizes[i] = (size_t)rng_range(&rng, 16, 2048);
        p[i] = (unsigned char *)xmalloc(sizes[i]);
        block_fill(p[i], sizes[i], tag_make((uint64_t)seed, (uint64_t)i));
    }
    for (long i = 0; i < blocks; i += 8) { /* a few grow */
        size_t n = sizes[i] * 3;
        unsigned char *q = (unsigned char *)realloc(p[i], n);
        if (q == NULL) out_of_memory(n);
        if (!block_ok(q, sizes[i], tag_make((uint64_t)seed, (uint64_t)i), 1))
            check_failed("startup: block %ld lost its contents in realloc", i);
        p[i] = q;
        sizes[i] = n;
        block_fill(p[i], sizes[i], tag_make((uint64_t)seed, (uint64_t)i));
    }
    char *strings[64];
    for (int i = 0; i < 64; i++) {
        char buf[64];
        int n = snprintf(buf, sizeof buf, "option-%d=value-%ld", i, seed);
        strings[i] = (char *)xmalloc((size_t)n + 1);
        memcpy(strings[i], buf, (size_t)n + 1);
    }
    for (long i = 0; i < blocks; i++) {
        if (!block_ok(p[i], sizes[i], tag_make((uint64_t)seed, (uint64_t)i), 1))
            check_failed("startup: block %ld overwritten", i);
        if (i % 2 == 0) free(p[i]);
    }
    for (int i = 0; i < 64; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "option-%d=value-%ld", i, seed);
        if (strcmp(strings[i], buf) != 0) check_failed("startup: string %d overwritten", i);
        if (i % 2) free(strings[i]);
    }
    return 0; /* the rest stays allocated, as in most programs at exit */
}

int main(int argc, char **argv) {
    long procs = 200, blocks = 300, is_child = 0, seed = 1;
    const char *lib = NULL, *exec = NULL;
    opt_t opts[] = {
        {"procs", "processes to start, one after another", &procs, NULL},
        {"blocks", "allocations per process", &blocks, NULL},
        {"child", "(internal) run as a child with this seed", &is_child, NULL},
        {"seed", "(internal) the child's seed", &seed, NULL},
        {"lib", "(internal) the parent's malloc library", NULL, &lib},
        {"exec", "children run this program (no arguments) instead of the allocations", NULL,
         &exec},
    };
    OPTS_PARSE(argc, argv, "Many short processes: start-up, a few allocations, exit.", opts);
    if (procs < 1 || blocks < 1) usage_error("startup: need procs >= 1, blocks >= 1");
    if (is_child) return child(seed, blocks, lib ? lib : "");

    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) check_failed("startup: cannot read /proc/self/exe");
    self[n] = '\0';
    char parent_lib[4096];
    snprintf(parent_lib, sizeof parent_lib, "%s", malloc_lib());
    char blocks_arg[32], seed_arg[32], lib_arg[4200];
    snprintf(blocks_arg, sizeof blocks_arg, "--blocks=%ld", blocks);
    snprintf(lib_arg, sizeof lib_arg, "--lib=%s", parent_lib);

    double t0 = now_sec();
    for (long i = 0; i < procs; i++) {
        snprintf(seed_arg, sizeof seed_arg, "--seed=%ld", i + 1);
        char *cargv[] = {self, "--child=1", blocks_arg, seed_arg, lib_arg, NULL};
        char *eargv[] = {(char *)exec, NULL};
        const char *path = exec != NULL ? exec : self;
        pid_t pid;
        int err = posix_spawn(&pid, path, NULL, NULL, exec != NULL ? eargv : cargv, environ);
        if (err != 0) check_failed("startup: posix_spawn: %s", strerror(err));
        int status;
        if (waitpid(pid, &status, 0) != pid) check_failed("startup: waitpid failed");
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            check_failed("startup: child %ld ended with status 0x%x", i, status);
    }
    double elapsed = now_sec() - t0;
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                 (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    report_malloc_lib();
    printf("info: procs=%ld blocks=%ld seconds=%.4f exec=%s\n", procs, blocks, elapsed,
           exec != NULL ? exec : "(allocations)");
    printf("info: per process: cpu_ms=%.4f minflt=%.1f\n", cpu * 1000.0 / (double)procs,
           (double)ru.ru_minflt / (double)procs);
    printf("result: procs_per_sec=%.1f ms_per_proc=%.4f\n", (double)procs / elapsed,
           elapsed * 1000.0 / (double)procs);
    return 0;
}
