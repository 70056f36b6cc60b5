/* coralloc: run a command with coralloc preloaded, and list its options.
 *
 *   coralloc run [--secure] [--stats] [--option KEY=VALUE]... -- COMMAND [ARGS...]
 *   coralloc options [--option KEY=VALUE]...
 *   coralloc --version | --help
 *
 * The library is found relative to this program's own file (so the same
 * binary works from the build tree, where both sit in one folder, and from an
 * install, bin/ beside lib/): CORAL_REL_LIBDIR is the path from the command's
 * folder to the library's, set by the build. Bad arguments: one line on
 * stderr, exit status 2. See coralloc(1).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coralloc.h"

#ifndef CORAL_REL_LIBDIR
#define CORAL_REL_LIBDIR "../lib"
#endif
#define STR2(x) #x
#define STR(x) STR2(x)
#define SONAME_SUFFIX ".so." STR(CORALLOC_VERSION_MAJOR)

enum { EXIT_USAGE = 2, EXIT_CANNOT_RUN = 127 };

static const char usage[] =
    "usage: coralloc run [--secure] [--stats] [--option KEY=VALUE]... -- COMMAND [ARGS...]\n"
    "       coralloc options [--option KEY=VALUE]...\n"
    "       coralloc --version | --help\n"
    "\n"
    "  run       run COMMAND with libcoralloc.so preloaded (LD_PRELOAD); every process\n"
    "            it starts uses coralloc too\n"
    "  options   list every option: name, default, accepted values, value in force\n"
    "\n"
    "  --secure             preload the secure build (libcoralloc-secure.so)\n"
    "  --stats              each process prints coralloc's statistics to stderr at exit\n"
    "                       (CORALLOC_SHOW_STATS=1)\n"
    "  --option KEY=VALUE   set option CORALLOC_KEY (KEY with or without the CORALLOC_\n"
    "                       prefix, any case); checked before the command runs\n"
    "\n"
    "Options also come from the environment (CORALLOC_*). See coralloc(1), coralloc(3).\n";

/* One clear line, exit status 2. */
__attribute__((noreturn, format(printf, 1, 2))) static void usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("coralloc: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (coralloc --help for usage)\n", stderr);
    va_end(ap);
    exit(EXIT_USAGE);
}

/* ---- finding and opening the library ------------------------------------------ */

/* The folder of this program's file, resolved. */
static void self_dir(char *out, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "coralloc: cannot find my own file (/proc/self/exe): %s\n",
                strerror(errno));
        exit(EXIT_CANNOT_RUN);
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL) *slash = '\0';
    snprintf(out, cap, "%s", exe);
}

/* The absolute path of `stem` (e.g. "libcoralloc") beside this program or in
 * its install's library folder, as STEM.so.MAJOR or STEM.so; false if none. */
static bool find_library(const char *stem, char *out, size_t cap) {
    char dir[PATH_MAX], path[PATH_MAX + 64];
    self_dir(dir, sizeof dir);
    const char *subdirs[] = {"", "/" CORAL_REL_LIBDIR};
    const char *suffixes[] = {SONAME_SUFFIX, ".so"};
    for (size_t i = 0; i < 2; i++) {
        for (size_t k = 0; k < 2; k++) {
            snprintf(path, sizeof path, "%s%s/%s%s", dir, subdirs[i], stem, suffixes[k]);
            if (access(path, R_OK) == 0 && realpath(path, out) != NULL && strlen(out) < cap)
                return true;
        }
    }
    return false;
}

typedef int (*option_info_fn)(size_t, coral_option_info_t *);
typedef int (*option_parse_fn)(const char *, const char *, long long *);
typedef const char *(*version_fn)(void);

typedef struct library_s {
    char path[PATH_MAX];
    option_info_fn option_info;
    option_parse_fn option_parse;
    version_fn version;
} library_t;

/* Open the library to read its option table and version. Not as the process's
 * allocator: RTLD_LOCAL keeps its malloc out of this program's bindings. */
static void library_open(library_t *lib, const char *stem) {
    if (!find_library(stem, lib->path, sizeof lib->path)) {
        char dir[PATH_MAX];
        self_dir(dir, sizeof dir);
        if (strcmp(stem, "libcoralloc-secure") == 0)
            usage_error("--secure: the secure build (libcoralloc-secure.so) is not installed "
                        "beside %s",
                        dir);
        fprintf(stderr, "coralloc: cannot find %s.so in %s or %s/%s\n", stem, dir, dir,
                CORAL_REL_LIBDIR);
        exit(EXIT_CANNOT_RUN);
    }
    void *h = dlopen(lib->path, RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) {
        lib->option_info = (option_info_fn)(uintptr_t)dlsym(h, "coral_option_info");
        lib->option_parse = (option_parse_fn)(uintptr_t)dlsym(h, "coral_option_parse");
        lib->version = (version_fn)(uintptr_t)dlsym(h, "coral_version");
    }
    if (h == NULL || !lib->option_info || !lib->option_parse || !lib->version) {
        fprintf(stderr, "coralloc: %s is not a coralloc library this command can use: %s\n",
                lib->path, h == NULL ? dlerror() : "coral_option_info is missing");
        exit(EXIT_CANNOT_RUN);
    }
}

/* ---- options ----------------------------------------------------------------------------- */

/* "KEY=VALUE" from --option: checked against the library's table (unknown key
 * or bad value: exit 2), then set as CORALLOC_KEY=VALUE. */
static void option_apply(const library_t *lib, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (eq == NULL || eq == arg) usage_error("--option wants KEY=VALUE, not '%s'", arg);
    char key[128] = "CORALLOC_";
    const char *k = arg;
    size_t klen = (size_t)(eq - arg);
    if (klen > 9 && strncasecmp(k, "CORALLOC_", 9) == 0) k += 9, klen -= 9;
    if (klen + 10 > sizeof key) usage_error("unknown option '%.*s'", (int)(eq - arg), arg);
    for (size_t i = 0; i < klen; i++)
        key[9 + i] = (char)toupper((unsigned char)k[i]);
    key[9 + klen] = '\0';
    long long value;
    coral_option_info_t info;
    bool known = false;
    for (size_t i = 0; lib->option_info(i, &info) == 0; i++)
        known = known || strcmp(info.name, key + 9) == 0;
    if (!known) usage_error("unknown option '%.*s' (coralloc options lists them)", (int)klen, k);
    if (lib->option_parse(key, eq + 1, &value) != 0)
        usage_error("bad value for %s: '%s' (coralloc options lists the accepted values)", key,
                    eq + 1);
    if (setenv(key, eq + 1, 1) != 0) usage_error("cannot set %s: %s", key, strerror(errno));
}

static void print_accepted(const coral_option_info_t *o, char *buf, size_t cap) {
    if (o->is_bool) {
        snprintf(buf, cap, "boolean");
    } else if (o->names != NULL) {
        size_t n = 0;
        for (size_t k = 0; o->names[k] != NULL && n < cap; k++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", k ? "|" : "", o->names[k]);
    } else {
        snprintf(buf, cap, "%lld-%lld", o->min, o->max);
    }
}

static void value_text(const coral_option_info_t *o, long long v, char *buf, size_t cap) {
    size_t count = 0;
    while (o->names != NULL && o->names[count] != NULL)
        count++;
    if (v >= 0 && (size_t)v < count)
        snprintf(buf, cap, "%s", o->names[v]);
    else
        snprintf(buf, cap, "%lld", v);
}

static int cmd_options(int argc, char **argv) {
    library_t lib = {0};
    library_open(&lib, "libcoralloc");
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--option") == 0 && i + 1 < argc)
            option_apply(&lib, argv[++i]);
        else if (strncmp(argv[i], "--option=", 9) == 0)
            option_apply(&lib, argv[i] + 9);
        else
            usage_error("options: unexpected argument '%s'", argv[i]);
    }
    /* The options were read by dlopen's first call, before --option set them:
     * the value in force is what the environment says now. */
    printf("%-26s %-10s %-22s %-10s %s\n", "option", "default", "accepted", "value", "what");
    coral_option_info_t o;
    for (size_t i = 0; lib.option_info(i, &o) == 0; i++) {
        char var[96], accepted[64], def[32], cur[32];
        snprintf(var, sizeof var, "CORALLOC_%s", o.name);
        long long v = o.default_value;
        const char *env = getenv(var);
        if (env != NULL) lib.option_parse(var, env, &v);
        print_accepted(&o, accepted, sizeof accepted);
        value_text(&o, o.default_value, def, sizeof def);
        value_text(&o, v, cur, sizeof cur);
        printf("%-26s %-10s %-22s %-10s %s%s\n", var, def, accepted, cur, o.help,
               o.runtime ? "" : " [start-up only]");
    }
    return 0;
}

/* ---- run --------------------------------------------------------------------------------- */

static int cmd_run(int argc, char **argv) {
    bool secure = false, stats = false;
    int i = 0;
    const char *opts[256];
    int nopts = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (strcmp(a, "--secure") == 0) {
            secure = true;
        } else if (strcmp(a, "--stats") == 0) {
            stats = true;
        } else if (strcmp(a, "--option") == 0) {
            if (i + 1 >= argc) usage_error("--option wants KEY=VALUE");
            if (nopts == 256) usage_error("too many --option");
            opts[nopts++] = argv[++i];
        } else if (strncmp(a, "--option=", 9) == 0) {
            if (nopts == 256) usage_error("too many --option");
            opts[nopts++] = a + 9;
        } else if (a[0] == '-') {
            usage_error("run: unknown flag '%s'", a);
        } else {
            break; /* the command, without "--" */
        }
    }
    if (i >= argc) usage_error("run: no command given (coralloc run [flags] -- COMMAND ARGS...)");

    library_t lib = {0};
    library_open(&lib, secure ? "libcoralloc-secure" : "libcoralloc");
    for (int k = 0; k < nopts; k++)
        option_apply(&lib, opts[k]);
    if (stats && setenv("CORALLOC_SHOW_STATS", "1", 1) != 0)
        usage_error("cannot set CORALLOC_SHOW_STATS: %s", strerror(errno));

    /* ld.so splits LD_PRELOAD at spaces and colons. */
    if (strpbrk(lib.path, " :\t") != NULL) {
        fprintf(stderr,
                "coralloc: cannot preload %s: LD_PRELOAD cannot hold a path with a space "
                "or a colon\n",
                lib.path);
        return EXIT_CANNOT_RUN;
    }
    const char *old = getenv("LD_PRELOAD");
    char preload[PATH_MAX * 2];
    if (old != NULL && old[0] != '\0')
        snprintf(preload, sizeof preload, "%s:%s", lib.path, old);
    else
        snprintf(preload, sizeof preload, "%s", lib.path);
    setenv("LD_PRELOAD", preload, 1);

    execvp(argv[i], argv + i);
    fprintf(stderr, "coralloc: cannot run %s: %s\n", argv[i], strerror(errno));
    return errno == ENOENT ? EXIT_CANNOT_RUN : 126;
}

int main(int argc, char **argv) {
    if (argc < 2) usage_error("no command given");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        library_t lib = {0};
        if (find_library("libcoralloc", lib.path, sizeof lib.path)) {
            library_open(&lib, "libcoralloc");
            printf("coralloc %s (library %s: %s)\n", CORALLOC_VERSION, lib.path, lib.version());
        } else {
            printf("coralloc %s (library not found)\n", CORALLOC_VERSION);
        }
        return 0;
    }
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "options") == 0) return cmd_options(argc - 2, argv + 2);
    usage_error("unknown command '%s'", cmd);
}
