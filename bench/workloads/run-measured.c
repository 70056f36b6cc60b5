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
 *   minflt=<n> majflt=<n> [fault_traps=<n>]
 * then exits with the program's exit code (128 + signal when killed).
 *
 * fault_traps counts the page faults the program and its descendants took
 * as traps (the perf software event page-faults, opened on the child with
 * inherit and enabled at its exec). It differs from minflt: the kernel adds
 * pages faulted in on a process's behalf through get_user_pages (what
 * madvise(MADV_POPULATE_WRITE) and MAP_POPULATE use) to min_flt, but fires
 * the perf event only for a fault that trapped. So prefaulting cannot lower
 * minflt; it lowers fault_traps. When perf_event_open is refused (no kernel
 * support, perf_event_paranoid, a seccomp filter) or CORALLOC_BENCH_NO_PERF
 * is set, the field is left out: never reported as 0.
 *
 * The launcher is not run under the allocator being measured: the runner
 * puts the library to preload in CORALLOC_BENCH_PRELOAD, and only the
 * program's environment gets it as LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A counter of the page-fault traps of process pid and every process it
 * starts, counting from its next exec (so the launcher's own fork and the
 * waiting below are not counted). -1 when the kernel refuses. */
static int fault_trap_counter_open(pid_t pid) {
    if (getenv("CORALLOC_BENCH_NO_PERF") != NULL) return -1;
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_PAGE_FAULTS;
    attr.disabled = 1;       /* until ... */
    attr.enable_on_exec = 1; /* ... the program starts */
    attr.inherit = 1;        /* its threads and children count too */
    attr.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &attr, pid, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

/* The counter's final value (the program has been reaped: its inherited
 * children's counts were folded in as they exited). -1 on a failed read. */
static long long fault_trap_counter_read(int fd) {
    uint64_t value;
    if (read(fd, &value, sizeof value) != (ssize_t)sizeof value) return -1;
    return (long long)value;
}

/* The child: wait until the parent has attached the counter (it closes the
 * pipe's write end), then exec the program. */
static void run_child(int gate, char **argv, const char *preload) {
    char byte;
    while (read(gate, &byte, 1) < 0 && errno == EINTR) {
    }
    close(gate);
    if (preload != NULL && preload[0] != '\0')
        setenv("LD_PRELOAD", preload, 1);
    else
        unsetenv("LD_PRELOAD");
    unsetenv("CORALLOC_BENCH_PRELOAD");
    execvp(argv[0], argv);
    fprintf(stderr, "run-measured: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s REPORT_FILE PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    const char *report = argv[1];
    const char *preload = getenv("CORALLOC_BENCH_PRELOAD");
    int gate[2];
    if (pipe(gate) != 0) {
        perror("run-measured: pipe");
        return 125;
    }
    double t0 = now();
    pid_t pid = fork();
    if (pid < 0) {
        perror("run-measured: fork");
        return 125;
    }
    if (pid == 0) {
        close(gate[1]);
        run_child(gate[0], argv + 2, preload);
    }
    close(gate[0]);
    int traps_fd = fault_trap_counter_open(pid);
    close(gate[1]); /* the child may exec now */
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
    fprintf(f, "status=%d wall=%.6f user=%.6f sys=%.6f maxrss_kib=%ld minflt=%ld majflt=%ld", code,
            wall, (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
            (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6, ru.ru_maxrss,
            ru.ru_minflt, ru.ru_majflt);
    long long traps = traps_fd >= 0 ? fault_trap_counter_read(traps_fd) : -1;
    if (traps >= 0) fprintf(f, " fault_traps=%lld", traps);
    fputc('\n', f);
    if (fclose(f) != 0) return 125;
    return code >= 0 ? code : 128 - code;
}
