/* A stack whose frame-pointer chain leads to a stray word: alloc_under_stray
 * points its saved frame pointer at a fake frame whose "return address" is
 * 0x8000, an address no mapping can hold (below the kernel's
 * mmap_min_addr), as a caller built without frame pointers leaves a word
 * of its own there. Each of its 64 blocks is sampled (rate 1) and stays
 * live to the exit's profile; tests/profile/check_profile.py --stray checks
 * that no location of it lies in no mapping (the stack is cut before the
 * stray word). Built with frame pointers, without coralloc. */
#include <stdio.h>
#include <stdlib.h>

#define STRAY_RETURN ((void *)0x8000)

static __attribute__((noinline)) void *alloc_under_stray(void **fake) {
    void *volatile *fp = __builtin_frame_address(0);
    void *saved = fp[0];
    fp[0] = fake; /* the walk goes on to fake: its return address, then its end */
    void *p = malloc(4096);
    fp[0] = saved; /* as it was before the function returns through it */
    return p;
}

int main(void) {
    void *fake[2] = {NULL, STRAY_RETURN};
    static void *keep[64];
    for (int i = 0; i < 64; i++) {
        keep[i] = alloc_under_stray(fake);
        if (keep[i] == NULL) return 1;
    }
    printf("%p\n", keep[0]);
    return 0;
}
