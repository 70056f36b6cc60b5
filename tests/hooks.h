/* hooks.h: holding a thread at one of coralloc's test points (the hooks
 * library, coralloc_api_hooks; src/base/test_points.h names the points).
 *
 * A gate holds the first thread that reaches its point (once per arming)
 * until the test opens it, or until any thread reaches the gate's
 * `opener` point (for a window the allocator itself must close: an owner
 * that waits for the held thread, a fork that waits for a lock the held
 * thread has). Synchronisation is by mutex and condition variable only:
 * no sleeps, no timing. */
#ifndef CORAL_TEST_HOOKS_H
#define CORAL_TEST_HOOKS_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <unistd.h>

#include "../src/base/test_points.h"

void coral_test_point_set(coral_test_point_fn fn);

typedef struct gate_s {
    int point;  /* the point that holds (-1: none) */
    int opener; /* the point that opens the gate (-1: only gate_open) */
    bool armed, held, open;
    const void *object; /* what the held thread's point was about */
} gate_t;

/* Two gates, so that a test can hold a thread at one point and then at a
 * later one; one lock and condition variable for both, and for the
 * test's own flags (gate_signal / gate_wait_for), taken through
 * gates_enter / gates_leave / gates_wait / gates_wake.
 *
 * Fork: a thread other than the forking one may hold the lock when the
 * child's copy is made (a thread held at a gate, woken by a broadcast,
 * takes it back before it waits again), and the child has no such thread
 * to release it: its first test point (CORAL_TP_FORK_CHILD_FREEING, in
 * coralloc's child handler) would wait for it forever. No fork handler of
 * ours can take the lock first: coralloc's handlers, registered at load,
 * call the test points before and after any handler a test registers. So
 * each process takes its own lock and condition variable: a process's
 * first call finds gates_pid (the process that slot gates_gen belongs to)
 * not its own and moves to the next slot, which no thread of its own or
 * of its parent took (so nothing of the copied lock, nor TSan's record of
 * it, carries over). While one thread of a child moves, gates_pid is
 * minus the child's pid and the child's other threads (started by a
 * program's child handler) wait for it; a fork made then gives its child
 * a pid unlike both, which moves again. What the gates record stays as
 * copied (a gate held by a thread of the parent stays held). Forks nested
 * deeper than GATES_SYNC take a slot again. */
#define GATES 2
#define GATES_SYNC 16
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
} gates_sync[GATES_SYNC] = {
    [0 ... GATES_SYNC - 1] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER}};
static pid_t gates_pid; /* 0: the first process, not yet seen */
static unsigned gates_gen;
static gate_t gates[GATES] = {{-1, -1, false, false, false, NULL},
                              {-1, -1, false, false, false, NULL}};

/* The calling process's slot: the one it found, or the next, unused. */
static inline unsigned gates_slot(void) {
    pid_t pid = getpid();
    pid_t seen = __atomic_load_n(&gates_pid, __ATOMIC_ACQUIRE);
    while (seen != pid) {
        if (seen == -pid) { /* another thread of this child moves */
            sched_yield();
            seen = __atomic_load_n(&gates_pid, __ATOMIC_ACQUIRE);
            continue;
        }
        /* The first process keeps slot 0, as initialised; a child moves. */
        pid_t claim = seen == 0 ? pid : -pid;
        if (!__atomic_compare_exchange_n(&gates_pid, &seen, claim, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue; /* (seen is what another thread wrote) */
        if (claim == -pid) {
            gates_gen = (gates_gen + 1) % GATES_SYNC;
            __atomic_store_n(&gates_pid, pid, __ATOMIC_RELEASE);
        }
        break;
    }
    return gates_gen;
}

static inline void gates_enter(void) { pthread_mutex_lock(&gates_sync[gates_slot()].lock); }

static inline void gates_leave(void) { pthread_mutex_unlock(&gates_sync[gates_gen].lock); }

/* (Called between gates_enter and gates_leave.) */
static inline void gates_wait(void) {
    pthread_cond_wait(&gates_sync[gates_gen].cond, &gates_sync[gates_gen].lock);
}

static inline void gates_wake(void) { pthread_cond_broadcast(&gates_sync[gates_gen].cond); }

static void gate_hook(int point, const void *object) {
    gates_enter();
    for (int g = 0; g < GATES; g++) {
        gate_t *gate = &gates[g];
        if (point == gate->opener && gate->held) {
            gate->open = true;
            gates_wake();
        }
    }
    for (int g = 0; g < GATES; g++) {
        gate_t *gate = &gates[g];
        if (point != gate->point || !gate->armed) continue;
        gate->armed = false;
        gate->held = true;
        gate->object = object;
        gates_wake();
        while (!gate->open) gates_wait();
        gate->held = false;
        break;
    }
    gates_leave();
}

/* Hold the next thread that reaches `point` at gate g; open it when a
 * thread reaches `opener` (-1: only gate_open). */
static inline void gate_arm_at(int g, int point, int opener) {
    gates_enter();
    gates[g] = (gate_t){point, opener, true, false, false, NULL};
    gates_leave();
    coral_test_point_set(gate_hook);
}

static inline void gate_arm(int point, int opener) { gate_arm_at(0, point, opener); }

/* Wait until a thread is held at gate g (or the gate was opened). */
static inline const void *gate_wait_held_at(int g) {
    gates_enter();
    while (!gates[g].held && !gates[g].open) gates_wait();
    const void *object = gates[g].object;
    gates_leave();
    return object;
}

static inline const void *gate_wait_held(void) { return gate_wait_held_at(0); }

static inline void gate_open_at(int g) {
    gates_enter();
    gates[g].open = true;
    gates[g].armed = false;
    gates_wake();
    gates_leave();
}

static inline void gate_open(void) { gate_open_at(0); }

/* Whether gate g holds a thread now. */
static inline bool gate_holds(int g) {
    gates_enter();
    bool held = gates[g].held;
    gates_leave();
    return held;
}

/* A test's own flag, under the gates' lock: set it (and wake waiters), or
 * wait until it is set or gate g holds a thread. */
static inline void gate_signal(bool *flag) {
    gates_enter();
    *flag = true;
    gates_wake();
    gates_leave();
}

/* (g = GATES: wait for the flag only.) */
static inline void gate_wait_for(bool *flag, int g) {
    gates_enter();
    while (!*flag && (g >= GATES || !gates[g].held)) gates_wait();
    gates_leave();
}

#endif /* CORAL_TEST_HOOKS_H */
