/* The kernel calls: every mmap, munmap, madvise, mremap, mincore and mprotect
 * coralloc makes goes through here, so each call and the bytes it touches
 * are counted. CORALLOC_FAIL_OS_AFTER=N makes the Nth of them fail, for
 * testing. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "os/os.h"

static void mapped_add(int64_t delta) {
    coral_count_gauge(&coral_counters.mapped, &coral_counters.mapped_peak, delta);
}

/* Failure injection (CORALLOC_FAIL_OS_AFTER=N): counts the kernel calls;
 * the Nth one fails as the kernel would fail it (errno ENOMEM), without
 * being made. Every call counts but one: making a guard page accessible
 * again (mprotect to read-write), which the secure build cannot do
 * without. */
static _Atomic(int64_t) os_calls_seen;

static bool os_should_fail(void) {
    int64_t fail_at = coral_option(CORAL_OPT_FAIL_OS_AFTER);
    if (coral_likely(fail_at <= 0)) return false;
    if (atomic_fetch_add_explicit(&os_calls_seen, 1, memory_order_relaxed) + 1 != fail_at)
        return false;
    atomic_fetch_add_explicit(&coral_counters.os_failures_injected, 1, memory_order_relaxed);
    errno = ENOMEM;
    return true;
}

static void *os_mmap(void *hint, size_t size, int prot) {
    if (os_should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = mmap(hint, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    coral_count_os_call(CORAL_OS_MMAP, size);
    if (p == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    mapped_add(+(int64_t)size);
    return p;
}

void *coral_os_map(size_t size) { return os_mmap(NULL, size, PROT_READ | PROT_WRITE); }

void coral_os_unmap(void *p, size_t size) {
    if (p == NULL || size == 0) return;
    coral_count_os_call(CORAL_OS_MUNMAP, size);
    if (os_should_fail() || munmap(p, size) != 0)
        coral_message("munmap(%p, %zu) failed: errno %d", p, size, errno);
    else
        mapped_add(-(int64_t)size);
}

/* Map `size` bytes aligned to `alignment` (a power of two >= the OS page):
 * map more, then unmap the unaligned head and the tail. */
void *coral_os_map_aligned(size_t size, size_t alignment) {
    /* Try a plain mapping first: when the kernel hands out addresses
     * downwards from an aligned one, it often is aligned already. */
    uint8_t *p = coral_os_map(size);
    if (p == NULL) return NULL;
    if (((uintptr_t)p & (alignment - 1)) == 0) return p;
    coral_os_unmap(p, size);
    /* Then at the aligned address just below: the kernel took p from the top
     * of a free gap, so that range is usually free too and the hint is
     * taken (a process's first segment: three calls, not five). */
    uint8_t *below = (uint8_t *)((uintptr_t)p & ~(uintptr_t)(alignment - 1));
    p = os_mmap(below, size, PROT_READ | PROT_WRITE);
    if (p == below) return p;
    coral_os_unmap(p, size);
    if (size > SIZE_MAX - alignment) {
        errno = ENOMEM;
        return NULL;
    }
    size_t over = size + alignment;
    p = coral_os_map(over);
    if (p == NULL) return NULL;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1));
    size_t head = (size_t)(aligned - p), tail = over - head - size;
    if (head) coral_os_unmap(p, head);
    if (tail) coral_os_unmap(aligned + size, tail);
    return aligned;
}

/* Give the pages back to the OS; they read as zero afterwards. */
bool coral_os_purge(void *p, size_t size) {
    if (size == 0) return true;
    coral_count_os_call(CORAL_OS_PURGE, size);
    if (os_should_fail() || madvise(p, size, MADV_DONTNEED) != 0) {
        coral_message("madvise(%p, %zu, DONTNEED) failed: errno %d", p, size, errno);
        return false;
    }
    return true;
}

/* Map [end, end + size) only if nothing is mapped there: a mapping that ends
 * at `end` then grows in place (its pages stay; nothing moves). */
bool coral_os_extend(void *end, size_t size) {
    if (os_should_fail()) return false;
    void *p = mmap(end, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    coral_count_os_call(CORAL_OS_MMAP, size);
    if (p == MAP_FAILED) return false;
    mapped_add(+(int64_t)size);
    if (p == end) {
        /* Only huge blocks grow so: their growth gets huge pages as they do. */
        if (coral_huge_pages_for_big_block()) coral_os_advise_huge(end, size);
        return true;
    }
    /* A kernel before 4.17 took the address as a hint only. */
    coral_os_unmap(p, size);
    return false;
}

/* Whether [p, p + size) lies in one mapping (VMA), read from
 * /proc/self/maps without allocating; true when it cannot tell. Only the
 * old-kernel emulation asks (CORALLOC_OLD_MREMAP). */
static bool maps_one_mapping(const uint8_t *p, size_t size);

static bool one_mapping(const uint8_t *p, size_t size) {
    int state = coral_cancel_off(); /* (open, read: cancellation points) */
    bool one = maps_one_mapping(p, size);
    coral_cancel_restore(state);
    return one;
}

static bool maps_one_mapping(const uint8_t *p, size_t size) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;
    char buf[4096];
    size_t have = 0;
    bool one = true;
    for (;;) {
        ssize_t got = read(fd, buf + have, sizeof buf - have);
        if (got <= 0) break;
        have += (size_t)got;
        size_t line = 0;
        for (size_t i = 0; i < have; i++) {
            if (buf[i] != '\n') continue;
            uintptr_t lo = 0, hi = 0;
            size_t j = line;
            while (j < i && buf[j] != '-')
                lo = lo * 16 + (uintptr_t)(buf[j] <= '9' ? buf[j] - '0' : (buf[j] | 32) - 'a' + 10),
                j++;
            for (j++; j < i && buf[j] != ' '; j++)
                hi = hi * 16 + (uintptr_t)(buf[j] <= '9' ? buf[j] - '0' : (buf[j] | 32) - 'a' + 10);
            if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
                one = (uintptr_t)p + size <= hi;
                close(fd);
                return one;
            }
            line = i + 1;
        }
        memmove(buf, buf + line, have - line);
        have -= line;
    }
    close(fd);
    return one;
}

/* One mremap of [src, src + size) onto dst; dst's own pages are dropped.
 * Kernels before 6.17 unmap dst first when src spans several mappings, and
 * then fail (EFAULT): a failed move may leave dst unmapped. */
static bool os_move_once(uint8_t *src, uint8_t *dst, size_t size) {
    coral_count_os_call(CORAL_OS_REMAP, size);
    if (coral_option(CORAL_OPT_OLD_MREMAP) && !one_mapping(src, size)) {
        (void)munmap(dst, size); /* uncounted, as the kernel's own unmap */
        errno = EFAULT;
        return false;
    }
    if (os_should_fail() ||
        mremap(src, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == MAP_FAILED)
        return false;
    mapped_add(-(int64_t)size); /* the source range is gone */
    return true;
}

/* dst mapped again, zero, whatever a failed move did to it (MAP_FIXED
 * replaces what is there). False when the kernel refuses. */
static bool os_remap_destination(uint8_t *dst, size_t size) {
    void *p = mmap(dst, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    coral_count_os_call(CORAL_OS_MMAP, size);
    return p == dst;
}

/* The pieces of a failed move: halves, down to the huge page (the finest
 * grain of coralloc's own advice, which splits mappings); what still does
 * not move is copied (keep) into a destination mapped again first, or
 * left zero. The source is unmapped in the end either way. */
#define MOVE_MIN_PIECE ((size_t)2 << 20)
static void os_move_split(uint8_t *s, uint8_t *d, size_t n, bool keep) {
    if (os_move_once(s, d, n)) return;
    if (n > MOVE_MIN_PIECE) {
        size_t half = (n / 2 + CORAL_OS_PAGE_SIZE - 1) & ~(CORAL_OS_PAGE_SIZE - 1);
        os_move_split(s, d, half, keep);
        os_move_split(s + half, d + half, n - half, keep);
        return;
    }
    bool mapped = os_remap_destination(d, n);
    if (!mapped) coral_fatal("cannot map %zu bytes at %p again after a failed mremap", n, d);
    /* (dst counts as mapped throughout, whatever the failed move did.) */
    if (keep) memcpy(d, s, n);
    coral_os_unmap(s, n);
}

/* Move the pages of [src, src + size) onto the mapped range at dst (page
 * tables move: no byte is copied, nothing faults); the source range is
 * unmapped afterwards. The kernel moves only within one mapping, and a range
 * coralloc assembled from several moves is several mappings, split on
 * `piece` boundaries (the segment layer maps, moves and unmaps whole 4 MiB
 * chunks) or, inside a piece, where part of it was advised for huge pages:
 * then it goes piece by piece, and a piece that still does not move, in
 * halves. Kernels before 6.17 unmap the destination of a move that fails
 * so: a piece that does not move at all is mapped again at dst before it
 * is copied (`keep`: its contents matter) or left zero. */
void coral_os_move(void *src, void *dst, size_t size, bool keep, size_t piece) {
    uint8_t *s = src, *d = dst;
    if (size == 0 || os_move_once(s, d, size)) return;
    for (size_t off = 0; off < size; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        os_move_split(s + off, d + off, n, keep);
    }
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Fault the range in now, writable, in one system call (cheaper per page
 * than taking the faults one by one). Kernels before 5.14 refuse it: then
 * the pages fault in on first touch as usual. */
void coral_os_populate(void *p, size_t size) {
    coral_count_os_call(CORAL_OS_POPULATE, size);
    if (!os_should_fail()) (void)madvise(p, size, MADV_POPULATE_WRITE);
}

/* Which pages of [p, p + size) (page-aligned) are resident: vec gets a
 * byte per page, bit 0 set for a resident one. False when the kernel
 * cannot tell (vec is then untouched). */
bool coral_os_resident(const void *p, size_t size, unsigned char *vec) {
    coral_count_os_call(CORAL_OS_MINCORE, size);
    return !os_should_fail() && mincore((void *)(uintptr_t)p, size, vec) == 0;
}

/* Ask for transparent huge pages over the range (THP in "madvise" mode):
 * a clean 2 MiB-aligned 2 MiB of it then faults in as one page, one fault. */
void coral_os_advise_huge(void *p, size_t size) {
    coral_count_os_call(CORAL_OS_ADVISE, size);
    if (!os_should_fail()) (void)madvise(p, size, MADV_HUGEPAGE);
}

void coral_os_advise_no_huge(void *p, size_t size) {
    coral_count_os_call(CORAL_OS_UNADVISE, size);
    if (!os_should_fail()) (void)madvise(p, size, MADV_NOHUGEPAGE);
}

void coral_os_new_segment(void *base, size_t size, size_t header) {
    if (coral_option(CORAL_OPT_POPULATE) == CORAL_POPULATE_ON && size > header)
        coral_os_populate((uint8_t *)base + header, size - header);
}

bool coral_os_protect(void *p, size_t size, bool accessible) {
    coral_count_os_call(CORAL_OS_PROTECT, size);
    if ((accessible || !os_should_fail()) &&
        mprotect(p, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0)
        return true;
    coral_message("mprotect(%p, %zu) failed: errno %d", p, size, errno);
    return false;
}

/* (The reserved range counts as mapped: the figure is address space.) The
 * caller unmapped the range a moment before (its pages moved away), so
 * another thread's new mapping may lie there already: MAP_FIXED_NOREPLACE
 * leaves it alone, and the range is not reserved. */
bool coral_os_reserve_inaccessible(void *p, size_t size, size_t holes) {
    if (os_should_fail()) return false;
    void *r = mmap(p, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    coral_count_os_call(CORAL_OS_MMAP, size);
    if (r != p) {
        /* (a kernel before 4.17 takes NOREPLACE as a hint: a range elsewhere) */
        if (r != MAP_FAILED) munmap(r, size);
        return false;
    }
    mapped_add((int64_t)holes);
    return true;
}

void coral_os_random(void *out, size_t n) {
    uint8_t *o = out;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(o + got, n - got, GRND_NONBLOCK);
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got == n) return;
    /* No entropy from the kernel (early boot, seccomp): the clock and where
     * things were mapped, mixed. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uintptr_t)&ts ^
                 (uintptr_t)out ^ (uintptr_t)&coral_os_random;
    for (; got < n; got++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        o[got] = (uint8_t)(x >> 24);
    }
}
