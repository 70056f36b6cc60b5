/* Process and thread set-up, thread exit, fork, and the heap pool.
 *
 * Start-up runs on the first allocation of the process, from static memory
 * and without allocating: under LD_PRELOAD that call can come from the
 * dynamic loader or libc before they are fully up. A thread's heap is made
 * on its first allocation; a pthread key's destructor abandons it when the
 * thread exits. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "heap/heap.h"

__thread coral_heap_t *coral_tls_heap __attribute__((tls_model("initial-exec"))) =
    &coral_heap_empty;

/* The heap of a thread that has not allocated yet: every fast path takes
 * its slow path, which sets the thread up. Its direct_end is 0, so the
 * default build's pops never read its direct[], which stays empty: 1025
 * entries naming coral_page_empty would take as many relocations (24 KiB)
 * in the library's first code window (cmake/hot-text.ld). The secure
 * build's malloc and the profiling library's (CORAL_PROFILE_LIB,
 * api/api.h) bound their sizes with a constant instead, and read the
 * table: there every entry names coral_page_empty, a page with no free
 * block. */
coral_heap_t coral_heap_empty = {
#if CORAL_SECURE || CORAL_PROFILE_LIB
    .direct = {[0 ... CORAL_DIRECT_COUNT - 1] = &coral_page_empty},
#endif
    .direct_end = 0,
};

/* ---- the heap pool: heap structs for threads and user heaps ------------------------- */

/* Under heap_pool_lock: the free heaps (a stack through thread_link.next),
 * the rest of the newest mapping, and every heap handed out (registry). */
static pthread_mutex_t heap_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static coral_heap_t *heap_pool_free;
static uint8_t *heap_pool_carve;
static size_t heap_pool_carve_left;
static coral_list_t heaps_live; /* through heap->registry_link */
/* User heaps parked at their thread's exit (coral_heap_park_exited), through
 * heap->thread_link, under heap_pool_lock. */
static coral_list_t heaps_exited;

static void heap_counts_retire(coral_heap_t *heap);

/* Whether the calling thread holds heap_pool_lock: set once its take
 * returns, cleared before its release; written by the thread only, ordered
 * against a signal handler that interrupts it by signal fences. No thread
 * takes the pool's lock while it holds another lock that a fork's prepare
 * takes (a prepare does, but only by a try: fork_lock_to_pool), nor takes one
 * of those under it (exit_heap_make gets its heap before the exit
 * heap's lock). So a fork from a handler that interrupted this thread there
 * leaves the pool's lock to the code it interrupted (fork_prepare): the
 * thread's hold keeps every other thread out of the pool, as the prepare's
 * take would, and the prepare can take every other lock, since no thread
 * that holds one waits for this one (another thread's fork at the same
 * time gives back the earlier locks before it waits for the pool's).
 * The record's two windows, from the take inside pthread_mutex_lock to
 * the record and from the record's clear to the release inside
 * pthread_mutex_unlock, are covered by glibc's record of the owner
 * (pool_held_here). (Cleared after the release instead, a fork there would
 * leave the lock to no one, and its child a pool another thread was
 * changing.) */
static __thread bool pool_held __attribute__((tls_model("initial-exec")));

/* glibc's record of m's owner names the thread of kernel id tid: written
 * inside pthread_mutex_lock right after the take and cleared inside
 * pthread_mutex_unlock right before the release (also for the recursive
 * type), by the holder only, so reading the caller's own id means the
 * caller holds m. Relaxed: the thread reads its own writes, or another
 * thread's id. Another C library: never (no record read). */
static bool mutex_owner_is(pthread_mutex_t *m, int tid) {
#if defined(__GLIBC__)
    return __atomic_load_n(&m->__data.__owner, __ATOMIC_RELAXED) == tid;
#else
    (void)m, (void)tid;
    return false;
#endif
}

/* Whether the calling thread, of kernel id tid, holds heap_pool_lock, for
 * its signal handler's fork: pool_held, or glibc's record of the owner
 * (mutex_owner_is). That record covers pool_held's two windows, where
 * a handler's fork waited for its own thread for good
 * (window_fork_pool_unrecorded_taken, _releasing: a storm of handler forks
 * hung there 4 runs of 12, the signal taken at the call of
 * pthread_mutex_unlock); what remains is glibc's own few instructions
 * between the take and its record, and between the clear and the release. */
static bool pool_held_here(int tid) { return pool_held || mutex_owner_is(&heap_pool_lock, tid); }

/* What a fork's child handler leaves to the release of the pool's lock by
 * the code its signal interrupted (pool_held), since that code is half way
 * through a change of what the lock guards: the forks' count (tid_generation)
 * and the forking thread's parked heaps' old id (0: nothing left). */
static __thread uint32_t pool_child_forks __attribute__((tls_model("initial-exec")));
static __thread int pool_child_parked_tid __attribute__((tls_model("initial-exec")));

static void heaps_exited_postfork_child(int parked_tid, uint32_t forks);

static void pool_lock(void) {
    coral_mutex_lock(&heap_pool_lock);
    coral_test_point(CORAL_TP_HEAP_POOL_UNRECORDED, NULL);
    atomic_signal_fence(memory_order_seq_cst);
    pool_held = true;
    atomic_signal_fence(memory_order_seq_cst);
}

/* The child handler's change that waited for this release (above). Out of
 * line: every section of the pool's lock ends in pool_unlock, and a fork
 * from a handler inside one is rare. */
static CORAL_NOINLINE CORAL_COLD void pool_child_rename(void) {
    heaps_exited_postfork_child(pool_child_parked_tid, pool_child_forks);
    pool_child_forks = 0;
    pool_child_parked_tid = 0;
}

static void pool_unlock(void) {
    if (coral_unlikely(pool_child_forks != 0)) pool_child_rename();
    atomic_signal_fence(memory_order_seq_cst);
    pool_held = false;
    atomic_signal_fence(memory_order_seq_cst);
    coral_test_point(CORAL_TP_HEAP_POOL_UNRECORDED, &heap_pool_lock);
    coral_mutex_unlock(&heap_pool_lock);
}

/* Whether the thread of kernel id tid (of this process) has ended. */
static bool thread_gone(int tid) {
    return syscall(SYS_tgkill, getpid(), tid, 0) != 0 && errno == ESRCH;
}

/* ---- thread heaps by thread id --------------------------------------------------------
 * glibc runs a thread's key destructors for at most 4 rounds. A thread
 * whose first allocation comes in the last one (a program's key visited
 * before coralloc's in that round) sets coralloc's key after its turn:
 * coralloc's exit cleanup never runs, and the thread's heaps are left with
 * their segments, which carry its thread id (its thread pointer). No
 * thread may abandon them but one whose frees are local to them: a later
 * thread with the same thread id, which glibc makes when it gives a new
 * thread the dead one's stack and thread control block (it reuses them
 * first). So each thread's heap is listed by its thread id, and a thread's
 * set-up that finds one listed under its own id (no live thread has it:
 * it is a dead thread's) finishes that thread's cleanup first
 * (thread_clean_dead). Under heap_pool_lock. Only heaps listed since the
 * process's last fork count: a fork child's new threads get the stacks of
 * the parent's other threads, whose heaps the fork may have caught in the
 * middle of an owner's update (no lock guards those): they stay as they
 * were, as they did before this list. */
#define TID_BUCKETS 1024
static coral_list_t heaps_by_tid[TID_BUCKETS];
static uint32_t tid_generation; /* +1 in each fork child */

static coral_list_t *tid_bucket(uintptr_t tid) {
    return &heaps_by_tid[(tid * 0x9E3779B97F4A7C15ull) >> 54];
}

/* Under heap_pool_lock: a thread heap off heaps_by_tid. */
static void heap_tid_unlist(coral_heap_t *heap) {
    coral_thread_t *thread = &heap->thread_storage;
    if (!thread->tid_listed) return;
    coral_list_remove(tid_bucket(thread->segments.thread_id), &thread->tid_link);
    thread->tid_listed = false;
}

/* Under heap_pool_lock: heap, off the registry, on the free pool (a stack
 * through thread_link.next). */
static void heap_pool_push(coral_heap_t *heap) {
    heap_tid_unlist(heap);
    coral_list_remove(&heaps_live, &heap->registry_link);
    heap->thread_link.next = heap_pool_free ? &heap_pool_free->thread_link : NULL;
    heap_pool_free = heap;
}

/* Under heap_pool_lock: the oldest few parked heaps are looked at; those
 * whose thread is gone go back to the pool, the others to the back of the
 * list. So each call looks at other heaps: one whose thread lives on (a
 * later key destructor that blocks, a new thread with the dead one's id)
 * never stops the heaps behind it from being reused. */
static void heaps_exited_reap(void) {
    for (int looked = 0; heaps_exited.first != NULL && looked < 4; looked++) {
        coral_link_t *l = heaps_exited.first;
        coral_heap_t *heap = coral_container_of(l, coral_heap_t, thread_link);
        coral_list_remove(&heaps_exited, l);
        /* (in a fork's child whose rename waits for this section's release,
         * pool_unlock: the forking thread's parked heaps still carry the
         * parent's id, a thread gone here, yet they are its own) */
        bool renamed_later = pool_child_forks != 0 && heap->exited_tid == pool_child_parked_tid;
        if (!renamed_later && thread_gone(heap->exited_tid))
            heap_pool_push(heap);
        else
            coral_list_push_back(&heaps_exited, l);
    }
}

void coral_heap_park_exited(coral_heap_t *heap) {
    pool_lock();
    heap_counts_retire(heap);
    heap->thread = NULL;
    heap->exited_tid = gettid();
    coral_list_push_back(&heaps_exited, &heap->thread_link);
    pool_unlock();
}

bool coral_heap_exited_by_caller(const coral_heap_t *heap) {
    return heap->thread == NULL && heap->exited_tid != 0 && heap->exited_tid == gettid();
}

void coral_heap_forget_exited(coral_heap_t *heap) {
    pool_lock();
    coral_list_remove(&heaps_exited, &heap->thread_link);
    heap->exited_tid = 0;
    heap_pool_push(heap);
    pool_unlock();
}

void coral_heaps_visit(coral_heap_visit_fn fn, void *arg) {
    pool_lock();
    for (coral_link_t *l = heaps_live.first; l != NULL; l = l->next)
        fn(coral_container_of(l, coral_heap_t, registry_link), arg);
    pool_unlock();
}

/* A heap's counts outlive it in the global totals. */
static void heap_counts_retire(coral_heap_t *heap) {
#if CORAL_STATS_ENABLED
    for (int c = 0; c < CORAL_QUEUE_COUNT; c++) {
        coral_count(&coral_counters.class_allocs[c], (int64_t)heap->counts.allocs[c]);
        coral_count(&coral_counters.class_frees[c], (int64_t)heap->counts.frees[c]);
    }
#else
    (void)heap;
#endif
}

coral_heap_t *coral_heap_pool_get(void) {
    pool_lock();
    coral_test_point(CORAL_TP_HEAP_POOL_LOCKED, NULL);
    if (heaps_exited.first != NULL) heaps_exited_reap();
    /* Heaps are carved from 64 KiB mappings one at a time, when needed:
     * carving them all at once would touch (fault in) every page. */
    size_t chunk = 16 * CORAL_OS_PAGE_SIZE;
    size_t each = (sizeof(coral_heap_t) + CORAL_CACHE_LINE - 1) & ~(size_t)(CORAL_CACHE_LINE - 1);
    if (heap_pool_free == NULL && heap_pool_carve_left < each) {
        heap_pool_carve = coral_os_map(chunk);
        heap_pool_carve_left = heap_pool_carve != NULL ? chunk : 0;
    }
    coral_heap_t *heap = heap_pool_free;
    if (heap) {
        heap_pool_free = coral_list_entry(heap->thread_link.next, coral_heap_t, thread_link);
    } else if (heap_pool_carve_left >= each) {
        heap = (coral_heap_t *)heap_pool_carve;
        heap_pool_carve += each;
        heap_pool_carve_left -= each;
    }
    if (heap) {
        memset(heap, 0, sizeof *heap);
        coral_list_push_front(&heaps_live, &heap->registry_link);
    }
    pool_unlock();
    return heap;
}

void coral_heap_pool_put(coral_heap_t *heap) {
    pool_lock();
    coral_test_point(CORAL_TP_HEAP_POOL_LOCKED, heap);
    heap_counts_retire(heap);
    heap_pool_push(heap);
    pool_unlock();
}

/* ---- fork -------------------------------------------------------------------------------
 * The child has one thread (the forking one); every lock must be free in it,
 * and nothing may be left half done by a thread that the child does not
 * have. The prepare handler takes, in this order (released in reverse),
 * unless the fork is nested in another on this thread or the process is
 * single-threaded (base.h, "forks from signal handlers"):
 *   0. glibc's stdio list lock (coral_libc_streams_lock: glibc's fork takes
 *      it only after the prepare handlers, and a thread in getdelim holds
 *      a stream's lock while it allocates; in the child released if glibc
 *      did not make it anew, coral_libc_streams_child);
 *   1. the layer above's (coral_fork_hooks_set: the bulk caches' flush
 *      lock, so no purger flush of a cache is in progress);
 *   2. the exit heap's (allocations of threads past their exit);
 *      then the purger's lock (no purge pass starts or signals);
 *   3. the heap pool's (heap structs handed out or back), unless the code
 *      that the fork's signal handler interrupted holds it (pool_held);
 *      this one and the exit heap's taken by a try: where another thread
 *      holds one, the prepare gives back what it took, waits for that one
 *      holding none, and starts again (fork_lock_to_pool);
 *   4. the huge-block list lock (user heaps' huge blocks: allocated, freed,
 *      moved by mremap, detached at a thread's exit);
 *   5. the abandoned segments' and the segment registry's (adoption,
 *      abandonment, the purger's span locks are taken under the registry);
 *   6. the segment cache's purge lock, its evict lock, then its table's
 *      (no region out of the table, half purged or evicted and not yet
 *      unmapped);
 *   7. the reclaimer's and the orphan list's (no orphan half purged);
 *   8. the layer above's leaf locks (coral_fork_inner_hooks_set: the
 *      profiler's tables, which a thread may take while it holds the exit
 *      heap's lock: taken before it, a sampled allocation of an exiting
 *      thread waited for them while the fork waited for the exit heap,
 *      window_fork_profiled_exit).
 * Locks that a thread takes without waiting (a segment's span_lock, the
 * try-lock of its slices) are not taken: the child frees them all
 * (coral_segment_locks_postfork). The other threads' heaps stay as they
 * were: their blocks remain valid and can be freed (as remote frees) in the
 * child. */

/* The layer above's hooks: the outer ones (coral_fork_hooks_set) run first
 * in prepare and last after, the inner ones (coral_fork_inner_hooks_set)
 * run last in prepare and first after. */
typedef struct fork_hooks_s {
    _Atomic(coral_fork_fn) prepare, parent, child;
} fork_hooks_t;

static fork_hooks_t fork_hooks_outer, fork_hooks_inner;

static void fork_hooks_store(fork_hooks_t *hooks, coral_fork_fn prepare, coral_fork_fn parent,
                             coral_fork_fn child) {
    atomic_store_explicit(&hooks->parent, parent, memory_order_relaxed);
    atomic_store_explicit(&hooks->child, child, memory_order_relaxed);
    atomic_store_explicit(&hooks->prepare, prepare, memory_order_release);
}

void coral_fork_hooks_set(coral_fork_fn prepare, coral_fork_fn parent, coral_fork_fn child) {
    fork_hooks_store(&fork_hooks_outer, prepare, parent, child);
}

void coral_fork_inner_hooks_set(coral_fork_fn prepare, coral_fork_fn parent, coral_fork_fn child) {
    fork_hooks_store(&fork_hooks_inner, prepare, parent, child);
}

/* The parent and child hooks of the fork in progress: those whose prepare
 * hook ran. The hooks may be set while another thread is in fork() (a
 * coralloc loaded by dlopen sets the outer ones in its constructor, the
 * profiler the inner ones at the first allocation): run from the globals,
 * a parent hook would unlock locks its prepare never took (another
 * thread's lock, given away). Written by the prepare handler and read by
 * the parent and child handlers of the same fork, which run on the forking
 * thread (in the child, its copy). Thread-local: glibc (2.36) runs a
 * fork's handlers without its atfork lock held, so another thread's fork
 * may be in its prepare handler meanwhile (window_fork_concurrent). */
typedef struct fork_taken_s {
    coral_fork_fn parent, child;
} fork_taken_t;

static __thread fork_taken_t fork_taken_outer __attribute__((tls_model("initial-exec")));
static __thread fork_taken_t fork_taken_inner __attribute__((tls_model("initial-exec")));

static void fork_hooks_prepare(fork_hooks_t *hooks, fork_taken_t *taken) {
    coral_fork_fn prepare = atomic_load_explicit(&hooks->prepare, memory_order_acquire);
    /* (set before prepare, with release: seen with it) */
    taken->parent = prepare ? atomic_load_explicit(&hooks->parent, memory_order_relaxed) : NULL;
    taken->child = prepare ? atomic_load_explicit(&hooks->child, memory_order_relaxed) : NULL;
    if (prepare != NULL) prepare();
}

static void fork_hook_run(coral_fork_fn fn) {
    if (fn != NULL) fn();
}

static pthread_mutex_t exit_heap_lock;
static coral_heap_t *exit_heap; /* the exit heap (below), under exit_heap_lock */

/* A recursive mutex is unlocked only by its owner, and the child's thread
 * has another kernel id than the one that locked it in the parent (glibc
 * checks: EPERM, the lock left held): the child starts from a fresh one. */
static void exit_heap_lock_postfork(bool child) {
    if (!child) {
        coral_mutex_unlock(&exit_heap_lock);
        return;
    }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&exit_heap_lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

/* The forking thread's kernel id in the parent (its parked heaps are its
 * own in the child too, where it has another id). Thread-local, as
 * fork_taken_outer: another thread's fork may write its own meanwhile.
 * Written by the outermost fork in progress on the thread only: a fork
 * nested in it from a program's child handler run before coralloc's runs
 * in the child, whose parked heaps still have the parent's id until that
 * handler renames them, and so has that fork's own child (test_fork_early
 * nested_parked: the child's id written there, neither renamed them). */
static __thread int fork_parent_tid __attribute__((tls_model("initial-exec")));

/* The child: user heaps that the forking thread parked at its exit (it
 * forked from a later key destructor) are still its own, so it may destroy
 * them; they take its new id. The other parked heaps' threads do not exist
 * in the child: their structs are reused (heaps_exited_reap). The thread
 * heaps listed by id so far are left as they are (heaps_by_tid). */
static void heaps_exited_postfork_child(int parked_tid, uint32_t forks) {
    tid_generation += forks; /* (heaps_by_tid) */
    int tid = gettid();
    for (coral_link_t *l = heaps_exited.first; l != NULL; l = l->next) {
        coral_heap_t *heap = coral_container_of(l, coral_heap_t, thread_link);
        if (heap->exited_tid == parked_tid) heap->exited_tid = tid;
    }
}

/* The same, in a fork's child handler: at once, under the prepare's hold of
 * the pool's lock (or with no other thread); or, where the code that the
 * fork's signal handler interrupted holds it (pool_held), at that code's
 * release of it (pool_unlock), once what it changes is whole. A fork made
 * in that child before the release (from its handler) adds its count and
 * keeps the first fork's id, which the parked heaps still carry. */
static void heaps_exited_postfork_child_now_or_later(void) {
    if (!pool_held) {
        heaps_exited_postfork_child(fork_parent_tid, 1);
        return;
    }
    if (pool_child_forks++ == 0) pool_child_parked_tid = fork_parent_tid;
}

/* Whether the outermost fork in progress on this thread left the pool's
 * lock to the code its signal handler interrupted (pool_held), and so takes
 * and releases it nowhere. Written by the outermost prepare before its
 * first lock, so that a fork nested in it from a signal handler, which may
 * take the locks in its stead, reads this fork's value, not a stale one. */
static __thread bool fork_pool_left __attribute__((tls_model("initial-exec")));

/* This thread's forks in progress (base.h, "forks from signal handlers"). */
static __thread coral_fork_nest_t fork_nest __attribute__((tls_model("initial-exec")));

static void process_init_before_fork(void);
static void streams_witness_make(void);

/* Blocks the signals a handler could fork from while a parent or child
 * handler releases the locks (base.h, "forks from signal handlers"). A
 * fault's signal stays deliverable: blocked, the kernel would end the
 * process at it without the program's handler. */
static void fork_signals_block(sigset_t *old) {
    sigset_t set;
    sigfillset(&set);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&set, faults[i]);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

static void fork_signals_restore(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

/* Child handlers on this thread that released the locks (fork_child):
 * counted so that a back-off can tell that one ran, in a fork nested in it
 * (fork_back_off). Written by this thread only (its handlers included). */
static __thread unsigned fork_child_releases __attribute__((tls_model("initial-exec")));

/* Whether the back-off holds busy, after its take, signals blocked; releases
 * is fork_child_releases before its wait. No child handler ran since: it
 * does. One did, in a fork nested in the back-off, in whose child this
 * goes on: in the wait, the take came after that handler's release of busy
 * (or its making anew: the exit heap's) and holds it
 * (window_fork_back_off_wait_nested); after the take, that handler
 * released it (window_fork_back_off_nested). glibc's record of the owner
 * tells the two apart (mutex_owner_is): the take writes the id of its
 * thread, read after the take (in the child, the child's), and the release
 * and the making clear it. What remains is glibc's own few instructions
 * between the take and its record. Elsewhere: held only where none ran. */
static bool fork_back_off_holds(pthread_mutex_t *busy, unsigned releases) {
    return fork_child_releases == releases || mutex_owner_is(busy, gettid());
}

/* A prepare's back-off: busy, a lock that another thread held at the
 * prepare's try (below), and every lock the prepare took before it, from
 * stdio's list lock to the purger's (exit_heap_held: busy is the pool's)
 * or to the bulk caches' (not: busy is the exit heap's): gives those back,
 * in reverse, and waits for busy holding none of them (takes it and
 * releases it at once). The wait has signals deliverable (the prepare's
 * rule: base.h, "forks from signal handlers"). A fork from a handler
 * meanwhile is nested: its child handler releases every lock, busy too,
 * and if it returns this back-off goes on in that child. There busy is
 * held or not by where that fork came (fork_back_off_holds): the back-off
 * releases it only if it holds it, checked with signals blocked up to the
 * release, so that no child handler runs between the two. (A second
 * release of the pool's lock there let it go under a thread that a
 * program's child handler started and that took it in between; a hold
 * kept there left the retry waiting for its own thread, for good.) Out of
 * line and cold: reached only while another thread holds one of those two
 * locks at a fork. */
static CORAL_COLD void fork_back_off(pthread_mutex_t *busy, bool exit_heap_held) {
    if (exit_heap_held) {
        coral_purger_postfork(false);
        coral_mutex_unlock(&exit_heap_lock);
    }
    fork_hook_run(fork_taken_outer.parent);
    coral_libc_streams_unlock();
    unsigned releases = fork_child_releases;
    atomic_signal_fence(memory_order_seq_cst);
    coral_mutex_lock(busy);
    coral_test_point(CORAL_TP_FORK_BACK_OFF_TAKEN, busy);
    sigset_t mask;
    fork_signals_block(&mask);
    if (fork_back_off_holds(busy, releases)) {
        coral_test_point(CORAL_TP_FORK_BACK_OFF_RELEASING, busy);
        coral_mutex_unlock(busy);
    }
    fork_signals_restore(&mask);
}

/* The prepare's locks up to the pool's (0 to 3 above), in order; false,
 * holding none of them, after a back-off (the prepare starts again).
 * Two of them a signal handler's fork on the thread that holds them takes
 * nothing from, and goes past: the exit heap's (recursive: taken again)
 * and the pool's (left to the code the signal interrupted, pool_held).
 * That fork takes every other lock, those before them too (stdio's list
 * lock first). A prepare on another thread that waited for one of the two
 * while holding those waited for a thread that waited for it, for good
 * (window_fork_two_forks: thread B forks while thread A's first malloc
 * holds the pool's lock and A's handler forks; window_fork_two_forks_exit
 * heap: the same while A, past its exit, allocates from the exit heap).
 * So the prepare takes those two only by a try, and where another thread
 * holds one it backs off (fork_back_off) and starts again.
 * No cycle: a prepare waits for one of the two only in the back-off,
 * holding none of the fork's locks it took; it takes them while holding
 * earlier ones only by a try, which waits for nothing; and a thread that
 * holds one of the fork's locks takes none before it in this order (the
 * pool's under none: pool_held; the exit heap's struct comes from the pool
 * before its lock, exit_heap_make). So the holder of the lock waited for
 * either ends its section, which waits for no lock this prepare holds, or
 * has a handler whose fork waits for locks this prepare has given back;
 * and once the prepare holds the two, the holders of the later locks it
 * waits for wait for nothing it holds. (Two handlers' forks, one over a
 * pool section and one over an exit heap section on another thread, still
 * wait for each other: each needs the lock the other's interrupted code
 * holds, which neither may leave to a thread its child does not have.)
 * No lost wakeup: the wait is the mutex's own take; a release before it
 * lets it return at once. Progress: each failed try follows another
 * thread's take of the lock (a short section: a thread's set-up or exit,
 * a user heap's creation or end, an exiting thread's allocation), and the
 * prepare tries again once that one ends; it waits longer only while
 * other threads keep taking the lock between its wait and its try.
 * A signal handler's fork on this thread meanwhile is nested, as anywhere
 * in the prepare, and takes no lock (base.h, "forks from signal handlers"). */
static bool fork_lock_to_pool(void) {
    coral_libc_streams_lock(); /* before every lock of ours (base.h) */
    if (coral_unlikely(coral_libc_streams_witness_wanted())) streams_witness_make();
    fork_hooks_prepare(&fork_hooks_outer, &fork_taken_outer);
    if (!coral_mutex_trylock(&exit_heap_lock)) {
        fork_back_off(&exit_heap_lock, false);
        return false;
    }
    coral_purger_prefork();
    if (fork_pool_left || coral_mutex_trylock(&heap_pool_lock)) return true;
    fork_back_off(&heap_pool_lock, true);
    return false;
}

static void fork_prepare(void) {
    coral_test_point(CORAL_TP_FORK_PREPARE, NULL);
    process_init_before_fork(); /* before any lock: the initialisation takes none of them */
    if (fork_nest.depth == 0) {
        fork_parent_tid = gettid();
        fork_pool_left = pool_held_here(fork_parent_tid);
    }
    if (!coral_fork_nest_enter(&fork_nest)) return;
    while (!fork_lock_to_pool()) continue;
    coral_huge_lists_lock();
    coral_segment_locks_prefork();
    coral_segment_cache_prefork();
    coral_orphans_prefork();
    fork_hooks_prepare(&fork_hooks_inner, &fork_taken_inner);
    coral_fork_nest_prepared(&fork_nest);
    coral_fork_holding_set(true); /* (base.h, "the locks a fork holds") */
    coral_test_point(CORAL_TP_FORK_PREPARED, NULL);
}

/* In the child the locks are unlocked as in the parent (the child's
 * thread took them, and a default mutex has no owner check), not made
 * anew: to TSan a lock made anew stays held until the child's handlers are
 * done, and a program's child handler that allocates then takes the locks
 * taken before it "while holding" it, a lock-order inversion
 * (window_fork_atfork_first under TSan). The recursive exit heap lock
 * cannot be unlocked there (exit_heap_lock_postfork), and the purger's is
 * made anew with its condition variables: both come before every lock
 * that allocation takes, so they close no such cycle. */
static void fork_unlock(bool child) {
    coral_orphans_postfork();
    coral_segment_cache_postfork();
    coral_segment_locks_postfork(child);
    coral_huge_lists_unlock();
    coral_purger_postfork(child);
    exit_heap_lock_postfork(child);
    /* Last: in the child, threads that a program's child handler started
     * before this one (base.h, "the locks a fork holds") run meanwhile;
     * each takes its heap here first, so none is past its exit (taking the
     * exit heap's lock) before that lock is made anew. The code that a
     * fork's signal handler interrupted releases its own hold (pool_held). */
    if (!fork_pool_left) coral_mutex_unlock(&heap_pool_lock);
}

static void fork_parent(void) {
    if (!coral_fork_nest_took_locks(&fork_nest)) {
        coral_fork_nest_leave(&fork_nest);
        return;
    }
    sigset_t mask;
    fork_signals_block(&mask);
    coral_fork_holding_set(false);
    coral_fork_locks_released(); /* (read in a child only) */
    fork_hook_run(fork_taken_inner.parent);
    fork_unlock(false);
    fork_hook_run(fork_taken_outer.parent);
    coral_libc_streams_unlock(); /* (what is still held: base.h) */
    coral_test_point(CORAL_TP_FORK_RELEASED, NULL);
    coral_fork_nest_leave(&fork_nest);
    fork_signals_restore(&mask);
}

static void fork_child_state(void);

static void fork_child(void) {
    heaps_exited_postfork_child_now_or_later();
    /* No lock taken: the parent had no other thread (no lock to release,
     * no notice in flight, no purge thread to forget), or the fork is
     * nested in one whose child released them. */
    if (!coral_fork_nest_locks_held(&fork_nest)) {
        coral_fork_nest_leave(&fork_nest);
        return;
    }
    sigset_t mask;
    fork_signals_block(&mask);
    coral_fork_holding_set(false);
    fork_child_state();
    fork_child_releases++; /* (fork_back_off) */
    coral_fork_nest_released(&fork_nest);
    coral_fork_nest_leave(&fork_nest);
    fork_signals_restore(&mask);
}

/* The child of a fork whose prepare took every lock: releases them and sets
 * what other threads left in flight right. */
static void fork_child_state(void) {
    fork_hook_run(fork_taken_inner.child);
    fork_unlock(true);
    coral_libc_streams_child(); /* (base.h) */
    /* A thread that forks past its exit cleanup (from a later key
     * destructor) told the parent's purge thread; the child's forgot it
     * (coral_purger_postfork), and the thread, the child's only one, will
     * not tell again: it tells the child's, which a later free may start,
     * so that its end still ends the child. */
    if (coral_thread_exiting()) coral_purger_thread_exiting();
    fork_hook_run(fork_taken_outer.child);
    /* The exit heap is the child's too (its exiting threads allocate from
     * it): a parent thread's notice to it in flight is as for the forking
     * thread's heaps (window_fork_exit_heap_notice). */
    coral_heap_t *exiting = __atomic_load_n(&exit_heap, __ATOMIC_RELAXED);
    if (exiting != NULL) coral_heap_after_fork_child(exiting);
    coral_heap_t *heap = coral_tls_heap;
    if (heap != &coral_heap_empty)
        for (coral_link_t *l = heap->thread->heaps.first; l != NULL; l = l->next)
            coral_heap_after_fork_child(coral_container_of(l, coral_heap_t, thread_link));
    coral_fork_locks_released(); /* the state is the child's now (base.h) */
}

/* ---- process start-up ------------------------------------------------------------------- */

static pthread_key_t thread_key;
/* The process's first initialisation: 0 not started, PROCESS_READY done,
 * else the id (coral_thread_id) of the thread running it, claimed by one
 * CAS from 0, so that a fork can tell whose it is (process_init_before_fork). */
#define PROCESS_READY ((uintptr_t)1)
static _Atomic(uintptr_t) process_state;
static _Atomic(bool) fork_handlers_registered;
static _Atomic(coral_thread_exit_fn) thread_exit_hook;

static void thread_done(void *value);

void coral_process_init(void) {
    if (atomic_load_explicit(&process_state, memory_order_acquire) == PROCESS_READY) return;
    uintptr_t expected = 0;
    if (!atomic_compare_exchange_strong(&process_state, &expected, coral_thread_id())) {
        while (atomic_load_explicit(&process_state, memory_order_acquire) != PROCESS_READY)
            sched_yield();
        return;
    }
    coral_test_point(CORAL_TP_PROCESS_STARTING, NULL);
    coral_options_init(); /* reads the environment; does not allocate */
    coral_segments_init();
    coral_orphans_init();
    if (CORAL_SECURE) coral_secure_init(); /* before the first block */
    if (pthread_key_create(&thread_key, thread_done) != 0)
        coral_message("pthread_key_create failed: heaps of exiting threads are not reclaimed");
    atomic_store_explicit(&process_state, PROCESS_READY, memory_order_release);
}

/* A fork's prepare ends the process's first initialisation before any
 * lock: it runs it when no thread has claimed it, or waits for the thread
 * that has. A fork made while another thread ran it gave the child a
 * process still "starting" with no thread to end it: the child's first
 * allocation waited forever (window_fork_process_init when the other
 * thread had claimed it before the prepare looked, and
 * window_fork_process_init_unclaimed when it claimed it after). The
 * initialisation takes none of the locks a fork takes, allocates nothing
 * and waits for no thread but the one running it, so it ends. A fork from
 * a signal handler on the thread that runs it does not wait (for itself):
 * the code it interrupted ends the initialisation in the child too, once
 * the handler returns. */
static void process_init_before_fork(void) {
    uintptr_t state = atomic_load_explicit(&process_state, memory_order_acquire);
    if (state == PROCESS_READY || state == coral_thread_id()) return;
    if (state != 0) coral_test_point(CORAL_TP_FORK_INIT_WAIT, NULL);
    coral_process_init();
}

/* The fork handlers, once. They take and release every lock of the
 * allocator, so a program's own handlers that allocate or free must run
 * outside them: glibc runs the prepare handlers last registered first, the
 * parent and child handlers in their order of registration, so these are
 * registered before any of the program's can be, when the library is
 * loaded (a library loaded earlier than this one may still register
 * first). Registered at the first allocation instead, they came after
 * those of a program that registered its own before it allocated: its
 * prepare handler's malloc then waited forever for a lock its own thread
 * held (window_fork_atfork_first). The first allocation registers them if
 * it comes before the load's constructors (another library's). glibc's
 * registration allocates past 48 handlers: that malloc finds them
 * registered. */
static void fork_handlers_register(void) {
    if (atomic_exchange_explicit(&fork_handlers_registered, true, memory_order_relaxed)) return;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

__attribute__((constructor(101))) static void fork_handlers_at_load(void) {
    fork_handlers_register();
}

/* Set-up that may allocate: done once the first heap exists. */
static void process_init_late(void) {
    static _Atomic(bool) done;
    if (atomic_exchange_explicit(&done, true, memory_order_relaxed)) return;
    fork_handlers_register();
    if (coral_option(CORAL_OPT_VERBOSE)) coral_options_print();
}

void coral_thread_exit_hook_set(coral_thread_exit_fn fn) {
    atomic_store_explicit(&thread_exit_hook, fn, memory_order_release);
}

void coral_thread_exit_hook_set_if_none(coral_thread_exit_fn fn) {
    coral_thread_exit_fn none = NULL;
    atomic_compare_exchange_strong_explicit(&thread_exit_hook, &none, fn, memory_order_release,
                                            memory_order_relaxed);
}

/* The calling thread is setting up its heap (in coral_thread_init), with
 * the heap pool's lock held at times (and, finishing a dead thread's
 * cleanup, other locks) and its state half made: a malloc in
 * a signal handler that interrupted it there (POSIX does not allow one;
 * programs do it) gets NULL, ENOMEM: setting the thread up again would
 * wait for good for the lock its own thread holds, or for the process's
 * setup it interrupted. Written by its own thread only, ordered
 * against the handler that interrupts it by a signal fence. */
static __thread bool coral_tls_setting_up __attribute__((tls_model("initial-exec")));

/* ---- the exit heap --------------------------------------------------------------------
 * A thread whose exit has begun (thread_done ran and abandoned its heaps)
 * may still allocate: later pthread key destructors, C++ thread_local
 * destructors, the purge thread's creation. It must not get a heap of its
 * own again: glibc runs key destructors a bounded number of rounds (4), so
 * a heap made in the last one would never be abandoned, keeping every
 * segment it took, with the dead thread's id on its pages. So from the
 * start of thread_done on, the thread's coral_tls_heap stays the empty heap
 * (every allocation takes the slow path) and its allocations come from one
 * process-wide heap, under exit_heap_lock (recursive: a slow path may start
 * the purge thread, whose creation allocates on the same thread, at the
 * safe point where a thread's own heap allows it too). Its segments carry
 * a thread id that no thread has (the address of exit_heap), so every free
 * of its blocks, by any thread, is a remote free, which the heap takes back
 * when it next allocates. It is never abandoned. */
static pthread_mutex_t exit_heap_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
/* (exit_heap, declared above: made on first use.) */
static __thread bool coral_tls_exiting __attribute__((tls_model("initial-exec")));

bool coral_thread_exiting(void) { return coral_tls_exiting; }

/* The exit heap's making, at its first use (once a process): its struct
 * from the pool before the exit heap's lock (no lock a fork takes is held
 * while the pool's is taken: pool_held above); a thread that finds the
 * heap made meanwhile gives its struct back with the exit heap's lock
 * released. exit_heap is written under its lock and read without it by
 * coral_exit_heap_acquire (atomic accesses: a thread that reads it set
 * finds it whole under the lock). Out of line, off the first 64 KiB of
 * code (cmake/hot-text.ld). */
static CORAL_COLD void exit_heap_make(void) {
    coral_heap_t *spare = coral_heap_pool_get();
    coral_mutex_lock(&exit_heap_lock);
    if (spare != NULL && exit_heap == NULL) {
        coral_thread_t *thread = &spare->thread_storage;
        thread->segments.thread_id = (uintptr_t)&exit_heap;
        thread->heap_default = spare;
        coral_list_push_front(&thread->heaps, &spare->thread_link);
        coral_heap_init(spare, thread);
        spare->is_default = true;
        __atomic_store_n(&exit_heap, spare, __ATOMIC_RELAXED);
        spare = NULL;
    }
    coral_mutex_unlock(&exit_heap_lock);
    if (spare != NULL) coral_heap_pool_put(spare);
}

coral_heap_t *coral_exit_heap_acquire(void) {
    /* Only a signal handler's allocation comes here while the thread sets
     * up (a dead thread's cleanup, thread_clean_dead, marks it exiting and
     * allocates nothing): NULL, as in the rest of the setup (the exit
     * heap's first use waited for the pool's lock the cleanup held,
     * window_clean_dead_signal). */
    if (coral_tls_setting_up) return NULL;
    if (__atomic_load_n(&exit_heap, __ATOMIC_RELAXED) == NULL) exit_heap_make();
    coral_mutex_lock(&exit_heap_lock);
    if (exit_heap == NULL) { /* no memory */
        coral_mutex_unlock(&exit_heap_lock);
        return NULL;
    }
    coral_test_point(CORAL_TP_EXIT_HEAP_LOCKED, NULL);
    return exit_heap;
}

void coral_exit_heap_release(void) { coral_mutex_unlock(&exit_heap_lock); }

/* ---- threads ----------------------------------------------------------------------------- */

/* Every heap of the thread whose own heap is `heap` abandoned, with its
 * segments; then each user heap given to `user_heap` (off the thread). */
static void thread_heaps_abandon(coral_heap_t *heap, void (*user_heap)(coral_heap_t *)) {
    coral_thread_t *thread = heap->thread;
    for (coral_link_t *l = thread->heaps.first; l != NULL; l = l->next)
        coral_heap_abandon(coral_container_of(l, coral_heap_t, thread_link));
    coral_segments_abandon(&thread->segments);
    coral_link_t *l = thread->heaps.first;
    while (l != NULL) {
        coral_link_t *next = l->next;
        coral_heap_t *h = coral_container_of(l, coral_heap_t, thread_link);
        if (h != heap) user_heap(h);
        l = next;
    }
}

/* The heap listed under the calling thread's id (a dead thread's: see
 * heaps_by_tid), taken off the list; and heap (NULL: none), the calling
 * thread's new one, listed in its place. */
static coral_heap_t *thread_heap_list(coral_heap_t *heap) {
    uintptr_t tid = coral_thread_id();
    coral_list_t *bucket = tid_bucket(tid);
    coral_heap_t *dead = NULL;
    pool_lock();
    for (coral_link_t *l = bucket->first; l != NULL && dead == NULL; l = l->next) {
        coral_thread_t *thread = coral_container_of(l, coral_thread_t, tid_link);
        if (thread->segments.thread_id == tid && thread->tid_generation == tid_generation)
            dead = thread->heap_default;
    }
    if (dead != NULL) heap_tid_unlist(dead);
    if (heap != NULL) {
        heap->thread_storage.tid_listed = true;
        heap->thread_storage.tid_generation = tid_generation;
        coral_list_push_front(bucket, &heap->thread_storage.tid_link);
    }
    pool_unlock();
    return dead;
}

/* A dead thread's heaps (of the calling thread's id): its exit cleanup
 * (thread_done) done for it, with the calling thread's allocations meanwhile
 * from the exit heap, as in thread_done. But for its exit hook: its bulk
 * cache and profiler state were in its thread-local storage, which glibc
 * set anew for this thread (their blocks stay taken; the purger flushes an
 * idle bulk cache); and for its exit notice (it ended without one, as a
 * thread that never allocated). No thread can use its user heaps: they go
 * back to the pool at once. */
static void user_heap_put_dead(coral_heap_t *heap) {
    heap->thread = NULL; /* its handle stops working */
    coral_heap_pool_put(heap);
}

static void thread_clean_dead(coral_heap_t *dead) {
    coral_tls_exiting = true;
    thread_heaps_abandon(dead, user_heap_put_dead);
    coral_heap_pool_put(dead); /* last: it holds the thread's state */
    coral_count(&coral_counters.threads, -1);
    coral_tls_exiting = false;
}

static coral_heap_t *thread_set_up(void) {
    coral_process_init();
    coral_heap_t *heap = coral_heap_pool_get();
    if (heap == NULL) return NULL;
    coral_thread_t *thread = &heap->thread_storage;
    thread->segments.thread_id = coral_thread_id();
    /* Slice descriptors keep their flags above the id (segment.h). */
    if (thread->segments.thread_id & ~CORAL_SLICE_TID_MASK)
        coral_fatal("thread pointer %p above 2^56", (void *)thread->segments.thread_id);
    thread->heap_default = heap;
    coral_heap_t *dead = thread_heap_list(heap);
    if (dead != NULL) thread_clean_dead(dead);
    coral_list_push_front(&thread->heaps, &heap->thread_link);
    coral_heap_init(heap, thread);
    heap->is_default = true;
    coral_tls_heap = heap;
    pthread_setspecific(thread_key, heap);
    coral_count_gauge(&coral_counters.threads, &coral_counters.threads_peak, 1);
    process_init_late();
    return heap;
}

coral_heap_t *coral_thread_init(void) {
    if (coral_tls_exiting) return NULL;    /* the exit heap serves it */
    if (coral_tls_setting_up) return NULL; /* a signal handler's, nested */
    coral_tls_setting_up = true;
    atomic_signal_fence(memory_order_seq_cst);
    coral_heap_t *heap = thread_set_up();
    atomic_signal_fence(memory_order_seq_cst);
    coral_tls_setting_up = false;
    return heap;
}

/* stdio's witness for the fork handlers (base.h, coral_libc_streams_lock),
 * made by the first fork's prepare, maybe in a signal handler. Its malloc
 * is sent to the witness's own storage: the thread's heap reads as the
 * empty one (so that even a set-up thread's malloc reaches malloc_first,
 * which asks for that storage first), as being set up and as not past its
 * exit (so that a call the storage refuses, a larger stream of another
 * glibc, gets NULL: no second heap for the thread, nothing from the exit
 * heap, which the code a signal handler's fork interrupted may be
 * changing). Signals are blocked meanwhile, so that no handler's malloc
 * finds the thread so; nothing in it waits (the list lock, which
 * fopencookie takes, is held already). errno is kept: the prepare's is
 * the program's. */
static CORAL_COLD void streams_witness_make(void) {
    int saved_errno = errno;
    sigset_t mask;
    fork_signals_block(&mask);
    coral_heap_t *heap = coral_tls_heap;
    bool setting_up = coral_tls_setting_up, exiting = coral_tls_exiting;
    coral_tls_heap = &coral_heap_empty;
    coral_tls_setting_up = true;
    coral_tls_exiting = false;
    coral_libc_streams_witness_make();
    coral_tls_exiting = exiting;
    coral_tls_setting_up = setting_up;
    coral_tls_heap = heap;
    fork_signals_restore(&mask);
    errno = saved_errno;
}

/* ---- the key destructor rounds ahead -----------------------------------------------------
 * glibc runs a thread's TLS destructors (__cxa_thread_atexit_impl, C++
 * thread_local) before the first round of its pthread key destructors,
 * and never again. So a thread that registered one while it ran (not yet
 * exiting) learns, when it is called, that every round is still to come:
 * coralloc's key, set at the thread's first allocation, which came before,
 * is then called in round 1, and a cleanup put off to round 2 runs. A
 * thread whose heap was made in the rounds themselves (a key destructor's
 * allocation) never gets that call: its cleanup, in what may be the last
 * round, cannot wait. Registered at the thread's first user heap only
 * (the only reason to wait), by the api layer (coral_heap_new): glibc's
 * registration allocates (through this allocator, at a point where the
 * thread holds no lock), and ends the process when that fails, so its
 * caller makes sure it cannot. */
/* glibc has it (since 2.18): a strong reference, so that a static link
 * takes it from libc.a too (a weak one does not pull it in: a static
 * program had no registration, and the cleanup of a thread with user
 * heaps never waited). Weak elsewhere (absent: never registered). */
#ifdef __GLIBC__
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso);
#define CORAL_HAVE_TLS_DTORS 1
#else
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso) __attribute__((weak));
#define CORAL_HAVE_TLS_DTORS (__cxa_thread_atexit_impl != NULL)
#endif
extern char __dso_handle __attribute__((visibility("hidden")));
static __thread bool coral_tls_rounds_ahead __attribute__((tls_model("initial-exec")));

static void thread_rounds_ahead(void *unused) {
    (void)unused;
    coral_tls_rounds_ahead = true;
}

bool coral_thread_rounds_unwatched(const coral_thread_t *thread) {
    return !thread->rounds_watched && !coral_tls_exiting && CORAL_HAVE_TLS_DTORS;
}

void coral_thread_watch_rounds(coral_thread_t *thread) {
    thread->rounds_watched = true;
    (void)__cxa_thread_atexit_impl(thread_rounds_ahead, NULL, &__dso_handle);
}

/* Whether the thread holds heaps besides its own (coral_heap_new). */
static bool thread_has_user_heaps(const coral_thread_t *thread) {
    return thread->heaps.first != thread->heaps.last;
}

/* A user heap destroyed by a later destructor of this round (a pthread key
 * made after coralloc's, or a Rust thread_local in one) frees its pages at
 * once only while the thread's cleanup has not run. So a thread that holds
 * user heaps sets its key again and cleans up in the next round: glibc calls
 * a destructor again when its value was set anew, for up to
 * PTHREAD_DESTRUCTOR_ITERATIONS rounds. It waits only when this call is
 * surely of round 1 (coral_tls_rounds_ahead, above): a thread whose heaps
 * were made in the rounds may be in the last one, with no next call (its
 * heaps were never abandoned). One that waited cleans up in the second
 * round, and a user heap destroyed later than that is parked
 * (coral_heap_park_exited). */
static bool thread_done_deferred(coral_thread_t *thread, coral_heap_t *heap) {
    /* A next round is certain only for a thread whose TLS destructors ran. */
    if (thread->exit_deferred || !coral_tls_rounds_ahead || !thread_has_user_heaps(thread))
        return false;
    thread->exit_deferred = true;
    return pthread_setspecific(thread_key, heap) == 0;
}

/* The pthread key's destructor: the thread is exiting. */
static void thread_done(void *value) {
    coral_heap_t *heap = value;
    if (heap == NULL || heap != coral_tls_heap) return;
    coral_thread_t *thread = heap->thread;
    if (thread_done_deferred(thread, heap)) return;
    /* From here on the thread allocates from the exit heap, also inside
     * what follows (the exit hook frees, abandonment may start the purge
     * thread): nothing can make a page of the heaps being abandoned. Frees
     * still find the thread's own pages by its id. */
    coral_tls_exiting = true;
    coral_tls_heap = &coral_heap_empty;
    /* The exit hook first (the bulk cache: its blocks go back to pages the
     * thread still owns). */
    coral_thread_exit_fn hook = atomic_load_explicit(&thread_exit_hook, memory_order_acquire);
    if (hook != NULL) hook();
    /* The secure build's ring of freed blocks (heap.h): back to pages the
     * thread still owns, and closed to later frees. */
    if (CORAL_SECURE) coral_heap_ring_flush(true);
    /* A user heap's handle stops working (coral_heap_*: a clear error),
     * but its struct is not reused while this thread may still hold it. */
    thread_heaps_abandon(heap, coral_heap_park_exited);
    coral_heap_pool_put(heap); /* last: it holds the thread's state */
    coral_count(&coral_counters.threads, -1);
    coral_purger_thread_exiting();
    coral_purger_start_if_wanted();
}
