/* check.h: the assertion macros of coralloc's tests.
 *
 * A failed check prints "file:line: CHECK(...) failed" with the expression
 * (and the values, for the comparisons) on stderr and ends the process with
 * exit status 1 at once (_exit, so that a failure on one thread does not run
 * atexit handlers under the feet of the others). Usable from C and C++.
 */
#ifndef CORAL_TEST_CHECK_H
#define CORAL_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__GNUC__)
#define CHECK_NORETURN_ __attribute__((noreturn, cold, format(printf, 3, 4)))
#else
#define CHECK_NORETURN_
#endif

static void check_fail_(const char *file, int line, const char *fmt, ...) CHECK_NORETURN_;

#include <stdarg.h>
static void check_fail_(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(1);
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) check_fail_(__FILE__, __LINE__, "CHECK(%s) failed", #cond);                   \
    } while (0)

/* CHECK with an explanation: CHECK_MSG(p != NULL, "size %zu", n). */
#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fflush(stdout);                                                                        \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fflush(stderr);                                                                        \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

/* Integer comparisons; both sides are evaluated once and printed. */
#define CHECK_CMP_(a, op, b)                                                                       \
    do {                                                                                           \
        uintmax_t check_a_ = (uintmax_t)(a), check_b_ = (uintmax_t)(b);                            \
        if (!(check_a_ op check_b_))                                                               \
            check_fail_(__FILE__, __LINE__, "CHECK(%s %s %s) failed: %ju (0x%jx) vs %ju (0x%jx)",  \
                        #a, #op, #b, check_a_, check_a_, check_b_, check_b_);                      \
    } while (0)
#define CHECK_EQ(a, b) CHECK_CMP_(a, ==, b)
#define CHECK_NE(a, b) CHECK_CMP_(a, !=, b)
#define CHECK_GE(a, b) CHECK_CMP_(a, >=, b)
#define CHECK_LE(a, b) CHECK_CMP_(a, <=, b)
#define CHECK_GT(a, b) CHECK_CMP_(a, >, b)
#define CHECK_LT(a, b) CHECK_CMP_(a, <, b)

#define CHECK_NULL(p)                                                                              \
    do {                                                                                           \
        const void *check_p_ = (const void *)(p);                                                  \
        if (check_p_ != NULL)                                                                      \
            check_fail_(__FILE__, __LINE__, "CHECK(%s == NULL) failed: %p", #p, check_p_);         \
    } while (0)
#define CHECK_NOT_NULL(p)                                                                          \
    do {                                                                                           \
        if ((const void *)(p) == NULL)                                                             \
            check_fail_(__FILE__, __LINE__, "CHECK(%s != NULL) failed", #p);                       \
    } while (0)

/* p is a multiple of align (a power of two). */
#define CHECK_ALIGNED(p, align)                                                                    \
    do {                                                                                           \
        uintptr_t check_p_ = (uintptr_t)(p);                                                       \
        uintptr_t check_al_ = (uintptr_t)(align);                                                  \
        if (check_p_ % check_al_ != 0)                                                             \
            check_fail_(__FILE__, __LINE__,                                                        \
                        "CHECK_ALIGNED(%s, %s) failed: %p is not a multiple "                      \
                        "of %ju",                                                                  \
                        #p, #align, (void *)check_p_, (uintmax_t)check_al_);                       \
    } while (0)

#endif /* CORAL_TEST_CHECK_H */
