/* Messages on stderr (written with one write(2), never allocating: they may
 * run before libc is up, or inside a broken heap) and the allocator's clock. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#endif

#include "base/base.h"

int coral_cancel_off(void) {
    int state = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    return state;
}

void coral_cancel_restore(int state) {
    int ignored;
    pthread_setcancelstate(state, &ignored);
}

static void write_line(const char *prefix, const char *fmt, va_list ap) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    int state = coral_cancel_off();
    ssize_t ignored = write(STDERR_FILENO, buf, len);
    (void)ignored;
    coral_cancel_restore(state);
}

void coral_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_line("coralloc: error: ", fmt, ap);
    va_end(ap);
    abort();
}

void coral_misuse(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_line("coralloc: error: ", fmt, ap);
    va_end(ap);
    if (coral_option_now(CORAL_OPT_ON_ERROR) != CORAL_ON_ERROR_WARN) abort();
}

void coral_message(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_line("coralloc: ", fmt, ap);
    va_end(ap);
}

/* What tests moved the clock forward by (coral_clock_advance). */
static _Atomic(uint64_t) clock_skew_ms;

uint64_t coral_clock_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u +
           atomic_load_explicit(&clock_skew_ms, memory_order_relaxed);
}

__thread bool coral_fork_holding __attribute__((tls_model("initial-exec")));
_Atomic(pid_t) coral_fork_locks_pid;

bool coral_process_single_threaded(void) {
#if __has_include(<sys/single_threaded.h>)
    return __libc_single_threaded != 0;
#else
    return false; /* (a C library without the flag: every fork takes the locks) */
#endif
}

#if defined(__GLIBC__)
/* (exported by glibc since 2.2.5, in no header; called, not tested for, so
 * that the loader binds them at the first fork, not at every start-up) */
extern void _IO_list_lock(void);
extern void _IO_list_unlock(void);
extern void _IO_list_resetlock(void);

/* The witness (base.h, coral_libc_streams_lock): a stream of no file
 * (fopencookie, no descriptor), made by the first fork that takes the list
 * lock (coral_libc_streams_witness_make), never closed. Written once,
 * under the list lock; read by the forks' prepare handlers under it. Locked
 * only with the list lock held, taken first: by those handlers, and by
 * fflush(NULL) (the list lock, then each stream's), so the order of the
 * two is glibc's. */
static FILE *streams_witness;

/* The witness's storage. fopencookie takes it with one malloc, which is
 * this allocator's where it serves malloc: that call is served from here
 * (coral_libc_streams_witness_storage), so that the witness takes no
 * block of a heap that the code a signal handler's fork interrupted may be
 * changing. The size of glibc's stream (struct locked_FILE: 280 bytes on
 * x86-64 and arm64 with glibc 2.36) is not public: a larger one gets NULL,
 * and no witness is made. Lent only by the thread making the witness,
 * during its fopencookie call. */
#define WITNESS_STORAGE 512
static _Alignas(16) unsigned char witness_storage[WITNESS_STORAGE];
static __thread bool witness_storage_lent __attribute__((tls_model("initial-exec")));

/* What this thread's fork holds, from its prepare handler to its parent
 * or child handler: the list lock (streams_list_held) and the witness it
 * locked (NULL: none, or none could be made). Each is recorded as soon as
 * its take returns, and cleared by the release and by a child handler:
 * a fork from a signal handler that interrupts the prepare meanwhile
 * (nested: it takes nothing) makes, in its child, both locks anew (glibc's
 * fork of a multi-threaded process), and if that child's handler returns,
 * the prepare goes on there and its parent and child handlers release only
 * what is still recorded, and what the prepare took after. (Before, the
 * hold was recorded once both were taken, by the caller: a signal between
 * the two left the list lock made anew recorded as held, and its second
 * release left its count of takes at -1, the lock then held for good by
 * the next thread to take it, window_fork_nested_in_streams_lock.) What
 * remains is the store after each take's return (a signal there leaves
 * that lock recorded after its child made it anew), as glibc's own fork
 * has such windows inside _IO_list_lock. Written by this thread only;
 * signal fences order them against its handlers. */
static __thread bool streams_list_held __attribute__((tls_model("initial-exec")));
static __thread FILE *streams_witness_held __attribute__((tls_model("initial-exec")));

static void streams_record(bool *flag, bool value) {
    atomic_signal_fence(memory_order_seq_cst);
    *flag = value;
    atomic_signal_fence(memory_order_seq_cst);
}

/* glibc's lock of a stream, *fp->_lock (sysdeps/nptl/stdio-lock.h: the
 * same fields since glibc 2.3; fp->_lock is public, its type is not): the
 * futex word, the count of takes and the owner, the taking thread's
 * pthread_self (its struct pthread, the same in a fork's child). */
struct glibc_stream_lock {
    int lock;
    int cnt;
    void *owner;
};

/* The witness is held by this thread: the child of a fork whose glibc did
 * not make the streams' locks anew. (Relaxed: another thread of the child,
 * started by an earlier child handler, may be taking it meanwhile; it
 * never writes this thread as the owner.) */
static bool streams_witness_mine(FILE *fp) {
    struct glibc_stream_lock *lock = (struct glibc_stream_lock *)fp->_lock;
    return __atomic_load_n(&lock->owner, __ATOMIC_RELAXED) == (void *)pthread_self();
}

/* Locks the witness just taken or made, and records it. */
static void streams_witness_lock(FILE *witness) {
    flockfile(witness);
    atomic_signal_fence(memory_order_seq_cst);
    streams_witness_held = witness;
    atomic_signal_fence(memory_order_seq_cst);
}
#endif

void coral_libc_streams_lock(void) {
#if defined(__GLIBC__)
    _IO_list_lock();
    streams_record(&streams_list_held, true);
    coral_test_point(CORAL_TP_FORK_STREAMS_LISTED, NULL);
    if (streams_witness != NULL) streams_witness_lock(streams_witness);
#endif
}

bool coral_libc_streams_witness_wanted(void) {
#if defined(__GLIBC__)
    return streams_list_held && streams_witness == NULL;
#else
    return false;
#endif
}

void coral_libc_streams_witness_make(void) {
#if defined(__GLIBC__)
    witness_storage_lent = true;
    atomic_signal_fence(memory_order_seq_cst);
    FILE *made = fopencookie(NULL, "r", (cookie_io_functions_t){0});
    atomic_signal_fence(memory_order_seq_cst);
    witness_storage_lent = false;
    if (made == NULL) return;
    streams_witness = made;
    streams_witness_lock(made);
#endif
}

void *coral_libc_streams_witness_storage(size_t size) {
#if defined(__GLIBC__)
    if (!witness_storage_lent || size > WITNESS_STORAGE) return NULL;
    witness_storage_lent = false;
    return witness_storage;
#else
    (void)size;
    return NULL;
#endif
}

void coral_libc_streams_unlock(void) {
#if defined(__GLIBC__)
    if (streams_witness_held != NULL) funlockfile(streams_witness_held);
    streams_witness_held = NULL;
    if (streams_list_held) _IO_list_unlock();
    streams_list_held = false;
#endif
}

void coral_libc_streams_child(void) {
#if defined(__GLIBC__)
    FILE *witness = streams_witness_held;
    bool list = streams_list_held;
    streams_witness_held = NULL;
    streams_list_held = false;
    if (witness == NULL) {
        if (list) _IO_list_resetlock(); /* (no witness: the fork's start is not known) */
    } else if (streams_witness_mine(witness)) {
        funlockfile(witness);
        if (list) _IO_list_unlock();
    }
#endif
}

void coral_clock_advance(uint64_t ms) {
    atomic_fetch_add_explicit(&clock_skew_ms, ms, memory_order_relaxed);
}

#if CORAL_TEST_HOOKS
/* The hook the test points call (test_points.h); set by a test. */
_Atomic(coral_test_point_fn) coral_test_point_hook;

void coral_test_point_set(coral_test_point_fn fn);
void coral_test_point_set(coral_test_point_fn fn) {
    atomic_store_explicit(&coral_test_point_hook, fn, memory_order_release);
}
#endif
