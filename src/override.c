/* The standard names: malloc & co. resolve here when libcoralloc is
 * preloaded or linked. Every entry point that can hand out or take back a
 * block is defined, so no block from glibc's allocator can reach our free
 * (and the other way round). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

#include "alloc.h"
#include "internal.h"
#include "stats.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT void *malloc(size_t size) { return coral_malloc_inline(size); }
EXPORT void free(void *p) { coral_free_inline(p); }
EXPORT void *calloc(size_t n, size_t size) { return coral_calloc_inline(n, size); }
EXPORT void *realloc(void *p, size_t size) { return coral_realloc(p, size); }
EXPORT void *reallocarray(void *p, size_t n, size_t size) { return coral_reallocarray(p, n, size); }
EXPORT int posix_memalign(void **out, size_t alignment, size_t size) {
    return coral_posix_memalign(out, alignment, size);
}
EXPORT void *aligned_alloc(size_t alignment, size_t size) {
    return coral_aligned_alloc(alignment, size);
}
EXPORT void *memalign(size_t alignment, size_t size) { return coral_memalign(alignment, size); }
EXPORT void *valloc(size_t size) { return coral_valloc(size); }
EXPORT void *pvalloc(size_t size) { return coral_pvalloc(size); }
EXPORT size_t malloc_usable_size(void *p) { return coral_malloc_usable_size(p); }
EXPORT void cfree(void *p) { coral_free_inline(p); }
EXPORT void free_sized(void *p, size_t size) { coral_free_sized(p, size); }
EXPORT void free_aligned_sized(void *p, size_t alignment, size_t size) {
    coral_free_aligned_sized(p, alignment, size);
}

/* glibc's internal names, which some programs and libraries call. */
EXPORT void *__libc_malloc(size_t size) { return coral_malloc_inline(size); }
EXPORT void __libc_free(void *p) { coral_free_inline(p); }
EXPORT void *__libc_calloc(size_t n, size_t size) { return coral_calloc_inline(n, size); }
EXPORT void *__libc_realloc(void *p, size_t size) { return coral_realloc(p, size); }
EXPORT void *__libc_memalign(size_t alignment, size_t size) {
    return coral_memalign(alignment, size);
}
EXPORT void *__libc_valloc(size_t size) { return coral_valloc(size); }
EXPORT void *__libc_pvalloc(size_t size) { return coral_pvalloc(size); }
EXPORT int __posix_memalign(void **out, size_t alignment, size_t size) {
    return coral_posix_memalign(out, alignment, size);
}

/* glibc's malloc control calls. */
EXPORT int malloc_trim(size_t pad) {
    (void)pad;
    coral_collect(1);
    return 1;
}

/* glibc's format, with coralloc's figures: "system bytes" is what is mapped,
 * "in use bytes" what lies in pages in use (and huge blocks). */
EXPORT void malloc_stats(void) {
    coral_stats_t s;
    coral_stats_snapshot(&s);
    long long in_use = (long long)(s.page_bytes + s.huge_bytes);
    fprintf(stderr, "Arena 0:\nsystem bytes     = %10lld\nin use bytes     = %10lld\n",
            (long long)s.mapped, in_use);
    fprintf(stderr, "Total (incl. mmap):\nsystem bytes     = %10lld\nin use bytes     = %10lld\n",
            (long long)s.mapped, in_use);
    fprintf(stderr, "max mmap regions = %10lld\nmax mmap bytes   = %10lld\n",
            (long long)s.segments_peak, (long long)s.mapped_peak);
}

EXPORT int mallopt(int param, int value) {
    (void)param;
    (void)value;
    return 0; /* glibc's options do not apply: "not done" */
}

/* arena: mapped bytes outside huge blocks; hblks/hblkhd: huge blocks;
 * uordblks: bytes in pages in use plus huge blocks; fordblks: the rest of
 * what is mapped; usmblks: the peak mapped. Block-exact in-use figures come
 * from coral_stats_json in CORAL_STATS builds. */
EXPORT struct mallinfo2 mallinfo2(void) {
    coral_stats_t s;
    coral_stats_snapshot(&s);
    struct mallinfo2 mi = {0};
    size_t huge = (size_t)s.huge_bytes, mapped = (size_t)s.mapped;
    mi.arena = mapped > huge ? mapped - huge : 0;
    mi.hblks = (size_t)s.huge_live;
    mi.hblkhd = huge;
    mi.uordblks = (size_t)s.page_bytes + huge;
    mi.fordblks = mapped > mi.uordblks ? mapped - mi.uordblks : 0;
    mi.usmblks = (size_t)s.mapped_peak;
    return mi;
}

static int clamp_int(size_t v) { return v > (size_t)INT32_MAX ? INT32_MAX : (int)v; }

EXPORT struct mallinfo mallinfo(void) {
    struct mallinfo2 m2 = mallinfo2();
    struct mallinfo mi = {0};
    mi.arena = clamp_int(m2.arena);
    mi.hblks = clamp_int(m2.hblks);
    mi.hblkhd = clamp_int(m2.hblkhd);
    mi.uordblks = clamp_int(m2.uordblks);
    mi.fordblks = clamp_int(m2.fordblks);
    mi.usmblks = clamp_int(m2.usmblks);
    return mi;
}
