/* startup_alloc: a short program that allocates a little and exits, as
 * many processes do (tests/startup_cost.sh counts the system calls a
 * preloaded allocator adds to it). Built without coralloc. */
#include <stdlib.h>
#include <string.h>

int main(void) {
    enum { BLOCKS = 400 };
    static void *blocks[BLOCKS];
    unsigned size = 16;
    for (int i = 0; i < BLOCKS; i++) {
        size = size * 7 % 2033 + 16; /* 16 to 2048 bytes, spread over the classes */
        blocks[i] = malloc(size);
        if (blocks[i] == NULL) return 1;
        memset(blocks[i], i, size);
    }
    for (int i = 0; i < BLOCKS; i += 2) free(blocks[i]);
    return 0; /* the rest stays allocated, as in most programs at exit */
}
