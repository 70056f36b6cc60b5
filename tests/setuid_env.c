/* setuid_env: allocates enough for the heap profiler to take samples, then
 * prints its real and effective user ids ("ruid R euid E"), which
 * tests/setuid_env.sh reads to know whether it ran set-user-ID. Linked with
 * libcoralloc.a, so that the loader needs no library path (a set-user-ID
 * program's loader ignores LD_LIBRARY_PATH and $ORIGIN). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void) {
    for (int i = 0; i < 1000; i++) {
        void *volatile p = malloc(1000);
        free(p);
    }
    printf("ruid %d euid %d\n", (int)getuid(), (int)geteuid());
    return 0;
}
