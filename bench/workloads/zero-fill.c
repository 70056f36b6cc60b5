/* zero-fill: the page-fault cost of allocate-touch-free.
 *
 * --rounds times: allocate --count blocks of --size bytes (4 KiB, 8 KiB,
 * 64 KiB, 2 MiB in the suite), write into every 4 KiB page of each (a tag at
 * each page and the last byte), check them, free them all. An allocator that
 * returns the memory to the kernel and takes it back again pays a page fault
 * and a kernel zero-fill per page every round; one that keeps it does not.
 * With --calloc=1 blocks come from calloc and are checked to be zero first.
 *
 * Figure: ops_per_sec (one op = one block allocated, touched and freed),
 * faults_per_op (minor faults of the timed part, from getrusage) and
 * ns_per_op.
 */
#include "common.h"

int main(int argc, char **argv) {
    long size = 4096, count = 64, rounds = 1000, use_calloc = 0;
    opt_t opts[] = {
        {"size", "block size (bytes)", &size, NULL},
        {"count", "blocks alive at once", &count, NULL},
        {"rounds", "allocate-touch-free rounds", &rounds, NULL},
        {"calloc", "1: calloc and check for zeros, 0: malloc", &use_calloc, NULL},
    };
    OPTS_PARSE(argc, argv, "Page-fault cost of allocate, touch every page, free.", opts);
    if (size < 16 || count < 1) usage_error("zero-fill: need size >= 16 and count >= 1");
    size_t sz = (size_t)size, n = (size_t)count;
    unsigned char **p = (unsigned char **)xmalloc(sizeof(void *) * n);

    long f0 = minor_faults();
    double t0 = now_sec();
    for (long r = 0; r < rounds; r++) {
        for (size_t i = 0; i < n; i++) {
            if (use_calloc) {
                p[i] = (unsigned char *)calloc(1, sz);
                if (p[i] == NULL) out_of_memory(sz);
                for (size_t off = 0; off < sz; off += TOUCH_STEP) {
                    uint64_t w;
                    memcpy(&w, p[i] + off, 8);
                    if (w != 0 || p[i][sz - 1] != 0)
                        check_failed("zero-fill: calloc block %zu not zero at offset %zu", i, off);
                }
            } else {
                p[i] = (unsigned char *)xmalloc(sz);
            }
            pages_touch(p[i], sz, tag_make((uint64_t)r, i));
        }
        for (size_t i = 0; i < n; i++) {
            size_t off = pages_touched_differ(p[i], sz, tag_make((uint64_t)r, i));
            if (off != SIZE_MAX) check_failed("zero-fill: block %zu overwritten at %zu", i, off);
            free(p[i]);
        }
    }
    double elapsed = now_sec() - t0;
    long faults = minor_faults() - f0;
    free(p);
    double ops = (double)rounds * (double)count;
    report_malloc_lib();
    printf("info: size=%ld count=%ld rounds=%ld calloc=%ld faults=%ld seconds=%.4f\n", size, count,
           rounds, use_calloc, faults, elapsed);
    printf("result: ops_per_sec=%.1f faults_per_op=%.3f ns_per_op=%.1f\n", ops / elapsed,
           (double)faults / ops, elapsed * 1e9 / ops);
    return 0;
}
