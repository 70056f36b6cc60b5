/* Site totals of threads gone and threads running at a dump: 8 threads
 * each allocate 500 blocks of 4096 bytes in totals_alloc and free every
 * second one themselves; 4 of them exit before the dump, 4 wait (alive,
 * their totals not yet published by an eviction or an exit) while main
 * writes the profile with coral_profile_dump(argv[1]). At rate 1 a block
 * of 4096 bytes is sampled with probability 1 - e^-4096 = 1.0 (as a
 * double), so each counts exactly 1 object and 4096 bytes:
 * tests/profile/check_profile.py --totals checks that the dump's
 * totals_alloc holds 4000 objects allocated and 2000 in use, exactly.
 * Built with frame pointers, without coralloc (preloaded). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 8
#define BLOCKS 500

static pthread_barrier_t allocated, dumped;

static __attribute__((noinline)) void *totals_alloc(void) {
    void *p = malloc(4096);
    __asm__ volatile("" ::"r"(p) : "memory"); /* (not a tail call: this frame stays) */
    return p;
}

static void *worker(void *arg) {
    static void *kept[THREADS][BLOCKS];
    size_t me = (size_t)arg;
    for (size_t i = 0; i < BLOCKS; i++) {
        kept[me][i] = totals_alloc();
        if (kept[me][i] == NULL) abort();
        if (i % 2 == 1) free(kept[me][i]);
    }
    if (me % 2 == 1) { /* stays alive over the dump */
        pthread_barrier_wait(&allocated);
        pthread_barrier_wait(&dumped);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "coral_profile_dump");
    if (dump == NULL) return 3;
    pthread_barrier_init(&allocated, NULL, THREADS / 2 + 1);
    pthread_barrier_init(&dumped, NULL, THREADS / 2 + 1);
    pthread_t t[THREADS];
    for (size_t i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0) return 4;
    for (size_t i = 0; i < THREADS; i += 2) pthread_join(t[i], NULL); /* gone before the dump */
    pthread_barrier_wait(&allocated);
    int rc = dump(argv[1]);
    pthread_barrier_wait(&dumped);
    for (size_t i = 1; i < THREADS; i += 2) pthread_join(t[i], NULL);
    if (rc != 0) return 5;
    printf("totals_alloc %d %d\n", THREADS * BLOCKS, THREADS * BLOCKS / 2);
    return 0;
}
