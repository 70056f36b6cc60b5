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
 *   minflt=<n> majflt=<n> [fault_traps=<n>] [rtt_before_ns=<ns> rtt_after_ns=<ns>]
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
 * rtt_before_ns and rtt_after_ns are the cache-line round trip between the
 * first two CPUs the launcher may run on, measured just before the fork and
 * just after the wait (see core_rtt_ns). It is a property of the machine, not
 * of the program: on a virtual machine the host may place the two vCPUs on
 * nearby or distant physical cores, and every cross-thread workload (each
 * block freed by another thread costs a few line transfers) slows with it.
 * The fields are left out when the launcher may run on one CPU only or when
 * CORALLOC_BENCH_NO_RTT is set.
 *
 * The launcher is not run under the allocator being measured: the runner
 * puts the library to preload in CORALLOC_BENCH_PRELOAD, and only the
 * program's environment gets it as LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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

/* ---- cross-CPU round trip ---------------------------------------------- */

#define RTT_BATCH 2000  /* round trips per timed batch */
#define RTT_BATCHES 8   /* batches; the fastest one is the figure */
#define RTT_BUDGET 0.02 /* seconds: give up on the rest past this */
#define RTT_STOP (~0UL) /* the pinger's "done" in the shared word */

/* One line bounced between two threads, each pinned to its CPU: the pinger
 * writes an odd value, the ponger answers with the next even one. */
typedef struct {
    _Alignas(64) atomic_ulong turn;
    int cpu[2];
    double best; /* the pinger's figure, read after the join */
} rtt_t;

static int pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *rtt_pong(void *arg) {
    rtt_t *r = (rtt_t *)arg;
    if (pin_self(r->cpu[1]) != 0) {
        atomic_store(&r->turn, RTT_STOP);
        return NULL;
    }
    /* The answer is a compare-exchange, not a store: the pinger may write
     * RTT_STOP between our load of an odd value and our answer (it gives up
     * at its deadline), and a plain store would overwrite that STOP with an
     * even value no one answers: this thread would spin forever and the
     * launcher would never run the program. */
    for (;;) {
        unsigned long v = atomic_load_explicit(&r->turn, memory_order_acquire);
        if (v == RTT_STOP) return NULL;
        if (v & 1)
            atomic_compare_exchange_strong_explicit(&r->turn, &v, v + 1, memory_order_acq_rel,
                                                    memory_order_acquire);
    }
}

/* The pinger: r->best is the fastest batch's mean round trip in ns; -1 when
 * no batch finished within the budget (the ponger could not run or pin). */
static void *rtt_ping(void *arg) {
    rtt_t *r = (rtt_t *)arg;
    r->best = -1;
    if (pin_self(r->cpu[0]) != 0) {
        atomic_store(&r->turn, RTT_STOP);
        return NULL;
    }
    double deadline = now() + RTT_BUDGET;
    unsigned long v = 0;
    for (int b = 0; b < RTT_BATCHES; b++) {
        double t0 = now();
        int i;
        for (i = 0; i < RTT_BATCH; i++) {
            atomic_store_explicit(&r->turn, ++v, memory_order_release);
            unsigned long spins = 0, seen;
            while ((seen = atomic_load_explicit(&r->turn, memory_order_acquire)) == v)
                if ((++spins & 0xfff) == 0 && now() > deadline) break;
            if (seen == RTT_STOP || seen != v + 1) break;
            v++;
        }
        if (i < RTT_BATCH) break;
        double ns = (now() - t0) * 1e9 / RTT_BATCH;
        if (r->best < 0 || ns < r->best) r->best = ns;
        if (now() > deadline) break;
    }
    atomic_store(&r->turn, RTT_STOP);
    return NULL;
}

/* The round trip between the first two CPUs this process may run on, in ns;
 * -1 when there are not two or when it was not measured. The calling
 * thread's own affinity is left as it was (the program inherits it). */
static double core_rtt_ns(void) {
    if (getenv("CORALLOC_BENCH_NO_RTT") != NULL) return -1;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    static rtt_t r;
    int found = 0;
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
        if (CPU_ISSET(c, &allowed)) r.cpu[found++] = c;
    if (found < 2) return -1;
    atomic_store(&r.turn, 0);
    pthread_t ping, pong;
    if (pthread_create(&pong, NULL, rtt_pong, &r) != 0) return -1;
    if (pthread_create(&ping, NULL, rtt_ping, &r) != 0) {
        atomic_store(&r.turn, RTT_STOP);
        pthread_join(pong, NULL);
        return -1;
    }
    pthread_join(ping, NULL);
    pthread_join(pong, NULL);
    return r.best;
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
    double rtt_before = core_rtt_ns();
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
    double rtt_after = core_rtt_ns();
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
    if (rtt_before >= 0 && rtt_after >= 0)
        fprintf(f, " rtt_before_ns=%.1f rtt_after_ns=%.1f", rtt_before, rtt_after);
    fputc('\n', f);
    if (fclose(f) != 0) return 125;
    return code >= 0 ? code : 128 - code;
}
