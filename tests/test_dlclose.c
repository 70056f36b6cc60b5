/* libcoralloc.so loaded with dlopen (its coral_ API beside the program's
 * own malloc, as from a plugin or Python's ctypes) and closed while a
 * thread that used it lives: that thread's exit runs coralloc's pthread
 * key destructor, and the purge thread runs coralloc's code, so the
 * library must stay mapped (linked with -z nodelete). Before: SIGSEGV at
 * the thread's exit (case `thread`), in the purge thread (`purger`).
 * Run as `test_dlclose LIBRARY CASE`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static void *lib;
static bool start_purger;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int stage; /* 1: the thread used coralloc; 2: the library was closed */

static void *sym(const char *name) {
    void *f = dlsym(lib, name);
    CHECK_MSG(f != NULL, "dlsym(%s): %s", name, dlerror());
    return f;
}

static void set_stage(int s) {
    pthread_mutex_lock(&lock);
    stage = s;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

static void wait_stage(int s) {
    pthread_mutex_lock(&lock);
    while (stage != s) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
}

static void *user(void *arg) {
    (void)arg;
    void *(*coral_malloc)(size_t) = (void *(*)(size_t))sym("coral_malloc");
    void (*coral_free)(void *) = (void (*)(void *))sym("coral_free");
    char *p = coral_malloc(100); /* the thread's heap, and coralloc's key set */
    CHECK(p != NULL);
    memset(p, 1, 100);
    coral_free(p);
    if (start_purger) { /* 8 MiB freed, then a safe point: the purge thread starts */
        char *big = coral_malloc((size_t)8 << 20);
        CHECK(big != NULL);
        memset(big, 2, (size_t)8 << 20);
        coral_free(big);
        coral_free(coral_malloc(64));
    }
    set_stage(1);
    wait_stage(2);
    return NULL; /* exits after the library was closed */
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[2], "thread") != 0 && strcmp(argv[2], "purger") != 0)) {
        fprintf(stderr, "usage: test_dlclose LIBRARY thread|purger\n");
        return 2;
    }
    start_purger = strcmp(argv[2], "purger") == 0;
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(lib != NULL, "dlopen: %s", dlerror());
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, user, NULL), 0);
    wait_stage(1);
    CHECK_EQ(dlclose(lib), 0);
    set_stage(2);
    CHECK_EQ(pthread_join(t, NULL), 0);
    printf("%s: passed\n", argv[2]);
    return 0;
}
