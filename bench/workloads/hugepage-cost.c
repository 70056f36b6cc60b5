/* hugepage-cost: what a 2 MiB of fresh memory costs to fault in on this
 * machine, in transparent huge pages and in 4 KiB pages (no allocator
 * involved: it maps its own memory).
 *
 * --pages times, a clean 2 MiB-aligned 2 MiB is faulted in with one
 * madvise(MADV_POPULATE_WRITE), timed in the thread's CPU time (user and
 * system; preemption does not count), first in a range advised with
 * MADV_HUGEPAGE (one huge page each, where the kernel has one), then in a
 * range that is not (512 pages of 4 KiB each). coralloc asks for huge pages
 * only while they cost at most 1 ms each (docs/DESIGN.md, "Transparent huge
 * pages"): this shows where a machine stands.
 *
 * Figure: huge_us, the mean cost of a huge page in microseconds; also
 * small_us (2 MiB in 4 KiB pages), and the max and the count above 1 ms
 * of each.
 */
#include "common.h"

#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define TWO_MIB ((size_t)2 << 20)

typedef struct {
    double mean_us, max_us;
    long slow; /* above 1 ms */
} cost_t;

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Fault in `pages` fresh 2 MiB regions, advised for huge pages or not. */
static cost_t fault_in(long pages, int huge) {
    size_t size = (size_t)pages * TWO_MIB;
    uint8_t *map =
        mmap(NULL, size + TWO_MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) check_failed("hugepage-cost: mmap of %zu bytes failed", size);
    uint8_t *p = (uint8_t *)(((uintptr_t)map + TWO_MIB - 1) & ~(TWO_MIB - 1));
    if (huge && madvise(p, size, MADV_HUGEPAGE) != 0)
        printf("info: MADV_HUGEPAGE refused (errno %d)\n", errno);
    cost_t c = {0, 0, 0};
    for (long i = 0; i < pages; i++) {
        uint64_t t = thread_cpu_ns();
        if (madvise(p + (size_t)i * TWO_MIB, TWO_MIB, MADV_POPULATE_WRITE) != 0)
            check_failed("hugepage-cost: MADV_POPULATE_WRITE refused (errno %d)", errno);
        double us = (double)(thread_cpu_ns() - t) / 1e3;
        c.mean_us += us / (double)pages;
        if (us > c.max_us) c.max_us = us;
        if (us > 1000.0) c.slow++;
    }
    for (long i = 0; i < pages; i++) /* the pages are there and writable */
        if (p[(size_t)i * TWO_MIB] != 0) check_failed("hugepage-cost: fresh memory not zero");
    munmap(map, size + TWO_MIB);
    return c;
}

int main(int argc, char **argv) {
    long pages = 32;
    opt_t opts[] = {{"pages", "2 MiB regions faulted in, of each kind", &pages, NULL}};
    OPTS_PARSE(argc, argv, "What 2 MiB of fresh memory costs to fault in, in huge and 4 KiB pages.",
               opts);
    if (pages < 1 || pages > 4096) usage_error("hugepage-cost: need 1 <= pages <= 4096");
    cost_t huge = fault_in(pages, 1), small = fault_in(pages, 0);
    report_malloc_lib();
    printf("info: pages=%ld huge_max_us=%.0f huge_slow=%ld small_max_us=%.0f small_slow=%ld\n",
           pages, huge.max_us, huge.slow, small.max_us, small.slow);
    printf("result: huge_us=%.1f small_us=%.1f\n", huge.mean_us, small.mean_us);
    return 0;
}
