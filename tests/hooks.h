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
#include <stdbool.h>

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
 * test's own flags (gate_signal / gate_wait_for). */
#define GATES 2
static pthread_mutex_t gates_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gates_cond = PTHREAD_COND_INITIALIZER;
static gate_t gates[GATES] = {{-1, -1, false, false, false, NULL},
                              {-1, -1, false, false, false, NULL}};

static void gate_hook(int point, const void *object) {
    pthread_mutex_lock(&gates_lock);
    for (int g = 0; g < GATES; g++) {
        gate_t *gate = &gates[g];
        if (point == gate->opener && gate->held) {
            gate->open = true;
            pthread_cond_broadcast(&gates_cond);
        }
    }
    for (int g = 0; g < GATES; g++) {
        gate_t *gate = &gates[g];
        if (point != gate->point || !gate->armed) continue;
        gate->armed = false;
        gate->held = true;
        gate->object = object;
        pthread_cond_broadcast(&gates_cond);
        while (!gate->open) pthread_cond_wait(&gates_cond, &gates_lock);
        gate->held = false;
        break;
    }
    pthread_mutex_unlock(&gates_lock);
}

/* Hold the next thread that reaches `point` at gate g; open it when a
 * thread reaches `opener` (-1: only gate_open). */
static inline void gate_arm_at(int g, int point, int opener) {
    pthread_mutex_lock(&gates_lock);
    gates[g] = (gate_t){point, opener, true, false, false, NULL};
    pthread_mutex_unlock(&gates_lock);
    coral_test_point_set(gate_hook);
}

static inline void gate_arm(int point, int opener) { gate_arm_at(0, point, opener); }

/* Wait until a thread is held at gate g (or the gate was opened). */
static inline const void *gate_wait_held_at(int g) {
    pthread_mutex_lock(&gates_lock);
    while (!gates[g].held && !gates[g].open) pthread_cond_wait(&gates_cond, &gates_lock);
    const void *object = gates[g].object;
    pthread_mutex_unlock(&gates_lock);
    return object;
}

static inline const void *gate_wait_held(void) { return gate_wait_held_at(0); }

static inline void gate_open_at(int g) {
    pthread_mutex_lock(&gates_lock);
    gates[g].open = true;
    gates[g].armed = false;
    pthread_cond_broadcast(&gates_cond);
    pthread_mutex_unlock(&gates_lock);
}

static inline void gate_open(void) { gate_open_at(0); }

/* Whether gate g holds a thread now. */
static inline bool gate_holds(int g) {
    pthread_mutex_lock(&gates_lock);
    bool held = gates[g].held;
    pthread_mutex_unlock(&gates_lock);
    return held;
}

/* A test's own flag, under the gates' lock: set it (and wake waiters), or
 * wait until it is set or gate g holds a thread. */
static inline void gate_signal(bool *flag) {
    pthread_mutex_lock(&gates_lock);
    *flag = true;
    pthread_cond_broadcast(&gates_cond);
    pthread_mutex_unlock(&gates_lock);
}

/* (g = GATES: wait for the flag only.) */
static inline void gate_wait_for(bool *flag, int g) {
    pthread_mutex_lock(&gates_lock);
    while (!*flag && (g >= GATES || !gates[g].held)) pthread_cond_wait(&gates_cond, &gates_lock);
    pthread_mutex_unlock(&gates_lock);
}

#endif /* CORAL_TEST_HOOKS_H */
