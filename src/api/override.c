/* The standard names: malloc & co. resolve here when libcoralloc is
 * preloaded or linked. Every entry point that can hand out or take back a
 * block is defined, so no block from glibc's allocator can reach our free
 * (and the other way round). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

#include "api/api.h"

#define EXPORT __attribute__((visibility("default")))

/* Defined where malloc is coralloc's (alloc.c, watch_rounds). */
const char coral_serves_malloc = 1;

/* malloc and free each start a cache line, in every build: a tight loop of
 * malloc and free is sensitive to where they fall (docs/FASTPATH.md). The
 * default library's layout script (cmake/hot-text.ld) places them so too;
 * the secure library and the static one have no such script, so without
 * this their place would follow the size of the code linked before them. */
#define LINE_START __attribute__((aligned(64)))

/* malloc's fast path: the profiling library's charges the profiler's
 * countdown (api.h). */
#if CORAL_PROFILE_LIB
#if CORAL_SECURE || CORAL_VALGRIND
#error "the profiling library is the default build's"
#endif
#define coral_malloc_entry coral_malloc_counted_inline
#else
#define coral_malloc_entry coral_malloc_inline
#endif

EXPORT LINE_START void *malloc(size_t size) { return coral_malloc_entry(size); }
EXPORT LINE_START void free(void *p) { coral_free_inline(p); }
EXPORT void *calloc(size_t n, size_t size) {
    return coral_heap_calloc_inline(coral_tls_heap, n, size);
}
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
EXPORT void free_sized(void *p, size_t size) { coral_free_sized(p, size); }
EXPORT void free_aligned_sized(void *p, size_t alignment, size_t size) {
    coral_free_aligned_sized(p, alignment, size);
}

/* C++'s sized and aligned deletes, by their mangled names: libstdc++'s
 * would call free() and drop what they are told, so a size larger than
 * the block, or a pointer not aligned as asked, would go unseen. Aligned
 * new is libstdc++'s (it calls aligned_alloc, which is ours);
 * libcoralloc.a's override_new.cc defines every form for static links. */
#define CXX_DELETE "operator delete"
EXPORT void _ZdlPvm(void *p, size_t n) { coral_free_sized_inline(p, n, CXX_DELETE); }
EXPORT void _ZdlPvSt11align_val_t(void *p, size_t al) {
    coral_free_aligned_sized_as(p, al, 0, CXX_DELETE);
}
EXPORT void _ZdaPvSt11align_val_t(void *p, size_t al) {
    coral_free_aligned_sized_as(p, al, 0, CXX_DELETE);
}
EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) {
    coral_free_aligned_sized_as(p, al, n, CXX_DELETE);
}
EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) {
    coral_free_aligned_sized_as(p, al, n, CXX_DELETE);
}

#if CORAL_CXX_NEW
/* The shared libraries: C++'s plain and array new (throwing and nothrow)
 * and unsized delete, by their mangled names, with malloc's and free's
 * fast paths inline. libstdc++'s would do the same work through a second
 * call each (its new calls malloc, its delete calls free, both through
 * the PLT): about 10 instructions per new/delete pair, 7% of
 * mimalloc-bench's alloc-test under callgrind.
 *
 * What C cannot do, C++'s rules for a failed new (call the installed
 * new_handler and try again; throw std::bad_alloc, or give nullptr from
 * the nothrow forms, when there is none), stays libstdc++'s: a malloc
 * that fails hands the call to the next definition of the same operator
 * (dlsym RTLD_NEXT: libstdc++'s, which calls our malloc again). Its
 * exception unwinds through no frame of ours (a tail call; override.c is
 * built with -fexceptions besides). A program that calls new has a C++
 * runtime loaded, so the next definition exists; if it does not, the
 * error is named. */
CORAL_COLD static void *cxx_next(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (f == NULL) coral_fatal("%s: no C++ runtime's operator new after coralloc's", name);
    return f;
}

CORAL_COLD static void *cxx_new_failed(size_t n, const char *name) {
    void *(*next)(size_t) = (void *(*)(size_t))cxx_next(name);
    return next(n);
}

CORAL_COLD static void *cxx_new_nothrow_failed(size_t n, const void *tag, const char *name) {
    void *(*next)(size_t, const void *) = (void *(*)(size_t, const void *))cxx_next(name);
    return next(n, tag);
}

#define CXX_NEW(name)                                                                              \
    EXPORT void *name(size_t n) {                                                                  \
        void *p = coral_malloc_entry(n);                                                           \
        return coral_likely(p != NULL) ? p : cxx_new_failed(n, #name);                             \
    }
#define CXX_NEW_NOTHROW(name)                                                                      \
    EXPORT void *name(size_t n, const void *tag) {                                                 \
        void *p = coral_malloc_entry(n);                                                           \
        return coral_likely(p != NULL) ? p : cxx_new_nothrow_failed(n, tag, #name);                \
    }
CXX_NEW(_Znwm)                       /* operator new(size_t) */
CXX_NEW(_Znam)                       /* operator new[](size_t) */
CXX_NEW_NOTHROW(_ZnwmRKSt9nothrow_t) /* operator new(size_t, nothrow_t const&) */
CXX_NEW_NOTHROW(_ZnamRKSt9nothrow_t) /* operator new[](size_t, nothrow_t const&) */
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *tag) {
    (void)tag;
    coral_free_inline(p);
}
EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *tag) {
    (void)tag;
    coral_free_inline(p);
}
#endif

/* glibc's internal names, which some programs and libraries call: second
 * names of the functions above. */
#define ALIAS(name) __attribute__((alias(#name), visibility("default")))
/* (glibc's prototypes of the targets carry attributes, malloc, nothrow, ...,
 * that its internal names are not declared with: the same function.) */
#pragma GCC diagnostic ignored "-Wmissing-attributes"
void *__libc_malloc(size_t size) ALIAS(malloc);
void __libc_free(void *p) ALIAS(free);
void cfree(void *p) ALIAS(free);
void *__libc_calloc(size_t n, size_t size) ALIAS(calloc);
void *__libc_realloc(void *p, size_t size) ALIAS(realloc);
void *__libc_memalign(size_t alignment, size_t size) ALIAS(memalign);
void *__libc_valloc(size_t size) ALIAS(valloc);
void *__libc_pvalloc(size_t size) ALIAS(pvalloc);
int __posix_memalign(void **out, size_t alignment, size_t size) ALIAS(posix_memalign);

/* C++'s deletes that do what another entry does: second names of it, one
 * copy of the code (the library's first 64 KiB of code is full,
 * cmake/hot-text.ld): delete[] is delete, unsized delete is free. */
void _ZdaPvm(void *p, size_t n) ALIAS(_ZdlPvm);
#if CORAL_CXX_NEW
void _ZdlPv(void *p) ALIAS(free);
void _ZdaPv(void *p) ALIAS(free);
#endif

/* glibc's malloc control calls. */
EXPORT int malloc_trim(size_t pad) {
    (void)pad;
    coral_collect(1);
    return 1;
}

/* glibc's format, with coralloc's figures: "system bytes" is what is mapped,
 * "in use bytes" what lies in pages in use (and huge blocks). */
static long long counter(_Atomic(int64_t) *c) {
    return (long long)atomic_load_explicit(c, memory_order_relaxed);
}

EXPORT void malloc_stats(void) {
    int state = coral_cancel_off(); /* not a cancellation point (glibc's is not either) */
    long long in_use = counter(&coral_counters.page_bytes) + counter(&coral_counters.huge_bytes);
    long long mapped = counter(&coral_counters.mapped);
    fprintf(stderr, "Arena 0:\nsystem bytes     = %10lld\nin use bytes     = %10lld\n", mapped,
            in_use);
    fprintf(stderr, "Total (incl. mmap):\nsystem bytes     = %10lld\nin use bytes     = %10lld\n",
            mapped, in_use);
    fprintf(stderr, "max mmap regions = %10lld\nmax mmap bytes   = %10lld\n",
            counter(&coral_counters.segments_peak), counter(&coral_counters.mapped_peak));
    coral_cancel_restore(state);
}

/* glibc's parameters (malloc.h), here as numbers: a program may pass them
 * whatever headers coralloc is built with. */
enum {
    GLIBC_M_MXFAST = 1,
    GLIBC_M_TRIM_THRESHOLD = -1,
    GLIBC_M_TOP_PAD = -2,
    GLIBC_M_MMAP_THRESHOLD = -3,
    GLIBC_M_MMAP_MAX = -4,
    GLIBC_M_CHECK_ACTION = -5,
    GLIBC_M_PERTURB = -6,
    GLIBC_M_ARENA_TEST = -7,
    GLIBC_M_ARENA_MAX = -8,
};

/* glibc's tuning parameters tune parts coralloc does not have (fastbins,
 * arenas, the heap top, mmap thresholds): a value glibc would take is
 * taken (1, "done"), and changes nothing, as under an allocator that
 * leaves glibc's mallopt in place; one glibc refuses is refused (0), as
 * glibc does. Programs set M_ARENA_MAX and M_MMAP_THRESHOLD and stop when
 * told no. The two that change what the allocator does for the program,
 * M_CHECK_ACTION (coralloc's is CORALLOC_ON_ERROR) and M_PERTURB (no
 * fill), and any other parameter, are refused. */
EXPORT int mallopt(int param, int value) {
    switch (param) {
    case GLIBC_M_MXFAST:
        return value >= 0 && value <= 80 * (int)sizeof(size_t) / 4; /* glibc's MAX_FAST_SIZE */
    case GLIBC_M_MMAP_THRESHOLD: /* at most glibc's HEAP_MAX_SIZE / 2 */
        return (unsigned long)(long)value <=
               (unsigned long)(2 * 4 * 1024 * 1024 * sizeof(long)) / 2;
    case GLIBC_M_TRIM_THRESHOLD:
    case GLIBC_M_TOP_PAD:
    case GLIBC_M_MMAP_MAX:
    case GLIBC_M_ARENA_TEST:
    case GLIBC_M_ARENA_MAX:
        return 1;
    default:
        return 0;
    }
}

/* arena: mapped bytes outside huge blocks; hblks/hblkhd: huge blocks;
 * uordblks: bytes in pages in use plus huge blocks; fordblks: the rest of
 * what is mapped; usmblks: the peak mapped. Block-exact in-use figures come
 * from coral_stats_json in CORAL_STATS builds. */
EXPORT struct mallinfo2 mallinfo2(void) {
    struct mallinfo2 mi = {0};
    size_t huge = (size_t)counter(&coral_counters.huge_bytes);
    size_t mapped = (size_t)counter(&coral_counters.mapped);
    mi.arena = mapped > huge ? mapped - huge : 0;
    mi.hblks = (size_t)counter(&coral_counters.huge_live);
    mi.hblkhd = huge;
    mi.uordblks = (size_t)counter(&coral_counters.page_bytes) + huge;
    mi.fordblks = mapped > mi.uordblks ? mapped - mi.uordblks : 0;
    mi.usmblks = (size_t)counter(&coral_counters.mapped_peak);
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
