/* run-measured: run a program and report its own rusage.
 *
 * usage: run-measured REPORT_FILE PROGRAM [ARGS...]
 *
 * The runner is a Python process of some tens of MiB. A process forked from
 * it keeps that memory's high-water mark: at exec the kernel records the old
 * address space's peak RSS as the process's ru_maxrss, so os.wait4() on a
 * direct child reports at least the runner's size. This small launcher forks
 * the program from a small address space instead, waits for it with wait4()
 * and writes one line to REPORT_FILE:
 *   status=<exit code or -signal> wall=<s> user=<s> sys=<s> maxrss_kib=<n>
 *   minflt=<n> majflt=<n>
 * then exits with the program's exit code (128 + signal when killed).
 *
 * The launcher is not run under the allocator being measured: the runner
 * puts the library to preload in CORALLOC_BENCH_PRELOAD, and only the
 * program's environment gets it as LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s REPORT_FILE PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    const char *report = argv[1];
    const char *preload = getenv("CORALLOC_BENCH_PRELOAD");
    double t0 = now();
    pid_t pid = fork();
    if (pid < 0) {
        perror("run-measured: fork");
        return 125;
    }
    if (pid == 0) {
        if (preload != NULL && preload[0] != '\0')
            setenv("LD_PRELOAD", preload, 1);
        else
            unsetenv("LD_PRELOAD");
        unsetenv("CORALLOC_BENCH_PRELOAD");
        execvp(argv[2], argv + 2);
        fprintf(stderr, "run-measured: cannot run %s: %s\n", argv[2], strerror(errno));
        _exit(127);
    }
    int status;
    struct rusage ru;
    pid_t got;
    do {
        got = wait4(pid, &status, 0, &ru);
    } while (got < 0 && errno == EINTR);
    double wall = now() - t0;
    if (got < 0) {
        perror("run-measured: wait4");
        return 125;
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    FILE *f = fopen(report, "w");
    if (f == NULL) {
        perror("run-measured: report file");
        return 125;
    }
    fprintf(f, "status=%d wall=%.6f user=%.6f sys=%.6f maxrss_kib=%ld minflt=%ld majflt=%ld\n",
            code, wall, (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
            (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6, ru.ru_maxrss,
            ru.ru_minflt, ru.ru_majflt);
    if (fclose(f) != 0) return 125;
    return code >= 0 ? code : 128 - code;
}
