/* coralloc: run a command with coralloc preloaded, and list its options.
 *
 *   coralloc run [--secure] [--stats] [--option KEY=VALUE | --option=KEY=VALUE]... [--]
 *                COMMAND [ARGS...]
 *   coralloc run [--profile FILE [--profile-rate BYTES]] [--leaks] [--] COMMAND [ARGS...]
 *   coralloc profile FILE
 *   coralloc options [--option KEY=VALUE | --option=KEY=VALUE]...
 *   coralloc --version
 *   coralloc --help | -h | help
 *
 * The library is found relative to this program's own file (so the same
 * binary works from the build tree, where both sit in one folder, and from an
 * install, bin/ beside lib/): CORAL_REL_LIBDIR is the path from the command's
 * folder to the library's, set by the build. Bad arguments: one line on
 * stderr, exit status 2; what it cannot write to stdout: one line, status 1.
 * See coralloc(1).
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
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "coralloc.h"
#include "profile_report.h"

#ifndef CORAL_REL_LIBDIR
#define CORAL_REL_LIBDIR "../lib"
#endif
#define STR2(x) #x
#define STR(x) STR2(x)
#define SONAME_SUFFIX ".so." STR(CORALLOC_VERSION_MAJOR)

enum { EXIT_WRITE_ERROR = 1, EXIT_USAGE = 2, EXIT_CANNOT_EXECUTE = 126, EXIT_CANNOT_RUN = 127 };

/* The first four lines are the SYNOPSIS of coralloc(1), word for word
 * (check_docs.py synopsis compares them). */
static const char usage[] =
    "usage: coralloc run [--secure] [--stats] [--option KEY=VALUE | --option=KEY=VALUE]... [--] "
    "COMMAND [ARGS...]\n"
    "       coralloc run [--profile FILE [--profile-rate BYTES]] [--leaks] [--] COMMAND [ARGS...]\n"
    "       coralloc profile FILE\n"
    "       coralloc options [--option KEY=VALUE | --option=KEY=VALUE]...\n"
    "       coralloc --version\n"
    "       coralloc --help | -h | help\n"
    "\n"
    "  run       run COMMAND with libcoralloc.so preloaded (LD_PRELOAD), and the\n"
    "            processes it starts, except setuid/setgid programs (ld.so drops\n"
    "            the preload; coralloc run warns for COMMAND) and static binaries;\n"
    "            \"--\" is needed only before a COMMAND that starts with '-'\n"
    "  profile   a short report of a heap profile: top sites by in-use and allocated bytes\n"
    "  options   list every option: name, default, accepted values, value in force\n"
    "\n"
    "  --secure             preload the secure build (libcoralloc-secure.so)\n"
    "  --stats              each process prints coralloc's statistics to stderr at exit\n"
    "                       (CORALLOC_SHOW_STATS=1); nothing from a process that has\n"
    "                       closed its stderr by then\n"
    "  --profile FILE       heap profile: each process writes FILE.PID (pprof format) at\n"
    "                       exit; read it with `coralloc profile` or pprof (docs/PROFILING.md);\n"
    "                       it and --leaks preload the profiling library (libcoralloc-profile.so)\n"
    "  --profile-rate BYTES mean bytes allocated between two samples (default 524288)\n"
    "  --leaks              each process prints the sites of sampled blocks still live at exit\n"
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
        /* The variants a flag asks for: the flag is named. */
        static const struct {
            const char *stem, *flag, *what;
        } variants[] = {{"libcoralloc-secure", "--secure", "the secure build"},
                        {"libcoralloc-profile", "--profile/--leaks", "the profiling library"}};
        for (size_t k = 0; k < sizeof variants / sizeof *variants; k++)
            if (strcmp(stem, variants[k].stem) == 0)
                usage_error("%s: %s (%s.so) is not installed: not in %s nor in %s/%s",
                            variants[k].flag, variants[k].what, stem, dir, dir, CORAL_REL_LIBDIR);
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

/* argv[*i] as "--option KEY=VALUE" (then *i moves to the value) or
 * "--option=KEY=VALUE": the KEY=VALUE text; NULL when it is neither. */
static const char *option_arg(int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (strncmp(a, "--option=", 9) == 0) return a + 9;
    if (strcmp(a, "--option") != 0) return NULL;
    if (*i + 1 >= argc) usage_error("--option wants KEY=VALUE");
    return argv[++*i];
}

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
    for (size_t i = 0; i < klen; i++) key[9 + i] = (char)toupper((unsigned char)k[i]);
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
    while (o->names != NULL && o->names[count] != NULL) count++;
    if (v >= 0 && (size_t)v < count)
        snprintf(buf, cap, "%s", o->names[v]);
    else
        snprintf(buf, cap, "%lld", v);
}

static int cmd_options(int argc, char **argv) {
    library_t lib = {0};
    library_open(&lib, "libcoralloc");
    for (int i = 0; i < argc; i++) {
        const char *kv = option_arg(argc, argv, &i);
        if (kv == NULL) usage_error("options: unexpected argument '%s'", argv[i]);
        option_apply(&lib, kv);
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

/* LD_PRELOAD = the library, then the user's LD_PRELOAD if any, however long:
 * too long for the kernel, execve says so (E2BIG), in one line. */
static void preload_set(const char *lib_path) {
    const char *old = getenv("LD_PRELOAD");
    char *value = NULL;
    if (old != NULL && old[0] != '\0' && asprintf(&value, "%s:%s", lib_path, old) < 0) {
        fprintf(stderr, "coralloc: cannot build LD_PRELOAD: %s\n", strerror(errno));
        exit(EXIT_CANNOT_RUN);
    }
    if (setenv("LD_PRELOAD", value != NULL ? value : lib_path, 1) != 0) {
        fprintf(stderr, "coralloc: cannot set LD_PRELOAD: %s\n", strerror(errno));
        exit(EXIT_CANNOT_RUN);
    }
    free(value);
}

/* The file execvp would run for `command` (searched in PATH when it has no
 * slash), into out; false if none is found. */
static bool command_file(const char *command, char *out, size_t cap) {
    if (strchr(command, '/') != NULL) return snprintf(out, cap, "%s", command) < (int)cap;
    const char *path = getenv("PATH");
    if (path == NULL) path = "/bin:/usr/bin"; /* execvp's default */
    for (const char *dir = path;; dir = strchr(dir, ':') + 1) {
        size_t len = strcspn(dir, ":");
        int n = len ? snprintf(out, cap, "%.*s/%s", (int)len, dir, command)
                    : snprintf(out, cap, "./%s", command); /* an empty entry: "." */
        struct stat st;
        if (n > 0 && n < (int)cap && stat(out, &st) == 0 && S_ISREG(st.st_mode) &&
            access(out, X_OK) == 0)
            return true;
        if (dir[len] == '\0') return false;
    }
}

/* Why running `file` puts ld.so in secure-execution mode (AT_SECURE),
 * where it ignores LD_PRELOAD and removes it from the environment: a
 * setuid or setgid file that changes this process's user or group (on a
 * file system that honours the bits), or one with file capabilities; NULL
 * when it does not. */
static const char *secure_mode_reason(const char *file) {
    struct stat st;
    struct statvfs fs;
    if (stat(file, &st) != 0) return NULL;
    if (statvfs(file, &fs) == 0 && (fs.f_flag & ST_NOSUID)) return NULL;
    if ((st.st_mode & S_ISUID) && st.st_uid != getuid()) return "setuid";
    if ((st.st_mode & S_ISGID) && (st.st_mode & S_IXGRP) && st.st_gid != getgid()) return "setgid";
    if (getuid() != 0 && getxattr(file, "security.capability", NULL, 0) > 0)
        return "given file capabilities";
    return NULL;
}

/* One line on stderr when the preload will be dropped; the command runs. */
static void warn_if_secure_mode(const char *command) {
    char file[PATH_MAX];
    const char *why;
    if (command_file(command, file, sizeof file) && (why = secure_mode_reason(file)) != NULL)
        fprintf(stderr,
                "coralloc: warning: %s is %s: ld.so ignores LD_PRELOAD for it, so neither "
                "it nor the processes it starts use coralloc\n",
                file, why);
}

/* --profile FILE: CORALLOC_PROFILE, made absolute (the command's processes
 * may change folders). */
static void profile_path_set(const char *file) {
    char cwd[PATH_MAX], path[PATH_MAX * 2];
    if (file[0] == '\0') usage_error("--profile wants a file name");
    if (file[0] != '/' && getcwd(cwd, sizeof cwd) != NULL)
        snprintf(path, sizeof path, "%s/%s", cwd, file);
    else
        snprintf(path, sizeof path, "%s", file);
    if (setenv("CORALLOC_PROFILE", path, 1) != 0)
        usage_error("cannot set CORALLOC_PROFILE: %s", strerror(errno));
}

static int cmd_run(int argc, char **argv) {
    bool secure = false, stats = false, leaks = false;
    int i = 0;
    const char *opts[256], *kv, *profile = NULL, *rate = NULL;
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
        } else if (strcmp(a, "--leaks") == 0) {
            leaks = true;
        } else if (strcmp(a, "--profile") == 0 || strcmp(a, "--profile-rate") == 0) {
            if (i + 1 >= argc) usage_error("%s wants a value", a);
            *(strcmp(a, "--profile") == 0 ? &profile : &rate) = argv[++i];
        } else if (strncmp(a, "--profile=", 10) == 0) {
            profile = a + 10;
        } else if (strncmp(a, "--profile-rate=", 15) == 0) {
            rate = a + 15;
        } else if ((kv = option_arg(argc, argv, &i)) != NULL) {
            if (nopts == 256) usage_error("too many --option");
            opts[nopts++] = kv;
        } else if (a[0] == '-') {
            usage_error("run: unknown flag '%s'", a);
        } else {
            break; /* the command, without "--" */
        }
    }
    if (i >= argc)
        usage_error("run: no command given (coralloc run [flags] [--] COMMAND [ARGS...])");

    /* Profiling preloads the profiling library (the default build whose
     * malloc counts for the profiler inline: docs/PROFILING.md, "What it
     * costs"); the secure build profiles through its slow paths. */
    library_t lib = {0};
    library_open(&lib, secure                     ? "libcoralloc-secure"
                       : profile != NULL || leaks ? "libcoralloc-profile"
                                                  : "libcoralloc");
    for (int k = 0; k < nopts; k++) option_apply(&lib, opts[k]);
    if (stats && setenv("CORALLOC_SHOW_STATS", "1", 1) != 0)
        usage_error("cannot set CORALLOC_SHOW_STATS: %s", strerror(errno));
    if (rate != NULL) {
        char opt[64];
        if (profile == NULL && !leaks) usage_error("--profile-rate needs --profile or --leaks");
        snprintf(opt, sizeof opt, "PROFILE_RATE=%s", rate);
        option_apply(&lib, opt);
    }
    if (profile != NULL) profile_path_set(profile);
    if (leaks) option_apply(&lib, "PROFILE_LEAKS=1");

    /* ld.so splits LD_PRELOAD at spaces and colons. */
    if (strpbrk(lib.path, " :\t") != NULL) {
        fprintf(stderr,
                "coralloc: cannot preload %s: LD_PRELOAD cannot hold a path with a space "
                "or a colon\n",
                lib.path);
        return EXIT_CANNOT_RUN;
    }
    preload_set(lib.path);
    warn_if_secure_mode(argv[i]);

    execvp(argv[i], argv + i);
    int err = errno; /* before fprintf, which may fail (a closed stderr) */
    fprintf(stderr, "coralloc: cannot run %s: %s\n", argv[i], strerror(err));
    return err == ENOENT ? EXIT_CANNOT_RUN : EXIT_CANNOT_EXECUTE;
}

/* At exit: output that could not be written (a full disk, a closed
 * stdout) is an error, one line and status 1, never a silent success. */
static void stdout_check_at_exit(void) {
    errno = 0;
    bool flushed = fflush(stdout) == 0;
    if (flushed && !ferror(stdout)) return;
    int err = flushed ? 0 : errno; /* else an earlier write's error, errno long gone */
    fprintf(stderr, "coralloc: cannot write to standard output: %s\n",
            err != 0 ? strerror(err) : "write error");
    _exit(EXIT_WRITE_ERROR);
}

int main(int argc, char **argv) {
    atexit(stdout_check_at_exit);
    if (argc < 2) usage_error("no command given");
    const char *cmd = argv[1];
    bool help = strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0;
    if ((help || strcmp(cmd, "--version") == 0) && argc > 2)
        usage_error("%s: unexpected argument '%s'", cmd, argv[2]);
    if (help) {
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
    if (strcmp(cmd, "profile") == 0) return coralloc_profile_report(argc - 2, argv + 2);
    usage_error("unknown command '%s'", cmd);
}
