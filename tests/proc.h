/* proc.h: process-level helpers for the C tests: resident memory, and
 * running this test binary again as a child with options in its
 * environment (coralloc reads CORALLOC_* once, at start-up). */
#ifndef CORAL_TEST_PROC_H
#define CORAL_TEST_PROC_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* Resident memory of this process, in KiB (/proc/self/statm). */
static inline size_t rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK_NOT_NULL(f);
    unsigned long size = 0, resident = 0;
    CHECK_EQ(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return resident * (size_t)sysconf(_SC_PAGESIZE) / 1024;
}

static inline size_t rss_mib(void) { return rss_kib() / 1024; }

/* Minor page faults of this process so far (getrusage). */
static inline long minor_faults(void) {
    struct rusage u;
    CHECK_EQ(getrusage(RUSAGE_SELF, &u), 0);
    return u.ru_minflt;
}

/* Run /proc/self/exe with the one argument `mode` and the NAME=value
 * strings of env (NULL-terminated) added to its environment; the child
 * must exit with status 0. */
static inline void run_child(const char *mode, const char *const env[]) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (size_t i = 0; env[i]; i++) putenv((char *)env[i]);
        execl("/proc/self/exe", "/proc/self/exe", mode, (char *)NULL);
        _exit(127);
    }
    int status;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status 0x%x\n", mode, status);
}

#endif /* CORAL_TEST_PROC_H */
