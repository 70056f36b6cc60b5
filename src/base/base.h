/* Layer 1, base: what every other layer may use, and which calls nothing
 * of theirs.
 *
 * It owns: the platform facts (OS page size, cache line, alignment), the
 * messages (coral_fatal, coral_message), the clock, the options read from
 * the environment (CORALLOC_*), the statistics counters (written by every
 * layer where an event happens, read by the api layer's output: counters
 * observe, no policy reads them), the rule by which fork handlers take no
 * lock in a fork from a signal handler, and the one intrusive list every
 * list of the allocator is made of.
 *
 * The layers, lowest first (src/README.md draws the map): base, os,
 * segment, page, heap, api. A file includes and calls only its own layer's
 * header and those of the layers below (tests/check_layers.py checks it). */
#ifndef CORAL_BASE_H
#define CORAL_BASE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "coralloc.h"

#define CORAL_INLINE static inline __attribute__((always_inline))
#define CORAL_NOINLINE __attribute__((noinline))
#define CORAL_COLD __attribute__((cold, noinline))
#define coral_likely(x) __builtin_expect(!!(x), 1)
#define coral_unlikely(x) __builtin_expect(!!(x), 0)
#define coral_container_of(ptr, type, member)                                                      \
    ((type *)(void *)((uint8_t *)(ptr)-offsetof(type, member)))

/* ---- build ----------------------------------------------------------------
 * CORAL_SECURE=1: the secure build (libcoralloc-secure.so): encoded free
 * lists, canaries, guard pages, fill on free, no-access malloc(0). What it
 * adds lives in the page layer (page.h, "the secure build") and in the OS
 * calls it needs; elsewhere it is a constant that folds away. */
#ifndef CORAL_SECURE
#define CORAL_SECURE 0
#endif

/* CORAL_VALGRIND=1 (cmake -DCORAL_VALGRIND=ON): client requests that tell
 * memcheck where coralloc's blocks are (a block is allocated from malloc to
 * free and inaccessible after; the allocator's own reads and writes of free
 * blocks are let through), so that a program run under valgrind gets
 * memcheck's reports about its blocks. Off: CORAL_VG(...) is nothing. */
#ifndef CORAL_VALGRIND
#define CORAL_VALGRIND 0
#endif
#if CORAL_VALGRIND
#include <valgrind/memcheck.h>
#define CORAL_VG(request) request
#else
#define CORAL_VG(request) ((void)0)
#endif
/* Bulk calls go block by block through malloc and free (whose checks or
 * client requests apply to each block). */
#define CORAL_BULK_BLOCKWISE (CORAL_SECURE || CORAL_VALGRIND)

/* CORAL_TEST_HOOKS=1 (the hooks library the interleaving tests link): the
 * test points of test_points.h call the hook a test set. Elsewhere they are
 * nothing. */
#include "base/test_points.h"
#ifndef CORAL_TEST_HOOKS
#define CORAL_TEST_HOOKS 0
#endif
#if CORAL_TEST_HOOKS
extern _Atomic(coral_test_point_fn) coral_test_point_hook;
static inline void coral_test_point(coral_test_point_t point, const void *object) {
    coral_test_point_fn fn = atomic_load_explicit(&coral_test_point_hook, memory_order_acquire);
    if (fn != NULL) fn((int)point, object);
}
#else
#define coral_test_point(point, object) ((void)(point), (void)(object))
#endif

/* ---- platform ------------------------------------------------------------ */
#define CORAL_OS_PAGE_SIZE ((size_t)4096)
#define CORAL_CACHE_LINE 64
#define CORAL_ALIGNMENT 16 /* every malloc result is aligned to this */

/* A value unique among live threads: the thread pointer. */
CORAL_INLINE uintptr_t coral_thread_id(void) { return (uintptr_t)__builtin_thread_pointer(); }

/* x, which the compiler may no longer recompute from what it was made of:
 * keeps a fast path's arithmetic as written where the compiler's own
 * choice costs an instruction more (free: a chunk number shifted back). */
CORAL_INLINE uintptr_t coral_opaque(uintptr_t x) {
    __asm__("" : "+r"(x));
    return x;
}

/* Hold x in the register a function returns its result in (x86-64; a no-op
 * elsewhere): at the end of malloc's fast path the compiler otherwise keeps
 * the block in another register and adds a move before `ret`. */
#if defined(__x86_64__)
#define CORAL_RETURN_REGISTER(x) __asm__("" : "+a"(x))
#else
#define CORAL_RETURN_REGISTER(x) ((void)0)
#endif

/* A short wait in a spin loop. */
CORAL_INLINE void coral_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- forks from signal handlers -------------------------------------------
 * fork() is async-signal-safe, and glibc keeps it so with its malloc in a
 * single-threaded process. A signal handler may fork while its thread is
 * inside the allocator, holding a lock that a prepare handler would wait
 * for forever (a free interrupted in its slow path), or inside another fork,
 * whose prepare handler already holds every lock. The fork handlers (the
 * heap layer's, which run the layers' hooks) keep a coral_fork_nest_t in
 * thread-local storage (only its thread writes it; a signal fence orders
 * it against the handler that interrupts) and ask it:
 * - prepare: coral_fork_nest_enter, true when this fork takes the locks:
 *   not when another fork is in progress on the thread (its prepare holds
 *   them), nor in a single-threaded process (no other thread can hold one;
 *   this one may, interrupted, and waits for the handler to return);
 *   a prepare that takes them ends with coral_fork_nest_prepared;
 * - parent: release the locks if coral_fork_nest_took_locks (a nested
 *   fork's parent leaves them to the outer fork's parent handler);
 * - child: release them if coral_fork_nest_locks_held (the outermost fork
 *   took them: a nested fork's child is the child of a process whose locks
 *   the forking thread all holds, as after any prepare), then
 *   coral_fork_nest_released; else only set the child's state right,
 *   taking and releasing nothing;
 * - both end with coral_fork_nest_leave. A parent or child handler that
 *   releases the locks blocks the signals a handler could fork from until
 *   it has left: a fork from a handler that interrupted the release,
 *   nested, took no lock while other threads took back those already
 *   released, and its child released them under those threads' feet
 *   (window_fork_nested_in_release: a purge's region out of the segment
 *   cache's table was lost to that child). The prepare handler does not
 *   block them while it takes the locks: it may wait there, and a program
 *   that stops its threads with signals (a garbage collector) would wait
 *   for it while a thread it stopped holds the lock it waits for. A fork
 *   from a handler that interrupts it there takes no lock either, and its
 *   child releases the locks that other threads hold, their work half
 *   done (glibc's own fork, interrupted while it takes its malloc's
 *   locks, deadlocks).
 * One lock is left to the code the handler interrupted: the heap pool's,
 * which a thread's first allocation takes (heap/thread.c, pool_held). One
 * is taken again: the exit heap's, recursive (a thread past its exit
 * allocating); another thread's prepare backs off from both rather than
 * wait for them holding the locks before them (fork_lock_to_pool). One
 * is never held by a thread a handler can interrupt without a record its
 * handler reads: the purger's, which program threads hold with every
 * signal blocked (os/purge.c, purger_lock_take) and a fork's prepare holds
 * recorded (purger_lock_forking). A fork from a handler that interrupted
 * any other section holding a lock of the allocator deadlocks in a
 * multi-threaded process, as with glibc's malloc (docs/DESIGN.md, "Thread
 * exit, adoption, fork"). */
typedef struct coral_fork_nest_s {
    unsigned depth;    /* forks in progress on this thread */
    uint32_t lockless; /* bit d: the fork at depth d took no lock */
    bool prepared;     /* the outermost fork's prepare took every lock */
} coral_fork_nest_t;

/* In a single-threaded process (glibc's __libc_single_threaded: false from
 * the first pthread_create on, for good). */
bool coral_process_single_threaded(void);

/* stdio's list of open streams, locked (glibc's _IO_list_lock; nothing with
 * another C library). A fork's prepare handler takes it before any lock of
 * the allocator, and the parent handler gives it back after them: glibc's
 * fork takes it itself only after the prepare handlers have run, and a
 * thread in getline or getdelim holds its stream's lock while it
 * allocates, so with the allocator's locks taken first three threads
 * waited for each other forever (glibc's malloc/tst-malloc-fork-deadlock:
 * the fork held the allocator's locks and waited for the list lock; a
 * thread in fflush(NULL) held that and waited for a stream's lock; a
 * thread in getdelim held that and waited for the allocator's). The lock
 * is recursive (glibc's fork takes it again).
 *
 * In the child, glibc makes the list lock and every listed stream's lock
 * anew before the child handlers run, but only if the process had other
 * threads when its fork began (glibc 2.36, posix/fork.c): a program's
 * prepare handler, run before ours, may start the thread that makes ours
 * take it (window_fork_prepare_starts_thread: the child kept it held by its
 * thread, and another thread's fflush(NULL) there waited forever). The
 * child handler (coral_libc_streams_child) must release it then, and only
 * then: a thread that an earlier child handler started runs meanwhile and
 * may hold it, taken after glibc's reset (test_fork_early
 * child_thread_forks: made anew again under that thread's hold, its count
 * went to -1 at the thread's release, and the child's next fork waited
 * forever). Which one happened, no glibc interface says
 * (__libc_single_threaded reads the same in both), so the prepare handler
 * also locks a witness, after the list lock: a stream of ours in glibc's
 * list, which only a thread that holds the list lock locks (a prepare
 * handler, fflush(NULL)). In the child it is still held by this thread
 * if and only if glibc made nothing anew, and the child handler then
 * releases both as the parent handler does (a release, not a reset, also
 * wakes a thread that waits for the list lock there); else it touches
 * neither. The owner is read from the stream's lock (glibc's layout, the
 * same since 2.3): through the public calls a lock held by the caller and a
 * free one look alike. The first fork that takes the lock makes the
 * witness, under the list lock (no system call, no descriptor; a process
 * that never forks pays nothing for it). Its one allocation, fopencookie's
 * malloc, is served from storage of its own, not from a heap: a first fork
 * from a signal handler made it in the handler, in the heap that the
 * interrupted code may have been changing (the exit heap, past a thread's
 * exit). Where it could not be made, the child handler resets the list
 * lock it holds (which wakes no thread of the child that waits for it).
 * (message.c) */
void coral_libc_streams_lock(void);
void coral_libc_streams_unlock(void);
void coral_libc_streams_child(void);
/* The witness is to be made: this thread's prepare holds the list lock
 * (coral_libc_streams_lock), and no fork made it yet. */
bool coral_libc_streams_witness_wanted(void);
/* Makes the witness (the list lock held) and locks it. Its malloc must
 * reach coral_libc_streams_witness_storage before any heap (the caller
 * sees to it: heap/thread.c, streams_witness_make). */
void coral_libc_streams_witness_make(void);
/* The witness's storage for an allocation of size bytes while
 * coral_libc_streams_witness_make runs on this thread (once), else NULL. */
void *coral_libc_streams_witness_storage(size_t size);

/* ---- the locks a fork holds ------------------------------------------------
 * Every mutex the fork's prepare handler takes (heap/thread.c, "fork") is
 * taken and released through coral_mutex_lock / _trylock / _unlock. From
 * the end of that prepare to the start of the release in the parent or
 * child handler, coral_fork_holding is set on the forking thread (only it
 * writes its own; a signal fence orders it against a handler that
 * interrupts): it holds every one of those locks, so no other thread is
 * inside their critical sections, and it is inside none itself (it is in
 * fork). A program's own fork handlers run then and may allocate: those
 * of a library whose constructor registered them before coralloc's (the
 * loader runs a linked library's constructors before an LD_PRELOADed
 * coralloc's), whose prepare handler runs after ours and whose parent and
 * child handlers run before ours. Their allocations take none of those
 * locks and go on as if the locks were theirs (ctest fork_early_handlers:
 * before, they waited for their own thread). Any other lock is taken as
 * always. So while it is set nothing may wait for another thread of the
 * allocator's (the purge thread) nor start one (os/purge.c).
 *
 * In the child, the early child handlers run before coralloc's has set
 * right what the parent's other threads left in flight, and threads they
 * start run meanwhile: coral_fork_locks_pid, the pid of the process whose
 * fork's prepare took the locks (0: none), set with the flag, cleared in
 * the parent with it and in the child only once its handler has released
 * the locks and made the purge thread's state anew, tells any thread
 * there that it is in such a child (coral_fork_child_unreleased). There a
 * remote free's FREEING state on the forking thread's pages is stale
 * (page/page.c), and no thread signals or starts the purge thread (its
 * lock and condition variables are the parent's, about to be made anew).
 * (message.c defines both.) */
extern __thread bool coral_fork_holding __attribute__((tls_model("initial-exec")));
extern _Atomic(pid_t) coral_fork_locks_pid;

CORAL_INLINE void coral_mutex_lock(pthread_mutex_t *m) {
    if (!coral_fork_holding) pthread_mutex_lock(m);
}

CORAL_INLINE void coral_mutex_unlock(pthread_mutex_t *m) {
    if (!coral_fork_holding) pthread_mutex_unlock(m);
}

/* True when taken (or held by this thread's fork). */
CORAL_INLINE bool coral_mutex_trylock(pthread_mutex_t *m) {
    return coral_fork_holding || pthread_mutex_trylock(m) == 0;
}

/* The forking thread's prepare took every lock (and marks the process's
 * pid), or its release begins. */
CORAL_INLINE void coral_fork_holding_set(bool holding) {
    atomic_signal_fence(memory_order_seq_cst);
    if (holding) atomic_store_explicit(&coral_fork_locks_pid, getpid(), memory_order_relaxed);
    coral_fork_holding = holding;
    atomic_signal_fence(memory_order_seq_cst);
}

/* The release is done (in the child: the state made anew). Release: a
 * thread that reads 0 sees that state. */
CORAL_INLINE void coral_fork_locks_released(void) {
    atomic_store_explicit(&coral_fork_locks_pid, 0, memory_order_release);
}

/* The calling thread is in the child of a fork (or of one nested in it)
 * whose child handler has not yet released the locks. (A system call, only
 * while a fork holds the locks.) */
CORAL_INLINE bool coral_fork_child_unreleased(void) {
    pid_t pid = atomic_load_explicit(&coral_fork_locks_pid, memory_order_acquire);
    return pid != 0 && pid != getpid();
}

CORAL_INLINE bool coral_fork_nest_enter(coral_fork_nest_t *n) {
    unsigned d = n->depth;
    bool lock = d == 0 && !coral_process_single_threaded();
    uint32_t bit = d < 32 ? 1u << d : 0;
    n->lockless = lock ? n->lockless & ~bit : n->lockless | bit;
    atomic_signal_fence(memory_order_seq_cst);
    n->depth = d + 1;
    atomic_signal_fence(memory_order_seq_cst);
    return lock;
}

/* The fork being handled took the locks at its prepare. */
CORAL_INLINE bool coral_fork_nest_took_locks(const coral_fork_nest_t *n) {
    unsigned d = n->depth - 1;
    return d < 32 && !(n->lockless & (1u << d));
}

/* The outermost fork in progress on the thread took the locks: this
 * thread holds them all. */
CORAL_INLINE bool coral_fork_nest_locks_held(const coral_fork_nest_t *n) {
    return n->depth > 0 && !(n->lockless & 1u);
}

/* The prepare handler that took the locks has taken them all. */
CORAL_INLINE void coral_fork_nest_prepared(coral_fork_nest_t *n) {
    atomic_signal_fence(memory_order_seq_cst);
    n->prepared = true;
    atomic_signal_fence(memory_order_seq_cst);
}

/* The child handler released the locks: the forks still in progress on
 * the thread hold none in this process. A nested fork's child whose
 * handler returns goes on with the fork its signal interrupted (after that
 * fork's prepare handler): that fork's parent and child handlers, run in
 * this process and in the child it makes, must release nothing again
 * (window_fork_nested_child_forks: stdio's list lock, released twice, was
 * left with a count of -1 and then held for good). (If the signal
 * interrupted the prepare handler while it took them, it goes on taking
 * the rest, and its parent handler releases them all but stdio's locks
 * made anew, which the child handler forgot: message.c,
 * streams_list_held.) */
CORAL_INLINE void coral_fork_nest_released(coral_fork_nest_t *n) {
    atomic_signal_fence(memory_order_seq_cst);
    if (n->prepared) n->lockless = ~0u;
    n->prepared = false;
    atomic_signal_fence(memory_order_seq_cst);
}

CORAL_INLINE void coral_fork_nest_leave(coral_fork_nest_t *n) {
    atomic_signal_fence(memory_order_seq_cst);
    if (--n->depth == 0) n->prepared = false;
    atomic_signal_fence(memory_order_seq_cst);
}

/* ---- messages and the clock (message.c) ------------------------------------ */

/* "coralloc: error: <what>" on stderr, then abort(). */
CORAL_COLD __attribute__((noreturn, format(printf, 1, 2))) void coral_fatal(const char *fmt, ...);
/* A misuse of the allocator detected at the call that does it (a double
 * free, a pointer coralloc never gave out, an overflow found at free):
 * "coralloc: error: <what>" on stderr, then abort(), unless
 * CORALLOC_ON_ERROR=warn: then it returns, and the caller leaves the block
 * alone (leaks it) and returns as if the call had done nothing. Damage found
 * after the fact, with no call to undo, is coral_fatal. */
CORAL_COLD __attribute__((format(printf, 1, 2))) void coral_misuse(const char *fmt, ...);
/* "coralloc: <what>" on stderr. Neither allocates. */
CORAL_COLD __attribute__((format(printf, 1, 2))) void coral_message(const char *fmt, ...);
/* Milliseconds of CLOCK_MONOTONIC, plus what coral_clock_advance added. */
uint64_t coral_clock_ms(void);
/* Tests: move the allocator's clock forward, so that delayed work (purges,
 * reclaims, idle caches) falls due without waiting. */
void coral_clock_advance(uint64_t ms);

/* Cancellation off for the calling thread while the allocator makes calls
 * that are cancellation points (write, open, read, close): malloc, free
 * and the statistics calls are not cancellation points, and a pending
 * pthread_cancel acting inside one would end the thread holding the
 * allocator's locks, or half way through its output or its error report
 * (whose abort would never come). coral_cancel_off returns the state to
 * give back to coral_cancel_restore. (message.c) */
int coral_cancel_off(void);
void coral_cancel_restore(int state);

/* ---- options (options.c) ----------------------------------------------------
 * Read once from the environment (CORALLOC_<NAME>) at start-up, without
 * allocating; each documented in docs/OPTIONS.md. */
typedef enum coral_option_e {
    CORAL_OPT_VERBOSE,        /* print the options in force at start-up */
    CORAL_OPT_SHOW_STATS,     /* print statistics at exit */
    CORAL_OPT_PURGE_DELAY_MS, /* unused memory is returned after this delay */
    CORAL_OPT_SEGMENT_CACHE,  /* segment cache size, in 4 MiB chunks */
    CORAL_OPT_PURGE_THREAD,   /* purge from a background thread */
    CORAL_OPT_POPULATE,       /* prefault policy: CORAL_POPULATE_* */
    CORAL_OPT_HUGE_PAGES,     /* transparent huge pages for segments */
    CORAL_OPT_FAIL_OS_AFTER,  /* testing: the Nth OS call that can fail fails (0: off) */
    CORAL_OPT_BULK_CACHE_KB,  /* per-thread bulk cache (api/bulk_cache.h) */
    CORAL_OPT_ON_ERROR,       /* a misuse detected: CORAL_ON_ERROR_* */
    CORAL_OPT_OLD_MREMAP,     /* testing: mremap as kernels before 6.17 (os.c) */
    CORAL_OPT_PROFILE_RATE,   /* the heap profiler's mean bytes between samples */
    CORAL_OPT_PROFILE_SIGNAL, /* a signal that writes the heap profile (0: none) */
    CORAL_OPT_PROFILE_LEAKS,  /* print the sampled live blocks' sites at exit */
    CORAL_OPT_COUNT
} coral_option_t;

#define CORAL_POPULATE_OFF 0
#define CORAL_POPULATE_ON 1
#define CORAL_POPULATE_ADAPTIVE 2

#define CORAL_ON_ERROR_ABORT 0
#define CORAL_ON_ERROR_WARN 1

/* Values, indexed by coral_option_t. Written at start-up only (and by
 * coral_option_set for the options that allow it); read with relaxed loads. */
extern int64_t coral_options[CORAL_OPT_COUNT];

static inline int64_t coral_option(coral_option_t opt) {
    return __atomic_load_n(&coral_options[opt], __ATOMIC_RELAXED);
}

void coral_options_init(void);
/* The value of environment variable var, or NULL; always NULL in a process
 * running with privileges its user lacks (set-user-ID: AT_SECURE). Every
 * CORALLOC_* variable is read through it. */
const char *coral_env(const char *var);
/* An option's value also before coral_options_init has run (read from the
 * environment then): for what may happen before the first allocation. */
int64_t coral_option_now(coral_option_t opt);
void coral_options_print(void);
/* The option named name (with or without CORALLOC_), or -1. */
int coral_option_index(const char *name);
/* Whether option i may be set to value at run time: 0, EINVAL (out of
 * range) or EPERM (read at start-up only). */
int coral_option_check(int i, long long value);
/* Option `index` described, with the value in force (the caller has read
 * the options: coral_option_info in the api layer); EINVAL past the last. */
int coral_option_describe(size_t index, coral_option_info_t *out);

/* ---- statistics counters (counters.c) ----------------------------------------
 * Global atomic counters, touched only next to a system call or a segment-
 * or page-level event, never on the malloc/free fast paths. Per size class
 * block counts are compiled in with -DCORAL_STATS=ON (the heap layer keeps
 * them per heap, merged on read). */
typedef enum coral_os_call_e {
    CORAL_OS_MMAP,
    CORAL_OS_MUNMAP,
    CORAL_OS_PURGE,
    CORAL_OS_REMAP,
    CORAL_OS_POPULATE, /* madvise(MADV_POPULATE_WRITE) */
    CORAL_OS_ADVISE,   /* madvise(MADV_HUGEPAGE) */
    CORAL_OS_MINCORE,  /* mincore: the adaptive populate policy's samples */
    CORAL_OS_PROTECT,  /* mprotect: the secure build's guard pages */
    CORAL_OS_UNADVISE, /* madvise(MADV_NOHUGEPAGE): huge pages found slow */
    CORAL_OS_CALL_KINDS
} coral_os_call_t;

#define CORAL_STAT_CLASSES 160 /* size classes, their twins, large/huge, with room to spare */

typedef struct coral_counters_s {
    _Atomic(int64_t) os_calls[CORAL_OS_CALL_KINDS];
    _Atomic(int64_t) os_bytes[CORAL_OS_CALL_KINDS];
    _Atomic(int64_t) mapped, mapped_peak;
    _Atomic(int64_t) segments, segments_peak;
    _Atomic(int64_t) huge_allocs, large_allocs;
    _Atomic(int64_t) segments_abandoned, segments_adopted;
    _Atomic(int64_t) orphans_reclaimed, orphan_bytes_reclaimed;
    /* Empty pages a heap kept, parked and returned by the purger. */
    _Atomic(int64_t) parked_reclaimed, parked_bytes_reclaimed;
    _Atomic(int64_t) aside_reclaimed, aside_bytes_reclaimed;
    _Atomic(int64_t) threads, threads_peak;
    _Atomic(int64_t) page_bytes, page_bytes_peak; /* bytes of pages in use */
    _Atomic(int64_t) huge_bytes, huge_live;       /* huge blocks in use */
    _Atomic(int64_t) huge_pages_slow; /* 2 MiB pages slower to fault in than 4 KiB ones */
    _Atomic(int64_t) bulk_cached, bulk_cached_peak; /* bytes in threads' bulk caches */
    /* Kernel calls failed on purpose (CORALLOC_FAIL_OS_AFTER): what shows a
     * test that its injected failure happened. */
    _Atomic(int64_t) os_failures_injected;
    /* Per class counts of heaps that are gone, and of frees by threads
     * without a heap (CORAL_STATS builds). */
    _Atomic(int64_t) class_allocs[CORAL_STAT_CLASSES], class_frees[CORAL_STAT_CLASSES];
    _Atomic(int64_t) class_peak[CORAL_STAT_CLASSES];
} coral_counters_t;

extern coral_counters_t coral_counters;

static inline void coral_count_os_call(coral_os_call_t kind, size_t bytes) {
    atomic_fetch_add_explicit(&coral_counters.os_calls[kind], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&coral_counters.os_bytes[kind], (int64_t)bytes, memory_order_relaxed);
}

/* Add delta to a gauge and raise its peak. */
static inline void coral_count_gauge(_Atomic(int64_t) *value, _Atomic(int64_t) *peak,
                                     int64_t delta) {
    int64_t now = atomic_fetch_add_explicit(value, delta, memory_order_relaxed) + delta;
    int64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (now > seen && !atomic_compare_exchange_weak_explicit(
                             peak, &seen, now, memory_order_relaxed, memory_order_relaxed)) {
    }
}

static inline void coral_count(_Atomic(int64_t) *counter, int64_t delta) {
    atomic_fetch_add_explicit(counter, delta, memory_order_relaxed);
}

#ifdef CORAL_STATS
#define CORAL_STATS_ENABLED 1
#else
#define CORAL_STATS_ENABLED 0
#endif

/* ---- the intrusive list --------------------------------------------------------
 * A doubly linked list of links embedded in their elements, NULL-terminated
 * both ways: an element is first exactly when its link's prev is NULL, a
 * test the free fast path makes on pages. Not thread-safe: every list
 * names the lock or the owner thread that guards it. */
typedef struct coral_link_s {
    struct coral_link_s *next, *prev;
} coral_link_t;

typedef struct coral_list_s {
    coral_link_t *first, *last;
} coral_list_t;

#define coral_list_entry(link, type, member)                                                       \
    ((link) == NULL ? (type *)NULL : coral_container_of(link, type, member))

static inline void coral_list_push_front(coral_list_t *list, coral_link_t *e) {
    e->prev = NULL;
    e->next = list->first;
    if (list->first)
        list->first->prev = e;
    else
        list->last = e;
    list->first = e;
}

static inline void coral_list_push_back(coral_list_t *list, coral_link_t *e) {
    e->next = NULL;
    e->prev = list->last;
    if (list->last)
        list->last->next = e;
    else
        list->first = e;
    list->last = e;
}

static inline void coral_list_remove(coral_list_t *list, coral_link_t *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        list->first = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        list->last = e->prev;
    e->next = e->prev = NULL;
}

/* An element moved in memory (mremap): its neighbours and the list point at
 * its new place. */
static inline void coral_list_relink(coral_list_t *list, coral_link_t *e) {
    if (e->prev)
        e->prev->next = e;
    else
        list->first = e;
    if (e->next)
        e->next->prev = e;
    else
        list->last = e;
}

#endif /* CORAL_BASE_H */
