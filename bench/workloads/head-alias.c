/* head-alias: what block heads 4 KiB apart cost, with no allocator.
 *
 * --count blocks of --size bytes are laid out --stride bytes apart in one
 * mapping (the layout a size class gives its blocks), kept on a LIFO list
 * linked through their first word, and --rounds times taken off the list,
 * touched as zero-fill touches its blocks (a word at each 4 KiB and the
 * last byte), checked and put back. With --stride a multiple of 4096 every
 * head, and every word 4 KiB further, maps to one set of an L1 cache
 * indexed by address bits 6-11, which then holds 8 (or 12) of them; a
 * stride 64 bytes longer spreads them over the sets. So this separates
 * what zero-fill's figure owes to where the blocks lie from what it owes
 * to the allocator's work (docs/experiments/, "What the numbers said before issue 36").
 *
 * Figure: ns_per_op, one op = one block taken, touched, checked, put back.
 * Not in a profile: run by hand, e.g. --stride 8192 against 8256.
 */
#include "common.h"

#include <sys/mman.h>

int main(int argc, char **argv) {
    long size = 8192, stride = 8192, count = 64, rounds = 200000;
    opt_t opts[] = {
        {"size", "block size (bytes)", &size, NULL},
        {"stride", "bytes from one block's start to the next", &stride, NULL},
        {"count", "blocks", &count, NULL},
        {"rounds", "take-touch-put rounds", &rounds, NULL},
    };
    OPTS_PARSE(argc, argv, "Block heads a stride apart, no allocator.", opts);
    if (size < 16 || stride < size || stride % 16 != 0 || count < 1 || rounds < 1)
        usage_error("head-alias: need size >= 16, stride >= size and 16-aligned, count >= 1");
    size_t sz = (size_t)size, n = (size_t)count, span = (size_t)stride * n;
    unsigned char *base = (unsigned char *)mmap(NULL, span, PROT_READ | PROT_WRITE,
                                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) out_of_memory(span);
    unsigned char **p = (unsigned char **)xmalloc(sizeof(void *) * n);
    void *head = NULL;
    for (size_t i = n; i-- > 0;) {
        unsigned char *b = base + i * (size_t)stride;
        memcpy(b, &head, sizeof head);
        head = b;
    }
    double t0 = now_sec();
    for (long r = 0; r < rounds; r++) {
        for (size_t i = 0; i < n; i++) {
            unsigned char *b = (unsigned char *)head;
            memcpy(&head, b, sizeof head);
            p[i] = b;
            pages_touch(b, sz, tag_make((uint64_t)r, i));
        }
        for (size_t i = 0; i < n; i++) {
            size_t off = pages_touched_differ(p[i], sz, tag_make((uint64_t)r, i));
            if (off != SIZE_MAX) check_failed("head-alias: block %zu changed at %zu", i, off);
            memcpy(p[i], &head, sizeof head);
            head = p[i];
        }
    }
    double elapsed = now_sec() - t0;
    double ops = (double)rounds * (double)count;
    free(p);
    munmap(base, span);
    printf("info: size=%ld stride=%ld count=%ld rounds=%ld seconds=%.4f\n", size, stride, count,
           rounds, elapsed);
    printf("result: ns_per_op=%.1f\n", elapsed * 1e9 / ops);
    return 0;
}
