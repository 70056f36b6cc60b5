/* Delayed purging: freed memory goes back to the OS (MADV_DONTNEED) only once
 * it has stayed unused for CORALLOC_PURGE_DELAY_MS, so memory that is freed
 * and soon reused is never purged and refaulted.
 *
 * Who purges: a background thread (CORALLOC_PURGE_THREAD=1, the default),
 * so that memory goes back even when every thread of the program is idle;
 * or, without it, the allocating threads, every so often in their slow
 * paths. The thread is started once PURGER_START_BACKLOG bytes or more wait
 * to be purged (never at start-up, nor for a few pages: a small program does
 * not pay for a thread, nor for the pages its start touches), at the next
 * safe point (the start of a malloc slow path or the end of a free, where
 * the allocator holds no lock). Below that, the allocating threads' slow
 * paths purge. It sleeps on a condition variable when nothing is pending.
 *
 * The backlog is an estimate kept with relaxed atomic adds by the layers
 * above at segment- and page-level events: bytes of free slices that may
 * hold data, dirty bytes in the segment cache, orphan pages, blocks in bulk
 * caches; less what is reused or purged.
 *
 * Wake-up protocol: `pending` is set by whoever leaves something to purge
 * (coral_purger_notify); the thread clears it *before* each pass, and waits
 * only when a pass found nothing and `pending` is still clear. So a
 * notification is never lost, and the futex wake (a system call) happens
 * only on the idle -> busy transition. (One that came while the thread
 * was being started signalled nothing: its starter wakes it,
 * purger_wake_for_notices.) A new purge is never due earlier than
 * the ones already pending (its delay starts now), so a sleeping thread need
 * not be woken for it.
 *
 * The process's end: POSIX ends a process when its last thread ends, and
 * glibc does so by counting its threads, the purge thread among them. So
 * when every program thread has ended with pthread_exit (main's included),
 * the purge thread would keep the process alive forever (it blocks every
 * signal). Each exiting program thread tells it (coral_purger_thread_exiting),
 * also before it runs: a thread past its notice may start it.
 * While the main thread lives the process cannot end that way, so nothing
 * is watched: a thread other than main that exits only asks the purge
 * thread to look once, MAIN_LOOK_MS later (one read of main's
 * /proc/self/task/PID/stat, however many threads exit meanwhile), whether
 * main has ended without telling (a main thread that never allocated). Once
 * main has ended (it told, or the look found it), each exit makes the purge
 * thread look every EXIT_WATCH_STEP_MS, for EXIT_WATCH_MS, then every
 * EXIT_WATCH_SLOW_STEP_MS for as long as the process lives, at the
 * process's threads (/proc/self/task, read with no allocation), and when it
 * is the only one not ended it calls exit(0), as glibc would have for the
 * last thread. So a program that starts and ends threads all day while main
 * lives costs the purge thread at most one small read per MAIN_LOOK_MS,
 * not a directory walk every 5 ms. A program whose last thread never
 * allocated (so never told it) is not seen: the purge thread starts only
 * after 1 MiB was freed, which such a thread has not done. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "os/os.h"

enum { PURGER_OFF, PURGER_WANTED, PURGER_STARTING, PURGER_RUNNING, PURGER_FAILED };

static pthread_mutex_t purger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t purger_cond; /* monotonic: purger_cond_init */
/* Under purger_lock: passes the thread finished, and a test's request for
 * a pass now (coral_purge_wait_pass), both signalled on pass_cond. */
static pthread_cond_t pass_cond;
static uint64_t purger_passes;
static bool purger_test_wake;
static _Atomic(int) purger_pending;
static _Atomic(int) purger_state;
static _Atomic(uint64_t) next_tick_ms; /* throttles purging from slow paths */
static _Atomic(int64_t) purge_backlog; /* bytes waiting to be purged (an estimate) */

#define PURGER_START_BACKLOG ((int64_t)1 << 20)

/* After a program thread's exit notice (once main has ended), the purge
 * thread looks for the process's last thread every EXIT_WATCH_STEP_MS for
 * EXIT_WATCH_MS, then every EXIT_WATCH_SLOW_STEP_MS until the process ends:
 * a thread that told it may still run long (a slow key destructor of the
 * program), and no later notice may come, so the watch never stops once
 * main has ended. */
#define EXIT_WATCH_STEP_MS 5
#define EXIT_WATCH_MS 2000
#define EXIT_WATCH_SLOW_STEP_MS 100
static _Atomic(uint64_t) exit_watch_until_ms; /* coral_clock_ms: end of the fast looks; 0: none */
/* The main thread has ended (it told, or a look found it): set by the
 * exiting main thread or the purge thread, cleared only in a fork's child. */
static _Atomic(bool) main_ended;
/* When the purge thread looks whether main has ended (0: no look asked).
 * Set (from 0) by an exiting thread other than main with a CAS, cleared by
 * the purge thread when it looks. */
#define MAIN_LOOK_MS 100
static _Atomic(uint64_t) main_look_ms;

/* ---- demand: what the program uses, and its recent peak ----------------------------
 * Freed memory is purged only when the program no longer needs it: what the
 * peak of its demand over the last DEMAND_WINDOW says it will use again
 * stays resident, however long each piece of it stayed free. So a program
 * whose threads free memory and other threads take it again (threads that
 * exit and are replaced, a pool that shrinks and grows) does not see it
 * purged between the free and the take and faulted in again, while memory
 * beyond that peak (a freed burst that is not repeated) goes back once it
 * stayed unused for the purge delay.
 *
 * demand_now: bytes of spans in use and of huge blocks, changed by the
 * layers above at each span or huge block taken or given back
 * (coral_purge_demand_add, next to the same events' statistics: a relaxed
 * atomic add, and a load and compare against demand_high). demand_high:
 * the highest demand since the last look, raised by any thread with a CAS
 * (max), so it is exact: demand only exceeds it by a rise, which raises
 * it. demand_peaks: the highest demand seen in each of the last
 * DEMAND_SLOTS slots of the window (DEMAND_WINDOW / DEMAND_SLOTS), packed
 * as (slot number << 40) | (peak in 4 KiB units); a slot names its number,
 * so one from an earlier turn of the ring is seen as stale. A look (every
 * purge pass, coral_purge_keep_bytes) takes demand_high, resetting it to
 * demand now, into the slot of its time (raised with a CAS, never
 * lowered); the peak of the window is then the highest of the window's
 * slots and of demand now. A peak is filed at the look after it, so it is
 * kept from then for the window: memory goes back at most a pass later
 * than the window would say, and the clock is read by passes only, never
 * at a span taken or freed. */
#define DEMAND_SLOTS 8
#define DEMAND_SLOT_SHIFT 40
#define DEMAND_UNITS_MASK (((uint64_t)1 << DEMAND_SLOT_SHIFT) - 1)
#define DEMAND_NUMBER_MASK (((uint64_t)1 << (64 - DEMAND_SLOT_SHIFT)) - 1)
static _Atomic(int64_t) demand_now;
static _Atomic(int64_t) demand_high;
static _Atomic(uint64_t) demand_peaks[DEMAND_SLOTS];

/* The window's slot length (0: no window, purge as soon as due). */
static uint64_t demand_slot_ms(void) {
    return (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS) * CORAL_PURGE_WINDOW_DELAYS /
           DEMAND_SLOTS;
}

void coral_purge_demand_add(int64_t bytes) {
    int64_t level = atomic_fetch_add_explicit(&demand_now, bytes, memory_order_relaxed) + bytes;
    if (bytes <= 0) return;
    int64_t high = atomic_load_explicit(&demand_high, memory_order_relaxed);
    while (level > high &&
           !atomic_compare_exchange_weak_explicit(&demand_high, &high, level, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

/* File the highest demand since the last look in the slot of `number`. */
static void demand_file_peak(uint64_t number, int64_t level) {
    int64_t high = atomic_exchange_explicit(&demand_high, level, memory_order_relaxed);
    if (high < level) high = level;
    uint64_t units = high > 0 ? (uint64_t)high >> 12 : 0;
    if (units > DEMAND_UNITS_MASK) units = DEMAND_UNITS_MASK;
    _Atomic(uint64_t) *slot = &demand_peaks[number % DEMAND_SLOTS];
    uint64_t old = atomic_load_explicit(slot, memory_order_relaxed);
    uint64_t want = number << DEMAND_SLOT_SHIFT | units;
    while ((old >> DEMAND_SLOT_SHIFT) != number || (old & DEMAND_UNITS_MASK) < units)
        if (atomic_compare_exchange_weak_explicit(slot, &old, want, memory_order_relaxed,
                                                  memory_order_relaxed))
            return;
}

size_t coral_purge_keep_bytes(uint64_t now) {
    uint64_t slot_ms = demand_slot_ms();
    int64_t level = atomic_load_explicit(&demand_now, memory_order_relaxed);
    if (slot_ms == 0 || level < 0) return 0;
    uint64_t number = (now / slot_ms) & DEMAND_NUMBER_MASK, peak = (uint64_t)level >> 12;
    demand_file_peak(number, level);
    for (int i = 0; i < DEMAND_SLOTS; i++) {
        uint64_t v = atomic_load_explicit(&demand_peaks[i], memory_order_relaxed);
        uint64_t age = (number - (v >> DEMAND_SLOT_SHIFT)) & DEMAND_NUMBER_MASK;
        if (age < DEMAND_SLOTS && (v & DEMAND_UNITS_MASK) > peak) peak = v & DEMAND_UNITS_MASK;
    }
    uint64_t peak_bytes = peak << 12;
    return peak_bytes > (uint64_t)level ? (size_t)(peak_bytes - (uint64_t)level) : 0;
}

uint64_t coral_purge_recheck_ms(uint64_t now) {
    uint64_t slot_ms = demand_slot_ms();
    return now + (slot_ms != 0 ? slot_ms : 1);
}

/* The stages of a pass (coral_purge_stage_set). Set once each, by the
 * layer that owns what they purge, before it has anything to purge. */
static _Atomic(coral_purge_fn) purge_stages[CORAL_PURGE_STAGES];

void coral_purge_stage_set(coral_purge_stage_t stage, coral_purge_fn fn) {
    atomic_store_explicit(&purge_stages[stage], fn, memory_order_release);
}

/* One purge pass: every stage in order; returns when the next purge is due
 * (0: nothing pending). */
static uint64_t purge_pass(bool force) {
    uint64_t now = coral_clock_ms(), next = 0;
    for (int i = 0; i < CORAL_PURGE_STAGES; i++) {
        coral_purge_fn fn = atomic_load_explicit(&purge_stages[i], memory_order_acquire);
        uint64_t due = fn != NULL ? fn(now, force) : 0;
        if (due != 0 && (next == 0 || due < next)) next = due;
    }
    return next;
}

/* The purge thread's condition variable waits on CLOCK_MONOTONIC, the
 * clock coral_clock_ms reads. */
static void purger_cond_init(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&purger_cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&pass_cond, NULL);
}

/* Under purger_lock: wait on the condition variable until `due`
 * (coral_clock_ms) at the latest. */
static void timed_wait_until(uint64_t due) {
    uint64_t now = coral_clock_ms();
    if (due <= now) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (due - now) % 1000 * 1000000u;
    ts.tv_sec += (time_t)((due - now) / 1000 + ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&purger_cond, &purger_lock, &ts);
}

/* Whether the task `tid` (of this process) has ended: its state in
 * /proc/self/task/TID/stat is Z (an ended thread group leader stays listed
 * as a zombie until the whole process ends) or X, or the task is gone
 * (ENOENT, ESRCH). */
static bool task_ended(const char *tid) {
    char path[64] = "/proc/self/task/", buf[512];
    size_t n = strlen(path), t = strlen(tid);
    if (n + t + sizeof "/stat" > sizeof path) return false;
    memcpy(path + n, tid, t);
    memcpy(path + n + t, "/stat", sizeof "/stat");
    /* Only a task that is gone is ended: an open that failed for another
     * reason (EMFILE: the program uses every descriptor) says nothing. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH;
    ssize_t got = read(fd, buf, sizeof buf - 1);
    int err = errno;
    close(fd);
    if (got < 0) return err == ENOENT || err == ESRCH;
    if (got == 0) return true;
    buf[got] = 0;
    const char *paren = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    if (paren == NULL || paren[1] != ' ') return false;
    return paren[2] == 'Z' || paren[2] == 'X';
}

struct linux_dirent64_s {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

/* A task id's name in /proc/self/task (decimal), without allocating. */
static void task_name(long id, char name[24]) {
    char digits[24];
    int len = 0;
    do digits[len++] = (char)('0' + id % 10);
    while ((id /= 10) > 0);
    for (int i = 0; i < len; i++) name[i] = digits[len - 1 - i];
    name[len] = 0;
}

/* Whether the calling thread is the only one of the process not ended.
 * False when /proc cannot tell. Allocates nothing (getdents64 into a
 * buffer on the stack). */
static bool only_thread_left(void) {
    int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    char self[24];
    task_name(syscall(SYS_gettid), self);
    char buf[1024] __attribute__((aligned(8)));
    bool alone = true, any = false;
    long n;
    while (alone && (n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n && alone;) {
            const struct linux_dirent64_s *d = (const void *)(buf + off);
            off += d->reclen;
            if (d->name[0] == '.') continue;
            any = true;
            if (strcmp(d->name, self) != 0 && !task_ended(d->name)) alone = false;
        }
    }
    close(fd);
    return alone && any;
}

/* The signal mask of the thread that started the purge thread (which
 * itself blocks every signal while the program runs). */
static sigset_t program_mask;

/* No program thread is left: end the process as its last thread's exit
 * would have (glibc calls exit(0) then). The atexit handlers and static
 * destructors run here, with the program's signal mask back (this thread
 * is the process's only one now) and on a program thread's stack size
 * (coral_purger_start_if_wanted). */
static void purger_end_process_if_last(void) {
    coral_test_point(CORAL_TP_PURGER_WATCH, NULL);
    if (!only_thread_left()) return;
    coral_test_point(CORAL_TP_PURGER_LAST_THREAD, NULL);
    pthread_sigmask(SIG_SETMASK, &program_mask, NULL);
    exit(0);
}

/* The process's main thread (the thread group leader, tid == pid) has
 * ended: its task is a zombie until the whole process ends. */
static bool main_thread_ended(void) {
    char pid[24];
    task_name(getpid(), pid);
    return task_ended(pid);
}

/* The purge thread: the look an exiting thread asked for is due; main
 * found ended starts the watch. */
static void purger_look_at_main(void) {
    atomic_store_explicit(&main_look_ms, 0, memory_order_relaxed);
    if (!main_thread_ended()) return;
    atomic_store_explicit(&main_ended, true, memory_order_relaxed);
    atomic_store_explicit(&exit_watch_until_ms, coral_clock_ms() + EXIT_WATCH_MS,
                          memory_order_relaxed);
}

/* A program thread holds purger_lock with every signal blocked, so that no
 * signal handler runs while it holds it: a handler that forks would wait
 * in the prepare (coral_purger_prefork) for the lock its own thread holds,
 * forever (base.h, "forks from signal handlers"; window_purger_lock_signal).
 * It never waits for the lock with them blocked: the holder may be a
 * fork's prepare, which holds it with signals deliverable while it waits
 * for the fork's later locks, and a program that stops its threads with
 * signals (a garbage collector) may have stopped it there: a waiter that
 * could not take that signal would keep the collector waiting for it, and
 * so the prepare, for good. So a take that finds the lock held unblocks
 * the signals, yields and tries again. The sections are short and rare (a
 * wake of the purge thread at a notice or a thread's exit), but for a
 * test's wait for a pass (coral_test_purge_pass: its condition wait takes
 * the lock back with signals blocked). The purge thread runs with every
 * signal blocked and takes the lock directly. */
static void signals_block_all(sigset_t *old) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

static void purger_lock_take(sigset_t *old) {
    for (;;) {
        signals_block_all(old);
        if (coral_mutex_trylock(&purger_lock)) break;
        pthread_sigmask(SIG_SETMASK, old, NULL);
        sched_yield();
    }
    coral_test_point(CORAL_TP_PURGER_LOCKED, NULL);
}

/* This thread's fork's prepare holds purger_lock (coral_purger_prefork to
 * coral_purger_postfork), with signals deliverable: a handler of this
 * thread that gives a notice meanwhile (a free, before coral_fork_holding
 * is set) would retry the take for good, its own thread the holder. So it
 * leaves the wake to the release instead (purger_signal_owed). Both
 * written by this thread only, set and read with signals blocked around
 * the lock's take and release, so that no handler of it finds the lock
 * held and the flag clear. */
static __thread bool purger_lock_forking __attribute__((tls_model("initial-exec")));
static __thread bool purger_signal_owed __attribute__((tls_model("initial-exec")));

static void purger_lock_drop(const sigset_t *old) {
    coral_mutex_unlock(&purger_lock);
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Wake the purge thread (its state RUNNING). Not in a fork's child before
 * its child handler released the locks (base.h, "the locks a fork holds":
 * a program's handler registered before coralloc's, or a thread it
 * started, frees there): the lock and condition variable are the
 * parent's, whose purge thread the child does not have (it may even have
 * held the variable's internal lock at the fork), and the child handler
 * makes them anew, so a thread that waited for that lock then waited
 * forever (test_fork_early child_thread); it forgets what is pending too
 * (coral_purger_postfork). */
static void purger_signal(void) {
    if (coral_fork_child_unreleased()) return;
    if (purger_lock_forking) { /* (a handler's, in its own thread's prepare) */
        purger_signal_owed = true;
        coral_test_point(CORAL_TP_PURGER_SIGNAL_OWED, NULL);
        return;
    }
    sigset_t mask;
    purger_lock_take(&mask);
    pthread_cond_signal(&purger_cond);
    purger_lock_drop(&mask);
}

/* The notice is noted even while no purge thread runs: the thread that
 * gave it (a later key destructor's free) or another may start one after
 * it, and the exit that it noted may have been the last program thread's.
 * A purge thread that starts finds the watch or look asked for (it reads
 * them in its loop), and its starter wakes it for a notice that came while
 * it started (purger_wake_for_notices: a store-load pair with this one). */
void coral_purger_thread_exiting(void) {
    if (syscall(SYS_gettid) == getpid())
        atomic_store_explicit(&main_ended, true, memory_order_relaxed);
    if (atomic_load_explicit(&main_ended, memory_order_relaxed)) {
        atomic_store_explicit(&exit_watch_until_ms, coral_clock_ms() + EXIT_WATCH_MS,
                              memory_order_seq_cst);
    } else {
        uint64_t none = 0;
        if (atomic_load_explicit(&main_look_ms, memory_order_relaxed) != 0 ||
            !atomic_compare_exchange_strong(&main_look_ms, &none, coral_clock_ms() + MAIN_LOOK_MS))
            return; /* a look is asked already */
    }
    /* (seq_cst: purger_wake_for_notices) */
    if (atomic_load_explicit(&purger_state, memory_order_seq_cst) != PURGER_RUNNING) return;
    purger_signal();
}

/* The starter of the purge thread, once its state is RUNNING: a notice that
 * saw it not yet RUNNING signalled nothing (an exit notice, or a free's
 * coral_purger_notify, which leaves `pending` set: every later one then
 * returns at once), and the thread may have looked before the notice and
 * be waiting with no end. Each side stores, then loads what the other
 * stores, all seq_cst: the notice sees RUNNING or this sees the notice,
 * and the thread is woken either way. */
static void purger_wake_for_notices(void) {
    if (atomic_load_explicit(&exit_watch_until_ms, memory_order_seq_cst) == 0 &&
        atomic_load_explicit(&main_look_ms, memory_order_seq_cst) == 0 &&
        atomic_load_explicit(&purger_pending, memory_order_seq_cst) == 0)
        return;
    purger_signal();
}

/* Under purger_lock: sleep until a pass is due (true: `next`, the
 * earliest purge due, has come; or, when none is due, something new is
 * pending; or a test asks for a pass), or until the next look for the
 * process's last thread (false). Notifications wake the wait harmlessly
 * while a purge is due: nothing new is due before it. */
static bool purger_sleep(uint64_t next) {
    for (;;) {
        if (purger_test_wake) return true;
        if (next == 0 && atomic_load_explicit(&purger_pending, memory_order_seq_cst)) return true;
        uint64_t now = coral_clock_ms();
        if (next != 0 && next <= now) return true;
        uint64_t until = atomic_load_explicit(&exit_watch_until_ms, memory_order_relaxed);
        uint64_t look = until == 0    ? 0
                        : now < until ? now + EXIT_WATCH_STEP_MS
                                      : now + EXIT_WATCH_SLOW_STEP_MS,
                 wake = next;
        if (until != 0 && now >= until) coral_test_point(CORAL_TP_EXIT_WATCH_SLOW, NULL);
        uint64_t main_look = atomic_load_explicit(&main_look_ms, memory_order_relaxed);
        if (main_look != 0 && (look == 0 || main_look < look)) look = main_look;
        if (look != 0 && (wake == 0 || look < wake)) wake = look;
        if (wake == 0) {
            coral_test_point(CORAL_TP_PURGER_WAIT, NULL);
            pthread_cond_wait(&purger_cond, &purger_lock);
        } else {
            timed_wait_until(wake);
        }
        if (look != 0 && coral_clock_ms() >= look) return false;
    }
}

static void *purger_main(void *arg) {
    (void)arg;
    uint64_t next = 0;
    bool pass = true;
    for (;;) {
        if (pass) {
            atomic_store_explicit(&purger_pending, 0, memory_order_seq_cst);
            next = purge_pass(false);
        }
        uint64_t main_look = atomic_load_explicit(&main_look_ms, memory_order_relaxed);
        if (main_look != 0 && coral_clock_ms() >= main_look) purger_look_at_main();
        if (atomic_load_explicit(&exit_watch_until_ms, memory_order_relaxed) != 0)
            purger_end_process_if_last();
        coral_mutex_lock(&purger_lock);
        if (pass) {
            /* A test that asked for a pass during this one asks again when
             * it sees it counted (coral_purge_wait_pass loops). */
            purger_test_wake = false;
            purger_passes++;
            pthread_cond_broadcast(&pass_cond);
        }
        pass = purger_sleep(next);
        coral_mutex_unlock(&purger_lock);
    }
    return NULL;
}

/* While this thread's fork holds the locks (base.h), the pass is run here:
 * the purge thread's would wait for those locks, and in the fork's child,
 * before its child handler, the purge thread is the parent's, which the
 * child does not have (test_fork_early purge_pass: both waited forever). */
bool coral_purge_wait_pass(void) {
    if (atomic_load_explicit(&purger_state, memory_order_acquire) != PURGER_RUNNING ||
        coral_fork_holding || coral_fork_child_unreleased()) {
        (void)purge_pass(false);
        return false;
    }
    /* A handler's, in its own thread's prepare: that prepare holds some of
     * the locks a pass takes, and the purge thread's pass would wait for
     * them. No pass. */
    if (purger_lock_forking) return false;
    sigset_t mask;
    purger_lock_take(&mask);
    /* A pass in progress may have read the clock before this call: the
     * pass after it is the first whole pass that starts after it. */
    uint64_t target = purger_passes + 2;
    while (purger_passes < target) {
        purger_test_wake = true;
        atomic_store_explicit(&purger_pending, 1, memory_order_seq_cst);
        pthread_cond_broadcast(&purger_cond);
        pthread_cond_wait(&pass_cond, &purger_lock);
    }
    purger_lock_drop(&mask);
    return true;
}

void coral_purger_notify(void) {
    if (atomic_load_explicit(&purger_pending, memory_order_relaxed)) return;
    if (atomic_exchange_explicit(&purger_pending, 1, memory_order_seq_cst)) return;
    /* (seq_cst: purger_wake_for_notices) */
    if (atomic_load_explicit(&purger_state, memory_order_seq_cst) == PURGER_RUNNING) {
        purger_signal();
    }
}

/* The purge thread is wanted once the backlog reaches the threshold (it is
 * started at the next safe point). */
static void purger_want_if(int64_t backlog) {
    if (backlog < PURGER_START_BACKLOG) return;
    if (atomic_load_explicit(&purger_state, memory_order_relaxed) != PURGER_OFF ||
        !coral_option(CORAL_OPT_PURGE_THREAD))
        return;
    int off = PURGER_OFF;
    atomic_compare_exchange_strong(&purger_state, &off, PURGER_WANTED);
}

/* Bytes that may hold data were freed (bytes > 0), or reused or purged
 * (bytes < 0). */
void coral_purge_backlog_add(int64_t bytes) {
    int64_t now = atomic_fetch_add_explicit(&purge_backlog, bytes, memory_order_relaxed) + bytes;
    if (bytes > 0) purger_want_if(now);
}

/* A free is about to leave `bytes` to purge: when they bring the backlog to
 * the threshold, the purge thread starts now, while they are still in use,
 * so that its start-up allocations (pthread_create allocates) cannot take
 * them: a second free of the same block then still finds it free. Call
 * only where no allocator lock is held. */
void coral_purger_start_ahead(int64_t bytes) {
    purger_want_if(atomic_load_explicit(&purge_backlog, memory_order_relaxed) + bytes);
    coral_purger_start_if_wanted();
}

/* Called at the start of malloc's slow path, where no allocator lock is
 * held: pthread_create may allocate, and does so through us. */
void coral_purger_start_if_wanted(void) {
    int wanted = PURGER_WANTED;
    /* Not while this thread's fork holds every allocator lock, nor in a
     * fork's child before its child handler (base.h): the thread would wait
     * for those locks, and one started in the child had its lock and
     * condition variables made anew under it and was taken for not
     * running, so that a second one started (test_fork_early
     * purger_start). It stays WANTED: the next safe point after the
     * release starts it. */
    if (atomic_load_explicit(&purger_state, memory_order_relaxed) != PURGER_WANTED ||
        coral_fork_holding || coral_fork_child_unreleased() ||
        !atomic_compare_exchange_strong(&purger_state, &wanted, PURGER_STARTING))
        return;
    purger_cond_init(); /* no one waits on or signals it before RUNNING */
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t old;
    /* The thread inherits this mask: no signal meant for the program is
     * ever delivered to it. */
    signals_block_all(&old);
    program_mask = old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* The default stack size (a program thread's: 8 MiB of address space,
     * resident only as it is used), not a small one: when no program
     * thread is left this thread ends the process, running the program's
     * atexit handlers and destructors (a 64 KiB stack overflowed under a
     * handler with a 256 KiB buffer, lifetime_atexit_stack). */
    int rc = pthread_create(&thread, &attr, purger_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) coral_test_point(CORAL_TP_PURGER_STARTED, NULL);
    if (rc != 0)
        coral_message("cannot start the purge thread (error %d): purging from slow paths", rc);
    atomic_store_explicit(&purger_state, rc == 0 ? PURGER_RUNNING : PURGER_FAILED,
                          memory_order_seq_cst); /* purger_wake_for_notices */
    if (rc == 0) purger_wake_for_notices();
}

/* From malloc's slow path, every so often: purge what is due, unless the
 * background thread does it. At most one pass per quarter purge delay. */
void coral_purge_tick(void) {
    if (atomic_load_explicit(&purger_state, memory_order_relaxed) == PURGER_RUNNING) return;
    uint64_t now = coral_clock_ms(),
             due = atomic_load_explicit(&next_tick_ms, memory_order_relaxed);
    if (now < due) return;
    uint64_t step = (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS) / 4 + 1;
    if (!atomic_compare_exchange_strong(&next_tick_ms, &due, now + step)) return;
    (void)purge_pass(false);
}

/* Purge everything purgeable now (coral_collect, malloc_trim). */
void coral_purge_now(void) { (void)purge_pass(true); }

void coral_purger_prefork(void) {
    sigset_t mask;
    purger_lock_take(&mask);
    purger_lock_forking = true;
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
}

/* The child has no purge thread: it starts a new one when it needs it. The
 * condition variable may still count the parent's purge thread as a waiter
 * (it was waiting when the parent forked): signalling it in the child would
 * wait for that thread forever, so the child starts from fresh ones. */
void coral_purger_postfork(bool child) {
    if (!child) {
        sigset_t mask;
        signals_block_all(&mask);
        if (purger_signal_owed) pthread_cond_signal(&purger_cond);
        purger_signal_owed = false;
        purger_lock_forking = false;
        purger_lock_drop(&mask);
        return;
    }
    purger_signal_owed = false;
    purger_lock_forking = false;
#if CORAL_TEST_HOOKS
    /* Only in a child that has another thread (one a program's child
     * handler started): other tests' hooks may take a lock that a parent
     * thread held at the fork. */
    if (!only_thread_left()) coral_test_point(CORAL_TP_FORK_CHILD_PURGER, &purger_lock);
#endif
    pthread_mutex_init(&purger_lock, NULL);
    purger_cond_init();
    int state = atomic_load_explicit(&purger_state, memory_order_relaxed);
    if (state == PURGER_RUNNING || state == PURGER_STARTING)
        atomic_store_explicit(&purger_state, PURGER_OFF, memory_order_relaxed);
    atomic_store_explicit(&purger_pending, 0, memory_order_relaxed);
    atomic_store_explicit(&exit_watch_until_ms, 0, memory_order_relaxed);
    /* The child's one thread (the forking one) is its main thread now. */
    atomic_store_explicit(&main_ended, false, memory_order_relaxed);
    atomic_store_explicit(&main_look_ms, 0, memory_order_relaxed);
}
