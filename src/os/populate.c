/* When to prefault memory (CORALLOC_POPULATE).
 *
 * A page that faults in on first touch costs a trap into the kernel per
 * 4 KiB. madvise(MADV_POPULATE_WRITE) faults a whole range in with one
 * call, cheaper per page but with a fixed cost per call, so it pays for
 * ranges of CORAL_POPULATE_MIN_BYTES and more (docs/experiments/ has the
 * figures), and only for pages the program then writes: a prefaulted page
 * it never touches is resident for nothing.
 *
 * `on` populates every new segment and huge mapping whole
 * (coral_os_new_segment). `adaptive` populates clean memory (never touched, or purged)
 * only where the allocator has evidence that it will be written soon:
 *
 *   - a new page of a class of blocks of at most an OS page, once the heap
 *     has a full page of the class: carving links each block (a write into
 *     it), and with blocks that small every OS page of the span holds the
 *     start of one, so the whole page is written as it is carved, and the
 *     class is filling pages. A thread's first page of a class never is.
 *   - a new page of a class of bigger blocks, when the heap's newest full
 *     page of the class is resident for at least 7/8 of its OS pages
 *     (mincore): the program writes its blocks of that class whole. A
 *     program that touches one page of each block gets none.
 *   - the clean part of a large or huge block, when the process's running
 *     score of big blocks is dense: the blocks placed on clean memory are
 *     measured (mincore, a bounded sample) when they are freed, so the
 *     measure costs at most one call for each such placement, which cost a
 *     fault per page or a populate anyway. The score starts sparse: nothing
 *     is populated before two dense blocks were seen.
 *   - the part of a new block that realloc is about to copy the old one
 *     into, when it lies on clean memory (its last page is not resident):
 *     the copy writes it all. (A list or buffer grown by realloc through
 *     the classes of big blocks went to the kernel a page at a time.)
 *   - the part a large or huge block grows by in realloc, when the old
 *     block is resident for 7/8 of its pages (the program filled it and
 *     fills it on as it grows), at most as much as the old size.
 *
 * Each decision thus rests on what the program did with memory of the same
 * kind, and wrong guesses cost at most the span or block at hand. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "os/os.h"

/* Resident shares are in 1/256ths; dense is at least 7/8 of the pages. */
#define SHARE_ONE 256u
#define SHARE_DENSE 224u
/* mincore samples up to SAMPLE_WINDOWS windows of SAMPLE_PAGES pages
 * spread over a range: whole up to 8 MiB, sampled beyond. */
#define SAMPLE_PAGES 256u
#define SAMPLE_WINDOWS 8u

/* The running score of big blocks placed on clean memory, in 1/256ths of
 * their pages found resident at their free: each sample moves it 3/4 of
 * the way (two dense samples in a row make it dense, one sparse sample
 * makes it sparse). Any thread updates it, relaxed: a lost update only
 * delays a decision by one block. */
static _Atomic(unsigned) big_block_share;

/* The running score of the class pages the process fills, the same way:
 * a page of blocks up to an OS page is written whole (carving links every
 * block), a page of bigger blocks as much as mincore finds resident. It
 * starts dense: a program that fills pages of small blocks has shown
 * nothing else; one sparse page of big blocks makes it sparse. */
static _Atomic(unsigned) span_share = SHARE_ONE;

static void score_add(_Atomic(unsigned) *score, unsigned sample) {
    unsigned old = atomic_load_explicit(score, memory_order_relaxed);
    atomic_store_explicit(score, (old + 3u * sample) / 4u, memory_order_relaxed);
}

static bool score_dense(_Atomic(unsigned) *score) {
    return atomic_load_explicit(score, memory_order_relaxed) >= SHARE_DENSE;
}

bool coral_populate_adaptive(void) {
    return coral_option(CORAL_OPT_POPULATE) == CORAL_POPULATE_ADAPTIVE;
}

static size_t page_floor(size_t x) { return x & ~(CORAL_OS_PAGE_SIZE - 1); }
static size_t page_ceil(size_t x) { return page_floor(x + CORAL_OS_PAGE_SIZE - 1); }

/* Resident pages among `pages` pages from p, counted by mincore; 0 for a
 * range the kernel cannot tell (treated as untouched: never populates). */
static size_t resident_in_window(const uint8_t *p, size_t pages) {
    unsigned char vec[SAMPLE_PAGES];
    if (!coral_os_resident(p, pages * CORAL_OS_PAGE_SIZE, vec)) return 0;
    size_t n = 0;
    for (size_t i = 0; i < pages; i++) n += vec[i] & 1u;
    return n;
}

/* The share (0..SHARE_ONE) of the OS pages of [p, p + size) that are
 * resident: all of them up to SAMPLE_WINDOWS x SAMPLE_PAGES pages, else
 * that many in evenly spread windows. p is page-aligned. */
static unsigned resident_share(const uint8_t *p, size_t size) {
    size_t pages = size / CORAL_OS_PAGE_SIZE;
    if (pages == 0) return 0;
    size_t windows = (pages + SAMPLE_PAGES - 1) / SAMPLE_PAGES;
    if (windows > SAMPLE_WINDOWS) windows = SAMPLE_WINDOWS;
    /* Consecutive windows while they cover the range, else spread out:
     * either way they never overlap (stride >= SAMPLE_PAGES). */
    size_t stride = pages / windows > SAMPLE_PAGES ? pages / windows : SAMPLE_PAGES;
    size_t sampled = 0, resident = 0;
    for (size_t w = 0; w < windows; w++) {
        size_t first = w * stride;
        size_t n = pages - first < SAMPLE_PAGES ? pages - first : SAMPLE_PAGES;
        resident += resident_in_window(p + first * CORAL_OS_PAGE_SIZE, n);
        sampled += n;
    }
    return (unsigned)(resident * SHARE_ONE / sampled);
}

/* Populate the OS pages [p, p + size) lies in, if they are enough to pay.
 * (Its first and last page are written with it: a block's end is, and a
 * partly used first page holds the bytes before p.) Callers pass ranges
 * inside one block or span, whose ends are OS page boundaries, so the
 * rounded range never reaches memory of another block. `huge_pages`: the
 * range was advised for huge pages, and what they cost is noted. */
static void populate_range(uint8_t *p, size_t size, bool huge_pages) {
    uint8_t *from = (uint8_t *)page_floor((uintptr_t)p);
    uint8_t *to = (uint8_t *)page_ceil((uintptr_t)(p + size));
    if ((size_t)(to - from) < CORAL_POPULATE_MIN_BYTES) return;
    if (huge_pages)
        coral_huge_pages_fault_in(from, (size_t)(to - from));
    else
        coral_os_populate(from, (size_t)(to - from));
}

/* A new clean span of `bytes` at start for a class of blocks, whose heap's
 * newest full span of the class is `full` (NULL: none, e.g. the class's
 * first page). */
void coral_populate_class_span(uint8_t *start, size_t bytes, size_t block_size, const uint8_t *full,
                               size_t full_bytes) {
    if (full == NULL) return;
    unsigned share = block_size > CORAL_OS_PAGE_SIZE ? resident_share(full, full_bytes) : SHARE_ONE;
    score_add(&span_share, share);
    if (share >= SHARE_DENSE) populate_range(start, bytes, false);
}

/* A large or huge block was placed on clean memory [p, p + size). */
void coral_populate_big_block(uint8_t *p, size_t size, bool huge_pages) {
    if (page_ceil(size) < CORAL_POPULATE_MIN_BYTES || !score_dense(&big_block_share)) return;
    populate_range(p, size, huge_pages);
}

/* A large or huge block placed on clean memory is freed: how much of it
 * the program wrote moves the score. */
void coral_populate_note_big_block(const uint8_t *p, size_t size) {
    score_add(&big_block_share, resident_share((const uint8_t *)page_floor((uintptr_t)p), size));
}

/* realloc grew the block at p from old_size to new_size bytes (in place,
 * or with its pages moved). If the program wrote the old block (7/8 of its
 * pages resident), it fills the block as it grows: populate the new part,
 * at most the old size of it. */
void coral_populate_growth(uint8_t *p, size_t old_size, size_t new_size) {
    if (new_size <= old_size) return;
    size_t grow = new_size - old_size < old_size ? new_size - old_size : old_size;
    if (page_ceil(grow) < CORAL_POPULATE_MIN_BYTES) return;
    const uint8_t *base = (const uint8_t *)page_floor((uintptr_t)p);
    if (resident_share(base, page_floor((size_t)(p + old_size - base))) < SHARE_DENSE) return;
    populate_range(p + old_size, grow, false);
}

/* realloc is about to copy `size` bytes into the new block at dst: a write
 * of all of them. Populated when they lie on clean memory, told by the
 * last page of the range (the first may be resident: carving a block of a
 * big class links it, a write into its first page). */
void coral_populate_copy(void *dst, size_t size) {
    uint8_t *p = dst;
    if (size == 0 ||
        page_ceil((size_t)(p + size) - page_floor((uintptr_t)p)) < CORAL_POPULATE_MIN_BYTES)
        return;
    const uint8_t *last = (const uint8_t *)page_floor((uintptr_t)(p + size - 1));
    if (resident_in_window(last, 1) != 0) return;
    populate_range(p, size, false);
}

/* ---- the huge-page policy ---------------------------------------------------- */

/* Huge pages found slow so far (any thread adds, relaxed: the count only
 * ever grows, and a thread that reads it late advises one more range). */
static _Atomic(unsigned) huge_slow_pages;
/* Tests: the cost taken for every huge page instead of the measured one
 * (negative: measure). */
static _Atomic(int64_t) huge_cost_override = -1;

static bool huge_pages_cheap(void) {
    return atomic_load_explicit(&huge_slow_pages, memory_order_relaxed) < CORAL_HUGE_SLOW_LIMIT;
}

bool coral_huge_pages_for_segment(void) {
    return coral_option(CORAL_OPT_HUGE_PAGES) && huge_pages_cheap() && score_dense(&span_share);
}

bool coral_huge_pages_for_big_block(void) {
    return coral_option(CORAL_OPT_HUGE_PAGES) && huge_pages_cheap();
}

/* The calling thread's CPU time (user and system) in ns; 0 if unknown. */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

bool coral_huge_pages_turned_slow(void) {
    return coral_option(CORAL_OPT_HUGE_PAGES) && !huge_pages_cheap();
}

/* Fault in [p, p + size) and note the cost of each 2 MiB of it: a slow one
 * counts once, whatever the number of pages (the average is above the
 * bound). */
static void fault_in_timed(uint8_t *p, size_t size) {
    uint64_t start = thread_cpu_ns();
    coral_os_populate(p, size);
    size_t pages = size / CORAL_HUGE_PAGE_SIZE;
    if (pages == 0) return;
    int64_t fixed = atomic_load_explicit(&huge_cost_override, memory_order_relaxed);
    uint64_t each = fixed >= 0 ? (uint64_t)fixed : (thread_cpu_ns() - start) / pages;
    if (each <= CORAL_HUGE_SLOW_NS) return;
    atomic_fetch_add_explicit(&huge_slow_pages, 1, memory_order_relaxed);
    coral_count(&coral_counters.huge_pages_slow, 1);
}

bool coral_huge_pages_fault_in(void *p, size_t size) {
    uint8_t *first = p;
    size_t first_size = size < CORAL_HUGE_PAGE_SIZE ? size : CORAL_HUGE_PAGE_SIZE;
    fault_in_timed(first, first_size);
    if (first_size == size) return huge_pages_cheap();
    if (!huge_pages_cheap()) {
        coral_os_advise_no_huge(first + first_size, size - first_size);
        coral_os_populate(first + first_size, size - first_size);
        return false;
    }
    fault_in_timed(first + first_size, size - first_size);
    return huge_pages_cheap();
}

void coral_huge_pages_cost_override(int64_t ns) {
    atomic_store_explicit(&huge_cost_override, ns, memory_order_relaxed);
    atomic_store_explicit(&huge_slow_pages, 0, memory_order_relaxed);
}
